"""``qualify tune``: race one class's session settings (`qualify.tune`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from qualify.cli.errors import _fail
from qualify.cli.options import _db_option, _project_option
from qualify.cli.output import echo_json, json_option, quiet_option

__all__ = ["tune_cmd"]


@click.command("tune")
@click.option("--host-class", "host_class", required=True, help="Host class to tune.")
@_project_option
@_db_option
@click.option(
    "--budget",
    "budget",
    default="2m",
    show_default=True,
    metavar="DURATION",
    help="Wall time for the race of configurations (the winner's qualification run comes on "
    "top), e.g. 90s, 5m.",
)
@click.option(
    "--max-trials",
    type=click.IntRange(2, 32),
    default=8,
    show_default=True,
    help="Configurations raced, the class's current settings included.",
)
@click.option("--artifact", help="Artifact to tune with; default: the first candidate.")
@click.option(
    "--no-write",
    "no_write",
    is_flag=True,
    help="Do not write the winner into the project file (still raced, qualified and stored).",
)
@click.option("--emulate", is_flag=True, help="Tune even if this host does not match the class.")
@json_option("tune-record")
@quiet_option
def tune_cmd(
    host_class: str,
    project_path: Path,
    db_path: Path,
    budget: str,
    max_trials: int,
    artifact: str | None,
    no_write: bool,
    emulate: bool,
    as_json: bool,
    quiet: bool,
) -> None:
    """Race session settings for one class and keep the fastest that passes every gate.

    Tries the class's current provider settings against changes of threads, execution mode,
    graph optimisation level, thread spinning, CPU affinity, integer precision and the
    provider's own options, each in its own process with interleaved, paired rounds, dropping
    the clearly slower half after each stage. A configuration wins only when its p50 and p99
    ratios to the current settings have upper confidence bounds of at most 1; it is then
    qualified by a full run (parity included) and, on pass, written into the class's provider
    section. Every trial is stored in the matrix (qualify report shows them).

    Exit status: 0 when the tune finished (whether or not anything beat the current settings),
    1 when the winner's qualification run failed or no trial finished to be compared with the
    current settings (every one timed out or failed: each is said), 2 for a usage or
    project-file error.
    """
    from datetime import timedelta

    from qualify.console import RunDisplay
    from qualify.project.load import load_project
    from qualify.release.generate import parse_duration
    from qualify.run import RunOptions
    from qualify.tune import TuneOptions, tune_class

    budget_s = parse_duration(budget, what="--budget", most=timedelta(hours=12)).total_seconds()
    if budget_s < 5:
        _fail(f"--budget {budget!r}: a race needs at least 5s to compare anything")
    loaded = load_project(project_path)
    options = RunOptions(db_path=db_path, emulate=emulate)
    tune = TuneOptions(
        budget_s=budget_s, max_trials=max_trials, artifact=artifact, write=not no_write
    )
    with RunDisplay(quiet=quiet) as display:
        outcome = tune_class(
            loaded, host_class, options, tune, on_event=display.event, on_progress=display.progress
        )
    record = outcome.record
    if as_json:
        echo_json(record)
    else:
        _echo_trials(record, measured=outcome.measured)
    failed = record.winner != 0 and record.qualification_verdict != "pass"
    sys.exit(1 if failed or not outcome.measured else 0)


def _echo_trials(record: Any, *, measured: bool) -> None:
    """The tune's text: one line per trial with its ratios to the current settings, then the
    winner (``--json`` prints the record)."""
    from qualify.table import shorten

    for trial in record.trials:
        r = trial.vs_current
        ratio = (
            f"p50 x{r.p50_ratio:.3f} [{_bound(r.p50_lower)}, {_bound(r.p50_upper)}]  "
            f"p99 x{r.p99_ratio:.3f} [{_bound(r.p99_lower)}, {_bound(r.p99_upper)}]"
            if r is not None and r.p50_ratio is not None and r.p99_ratio is not None
            else "no paired rounds"
            if trial.trial
            else "reference"
        )
        click.echo(f"  {trial.trial:>2} {trial.status:<9} {shorten(trial.label):<40} {ratio}")
    if measured:
        click.echo(f"winner: {record.winner_label}: {record.outcome}")
    else:
        click.echo(f"no winner: {record.outcome}")


def _bound(value: float | None) -> str:
    return "?" if value is None else f"{value:.3f}"
