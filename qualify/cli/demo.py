"""``qualify demo``: build the demo project and qualify it (`qualify.demo`)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

__all__ = ["demo_cmd"]


@click.command("demo")
@click.option(
    "--workdir",
    type=click.Path(path_type=Path, file_okay=False),
    default="demo",
    show_default=True,
    help="Directory to build the demo in: missing or empty.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Start clean over an earlier demo: delete what a demo wrote in --workdir first. A "
    "folder no demo made, or holding other files, is refused and left as it is.",
)
def demo_cmd(workdir: Path, force: bool) -> None:
    """Build the demo project offline and qualify all of its host classes.

    The demo is one story in one folder: over an existing non-empty --workdir it refuses
    (exit 2) unless --force.
    """
    from qualify.demo.story import run_demo

    ok = run_demo(workdir, echo=click.echo, force=force)
    sys.exit(0 if ok else 1)
