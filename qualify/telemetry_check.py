"""Judging the deployed path: the window's telemetry against the manifest and the matrix.

Owns ``check_telemetry``, the judgement of ``qualify telemetry check``: a pure function over the
manifest, the cells and the window's aggregates (no clock, no database, no printing), and what it
needs read from the matrix (``TelemetryAggregates``; ``tails_needed`` and ``tail_size`` say which
latency tails and how long). Does not own the queries (``matrix.telemetry``, run by
``qualify.telemetry.gather_aggregates``), the event and result models (``schemas.telemetry``),
the runtime revisions a class counts as qualified (``qualify.staleness``, so that an
``unqualified_runtime`` alert and ``qualify matrix stale`` agree), the text people read
(``qualify.telemetry_render``) nor what hosts write (``manifest.host_events``).

Per class in the manifest, the check raises:

* ``unexpected_digest``: hosts run a digest the manifest does not assign to the class (the
  rollback digest of an entry is a warning: resolve-artifact served it because the host cannot
  run the entry's artifact; a staged rollout's artifact is assigned to its cohort);
* ``provider_changed`` and ``fallback_appeared``: events of the assigned digest whose providers
  differ from the qualified cell's actual placement, or with more nodes off the expected
  provider than that cell had (a driver or image change does not change the digest);
* ``p99_regression``: with at least ``min_samples`` latencies of the assigned digest, the
  observed p99's distribution-free lower confidence bound exceeds the qualified p99 upper bound
  times ``1 + p99_tolerance`` (below ``min_samples``, or when the bounds straddle the threshold,
  the p99 state is ``insufficient_data``, never a pass);
* ``no_data``: no event at all in the window (its own state, never a pass);
* ``unqualified_runtime``: hosts report an onnxruntime revision no cell of the class's key ran on;
* ``unknown_class``: hosts report a class the manifest does not know.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import numpy.typing as npt

from matrix.telemetry import ProfileRow, TelemetryProfile
from qualify.staleness import qualified_revisions
from qualify.stats import quantile_bound_ranks
from schemas.cell import Cell, latest
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
    TelemetryCheck,
)

__all__ = [
    "TelemetryAggregates",
    "check_telemetry",
    "tail_size",
    "tails_needed",
]

_Q = 0.99
_Tail = npt.NDArray[np.float64]


@dataclass(frozen=True)
class TelemetryAggregates:
    """What a check reads from the matrix: the window's profile and the latency tails.

    Attributes:
        profile: Events of the window grouped per (class, digest, runtime, providers, fallback).
        tails: (class, digest) -> largest latencies in ms, descending: at least ``tail_size``
            of the pair's sample count, for the pairs with enough samples.
    """

    profile: TelemetryProfile
    tails: Mapping[tuple[str, str], _Tail]


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


def _assigned(entry: ManifestEntry) -> str | None:
    return entry.artifact.digest if entry.artifact is not None else None


def tails_needed(
    profile: TelemetryProfile, manifest: Manifest, settings: CheckSettings
) -> dict[tuple[str, str], int]:
    """Which latency tails a check judges, and how many of the largest latencies each needs.

    Args:
        profile: The window's profile (its sample counts per class and digest).
        manifest: The manifest the check compares with (which digest each class runs).
        settings: min_samples and confidence.

    Returns:
        (class, assigned digest) -> ``tail_size`` for each class whose assigned digest has at
        least ``min_samples`` latencies in the window.
    """
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for row in profile.rows:
        if row.model_digest is not None:
            counts[(row.host_class, row.model_digest)] += row.latency_samples
    wanted: dict[tuple[str, str], int] = {}
    for name, entry in manifest.signed.entries.items():
        digest = _assigned(entry)
        n = counts.get((name, digest), 0) if digest else 0
        if digest and n >= settings.min_samples:
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


def _qualified_cell(entry: ManifestEntry, cells: Sequence[Cell]) -> Cell | None:
    digest = _assigned(entry)
    if digest is None:
        return None
    key = entry.key.as_tuple()
    mine = [c for c in cells if c.key.as_tuple() == key and c.artifact_digest == digest]
    if entry.evidence is not None and entry.evidence.artifact_digest == digest:
        for cell in mine:
            if cell.run_id == entry.evidence.run_id:
                return cell
    return latest(mine)


def _qualified_p99(entry: ManifestEntry, cell: Cell | None) -> float | None:
    evidence = entry.evidence
    if (
        evidence is not None
        and evidence.artifact_digest == _assigned(entry)
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


def _digest_alert(
    name: str,
    entry: ManifestEntry,
    rows: Sequence[ProfileRow],
    short: Mapping[str, str],
    version: int,
) -> Alert | None:
    assigned = _assigned(entry)
    rollback = entry.rollback.digest if entry.rollback is not None else None
    allowed = {assigned} if assigned is not None else ({rollback} if rollback else set())
    if entry.rollout is not None:  # the canary cohort runs the rollout's artifact, as assigned
        allowed.add(entry.rollout.artifact.digest)
    by_digest: dict[str, list[ProfileRow]] = defaultdict(list)
    for row in rows:
        if row.model_digest is not None and row.model_digest not in allowed:
            by_digest[row.model_digest].append(row)
    if not by_digest:
        return None
    seen = [
        _group(found, digest=digest, name=short.get(digest), is_rollback=digest == rollback)
        for digest, found in sorted(by_digest.items())
    ]
    only_rollback = all(item["is_rollback"] for item in seen)
    hosts = sum(item["hosts"] for item in seen)
    wanted = (
        f"{entry.artifact.name} ({assigned})"
        if entry.artifact is not None
        else "nothing new (the class is on hold)"
    )
    names = ", ".join(f"{item['name'] or item['digest'][:19]}" for item in seen)
    if only_rollback:
        action = (
            "These hosts were served the rollback: resolve-artifact found that their runtime or "
            "providers cannot run the entry's artifact. Fix the host image, or re-qualify the "
            f"class on it (qualify run --host-class {name})."
        )
    else:
        action = (
            "Find what deployed that model; re-run resolve-artifact on the hosts (it answers "
            f"{wanted}), or hold the class in the next manifest."
        )
    return _alert(
        name,
        "unexpected_digest",
        "warning" if only_rollback else "critical",
        f"{hosts} host(s) of {name} run {names}; manifest v{version} assigns {wanted}",
        {"assigned": assigned, "rollback": rollback, "seen": seen},
        action,
    )


def _placement_alerts(
    name: str, entry: ManifestEntry, cell: Cell | None, rows: Sequence[ProfileRow]
) -> tuple[list[Alert], list[str]]:
    assigned = _assigned(entry)
    notes: list[str] = []
    if assigned is None:
        return [], [f"{name} is on hold: no qualified path to compare providers and latency with"]
    mine = [r for r in rows if r.model_digest == assigned]
    if not mine:
        return [], [f"no event of the assigned digest {assigned[:19]}: providers not judged"]
    placement = cell.placement if cell is not None else None
    if placement is None:
        return [], ["the qualified cell's placement is unknown: providers not judged"]
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
                f"{sum(o['hosts'] for o in observed)} host(s) of {name} run "
                f"{entry.artifact.name if entry.artifact else assigned} on {shown}; it was "
                f"qualified on {'+'.join(qualified) or 'no provider'} (run {cell.run_id if cell else '?'})",
                {
                    "digest": assigned,
                    "qualified_providers": qualified,
                    "qualified_run_id": cell.run_id if cell else None,
                    "observed": observed,
                },
                "A driver, image or runtime change moved the model to another provider without "
                f"changing its digest: re-qualify the class on the new image (qualify run "
                f"--host-class {name}), or pin the image and hold the class until then.",
            )
        )
    qualified_fallback = placement.fallback_nodes
    worse = [
        r
        for r in mine
        if r.placement == "actual"
        and r.fallback_nodes is not None
        and r.fallback_nodes > qualified_fallback
    ]
    if worse:
        alerts.append(
            _alert(
                name,
                "fallback_appeared",
                "critical",
                f"{sum(r.hosts for r in worse)} host(s) of {name} run up to "
                f"{max(r.fallback_nodes or 0 for r in worse)} node(s) off "
                f"{placement.expected_provider}; the qualified cell had {qualified_fallback}",
                {
                    "digest": assigned,
                    "expected_provider": placement.expected_provider,
                    "qualified_fallback_nodes": qualified_fallback,
                    "observed_max_fallback_nodes": max(r.fallback_nodes or 0 for r in worse),
                    **_group(worse),
                },
                "Nodes fell back off the expected provider (look for provider warnings in the "
                "service log); fix the host's provider install, or set strict_fallback so the "
                f"session fails loudly, and re-qualify the class (qualify run --host-class {name}).",
            )
        )
    if not any(r.placement == "actual" for r in mine):
        notes.append(
            "no event with actual placement (record_session on a session with "
            "session.record_ep_graph_assignment_info=1): fallback not judged"
        )
    return alerts, notes


def _qualified_settings_of(entry: ManifestEntry, digest: str) -> dict[str, str] | None:
    """The settings ``digest`` was approved under in this entry; None: not one of its own."""
    provider = entry.provider
    if (
        entry.rollback is not None
        and digest == entry.rollback.digest
        and digest != _assigned(entry)
    ):
        provider = entry.rollback.provider or entry.provider
    elif digest != _assigned(entry) and (
        entry.rollout is None or digest != entry.rollout.artifact.digest
    ):
        return None
    return qualified_settings(provider.model_dump(mode="json"))


def _settings_alert(name: str, entry: ManifestEntry, rows: Sequence[ProfileRow]) -> Alert | None:
    """Hosts whose sessions run one of the class's artifacts under other session settings."""
    combos: dict[tuple[str, str], list[ProfileRow]] = defaultdict(list)
    phrases: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        if row.settings is None or row.model_digest is None:
            continue
        qualified = _qualified_settings_of(entry, row.model_digest)
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
            "qualified": qualified_settings(entry.provider.model_dump(mode="json")),
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


