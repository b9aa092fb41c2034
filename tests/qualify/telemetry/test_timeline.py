"""Telemetry over several releases: each event judged against the version it reports, hosts
counted once by their latest event, lagging hosts reported (a warning only past the propagation
deadline), and another model line's events never judged. Real events through a real DuckDB
matrix and ``run_check``, as the CLI runs it."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from manifest.lookup import cohort_point
from qualify.telemetry.render import render_check
from schemas.telemetry import CheckSettings, TelemetryCheck
from tests.manifest.factories import digest_of
from tests.qualify.telemetry_story import (
    FP32,
    INT4,
    INT8,
    NOW,
    ROGUE,
    Pointer,
    Story,
    event,
)

H = timedelta(hours=1)
M = timedelta(minutes=1)


def kinds(check: TelemetryCheck) -> list[tuple[str, str, str]]:
    return [(a.host_class, a.kind, a.severity) for a in check.alerts if a.kind != "no_data"]


def lagging(check: TelemetryCheck, name: str) -> list[tuple[int, int, int, bool]]:
    state = next(s for s in check.classes if s.host_class == name)
    return [(g.version, g.newer_version, g.hosts, g.past_deadline) for g in state.lagging]


def two_releases(story: Story, *, second: timedelta) -> None:
    """v1 (a day ago): x86 runs fp32; v2 (``second`` ago): x86 runs int8. arm runs int8 in both."""
    story.publish(NOW - 24 * H, x86=Pointer(FP32, rollback=None), arm=Pointer(INT8))
    story.publish(NOW - second, x86=Pointer(INT8))
    story.events += [
        event(f"arm-{i}", "arm", NOW - 10 * M, version=2, digest=INT8) for i in range(3)
    ]


def test_hosts_still_on_the_older_version_are_lagging_not_running_an_unexpected_digest(
    tmp_path: Path,
) -> None:
    story = Story()
    two_releases(story, second=H)
    story.events += [
        event(f"x86-{i}", "x86", NOW - 2 * H, version=1, digest=FP32) for i in range(6)
    ] + [event(f"x86-{i}", "x86", NOW - 10 * M, version=2, digest=INT8) for i in range(2)]
    check = story.check(tmp_path)
    assert kinds(check) == []
    assert lagging(check, "x86") == [(1, 2, 4, False)]  # hosts 2..5, each counted once
    assert "4 host(s) still on v1: v2 changed what they run 1.0 h ago" in render_check(check)
    assert check.versions == [1, 2]


def test_a_host_lagging_past_the_propagation_deadline_is_a_warning(tmp_path: Path) -> None:
    story = Story()
    two_releases(story, second=8 * H)
    story.events += [event("x86-0", "x86", NOW - 10 * M, version=1, digest=FP32)]
    check = story.check(tmp_path / "a")
    assert kinds(check) == [("x86", "lagging", "warning")]
    [alert] = [a for a in check.alerts if a.kind == "lagging"]
    assert "1 host(s) of x86 still run what an older manifest gave them" in alert.message
    assert "past the 6h propagation deadline" in alert.message
    assert alert.evidence["groups"][0]["example_hosts"] == ["x86-0"]
    later = story.check(tmp_path / "b", CheckSettings(propagation_deadline="12h"))
    assert kinds(later) == [] and lagging(later, "x86") == [(1, 2, 1, False)]


def test_a_host_that_reports_the_current_version_and_runs_another_digest_is_critical(
    tmp_path: Path,
) -> None:
    story = Story()
    two_releases(story, second=H)
    story.events += [
        event("x86-0", "x86", NOW - 5 * M, version=2, digest=ROGUE),
        event("x86-1", "x86", NOW - 5 * M, version=2, digest=INT8),
    ]
    check = story.check(tmp_path)
    assert kinds(check) == [("x86", "unexpected_digest", "critical")]
    [alert] = check.alerts
    assert [(s["digest"], s["hosts"], s["versions"]) for s in alert.evidence["seen"]] == [
        (ROGUE, 1, [2])
    ]


def test_a_lagging_host_runs_what_its_own_version_assigned_or_it_is_critical(
    tmp_path: Path,
) -> None:
    story = Story()
    two_releases(story, second=H)
    # It says v1 (fp32) and runs int8: judged against what it reports, not what is current.
    story.events += [event("x86-0", "x86", NOW - 5 * M, version=1, digest=INT8)]
    check = story.check(tmp_path)
    assert kinds(check) == [("x86", "unexpected_digest", "critical")]
    assert "v1 assigns rec-fp32" in check.alerts[0].message


def test_hosts_are_counted_once_by_their_latest_event_over_three_releases(
    tmp_path: Path,
) -> None:
    story = Story()
    story.publish(NOW - 20 * H, x86=Pointer(FP32, rollback=None))
    story.publish(NOW - 10 * H, x86=Pointer(INT8))
    story.publish(NOW - 2 * H, x86=Pointer(INT4, rollback=INT8))
    for i in range(6):  # every host ran fp32 under v1, then most moved on
        story.events.append(event(f"x86-{i}", "x86", NOW - 19 * H, version=1, digest=FP32))
    for i in range(2, 6):
        story.events.append(event(f"x86-{i}", "x86", NOW - 9 * H, version=2, digest=INT8))
    for i in range(4, 6):
        story.events.append(event(f"x86-{i}", "x86", NOW - H, version=3, digest=INT4))
    check = story.check(tmp_path)
    # x86-0, 1 lag by two versions since v2 (10 h: past the deadline); 2, 3 by one since v3.
    assert lagging(check, "x86") == [(1, 2, 2, True), (2, 3, 2, False)]
    assert kinds(check) == [("x86", "lagging", "warning")]
    x86 = next(s for s in check.classes if s.host_class == "x86")
    assert x86.hosts == 6


def test_a_host_that_skipped_a_version_is_judged_against_the_one_it_reports(
    tmp_path: Path,
) -> None:
    story = Story()
    story.publish(NOW - 20 * H, x86=Pointer(FP32, rollback=None))
    story.publish(NOW - 10 * H, x86=Pointer(INT8))
    story.publish(NOW - 9 * H, x86=Pointer(INT4, rollback=INT8))
    story.events += [
        event("x86-0", "x86", NOW - 19 * H, version=1, digest=FP32),
        event("x86-0", "x86", NOW - H, version=3, digest=INT4),  # v2 never reached it
    ]
    check = story.check(tmp_path)
    assert kinds(check) == [] and lagging(check, "x86") == []


def test_events_without_a_version_are_judged_against_the_manifest_published_at_their_time(
    tmp_path: Path,
) -> None:
    story = Story()
    two_releases(story, second=3 * H)
    story.events += [
        event("x86-0", "x86", NOW - 4 * H, version=None, digest=FP32),  # v1 was current
        event("x86-1", "x86", NOW - 2 * H, version=None, digest=INT8),  # v2 was
        event("x86-2", "x86", NOW - 2 * H, version=None, digest=INT4),  # neither gave int4
    ]
    check = story.check(tmp_path)
    assert kinds(check) == [("x86", "unexpected_digest", "critical")]
    seen = check.alerts[0].evidence["seen"]
    assert [(s["digest"], s["example_hosts"], s["versions"]) for s in seen] == [
        (INT4, ["x86-2"], [2])
    ]
    assert lagging(check, "x86") == [(1, 2, 1, False)]  # x86-0, last heard under v1


def test_a_version_that_was_never_published_is_judged_by_the_events_time(tmp_path: Path) -> None:
    story = Story()
    two_releases(story, second=3 * H)
    story.events += [event("x86-0", "x86", NOW - H, version=9, digest=INT8)]
    check = story.check(tmp_path)
    assert kinds(check) == [] and lagging(check, "x86") == []


def test_a_rollout_cohort_is_judged_by_the_version_each_host_reports(tmp_path: Path) -> None:
    story = Story()
    rid = "x86-r1"
    story.publish(NOW - 20 * H, x86=Pointer(FP32, rollback=None))
    story.publish(NOW - 3 * H, x86=Pointer(FP32, rollback=None, rollout=(rid, 25, INT8)))
    story.publish(NOW - H, x86=Pointer(INT8))  # the rollout completed
    hosts = [f"x86-{i:03d}" for i in range(40)]
    canary = [h for h in hosts if cohort_point(rid, h) < 25]
    assert 0 < len(canary) < len(hosts)
    for host in hosts:
        side = "canary" if host in canary else "rest"
        digest = INT8 if host in canary else FP32
        story.events.append(
            event(host, "x86", NOW - 2 * H, version=2, digest=digest, cohort=(rid, side))
        )
    check = story.check(tmp_path)
    # The canary already runs what v3 gives it; the rest lag behind v3 (within the deadline).
    assert kinds(check) == []
    assert lagging(check, "x86") == [(2, 3, len(hosts) - len(canary), False)]


def test_a_class_on_hold_has_no_lagging_hosts(tmp_path: Path) -> None:
    story = Story()
    story.publish(NOW - 20 * H, x86=Pointer(INT8))
    story.publish(NOW - 10 * H, x86=Pointer(None, rollback=FP32))  # held: hosts keep it
    story.events += [event("x86-0", "x86", NOW - H, version=1, digest=INT8)]
    check = story.check(tmp_path)
    assert kinds(check) == [] and lagging(check, "x86") == []


# -- model lines ------------------------------------------------------------------------------


def test_events_of_another_model_line_are_skipped_counted_and_said(tmp_path: Path) -> None:
    story = Story()
    two_releases(story, second=3 * H)
    story.events += [event("x86-0", "x86", NOW - H, version=2, digest=INT8)]
    # The same host serves a second model under the same class name: a higher version, other
    # digests, a digest this line never had.
    story.events += [
        event("x86-0", "x86", NOW - 30 * M, version=17, digest=ROGUE, model="speech")
        for _ in range(4)
    ]
    check = story.check(tmp_path)
    assert kinds(check) == []
    assert [(s.model, s.events, s.hosts, s.example_digests) for s in check.skipped] == [
        ("speech", 4, 1, [ROGUE])
    ]
    assert next(s for s in check.classes if s.host_class == "x86").events == 1
    assert "skipped: 4 event(s) from 1 host(s) that name model line 'speech'" in render_check(check)


def test_an_event_without_a_model_is_this_lines_only_when_its_digest_is(tmp_path: Path) -> None:
    story = Story()
    two_releases(story, second=3 * H)
    story.events += [
        event("x86-0", "x86", NOW - H, version=2, digest=INT8, model=None),  # known: judged
        event("x86-1", "x86", NOW - H, version=2, digest=ROGUE, model=None),  # unknown: skipped
    ]
    check = story.check(tmp_path)
    assert kinds(check) == []
    assert [(s.model, s.events) for s in check.skipped] == [(None, 1)]
    assert "name no model line and run digests this line never had" in render_check(check)
    # The same digest, named as this line's, is what the check exists to catch.
    story.events.append(event("x86-2", "x86", NOW - H, version=2, digest=ROGUE))
    named = story.check(tmp_path / "again")
    assert kinds(named) == [("x86", "unexpected_digest", "critical")]


# -- rollout advance judges its cohort by the same rules ------------------------------------


def session(host: str, at_minute: int, digest: str, **extra: object) -> dict[str, object]:
    """A session event of a healthy x86 host (the qualified placement, 20 ms) under v2."""
    found = event(host, "x86", NOW - timedelta(minutes=at_minute), version=2, digest=digest)
    nodes = {"CPUExecutionProvider": 10}
    return {
        **found,
        "source": "session",
        "placement": "actual",
        "providers": sorted(nodes),
        "nodes_per_provider": nodes,
        "fallback_nodes": 0,
        "latency_ms": 20.0,
        **extra,
    }


def test_a_rollout_step_is_not_halted_by_another_model_lines_events(tmp_path: Path) -> None:
    from matrix.store import Store
    from qualify.release.publishing import PublishOptions
    from qualify.rollout import advance_rollout
    from tests.manifest.factories import GOLDEN

    rid = "x86-r1"
    story = Story()
    story.publish(NOW - 20 * H, x86=Pointer(FP32, rollback=None))
    story.publish(NOW - 2 * H, x86=Pointer(FP32, rollback=None, rollout=(rid, 30, INT8)))
    hosts = [f"x86-{i:03d}" for i in range(60)]
    canary = [h for h in hosts if cohort_point(rid, h) < 30]
    for i in range(3000):  # hosts too old to say their side: told apart by their digest
        host = hosts[i % len(hosts)]
        story.events.append(session(host, 1 + i % 50, INT8 if host in canary else FP32))
    # The same hosts serve a second model: its events name their own line, other digests, a
    # higher version, and come last.
    story.events += [
        event(h, "x86", NOW - 30 * timedelta(seconds=1), version=9, digest=ROGUE, model="speech")
        for h in canary
    ]
    db = story.matrix(tmp_path)
    with Store.open(db) as store:
        store.record_rollout(rid, "x86", "start", 2, 1, 30, "rec-int8", "t", "", NOW - 2 * H)
        options = PublishOptions(
            key_path=GOLDEN / "test.key",
            out=tmp_path / "manifest.json",
            now=NOW,
            expires_in=timedelta(days=30),
            who="t",
        )
        step, verdict = advance_rollout(store, "x86", options)
    assert verdict.problems == [] and step is not None, verdict.problems
    assert "advanced to 100%" in step.summary


def test_matrix_stale_reads_only_this_model_lines_runtimes(tmp_path: Path) -> None:
    from qualify.telemetry.watch import run_stale

    story = Story()
    two_releases(story, second=3 * H)
    other = event("x86-0", "x86", NOW - H, version=5, digest=ROGUE, model="speech")
    story.events.append({**other, "runtime_revision": "1.40.0"})
    db = story.matrix(tmp_path)
    project = story.simulated.project
    now_files = {
        s.label: digest_of(s.label)
        for s in [project.artifacts.baseline, *project.artifacts.candidates]
    }
    assert run_stale(db, project, now=NOW, digests=now_files) == []
    mine = event("x86-1", "x86", NOW - H, version=2, digest=INT8)
    story.events.append({**mine, "runtime_revision": "1.41.0"})
    items = run_stale(story.matrix(tmp_path / "again"), project, now=NOW, digests=now_files)
    assert [(i.host_class, i.runtime_revisions) for i in items] == [("x86", ["1.41.0"])]
