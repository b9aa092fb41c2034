"""The run's display when its output is a pipe or a log (qualify.console)."""

from __future__ import annotations

import io

from rich.console import Console

from qualify.console import PIPE_PROGRESS_S, RunDisplay


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
