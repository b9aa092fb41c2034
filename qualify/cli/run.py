"""``qualify run``: qualify every artifact on one host class (`qualify.run`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from qualify.cli.ci import GATE_EXIT, _ci_options, _ci_outputs
from qualify.cli.errors import _fail, _say
from qualify.cli.options import _db_option, _project_option
from qualify.cli.output import echo_json, json_option, quiet_option

__all__ = ["run_cmd"]


@click.command("run")
@click.option("--host-class", "host_class", required=True, help="Host class to qualify.")
@_project_option
@_db_option
@click.option(
    "--emulate",
    is_flag=True,
    help="Measure even if this host does not match the class (cells are marked emulated), and "
    "compute parity on an emulated CPU of the class's ISA under QEMU where one exists (see "
    "qualify emulators show).",
)
@click.option(
    "--shared-host",
    is_flag=True,
    help="Measure without the host-wide lock, alongside other runs on this host (their tails "
    "suffer each other); cells say measured_alone false.",
)
@click.option(
    "--soak",
    "soak",
    metavar="DURATION",
    help="After the interleaved rounds, serve every artifact this long (e.g. 10m) at the gate "
    "config and judge drift (overrides workload.soak_s).",
)
@click.option(
    "--open-loop",
    "open_loop",
    is_flag=True,
    help="After the interleaved rounds, find each artifact's highest request rate (Poisson "
    "arrivals) whose p99 meets the class's budget (workload.open_loop, or its defaults).",
)
@click.option(
    "--lock-wait",
    "lock_wait",
    metavar="DURATION",
    default="10m",
    show_default=True,
    help="How long to wait for another run measuring on this host (the host-wide lock) before "
    "giving up, e.g. 30s, 1h; who holds it is said every 10 s.",
)
@json_option("run-summary")
@quiet_option
@_ci_options
def run_cmd(
    host_class: str,
    project_path: Path,
    db_path: Path,
    emulate: bool,
    shared_host: bool,
    soak: str | None,
    open_loop: bool,
    lock_wait: str,
    as_json: bool,
    quiet: bool,
    junit_xml: Path | None,
    summary_md: Path | None,
    gate: bool,
    published_manifest: Path | None,
    published_pubkey: Path | None,
) -> None:
    """Qualify every artifact on one host class and store the cells in the matrix.

    Exit status: 0 when every cell was measured (whatever its verdict), 1 when any cell ended
    in error, 2 for a usage or project-file error or a host that does not match the class, 3
    with --gate when the release cannot proceed for this class.
    """
    from qualify.measure.runner import start_probe

    start_probe()  # its interpreter starts while this one loads the run and the project
    from qualify.console import RunDisplay, run_summary
    from qualify.project.load import load_project
    from qualify.run import qualify_run

    options = _run_options(db_path, emulate, shared_host, soak, open_loop, lock_wait)
    loaded = load_project(project_path)
    with RunDisplay(quiet=quiet) as display:
        # A wait for another run's host lock is said even with --quiet: it explains a pause.
        waits = display.event if display.console.is_terminal and not quiet else _say
        outcome = qualify_run(
            loaded,
            host_class,
            options,
            on_event=display.event,
            on_wait=waits,
            on_progress=display.progress,
        )
    if as_json:
        echo_json(run_summary(outcome.bundle))
    else:
        display.print_cells(outcome.bundle, loaded.project)
    blocked = _ci_outputs(
        loaded,
        db_path,
        [host_class],
        junit=junit_xml,
        summary=summary_md,
        gate=gate,
        published=(published_manifest, published_pubkey),
    )
    sys.exit(1 if not outcome.ok else GATE_EXIT if blocked else 0)


def _run_options(
    db_path: Path,
    emulate: bool,
    shared_host: bool,
    soak: str | None,
    open_loop: bool,
    lock_wait: str,
) -> Any:
    """The run's `qualify.run.RunOptions` from its options, each bad value refused by name."""
    from datetime import timedelta

    from qualify.release.generate import parse_duration
    from qualify.run import RunOptions

    soak_s = None
    if soak is not None:
        soak_s = parse_duration(soak, what="--soak", most=timedelta(days=7)).total_seconds()
        if soak_s < 10:
            _fail(f"--soak {soak!r}: a soak needs at least 10s to have windows worth comparing")
    lock_wait_s = parse_duration(
        lock_wait, what="--lock-wait", most=timedelta(days=1)
    ).total_seconds()
    return RunOptions(
        db_path=db_path,
        emulate=emulate,
        measure_alone=not shared_host,
        host_lock_wait_s=lock_wait_s,
        soak_s=soak_s,
        open_loop=open_loop,
    )
