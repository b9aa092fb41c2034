"""The matrix section: the heat map of every class (rows) by every artifact (columns)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from manifest.verdict import CurrentVerdict
from reports.formatting import NOT_MEASURED, VERDICT_WORDS, ms
from reports.inputs import Classes, Inputs
from reports.rows.parity import parity_text
from reports.rows.placement import fallback_note
from reports.rows.table import cell_tones
from reports.tones import with_tone
from reports.view import ArtifactColumn, HeatCell, MatrixView, Tone
from schemas.cell import Cell
from schemas.project import HostClass, Project

__all__ = ["build", "columns", "heat_cell"]


def columns(project: Project, cells: Sequence[Cell]) -> list[ArtifactColumn]:
    """The project's artifacts in file order (baseline first), then any other artifact the
    matrix measured, baselines first and by name."""
    found = [
        ArtifactColumn(
            name=project.artifacts.baseline.label,
            role="baseline",
            precision=project.artifacts.baseline.precision,
            in_project=True,
        ),
        *(
            ArtifactColumn(name=c.label, role="candidate", precision=c.precision, in_project=True)
            for c in project.artifacts.candidates
        ),
    ]
    known = {col.name for col in found}
    for cell in sorted(cells, key=lambda c: (c.role != "baseline", c.artifact_name)):
        if cell.artifact_name not in known:
            known.add(cell.artifact_name)
            found.append(
                ArtifactColumn(
                    name=cell.artifact_name,
                    role=cell.role,
                    precision=cell.precision,
                    in_project=False,
                )
            )
    return found


def _p99_text(cell: Cell, budget: float | None, tone: Tone) -> tuple[str, Tone]:
    gate = cell.gate_latency
    if gate is None:
        return "p99 " + NOT_MEASURED, "muted"
    of = f" of {ms(budget)}" if budget is not None else ""
    if gate.p99_upper_ms is None:
        return f"p99 {ms(gate.p99_ms)}, no bound{of}", "warn"
    return f"p99 ≤ {ms(gate.p99_upper_ms)}{of}", tone


_MISSING = HeatCell(
    artifact="",
    verdict="missing",
    verdict_text=NOT_MEASURED,
    p99_text="",
    p99_tone="muted",
    parity_text="",
    parity_tone="muted",
    fallback_text="",
    emulated=False,
    stale=False,
)


def heat_cell(
    name: str, cell: Cell | None, now: CurrentVerdict | None, cls: HostClass | None, emulated: bool
) -> HeatCell:
    """One artifact's cell of a class's row: the verdict now, p99 bound, parity, fallback."""
    if cell is None or now is None:
        return replace(_MISSING, artifact=name)
    tones = cell_tones(cell, now, cls)
    p99, p99_tone = _p99_text(cell, cls.budgets.p99_ms if cls else None, tones.get("p99", ""))
    parity, parity_tone = with_tone(parity_text(cell, now), tones.get("parity"))
    return HeatCell(
        artifact=name,
        verdict=now.verdict,
        verdict_text=VERDICT_WORDS[now.verdict],
        p99_text=p99,
        p99_tone=p99_tone,
        parity_text=parity,
        parity_tone=parity_tone,
        fallback_text=fallback_note(cell),
        emulated=emulated,
        stale=now.stale,
    )


def build(inputs: Inputs, classes: Classes) -> MatrixView:
    return MatrixView(artifacts=tuple(inputs.columns), rows=classes.heat)
