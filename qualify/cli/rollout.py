"""``qualify rollout``: staged rollouts, holds, pins and their log (`qualify.rollout`)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from qualify.cli.errors import _fail
from qualify.cli.options import (
    DEFAULT_PROJECT,
    _db_option,
    _min_samples_option,
    _project_option,
    _require_db,
    _settings,
    _tolerance_option,
)
from qualify.cli.output import echo_json, json_option
from qualify.cli.publish import Publishing, _recover, _warn_if_hosts_refuse, publish_options

if TYPE_CHECKING:
    from matrix.store import Store
    from qualify.release.publishing import PublishOptions
    from qualify.rollout import RolloutAction

__all__ = ["rollout_group"]


@click.group("rollout")
def rollout_group() -> None:
    """Staged rollouts: a class's new artifact to a cohort of its hosts, then a rollback."""


_rollout_publish_options = publish_options(
    out_help="Manifest file hosts read (the new version replaces it atomically)."
)
"""``--out``, ``--key`` (required: every step is a signed version), ``--expires`` and
``--per-class``, as one ``publishing`` argument."""


@contextlib.contextmanager
def _matrix(db_path: Path, model: str | None = None) -> Iterator[Store]:
    """The matrix opened for a rollout action (of model line ``model``, when the action reads
    the project file), an interrupted publication completed or discarded first."""
    from matrix.store import Store
    from qualify.measure.hostlock import lock_wait_message

    _require_db(db_path)
    with Store.open(db_path, on_wait=lock_wait_message(), model=model) as db:
        _recover(db)
        yield db


@contextlib.contextmanager
def _publishing_session(
    db_path: Path, publishing: Publishing, why: str, model: str | None = None
) -> Iterator[tuple[Store, PublishOptions]]:
    """`_matrix`, and the action's publish options: its time, taken once the matrix is open,
    and who runs it (`qualify.rollout.actor`)."""
    from qualify.rollout import actor

    publishing.validity()  # a bad --expires fails before the matrix opens
    with _matrix(db_path, model) as db:
        yield db, publishing.options(why=why, who=actor())


def _published(done: RolloutAction, publishing: Publishing) -> None:
    click.echo(f"{done.summary}; wrote {done.path}")
    _warn_if_hosts_refuse(done.path, publishing.per_class_dir, done.version, done.model)


@rollout_group.command("start")
@click.argument("host_class")
@click.option("--steps", default="5,25,100", show_default=True, help="Percent of hosts per step.")
@click.option(
    "--artifact", help="The candidate to roll out (default: the one the matrix supports)."
)
@click.option("--why", default="", help="Why, recorded with the step.")
@click.option("--artifact-base-uri", help="Base URL hosts fetch artifacts from.")
@_rollout_publish_options
@_project_option
@_db_option
def rollout_start(
    host_class: str,
    steps: str,
    artifact: str | None,
    why: str,
    artifact_base_uri: str | None,
    publishing: Publishing,
    project_path: Path,
    db_path: Path,
) -> None:
    """Publish a version in which HOST_CLASS's hosts in the first step's cohort run the new
    artifact (chosen per host by a stable hash of its id) and the rest keep the current one."""
    from qualify.project.load import load_project
    from qualify.rollout import parse_steps, start_rollout

    plan = parse_steps(steps)
    loaded = load_project(project_path)
    with _publishing_session(db_path, publishing, why, loaded.project.model) as (db, options):
        done = start_rollout(
            loaded,
            db,
            host_class,
            options,
            steps=plan,
            artifact=artifact,
            artifact_base_uri=artifact_base_uri,
        )
    _published(done, publishing)


@rollout_group.command("abort")
@click.argument("host_class")
@click.option("--why", required=True, help="Why, recorded with the rollback.")
@_rollout_publish_options
@_project_option
@_db_option
def rollout_abort(
    host_class: str, why: str, publishing: Publishing, project_path: Path, db_path: Path
) -> None:
    """Publish a sanctioned rollback: a newer version sending every host of HOST_CLASS, canary
    or not, to what the rest of the class runs (a held class: its rollback package), so that
    hosts never have to accept an older document; releases keep it until 'rollout clear'."""
    from qualify.project.load import load_project
    from qualify.rollout import abort_rollout

    loaded = load_project(project_path, check_models=False)
    with _publishing_session(db_path, publishing, why, loaded.project.model) as (db, options):
        done = abort_rollout(loaded, db, host_class, options)
    _published(done, publishing)


