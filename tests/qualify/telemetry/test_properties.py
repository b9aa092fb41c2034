"""A property of the telemetry check over time: random event histories over random manifest
histories (versions, hold, rollbacks, rollout cohorts, hosts that lag or skip a version, events
without a version, events of another model line) agree with a small oracle of the rule, written
from docs/telemetry.md straight over the raw events. The check runs as the CLI runs it: events
ingested into a real DuckDB matrix, every version stored and published there."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from manifest.lookup import cohort_point
from schemas.telemetry import TelemetryCheck
from tests.qualify.telemetry_story import (
    FP32,
    INT4,
    INT8,
    MODEL,
    NOW,
    ROGUE,
    Pointer,
    Story,
    event,
)

DEADLINE = timedelta(hours=6)
CLASSES = ("arm", "x86")
HOSTS = [f"h{i}" for i in range(6)]
DIGESTS = (FP32, INT8, INT4, ROGUE, None)


@dataclass(frozen=True)
class Raw:
    host: str
    host_class: str
    at: datetime
    version: int | None
    digest: str | None
    model: str | None


def pointers() -> st.SearchStrategy[Pointer]:
    rollout = st.one_of(
        st.none(),
        st.tuples(
            st.sampled_from(["r1", "r2"]), st.integers(1, 100), st.sampled_from([INT8, INT4])
        ),
    )
    return st.builds(
        Pointer,
        artifact=st.sampled_from([FP32, INT8, INT4, None]),
        rollback=st.sampled_from([FP32, INT8, None]),
        rollout=rollout,
    )


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[tuple[datetime, dict[str, Pointer]]], list[Raw]]:
    count = draw(st.integers(1, 4))
    ages = sorted(draw(st.lists(st.integers(1, 30), min_size=count, max_size=count)), reverse=True)
    releases = [
        (NOW - timedelta(hours=age), {c: draw(pointers()) for c in CLASSES}) for age in ages
    ]
    events = draw(
        st.lists(
            st.builds(
                Raw,
                host=st.sampled_from(HOSTS),
                host_class=st.sampled_from(CLASSES),
                at=st.integers(1, 23 * 60).map(lambda m: NOW - timedelta(minutes=m)),
                version=st.one_of(st.none(), st.integers(1, count + 1)),
                digest=st.sampled_from(DIGESTS),
                model=st.sampled_from([MODEL, MODEL, MODEL, None, "speech"]),
            ),
            min_size=1,
            max_size=25,
        )
    )
    return releases, events


# -- the oracle -------------------------------------------------------------------------------


def _gives(pointer: Pointer, host: str) -> str | None:
    """What a version's entry gives one host; None: nothing new (hold)."""
    if pointer.artifact is None:
        return None
    if pointer.rollout is not None:
        rid, percent, digest = pointer.rollout
        if cohort_point(rid, host) < percent:
            return digest
    return pointer.artifact


def oracle(
    releases: list[tuple[datetime, dict[str, Pointer]]], events: list[Raw]
) -> dict[str, Any]:
    versions = {i + 1: r for i, r in enumerate(releases)}
    current = len(releases)
    known = {FP32, INT8}  # the digests of the fleet's cells (int4 has none)
    for _, entries in releases:
        for p in entries.values():
            known |= {d for d in (p.artifact, p.rollback) if d}
            known |= {p.rollout[2]} if p.rollout else set()
    mine = [
        (i, e)
        for i, e in enumerate(events)
        if e.model == MODEL or (e.model is None and (e.digest is None or e.digest in known))
    ]
    latest: dict[str, tuple[int, Raw]] = {}
    for i, e in mine:
        if e.host not in latest or (e.at, i) >= (latest[e.host][1].at, latest[e.host][0]):
            latest[e.host] = (i, e)
    verdicts: dict[str, Counter[str]] = {c: Counter() for c in CLASSES}
    lags: dict[str, Counter[tuple[int, int, bool]]] = {c: Counter() for c in CLASSES}
    for _, e in latest.values():
        if e.version in versions:
            v = e.version
        else:
            at_time = [n for n, (t, _) in versions.items() if t <= e.at]
            v = max(at_time) if at_time else min(versions)
        p = versions[v][1][e.host_class]
        if e.digest is not None:
            allowed = {p.artifact} | ({p.rollout[2]} if p.rollout else set())
            if p.artifact is None:  # on hold: the rollback (and a stopped rollout's artifact)
                allowed = {p.rollback} | ({p.rollout[2]} if p.rollout else set())
            if e.digest in allowed:
                pass
            elif e.digest == p.rollback:
                verdicts[e.host_class]["rollback"] += 1
            else:
                verdicts[e.host_class]["unexpected"] += 1
        cur = _gives(versions[current][1][e.host_class], e.host)
        then = _gives(p, e.host)
        if v < current and cur is not None and cur != then:
            newer = next(
                n
                for n in range(v + 1, current + 1)
                if _gives(versions[n][1][e.host_class], e.host) != then
            )
            since = versions[newer][0]
            lags[e.host_class][(v, newer, NOW - since > DEADLINE)] += 1
    skipped = len(events) - len(mine)
    return {"verdicts": verdicts, "lags": lags, "skipped": skipped}


def observed(check: TelemetryCheck) -> dict[str, Any]:
    verdicts: dict[str, Counter[str]] = {c: Counter() for c in CLASSES}
    lags: dict[str, Counter[tuple[int, int, bool]]] = {c: Counter() for c in CLASSES}
    for alert in check.alerts:
        if alert.kind == "unexpected_digest":
            for seen in alert.evidence["seen"]:
                verdicts[alert.host_class]["rollback" if seen["is_rollback"] else "unexpected"] += (
                    seen["hosts"]
                )
    for state in check.classes:
        for g in state.lagging:
            lags[state.host_class][(g.version, g.newer_version, g.past_deadline)] += g.hosts
    return {
        "verdicts": verdicts,
        "lags": lags,
        "skipped": sum(s.events for s in check.skipped),
    }


@pytest.mark.slow  # each example ingests into and checks a fresh matrix: ~0.7 s
@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(history=histories())
def test_the_check_agrees_with_the_oracle_of_the_time_rule(
    tmp_path_factory: Any, history: tuple[list[tuple[datetime, dict[str, Pointer]]], list[Raw]]
) -> None:
    releases, raw = history
    story = Story()
    for created, entries in releases:
        story.publish(created, **entries)
    story.events = [
        event(e.host, e.host_class, e.at, version=e.version, digest=e.digest, model=e.model)
        for e in raw
    ]
    check = story.check(Path(tmp_path_factory.mktemp("story")))
    expected = oracle(releases, raw)
    assert observed(check) == expected
    kinds = {(a.host_class, a.kind, a.severity) for a in check.alerts}
    for name in CLASSES:
        late = any(past for (_, _, past) in expected["lags"][name])
        assert ((name, "lagging", "warning") in kinds) == late
        v = expected["verdicts"][name]
        severity = "critical" if v["unexpected"] else "warning" if v["rollback"] else None
        found = {s for (c, k, s) in kinds if c == name and k == "unexpected_digest"}
        assert found == ({severity} if severity else set())
