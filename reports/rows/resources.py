"""Rows of what a session costs to start and hold: cold and warm init, peak memory."""

from __future__ import annotations

from collections.abc import Callable

from reports.formatting import NOT_MEASURED, mb, ms
from reports.rows.table import Table
from reports.view import CompareRow, Tone

__all__ = ["resource_rows"]

_RSS_SOURCES = {
    "wait4": "os.wait4",
    "vmhwm": "child's VmHWM",
    "vmhwm-before-kill": "VmHWM before the timeout kill",
}


def _against(
    value: float | None, budget: float | None, fmt: Callable[[float | None], str]
) -> tuple[str, Tone]:
    if value is None:
        return NOT_MEASURED, "muted"
    if budget is None:
        return f"{fmt(value)} (no budget)", ""
    share = value / budget
    return f"{fmt(value)} of {fmt(budget)} ({share:.0%})", ""


def _measured_by(shown: tuple[str, Tone], source: str | None) -> tuple[str, Tone]:
    text, tone = shown
    if source is None or text == NOT_MEASURED:
        return shown
    return f"{text}, by {_RSS_SOURCES.get(source, source)}", tone


def resource_rows(table: Table) -> list[CompareRow]:
    budgets = table.cls.budgets if table.cls else None
    return [
        table.row(
            "cold init",
            lambda c: _against(c.cold_init_ms, budgets.cold_init_ms if budgets else None, ms),
            "cold init",
        ),
        table.row(
            "warm init",
            lambda c: (ms(c.warm_init_ms), "" if c.warm_init_ms is not None else "muted"),
        ),
        table.row(
            "peak memory",
            lambda c: _measured_by(
                _against(c.peak_rss_mb, budgets.peak_rss_mb if budgets else None, mb),
                c.peak_rss_source,
            ),
            "memory",
        ),
    ]
