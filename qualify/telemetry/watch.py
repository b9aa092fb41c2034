"""Watching the deployed path, at the edges: what ``qualify telemetry`` and ``qualify matrix stale``
call, reading the matrix and handing what they read to the pure modules.

Owns the I/O of those commands: ``ingest_files`` (``qualify telemetry ingest``),
``gather_aggregates`` (the queries a check needs, in order), ``load_current_manifest`` (which
manifest a check compares with), ``load_releases`` (the published versions before it that the
window's events may be judged against), ``run_check`` (``qualify telemetry check``) and ``run_stale``
(``qualify matrix stale``), each with the clock as a parameter. Does not own the judgement
(``qualify.telemetry.check``), what is stale (``qualify.telemetry.staleness``), the text people read
(``qualify.telemetry.render``), SQL or parsing event files (``matrix.telemetry.ingest``,
``matrix.telemetry.queries``), the event format (``schemas.telemetry``) nor what hosts write
(``manifest.host_events``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from matrix.store import Store
from matrix.telemetry.ingest import TelemetryIngestReport, ingest_telemetry
from matrix.telemetry.queries import latency_tails, revisions_by_class, telemetry_profile
from matrix.telemetry.scope import (
    Attribution,
    Cohort,
    host_states,
    reported_versions,
    skipped_events,
)
from qualify.errors import QualifyError
from qualify.measure.hostlock import lock_wait_message

if TYPE_CHECKING:
    # Loaded where used: ``telemetry ingest`` needs none of them, and the manifest's, the
    # release's and the check's modules cost a fresh process about 0.15 s.
    from qualify.telemetry.check import TelemetryAggregates
    from qualify.telemetry.timeline import Releases
    from schemas.cell import Cell
    from schemas.manifest import Manifest
    from schemas.project import Project
    from schemas.telemetry import CheckSettings, StaleItem, TelemetryCheck

__all__ = [
    "DEFAULT_MANIFEST",
    "gather_aggregates",
    "ingest_files",
    "load_current_manifest",
    "load_releases",
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
    releases: Releases | None = None,
    cells: Sequence[Cell] | None = None,
) -> TelemetryAggregates:
    """Run the queries a check needs: the profile, the tail of each judged (class, digest), each
    host's latest event, and what was skipped as another model line's.

    Args:
        store: An open store.
        manifest: The current manifest (which digest each class runs now).
        start: Window start.
        end: Window end (the check's ``now``).
        settings: min_samples and confidence decide which tails are read and how long
            (``qualify.telemetry.check.tails_needed``).
        cohort: Only one side of a staged rollout (``matrix.telemetry.scope.Cohort``).
        releases: The published manifests events are judged against (`load_releases`); by
            default ``manifest`` alone (every event judged against it: a rollout's cohort view).
        cells: The matrix's cells, whose digests tell this line's events from others' (default:
            read from ``store``).

    Returns:
        The aggregates for ``check_telemetry``.
    """
    from qualify.telemetry.check import TelemetryAggregates, tails_needed
    from qualify.telemetry.timeline import Releases
    from schemas.telemetry import SkippedEvents

    releases = releases or Releases.single(manifest)
    attribution = releases.attribution(store.cells() if cells is None else cells)
    versions = releases.versions
    profile = telemetry_profile(
        store, start=start, end=end, cohort=cohort, attribution=attribution, versions=versions
    )
    wanted = tails_needed(profile, releases, settings)
    tails = latency_tails(
        store, start=start, end=end, wanted=wanted, cohort=cohort, attribution=attribution
    )
    hosts = host_states(
        store, start=start, end=end, cohort=cohort, attribution=attribution, versions=versions
    )
    skipped = [
        SkippedEvents(model=model, events=events, hosts=n, example_digests=digests)
        for model, events, n, digests in skipped_events(
            store, start=start, end=end, attribution=attribution, cohort=cohort
        )
    ]
    return TelemetryAggregates(
        profile=profile, tails=tails, releases=releases, hosts=hosts, skipped=skipped
    )


def load_releases(store: Store, current: Manifest, *, start: datetime, end: datetime) -> Releases:
    """The manifests a check over [start, end] judges against: ``current`` and every published
    version of its model line before it, from the oldest that an event of the window reports or
    that was current during the window (so that a lagging host's "since" is the version that
    changed its assignment, whichever came between).

    Raises:
        MalformedError: a stored version does not load as a manifest.
    """
    from manifest.envelope import parse_time
    from manifest.load import load_manifest
    from qualify.telemetry.timeline import Release, Releases

    version = current.signed.version
    published = [(v, t) for v, t in store.published_versions() if v < version]
    reported = reported_versions(store, start=start, end=end)
    wanted = {v for v, t in published if v in reported or start < t <= end}
    at_start = [v for v, t in published if t <= start]
    if at_start:
        wanted.add(max(at_start))
    oldest = min(wanted, default=version)
    items = []
    for v, t in published:
        text = store.manifest(v) if v >= oldest else None
        if text is None:
            continue
        older = load_manifest(text.encode(), source=f"matrix {store.path} manifest v{v}")
        if older.signed.model == current.signed.model:
            items.append(Release(v, t, older))
    times = dict(store.published_versions())
    when = times.get(version) or parse_time(current.signed.created)
    return Releases((*items, Release(version, when, current)))


def _window(now: datetime, since: str) -> tuple[datetime, datetime]:
    from qualify.release.generate import parse_duration

    if now.tzinfo is None:
        raise QualifyError("the check's reference time must be timezone-aware (UTC)")
    span: timedelta = parse_duration(since, what="--since")
    return now - span, now


def load_current_manifest(store: Store, manifest_path: Path | None) -> Manifest:
    """The manifest a check compares with: ``manifest_path`` if given, else the latest stored in
    the matrix (published, or a publication interrupted past its commit point:
    ``qualify.release.publishing.committed``), else ``manifest.json`` in the working directory.

    Raises:
        QualifyError: none of them exists.
        MalformedError: the file is not a manifest.
    """
    from manifest.load import load_manifest

    if manifest_path is not None:
        return load_manifest(manifest_path)
    from qualify.release.publishing import committed

    latest = store.latest_manifest()
    # A publication killed past its commit point is in the file hosts read: they may run it
    # already, and the next publishing command completes it. Hosts are judged against it.
    ahead = [c for c in committed(store) if latest is None or c[0] > latest[0]]
    latest = ahead[-1] if ahead else latest
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
    from qualify.telemetry.check import check_telemetry
    from schemas.telemetry import CheckSettings

    settings = settings or CheckSettings()
    start, end = _window(now, settings.since)
    from qualify.release.generate import parse_duration

    # a bad deadline is said before anything is read
    parse_duration(settings.propagation_deadline, what="--propagation-deadline")
    with Store.open(db_path, read_only=True) as store:
        manifest = load_current_manifest(store, manifest_path)
        releases = load_releases(store, manifest, start=start, end=end)
        cells = store.cells()
        aggregates = gather_aggregates(
            store,
            manifest,
            start=start,
            end=end,
            settings=settings,
            releases=releases,
            cells=cells,
        )
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
        digests: Artifact label -> the digest of its file now (``qualify.release.current.file_digests``).

    Raises:
        QualifyError: bad ``since``.
        MatrixError: no matrix at ``db_path``.
    """
    from qualify.telemetry.staleness import stale_items

    start, end = _window(now, since)
    with Store.open(db_path, read_only=True, model=project.model) as store:
        cells = store.cells()
        # Only this model line's events: another model on the same hosts runs its own runtime.
        line = Attribution(project.model, tuple(sorted({c.artifact_digest for c in cells})))
        revisions = revisions_by_class(store, start=start, end=end, attribution=line)
    return stale_items(project, cells, revisions, digests=digests)
