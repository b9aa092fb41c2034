"""One class's side-by-side table as its rows see it: the cells, their verdicts now, the class.

Owns ``Table`` and ``Value``; each row module (``reports.rows``) turns a ``Table`` into rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from manifest.verdict import CurrentVerdict
from reports.tones import gate_tones, with_tone
from reports.view import CompareRow, Tone
from schemas.cell import Cell, RunRecord
from schemas.project import HostClass

__all__ = ["Table", "Value", "cell_tones"]

Value = Callable[[Cell], tuple[str, Tone]]
"""One artifact's value in a row of the side-by-side table: its text and own tone."""


def cell_tones(cell: Cell, now: CurrentVerdict, cls: HostClass | None) -> dict[str, Tone]:
    """`gate_tones`, with the parity's tone as judged under the project's tolerances now."""
    tones = gate_tones(cell, cls) if not now.stale else {}
    if cell.parity is not None and cell.role == "candidate" and not now.stale:
        tones["parity"] = "bad" if "parity_failed" in now.codes else "ok"
    return tones


@dataclass(frozen=True)
class Table:
    """The cells of one class's table (one per shown artifact) and what judges them now."""

    cells: Sequence[Cell]
    nows: Sequence[CurrentVerdict]
    cls: HostClass | None
    runs: Mapping[str, RunRecord]
    _tones: list[dict[str, Tone]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        tones = [cell_tones(c, n, self.cls) for c, n in zip(self.cells, self.nows, strict=True)]
        object.__setattr__(self, "_tones", tones)

    def now(self, cell: Cell) -> CurrentVerdict:
        """The current verdict of one of the table's cells."""
        return next(n for c, n in zip(self.cells, self.nows, strict=True) if c is cell)

    def row(self, label: str, fn: Value, gate: str | None = None) -> CompareRow:
        """A row of ``fn``'s value per cell; a row a gate judges takes that gate's tone (one
        rule, as the runner and the policy apply it)."""
        return CompareRow(
            label=label,
            values=tuple(
                with_tone(fn(cell), tone.get(gate) if gate else None)
                for cell, tone in zip(self.cells, self._tones, strict=True)
            ),
        )

    def any(self, has: Callable[[Cell], object]) -> bool:
        """Whether some cell of the table has what ``has`` looks for."""
        return any(has(cell) for cell in self.cells)
