"""The energy row: energy per inference at the gate's config, and its counters or why none."""

from __future__ import annotations

from reports.formatting import NOT_MEASURED
from reports.rows.table import Table
from reports.view import CompareRow, Tone
from schemas.cell import Cell

__all__ = ["energy_row"]


def _energy_text(cell: Cell) -> tuple[str, Tone]:
    gate = cell.gate_latency
    if gate is None:
        return NOT_MEASURED, "muted"
    if gate.energy_mj is None:
        why = f": {gate.energy_missing}" if gate.energy_missing else ""
        return f"{NOT_MEASURED}{why}", "muted"
    return f"{gate.energy_mj:.3g} mJ per inference ({', '.join(gate.energy_source or [])})", ""


def energy_row(table: Table) -> list[CompareRow]:
    return [table.row("energy", _energy_text, "energy")]
