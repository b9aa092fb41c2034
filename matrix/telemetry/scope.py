"""Which telemetry a check reads, and under which manifest version: the SQL of the time rule.

Owns the part of the telemetry queries that a check over a product's life needs beyond the
window itself (each event's version, each host's latest event, the hosts that lag). Does not
judge anything (``qualify.telemetry.timeline``, ``qualify.telemetry.check``). More:
docs/internals.md, ``matrix.telemetry.scope``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from matrix.store import Store

__all__ = [
    "Attribution",
    "Cohort",
    "HostState",
    "Versions",
    "host_states",
    "reported_versions",
    "scope_sql",
    "skipped_events",
]

Cohort = tuple[str, str]
"""(rollout id, 'canary' or 'rest'): only the events of that side of that rollout; the rest
are every event not reported from its canary (hosts that report no rollout count as the rest)."""


@dataclass(frozen=True)
class Attribution:
    """The model line a check judges, and how its events are told from other lines'.

    Attributes:
        model: The line's name (the manifests' ``model``).
        digests: Every digest the line knows: its manifests' artifacts, rollbacks and rollout
            artifacts, and its cells' artifacts. An event that names no model is this line's
            when it runs one of them (or nothing).
    """

    model: str
    digests: tuple[str, ...]


@dataclass(frozen=True)
class Versions:
    """Published manifest versions and when each was published (its ``created``).

    Attributes:
        published: (version, created), any order; at least one.
    """

    published: tuple[tuple[int, datetime], ...]


@dataclass(frozen=True)
class HostState:
    """A host's latest event in the window (ties: the later line of the file, then the file).

    Attributes:
        host_class: The class it reported.
        host_id: The host.
        time: When.
        version: The manifest version that event is judged against (see `Versions`); None when
            the query was given no versions and the event reports none.
        reported_version: The version the event reported (None: none).
        digest: The digest it ran (None: nothing, e.g. a class on hold).
    """

    host_class: str
    host_id: str
    time: datetime
    version: int | None
    reported_version: int | None
    digest: str | None


def _judged_version(versions: Versions | None, params: dict[str, Any]) -> str:
    """SQL for the version an event is judged against (`Versions`)."""
    if versions is None or not versions.published:
        return "manifest_version"
    ordered = sorted(versions.published, reverse=True)
    params["known_versions"] = [int(v) for v, _ in ordered]
    cases = []
    for i, (version, created) in enumerate(ordered):
        params[f"published_{i}"] = created
        cases.append(f"WHEN time >= $published_{i} THEN {int(version)}")
    oldest = min(int(v) for v, _ in ordered)
    return (
        "CASE WHEN list_contains($known_versions::BIGINT[], manifest_version) THEN "
        f"manifest_version {' '.join(cases)} ELSE {oldest} END"
    )


def _attributed(attribution: Attribution | None, params: dict[str, Any], alias: str = "") -> str:
    """SQL: whether an event is the judged line's (`Attribution`)."""
    if attribution is None:
        return "true"
    params["line"] = attribution.model
    params["line_digests"] = list(attribution.digests)
    a = alias
    return (
        f"(coalesce({a}model = $line, false) OR ({a}model IS NULL AND ({a}model_digest IS NULL "
        f"OR coalesce(list_contains($line_digests::VARCHAR[], {a}model_digest), false))))"
    )


def _cohort_filter(cohort: Cohort | None, params: dict[str, Any], alias: str = "") -> str:
    if cohort is None:
        return "true"
    rollout, side = cohort
    canary = f"coalesce({alias}rollout = $rollout AND {alias}cohort = 'canary', false)"
    params["rollout"] = rollout
    if side == "canary":
        return canary
    if side == "rest":
        return f"NOT {canary}"
    raise ValueError(f"a cohort is 'canary' or 'rest', not {side!r}")