def _p99(
    name: str,
    entry: ManifestEntry,
    cell: Cell | None,
    rows: Sequence[ProfileRow],
    tails: Mapping[tuple[str, str], _Tail],
    settings: CheckSettings,
) -> tuple[dict[str, Any], Alert | None, str | None]:
    assigned = _assigned(entry)
    n = sum(r.latency_samples for r in rows if r.model_digest == assigned) if assigned else 0
    state: dict[str, Any] = {
        "latency_samples": n,
        "observed_p99_ms": None,
        "observed_p99_lower_ms": None,
        "observed_p99_upper_ms": None,
        "qualified_p99_upper_ms": None,
        "p99_threshold_ms": None,
        "p99": "not_judged",
    }
    if assigned is None:
        return state, None, None
    qualified = _qualified_p99(entry, cell)
    threshold = qualified * (1.0 + settings.p99_tolerance) if qualified is not None else None
    state["qualified_p99_upper_ms"] = qualified
    state["p99_threshold_ms"] = threshold
    tail = tails.get((name, assigned))
    if n >= settings.min_samples and tail is not None:
        lower_rank, upper_rank = quantile_bound_ranks(n, _Q, settings.confidence)
        state["observed_p99_ms"] = _at_rank(tail, n, order_rank(n, _Q))
        state["observed_p99_lower_ms"] = _at_rank(tail, n, lower_rank)
        state["observed_p99_upper_ms"] = _at_rank(tail, n, upper_rank)
    if threshold is None:
        return state, None, "no qualified p99 bound for the assigned artifact: p99 not judged"
    if n < settings.min_samples or tail is None:
        state["p99"] = "insufficient_data"
        return (
            state,
            None,
            f"insufficient data: {n} latency sample(s) of the assigned digest, a p99 needs "
            f"{settings.min_samples}",
        )
    lower, upper = state["observed_p99_lower_ms"], state["observed_p99_upper_ms"]
    outcome = p99_outcome(lower, upper, threshold)
    if outcome == "fail":
        state["p99"] = "regressed"
        alert = _alert(
            name,
            "p99_regression",
            "critical",
            f"{name}'s observed p99 is {state['observed_p99_ms']:.3g} ms (lower bound "
            f"{lower:.3g} ms at {settings.confidence:.0%} confidence, {n} samples); qualified "
            f"p99 upper bound {qualified:.3g} ms, threshold {threshold:.3g} ms "
            f"(+{settings.p99_tolerance:.0%})",
            {
                "digest": assigned,
                "samples": n,
                "observed_p99_ms": state["observed_p99_ms"],
                "observed_p99_lower_ms": lower,
                "observed_p99_upper_ms": upper,
                "qualified_p99_upper_ms": qualified,
                "qualified_run_id": cell.run_id if cell else None,
                "threshold_ms": threshold,
                "tolerance": settings.p99_tolerance,
                "confidence": settings.confidence,
                "example_hosts": _hosts(r for r in rows if r.model_digest == assigned),
            },
            "Compare the hosts' load, batch and image with the qualified run; re-qualify the "
            f"class (qualify run --host-class {name}) and regenerate the manifest, or roll the "
            f"class back to {entry.rollback.name if entry.rollback else 'the baseline'} if "
            "users are hurt.",
        )
        return state, alert, None
    if outcome == "pass":
        state["p99"] = "ok"
        return state, None, None
    state["p99"] = "insufficient_data"
    return (
        state,
        None,
        f"insufficient data: the observed p99 bounds ({lower} to {upper} ms) straddle the "
        f"threshold {threshold:.3g} ms",
    )


