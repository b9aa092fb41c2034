"""``qualify matrix``: show, gate, ingest, export, split and list what is stale in the matrix."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from qualify.cli.ci import GATE_EXIT, _ci_outputs, _published_options
from qualify.cli.errors import _fail
from qualify.cli.options import _db_option, _project_option, _RegularFile, _require_db
from qualify.cli.output import echo_json, json_option

if TYPE_CHECKING:
    from matrix.store import Store
    from qualify.project.view import ProjectView
    from qualify.release.coverage import CoverageItem

__all__ = ["matrix_group"]


@click.group("matrix")
def matrix_group() -> None:
    """Read, load and export the qualification matrix."""


@matrix_group.command("show")
@_db_option
@_project_option
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json", "csv"]),
    default="table",
    show_default=True,
    help="Output format: csv writes the rows with plain values (lists as JSON text); json the "
    "rows alone (the older form: --json prints the whole document).",
)
@json_option("matrix-show")
def matrix_show(db_path: Path, project_path: Path, fmt: str, as_json: bool) -> None:
    """Show each class x artifact of the project with its verdict under the project file now
    (budgets, tolerances and the artifacts' bytes as they are today; stale where the stored
    evidence cannot say), and every gap. Without a project file: the latest cell per
    (hardware, runtime, provider, artifact), as measured."""
    from matrix.store import Store
    from qualify.release.coverage import unmeasured
    from qualify.table import TITLE, TITLE_NOW, rows_to_csv, with_budgets

    _require_db(db_path)
    items: list[CoverageItem] | None = None
    orphans = 0
    title = TITLE
    with Store.open(db_path, read_only=True) as db:  # showing never writes, nor migrates
        rows = with_budgets(db.matrix_rows(), None)
        unserved = db.unserved()
        # With a project, the warnings of its classes' cells (other keys' are counted, not shown).
        keys: set[tuple[str, str, str]] | None = None
        fleet_gaps = db.fleet_gaps() if as_json else {}
        if project_path.exists() and not rows and db.model_line() is None:
            # Nothing measured, of any line: every class x artifact is a gap, which the
            # project's recorded view says without validating the file again.
            items = unmeasured(_project_view(project_path, db), unserved=unserved)
        elif project_path.exists():
            from qualify.project.load import load_project
            from qualify.release.current import show_now

            loaded = load_project(project_path, check_models=False)
            db.require_model_line(loaded.project.model)
            shown = show_now(loaded, db, unserved=unserved)
            rows, items, orphans, title = shown.rows, shown.items, shown.orphans, TITLE_NOW
            keys = {c.key.as_tuple() for c in loaded.project.host_classes.values()}
        warned = db.latest_warnings(keys) if fmt == "table" or as_json else []
    if as_json:
        echo_json(_show_document(rows, items, warned, fleet_gaps, orphans))
    elif fmt == "json":
        click.echo(json.dumps(rows, indent=2, default=str))
    elif fmt == "csv":
        click.echo(rows_to_csv(rows), nl=False)
    else:
        _echo_show(rows, items, warned, orphans, title=title, project_path=project_path)


def _show_document(
    rows: list[dict[str, Any]],
    items: list[CoverageItem] | None,
    warned: list[tuple[str, str, list[tuple[str, int]]]],
    fleet_gaps: dict[str, tuple[str, str]],
    orphans: int,
) -> dict[str, Any]:
    """``matrix show --json``: `schemas.output.MatrixShown`, built with the standard library
    (showing the matrix loads no pydantic; a test validates the document against the schema)."""
    from qualify.release.coverage import coverage_line

    coverage = [_coverage_entry(item) for item in items] if items is not None else None
    return {
        "basis": "measured" if items is None else "project",
        "rows": rows,
        "coverage": coverage,
        "summary": coverage_line(items) if items is not None else None,
        "warnings": [
            {
                "host_class": host_class,
                "artifact_name": name,
                "warnings": [
                    {"message": message, "count": count}
                    for message, count in sorted(said, key=lambda item: -item[1])
                ],
            }
            for host_class, name, said in warned
        ],
        "fleet_gaps": [
            {"host_class": name, "reason": reason, "detail": detail}
            for name, (reason, detail) in sorted(fleet_gaps.items())
        ],
        "not_shown": orphans,
    }


def _echo_show(
    rows: list[dict[str, Any]],
    items: list[CoverageItem] | None,
    warned: list[tuple[str, str, list[tuple[str, int]]]],
    orphans: int,
    *,
    title: str,
    project_path: Path,
) -> None:
    """``matrix show``'s text: the table, the warnings, each gap and the coverage line."""
    from qualify.release.coverage import coverage_line
    from qualify.table import print_matrix, warning_lines
    from qualify.text import one_line

    print_matrix(rows, sys.stdout, title=title)
    for line in warning_lines(warned):
        click.echo(line)
    for item in items or ():
        if item.gap is not None:
            click.echo(
                f"gap: {one_line(item.host_class)} x {one_line(item.artifact)}: "
                + one_line(item.note)
            )
    if items is not None:
        click.echo(coverage_line(items))
    if orphans:
        click.echo(f"not shown: {orphans} cell(s) measured on keys no class of {project_path} has")


