"""Release manifests from the matrix: the composition of policy, build, signing and storage.

Owns the order of ``qualify manifest generate``: read the latest evidence and the previous
manifest from the matrix, decide per class (``manifest.policy``), build and sign the document
(``manifest.build``/``manifest.signing``), write it and the per-class documents atomically, and
record it in the matrix with its version. Decisions and signatures live in ``manifest``; SQL lives
in ``matrix``; this module only wires them, with the clock as a parameter.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from manifest.build import build_manifest, next_version, write_manifest, write_per_class
from manifest.envelope import encode_canonical, encode_envelope
from manifest.load import load_manifest
from manifest.policy import decide
from manifest.signing import load_private_key, sign_encoded
from matrix.store import Store
from qualify.artifacts import ArtifactStore, digest_file
from qualify.coverage import CoverageItem, ReleaseGate, coverage, release_gate
from qualify.errors import QualifyError
from qualify.project import LoadedProject
from schemas.manifest import ArtifactRef, ClassDecision, Manifest

__all__ = [
    "MAX_VALIDITY",
    "GeneratedManifest",
    "ReleaseCheck",
    "artifact_refs",
    "generate_manifest",
    "parse_duration",
    "previous_manifest",
    "release_check",
]

_DURATION = re.compile(r"\s*([0-9]{1,9})\s*([smhdw])\s*")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}

MAX_VALIDITY = timedelta(days=366)
"""Longest ``--expires`` a manifest may have: hosts refuse documents valid for longer than
their policy (``resolve-artifact --max-validity-days``, 400 by default), and a year is already
long for a signed release to stay trusted without a refresh."""


def parse_duration(
    text: str, *, what: str = "duration", most: timedelta = timedelta(days=3650)
) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``2w`` or ``45s`` as a timedelta, at most ``most``.

    Raises:
        QualifyError: anything else, naming ``what`` (the option) and the fix.
    """
    m = _DURATION.fullmatch(text)
    if not m or int(m.group(1)) <= 0:
        raise QualifyError(
            f"{what} {text[:40]!r}: expected a positive number and a unit (s, m, h, d, w), e.g. 30d"
        )
    try:
        span = timedelta(**{_UNITS[m.group(2)]: int(m.group(1))})
    except OverflowError:
        span = timedelta.max
    if span > most:
        raise QualifyError(
            f"{what} {text!r} is longer than the {most.days} days allowed; use at most {most.days}d"
        )
    return span


@dataclass(frozen=True)
class GeneratedManifest:
    """What ``generate_manifest`` wrote."""

    document: dict[str, Any]
    manifest: Manifest
    decisions: list[ClassDecision]
    path: Path
    per_class_dir: Path | None
    signed: bool


def previous_manifest(db: Store) -> Manifest | None:
    """The newest manifest published from the matrix, if any."""
    latest = db.latest_manifest()
    if latest is None:
        return None
    return load_manifest(latest[1].encode(), source=f"matrix manifest v{latest[0]}")


def artifact_refs(
    loaded: LoadedProject, store: ArtifactStore, base_uri: str | None
) -> tuple[dict[str, str], dict[str, ArtifactRef]]:
    """The project's artifacts: label -> digest (of the files now), and digest -> where hosts
    fetch it (the spec's ``uri``, else ``base_uri``, else the store's ``file://`` path)."""
    digests: dict[str, str] = {}
    refs: dict[str, ArtifactRef] = {}
    specs = [loaded.project.artifacts.baseline, *loaded.project.artifacts.candidates]
    for spec in specs:
        path = loaded.resolve(spec.path)
        digest = digest_file(path)
        digests[spec.label] = digest
        hexname = f"sha256/{digest.removeprefix('sha256:')}.onnx"
        if spec.uri:
            uri = spec.uri
        elif base_uri:
            uri = base_uri.rstrip("/") + "/" + hexname
        else:
            uri = store.path_of(digest).resolve().as_uri()
        refs[digest] = ArtifactRef(name=spec.label, uri=uri, length=path.stat().st_size)
    return digests, refs


