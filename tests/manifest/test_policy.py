"""The decision rule, one gate per test, on a scripted in-memory fleet."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

import pytest

from manifest import policy, verdict
from manifest.build import build_manifest
from manifest.errors import PolicyError
from schemas.cell import Numerics, OutputParity
from schemas.manifest import ClassDecision, Manifest
from schemas.project import InputSpec, OutputTolerance, Parity, TaskTolerance
from tests.manifest.factories import (
    BASELINE,
    CLOCK,
    Fleet,
    artifact_refs,
    class_spec,
    digest_of,
    make_project,
)


def one_class(**spec: object) -> Fleet:
    return Fleet(make_project({"arm": class_spec(1, **spec)}))  # type: ignore[arg-type]


def codes(fleet: Fleet, name: str = "arm") -> set[str]:
    return {r.code for r in fleet.decide()[name].reasons}


def test_class_that_passes_every_gate_gets_the_candidate() -> None:
    fleet = one_class()
    run = fleet.qualify("arm")
    d = fleet.decide()["arm"]
    assert (d.decision, d.artifact_name, d.artifact_digest) == (
        "candidate",
        "rec-int8",
        digest_of("rec-int8"),
    )
    assert d.reasons[0].code == "candidate_passed"
    assert d.run_ids == [run]
    assert d.evidence is not None and d.evidence.p99_upper_us == 42000
    assert "arm gets candidate rec-int8" in d.summary


def test_class_that_falls_back_to_cpu_gets_baseline() -> None:
    fleet = one_class(expected="CUDAExecutionProvider")
    fleet.qualify("arm", fallback_nodes=3)
    d = fleet.decide()["arm"]
    assert (d.decision, d.artifact_name) == ("baseline", BASELINE)
    assert "provider_fallback" in {r.code for r in d.reasons}


def test_fallback_within_the_allowance_still_qualifies() -> None:
    fleet = one_class(expected="CUDAExecutionProvider", fallback_allowance=3)
    fleet.qualify("arm", fallback_nodes=3)
    assert fleet.decide()["arm"].decision == "candidate"


def test_class_whose_expected_provider_ran_no_node_is_held_when_the_baseline_fails_too() -> None:
    fleet = one_class(expected="CUDAExecutionProvider", fallback_allowance=100)
    fleet.qualify("arm", fallback_nodes=10, expected_nodes=0)
    assert fleet.decide()["arm"].decision == "hold"
    assert {"expected_provider_missing", "baseline_fails_gates", "hold"} <= codes(fleet)


def test_policy_can_ship_the_baseline_to_a_class_whose_baseline_fails_its_gates() -> None:
    fleet = one_class(expected="CUDAExecutionProvider", fallback_allowance=100)
    fleet.project = fleet.project.model_copy(
        update={"policy": fleet.project.policy.model_copy(update={"failing_baseline": "baseline"})}
    )
    fleet.qualify("arm", fallback_nodes=10, expected_nodes=0)
    assert fleet.decide()["arm"].decision == "baseline"
    assert "baseline_fails_gates" not in codes(fleet)


def test_class_whose_p99_upper_bound_exceeds_the_budget_gets_baseline() -> None:
    fleet = one_class(p99_ms=80.0)
    fleet.qualify("arm", p99_ms=85.0, p99_upper_ms=90.0, p99_lower_ms=82.0)
    assert fleet.decide()["arm"].decision == "baseline"
    assert "p99_over_budget" in codes(fleet)


def test_insufficient_p99_evidence_is_not_a_pass() -> None:
    fleet = one_class(p99_ms=80.0)
    fleet.qualify("arm", p99_ms=70.0, p99_upper_ms=None, p99_lower_ms=None)
    assert fleet.decide()["arm"].decision == "baseline"
    assert "p99_insufficient" in codes(fleet)


def test_budget_tightened_after_the_run_is_honoured() -> None:
    fleet = one_class(p99_ms=80.0)
    fleet.qualify("arm", p99_upper_ms=42.0)  # the runner said pass under 80 ms
    tighter = make_project({"arm": class_spec(1, p99_ms=41.0)})
    fleet.project = tighter
    # The scripted baseline misses the tightened budget too, so the class is held.
    assert fleet.decide()["arm"].decision == "hold"
    assert {"p99_insufficient", "baseline_fails_gates"} <= codes(fleet)


def test_class_whose_candidate_breaks_parity_gets_baseline() -> None:
    fleet = one_class()
    fleet.qualify("arm", parity_passed=False, verdict="fail")
    assert fleet.decide()["arm"].decision == "baseline"
    assert "parity_failed" in codes(fleet)
    # The runner's verdict is not consulted: the evidence is judged again under the project now.
    assert "verdict_not_pass" not in codes(fleet)


def test_parity_measured_against_another_baseline_is_not_evidence() -> None:
    fleet = one_class()
    fleet.qualify("arm", parity_reference=digest_of("some-other-fp32"))
    assert fleet.decide()["arm"].decision == "baseline"
    assert "parity_reference_mismatch" in codes(fleet)


def test_parity_that_fails_the_current_tolerance_gets_baseline() -> None:
    fleet = one_class()
    fleet.qualify("arm", cosine_min=0.95)  # int8 default tolerance needs >= 0.99
    assert fleet.decide()["arm"].decision == "baseline"
    assert "parity_failed" in codes(fleet)


def test_class_whose_candidate_uses_too_much_memory_gets_baseline() -> None:
    fleet = one_class(peak_rss_mb=512.0)
    fleet.qualify("arm", peak_rss_mb=600.0)
    assert fleet.decide()["arm"].decision == "baseline"
    assert "peak_rss_over_budget" in codes(fleet)


def test_unmeasured_memory_under_a_budget_is_not_a_pass() -> None:
    fleet = one_class(peak_rss_mb=512.0)
    fleet.qualify("arm", peak_rss_mb=None)
    assert fleet.decide()["arm"].decision == "baseline"
    assert "peak_rss_missing" in codes(fleet)


def test_class_whose_candidate_starts_too_slowly_gets_baseline() -> None:
    fleet = one_class(cold_init_ms=1500.0)
    fleet.qualify("arm", cold_init_ms=2000.0)
    assert fleet.decide()["arm"].decision == "baseline"
    assert "cold_init_over_budget" in codes(fleet)


def test_class_without_memory_or_init_budget_does_not_check_them() -> None:
    fleet = one_class(peak_rss_mb=None, cold_init_ms=None)
    fleet.qualify("arm", peak_rss_mb=None, cold_init_ms=None)
    assert fleet.decide()["arm"].decision == "candidate"


def test_a_previous_artifact_that_no_longer_loads_is_skipped_for_the_baseline() -> None:
    fleet = one_class()
    fleet.qualify("arm", rollback_loaded=False, rollback_digest=digest_of("old-int8"))
    previous = _previous_pointing_at(fleet, "old-int8")
    d = fleet.decide(previous=previous)["arm"]
    assert d.decision == "candidate"  # its rollback is the baseline, which loads
    assert (d.rollback_digest, d.rollback_proven) == (digest_of(BASELINE), True)


def test_a_previous_artifact_never_checked_is_not_a_rollback() -> None:
    fleet = one_class()
    fleet.qualify("arm", rollback_loaded=None, rollback_digest=digest_of("old-int8"))
    d = fleet.decide(previous=_previous_pointing_at(fleet, "old-int8"))["arm"]
    assert d.rollback_digest == digest_of(BASELINE) and d.rollback_proven


def test_a_rollback_that_does_not_load_blocks_the_candidate() -> None:
    fleet = one_class()
    # Only the candidate was measured now; the run's check of the baseline failed to load it.
    fleet.qualify("arm", rollback_loaded=False, baseline_verdict="error")
    d = fleet.decide()["arm"]
    assert d.decision != "candidate"
    assert "rollback_failed" in {r.code for r in d.reasons}


def test_stale_cell_gets_baseline_after_settings_change() -> None:
    fleet = one_class(version="1.31.*")
    fleet.qualify("arm")
    fleet.project = make_project({"arm": class_spec(1, version="1.32.*")})
    fleet.qualify("arm", candidate=None)  # the baseline re-ran under the new settings
    d = fleet.decide()["arm"]
    assert d.decision == "baseline"
    assert "stale" in {r.code for r in d.reasons}


def test_stale_evidence_only_falls_to_the_unknown_class_policy() -> None:
    fleet = one_class(version="1.31.*")
    fleet.qualify("arm")
    fleet.project = make_project({"arm": class_spec(1, version="1.32.*")}, unknown_class="hold")
    d = fleet.decide()["arm"]
    assert d.decision == "hold"
    assert {"stale", "baseline_unmeasured"} <= {r.code for r in d.reasons}


def _workload(fleet: Fleet, **changes: object) -> None:
    """Edit the fleet's project workload as a person edits the project file."""
    workload = fleet.project.workload.model_copy(update=changes)
    fleet.project = fleet.project.model_copy(update={"workload": workload})