def _project_view(project_path: Path, db: Store) -> ProjectView:
    """What ``matrix show`` needs of the project file: the view a writer recorded for these very
    bytes, else the file validated in full (its errors are the project loader's)."""
    from qualify.project.view import ProjectView, recorded_view

    view = recorded_view(db, project_path)
    if view is not None:
        return view
    from qualify.project.load import load_project

    return ProjectView.of(load_project(project_path, check_models=False).project)


@matrix_group.command("gate")
@_db_option
@_project_option
@_published_options
@click.option("--classes", help="Comma-separated classes in scope; default: every class.")
@click.option(
    "--junit-xml",
    "junit_xml",
    type=_RegularFile(),
    help="Write JUnit XML: one test case per class x artifact, and one per class's decision.",
)
@click.option(
    "--summary-md",
    "summary_md",
    type=_RegularFile(),
    help="Write a markdown summary for a CI job (e.g. $GITHUB_STEP_SUMMARY).",
)
@json_option("matrix-gate")
def matrix_gate(
    db_path: Path,
    project_path: Path,
    published_manifest: Path | None,
    published_pubkey: Path | None,
    classes: str | None,
    junit_xml: Path | None,
    summary_md: Path | None,
    as_json: bool,
) -> None:
    """Whether a release can proceed from the matrix as it is (e.g. after ingesting bundles).

    Compares with --manifest (the published manifest, fetched), else the newest manifest the
    matrix published; with neither it says that a regression cannot be seen.

    Exit status: 0 when every class in scope has a measured decision and none regressed from
    the current manifest, 3 when the release cannot proceed, 2 for a usage or project error.
    """
    from qualify.project.load import load_project

    _require_db(db_path)
    loaded = load_project(project_path, check_models=False)
    known = list(loaded.project.host_classes)
    scope = [c.strip() for c in classes.split(",") if c.strip()] if classes else known
    unknown = [c for c in scope if c not in known]
    if unknown:
        _fail(f"--classes: {', '.join(unknown)} not in {loaded.path}; pick from {', '.join(known)}")
    blocked = _ci_outputs(
        loaded,
        db_path,
        scope,
        junit=junit_xml,
        summary=summary_md,
        gate=True,
        published=(published_manifest, published_pubkey),
        on_check=(lambda check: echo_json(_gate_document(check, scope))) if as_json else None,
    )
    if not blocked and not as_json:
        click.echo("release gate: the release can proceed for " + ", ".join(scope))
    sys.exit(GATE_EXIT if blocked else 0)


