"""Rows of a cell's standing: its verdict now, what makes its numbers doubtful, its gates."""

from __future__ import annotations

from collections.abc import Mapping

from manifest.gates import assess
from manifest.verdict import STALE_CODES, CurrentVerdict
from reports.formatting import VERDICT_WORDS
from reports.rows.table import Table
from reports.tones import verdict_tone
from reports.view import CompareRow, Tone
from schemas.cell import Cell, RunRecord
from schemas.project import HostClass

__all__ = ["emulated", "gates_row", "measured_row", "verdict_row"]


def emulated(cell: Cell, runs: Mapping[str, RunRecord]) -> bool:
    """Whether the cell, or the run it came from, was measured under emulation."""
    run = runs.get(cell.run_id)
    return cell.emulated or (run is not None and run.emulated)


def verdict_row(table: Table) -> list[CompareRow]:
    # The verdict under the project file now (``manifest.verdict``), not the runner's.
    def verdict(cell: Cell) -> tuple[str, Tone]:
        now = table.now(cell)
        return VERDICT_WORDS[now.verdict], verdict_tone(now.verdict)

    return [table.row("verdict", verdict)]


def _flags(
    cell: Cell, runs: Mapping[str, RunRecord], now: CurrentVerdict | None
) -> tuple[str, Tone]:
    # What makes a cell's numbers doubtful here: emulation, another ISA's numerics, staleness.
    marks = []
    if emulated(cell, runs):
        marks.append("emulated")
    if cell.isa_mismatch:
        marks.append("numerics from another ISA (" + "; ".join(cell.isa_mismatch) + ")")
    numerics = cell.numerics
    if numerics is not None and numerics.source == "emulated":
        marks.append(f"numerics of this ISA, emulated on {numerics.cpu} (QEMU {numerics.qemu})")
    if now is not None and now.stale:
        marks.append("stale: " + "; ".join(r.message for r in now.reasons))
    return (", ".join(marks), "warn") if marks else ("current", "")


def measured_row(table: Table) -> list[CompareRow]:
    """Said only where some cell's numbers are doubtful."""

    def flags(cell: Cell) -> tuple[str, Tone]:
        return _flags(cell, table.runs, table.now(cell))

    return [table.row("measured", flags)] if table.any(lambda c: flags(c)[0] != "current") else []


def _judged(cell: Cell, now: CurrentVerdict | None, cls: HostClass | None) -> tuple[str, Tone]:
    # Which gates fail or cannot decide under the project now (manifest.verdict), in a sentence.
    if cls is None or now is None:
        return "no class to judge against", "muted"
    if now.stale:
        return "not judged: stale (" + ", ".join(STALE_CODES[c] for c in now.codes) + ")", "warn"
    if cell.error is not None:
        return "not judged: it could not run", "muted"
    # The gates as the current verdict applies them: parity against the tolerances now.
    rejudged = cell.role == "candidate" and cell.parity is not None
    findings = assess(cell, cls, skip=("parity",) if rejudged else ())
    failed = [g.name for g, f in findings if f.outcome == "fail"]
    undecided = [g.name for g, f in findings if f.outcome == "undecided"]
    if rejudged and "parity_failed" in now.codes:
        failed.insert(0, "parity")
    if not failed and not undecided:
        return "every configured gate held", "ok"
    parts = ([f"failed: {', '.join(failed)}"] if failed else []) + (
        [f"undecided: {', '.join(undecided)}"] if undecided else []
    )
    return "; ".join(parts), "bad" if failed else "warn"


def gates_row(table: Table) -> list[CompareRow]:
    return [table.row("gates", lambda c: _judged(c, table.now(c), table.cls))]
