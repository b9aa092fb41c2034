"""The soak row (shown where some cell soaked): p99 per window, first to last, and the heat."""

from __future__ import annotations

from reports.formatting import NOT_MEASURED
from reports.rows.table import Table
from reports.view import CompareRow, Tone
from schemas.cell import Cell

__all__ = ["soak_row"]


def _soak_text(cell: Cell) -> tuple[str, Tone]:
    soak = cell.soak
    if soak is None:
        return NOT_MEASURED, "muted"
    p99s = ", ".join("?" if w.p99_ms is None else f"{w.p99_ms:.3g}" for w in soak.windows)
    temps = [w.temp_c for w in soak.windows if w.temp_c is not None]
    heat = f"; up to {max(temps):.0f} °C" if temps else ""
    verdict = {True: "drifted", False: "steady", None: "undecided"}[soak.drifted]
    return f"{soak.seconds:.0f} s, p99 by window {p99s} ms: {verdict}{heat}", ""


def soak_row(table: Table) -> list[CompareRow]:
    return [table.row("soak", _soak_text, "sustained")] if table.any(lambda c: c.soak) else []
