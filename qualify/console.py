"""The run's terminal output: its progress on stderr (`RunDisplay`), its result table (rich), and
the ``run --json`` document (`run_summary`). Computes nothing that is not in the cells."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.status import Status
from rich.table import Table
from rich.text import Text

from qualify.table import VERDICT_COLOR, shorten
from qualify.text import one_line

if TYPE_CHECKING:
    from schemas.cell import Cell, RunBundle
    from schemas.project import Project

__all__ = [
    "PIPE_PROGRESS_S",
    "RunDisplay",
    "cell_summary",
    "plain",
    "run_summary",
]


PIPE_WIDTH = 240
"""Columns a table may use when the output is a pipe or a log, not a terminal: rich's default of
80 would cut every column of the run's table to a few characters in a CI log."""


def _console(*, stderr: bool = False) -> Console:
    """A console for the terminal, or for a pipe or log as wide as `PIPE_WIDTH` (``COLUMNS``,
    when set, wins, as everywhere in rich)."""
    console = Console(stderr=stderr)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = PIPE_WIDTH
    return console


def plain(value: object) -> str:
    """A user string (a name, a path, an error from a model) for the terminal: control
    characters (newlines, ANSI escapes) spelled out and rich markup escaped, so that no input
    can split a line, forge one, recolour the terminal or break the renderer (``int8[/]``)."""
    return escape(one_line(value))


def _ms(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.3f}" if value < 10 else f"{value:.1f}"


def cell_summary(cell: Cell) -> dict[str, Any]:
    """The per-cell part of ``qualify run --json``."""
    gate = cell.gate_latency
    return {
        "artifact_digest": cell.artifact_digest,
        "artifact_name": cell.artifact_name,
        "role": cell.role,
        "verdict": cell.verdict,
        "reasons": [r.model_dump() for r in cell.reasons],
        "p50_ms": gate.p50_ms if gate else None,
        "p99_ms": gate.p99_ms if gate else None,
        "p99_upper_ms": gate.p99_upper_ms if gate else None,
        "inference_p50_ms": gate.inference_p50_ms if gate else None,
        "inference_p99_ms": gate.inference_p99_ms if gate else None,
        "stage_share": gate.stage_share if gate else None,
        "energy_mj": gate.energy_mj if gate else None,
        "energy_missing": gate.energy_missing if gate else None,
        "samples": gate.samples if gate else None,
        "nodes_per_provider": cell.placement.nodes_per_provider if cell.placement else None,
        "fallback_nodes": cell.placement.fallback_nodes if cell.placement else None,
        "kernel_ms_per_provider": cell.placement.kernel_ms_per_provider if cell.placement else None,
        "peak_rss_mb": cell.peak_rss_mb,
        "cold_init_ms": cell.cold_init_ms,
        "parity_passed": cell.parity.passed if cell.parity else None,
        "warnings": [w.model_dump() for w in cell.placement.warnings] if cell.placement else [],
        "numerics": cell.numerics.model_dump() if cell.numerics else None,
    }


def run_summary(bundle: RunBundle) -> dict[str, Any]:
    """The document ``qualify run --json`` prints."""
    run = bundle.run
    return {
        "run_id": run.run_id,
        "host_class": run.host_class,
        "key": run.key.model_dump(),
        "emulated": run.emulated,
        "mismatches": run.mismatches,
        "rollback": run.rollback.model_dump() if run.rollback else None,
        "cells": [cell_summary(c) for c in bundle.cells],
    }


PIPE_PROGRESS_S = 10.0
"""When the output is a pipe or a log, at most one progress line per this many seconds: a CI log
shows where sampling stands without a line per round of a fast model."""


class RunDisplay:
    """Progress on stderr in every mode (``--json`` too, beside the JSON on stdout): a live status
    line on a terminal; on a pipe or in a log, one plain line per step, never wrapped or padded
    by the renderer (a CI log gets each step whole, whatever its width), and sampling progress at
    most once per `PIPE_PROGRESS_S`; nothing at all with ``quiet`` (``--quiet``)."""

    def __init__(self, quiet: bool = False, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.quiet = quiet
        # No source location on each line (qualify's own file:line tells a user nothing).
        self.console = Console(stderr=True, log_path=False)
        self._status: Status | None = None
        self._clock = clock
        self._last_progress: float | None = None

    def __enter__(self) -> RunDisplay:
        if not self.quiet and self.console.is_terminal:
            self._status = self.console.status("starting", spinner="dots")
            self._status.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._status is not None:
            self._status.stop()

    def event(self, message: str) -> None:
        """Show one step: the line is kept and the spinner names the step."""
        if self.quiet:
            return
        if not self.console.is_terminal:
            self._line(message)
            return
        text = Text(one_line(message))  # a Text is never parsed as markup
        self.console.log(text, highlight=False)
        if self._status is not None:
            self._status.update(text)

    def progress(self, message: str) -> None:
        """Where a step stands: in place of the spinner's text on a terminal (not kept); as a
        line on a pipe or in a log, at most one per `PIPE_PROGRESS_S` (the first at once), so
        that a CI log is never silent for minutes while the rounds sample."""
        if self.quiet:
            return
        if self.console.is_terminal:
            if self._status is not None:
                self._status.update(Text(one_line(message)))
            return
        now = self._clock()
        if self._last_progress is not None and now - self._last_progress < PIPE_PROGRESS_S:
            return
        self._last_progress = now
        self._line(message)

    def _line(self, message: str) -> None:
        """One line on a pipe or in a log, as it is: rich would wrap it at the 80 columns it
        assumes for a pipe (and pad it to them)."""
        stream = self.console.file
        stream.write(f"[{time.strftime('%H:%M:%S')}] {one_line(message)}\n")
        stream.flush()

    def print_cells(self, bundle: RunBundle, project: Project) -> None:
        """The result table of one run."""
        budget = project.host_classes[bundle.run.host_class].budgets
        title = f"run {plain(bundle.run.run_id)}" + (" (EMULATED)" if bundle.run.emulated else "")
        table = Table(title=title)
        for col in (
            "artifact",
            "role",
            "verdict",
            "p50 ms",
            "p99 ms",
            "p99 bound",
            "budget",
            "n",
            "fallback",
            "peak MB",
            "cold ms",
        ):
            table.add_column(col)
        # One line per artifact, however many reasons: cut with an ellipsis where the width
        # ends (the JSON and the report have every sentence whole).
        table.add_column("reasons", no_wrap=True, overflow="ellipsis")
        for cell in bundle.cells:
            gate = cell.gate_latency
            style = VERDICT_COLOR[cell.verdict]
            table.add_row(
                plain(cell.artifact_name),
                cell.role,
                f"[{style}]{cell.verdict}[/]",
                _ms(gate.p50_ms if gate else None),
                _ms(gate.p99_ms if gate else None),
                _ms(gate.p99_upper_ms if gate else None),
                _ms(budget.p99_ms),
                str(gate.samples) if gate else "—",
                "—" if cell.placement is None else str(cell.placement.fallback_nodes),
                "—" if cell.peak_rss_mb is None else f"{cell.peak_rss_mb:.0f}",
                _ms(cell.cold_init_ms),
                escape(shorten("; ".join(r.message for r in cell.reasons))),
            )
        _console().print(table)
