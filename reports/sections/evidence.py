"""A class's evidence below its table: the runs its cells came from (host fingerprint, the
rollback check) and the manifest's rollback package with the run that proved it loads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from reports.formatting import NOT_MEASURED, short_digest, utc_minute
from reports.view import RunView, Tone
from schemas.cell import Cell, RunRecord
from schemas.manifest import ManifestEntry
from schemas.project import HostClass

__all__ = ["rollback_entry", "run_views"]


def _flags_text(cpu_flags: list[str], wanted: list[str]) -> str:
    """How many flags the host has, and each flag the class requires: present or MISSING."""
    have = {f.replace("_", "") for f in cpu_flags} | set(cpu_flags)

    def has(flag: str) -> bool:
        return bool({flag, flag.replace("_", "")} & have)

    text = f"{len(cpu_flags)} flags"
    if wanted:
        text += "; required: " + ", ".join(
            f"{f} {'present' if has(f) else 'MISSING'}" for f in wanted
        )
    return text


def _facts(run: RunRecord, cls: HostClass | None) -> tuple[tuple[str, str], ...]:
    fp = run.fingerprint
    rt = fp.runtime
    return (
        ("host", fp.hostname),
        ("arch", fp.arch),
        ("cpu", fp.cpu_model or NOT_MEASURED),
        ("cpu flags", _flags_text(fp.cpu_flags, cls.match.cpu_flags if cls else [])),
        ("cores", f"{fp.cores} (affinity {len(fp.affinity)})"),
        ("memory", f"{fp.memory_mb:,} MB" if fp.memory_mb is not None else NOT_MEASURED),
        ("os", fp.os),
        ("python", fp.python),
        ("onnxruntime", f"{rt.version} ({rt.package or 'package unknown'})"),
        ("build info", rt.build_info or "not offered"),
        ("providers", ", ".join(rt.available_providers) or "none available"),
        (
            "load average",
            f"{' / '.join(f'{x:.2f}' for x in run.load_avg_before)} before, "
            f"{' / '.join(f'{x:.2f}' for x in run.load_avg_after)} after",
        ),
    )


def _rollback_check(run: RunRecord) -> tuple[str, Tone]:
    """Whether the run loaded the class's rollback artifact."""
    check = run.rollback
    if check is None:
        return "rollback artifact not checked in this run", "warn"
    if check.loaded:
        return f"rollback artifact {short_digest(check.artifact_digest)} loaded and ran", "ok"
    return (
        f"rollback artifact {short_digest(check.artifact_digest)} did NOT load: "
        f"{check.error or 'no detail'}",
        "bad",
    )


def _run_view(run: RunRecord, cls: HostClass | None) -> RunView:
    rollback_text, rollback_tone = _rollback_check(run)
    return RunView(
        run_id=run.run_id,
        when=f"{utc_minute(run.started_at)} to {utc_minute(run.finished_at)}",
        emulated=run.emulated,
        mismatches=tuple(run.mismatches),
        facts=_facts(run, cls),
        rollback_text=rollback_text,
        rollback_tone=rollback_tone,
    )


def run_views(
    cells: Sequence[Cell], runs: Mapping[str, RunRecord], cls: HostClass | None
) -> tuple[RunView, ...]:
    """The runs of ``cells``, newest first (a run the matrix no longer has is left out)."""
    run_ids = sorted({c.run_id for c in cells})
    return tuple(
        _run_view(runs[r], cls)
        for r in sorted(
            run_ids,
            key=lambda r: runs[r].finished_at if r in runs else datetime.min.replace(tzinfo=UTC),
            reverse=True,
        )
        if r in runs
    )


def rollback_entry(
    name: str, entry: ManifestEntry | None, runs: Mapping[str, RunRecord]
) -> tuple[str, Tone]:
    """The manifest's rollback package, and the runtime that really loaded it (never the
    class's declared one: a CPU build under emulation proves nothing about a GPU build)."""
    if entry is None or entry.rollback is None:
        return ("no rollback package in the manifest" if entry else "no manifest yet"), "muted"
    rb = entry.rollback
    declared = rb.runtime or entry.runtime  # null: the entry's own runtime
    package = f"{rb.name} ({short_digest(rb.digest)}, {rb.uri})"
    if not rb.proven_to_load:
        return (
            f"{package}, NOT proven to load; hosts run {declared.package} {declared.version}",
            "bad",
        )
    proofs = [
        run
        for run in runs.values()
        if run.host_class == name
        and run.rollback is not None
        and run.rollback.artifact_digest == rb.digest
        and run.rollback.loaded
    ]
    proof = max(proofs, key=lambda r: (r.finished_at, r.run_id), default=None)
    if proof is None:
        return f"{package}, proven to load by a measured cell", "ok"
    rt = proof.fingerprint.runtime
    how = f"onnxruntime {rt.version} ({rt.package or 'package unknown'})"
    if proof.emulated:
        how += ", emulated"
    return f"{package}, proven to load in run {proof.run_id} under {how}", "ok"