def test_a_cell_measured_under_another_workload_is_stale_until_measured_again() -> None:
    fleet = one_class()
    fleet.qualify("arm")
    measured_under = fleet.project.workload.evidence_digest()
    fleet.cells = [c.model_copy(update={"workload_digest": measured_under}) for c in fleet.cells]
    assert fleet.decide()["arm"].decision == "candidate"
    # What is judged, not what is fed: the verdict re-applies them, the evidence still answers.
    _workload(fleet, soak_tolerance=0.5, soak_floor=0.3, warmup=7, time_cap_s=9.0)
    assert fleet.decide()["arm"].decision == "candidate"
    _workload(fleet, batch_sizes=[1, 8])  # what the cells timed is no longer what a run times
    d = fleet.decide()["arm"]
    assert d.decision == "hold"
    assert {"workload_changed", "baseline_unmeasured"} <= {r.code for r in d.reasons}
    [why] = [r.message for r in d.reasons if r.code == "workload_changed"][:1]
    assert "workload" in why and fleet.cells[-1].run_id in why
    fleet.qualify("arm")  # measured again (a cell of a qualify from before the digest was kept)
    assert fleet.decide()["arm"].decision == "candidate"


def test_emulated_cell_does_not_qualify_a_candidate() -> None:
    fleet = Fleet(make_project({"arm": class_spec(1)}, unknown_class="baseline"))
    fleet.qualify("arm", emulated=True)
    d = fleet.decide()["arm"]
    assert d.decision == "baseline"
    assert "emulated" in {r.code for r in d.reasons}


