"""The telemetry a check reads from the matrix: a time window's events grouped by what the hosts
reported, the largest latencies of chosen (class, digest) pairs, the runtime revisions per
class, and whether a rollout's canary reported.

Reads only; what is in scope is ``matrix.telemetry.scope``'s. Does not own ingest
(``matrix.telemetry.ingest``) nor judging events (``qualify.telemetry.check``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from matrix.store import Store
from matrix.telemetry.scope import Attribution, Cohort, Versions, scope_sql

__all__ = [
    "ProfileRow",
    "TelemetryProfile",
    "latency_tails",
    "revisions_by_class",
    "rollout_reported",
    "telemetry_profile",
]

_EXAMPLE_HOSTS = 5


@dataclass(frozen=True)
class ProfileRow:
    """Events of one (class, digest, runtime, placement kind, providers, fallback, settings,
    judged version) in the window.

    Attributes:
        host_class: The class the hosts reported.
        model_digest: The digest they ran (None: nothing, e.g. a class on hold).
        runtime_revision: The onnxruntime version they reported.
        placement: "actual", "registered" or "requested".
        providers: The providers, as reported (sorted).
        fallback_nodes: Nodes off the expected provider (None: placement unknown).
        events: Events.
        hosts: Distinct hosts.
        example_hosts: Up to five host ids, sorted.
        latency_samples: Events with a latency.
        first: Earliest event time.
        last: Latest event time.
        manifest_versions: Manifest versions the hosts reported, sorted (unknown left out).
        settings: The session settings the hosts reported (`schemas.settings` encoding; None:
            not reported).
        version: The manifest version these events are judged against
            (``matrix.telemetry.scope``): the one they report, or the one published at their
            time; None without versions given and none reported.
    """

    host_class: str
    model_digest: str | None
    runtime_revision: str
    placement: str
    providers: tuple[str, ...]
    fallback_nodes: int | None
    events: int
    hosts: int
    example_hosts: tuple[str, ...]
    latency_samples: int
    first: datetime
    last: datetime
    manifest_versions: tuple[int, ...]
    settings: str | None = None
    version: int | None = None


@dataclass(frozen=True)
class TelemetryProfile:
    """The window's events, grouped. ``class_hosts`` counts distinct hosts per class."""

    start: datetime
    end: datetime
    rows: tuple[ProfileRow, ...]
    class_events: dict[str, int]
    class_hosts: dict[str, int]


_PROFILE_SQL = """
WITH w AS (
    SELECT host_class, model_digest, runtime_revision, placement,
           list_sort(providers) AS providers, fallback_nodes, settings, host_id, latency_ms,
           time, manifest_version, {judged} AS judged
    FROM telemetry
    WHERE {where}
),
h AS (
    SELECT host_class, model_digest, runtime_revision, placement, providers, fallback_nodes,
           settings, judged, host_id, count(*) AS events, count(latency_ms) AS latency_samples,
           min(time) AS first, max(time) AS last,
           list(DISTINCT manifest_version) FILTER (WHERE manifest_version IS NOT NULL) AS mv
    FROM w
    GROUP BY ALL
)
SELECT host_class, model_digest, runtime_revision, placement, providers, fallback_nodes,
       sum(events)::BIGINT, count(*)::BIGINT, min(host_id, $examples),
       sum(latency_samples)::BIGINT, min(first), max(last),
       list_sort(list_distinct(flatten(list(mv)))), settings, judged
FROM h
GROUP BY host_class, model_digest, runtime_revision, placement, providers, fallback_nodes,
         settings, judged
ORDER BY host_class, model_digest NULLS FIRST, runtime_revision, placement, providers,
         fallback_nodes NULLS FIRST, settings NULLS FIRST, judged NULLS FIRST
"""

_CLASS_SQL = """
SELECT host_class, count(*)::BIGINT, count(DISTINCT host_id)::BIGINT
FROM telemetry
WHERE {where}
GROUP BY host_class
"""


def rollout_reported(store: Store, rollout: str, *, start: datetime, end: datetime) -> bool:
    """Whether any event of the window says it came from ``rollout``'s canary cohort."""
    row = store.connection.execute(
        "SELECT count(*) FROM telemetry WHERE time >= $start AND time <= $end AND "
        "rollout = $rollout AND cohort = 'canary'",
        {"start": start, "end": end, "rollout": rollout},
    ).fetchall()
    return bool(row and row[0][0])


def _profile_row(r: tuple[Any, ...]) -> ProfileRow:
    """One row of ``_PROFILE_SQL`` as a `ProfileRow`."""
    return ProfileRow(
        host_class=str(r[0]),
        model_digest=r[1],
        runtime_revision=str(r[2]),
        placement=str(r[3]),
        providers=tuple(r[4] or ()),
        fallback_nodes=None if r[5] is None else int(r[5]),
        events=int(r[6]),
        hosts=int(r[7]),
        example_hosts=tuple(sorted(r[8] or ())),
        latency_samples=int(r[9]),
        first=r[10],
        last=r[11],
        manifest_versions=tuple(int(v) for v in r[12] or ()),
        settings=r[13],
        version=None if r[14] is None else int(r[14]),
    )


