"""Watching the deployed path, at the edges: what ``qualify telemetry`` and ``qualify matrix stale``
call, reading the matrix and handing what they read to the pure modules.

Owns the I/O of those commands: ``ingest_files`` (``qualify telemetry ingest``),
``gather_aggregates`` (the queries a check needs, in order), ``load_current_manifest`` (which
manifest a check compares with), ``run_check`` (``qualify telemetry check``) and ``run_stale``
(``qualify matrix stale``), each with the clock as a parameter. Does not own the judgement
(``qualify.telemetry_check``), what is stale (``qualify.staleness``), the text people read
(``qualify.telemetry_render``), SQL or parsing event files (``matrix.telemetry``), the event
format (``schemas.telemetry``) nor what hosts write (``manifest.host_events``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from matrix.store import Store
from matrix.telemetry import (
    Cohort,
    TelemetryIngestReport,
    ingest_telemetry,
    latency_tails,
    revisions_by_class,
    telemetry_profile,
)
from qualify.errors import QualifyError
from qualify.hostlock import lock_wait_message

if TYPE_CHECKING:
    # Loaded where used: ``telemetry ingest`` needs none of them, and the manifest's, the
    # release's and the check's modules cost a fresh process about 0.15 s.
    from qualify.telemetry_check import TelemetryAggregates
    from schemas.manifest import Manifest
    from schemas.project import Project
    from schemas.telemetry import CheckSettings, StaleItem, TelemetryCheck

__all__ = [
    "DEFAULT_MANIFEST",
    "gather_aggregates",
    "ingest_files",
    "load_current_manifest",
    "run_check",
    "run_stale",
]

DEFAULT_MANIFEST = "manifest.json"
"""Manifest read when the matrix stores none and ``--manifest`` is not given."""


def gather_aggregates(
    store: Store,
    manifest: Manifest,
    *,
    start: datetime,
    end: datetime,
    settings: CheckSettings,
    cohort: Cohort | None = None,
) -> TelemetryAggregates:
    """Run the queries a check needs: the profile, then the tail of each judged (class, digest).

    Args:
        store: An open store.
        manifest: The manifest the check compares with (which digest each class runs).
        start: Window start.
        end: Window end (the check's ``now``).
        settings: min_samples and confidence decide which tails are read and how long
            (``qualify.telemetry_check.tails_needed``).
        cohort: Only one side of a staged rollout (``matrix.telemetry.Cohort``).

    Returns:
        The aggregates for ``check_telemetry``.
    """
    from qualify.telemetry_check import TelemetryAggregates, tails_needed

    profile = telemetry_profile(store, start=start, end=end, cohort=cohort)
    wanted = tails_needed(profile, manifest, settings)
    tails = latency_tails(store, start=start, end=end, wanted=wanted, cohort=cohort)
    return TelemetryAggregates(profile=profile, tails=tails)


def _window(now: datetime, since: str) -> tuple[datetime, datetime]:
    from qualify.release import parse_duration

    if now.tzinfo is None:
        raise QualifyError("the check's reference time must be timezone-aware (UTC)")
    span: timedelta = parse_duration(since, what="--since")
    return now - span, now


def load_current_manifest(store: Store, manifest_path: Path | None) -> Manifest:
    """The manifest a check compares with: ``manifest_path`` if given, else the latest stored in
    the matrix, else ``manifest.json`` in the working directory.

    Raises:
        QualifyError: none of them exists.
        MalformedError: the file is not a manifest.
    """
    from manifest.load import load_manifest

    if manifest_path is not None:
        return load_manifest(manifest_path)
    latest = store.latest_manifest()
    if latest is not None:
        return load_manifest(
            latest[1].encode(), source=f"matrix {store.path} manifest v{latest[0]}"
        )
    fallback = Path(DEFAULT_MANIFEST)
    if fallback.is_file():
        return load_manifest(fallback)
    raise QualifyError(
        f"no manifest to compare with: matrix {store.path} stores none and there is no "
        f"{DEFAULT_MANIFEST} here; pass --manifest FILE or run `qualify manifest generate`"
    )


def ingest_files(db_path: Path, paths: Sequence[Path], *, now: datetime) -> TelemetryIngestReport:
    """``qualify telemetry ingest``: load telemetry files into the matrix at ``db_path``.

    Raises:
        TelemetryFileError: a file is missing or unreadable.
        MatrixError: the matrix cannot be opened.
    """
    with Store.open(db_path, on_wait=lock_wait_message()) as store:
        return ingest_telemetry(store, paths, now=now)


def run_check(
    db_path: Path,
    *,
    now: datetime,
    settings: CheckSettings | None = None,
    manifest_path: Path | None = None,
) -> TelemetryCheck:
    """``qualify telemetry check``: gather from the matrix and judge.

    Args:
        db_path: The matrix (opened read-only).
        now: Reference time (UTC, aware).
        settings: Window, tolerance, min_samples, confidence.
        manifest_path: The manifest to compare with; default see ``load_current_manifest``.

    Raises:
        QualifyError: bad ``since``, no manifest.
        MatrixError: no matrix at ``db_path``.
    """
    from qualify.telemetry_check import check_telemetry
    from schemas.telemetry import CheckSettings

    settings = settings or CheckSettings()
    start, end = _window(now, settings.since)
    with Store.open(db_path, read_only=True) as store:
        manifest = load_current_manifest(store, manifest_path)
        cells = store.cells()
        aggregates = gather_aggregates(store, manifest, start=start, end=end, settings=settings)
    return check_telemetry(manifest, cells, aggregates, now=now, settings=settings)


def run_stale(
    db_path: Path,
    project: Project,
    *,
    now: datetime,
    since: str = "7d",
    digests: Mapping[str, str],
) -> list[StaleItem]:
    """``qualify matrix stale``: cells and classes to re-run.

    Args:
        db_path: The matrix (opened read-only).
        project: The project file as it is now.
        now: Reference time for the telemetry window.
        since: How far back telemetry counts for runtime revisions.
        digests: Artifact label -> the digest of its file now (``qualify.current.file_digests``).

    Raises:
        QualifyError: bad ``since``.
        MatrixError: no matrix at ``db_path``.
    """
    from qualify.staleness import stale_items

    start, end = _window(now, since)
    with Store.open(db_path, read_only=True, model=project.model) as store:
        cells = store.cells()
        revisions = revisions_by_class(store, start=start, end=end)
    return stale_items(project, cells, revisions, digests=digests)
