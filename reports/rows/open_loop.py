"""The request-rate row (shown where some cell searched one): what the open loop found."""

from __future__ import annotations

from reports.formatting import NOT_MEASURED, open_loop_text
from reports.rows.table import Table
from reports.view import CompareRow, Tone
from schemas.cell import Cell

__all__ = ["open_loop_row"]


def _rate_text(cell: Cell) -> tuple[str, Tone]:
    found = cell.open_loop
    if found is None:
        return NOT_MEASURED, "muted"
    return open_loop_text(found), "muted" if found.max_rate_rps is None else ""


def open_loop_row(table: Table) -> list[CompareRow]:
    if not table.any(lambda c: c.open_loop):
        return []
    return [table.row("request rate", _rate_text, "rate")]