def test_emulated_cell_qualifies_when_the_policy_allows_it() -> None:
    fleet = Fleet(make_project({"arm": class_spec(1)}, allow_emulated=True))
    fleet.qualify("arm", emulated=True)
    assert fleet.decide()["arm"].decision == "candidate"


N1 = Numerics(source="emulated", arch="aarch64", cpu="neoverse-n1", qemu="7.2.22")


@pytest.mark.parametrize(
    ("allow", "decision", "code"),
    [
        (False, "baseline", "emulated_numerics"),
        ("parity", "candidate", None),
        (True, "candidate", None),
    ],
)
def test_parity_on_an_emulated_cpu_of_the_classs_isa_qualifies_only_where_the_policy_says(
    allow: bool | str, decision: str, code: str | None
) -> None:
    # Measured on a host of the class (latency, memory, init are its own); parity on QEMU.
    fleet = Fleet(
        make_project({"arm": class_spec(1)}, unknown_class="baseline", allow_emulated=allow)
    )
    fleet.qualify("arm", numerics=N1)
    d = fleet.decide()["arm"]
    assert d.decision == decision
    assert ("emulated_numerics" in {r.code for r in d.reasons}) == (code is not None)
    if decision == "candidate":
        assert d.evidence is not None and d.evidence.emulated_numerics is not None
        assert d.evidence.emulated_numerics.model_dump() == {
            "cpu": "neoverse-n1",
            "arch": "aarch64",
            "qemu": "7.2.22",
        }


def test_policy_parity_still_requires_latency_from_a_host_of_the_class() -> None:
    fleet = Fleet(
        make_project({"arm": class_spec(1)}, unknown_class="baseline", allow_emulated="parity")
    )
    fleet.qualify("arm", emulated=True, numerics=N1)
    d = fleet.decide()["arm"]
    assert d.decision == "baseline"
    assert {r.code for r in d.reasons} >= {"emulated"}
    assert "emulated_numerics" not in {r.code for r in d.reasons}


