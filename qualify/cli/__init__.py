"""The ``qualify`` command line, the composition root: the ``qualify`` group, and one module per
command (group) beside it, each a thin adapter that parses options, calls one library function
and prints or writes its result. How errors become messages and exit codes: ``errors``."""

from __future__ import annotations

import sys

import click

from qualify import __version__
from qualify.cli import (
    candidates,
    demo,
    emulators,
    fleet,
    init,
    keygen,
    manifest,
    matrix,
    report,
    rollout,
    run,
    telemetry,
    tune,
)
from qualify.cli.errors import _QualifyGroup, end_on_closed_pipe

__all__ = ["cli", "main"]


@click.group(cls=_QualifyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="qualify")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
def cli(debug: bool) -> None:
    """Qualify ONNX artifacts per host class and publish signed release manifests."""


for _command in (
    run.run_cmd,
    candidates.candidates_cmd,
    tune.tune_cmd,
    emulators.emulators_group,
    matrix.matrix_group,
    telemetry.telemetry_group,
    keygen.keygen_cmd,
    manifest.manifest_group,
    report.report_cmd,
    demo.demo_cmd,
    init.init_cmd,
    fleet.fleet_group,
    rollout.rollout_group,
):
    cli.add_command(_command)


def main() -> None:
    """Console-script entry point."""
    try:
        cli(prog_name="qualify")
    finally:
        # What a command wrote without a flush is flushed here, not by the interpreter at exit,
        # where a closed pipe would print "Exception ignored ... BrokenPipeError".
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            end_on_closed_pipe()
