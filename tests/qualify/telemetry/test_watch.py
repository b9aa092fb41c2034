"""The telemetry check and re-qualification list: one test per alert kind and state, over real
events ingested into a real DuckDB matrix, judged against a signed manifest of a simulated fleet."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from manifest import envelope
from matrix.samples import empty_samples
from matrix.store import Store
from matrix.telemetry.ingest import ingest_telemetry
from qualify.demo.telemetry import write_demo_telemetry
from qualify.errors import QualifyError
from qualify.release.generate import parse_duration
from qualify.telemetry.check import check_telemetry
from qualify.telemetry.render import render_check
from qualify.telemetry.staleness import stale_items
from qualify.telemetry.watch import gather_aggregates, load_current_manifest, run_check, run_stale
from schemas.cell import Cell, OffProviderNode, RunBundle
from schemas.manifest import Manifest
from schemas.project import Project
from schemas.telemetry import CheckSettings, TelemetryCheck
from tests.manifest.factories import (
    Fleet,
    class_spec,
    digest_of,
    fixed_key,
    make_project,
    signed_manifest,
)

NOW = datetime(2025, 6, 2, 12, 0, tzinfo=UTC)
MODEL = "ocr-rec"
"""The model line of ``tests.manifest.factories.make_project``."""
CANDIDATE = digest_of("rec-int8")
BASELINE = digest_of("rec-fp32")


def fleet() -> Fleet:
    """x86 runs the candidate (p99 upper bound 42 ms); gpu the candidate with 7 nodes allowed off
    CUDA; arm the candidate too. Every cell ran onnxruntime 1.32.0."""
    simulated = Fleet(
        make_project(
            {
                "x86": class_spec(1, match={"arch": "x86_64"}),
                "gpu": class_spec(
                    2,
                    expected="CUDAExecutionProvider",
                    package="onnxruntime-gpu",
                    fallback_allowance=10,
                    match={"arch": "x86_64", "accelerator": "CUDAExecutionProvider"},
                ),
                "arm": class_spec(3, match={"arch": "aarch64"}),
            }
        )
    )
    simulated.qualify("x86")
    simulated.qualify("gpu", fallback_nodes=7, expected_nodes=3)
    simulated.qualify("arm")
    return simulated


def manifest_of(simulated: Fleet, *, version: int = 3) -> Manifest:
    doc = signed_manifest(simulated, fixed_key(), version=version, created=NOW - timedelta(days=2))
    return Manifest.model_validate_json(json.dumps(doc))


def traffic(
    host_class: str,
    *,
    n: int = 1000,
    digest: str | None = CANDIDATE,
    nodes: dict[str, int] | None = None,
    expected: str = "CPUExecutionProvider",
    placement: str = "actual",
    providers: list[str] | None = None,
    latency: Sequence[float] | None = None,
    runtime: str = "1.32.0",
    hosts: int = 4,
    model: str | None = None,
) -> list[dict[str, Any]]:
    """Session events of one class within the last hour; healthy unless told otherwise (an
    event names its model line only when ``model`` is given, as old writers did not)."""
    counts = nodes if nodes is not None else {expected: 10}
    values = list(latency) if latency is not None else np.linspace(10, 30, n).tolist()
    events = []
    for i in range(n):
        actual = placement == "actual"
        events.append(
            {
                "format": "qualify-telemetry/1",
                "time": (NOW - timedelta(seconds=3 * (i + 1))).isoformat().replace("+00:00", "Z"),
                "source": "session",
                "host_id": f"{host_class}-{i % hosts:02d}",
                "host_class": host_class,
                "model_digest": digest,
                "runtime_revision": runtime,
                "providers": providers if providers is not None else sorted(counts),
                "placement": placement,
                "nodes_per_provider": counts if actual else None,
                "fallback_nodes": sum(c for p, c in counts.items() if p != expected)
                if actual
                else None,
                "latency_ms": values[i % len(values)],
                "manifest_version": 3,
                **({"model": model} if model is not None else {}),
            }
        )
    return events


def healthy(*, skip: Sequence[str] = ()) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    if "x86" not in skip:
        events += traffic("x86")
    if "gpu" not in skip:
        events += traffic(
            "gpu",
            nodes={"CUDAExecutionProvider": 3, "CPUExecutionProvider": 7},
            expected="CUDAExecutionProvider",
        )
    if "arm" not in skip:
        events += traffic("arm")
    return events


def judge(
    tmp_path: Path,
    events: list[dict[str, Any]],
    *,
    simulated: Fleet | None = None,
    settings: CheckSettings | None = None,
) -> TelemetryCheck:
    simulated = simulated or fleet()
    manifest = manifest_of(simulated)
    path = tmp_path / "telemetry.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    settings = settings or CheckSettings()
    with Store.open(tmp_path / "m.duckdb") as store:
        ingest_telemetry(store, [path], now=NOW)
        aggregates = gather_aggregates(
            store, manifest, start=NOW - parse_duration(settings.since), end=NOW, settings=settings
        )
    return check_telemetry(manifest, simulated.cells, aggregates, now=NOW, settings=settings)


def kinds(check: TelemetryCheck) -> list[tuple[str, str]]:
    return [(a.host_class, a.kind) for a in check.alerts]


def state(check: TelemetryCheck, name: str) -> str:
    return next(s.state for s in check.classes if s.host_class == name)


def test_healthy_traffic_from_every_class_raises_nothing(tmp_path: Path) -> None:
    check = judge(tmp_path, healthy())
    assert check.alerts == []
    assert check.ok
    assert [(s.host_class, s.state, s.p99) for s in check.classes] == [
        ("arm", "ok", "ok"),
        ("gpu", "ok", "ok"),
        ("x86", "ok", "ok"),
    ]
    x86 = next(s for s in check.classes if s.host_class == "x86")
    assert x86.qualified_p99_upper_ms == 42.0
    assert x86.observed_p99_upper_ms is not None and x86.observed_p99_upper_ms <= 42.0 * 1.2


def test_a_host_running_a_digest_the_manifest_does_not_assign_is_an_alert(
    tmp_path: Path,
) -> None:
    rogue = digest_of("rec-int4-experimental")
    # The event names the model line: a digest this line never had is still its own.
    check = judge(tmp_path, healthy() + traffic("x86", n=5, digest=rogue, hosts=1, model=MODEL))
    assert kinds(check) == [("x86", "unexpected_digest")]
    [alert] = check.alerts
    assert alert.severity == "critical"
    assert alert.evidence["assigned"] == CANDIDATE
    assert [s["digest"] for s in alert.evidence["seen"]] == [rogue]
    assert alert.evidence["seen"][0]["example_hosts"] == ["x86-00"]
    assert "resolve-artifact" in alert.suggested_action


def test_hosts_served_the_rollback_are_a_warning_that_says_why(tmp_path: Path) -> None:
    check = judge(tmp_path, healthy() + traffic("arm", n=5, digest=BASELINE, hosts=1))
    [alert] = check.alerts
    assert (alert.host_class, alert.kind, alert.severity) == ("arm", "unexpected_digest", "warning")
    assert alert.evidence["seen"][0]["is_rollback"] is True
    assert "rollback" in alert.suggested_action


def test_a_provider_change_without_a_digest_change_is_caught(tmp_path: Path) -> None:
    # After a driver update the CUDA provider no longer loads: the session registers only CPU.
    moved = traffic(
        "gpu",
        n=20,
        placement="registered",
        providers=["CPUExecutionProvider"],
        expected="CUDAExecutionProvider",
    )
    check = judge(tmp_path, healthy() + moved)
    assert kinds(check) == [("gpu", "provider_changed")]
    [alert] = check.alerts
    assert alert.evidence["digest"] == CANDIDATE
    assert alert.evidence["qualified_providers"] == [
        "CPUExecutionProvider",
        "CUDAExecutionProvider",
    ]
    assert alert.evidence["observed"][0]["providers"] == ["CPUExecutionProvider"]


def test_fallback_nodes_where_the_qualified_cell_had_none_are_caught(tmp_path: Path) -> None:
    moved = traffic("x86", n=30, nodes={"CPUExecutionProvider": 7, "OpenVINOExecutionProvider": 3})
    check = judge(tmp_path, healthy() + moved)
    assert kinds(check) == [("x86", "fallback_appeared"), ("x86", "provider_changed")]
    fallback = check.alerts[0]
    assert fallback.evidence["qualified_fallback_nodes"] == 0
    assert fallback.evidence["observed_max_fallback_nodes"] == 3


def test_more_fallback_on_the_same_providers_is_caught_alone(tmp_path: Path) -> None:
    worse = traffic(
        "gpu",
        n=30,
        nodes={"CUDAExecutionProvider": 1, "CPUExecutionProvider": 9},
        expected="CUDAExecutionProvider",
    )
    check = judge(tmp_path, healthy() + worse)
    assert kinds(check) == [("gpu", "fallback_appeared")]
    assert check.alerts[0].evidence["qualified_fallback_nodes"] == 7
    # The simulated cell, like one recorded before nodes were named, does not name them.
    assert check.alerts[0].evidence["qualified_off_provider_nodes"] is None


def test_fallback_evidence_names_the_nodes_the_qualified_cell_ran_off_the_provider(
    tmp_path: Path,
) -> None:
    simulated = fleet()
    named = [
        OffProviderNode(name=f"conv{i}", op_type="Conv", provider="CPUExecutionProvider")
        for i in range(7)
    ]
    simulated.cells = [
        c.model_copy(
            update={"placement": c.placement.model_copy(update={"off_provider_nodes": named})}
        )
        if c.host_class == "gpu" and c.placement is not None
        else c
        for c in simulated.cells
    ]
    worse = traffic(
        "gpu",
        n=30,
        nodes={"CUDAExecutionProvider": 1, "CPUExecutionProvider": 9},
        expected="CUDAExecutionProvider",
    )
    check = judge(tmp_path, healthy() + worse, simulated=simulated)
    [alert] = check.alerts
    assert alert.kind == "fallback_appeared"
    assert alert.evidence["qualified_off_provider_nodes"] == [n.model_dump() for n in named]


def test_a_p99_above_the_qualified_bound_with_enough_samples_is_a_regression(
    tmp_path: Path,
) -> None:
    slow = traffic("x86", n=2000, latency=np.linspace(100, 160, 2000).tolist())
    check = judge(tmp_path, healthy(skip=["x86"]) + slow)
    assert kinds(check) == [("x86", "p99_regression")]
    evidence = check.alerts[0].evidence
    assert evidence["samples"] == 2000
    assert evidence["threshold_ms"] == pytest.approx(42.0 * 1.2)
    assert evidence["observed_p99_lower_ms"] > evidence["threshold_ms"]
    x86 = next(s for s in check.classes if s.host_class == "x86")
    assert (x86.state, x86.p99) == ("alert", "regressed")
    assert x86.observed_p99_lower_ms <= x86.observed_p99_ms <= x86.observed_p99_upper_ms  # type: ignore[operator]


def test_too_few_samples_for_a_p99_is_insufficient_data_not_a_pass(tmp_path: Path) -> None:
    slow = traffic("x86", n=300, latency=[150.0])
    check = judge(tmp_path, healthy(skip=["x86"]) + slow)
    assert check.alerts == []
    x86 = next(s for s in check.classes if s.host_class == "x86")
    assert (x86.state, x86.p99, x86.latency_samples) == (
        "insufficient_data",
        "insufficient_data",
        300,
    )
    assert x86.observed_p99_ms is None
    assert any("insufficient data: 300" in note for note in x86.notes)
    assert "insufficient_data" in render_check(check)


def test_a_class_that_sends_nothing_is_no_data_never_a_pass(tmp_path: Path) -> None:
    check = judge(tmp_path, healthy(skip=["arm"]))
    assert kinds(check) == [("arm", "no_data")]
    assert state(check, "arm") == "no_data"
    assert not check.ok


def test_hosts_on_a_runtime_revision_never_qualified_are_flagged(tmp_path: Path) -> None:
    check = judge(tmp_path, healthy() + traffic("arm", n=3, runtime="1.33.0", hosts=1))
    assert kinds(check) == [("arm", "unqualified_runtime")]
    alert = check.alerts[0]
    assert alert.evidence["qualified_revisions"] == ["1.32.0"]
    assert alert.evidence["seen"][0]["runtime_revision"] == "1.33.0"


def test_a_class_the_manifest_does_not_know_is_reported(tmp_path: Path) -> None:
    check = judge(tmp_path, healthy() + traffic("mystery", n=2))
    assert kinds(check) == [("mystery", "unknown_class")]
    assert state(check, "mystery") == "alert"


def test_events_outside_the_window_do_not_count(tmp_path: Path) -> None:
    # 20 events per class in the last minute: too few for a p99, and nothing else counts.
    check = judge(tmp_path, healthy(), settings=CheckSettings(since="1m"))
    assert {s.state for s in check.classes} == {"insufficient_data"}
    assert check.events == 3 * 20


def test_the_check_json_carries_class_kind_evidence_and_action(tmp_path: Path) -> None:
    check = judge(tmp_path, healthy(skip=["arm"]))
    doc = json.loads(check.model_dump_json())
    assert doc["alerts"][0]["host_class"] == "arm"
    assert doc["alerts"][0]["kind"] == "no_data"
    assert {"severity", "message", "evidence", "suggested_action"} <= set(doc["alerts"][0])
    assert [c["state"] for c in doc["classes"]] == ["no_data", "ok", "ok"]


# -- re-qualification --------------------------------------------------------------------------


def files(project: Project) -> dict[str, str]:
    """The digests of the project's artifact files (the factories' fake digest of each label)."""
    specs = [project.artifacts.baseline, *project.artifacts.candidates]
    return {spec.label: digest_of(spec.label) for spec in specs}


def test_a_class_whose_settings_changed_lists_its_cells_to_rerun() -> None:
    simulated = fleet()
    changed = class_spec(1, match={"arch": "x86_64"})
    changed["provider"]["graph_optimization_level"] = "basic"
    project = make_project(
        {**{k: v.model_dump() for k, v in simulated.project.host_classes.items()}, "x86": changed}
    )
    items = stale_items(project, simulated.cells, {}, digests=files(project))
    assert [(i.host_class, i.reason, i.artifact_name) for i in items] == [
        ("x86", "settings_changed", "rec-fp32"),
        ("x86", "settings_changed", "rec-int8"),
    ]
    assert "qualify run --host-class x86" in items[0].message


def test_telemetry_on_an_unqualified_runtime_lists_the_class() -> None:
    simulated = fleet()
    items = stale_items(
        simulated.project,
        simulated.cells,
        {"arm": ["1.32.0", "1.33.1"]},
        digests=files(simulated.project),
    )
    assert [(i.host_class, i.reason, i.runtime_revisions) for i in items] == [
        ("arm", "runtime_unqualified", ["1.33.1"])
    ]


def test_an_unchanged_fleet_has_nothing_stale() -> None:
    simulated = fleet()
    found = stale_items(
        simulated.project, simulated.cells, {"x86": ["1.32.0"]}, digests=files(simulated.project)
    )
    assert found == []


# -- from the matrix file, as the CLI does -----------------------------------------------------


def write_matrix(db: Path, simulated: Fleet, manifest: Manifest) -> None:
    with Store.open(db) as store:
        for run_id, run in simulated.runs.items():
            cells: list[Cell] = [c for c in simulated.cells if c.run_id == run_id]
            store.write_run(RunBundle(run=run, cells=cells), empty_samples())
        store.save_manifest(
            manifest.signed.version,
            manifest.signed.release,
            NOW - timedelta(days=2),
            NOW + timedelta(days=28),
            envelope.encode_canonical(manifest.model_dump(mode="json")).decode(),
        )
        store.mark_published(manifest.signed.version)


def test_run_check_reads_the_manifest_stored_in_the_matrix(tmp_path: Path) -> None:
    simulated = fleet()
    db = tmp_path / "qualify.duckdb"
    write_matrix(db, simulated, manifest_of(simulated))
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in healthy(skip=["gpu"])))
    with Store.open(db) as store:
        ingest_telemetry(store, [path], now=NOW)
    check = run_check(db, now=NOW)
    assert check.manifest_version == 3
    assert kinds(check) == [("gpu", "no_data")]
    items = run_stale(db, simulated.project, now=NOW, digests=files(simulated.project))
    assert items == []


def test_without_any_manifest_the_check_says_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with (
        Store.open(tmp_path / "q.duckdb") as store,
        pytest.raises(QualifyError, match="--manifest"),
    ):
        load_current_manifest(store, None)


# -- the demo's traffic ------------------------------------------------------------------------


def demo_like_fleet() -> Fleet:
    cpu = {"arch": "x86_64"}
    simulated = Fleet(
        make_project(
            {
                "arm-r5": class_spec(1, match={"arch": "aarch64"}),
                "x86-v4": class_spec(2, match=cpu),
                "x86-v3-1t": class_spec(3, match=cpu),
                "gpu-t4": class_spec(
                    4,
                    expected="CUDAExecutionProvider",
                    package="onnxruntime-gpu",
                    match={"arch": "x86_64", "accelerator": "CUDAExecutionProvider"},
                ),
            }
        )
    )
    for name in ("arm-r5", "x86-v4", "x86-v3-1t"):
        simulated.qualify(name)
    simulated.qualify("gpu-t4", fallback_nodes=6, expected_nodes=0)  # baseline, CPU fallback
    return simulated


def test_the_demo_traffic_alerts_on_its_two_injected_problems_and_nothing_else(
    tmp_path: Path,
) -> None:
    simulated = demo_like_fleet()
    manifest = manifest_of(simulated)
    assert manifest.signed.entries["gpu-t4"].decision in {"baseline", "hold"}
    written = write_demo_telemetry(manifest, simulated.cells, tmp_path / "t.jsonl", seed=7, now=NOW)
    assert (written.provider_class, written.p99_class) == ("x86-v4", "x86-v3-1t")
    with Store.open(tmp_path / "m.duckdb") as store:
        report = ingest_telemetry(store, [written.path], now=NOW)
        aggregates = gather_aggregates(
            store, manifest, start=NOW - timedelta(hours=24), end=NOW, settings=CheckSettings()
        )
    assert report.bad_lines == 0 and report.events == written.events
    check = check_telemetry(manifest, simulated.cells, aggregates, now=NOW)
    assert kinds(check) == [
        ("x86-v3-1t", "p99_regression"),
        ("x86-v4", "fallback_appeared"),
        ("x86-v4", "provider_changed"),
    ]
    assert {s.host_class: s.state for s in check.classes} == {
        "arm-r5": "ok",
        "gpu-t4": "ok",
        "x86-v3-1t": "alert",
        "x86-v4": "alert",
    }


def test_the_demo_traffic_is_the_same_bytes_for_the_same_seed(tmp_path: Path) -> None:
    simulated = demo_like_fleet()
    manifest = manifest_of(simulated)
    a = write_demo_telemetry(manifest, simulated.cells, tmp_path / "a.jsonl", seed=3, now=NOW)
    b = write_demo_telemetry(manifest, simulated.cells, tmp_path / "b.jsonl", seed=3, now=NOW)
    assert a.path.read_bytes() == b.path.read_bytes()


def test_a_staged_rollouts_cohort_running_its_artifact_is_not_an_unexpected_digest(
    tmp_path: Path,
) -> None:
    from schemas.manifest import ManifestArtifact, Rollout

    simulated = fleet()
    manifest = manifest_of(simulated)
    canary = digest_of("rec-int4-canary")
    entries = dict(manifest.signed.entries)
    entries["x86"] = entries["x86"].model_copy(
        update={
            "rollout": Rollout(
                id="x86-r1",
                artifact=ManifestArtifact(name="int4", digest=canary, length=1, uri="https://x/y"),
                percent=5,
                step=1,
                steps=[5, 100],
            )
        }
    )
    manifest = manifest.model_copy(
        update={"signed": manifest.signed.model_copy(update={"entries": entries})}
    )
    path = tmp_path / "telemetry.jsonl"
    events = healthy() + traffic("x86", n=5, digest=canary, hosts=1)
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    settings = CheckSettings()
    with Store.open(tmp_path / "m.duckdb") as store:
        ingest_telemetry(store, [path], now=NOW)
        aggregates = gather_aggregates(
            store, manifest, start=NOW - parse_duration(settings.since), end=NOW, settings=settings
        )
    check = check_telemetry(manifest, simulated.cells, aggregates, now=NOW, settings=settings)
    assert kinds(check) == []


def sessions_events(
    tmp_path: Path, simulated: Fleet, host_class: str, *, intra_op_threads: int
) -> list[dict[str, Any]]:
    """Events a real onnxruntime session writes through record_session, handed the settings
    resolve-artifact answers for the class, with the session built by a host that used
    ``intra_op_threads`` threads."""
    import onnxruntime as ort

    from manifest.host_events import record_session
    from schemas.settings import qualified_settings
    from tests.models import build

    entry = manifest_of(simulated).signed.entries[host_class]
    answer_settings = qualified_settings(entry.provider.model_dump(mode="json"))
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    model = build("identity_mlp", tmp_path)
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    path = tmp_path / f"{host_class}-{intra_op_threads}.jsonl"
    for i in range(20):
        record_session(
            session,
            path=path,
            host_class=host_class,
            model_digest=CANDIDATE,
            manifest_version=3,
            expected_provider="CPUExecutionProvider",
            latency_ms=20.0,
            sample_rate=1.0,
            host=f"{host_class}-s{i % 2}",
            when=NOW - timedelta(minutes=1 + i),
            settings=answer_settings,
        )
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_host_running_the_artifact_with_other_settings_than_qualified_raises_an_alert(
    tmp_path: Path,
) -> None:
    simulated = fleet()
    same = sessions_events(tmp_path, simulated, "x86", intra_op_threads=0)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert judge(tmp_path / "a", healthy() + same, simulated=simulated).alerts == []
    other = sessions_events(tmp_path, simulated, "x86", intra_op_threads=3)
    check = judge(tmp_path / "b", healthy() + other, simulated=simulated)
    assert kinds(check) == [("x86", "settings_differ")]
    [alert] = check.alerts
    assert alert.severity == "critical"
    assert "intra_op_threads 3, qualified 0" in alert.message
    [seen] = alert.evidence["observed"]
    assert seen["hosts"] == 2
    assert seen["differences"] == ["intra_op_threads 3, qualified 0"]
    assert alert.evidence["qualified"]["intra_op_threads"] == "0"
