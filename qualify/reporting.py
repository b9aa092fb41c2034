"""The qualification report from the matrix: gather, verify, hand to ``reports``, write.

Owns collecting what the page needs (project, the cells decisions rest on and the artifacts'
digests now, runs, raw samples, the current and previous manifests) and the signature status it shows: the report only displays a status, it is
verified here with the trusted public key. HTML lives in ``reports``; SQL in ``matrix``.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from manifest.errors import ManifestError
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
    """``verified: <keyid>``, ``unverified: ...``, ``unsigned`` or ``invalid: <why>``."""
    doc = json.loads(raw)
    if not doc.get("signatures"):
        return "unsigned"
    if pubkey is None:
        return "unverified: pass --pubkey to check the signature"
    public = load_public_key(pubkey)
    try:
        verify(doc, public, now=now)
    except ManifestError as exc:
        return f"invalid: {exc}"
    return f"verified: key {key_id(public)[:16]}"


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

    The manifest is ``manifest_path`` when given, else the newest one recorded in the matrix;
    the previous manifest (for the diff section) is the one recorded just before it.
    """
    current: Manifest | None = None
    previous: Manifest | None = None
    status: str | None = None
    if manifest_path is not None:
        from manifest.load import read_manifest_file

        raw = read_manifest_file(manifest_path)
        current = load_manifest(raw, source=str(manifest_path))
    else:
        latest = db.latest_manifest()
        raw = latest[1].encode() if latest else b""
        if latest is not None:
            current = load_manifest(raw, source=f"matrix manifest v{latest[0]}")
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
        previous=previous,
        rollouts=db.rollout_log(),
        steering=steering(db),
        tunes=db.tunes(),
        lineage=db.lineage(),
        digests=file_digests(loaded),
    )
    return write_report(view, out)