@rollout_group.command("advance")
@click.argument("host_class")
@click.option("--why", default="", help="Why, recorded with the step.")
@_tolerance_option
@_min_samples_option
@_rollout_publish_options
@click.option(
    "--project",
    "project_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Project file: a completed rollout's entry gets the evidence the matrix has for its "
    f"artifact under it [default: {DEFAULT_PROJECT}, where there is one]",
)
@_db_option
def rollout_advance(
    host_class: str,
    why: str,
    tolerance: float,
    min_samples: int,
    publishing: Publishing,
    project_path: Path | None,
    db_path: Path,
) -> None:
    """Advance HOST_CLASS's rollout one step, only if its cohort's telemetry since the step
    began shows no alert, enough latencies to bound its p99 within the qualified bound, and no
    p99 above the rest of the class's, both with --tolerance's slack (a class whose
    max_slowdown accepts a candidate slower than the baseline needs that slowdown here too).

    Exit status: 0 advanced (or completed), 1 halted (the reasons are printed and recorded).
    """
    from qualify.project.load import load_project
    from qualify.rollout import advance_rollout
    from schemas.telemetry import CheckSettings

    if project_path is None and Path(DEFAULT_PROJECT).is_file():
        project_path = Path(DEFAULT_PROJECT)
    loaded = load_project(project_path, check_models=False) if project_path else None

    settings = _settings(
        CheckSettings,
        {"p99_tolerance": tolerance, "min_samples": min_samples},
        {"p99_tolerance": "--tolerance", "min_samples": "--min-samples"},
    )
    with _publishing_session(db_path, publishing, why) as (db, options):
        done, verdict = advance_rollout(db, host_class, options, settings=settings, loaded=loaded)
    click.echo(f"evidence: {verdict.evidence() or 'none'}")
    if done is None:
        for problem in verdict.problems:
            click.echo(f"halted: {problem}")
        sys.exit(1)
    _published(done, publishing)


@rollout_group.command("hold")
@click.argument("host_class")
@click.option("--why", required=True, help="Why, recorded with the hold.")
@_rollout_publish_options
@_db_option
def rollout_hold(host_class: str, why: str, publishing: Publishing, db_path: Path) -> None:
    """Publish HOST_CLASS as held: its hosts keep what they run (a rollout stops where it
    is), and later releases keep the hold until 'qualify rollout clear'."""
    from qualify.rollout import hold_class

    with _publishing_session(db_path, publishing, why) as (db, options):
        done = hold_class(db, host_class, options)
    _published(done, publishing)


@rollout_group.command("pin")
@click.argument("host_class")
@click.option("--artifact", help="What to pin it to (default: what it runs now).")
@click.option("--why", required=True, help="Why, recorded with the pin.")
@_rollout_publish_options
@_project_option
@_db_option
def rollout_pin(
    host_class: str,
    artifact: str | None,
    why: str,
    publishing: Publishing,
    project_path: Path,
    db_path: Path,
) -> None:
    """Publish HOST_CLASS pinned to one artifact (what it runs, its rollback or the approved
    baseline) for every host; later releases keep the pin until 'qualify rollout clear'."""
    from qualify.project.load import load_project
    from qualify.rollout import pin_class

    loaded = load_project(project_path)
    with _publishing_session(db_path, publishing, why, loaded.project.model) as (db, options):
        done = pin_class(loaded, db, host_class, options, artifact=artifact)
    _published(done, publishing)


@rollout_group.command("clear")
@click.argument("host_class")
@click.option("--why", required=True, help="Why, recorded.")
@_db_option
def rollout_clear(host_class: str, why: str, db_path: Path) -> None:
    """Lift HOST_CLASS's hold, pin or aborted rollout (publishes nothing: the next manifest
    generate decides the class from the matrix again)."""
    from datetime import UTC, datetime

    from qualify.rollout import actor, clear_class

    with _matrix(db_path) as db:
        click.echo(clear_class(db, host_class, now=datetime.now(UTC), why=why, who=actor()))


@rollout_group.command("status")
@_db_option
@json_option("rollout-status")
def rollout_status(db_path: Path, as_json: bool) -> None:
    """The rollouts in progress (or halted) in the current manifest, the classes held, pinned
    or whose rollout was aborted (each in force until 'qualify rollout clear'), and a
    publication a kill interrupted."""
    from matrix.publications import pending, steering
    from matrix.store import Store
    from qualify.release.generate import previous_manifest

    _require_db(db_path)
    with Store.open(db_path, read_only=True) as db:
        current = previous_manifest(db)
        steered = steering(db)
        last = {str(r["rollout_id"]): r for r in db.rollout_log()}
        left = pending(db)
    if current is None:
        from qualify.console import plain

        for p in left:
            click.echo(
                f"v{p.version} ({plain(str(p.intent.get('what', 'a publish')))}) was interrupted: "
                "the next publishing command completes or discards it"
            )
        _fail("no manifest has been published from this matrix", 1)
    shown = _status_document(current, steered, last, left)
    if as_json:
        echo_json(shown)
    else:
        _echo_status(shown)


