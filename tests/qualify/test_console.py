"""The run's display (qualify.console): its steps on a pipe or in a log, and its table."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from qualify.console import PIPE_PROGRESS_S, RunDisplay, run_summary
from qualify.project.load import load_project
from qualify.run import RunOptions, qualify_run
from schemas.cell import Reason
from tests.qualify.projects import write_project
from tests.qualify.scripted import Script, ScriptedWorkers, digest_of


def _piped(display: RunDisplay) -> io.StringIO:
    out = io.StringIO()
    display.console = Console(file=out, force_terminal=False, width=200, log_path=False)
    return out


def test_piped_progress_is_a_line_at_most_every_interval_so_a_ci_log_is_never_silent() -> None:
    now = [0.0]
    display = RunDisplay(clock=lambda: now[0])
    out = _piped(display)
    with display:
        for second in range(0, 61):
            now[0] = float(second)
            display.progress(f"batch 1, concurrency 1: round {second + 1} (at least 40)")
    lines = [line for line in out.getvalue().splitlines() if "round" in line]
    # The first at once, then one per interval: 0, 10, ..., 60 s.
    assert len(lines) == 60 // int(PIPE_PROGRESS_S) + 1
    assert "round 1 " in lines[0] and "round 61 " in lines[-1]


def test_piped_steps_and_progress_are_shown_in_every_mode_and_quiet_silences_them() -> None:
    display = RunDisplay(clock=lambda: 0.0)
    out = _piped(display)
    with display:
        display.event("measuring identity_mlp")
        display.progress("round 3 \x1b[31m(at least 40)")
    said = out.getvalue()
    assert "measuring identity_mlp" in said and "round 3" in said
    assert "\x1b" not in said  # a control character in a label cannot recolour the log
    quiet = RunDisplay(quiet=True, clock=lambda: 0.0)
    silenced = _piped(quiet)
    with quiet:
        quiet.event("measuring identity_mlp")
        quiet.progress("round 3")
    assert silenced.getvalue() == ""


def test_a_piped_step_is_one_line_whatever_its_length() -> None:
    """Rich wraps at the 80 columns it assumes for a pipe: a step's line is written whole."""
    display = RunDisplay(clock=lambda: 0.0)
    out = io.StringIO()
    display.console = Console(file=out, force_terminal=False, width=80, log_path=False)
    step = "parity of int8-qdq-per-channel against the baseline " + "x" * 200
    with display:
        display.event(step)
    (line,) = out.getvalue().splitlines()
    assert line.endswith(step) and line.startswith("[")


def test_the_run_table_shows_each_artifact_on_one_line_its_reasons_cut_with_an_ellipsis(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Eight long reasons (a swept-dims run's) wrapped to six lines per candidate: now one line,
    and the run's JSON keeps every sentence whole."""
    project = write_project(tmp_path, ["classifier"])
    scripts = {digest_of(p): Script() for p in (tmp_path / "models").glob("*.onnx")}
    loaded = load_project(project)
    outcome = qualify_run(
        loaded,
        "here-cpu",
        RunOptions(db_path=tmp_path / "m.duckdb", measure_alone=False),
        workers=ScriptedWorkers(scripts).seam(),
    )
    long = [
        Reason(code="parity_failed", message=f"dims {k}: " + "max abs 0.5 " * 20) for k in range(8)
    ]
    cells = [c.model_copy(update={"reasons": long}) for c in outcome.bundle.cells]
    bundle = outcome.bundle.model_copy(update={"cells": cells})
    RunDisplay().print_cells(bundle, loaded.project)
    # One line per artifact (a wrapped cell would continue on lines of its own), each cut.
    rows = [line for line in capsys.readouterr().out.splitlines() if "max abs" in line]
    assert len(rows) == 2 and all("dims 0: max abs" in row and "…" in row for row in rows)
    summary = run_summary(bundle)
    assert summary["cells"][0]["reasons"][7]["message"] == long[7].message
