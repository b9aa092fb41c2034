"""The rows of each class's side-by-side table, one module per measurement, listed in ROWS.

A new measurement adds its module here and one entry to ``ROWS``; the builder is untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from reports.rows import (
    energy,
    hooks,
    identity,
    latency,
    open_loop,
    parity,
    placement,
    resources,
    soak,
    verdict,
)
from reports.rows.table import Table
from reports.view import CompareRow

__all__ = ["ROWS", "compare"]

ROWS: tuple[Callable[[Table], Sequence[CompareRow]], ...] = (
    verdict.verdict_row,
    verdict.measured_row,
    latency.config_row,
    latency.percentile_rows,
    hooks.hooks_rows,
    verdict.gates_row,
    latency.bound_row,
    parity.parity_row,
    placement.placement_rows,
    resources.resource_rows,
    energy.energy_row,
    soak.soak_row,
    open_loop.open_loop_row,
    identity.digest_row,
    latency.other_configs_row,
)
"""The table's rows in order; each gives its rows for a table (none where it does not apply)."""


def compare(table: Table) -> tuple[CompareRow, ...]:
    """Every row of one class's side-by-side table, in ``ROWS`` order."""
    return tuple(row for make in ROWS for row in make(table))