def scope_sql(
    *,
    start: datetime,
    end: datetime,
    cohort: Cohort | None = None,
    attribution: Attribution | None = None,
    versions: Versions | None = None,
    alias: str = "",
    own: bool = True,
) -> tuple[str, str, dict[str, Any]]:
    """The WHERE condition of a window's events and the judged-version expression.

    Args:
        start: Window start (inclusive).
        end: Window end (inclusive).
        cohort: Only one side of a staged rollout.
        attribution: Only the judged line's events (``own``), or only the others'.
        versions: The published versions the judged version is read from.
        alias: Table alias prefix for the condition (e.g. ``"t."``).
        own: With ``attribution``: the line's own events (True) or everything else (False).

    Returns:
        (condition, judged version expression, parameters).
    """
    params: dict[str, Any] = {"start": start, "end": end}
    line = _attributed(attribution, params, alias)
    condition = (
        f"{alias}time >= $start AND {alias}time <= $end AND "
        f"{_cohort_filter(cohort, params, alias)} AND " + (line if own else f"NOT {line}")
    )
    return condition, _judged_version(versions, params), params


def reported_versions(store: Store, *, start: datetime, end: datetime) -> set[int]:
    """The manifest versions any event of the window reports (whatever its model line)."""
    rows = store.connection.execute(
        "SELECT DISTINCT manifest_version FROM telemetry WHERE time >= $start AND time <= $end "
        "AND manifest_version IS NOT NULL",
        {"start": start, "end": end},
    ).fetchall()
    return {int(r[0]) for r in rows}


def host_states(
    store: Store,
    *,
    start: datetime,
    end: datetime,
    cohort: Cohort | None = None,
    attribution: Attribution | None = None,
    versions: Versions | None = None,
) -> tuple[HostState, ...]:
    """Each host's latest event of the window (of the judged line), by host id."""
    where, _, _ = scope_sql(start=start, end=end, cohort=cohort, attribution=attribution)
    where_t, judged, params = scope_sql(
        start=start,
        end=end,
        cohort=cohort,
        attribution=attribution,
        versions=versions,
        alias="t.",
    )
    # Each host's latest time first (a hash aggregate), then only the events at that time are
    # ranked for ties: a window over every event of the window sorted them all (measured at
    # 500,000 events: 2.1 s against 0.1 s).
    rows = store.connection.execute(
        f"WITH latest AS (SELECT host_id, max(time) AS at FROM telemetry WHERE {where} "
        "GROUP BY host_id) "
        f"SELECT t.host_class, t.host_id, t.time, {judged}, t.manifest_version, t.model_digest "
        f"FROM telemetry AS t JOIN latest ON t.host_id = latest.host_id AND t.time = latest.at "
        f"WHERE {where_t} "
        "QUALIFY row_number() OVER (PARTITION BY t.host_id ORDER BY t.file_sha256 DESC, "
        "t.line DESC) = 1 ORDER BY t.host_id",
        params,
    ).fetchall()
    return tuple(
        HostState(
            host_class=str(r[0]),
            host_id=str(r[1]),
            time=r[2],
            version=None if r[3] is None else int(r[3]),
            reported_version=None if r[4] is None else int(r[4]),
            digest=r[5],
        )
        for r in rows
    )


def skipped_events(
    store: Store,
    *,
    start: datetime,
    end: datetime,
    attribution: Attribution,
    cohort: Cohort | None = None,
    examples: int = 5,
) -> list[tuple[str | None, int, int, list[str]]]:
    """Events of the window that are not the judged line's, per model line they name.

    Returns:
        (model or None, events, distinct hosts, up to ``examples`` digests, sorted), by model
        (None first).
    """
    where, _, params = scope_sql(
        start=start, end=end, cohort=cohort, attribution=attribution, own=False
    )
    rows = store.connection.execute(
        "SELECT model, count(*)::BIGINT, count(DISTINCT host_id)::BIGINT, "
        "list_sort(list(DISTINCT model_digest) FILTER (WHERE model_digest IS NOT NULL)) "
        f"FROM telemetry WHERE {where} GROUP BY model ORDER BY model NULLS FIRST",
        params,
    ).fetchall()
    return [(r[0], int(r[1]), int(r[2]), [str(d) for d in (r[3] or [])][:examples]) for r in rows]
