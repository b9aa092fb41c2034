"""Rows of the gate's latency: its config, p50 and p99, the p99's bound, the other configs."""

from __future__ import annotations

from reports.formatting import NOT_MEASURED, bare_ms, ms
from reports.rows.hooks import staged
from reports.rows.table import Table, Value
from reports.view import CompareRow, Tone
from schemas.cell import Cell

__all__ = ["bound_row", "config_row", "other_configs_row", "percentile_rows"]


def _config(cell: Cell) -> tuple[str, Tone]:
    # The latency config the gates judged (the other configs have their own row).
    gate = cell.gate_latency
    if gate is None:
        return NOT_MEASURED, "muted"
    tput = f", {gate.throughput_ips:,.0f}/s" if gate.throughput_ips is not None else ""
    return (
        f"{gate.config.label.replace('concurrency', 'conc.')}, n={gate.samples:,}{tput}",
        "",
    )


def config_row(table: Table) -> list[CompareRow]:
    return [table.row("gate config", _config)]


def _gate_ms(attr: str) -> Value:
    # One duration of the gate's latency config, e.g. ``p50_ms``.
    def get(cell: Cell) -> tuple[str, Tone]:
        gate = cell.gate_latency
        if gate is None:
            return NOT_MEASURED, "muted"
        return ms(getattr(gate, attr)), ""

    return get


def percentile_rows(table: Table) -> list[CompareRow]:
    """p50 and p99 of the gate's config (end to end where a pipeline was timed)."""
    suffix = " end to end" if staged(table) else ""
    return [
        table.row("p50" + suffix, _gate_ms("p50_ms")),
        table.row("p99" + suffix, _gate_ms("p99_ms")),
    ]


def _bound(cell: Cell) -> tuple[str, Tone]:
    # The p99's confidence interval; a sample too small for one says so.
    gate = cell.gate_latency
    if gate is None:
        return NOT_MEASURED, "muted"
    if gate.p99_upper_ms is None or gate.p99_lower_ms is None:
        return f"none: {gate.samples} samples too few", "warn"
    return (
        f"{bare_ms(gate.p99_lower_ms)} to {ms(gate.p99_upper_ms)} ({gate.confidence:.0%})",
        "",
    )


def bound_row(table: Table) -> list[CompareRow]:
    return [table.row("p99 bound", _bound, "p99")]


def _other_configs(cell: Cell) -> tuple[str, Tone]:
    # Latency configs other than the gate's, one short clause each (the gate has its own rows).
    gate = cell.gate_latency
    others = [r for r in cell.latency if r is not gate]
    if not others:
        return "none", "muted"
    return "; ".join(
        f"{r.config.short}: p50 {bare_ms(r.p50_ms)}, p99 {bare_ms(r.p99_ms)} "
        f"(≤ {bare_ms(r.p99_upper_ms) if r.p99_upper_ms is not None else '?'}) ms, "
        f"n={r.samples:,}, {r.decision}"
        for r in others
    ), ""


def other_configs_row(table: Table) -> list[CompareRow]:
    return [table.row("other configs", _other_configs)]
