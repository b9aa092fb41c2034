"""The page's frame: the header (release, manifest, signature, counts), notes and glossary."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from reports.formatting import plural, short_digest
from reports.view import ArtifactColumn, ClassView, DiffView, Header, HeatRow, SignatureStatus
from schemas.manifest import ManifestEntry, ManifestSigned
from schemas.project import Project

__all__ = ["glossary", "manifest_header", "matrix_header", "matrix_line", "notes"]


def _decision_line(entries: Mapping[str, ManifestEntry]) -> tuple[str, tuple[tuple[str, int], ...]]:
    counts = {"candidate": 0, "baseline": 0, "hold": 0}
    for entry in entries.values():
        counts[entry.decision] = counts.get(entry.decision, 0) + 1
    parts = []
    if counts["candidate"]:
        n = counts["candidate"]
        parts.append(f"{plural(n, 'class gets', 'classes get')} the candidate")
    if counts["baseline"]:
        n = counts["baseline"]
        parts.append(f"{plural(n, 'class keeps', 'classes keep')} the baseline")
    if counts["hold"]:
        parts.append(f"{counts['hold']} held")
    line = ", ".join(parts) if parts else "the manifest has no classes"
    return line, tuple((k, v) for k, v in counts.items())


def matrix_line(views: Sequence[ClassView], heat: Sequence[HeatRow]) -> tuple[str, dict[str, int]]:
    # The heat map's cells counted by verdict, as a clause of the header and as counts.
    verdicts = {"pass": 0, "fail": 0, "insufficient": 0, "error": 0, "stale": 0}
    for row in heat:
        for hc in row.cells:
            if hc.verdict in verdicts:
                verdicts[hc.verdict] += 1
    unmeasured = sum(1 for v in views if not v.artifacts)
    if not verdicts["stale"]:
        del verdicts["stale"]  # said only where some cell is stale
    cell_line = ", ".join(f"{n} {v}" for v, n in verdicts.items()) + " cells"
    if unmeasured:
        cell_line += f"; {plural(unmeasured, 'class has', 'classes have')} no measurement"
    return cell_line, verdicts


def manifest_header(
    project: Project,
    current: ManifestSigned,
    status: SignatureStatus,
    snapshot: str | None,
    cell_line: str,
    generated: str,
    tool_version: str,
) -> Header:
    line, counts = _decision_line(current.entries)
    snapshot_note = ""
    if snapshot is not None and snapshot != current.snapshot:
        snapshot_note = (
            f"The manifest was built from matrix snapshot {short_digest(current.snapshot)}; the "
            "matrix has changed since, so some measurements below were not decided on."
        )
    return Header(
        model=project.model,
        release=current.release,
        manifest_text=(
            f"manifest version {current.version}, created {current.created}, "
            f"expires {current.expires}"
        ),
        has_manifest=True,
        signature_text=status.text,
        signature_tone=status.tone,
        snapshot=snapshot or current.snapshot,
        snapshot_note=snapshot_note,
        generated=generated,
        tool_version=tool_version,
        verdict_line=f"{line}. Matrix: {cell_line}.",
        counts=counts,
    )


def matrix_header(
    project: Project,
    snapshot: str | None,
    cell_line: str,
    verdicts: Mapping[str, int],
    generated: str,
    tool_version: str,
) -> Header:
    # A matrix-only report: no decisions, so the counts are the cells' verdicts.
    return Header(
        model=project.model,
        release="no manifest yet",
        manifest_text="no manifest yet: no decisions, measurements only",
        has_manifest=False,
        signature_text="no manifest to sign",
        signature_tone="muted",
        snapshot=snapshot or "not given",
        snapshot_note="",
        generated=generated,
        tool_version=tool_version,
        verdict_line=f"No manifest yet. Matrix: {cell_line}.",
        counts=tuple(verdicts.items()),
    )


def notes(orphans: int, columns: Sequence[ArtifactColumn]) -> tuple[str, ...]:
    # What the page leaves out or adds beyond the project file.
    notes: list[str] = []
    if orphans:
        notes.append(
            f"{plural(orphans, 'cell was', 'cells were')} measured on keys that no class of the "
            "project file has; they are not shown."
        )
    extra = [c.name for c in columns if not c.in_project]
    if extra:
        notes.append(f"Artifacts measured but not in the project file: {', '.join(extra)}.")
    return tuple(notes)


def glossary(views: Sequence[ClassView], diff: DiffView | None) -> tuple[tuple[str, str], ...]:
    # Every reason code on the page with its meaning, sorted; codes without one are left out.
    used: dict[str, str] = {}
    for v in views:
        for r in v.reasons:
            used[r.code] = r.meaning
        for _, _, cell_reasons, _ in v.cell_reasons:
            for r in cell_reasons:
                used[r.code] = r.meaning
    if diff is not None:
        for d in diff.rows:
            for r in d.reasons:
                used[r.code] = r.meaning
    return tuple(sorted((code, meaning) for code, meaning in used.items() if meaning))