def _status_document(
    current: Any, steered: dict[str, Any], last: dict[str, Any], left: list[Any]
) -> Any:
    """What ``rollout status`` says, as its document (``schemas.output.RolloutStatusShown``)."""
    from schemas.output import (
        Interrupted,
        RolloutInProgress,
        RolloutStatusShown,
        Steered,
    )

    rollouts = []
    for name, entry in current.signed.entries.items():
        if entry.rollout is None:
            continue
        r = entry.rollout
        halted = last.get(r.id)
        stopped = halted is not None and halted["action"] == "halt"
        rollouts.append(
            RolloutInProgress(
                host_class=name,
                rollout_id=r.id,
                artifact=r.artifact.name,
                percent=r.percent,
                step=r.step,
                steps=list(r.steps),
                halted=stopped,
                halted_why=str(halted["why"]) if stopped and halted is not None else None,
                rest=entry.artifact.name if entry.artifact is not None else None,
            )
        )
    return RolloutStatusShown(
        manifest_version=current.signed.version,
        interrupted=[
            Interrupted(version=p.version, what=str(p.intent.get("what", "a publish")))
            for p in left
        ],
        steered=[
            Steered(host_class=name, **{k: row[k] for k in _STEERED_FIELDS})
            for name, row in sorted(steered.items())
        ],
        rollouts=rollouts,
    )


_STEERED_FIELDS = ("action", "artifact", "rollout_id", "actor", "acted_at", "version", "why")


def _echo_status(shown: Any) -> None:
    """``rollout status``'s text: one line each, reasons cut to one line (``--json`` has them
    whole)."""
    from qualify.console import plain
    from qualify.table import shorten

    for p in shown.interrupted:
        click.echo(
            f"v{p.version} ({plain(p.what)}) was interrupted: "
            "the next publishing command completes or discards it"
        )
    for row in shown.steered:
        what = {
            "hold": "held",
            "pin": f"pinned to {row.artifact}",
            "abort": f"rollout {row.rollout_id} aborted (its hosts stay on the rollback)",
        }[row.action]
        click.echo(
            f"{plain(row.host_class)}: {plain(what)} by {plain(row.actor)} since "
            f"{row.acted_at:%Y-%m-%d %H:%M:%SZ} (v{row.version}): {plain(shorten(row.why))}"
        )
    for r in shown.rollouts:
        state = f"HALTED ({plain(shorten(r.halted_why or ''))})" if r.halted else "in progress"
        click.echo(
            f"{plain(r.host_class)}: rollout {plain(r.rollout_id)} of {plain(r.artifact)} at "
            f"{r.percent}% (step {r.step} of {len(r.steps)}: {', '.join(map(str, r.steps))}), "
            f"{state}; the rest run {plain(r.rest or 'nothing (hold)')} "
            f"(v{shown.manifest_version})"
        )
    if not shown.steered and not shown.rollouts:
        click.echo(f"no rollout, hold, pin or abort in force (manifest v{shown.manifest_version})")


@rollout_group.command("log")
@click.option("--host-class", "host_class", help="Only this class.")
@_db_option
@json_option("rollout-log")
def rollout_log(host_class: str | None, db_path: Path, as_json: bool) -> None:
    """Every rollout action: when, the version it published, who and why."""
    from matrix.store import Store
    from qualify.console import plain

    _require_db(db_path)
    with Store.open(db_path, read_only=True) as db:
        rows = db.rollout_log(host_class)
    if as_json:
        from schemas.output import RolloutAction, RolloutLog

        echo_json(RolloutLog(actions=[RolloutAction(**r) for r in rows]))
        return
    if not rows:
        click.echo("no rollout recorded")
    for r in rows:
        click.echo(
            f"{r['acted_at']:%Y-%m-%d %H:%M:%SZ} {plain(r['host_class'])} {plain(r['rollout_id'])} "
            f"{r['action']} v{r['version']} step {r['step']} {r['percent']}% "
            f"{plain(r['artifact'])} by {plain(r['actor'])}: {plain(r['why'] or '-')}"
        )