def test_evidence_of_numerics_computed_natively_has_no_emulated_numerics_member() -> None:
    fleet = Fleet(make_project({"arm": class_spec(1)}, allow_emulated=True))
    fleet.qualify("arm", numerics=Numerics(source="native", arch="aarch64"))
    d = fleet.decide()["arm"]
    assert d.evidence is not None and d.evidence.emulated_numerics is None
    assert "emulated_numerics" not in d.evidence.model_dump(mode="json")
    emulated = Fleet(make_project({"arm": class_spec(1)}, allow_emulated=True))
    emulated.qualify("arm", numerics=N1)
    signed = build_manifest(
        emulated.project,
        list(emulated.decide().values()),
        release="r1",
        version=1,
        created=CLOCK,
        expires=CLOCK + timedelta(days=30),
        snapshot="snap",
        artifacts=artifact_refs(emulated.project),
    )
    evidence = signed["entries"]["arm"]["evidence"]
    assert evidence["emulated_numerics"] == {
        "arch": "aarch64",
        "cpu": "neoverse-n1",
        "qemu": "7.2.22",
    }
    read = Manifest.model_validate({"signed": signed, "signatures": []})
    assert read.signed.entries["arm"].evidence is not None


def test_the_runners_verdict_is_judged_again_under_the_budgets_now() -> None:
    # Judged insufficient under a 40 ms budget its bounds straddled; the budget is 80 ms now.
    fleet = one_class()
    fleet.qualify("arm", verdict="insufficient")
    assert fleet.decide()["arm"].decision == "candidate"
    # Judged pass under 80 ms; the budget is 30 ms now, below its lower bound of 38 ms.
    tight = one_class(p99_ms=30.0)
    tight.qualify("arm", verdict="pass")
    d = tight.decide()["arm"]
    assert d.decision == "hold"  # the baseline (p99 >= 57 ms) fails the budget too
    assert "p99_over_budget" in {r.code for r in d.reasons}


def test_passing_cell_on_another_key_is_ignored() -> None:
    fleet = Fleet(make_project({"arm": class_spec(1), "x86": class_spec(2)}))
    fleet.qualify("x86")  # x86 passes
    fleet.qualify("arm", candidate=None)  # arm only measured its baseline
    fleet.qualify("arm", key_of="x86")  # an arm-named run, but on x86's key
    decisions = fleet.decide()
    assert decisions["x86"].decision == "candidate"
    assert decisions["arm"].decision == "baseline"
    assert "no_candidate_cell" in {r.code for r in decisions["arm"].reasons}


def test_unknown_class_is_held_by_default() -> None:
    fleet = Fleet(make_project({"arm": class_spec(1), "new": class_spec(2)}))
    fleet.qualify("arm")
    d = fleet.decide()["new"]
    assert (d.decision, d.artifact_digest, d.evidence) == ("hold", None, None)
    assert {r.code for r in d.reasons} == {"no_evidence", "hold"}
    assert d.rollback_digest == digest_of(BASELINE)


def test_unknown_class_gets_baseline_when_the_policy_says_so() -> None:
    fleet = Fleet(make_project({"new": class_spec(2)}, unknown_class="baseline"))
    d = fleet.decide()["new"]
    assert (d.decision, d.artifact_name) == ("baseline", BASELINE)


def test_baseline_that_cannot_run_on_the_class_holds_it() -> None:
    fleet = Fleet(make_project({"arm": class_spec(1)}, unknown_class="baseline"))
    fleet.qualify("arm", baseline_verdict="error", parity_passed=False, verdict="fail")
    d = fleet.decide()["arm"]
    assert d.decision == "hold"
    assert "baseline_failed" in {r.code for r in d.reasons}


def test_lowest_p99_upper_bound_wins_among_passing_candidates() -> None:
    project = make_project({"arm": class_spec(1)}, candidates=("fast-int8", "slow-int8"))
    fleet = Fleet(project)
    fleet.qualify("arm", candidate="slow-int8", p99_upper_ms=60.0)
    fleet.qualify("arm", candidate="fast-int8", p99_upper_ms=30.0)
    d = fleet.decide()["arm"]
    assert d.artifact_name == "fast-int8"
    assert "candidate_not_chosen" in {r.code for r in d.reasons}


