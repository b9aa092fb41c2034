"""``qualify init``: a first project file from a model (`qualify.project.init`)."""

from __future__ import annotations

from pathlib import Path

import click

from qualify.cli.errors import _fail
from qualify.cli.options import DEFAULT_PROJECT, _RegularFile

__all__ = ["init_cmd"]


@click.command("init")
@click.argument("model", type=_RegularFile(exists=True))
@click.option(
    "--candidate",
    "candidates",
    multiple=True,
    type=_RegularFile(exists=True),
    help="A candidate artifact (repeat for several).",
)
@click.option(
    "--out",
    type=_RegularFile(),
    default=DEFAULT_PROJECT,
    show_default=True,
    help="Project file to write.",
)
@click.option("--force", is_flag=True, help="Replace an existing project file.")
def init_cmd(model: Path, candidates: tuple[Path, ...], out: Path, force: bool) -> None:
    """Write a first project file from MODEL's own inputs, dtypes and shapes.

    Inputs are generated (seeded); dynamic dimensions other than the batch get a value and a
    comment saying what to choose; one host class matches this host; budgets are placeholders
    marked SET. The file loads and runs as written: then edit what it marks.
    """
    import platform

    from qualify.measure.runner import probe_runtime
    from qualify.project.init import write_initial_project

    if (out.exists() or out.is_symlink()) and not force:
        _fail(f"{out} exists; pass --force to replace it, or --out another path")
    version = str(probe_runtime()["version"])
    write_initial_project(
        model, list(candidates), out, arch=platform.machine(), runtime_version=version
    )
    click.echo(
        f"wrote {out}: edit the lines marked CHOOSE and SET, then: qualify run --host-class this-host"
    )
