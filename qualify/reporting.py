"""The qualification report from the matrix: gather, verify, hand to ``reports``, write.

Owns which manifest the page shows (``--manifest``, else ``./manifest.json``, else the newest
published), its signature status (verified here with the trusted key) and gathering the rest.
HTML lives in ``reports``; SQL in ``matrix``.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from manifest.errors import ExpiredError, ManifestError
from manifest.load import load_manifest
from manifest.signing import key_id, load_public_key, verify
from matrix.publications import published_before, steering
from matrix.store import Store
from qualify import __version__
from qualify.project.load import LoadedProject
from qualify.release.current import file_digests
from reports import build_report, write_report
from schemas.manifest import Manifest

__all__ = ["signature_status", "write_qualification_report"]


def signature_status(raw: bytes, pubkey: Path | None, *, now: datetime) -> str:
    """``verified: <keyid>``, ``unverified: ...``, ``unsigned``, ``expired: <when>`` (the
    signature verifies; the document is past its ``expires``) or ``invalid: <why>``."""
    doc = json.loads(raw)
    if not doc.get("signatures"):
        return "unsigned"
    if pubkey is None:
        return "unverified: pass --pubkey to check the signature"
    public = load_public_key(pubkey)
    try:
        verify(doc, public, now=now)
    except ExpiredError:
        return f"expired: {doc['signed'].get('expires', 'its expiry')}"
    except ManifestError as exc:
        return f"invalid: {exc}"
    return f"verified: key {key_id(public)[:16]}"


HOSTS_MANIFEST = Path("manifest.json")
"""What ``manifest publish`` writes by default and hosts fetch: the report's default."""


def _manifest(
    db: Store, given: Path | None, model: str
) -> tuple[Manifest | None, bytes, str | None]:
    """The manifest to report on, its bytes and where it came from (None: no manifest).

    ``./manifest.json`` of another model (a folder shared by two projects) is passed over for
    the matrix's, and the header says so.
    """
    from manifest.load import read_manifest_file

    if given is not None:
        raw = read_manifest_file(given)
        return load_manifest(raw, source=str(given)), raw, str(given)
    here = f"no ./{HOSTS_MANIFEST} here"
    if HOSTS_MANIFEST.is_file():
        raw = read_manifest_file(HOSTS_MANIFEST)
        found = load_manifest(raw, source=f"./{HOSTS_MANIFEST}")
        if found.signed.model == model:
            return found, raw, f"./{HOSTS_MANIFEST} (what hosts get)"
        here = f"./{HOSTS_MANIFEST} is model {found.signed.model}'s, not {model}'s"
    latest = db.latest_manifest()
    if latest is None:
        return None, b"", None
    raw = latest[1].encode()
    where = f"the matrix: the newest published, version {latest[0]} ({here})"
    return load_manifest(raw, source=f"matrix manifest v{latest[0]}"), raw, where


def write_qualification_report(
    loaded: LoadedProject,
    db: Store,
    out: Path,
    *,
    now: datetime,
    manifest_path: Path | None = None,
    pubkey: Path | None = None,
) -> Path:
    """Render the report for the matrix (and manifest) into ``out``, atomically.

    The manifest is ``manifest_path`` when given, else ``./manifest.json`` when present (what
    hosts get), else the newest one published in the matrix; the header says which. The
    previous manifest (for the diff section) is the one published just before it.
    """
    current, raw, source = _manifest(db, manifest_path, loaded.project.model)
    previous: Manifest | None = None
    status: str | None = None
    if current is not None:
        status = signature_status(raw, pubkey, now=now)
        # the one published before it (a draft or a discarded publication between is not)
        before = published_before(db, current.signed.version)
        if before is not None:
            previous = load_manifest(before.encode(), source="previous manifest")
    view = build_report(
        loaded.project,
        db.decision_cells(),  # what manifest generate decides on
        {r.run_id: r for r in db.runs()},
        db.samples_by_config,
        now=now,
        tool_version=__version__,
        snapshot=db.snapshot_id(),
        manifest=current,
        signature_status=status,
        manifest_source=source,
        previous=previous,
        rollouts=db.rollout_log(),
        releases=db.manifest_history(),
        steering=steering(db),
        tunes=db.tunes(),
        lineage=db.lineage(),
        digests=file_digests(loaded),
    )
    return write_report(view, out)