def test_good_aggregate_never_overrides_a_failing_class() -> None:
    classes = {f"c{i}": class_spec(i) for i in range(10)}
    fleet = Fleet(make_project(classes))
    for i in range(9):
        fleet.qualify(f"c{i}", p99_upper_ms=10.0)
    fleet.qualify("c9", p99_ms=85.0, p99_upper_ms=200.0, p99_lower_ms=81.0)
    decisions = fleet.decide()
    assert [decisions[f"c{i}"].decision for i in range(9)] == ["candidate"] * 9
    assert decisions["c9"].decision == "baseline"


def test_latest_current_cell_decides() -> None:
    fleet = one_class()
    fleet.qualify("arm", fallback_nodes=0)
    fleet.clock = CLOCK + timedelta(days=1)
    fleet.qualify("arm", p99_ms=85.0, p99_upper_ms=200.0, p99_lower_ms=81.0)
    assert fleet.decide()["arm"].decision == "baseline"


def test_first_release_rolls_back_to_the_baseline() -> None:
    fleet = one_class()
    fleet.qualify("arm")
    d = fleet.decide()["arm"]
    assert (d.rollback_digest, d.rollback_name, d.rollback_proven) == (
        digest_of(BASELINE),
        BASELINE,
        True,
    )


def test_the_rollback_is_never_the_entrys_own_artifact() -> None:
    fleet = one_class()
    fleet.qualify("arm")
    first = _manifest(fleet, fleet.decide(), version=1)
    fleet.qualify("arm", rollback_digest=digest_of("rec-int8"))
    d = fleet.decide(previous=first)["arm"]
    assert d.artifact_digest == digest_of("rec-int8")  # the same candidate again
    assert (d.rollback_digest, d.rollback_proven) == (digest_of(BASELINE), True)


def test_rollback_over_five_releases_is_the_last_other_artifact_proven_to_load() -> None:
    """A story: int8, int8 again, pruned, then the baseline twice, the second time after a
    runtime upgrade that no older cell speaks for."""
    project = make_project({"arm": class_spec(1)}, candidates=("rec-int8", "rec-pruned"))
    fleet = Fleet(project)
    history: list[Manifest] = []

    def release() -> ClassDecision:
        previous = history[-1] if history else None
        d = fleet.decide(previous=previous)["arm"]
        history.append(_manifest(fleet, {"arm": d}, version=len(history) + 1, previous=previous))
        return d

    fleet.qualify("arm", candidate="rec-int8")
    d = release()  # r1: the first candidate rolls back to the baseline
    assert (d.artifact_name, d.rollback_name, d.rollback_proven) == ("rec-int8", BASELINE, True)
    d = release()  # r2: nothing new: never 'candidate int8; rollback int8'
    assert (d.artifact_name, d.rollback_name) == ("rec-int8", BASELINE)
    fleet.qualify("arm", candidate="rec-pruned", p99_upper_ms=30.0)
    d = release()  # r3: pruned wins; int8, assigned before and its cell still current, loads
    assert (d.artifact_name, d.rollback_name, d.rollback_proven) == ("rec-pruned", "rec-int8", True)
    fleet.qualify("arm", candidate="rec-pruned", parity_passed=False, verdict="fail")
    fleet.qualify("arm", candidate="rec-int8", parity_passed=False, verdict="fail")
    d = release()  # r4: both fail now: the baseline, and back to the one before (it loads)
    assert (d.decision, d.rollback_name, d.rollback_proven) == ("baseline", "rec-pruned", True)
    assert "no_rollback" not in {r.code for r in d.reasons}
    fleet.project = make_project(
        {"arm": class_spec(1, version="1.33.*")}, candidates=("rec-int8", "rec-pruned")
    )
    fleet.qualify("arm", candidate=None)  # only the baseline measured on the new runtime
    d = release()  # r5: nothing else proven to load on 1.33: nothing further to go back to
    assert (d.decision, d.rollback_digest) == ("baseline", None)
    assert "no_rollback" in {r.code for r in d.reasons}
    entry = history[-1].signed.entries["arm"]
    assert entry.rollback is None and "nothing further to go back to" in " ".join(
        r.message for r in entry.reasons
    )