@dataclass(frozen=True)
class _Context:
    """What judging any one class reads besides that class's own rows."""

    cells: Sequence[Cell]
    aggregates: TelemetryAggregates
    settings: CheckSettings
    now: datetime
    version: int
    short: Mapping[str, str]  # digest -> artifact name, for messages


def _rows_by_class(rows: Iterable[ProfileRow]) -> dict[str, list[ProfileRow]]:
    by_class: dict[str, list[ProfileRow]] = defaultdict(list)
    for row in rows:
        by_class[row.host_class].append(row)
    return by_class


def _artifact_names(manifest: Manifest) -> dict[str, str]:
    """digest -> name of every artifact and rollback the manifest assigns."""
    short: dict[str, str] = {}
    for entry in manifest.signed.entries.values():
        for art in (entry.artifact, entry.rollback):
            if art is not None:
                short[art.digest] = art.name
    return short


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
    name: str,
    entry: ManifestEntry,
    cell: Cell | None,
    rows: Sequence[ProfileRow],
    ctx: _Context,
    p99_alert: Alert | None,
    p99_note: str | None,
) -> tuple[list[Alert], list[str]]:
    """Alerts and notes of a class that sent events: digest, placement, settings, p99 and
    runtime."""
    alerts: list[Alert] = []
    notes: list[str] = []
    digest_alert = _digest_alert(name, entry, rows, ctx.short, ctx.version)
    if digest_alert is not None:
        alerts.append(digest_alert)
    placement_alerts, placement_notes = _placement_alerts(name, entry, cell, rows)
    alerts.extend(placement_alerts)
    settings_alert = _settings_alert(name, entry, rows)
    if settings_alert is not None:
        alerts.append(settings_alert)
    notes.extend(placement_notes)
    if p99_alert is not None:
        alerts.append(p99_alert)
    if p99_note is not None:
        notes.append(p99_note)
    runtime_alert = _runtime_alert(name, entry.key.as_tuple(), ctx.cells, rows)
    if runtime_alert is not None:
        alerts.append(runtime_alert)
    return alerts, notes


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
    name: str, entry: ManifestEntry, rows: Sequence[ProfileRow], ctx: _Context
) -> tuple[list[Alert], ClassState]:
    """One class of the manifest: its alerts (sorted by kind) and its state."""
    profile = ctx.aggregates.profile
    events = profile.class_events.get(name, 0)
    cell = _qualified_cell(entry, ctx.cells)
    p99_state, p99_alert, p99_note = _p99(
        name, entry, cell, rows, ctx.aggregates.tails, ctx.settings
    )
    if events == 0:
        mine = [_no_data_alert(name, profile.start, ctx.now)]
        notes: list[str] = []
    else:
        mine, notes = _path_alerts(name, entry, cell, rows, ctx, p99_alert, p99_note)
    mine.sort(key=lambda a: a.kind)
    state = ClassState(
        host_class=name,
        state=_state_name(events, mine, p99_state["p99"]),
        decision=entry.decision,
        events=events,
        hosts=profile.class_hosts.get(name, 0),
        alerts=sorted(a.kind for a in mine),
        notes=notes,
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
    """Judge the window's telemetry against the manifest and the matrix, class by class.

    Pure: no clock, no database; ``aggregates`` comes from
    ``qualify.telemetry.gather_aggregates``.

    Args:
        manifest: The manifest hosts should be following.
        cells: Cells of the matrix (all of them: any run counts for the runtime revisions; the
            placement compared with is the cell the manifest's evidence cites, else the latest
            on the class's key for the assigned digest).
        aggregates: The window's profile and latency tails.
        now: The reference time (the window's end).
        settings: Tolerance, min_samples, confidence; defaults to ``CheckSettings()``.

    Returns:
        Alerts (sorted by class, kind) and one state per class: the manifest's classes plus any
        unknown class that sent events.
    """
    settings = settings or CheckSettings()
    profile = aggregates.profile
    version = manifest.signed.version
    rows_by_class = _rows_by_class(profile.rows)
    ctx = _Context(
        cells=cells,
        aggregates=aggregates,
        settings=settings,
        now=now,
        version=version,
        short=_artifact_names(manifest),
    )
    alerts: list[Alert] = []
    states: list[ClassState] = []
    for name in sorted(manifest.signed.entries):
        rows = rows_by_class.get(name, [])
        mine, state = _judge_class(name, manifest.signed.entries[name], rows, ctx)
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
        p99_tolerance=settings.p99_tolerance,
        min_samples=settings.min_samples,
        confidence=settings.confidence,
        events=sum(profile.class_events.values()),
        alerts=alerts,
        classes=states,
    )
