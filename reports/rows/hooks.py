"""Rows of a timed pipeline (hooks): the model call alone, and each stage's share."""

from __future__ import annotations

from reports.formatting import NOT_MEASURED, ms
from reports.rows.table import Table
from reports.view import CompareRow, Tone
from schemas.cell import Cell

__all__ = ["hooks_rows", "staged"]


def staged(table: Table) -> bool:
    """Whether some cell timed a pipeline of stages (its latency rows are then end to end)."""
    return table.any(
        lambda c: c.gate_latency is not None and c.gate_latency.stage_share is not None
    )


def _inference(cell: Cell) -> tuple[str, Tone]:
    # The model call alone, beside the end-to-end figures, when a pipeline was timed.
    gate = cell.gate_latency
    if gate is None or gate.inference_p50_ms is None or gate.inference_p99_ms is None:
        return NOT_MEASURED, "muted"
    return f"p50 {ms(gate.inference_p50_ms)}, p99 {ms(gate.inference_p99_ms)}", ""


def _stages(cell: Cell) -> tuple[str, Tone]:
    # Each stage's share of the timed time: a reader sees when pre-processing dominates.
    gate = cell.gate_latency
    if gate is None or gate.stage_share is None:
        return NOT_MEASURED, "muted"
    shares = gate.stage_share
    text = ", ".join(f"{stage} {share:.0%}" for stage, share in shares.items())
    return text, "warn" if shares.get("inference", 1.0) < 0.5 else ""


def hooks_rows(table: Table) -> list[CompareRow]:
    if not staged(table):
        return []
    return [table.row("inference alone", _inference), table.row("stages", _stages)]