def telemetry_profile(
    store: Store,
    *,
    start: datetime,
    end: datetime,
    cohort: Cohort | None = None,
    attribution: Attribution | None = None,
    versions: Versions | None = None,
) -> TelemetryProfile:
    """The events of a time window, grouped for a check.

    Args:
        store: An open store (read-only is fine).
        start: Window start (inclusive, aware).
        end: Window end (inclusive, aware).
        cohort: Only one side of a staged rollout (see `Cohort`).
        attribution: Only this model line's events (``matrix.telemetry.scope.Attribution``).
        versions: The published versions each group's judged version is read from
            (``matrix.telemetry.scope.Versions``).

    Returns:
        One row per (class, digest, runtime, placement kind, providers, fallback, settings,
        judged version), sorted, plus events and distinct hosts per class.
    """
    conn = store.connection
    where, judged, params = scope_sql(
        start=start, end=end, cohort=cohort, attribution=attribution, versions=versions
    )
    rows = conn.execute(
        _PROFILE_SQL.format(where=where, judged=judged), {**params, "examples": _EXAMPLE_HOSTS}
    ).fetchall()
    class_where, _, class_params = scope_sql(
        start=start, end=end, cohort=cohort, attribution=attribution
    )
    per_class = conn.execute(_CLASS_SQL.format(where=class_where), class_params).fetchall()
    return TelemetryProfile(
        start=start,
        end=end,
        rows=tuple(_profile_row(r) for r in rows),
        class_events={str(r[0]): int(r[1]) for r in per_class},
        class_hosts={str(r[0]): int(r[2]) for r in per_class},
    )


def latency_tails(
    store: Store,
    *,
    start: datetime,
    end: datetime,
    wanted: dict[tuple[str, str], int],
    cohort: Cohort | None = None,
    attribution: Attribution | None = None,
) -> dict[tuple[str, str], npt.NDArray[np.float64]]:
    """The largest latencies of chosen (class, digest) pairs in a window, largest first.

    A p99 and its confidence bounds are order statistics near the top, so only the tail is
    read, never every sample: one pass over the window keeping the top ``max(wanted)`` values
    per pair.

    Args:
        store: An open store.
        start: Window start (inclusive).
        end: Window end (inclusive).
        wanted: (host class, model digest) -> how many of the largest latencies to return.
        cohort: Only one side of a staged rollout (see `Cohort`).
        attribution: Only this model line's events.

    Returns:
        (host class, model digest) -> latencies in ms, descending, at most the number asked
        (fewer when the pair has fewer samples); pairs with no latency are absent.
    """
    wanted = {pair: count for pair, count in wanted.items() if count > 0}
    if not wanted:
        return {}
    pairs = pa.table(
        {
            "host_class": [pair[0] for pair in wanted],
            "model_digest": [pair[1] for pair in wanted],
        }
    )
    conn = store.connection
    where, _, params = scope_sql(
        start=start, end=end, cohort=cohort, attribution=attribution, alias="t."
    )
    conn.register("_wanted_pairs", pairs)
    try:
        rows = conn.execute(
            "SELECT t.host_class, t.model_digest, max(t.latency_ms, $top) "
            "FROM telemetry AS t SEMI JOIN _wanted_pairs AS p "
            "ON t.host_class = p.host_class AND t.model_digest = p.model_digest "
            f"WHERE t.latency_ms IS NOT NULL AND {where} "
            "GROUP BY t.host_class, t.model_digest",
            {**params, "top": max(wanted.values())},
        ).fetchall()
    finally:
        conn.unregister("_wanted_pairs")
    found: dict[tuple[str, str], npt.NDArray[np.float64]] = {}
    for host_class, digest, values in rows:
        pair = (str(host_class), str(digest))
        tail = np.sort(np.asarray(values, dtype=np.float64))[::-1]
        found[pair] = tail[: wanted[pair]].copy()
    return found


def revisions_by_class(
    store: Store, *, start: datetime, end: datetime, attribution: Attribution | None = None
) -> dict[str, dict[str, int]]:
    """Runtime revisions reported per class in a window, with the number of distinct hosts.

    Args:
        store: An open store.
        start: Window start (inclusive).
        end: Window end (inclusive).
        attribution: Only this model line's events.

    Returns:
        host class -> {runtime revision: hosts}.
    """
    where, _, params = scope_sql(start=start, end=end, attribution=attribution)
    rows = store.connection.execute(
        "SELECT host_class, runtime_revision, count(DISTINCT host_id) FROM telemetry "
        f"WHERE {where} GROUP BY ALL",
        params,
    ).fetchall()
    found: dict[str, dict[str, int]] = {}
    for host_class, revision, hosts in rows:
        found.setdefault(str(host_class), {})[str(revision)] = int(hosts)
    return found