def _gate_document(check: Any, scope: list[str]) -> Any:
    """``matrix gate --json`` (`schemas.output.MatrixGateShown`) of a
    `qualify.release.generate.ReleaseCheck`."""
    from schemas.output import ClassCoverage, ClassGate, MatrixGateShown

    gate = check.gate
    classes = []
    for name in scope:
        decision, artifact = gate.decisions.get(name, (None, None))
        current, current_artifact = gate.current.get(name, (None, None))
        classes.append(
            ClassGate(
                host_class=name,
                decision=decision,
                artifact=artifact,
                current_decision=current,
                current_artifact=current_artifact,
                problem=gate.problems.get(name),
            )
        )
    return MatrixGateShown(
        can_proceed=not gate.blocked,
        against=check.against,
        classes=classes,
        coverage=[ClassCoverage(**_coverage_entry(item)) for item in check.items],
    )


def _coverage_entry(item: CoverageItem) -> dict[str, Any]:
    """One class x artifact as ``--json`` says it (`schemas.output.ClassCoverage`)."""
    return {
        "host_class": item.host_class,
        "artifact": item.artifact,
        "role": item.role,
        "verdict": item.verdict,
        "reasons": item.reasons,
        "gap": item.gap,
        "note": item.note,
    }


@matrix_group.command("ingest")
@click.argument("bundles", nargs=-1, required=True, type=click.Path(path_type=Path, exists=True))
@_db_option
@json_option("matrix-ingest")
def matrix_ingest(bundles: tuple[Path, ...], db_path: Path, as_json: bool) -> None:
    """Load run bundles (from other hosts) into the matrix; idempotent by run id."""
    from matrix.ingest import ingest_bundles
    from matrix.store import Store
    from qualify.measure.hostlock import lock_wait_message

    with Store.open(db_path, on_wait=lock_wait_message()) as db:
        report = ingest_bundles(db, list(bundles))
    if as_json:
        from dataclasses import asdict

        from schemas.output import BundlesIngested

        echo_json(
            BundlesIngested.model_validate(
                {"bundles": [asdict(b) | {"path": str(b.path)} for b in report.bundles]}
            )
        )
        return
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
@_db_option
@json_option("matrix-export")
def matrix_export(out_dir: Path, db_path: Path, as_json: bool) -> None:
    """Export the matrix tables and view as Parquet."""
    from matrix.store import Store

    _require_db(db_path)
    with Store.open(db_path, read_only=True) as db:
        paths = db.export_parquet(out_dir)
    if as_json:
        echo_json({"files": [str(p) for p in paths]})
        return
    for p in paths:
        click.echo(str(p))


@matrix_group.command("split")
@click.option("--model", required=True, help="The model line to copy out (a project's 'model').")
@click.option(
    "--out",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="The new matrix to write (must not exist).",
)
@_db_option
def matrix_split(model: str, out: Path, db_path: Path) -> None:
    """Copy one model line out of a matrix that mixes lines (written before qualify kept one line
    per matrix) into a new matrix of that line alone: its runs, cells and samples, its manifests
    and rollouts, and the telemetry, tunes and lineage of its artifacts. The source is only
    read; run it once per line, then give each project its own --db."""
    from matrix.store import Store

    _require_db(db_path)
    copied = Store.split_model_line(db_path, model, out)
    said = ", ".join(f"{n} {table}" for table, n in copied.items() if n)
    click.echo(f"{out}: model line {model!r}: {said or 'nothing'} copied from {db_path}")


@matrix_group.command("stale")
@_db_option
@_project_option
@click.option(
    "--since",
    default="7d",
    show_default=True,
    help="How far back telemetry counts for runtime revisions never qualified.",
)
@json_option("matrix-stale")
def matrix_stale(db_path: Path, project_path: Path, since: str, as_json: bool) -> None:
    """List classes and cells to re-run: settings changed, or unqualified runtimes in telemetry."""
    from datetime import UTC, datetime

    from qualify.project.load import load_project
    from qualify.release.current import file_digests
    from qualify.telemetry.render import render_stale
    from qualify.telemetry.watch import run_stale

    loaded = load_project(project_path, check_models=False)
    _require_db(db_path)
    items = run_stale(
        db_path,
        loaded.project,
        now=datetime.now(UTC),
        since=since,
        digests=file_digests(loaded),
    )
    if as_json:
        from schemas.output import MatrixStale

        echo_json(MatrixStale(stale=items))
    else:
        click.echo(render_stale(items))