def generate_manifest(
    loaded: LoadedProject,
    db: Store,
    *,
    release: str,
    out: Path,
    now: datetime,
    expires_in: timedelta,
    key_path: Path | None,
    per_class_dir: Path | None = None,
    artifact_base_uri: str | None = None,
    store_dir: Path | None = None,
) -> GeneratedManifest:
    """Decide every class from the matrix and write a signed manifest.

    Args:
        loaded: the project file (classes, budgets and policy in force now).
        db: the matrix, opened for writing (the manifest is recorded there).
        release: release name.
        out: where to write the manifest.
        now: the clock (``created``).
        expires_in: validity period.
        key_path: Ed25519 private key; ``None`` writes an unsigned manifest (the CLI asks for
            an explicit flag).
        per_class_dir: also write one signed document per class here (needs a key).
        artifact_base_uri: base URL hosts fetch artifacts from (``BASE/sha256/<hex>.onnx``);
            defaults to ``file://`` URIs of the artifact store beside the matrix.
        store_dir: the artifact store (defaults to ``artifacts/`` beside the matrix).

    Raises:
        QualifyError, ManifestError, MatrixError: with messages naming the file and the fix.
    """
    if per_class_dir is not None and key_path is None:
        raise QualifyError("per-class documents must be signed: pass --key or drop --per-class")
    key = load_private_key(key_path) if key_path is not None else None
    previous = previous_manifest(db)
    store = ArtifactStore(store_dir or Path(db.path).resolve().parent / "artifacts")
    digests, refs = artifact_refs(loaded, store, artifact_base_uri)
    runs = {r.run_id: r for r in db.runs()}
    decisions = decide(loaded.project, db.cells(), runs, previous=previous, digests=digests)
    signed = build_manifest(
        loaded.project,
        decisions,
        release=release,
        # Above every version recorded: one reserved by a generate that died before it wrote
        # its file is never reused for other content.
        version=max(next_version(previous), db.highest_manifest_version() + 1),
        created=now,
        expires=now + expires_in,
        snapshot=db.snapshot_id(),
        artifacts=refs,
        previous=previous,
    )
    if key is not None:
        document, canonical = sign_encoded(signed, key)
    else:
        document = {"signed": signed, "signatures": []}
        canonical = encode_envelope([], encode_canonical(signed))
    manifest = load_manifest(canonical, source=str(out))
    # Record first: the version is reserved in the matrix before any host can see the file, so
    # two generators racing cannot both publish the same version.
    db.save_manifest(signed["version"], release, now, now + expires_in, canonical.decode())
    out.parent.mkdir(parents=True, exist_ok=True)
    write_manifest(canonical, out)
    if per_class_dir is not None and key is not None:
        write_per_class(document, key, per_class_dir)
    db.mark_published(signed["version"])  # only now do report and telemetry check see it
    return GeneratedManifest(
        document=document,
        manifest=manifest,
        decisions=decisions,
        path=out,
        per_class_dir=per_class_dir,
        signed=key is not None,
    )


@dataclass(frozen=True)
class ReleaseCheck:
    """What CI is told: coverage of the classes in scope, the release gate, the reasons."""

    items: list[CoverageItem]
    gate: ReleaseGate
    reasons: dict[tuple[str, str], list[str]]


def release_check(
    loaded: LoadedProject, db: Store, *, scope: Sequence[str], unserved: Sequence[str] = ()
) -> ReleaseCheck:
    """Coverage and the release gate for the classes in ``scope``, from the matrix as it is
    (``unserved`` adds to the classes the matrix knows a fleet run found no host for).

    Every class is decided as ``manifest generate`` would now (nothing is written) and compared
    with its entry in the newest published manifest.
    """
    budgets = {name: c.budgets.p99_ms for name, c in loaded.project.host_classes.items()}
    rows = [{**row, "p99_budget_ms": budgets.get(row["host_class"])} for row in db.matrix_rows()]
    wanted = set(scope)
    lost = {*unserved, *db.unserved()}
    items = [i for i in coverage(loaded.project, rows, unserved=lost) if i.host_class in wanted]
    runs = {r.run_id: r for r in db.runs()}
    cells = db.latest_cells()
    previous = previous_manifest(db)
    decisions = decide(loaded.project, cells, runs, previous=previous)
    current = previous.signed.entries if previous is not None else None
    gate = release_gate(decisions, current, scope=list(scope))
    reasons = {
        (c.run_id, c.artifact_digest): [f"{r.code}: {r.message}" for r in c.reasons] for c in cells
    }
    return ReleaseCheck(items=items, gate=gate, reasons=reasons)
