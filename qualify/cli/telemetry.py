"""``qualify telemetry``: load hosts' telemetry and check it (`qualify.telemetry`)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from qualify.cli.options import (
    _check_defaults,
    _db_option,
    _min_samples_option,
    _RegularFile,
    _require_db,
    _settings,
    _tolerance_option,
)
from qualify.cli.output import echo_json, json_option

__all__ = ["telemetry_group"]


@click.group("telemetry")
def telemetry_group() -> None:
    """Load telemetry from deployed hosts and check it against what was qualified."""


@telemetry_group.command("ingest")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@_db_option
@json_option("telemetry-ingest")
def telemetry_ingest(files: tuple[Path, ...], db_path: Path, as_json: bool) -> None:
    """Load JSON-lines telemetry files; idempotent, bad lines reported and skipped."""
    from datetime import UTC, datetime

    from qualify.telemetry.watch import ingest_files

    report = ingest_files(db_path, list(files), now=datetime.now(UTC))
    if as_json:
        from dataclasses import asdict

        from schemas.output import TelemetryIngested

        echo_json(
            TelemetryIngested.model_validate(
                {"files": [asdict(f) | {"path": str(f.path)} for f in report.files]}
            )
        )
        return
    for f in report.files:
        click.echo(
            f"{f.path}: {f.status}, {f.events} events, {f.bad_lines} bad lines"
            + (
                f", {f.pending_bytes} bytes after the last newline kept for later"
                if f.pending_bytes
                else ""
            )
        )
        for bad in f.bad:
            click.echo(f"  {f.path}:{bad.line}: {bad.message}", err=True)


@telemetry_group.command("check")
@click.option(
    "--since",
    default=lambda: _check_defaults().since,
    show_default="24h",
    help="Judge events from this far back.",
)
@_tolerance_option
@_min_samples_option
@click.option(
    "--propagation-deadline",
    default=lambda: _check_defaults().propagation_deadline,
    show_default="6h",
    help="How long after a manifest version changed what a host runs the host may still be on "
    "an older one before that is a 'lagging' warning (before it, lagging hosts are only "
    "reported).",
)
@click.option(
    "--manifest",
    "manifest_path",
    type=_RegularFile(exists=True),
    help="Manifest to compare with; default: the newest in the matrix, else ./manifest.json.",
)
@json_option("telemetry-check")
@_db_option
def telemetry_check(
    since: str,
    tolerance: float,
    min_samples: int,
    propagation_deadline: str,
    manifest_path: Path | None,
    as_json: bool,
    db_path: Path,
) -> None:
    """Alert per host class on digest, provider, fallback, p99, runtime, lag and no-data
    problems. Each event is judged against the manifest version it reports (or the one
    published at its time); events of another model line are skipped and counted.

    Exit status: 0 no alerts, 1 alerts raised (gate a cron job or CI on it), 2 usage errors.
    """
    from datetime import UTC, datetime

    from qualify.release.generate import parse_duration
    from qualify.telemetry.render import render_check
    from qualify.telemetry.watch import run_check
    from schemas.telemetry import CheckSettings

    settings = _settings(
        CheckSettings,
        {
            "since": since,
            "p99_tolerance": tolerance,
            "min_samples": min_samples,
            "propagation_deadline": propagation_deadline,
        },
        {
            "since": "--since",
            "p99_tolerance": "--tolerance",
            "min_samples": "--min-samples",
            "propagation_deadline": "--propagation-deadline",
        },
    )
    # a bad value is said before anything is read
    parse_duration(settings.since, what="--since")
    parse_duration(settings.propagation_deadline, what="--propagation-deadline")
    _require_db(db_path)
    check = run_check(
        db_path, now=datetime.now(UTC), settings=settings, manifest_path=manifest_path
    )
    if as_json:
        echo_json(check)
    else:
        click.echo(render_check(check))
    sys.exit(1 if check.alerts else 0)
