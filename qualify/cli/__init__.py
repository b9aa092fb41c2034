"""The ``qualify`` command line, the composition root: the ``qualify`` group, and one module per
command (group) beside it, each a thin adapter that parses options, calls one library function
and prints or writes its result. How errors become messages and exit codes: ``errors``."""

from __future__ import annotations

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
from qualify.cli.errors import _QualifyGroup, flushed_at_exit

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
    with flushed_at_exit():
        cli(prog_name="qualify")
