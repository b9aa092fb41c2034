"""``qualify report``: write the HTML qualification report (`qualify.reporting`)."""

from __future__ import annotations

from pathlib import Path

import click

from qualify.cli.options import _db_option, _project_option, _RegularFile, _require_db

__all__ = ["report_cmd"]


@click.command("report")
@click.option(
    "--out",
    type=_RegularFile(),
    default="report.html",
    show_default=True,
    help="HTML file to write (self-contained).",
)
@click.option(
    "--manifest",
    "manifest_path",
    type=_RegularFile(exists=True),
    help="Manifest to report on; default: ./manifest.json when present (what hosts get), else "
    "the newest one published in the matrix. The report's header says which.",
)
@click.option(
    "--pubkey",
    type=_RegularFile(exists=True),
    help="Trusted public key to verify the manifest's signature for the header.",
)
@_project_option
@_db_option
def report_cmd(
    out: Path, manifest_path: Path | None, pubkey: Path | None, project_path: Path, db_path: Path
) -> None:
    """Write the HTML qualification report: matrix heat map, per-class evidence, manifest diff."""
    from datetime import UTC, datetime

    from matrix.store import Store
    from qualify.project.load import load_project
    from qualify.reporting import write_qualification_report

    loaded = load_project(project_path, check_models=False)
    _require_db(db_path)
    with Store.open(db_path, read_only=True, model=loaded.project.model) as db:
        path = write_qualification_report(
            loaded, db, out, now=datetime.now(UTC), manifest_path=manifest_path, pubkey=pubkey
        )
    click.echo(f"report: {path}")
