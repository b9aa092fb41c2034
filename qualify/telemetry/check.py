"""Judging the deployed path: the window's telemetry against the manifest and the matrix.

Owns ``check_telemetry``, the judgement of ``qualify telemetry check``: a pure function over the
manifest, the cells and the window's aggregates (no clock, no database, no printing), and what it
needs read from the matrix (``TelemetryAggregates``; ``tails_needed`` and ``tail_size`` say which
latency tails and how long). Does not own the queries (``matrix.telemetry.queries``, run by
``qualify.telemetry.watch.gather_aggregates``), the event and result models (``schemas.telemetry``),
the runtime revisions a class counts as qualified (``qualify.telemetry.staleness``, so that an
``unqualified_runtime`` alert and ``qualify matrix stale`` agree), the text people read
(``qualify.telemetry.render``) nor what hosts write (``manifest.host_events``).

Each event is judged against the manifest version it reports, or the one published at its time
(``qualify.telemetry.timeline``). The alerts it raises per class (``unexpected_digest``,
``lagging``, ``provider_changed``, ``fallback_appeared``, ``p99_regression``, ``no_data``,
``unqualified_runtime``, ``unknown_class``) and their exact rules: docs/telemetry.md, "Check".
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import numpy.typing as npt

from matrix.telemetry.queries import ProfileRow, TelemetryProfile
from matrix.telemetry.scope import HostState
from qualify.measure.stats import quantile_bound_ranks
from qualify.telemetry.staleness import qualified_revisions
from qualify.telemetry.timeline import (
    ClassHosts,
    Releases,
    digest_alert,
    judge_hosts,
    lagging_alert,
    serving_digests,
)
from schemas.cell import Cell, Placement, latest
from schemas.manifest import Manifest, ManifestEntry
from schemas.rules import order_rank, p99_outcome
from schemas.settings import decode_settings, qualified_settings, settings_differences
from schemas.telemetry import (
    Alert,
    AlertKind,
    CheckSettings,
    ClassState,
    ClassStateName,
    Severity,
    SkippedEvents,
    TelemetryCheck,
)

__all__ = [
    "TelemetryAggregates",
    "check_telemetry",
    "judged_digests",
    "tail_size",
    "tails_needed",
]

_Q = 0.99
_Tail = npt.NDArray[np.float64]


@dataclass(frozen=True)
class TelemetryAggregates:
    """What a check reads from the matrix: the window's profile, the latency tails, each host's
    latest event, and the manifests they are judged against.

    Attributes:
        profile: The line's events of the window grouped per (class, digest, runtime,
            providers, fallback, settings, judged version).
        tails: (class, digest) -> largest latencies in ms, descending: at least ``tail_size``
            of the pair's sample count, for the pairs with enough samples.
        releases: The published manifests the events are judged against (the last current).
        hosts: Each host's latest event of the window (of the line).
        skipped: Events of the window that are not the line's, per model line they name.
    """

    profile: TelemetryProfile
    tails: Mapping[tuple[str, str], _Tail]
    releases: Releases
    hosts: Sequence[HostState] = ()
    skipped: Sequence[SkippedEvents] = ()


def tail_size(n: int, *, confidence: float) -> int:
    """How many of the largest of n latencies a p99 and its bounds need.

    Args:
        n: Sample count, >= 1.
        confidence: One-sided confidence of the bounds.

    Returns:
        ``n - r + 1`` where r is the smallest rank among the p99 and its bounds.
    """
    lower, _ = quantile_bound_ranks(n, _Q, confidence)
    smallest = min(order_rank(n, _Q), lower if lower is not None else n)
    return n - smallest + 1


def judged_digests(
    profile: TelemetryProfile, releases: Releases
) -> dict[str, dict[str, ManifestEntry]]:
    """Per class, the digests whose latency and placement are judged, each with the entry that
    gives it (the newest of the events' versions that does): the current assigned artifact, and
    every digest an event's own version gave the class (its artifact or rollout artifact)."""
    found: dict[str, dict[str, ManifestEntry]] = defaultdict(dict)
    versions: dict[tuple[str, str], int] = {}
    for name, entry in releases.current.signed.entries.items():
        if entry.artifact is not None:
            found[name][entry.artifact.digest] = entry
            versions[(name, entry.artifact.digest)] = releases.current.signed.version
    for row in profile.rows:
        giving = releases.entry(row.version, row.host_class)
        digest = row.model_digest
        if giving is None or digest is None or digest not in serving_digests(giving):
            continue
        version = row.version if row.version is not None else 0
        if version > versions.get((row.host_class, digest), -1):
            found[row.host_class][digest] = giving
            versions[(row.host_class, digest)] = version
    return dict(found)


def tails_needed(
    profile: TelemetryProfile, releases: Releases, settings: CheckSettings
) -> dict[tuple[str, str], int]:
    """Which latency tails a check judges, and how many of the largest latencies each needs.

    Args:
        profile: The window's profile (its sample counts per class and digest).
        releases: The manifests the events are judged against (`judged_digests`).
        settings: min_samples and confidence.

    Returns:
        (class, digest) -> ``tail_size`` for each judged digest of a class with at least
        ``min_samples`` latencies in the window (all of the class's events of that digest).
    """
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for row in profile.rows:
        if row.model_digest is not None:
            counts[(row.host_class, row.model_digest)] += row.latency_samples
    wanted: dict[tuple[str, str], int] = {}
    for name, digests in judged_digests(profile, releases).items():
        for digest in digests:
            n = counts.get((name, digest), 0)
            if n >= settings.min_samples:
                wanted[(name, digest)] = tail_size(n, confidence=settings.confidence)
    return wanted


# -- the check -------------------------------------------------------------------------------


def _hosts(rows: Iterable[ProfileRow]) -> list[str]:
    return sorted({h for r in rows for h in r.example_hosts})[:5]


def _group(rows: Sequence[ProfileRow], **extra: Any) -> dict[str, Any]:
    return {
        **extra,
        "events": sum(r.events for r in rows),
        "hosts": sum(r.hosts for r in rows),
        "example_hosts": _hosts(rows),
        "first_seen": min(r.first for r in rows).isoformat(),
        "last_seen": max(r.last for r in rows).isoformat(),
    }


def _qualified_cell(entry: ManifestEntry, cells: Sequence[Cell], digest: str) -> Cell | None:
    """The cell ``digest`` was qualified on for the entry's key: the one the entry's evidence
    cites, else the latest."""
    key = entry.key.as_tuple()
    mine = [c for c in cells if c.key.as_tuple() == key and c.artifact_digest == digest]
    if entry.evidence is not None and entry.evidence.artifact_digest == digest:
        for cell in mine:
            if cell.run_id == entry.evidence.run_id:
                return cell
    return latest(mine)


def _qualified_p99(entry: ManifestEntry, cell: Cell | None, digest: str) -> float | None:
    evidence = entry.evidence
    if (
        evidence is not None
        and evidence.artifact_digest == digest
        and evidence.p99_upper_us is not None
    ):
        return evidence.p99_upper_us / 1000.0
    gate = cell.gate_latency if cell is not None else None
    return gate.p99_upper_ms if gate is not None else None


def _at_rank(tail: _Tail, n: int, rank: int | None) -> float | None:
    if rank is None:
        return None
    index = n - rank  # tail is descending: rank n is tail[0]
    return float(tail[index]) if 0 <= index < tail.size else None


def _alert(
    name: str,
    kind: AlertKind,
    severity: Severity,
    message: str,
    evidence: dict[str, Any],
    action: str,
) -> Alert:
    return Alert(
        host_class=name,
        kind=kind,
        severity=severity,
        message=message,
        evidence=evidence,
        suggested_action=action,
    )


@dataclass(frozen=True)
class _Path:
    """One digest a class's versions gave it, as the check judges it."""

    digest: str
    label: str
    entry: ManifestEntry  # the newest of the events' versions that gives it
    cell: Cell | None  # where it was qualified on the class's key
    rows: Sequence[ProfileRow]  # the class's events of this digest, under a version giving it
    primary: bool  # the current manifest's assigned artifact


def _placement_alerts(name: str, path: _Path) -> tuple[list[Alert], list[str]]:
    notes: list[str] = []
    mine = path.rows
    if not mine:
        if path.primary:
            notes.append(
                f"no event of the assigned digest {path.digest[:19]}: providers not judged"
            )
        return [], notes
    cell = path.cell
    placement = cell.placement if cell is not None else None
    if placement is None:
        return [], [
            f"{path.label}: the qualified cell's placement is unknown: providers not judged"
        ]
    qualified = sorted(p for p, n in placement.nodes_per_provider.items() if n > 0)
    alerts: list[Alert] = []
    changed = [
        r
        for r in mine
        if (r.placement == "actual" and sorted(r.providers) != qualified)
        or (r.placement != "actual" and not set(qualified) <= set(r.providers))
    ]
    if changed:
        combos: dict[tuple[str, tuple[str, ...]], list[ProfileRow]] = defaultdict(list)
        for r in changed:
            combos[(r.placement, r.providers)].append(r)
        observed = [
            _group(found, providers=list(providers), placement=kind)
            for (kind, providers), found in sorted(combos.items())
        ]
        shown = "; ".join(f"{'+'.join(o['providers']) or 'none'}" for o in observed)
        alerts.append(
            _alert(
                name,
                "provider_changed",
                "critical",
                f"{sum(o['hosts'] for o in observed)} host(s) of {name} run {path.label} on "
                f"{shown}; it was qualified on {'+'.join(qualified) or 'no provider'} (run "
                f"{cell.run_id if cell else '?'})",
                {
                    "digest": path.digest,
                    "qualified_providers": qualified,
                    "qualified_run_id": cell.run_id if cell else None,
                    "observed": observed,
                },
                "A driver, image or runtime change moved the model to another provider without "
                f"changing its digest: re-qualify the class on the new image (qualify run "
                f"--host-class {name}), or pin the image and hold the class until then.",
            )
        )
    fallback = _fallback_alert(name, path, placement)
    if fallback is not None:
        alerts.append(fallback)
    if path.primary and not any(r.placement == "actual" for r in mine):
        notes.append(
            f"{path.label}: no event with actual placement (record_session on a session with "
            "session.record_ep_graph_assignment_info=1): fallback not judged"
        )
    return alerts, notes


def _fallback_alert(name: str, path: _Path, placement: Placement) -> Alert | None:
    """``fallback_appeared`` where hosts run more nodes off the expected provider than the
    qualified cell did; its evidence names the nodes the qualified cell ran off it."""
    expected, qualified = placement.expected_provider, placement.fallback_nodes
    named = placement.off_provider_nodes
    worse = [
        r
        for r in path.rows
        if r.placement == "actual" and r.fallback_nodes is not None and r.fallback_nodes > qualified
    ]
    if not worse:
        return None
    return _alert(
        name,
        "fallback_appeared",
        "critical",
        f"{sum(r.hosts for r in worse)} host(s) of {name} run {path.label} with up to "
        f"{max(r.fallback_nodes or 0 for r in worse)} node(s) off {expected}; the qualified "
        f"cell had {qualified}",
        {
            "digest": path.digest,
            "expected_provider": expected,
            "qualified_fallback_nodes": qualified,
            # By name and op type, the first OFF_PROVIDER_KEPT; null: the cell did not name them.
            "qualified_off_provider_nodes": (
                None if named is None else [n.model_dump() for n in named]
            ),
            "observed_max_fallback_nodes": max(r.fallback_nodes or 0 for r in worse),
            **_group(worse),
        },
        "Nodes fell back off the expected provider (look for provider warnings in the "
        "service log); fix the host's provider install, or set strict_fallback so the "
        f"session fails loudly, and re-qualify the class (qualify run --host-class {name}).",
    )


def _qualified_settings_of(entry: ManifestEntry, digest: str) -> dict[str, str] | None:
    """The settings ``digest`` was approved under in this entry; None: not one of its own."""
    provider = entry.provider
    assigned = entry.artifact.digest if entry.artifact is not None else None
    if entry.rollback is not None and digest == entry.rollback.digest and digest != assigned:
        provider = entry.rollback.provider or entry.provider
    elif digest != assigned and (entry.rollout is None or digest != entry.rollout.artifact.digest):
        return None
    return qualified_settings(provider.model_dump(mode="json"))


def _settings_alert(
    name: str, rows: Sequence[ProfileRow], releases: Releases, current: ManifestEntry
) -> Alert | None:
    """Hosts whose sessions run one of the class's artifacts under other session settings
    than the version each event is judged against approved it under."""
    combos: dict[tuple[str, str], list[ProfileRow]] = defaultdict(list)
    phrases: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        if row.settings is None or row.model_digest is None:
            continue
        entry = releases.entry(row.version, name)
        qualified = _qualified_settings_of(entry, row.model_digest) if entry else None
        if qualified is None:
            continue  # an unexpected digest: its own alert
        differences = settings_differences(qualified, decode_settings(row.settings))
        if differences:
            combos[(row.model_digest, row.settings)].append(row)
            phrases[(row.model_digest, row.settings)] = differences
    if not combos:
        return None
    observed = [
        _group(found, digest=digest, settings=text, differences=phrases[(digest, text)])
        for (digest, text), found in sorted(combos.items())
    ]
    hosts = sum(o["hosts"] for o in observed)
    first = observed[0]["differences"]
    shown = "; ".join(first[:3]) + (f" (+{len(first) - 3} more)" if len(first) > 3 else "")
    return _alert(
        name,
        "settings_differ",
        "critical",
        f"{hosts} host(s) of {name} run the model with other session settings than it was "
        f"qualified with: {shown}",
        {
            "qualified": qualified_settings(current.provider.model_dump(mode="json")),
            "observed": observed,
        },
        "Build the session with resolve-artifact's settings (threads, execution mode, graph "
        "level, session config, provider options), or qualify the class under the settings "
        f"the hosts use (edit its provider section, then qualify run --host-class {name}).",
    )


def _runtime_alert(
    name: str, key: tuple[str, str, str], cells: Sequence[Cell], rows: Sequence[ProfileRow]
) -> Alert | None:
    qualified = qualified_revisions(cells, key)
    by_revision: dict[str, list[ProfileRow]] = defaultdict(list)
    for row in rows:
        if row.runtime_revision not in qualified:
            by_revision[row.runtime_revision].append(row)
    if not by_revision:
        return None
    seen = [_group(found, runtime_revision=rev) for rev, found in sorted(by_revision.items())]
    revisions = ", ".join(item["runtime_revision"] for item in seen)
    return _alert(
        name,
        "unqualified_runtime",
        "warning",
        f"{sum(i['hosts'] for i in seen)} host(s) of {name} run onnxruntime {revisions}; the "
        f"class was qualified on {', '.join(sorted(qualified)) or 'no revision at all'}",
        {"qualified_revisions": sorted(qualified), "seen": seen},
        f"Qualify the class on that runtime (qualify run --host-class {name} on such a host); "
        "`qualify matrix stale` lists it until then.",
    )


def _p99_state(n: int) -> dict[str, Any]:
    return {
        "latency_samples": n,
        "observed_p99_ms": None,
        "observed_p99_lower_ms": None,
        "observed_p99_upper_ms": None,
        "qualified_p99_upper_ms": None,
        "p99_threshold_ms": None,
        "p99": "not_judged",
    }


def _p99(
    name: str,
    path: _Path,
    n: int,
    tails: Mapping[tuple[str, str], _Tail],
    settings: CheckSettings,
) -> tuple[dict[str, Any], Alert | None, str | None]:
    """One judged digest's p99 over all of the class's latencies of it in the window."""
    state = _p99_state(n)
    qualified = _qualified_p99(path.entry, path.cell, path.digest)
    threshold = qualified * (1.0 + settings.p99_tolerance) if qualified is not None else None
    state["qualified_p99_upper_ms"] = qualified
    state["p99_threshold_ms"] = threshold
    tail = tails.get((name, path.digest))
    if n >= settings.min_samples and tail is not None:
        lower_rank, upper_rank = quantile_bound_ranks(n, _Q, settings.confidence)
        state["observed_p99_ms"] = _at_rank(tail, n, order_rank(n, _Q))
        state["observed_p99_lower_ms"] = _at_rank(tail, n, lower_rank)
        state["observed_p99_upper_ms"] = _at_rank(tail, n, upper_rank)
    which = "the assigned digest" if path.primary else path.label
    if threshold is None:
        return state, None, f"no qualified p99 bound for {which}: p99 not judged"
    if n < settings.min_samples or tail is None:
        state["p99"] = "insufficient_data"
        return (
            state,
            None,
            f"insufficient data: {n} latency sample(s) of {which}, a p99 needs "
            f"{settings.min_samples}",
        )
    lower, upper = state["observed_p99_lower_ms"], state["observed_p99_upper_ms"]
    outcome = p99_outcome(lower, upper, threshold)
    if outcome == "fail":
        state["p99"] = "regressed"
        return state, _p99_alert(name, path, state, settings), None
    if outcome == "pass":
        state["p99"] = "ok"
        return state, None, None
    state["p99"] = "insufficient_data"
    return (
        state,
        None,
        f"insufficient data: the observed p99 bounds of {which} ({lower} to {upper} ms) "
        f"straddle the threshold {threshold:.3g} ms",
    )


def _p99_alert(name: str, path: _Path, state: dict[str, Any], settings: CheckSettings) -> Alert:
    lower, n = state["observed_p99_lower_ms"], state["latency_samples"]
    qualified, threshold = state["qualified_p99_upper_ms"], state["p99_threshold_ms"]
    rollback = path.entry.rollback
    of = "" if path.primary else f" running {path.label}"
    return _alert(
        name,
        "p99_regression",
        "critical",
        f"{name}'s observed p99{of} is {state['observed_p99_ms']:.3g} ms (lower bound "
        f"{lower:.3g} ms at {settings.confidence:.0%} confidence, {n} samples); qualified "
        f"p99 upper bound {qualified:.3g} ms, threshold {threshold:.3g} ms "
        f"(+{settings.p99_tolerance:.0%})",
        {
            "digest": path.digest,
            "samples": n,
            "observed_p99_ms": state["observed_p99_ms"],
            "observed_p99_lower_ms": lower,
            "observed_p99_upper_ms": state["observed_p99_upper_ms"],
            "qualified_p99_upper_ms": qualified,
            "qualified_run_id": path.cell.run_id if path.cell else None,
            "threshold_ms": threshold,
            "tolerance": settings.p99_tolerance,
            "confidence": settings.confidence,
            "example_hosts": _hosts(path.rows),
        },
        "Compare the hosts' load, batch and image with the qualified run; re-qualify the "
        f"class (qualify run --host-class {name}) and regenerate the manifest, or roll the "
        f"class back to {rollback.name if rollback else 'the baseline'} if users are hurt.",
    )


@dataclass(frozen=True)
class _Context:
    """What judging any one class reads besides that class's own rows."""

    cells: Sequence[Cell]
    aggregates: TelemetryAggregates
    settings: CheckSettings
    now: datetime
    releases: Releases
    judged: Mapping[str, Mapping[str, ManifestEntry]]  # class -> digest -> entry giving it
    hosts: Mapping[str, ClassHosts]


def _rows_by_class(rows: Iterable[ProfileRow]) -> dict[str, list[ProfileRow]]:
    by_class: dict[str, list[ProfileRow]] = defaultdict(list)
    for row in rows:
        by_class[row.host_class].append(row)
    return by_class


def _label(entry: ManifestEntry, digest: str) -> str:
    """The name the entry gives ``digest`` (its artifact's or its rollout's)."""
    for art in (entry.artifact, entry.rollout.artifact if entry.rollout else None):
        if art is not None and art.digest == digest:
            return art.name
    return digest[:19]


def _paths(name: str, rows: Sequence[ProfileRow], ctx: _Context) -> list[_Path]:
    """The digests judged for placement and p99, the current assigned one first."""
    current = ctx.releases.current.signed.entries[name]
    assigned = current.artifact.digest if current.artifact is not None else None
    found = []
    for digest, entry in ctx.judged.get(name, {}).items():
        giving = [
            r
            for r in rows
            if r.model_digest == digest
            and digest in serving_digests(ctx.releases.entry(r.version, name) or current)
        ]
        found.append(
            _Path(
                digest=digest,
                label=_label(entry, digest),
                entry=entry,
                cell=_qualified_cell(entry, ctx.cells, digest),
                rows=giving,
                primary=digest == assigned,
            )
        )
    return sorted(found, key=lambda p: (not p.primary, p.label, p.digest))


def _no_data_alert(name: str, start: datetime, now: datetime) -> Alert:
    return _alert(
        name,
        "no_data",
        "warning",
        f"{name} sent no telemetry since {start.isoformat()}: its path is not watched",
        {"window_start": start.isoformat(), "window_end": now.isoformat()},
        "Check that the class's hosts emit telemetry (resolve-artifact "
        "--emit-telemetry, manifest.host_events.record_session) and that the files are "
        "ingested (qualify telemetry ingest); if the class has no hosts any more, "
        "drop it from the project.",
    )


def _path_alerts(
    name: str, rows: Sequence[ProfileRow], paths: Sequence[_Path], ctx: _Context
) -> tuple[list[Alert], list[str], dict[str, Any] | None]:
    """Alerts and notes of a class that sent events (digest, lag, placement, settings, p99 and
    runtime), and the p99 state of its current assigned digest."""
    current = ctx.releases.current.signed.entries[name]
    hosts = ctx.hosts.get(name, ClassHosts())
    alerts: list[Alert] = []
    notes: list[str] = []
    found = digest_alert(name, ctx.releases, hosts, current)
    if found is not None:
        alerts.append(found)
    lag, lag_notes = lagging_alert(
        name, hosts, now=ctx.now, deadline=ctx.settings.propagation_deadline
    )
    if lag is not None:
        alerts.append(lag)
    notes.extend(lag_notes)
    if current.artifact is None:
        notes.append(f"{name} is on hold: no qualified path to compare providers and latency with")
    counts: dict[str, int] = defaultdict(int)
    for row in rows:
        if row.model_digest is not None:
            counts[row.model_digest] += row.latency_samples
    primary: dict[str, Any] | None = None
    for path in paths:
        placement_alerts, placement_notes = _placement_alerts(name, path)
        alerts.extend(placement_alerts)
        notes.extend(placement_notes)
        if not path.primary and not path.rows:
            continue
        state, p99_alert, p99_note = _p99(
            name, path, counts.get(path.digest, 0), ctx.aggregates.tails, ctx.settings
        )
        primary = state if path.primary else primary
        alerts.extend([p99_alert] if p99_alert is not None else [])
        if p99_note is not None and (path.primary or state["latency_samples"]):
            notes.append(p99_note)  # another digest's p99 is noted once it has latencies
    settings_alert = _settings_alert(name, rows, ctx.releases, current)
    if settings_alert is not None:
        alerts.append(settings_alert)
    runtime_alert = _runtime_alert(name, current.key.as_tuple(), ctx.cells, rows)
    if runtime_alert is not None:
        alerts.append(runtime_alert)
    return alerts, notes, primary


def _state_name(events: int, alerts: Sequence[Alert], p99: str) -> ClassStateName:
    """A class's state: no data outranks an alert, an alert outranks an undecided p99."""
    if events == 0:
        return "no_data"
    if alerts:
        return "alert"
    if p99 == "insufficient_data":
        return "insufficient_data"
    return "ok"


def _judge_class(
    name: str, rows: Sequence[ProfileRow], ctx: _Context
) -> tuple[list[Alert], ClassState]:
    """One class of the current manifest: its alerts (sorted by kind) and its state."""
    entry = ctx.releases.current.signed.entries[name]
    profile = ctx.aggregates.profile
    events = profile.class_events.get(name, 0)
    paths = _paths(name, rows, ctx)
    primary: dict[str, Any] | None = None
    if events == 0:
        mine = [_no_data_alert(name, profile.start, ctx.now)]
        notes: list[str] = []
        first = next((p for p in paths if p.primary), None)
        if first is not None:
            primary, _, _ = _p99(name, first, 0, ctx.aggregates.tails, ctx.settings)
    else:
        mine, notes, primary = _path_alerts(name, rows, paths, ctx)
    mine.sort(key=lambda a: a.kind)
    p99_state = primary if primary is not None else _p99_state(0)
    state = ClassState(
        host_class=name,
        state=_state_name(events, mine, p99_state["p99"]),
        decision=entry.decision,
        events=events,
        hosts=profile.class_hosts.get(name, 0),
        alerts=sorted({a.kind for a in mine}),
        notes=notes,
        lagging=list(ctx.hosts[name].lagging) if name in ctx.hosts else [],
        **p99_state,
    )
    return mine, state


def _unknown_class(
    name: str, rows: Sequence[ProfileRow], profile: TelemetryProfile, version: int
) -> tuple[Alert, ClassState]:
    """A class that sent events but is not in the manifest: reported, never judged."""
    alert = _alert(
        name,
        "unknown_class",
        "warning",
        f"{profile.class_hosts.get(name, 0)} host(s) report class {name}, which manifest "
        f"v{version} does not have",
        _group(rows, digests=sorted({r.model_digest for r in rows if r.model_digest})),
        "Fix the hosts' --host-class, or add the class to the project, qualify it and "
        "generate a new manifest.",
    )
    state = ClassState(
        host_class=name,
        state="alert",
        decision=None,
        events=profile.class_events.get(name, 0),
        hosts=profile.class_hosts.get(name, 0),
        latency_samples=sum(r.latency_samples for r in rows),
        observed_p99_ms=None,
        observed_p99_lower_ms=None,
        observed_p99_upper_ms=None,
        qualified_p99_upper_ms=None,
        p99_threshold_ms=None,
        p99="not_judged",
        alerts=["unknown_class"],
        notes=["not in the manifest: only reported"],
    )
    return alert, state


def check_telemetry(
    manifest: Manifest,
    cells: Sequence[Cell],
    aggregates: TelemetryAggregates,
    *,
    now: datetime,
    settings: CheckSettings | None = None,
) -> TelemetryCheck:
    """Judge the window's telemetry against the manifests and the matrix, class by class.

    Pure: no clock, no database; ``aggregates`` comes from
    ``qualify.telemetry.watch.gather_aggregates``.

    Args:
        manifest: The current manifest (the last of ``aggregates.releases``): its classes are
            judged, hosts on older versions against those.
        cells: Cells of the matrix (all of them: any run counts for the runtime revisions; the
            placement compared with is the cell the giving entry's evidence cites, else the
            latest on the class's key for that digest).
        aggregates: The window's profile, latency tails, host states and releases.
        now: The reference time (the window's end).
        settings: Tolerance, min_samples, confidence, propagation deadline; defaults to
            ``CheckSettings()``.

    Returns:
        Alerts (sorted by class, kind) and one state per class: the manifest's classes plus any
        unknown class that sent events.

    Raises:
        ValueError: ``manifest`` is not the newest of ``aggregates.releases``.
        QualifyError: the propagation deadline is not a duration.
    """
    from qualify.release.generate import parse_duration

    settings = settings or CheckSettings()
    releases = aggregates.releases
    if releases.current.signed.version != manifest.signed.version:
        raise ValueError(
            f"manifest v{manifest.signed.version} is not the newest release judged "
            f"(v{releases.current.signed.version})"
        )
    deadline = parse_duration(settings.propagation_deadline, what="propagation_deadline")
    profile = aggregates.profile
    version = manifest.signed.version
    rows_by_class = _rows_by_class(profile.rows)
    ctx = _Context(
        cells=cells,
        aggregates=aggregates,
        settings=settings,
        now=now,
        releases=releases,
        judged=judged_digests(profile, releases),
        hosts=judge_hosts(releases, aggregates.hosts, now=now, deadline=deadline),
    )
    alerts: list[Alert] = []
    states: list[ClassState] = []
    for name in sorted(manifest.signed.entries):
        mine, state = _judge_class(name, rows_by_class.get(name, []), ctx)
        alerts.extend(mine)
        states.append(state)
    for name in sorted(set(rows_by_class) - set(manifest.signed.entries)):
        alert, state = _unknown_class(name, rows_by_class[name], profile, version)
        alerts.append(alert)
        states.append(state)
    return TelemetryCheck(
        checked_at=now,
        window_start=profile.start,
        manifest_version=version,
        model=manifest.signed.model,
        versions=sorted({r.version for r in profile.rows if r.version is not None}),
        propagation_deadline=settings.propagation_deadline,
        skipped=list(aggregates.skipped),
        p99_tolerance=settings.p99_tolerance,
        min_samples=settings.min_samples,
        confidence=settings.confidence,
        events=sum(profile.class_events.values()),
        alerts=alerts,
        classes=states,
    )