def test_missing_baseline_digest_is_an_error_only_when_the_baseline_is_needed() -> None:
    project = make_project({"new": class_spec(1)}, unknown_class="hold")
    assert policy.decide(project, [], {})[0].decision == "hold"
    project = make_project({"new": class_spec(1)}, unknown_class="baseline")
    with pytest.raises(PolicyError, match="digest of artifact 'rec-fp32' is unknown"):
        policy.decide(project, [], {})


def test_digests_default_to_the_most_recent_cell_of_each_label() -> None:
    fleet = one_class()
    fleet.qualify("arm")
    found = policy.artifact_digests(fleet.project, fleet.cells)
    assert found == {BASELINE: digest_of(BASELINE), "rec-int8": digest_of("rec-int8")}
    decisions = policy.decide(fleet.project, fleet.cells, fleet.runs)
    assert decisions[0].decision == "candidate"


def _manifest(
    fleet: Fleet,
    decisions: Mapping[str, ClassDecision],
    *,
    version: int,
    previous: Manifest | None = None,
) -> Manifest:
    signed = build_manifest(
        fleet.project,
        list(decisions.values()),
        release=f"r{version}",
        version=version,
        created=CLOCK,
        expires=CLOCK + timedelta(days=30),
        snapshot="snap",
        artifacts=artifact_refs(fleet.project),
        previous=previous,
    )
    return Manifest.model_validate({"signed": signed, "signatures": []})


def _previous_pointing_at(fleet: Fleet, label: str) -> Manifest:
    """A previous manifest whose 'arm' entry approved ``label``."""
    decisions = Fleet(fleet.project).decide()
    base = _manifest(Fleet(fleet.project), decisions, version=1)
    data = base.model_dump(mode="json")
    data["signed"]["entries"]["arm"]["decision"] = "candidate"
    data["signed"]["entries"]["arm"]["artifact"] = {
        "name": label,
        "digest": digest_of(label),
        "length": 1,
        "uri": f"https://models.example/{label}.onnx",
    }
    return Manifest.model_validate(data)


def test_empty_placement_is_no_evidence_the_expected_provider_ran() -> None:
    fleet = one_class()
    fleet.qualify("arm", fallback_nodes=0, expected_nodes=0)
    assert fleet.decide()["arm"].decision == "hold"
    assert {"expected_provider_missing", "baseline_fails_gates"} <= codes(fleet)


def test_every_reason_code_a_decision_uses_is_documented() -> None:
    from schemas.cell import REASON_CODES
    from schemas.manifest import DECISION_REASON_CODES

    fleet = one_class(expected="CUDAExecutionProvider")
    fleet.qualify("arm", fallback_nodes=2, peak_rss_mb=None, cold_init_ms=9000.0, verdict="fail")
    used = codes(fleet)
    assert used <= set(DECISION_REASON_CODES) | set(REASON_CODES)


def test_a_busy_host_run_qualifies_unless_the_policy_refuses_it() -> None:
    fleet = one_class()
    run = fleet.qualify("arm")
    fleet.runs[run] = fleet.runs[run].model_copy(update={"host_busy": True})
    assert fleet.decide()["arm"].decision == "candidate"  # the default allows it
    policy = fleet.project.policy.model_copy(update={"busy_host": "refuse"})
    fleet.project = fleet.project.model_copy(update={"policy": policy})
    d = fleet.decide()["arm"]
    assert d.decision == "baseline"
    assert "host_busy" in {r.code for r in d.reasons}


def test_classes_sharing_runtime_and_provider_settings_share_one_digest_and_no_other() -> None:
    from manifest.verdict import Judge

    threads = class_spec(2)
    threads["provider"] |= {"intra_op_threads": 2}
    project = make_project({"a": class_spec(1), "b": class_spec(3), "c": threads})
    judge = Judge(project, {})
    for name, cls in project.host_classes.items():
        assert judge.settings(name) == cls.settings_digest()
    a, b, c = (judge.settings(name) for name in project.host_classes)
    assert a == b != c


