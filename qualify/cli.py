"""The ``qualify`` command line: the composition root.

Owns parsing options, calling one library function per command, and printing or writing its
result. Every user-facing error of every package is turned into a one-line message and an exit
code here (``--debug`` shows the traceback instead). No SQL, statistics or HTML lives here.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from qualify import __version__
from qualify.errors import QualifyError

__all__ = ["main"]

DEFAULT_PROJECT = "qualify.yaml"
DEFAULT_DB = "qualify.duckdb"

F = TypeVar("F", bound=Callable[..., Any])


def _user_errors() -> tuple[type[Exception], ...]:
    from manifest.errors import ManifestError
    from matrix.errors import MatrixError

    return (QualifyError, MatrixError, ManifestError)


class QualifyGroup(click.Group):
    """A group that turns known errors into messages and exit codes."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except _user_errors() as exc:
            if ctx.find_root().params.get("debug"):
                raise
            _fail(str(exc), getattr(exc, "exit_code", 2))


def _fail(message: str, code: int = 2) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def project_option(f: F) -> F:
    return click.option(
        "--project",
        "project_path",
        type=click.Path(path_type=Path, dir_okay=False),
        default=DEFAULT_PROJECT,
        show_default=True,
        help="Project file.",
    )(f)


def db_option(f: F) -> F:
    return click.option(
        "--db",
        "db_path",
        type=click.Path(path_type=Path, dir_okay=False),
        default=DEFAULT_DB,
        show_default=True,
        help="Matrix database (DuckDB file).",
    )(f)


@click.group(cls=QualifyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="qualify")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
def cli(debug: bool) -> None:
    """Qualify ONNX artifacts per host class and publish signed release manifests."""


@cli.command("run")
@click.option("--host-class", "host_class", required=True, help="Host class to qualify.")
@project_option
@db_option
@click.option(
    "--emulate",
    is_flag=True,
    help="Measure even if this host does not match the class; cells are marked emulated.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the run summary as JSON.")
def run_cmd(
    host_class: str, project_path: Path, db_path: Path, emulate: bool, as_json: bool
) -> None:
    """Qualify every artifact on one host class and store the cells in the matrix.

    Exit status: 0 when every cell was measured (whatever its verdict), 1 when any cell ended
    in error, 2 for a usage or project-file error or a host that does not match the class.
    """
    from qualify.console import RunDisplay, run_summary
    from qualify.project import load_project
    from qualify.run import RunOptions, qualify_run

    loaded = load_project(project_path)
    options = RunOptions(db_path=db_path, emulate=emulate)
    with RunDisplay(enabled=not as_json) as display:
        outcome = qualify_run(loaded, host_class, options, on_event=display.event)
    summary = run_summary(outcome.bundle)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        display.print_cells(outcome.bundle, loaded.project)
    sys.exit(0 if outcome.ok else 1)


@cli.group("matrix")
def matrix_group() -> None:
    """Read, load and export the qualification matrix."""


@matrix_group.command("show")
@db_option
@project_option
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json", "csv"]),
    default="table",
    show_default=True,
    help="Output format.",
)
def matrix_show(db_path: Path, project_path: Path, fmt: str) -> None:
    """Show the latest cell per (hardware, runtime, provider, artifact)."""
    from matrix.store import Store
    from qualify.console import print_matrix, rows_to_csv

    _require_db(db_path)
    with Store.open(db_path) as db:
        rows = db.matrix_rows()
    budgets = _budgets(project_path)
    for row in rows:
        row["p99_budget_ms"] = budgets.get(row["host_class"])
    if fmt == "json":
        click.echo(json.dumps(rows, indent=2, default=str))
    elif fmt == "csv":
        click.echo(rows_to_csv(rows), nl=False)
    else:
        print_matrix(rows)


def _require_db(db_path: Path) -> None:
    if not db_path.exists():
        _fail(
            f"{db_path}: no matrix database here. Fix: run 'qualify run --host-class NAME' "
            "first, or pass --db PATH."
        )


def _budgets(project_path: Path) -> dict[str, float]:
    if not project_path.exists():
        return {}
    from qualify.project import load_project

    project = load_project(project_path).project
    return {name: c.budgets.p99_ms for name, c in project.host_classes.items()}


@matrix_group.command("ingest")
@click.argument("bundles", nargs=-1, required=True, type=click.Path(path_type=Path, exists=True))
@db_option
def matrix_ingest(bundles: tuple[Path, ...], db_path: Path) -> None:
    """Load run bundles (from other hosts) into the matrix; idempotent by run id."""
    from matrix.ingest import ingest_bundles
    from matrix.store import Store

    with Store.open(db_path) as db:
        report = ingest_bundles(db, list(bundles))
    for item in report.bundles:
        state = "ingested" if item.status == "ingested" else "already present"
        click.echo(f"{item.run_id}: {state} ({item.cells} cells, {item.samples} samples)")


@matrix_group.command("export")
@click.option(
    "--parquet",
    "out_dir",
    required=True,
    type=click.Path(path_type=Path, file_okay=False),
    help="Directory to write one Parquet file per table.",
)
@db_option
def matrix_export(out_dir: Path, db_path: Path) -> None:
    """Export the matrix tables and view as Parquet."""
    from matrix.store import Store

    _require_db(db_path)
    with Store.open(db_path) as db:
        paths = db.export_parquet(out_dir)
    for p in paths:
        click.echo(str(p))


@cli.command("demo")
@click.option(
    "--workdir",
    type=click.Path(path_type=Path, file_okay=False),
    default="demo",
    show_default=True,
    help="Directory to build the demo in.",
)
def demo_cmd(workdir: Path) -> None:
    """Build the demo project offline and qualify all of its host classes."""
    from qualify.demo import run_demo

    ok = run_demo(workdir, echo=click.echo)
    sys.exit(0 if ok else 1)


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="qualify")
