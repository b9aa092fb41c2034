"""Where the nodes ran: nodes per provider, fallback against the class's allowance, and what
the runtime warned while measuring."""

from __future__ import annotations

from collections.abc import Sequence

from reports.formatting import NOT_MEASURED, provider_name
from reports.rows.table import Table
from reports.view import CompareRow, Tone
from schemas.cell import Cell
from schemas.project import HostClass
from schemas.rules import fallback_count

__all__ = ["fallback_note", "placement_rows", "warnings"]


def fallback_note(cell: Cell) -> str:
    """The heat map's short word on fallback ("" when every node ran where expected)."""
    placement = cell.placement
    if placement is None or not placement.fallback_nodes:
        return ""
    return f"fallback: {placement.fallback_nodes} nodes"


def _placement_parts(cell: Cell | None) -> tuple[tuple[str, bool], ...]:
    # Most nodes first; a provider other than the expected one that ran nodes is fallback.
    placement = cell.placement if cell is not None else None
    if placement is None:
        return ()
    ranked = sorted(placement.nodes_per_provider.items(), key=lambda kv: (-kv[1], kv[0]))
    kernel = placement.kernel_ms_per_provider or {}
    parts = tuple(
        (
            f"{provider_name(p)} {n}"
            + (f" ({kernel[p]:.3g} ms kernel time)" if p in kernel else "")
            + (" (fallback)" if fallback else ""),
            fallback,
        )
        for p, n in ranked
        for fallback in [p != placement.expected_provider and n > 0]
    )
    if placement.source == "profiler":
        parts += (("counted from the profiler: this onnxruntime has no placement API", False),)
    return parts


def _fallback_text(cell: Cell, cls: HostClass | None) -> tuple[str, Tone]:
    placement = cell.placement
    if placement is None:
        return NOT_MEASURED, "muted"
    expected = cls.provider.expected if cls is not None else placement.expected_provider
    fallback = fallback_count(placement.nodes_per_provider, expected)
    if placement.nodes_per_provider.get(expected, 0) == 0:
        return (
            f"{fallback} of {placement.total_nodes} nodes; {provider_name(expected)} ran none",
            "",
        )
    allowed = cls.provider.fallback_allowance if cls is not None else 0
    suffix = f" (allowed {allowed})" if allowed else ""
    return f"{fallback} of {placement.total_nodes} nodes{suffix}{_named(cell, fallback)}", ""


_NAMED_MOST = 5
"""Off-provider nodes the row names; the cell keeps up to 20, ``matrix show --json`` them all."""


def _named(cell: Cell, fallback: int) -> str:
    """ ": relu (Relu) on CPU, ... and N more": the nodes that ran off the expected provider,
    by name, where the cell recorded them."""
    nodes = (cell.placement.off_provider_nodes if cell.placement is not None else None) or []
    if not nodes or not fallback:
        return ""
    shown = ", ".join(
        f"{n.name or '(unnamed)'} ({n.op_type}) on {provider_name(n.provider)}"
        for n in nodes[:_NAMED_MOST]
    )
    more = fallback - min(len(nodes), _NAMED_MOST)
    return f": {shown}" + (f" and {more} more" if more > 0 else "")


def placement_rows(table: Table) -> list[CompareRow]:
    nodes = CompareRow(
        label="nodes per provider",
        values=tuple((NOT_MEASURED, "muted") for _ in table.cells),
        parts=tuple(_placement_parts(cell) for cell in table.cells),
    )
    return [nodes, table.row("fallback", lambda c: _fallback_text(c, table.cls), "placement")]


def warnings(cells: Sequence[Cell]) -> tuple[tuple[str, str, int], ...]:
    """(artifact, message, count) of what the runtime warned while each cell was measured,
    each cell's most frequent first."""
    return tuple(
        (cell.artifact_name, warning.message, warning.count)
        for cell in cells
        if cell.placement is not None
        for warning in sorted(cell.placement.warnings, key=lambda w: -w.count)
    )