def _output(values: tuple[float | None, ...], kept: tuple[float | None, ...]) -> OutputParity:
    """An output's parity with measured ``values`` and a ``min_passing`` of ``kept``."""
    fields = ("max_abs", "mean_abs", "max_rel", "cosine_min", "top1_agreement_min")
    measured = dict(zip(fields, values, strict=True))
    measured["top1_agreement"] = measured.pop("top1_agreement_min")
    return OutputParity(
        name="y",
        **measured,  # type: ignore[arg-type]
        tolerance=OutputTolerance(),
        passed=True,
        min_passing=OutputTolerance(**dict(zip(fields, kept, strict=True))),  # type: ignore[arg-type]
    )


def test_parity_is_judged_on_the_measured_values_whatever_min_passing_holds() -> None:
    values = (0.01, 0.001, 0.02, 0.9991, 1.0)
    as_the_runner_records_it = _output(values, values)
    assert verdict._measured(as_the_runner_records_it) is as_the_runner_records_it.min_passing
    for kept in ((0.01, None, None, 0.999, None), (0.0, 0.001, 0.02, 0.9991, 1.0)):
        other = _output(values, kept)
        assert verdict._measured(other) == OutputTolerance(
            max_abs=0.01, mean_abs=0.001, max_rel=0.02, cosine_min=0.9991, top1_agreement_min=1.0
        )


def test_parity_failures_of_equal_measurements_are_the_same_and_a_zeros_sign_is_kept() -> None:
    project = make_project({"arm": class_spec(1)})
    tolerances = verdict.Judge(project, {})
    failing = (0.5, 0.001, 0.02, 0.9, 0.8)
    first = tolerances._failures("int8", _output(failing, failing))
    again = tolerances._failures("int8", _output(failing, (0.01, None, None, 0.99, None)))
    assert first == again
    assert first == (
        "y max_abs 0.5 > 0.05",
        "y cosine_min 0.9 < 0.99",
        "y top1_agreement 0.8 < 0.98",
    )
    negative = tolerances._failures("int8", _output((0.01, None, None, -0.0, 1.0), (None,) * 5))
    positive = tolerances._failures("int8", _output((0.01, None, None, 0.0, 1.0), (None,) * 5))
    assert negative == ("y cosine_min -0 < 0.99",)
    assert positive == ("y cosine_min 0 < 0.99",)


def test_top1_measured_on_an_output_the_project_now_calls_a_state_is_not_held_against_it() -> None:
    """A cell measured before top-1 stopped applying to recurrent state: the current project
    feeds y back (state_from), so its top-1 agreement is no longer judged; after the project
    file says so, not before."""
    project = make_project({"arm": class_spec(1)})
    failing = (0.01, 0.001, 0.02, 0.999, 0.52)
    assert verdict.Judge(project, {})._failures("int8", _output(failing, failing)) == (
        "y top1_agreement 0.52 < 0.98",
    )
    workload = project.workload.model_copy(
        update={
            "inputs": {
                **project.workload.inputs,
                "h": InputSpec(
                    shape=[1, 1, 8], batch_axis=1, source="fixed", value=0, state_from="y"
                ),
            }
        }
    )
    edited = project.model_copy(update={"workload": workload})
    assert verdict.Judge(edited, {})._failures("int8", _output(failing, failing)) == ()


def test_task_level_tolerances_are_judged_first_under_the_current_project() -> None:
    project = make_project({"arm": class_spec(1)})
    text = "text: compared by exact match"
    skipped = dict.fromkeys(
        ("max_abs", "mean_abs", "max_rel", "cosine_min", "top1_agreement"), text
    )
    answer = _output((None,) * 5, (None,) * 5).model_copy(
        update={"name": "post.text", "exact_match": 0.84, "skipped": skipped}
    )
    # The family's tensor limits do not apply to text, and nothing asks for a task level yet.
    assert verdict.Judge(project, {})._failures("int8", answer) == ()
    stricter = project.model_copy(
        update={
            "parity": Parity(post={"text": TaskTolerance(exact_match_min=0.9)}),
        }
    )
    said = verdict.Judge(stricter, {})._failures("int8", answer)
    assert said[0] == "post.text exact_match 0.84 < 0.9"
