"""Rollouts persist: a halt, an abort, a pin and a hold stay in force through routine releases
until ``qualify rollout clear`` (or, for an abort, a new ``rollout start``); ``manifest
generate`` says which classes it kept and why, ``rollout status`` and the report list them; and
a rollout that completes leaves an entry with its own evidence and reasons, nothing stale."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from manifest import lookup, resolve
from matrix.store import Store
from tests.qualify.lab import CANDIDATE, Lab, make_lab
from tests.qualify.scripted import Script


def _healthy_canary(lab: Lab) -> None:
    """Telemetry of the rollout in progress: every host of its cohort runs the rollout's
    artifact on the CPU, at the latency it qualified with (ingested into the matrix)."""
    current = lab.published()
    assert current is not None
    version, signed = current
    rollout = signed["entries"]["here-cpu"]["rollout"]
    with Store.open(lab.db, read_only=True) as db:
        cell = next(c for c in db.latest_cells() if c.artifact_name == CANDIDATE)
    assert cell.placement is not None
    hosts = [
        f"h{k}"
        for k in range(100)
        if lookup.cohort_point(rollout["id"], f"h{k}") < rollout["percent"]
    ]
    now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    events = [
        {
            "format": "qualify-telemetry/1",
            "time": now,
            "source": "session",
            "host_id": hosts[i % len(hosts)],
            "host_class": "here-cpu",
            "model_digest": cell.artifact_digest,
            "runtime_revision": "1.32.0",
            "providers": sorted(cell.placement.nodes_per_provider),
            "placement": "actual",
            "nodes_per_provider": cell.placement.nodes_per_provider,
            "fallback_nodes": 0,
            "latency_ms": cell.latency[0].p50_ms,
            "manifest_version": version,
            "rollout": rollout["id"],
            "cohort": "canary",
        }
        for i in range(800)
    ]
    path = lab.root / f"telemetry-v{version}.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    lab.cli("telemetry", "ingest", str(path))


def _reasons(lab: Lab) -> list[str]:
    return [r["code"] for r in lab.entry()["reasons"]]


def test_a_halt_and_an_abort_stick_through_releases_until_cleared(tmp_path: Path) -> None:
    lab = make_lab(tmp_path / "lab")
    lab.cli("rollout", "start", "here-cpu", "--steps", "30,100")
    assert "halted: no_data" in lab.cli("rollout", "advance", "here-cpu", code=1)

    said = lab.cli("manifest", "generate", "--publish", "--release", "r2")
    assert "[kept: rollout here-cpu-" in said and "halted at 30% (no_data" in said
    assert lab.entry()["rollout"] is not None  # not jumped to 100% by a release
    assert "HALTED (no_data" in lab.cli("rollout", "status")

    lab.cli("rollout", "abort", "here-cpu", "--why", "provider change in the canary")
    for release in ("r3", "r4"):  # release after release: the abort stays
        said = lab.cli("manifest", "generate", "--publish", "--release", release)
        assert "[kept: rollout here-cpu-" in said and "aborted by" in said, said
        assert "until qualify rollout clear here-cpu or a new rollout start" in said
        assert (lab.entry()["decision"], _reasons(lab)) == ("baseline", ["rolled_back"])
    drafted = lab.cli("manifest", "generate", "--release", "r5")  # a draft says so too
    assert "[kept: rollout here-cpu-" in drafted
    assert "aborted (its hosts stay on the rollback)" in lab.cli("rollout", "status")
    lab.cli(
        "report",
        "--out",
        str(lab.root / "report.html"),
        "--project",
        str(lab.root / "qualify.yaml"),
    )
    page = (lab.root / "report.html").read_text()
    assert "In force until cleared" in page and "aborted: on its rollback" in page

    said = lab.cli("rollout", "clear", "here-cpu", "--why", "driver fixed")
    assert "abort of rollout here-cpu-" in said and "cleared" in said
    said = lab.cli("manifest", "generate", "--publish", "--release", "r6")
    assert "[kept:" not in said
    assert lab.entry()["decision"] == "candidate"  # the matrix decides the class again
    assert "no rollout, hold, pin or abort in force" in lab.cli("rollout", "status")


def test_a_new_start_lifts_an_abort(tmp_path: Path) -> None:
    lab = make_lab(tmp_path / "lab")
    lab.cli("rollout", "start", "here-cpu", "--steps", "30,100")
    lab.cli("rollout", "abort", "here-cpu", "--why", "canary")
    lab.cli("rollout", "start", "here-cpu", "--steps", "30,100")
    said = lab.cli("manifest", "generate", "--publish", "--release", "r3")
    assert "in progress at 30%]" in said and "aborted by" not in said
    assert "no rollout" not in lab.cli("rollout", "status")
    assert "aborted (its hosts" not in lab.cli("rollout", "status")


def test_a_completed_rollout_after_a_cleared_pin_carries_its_own_evidence(
    tmp_path: Path,
) -> None:
    """The demo's story for x86-v4: pinned back to the baseline, cleared, rolled out again to
    every host; the final entry must not say 'pinned' nor lack evidence."""
    lab = make_lab(tmp_path / "lab")
    lab.cli("rollout", "pin", "here-cpu", "--artifact", "identity_mlp", "--why", "driver")
    assert _reasons(lab) == ["pinned"]
    lab.cli("rollout", "clear", "here-cpu", "--why", "fixed")
    lab.cli("rollout", "start", "here-cpu", "--steps", "100")
    _healthy_canary(lab)
    said = lab.cli("rollout", "advance", "here-cpu")
    assert "completed: every host runs classifier" in said
    entry = lab.entry()
    assert entry["decision"] == "candidate" and entry["artifact"]["name"] == CANDIDATE
    assert "pinned" not in _reasons(lab) and _reasons(lab)[:2] == [
        "rollout_completed",
        "candidate_passed",
    ]
    assert entry["evidence"] is not None and entry["evidence"]["artifact_name"] == CANDIDATE
    assert entry["run_ids"] and entry["rollback"]["name"] == "identity_mlp"
    # and the next routine release agrees with it: nothing kept, the same decision
    said = lab.cli("manifest", "generate", "--publish", "--release", "r9")
    assert "[kept:" not in said
    assert lab.entry()["artifact"]["name"] == CANDIDATE
    assert lab.entry()["rollback"]["name"] == "identity_mlp"  # never its own artifact


def test_an_abort_after_a_cleared_pin_keeps_every_host_on_what_the_rest_ran(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The demo's story for x86-v3-1t: on the candidate, pinned back to the baseline (so the
    candidate becomes its rollback: never its own artifact), cleared, rolled out again, aborted.
    Every host, the canary's included, goes back to the baseline the rest ran, not to the
    candidate the rollback names, and releases keep it there."""
    lab = make_lab(tmp_path / "lab", first=Script())
    assert (lab.entry()["artifact"]["name"], lab.entry()["rollback"]["name"]) == (
        CANDIDATE,
        "identity_mlp",
    )
    lab.cli("rollout", "pin", "here-cpu", "--artifact", "identity_mlp", "--why", "p99 regressed")
    assert (lab.entry()["artifact"]["name"], lab.entry()["rollback"]["name"]) == (
        "identity_mlp",
        CANDIDATE,
    )
    lab.cli("rollout", "clear", "here-cpu", "--why", "fixed")
    lab.cli("rollout", "start", "here-cpu", "--steps", "25,100")
    rollout = lab.entry()["rollout"]
    canary = next(f"h{k}" for k in range(200) if lookup.cohort_point(rollout["id"], f"h{k}") < 25)
    said = lab.cli("rollout", "abort", "here-cpu", "--why", "provider change in the canary")
    assert "every host goes back to identity_mlp" in said
    entry = lab.entry()
    assert (entry["decision"], entry["artifact"]["name"], entry["rollback"]["name"]) == (
        "baseline",
        "identity_mlp",
        CANDIDATE,
    )
    argv = [
        "--manifest", str(lab.manifest), "--pubkey", str(lab.root / "k.pub"),
        "--host-class", "here-cpu", "--host-id", canary, "--runtime", "onnxruntime==1.32.0",
        "--providers", "CPUExecutionProvider", "--uri-schemes", "file", "--no-state", "--json",
    ]  # fmt: skip
    assert resolve.main(argv) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["artifact"]["digest"] == entry["artifact"]["digest"] and answer["cohort"] is None
    lab.cli("manifest", "generate", "--publish", "--release", "r-next")
    assert lab.entry()["artifact"]["name"] == "identity_mlp"
