"""The gates a fresh cell is judged by (the runner's verdict), one behaviour per test."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from manifest.gates import GATES, assess, class_checks, gate_of, judge, judge_with
from schemas.cell import Cell, OpenLoopResult
from schemas.project import Budgets
from schemas.reasons import CELL_CODES, REASONS
from tests.manifest.factories import Fleet, class_spec, make_project


def candidate_cell(**measured: Any) -> tuple[Cell, Any]:
    project = make_project({"c": class_spec(0, p99_ms=80.0)})
    fleet = Fleet(project)
    fleet.qualify("c", **measured)
    return fleet.cells[-1], project.host_classes["c"]


def codes(cell: Cell, cls: Any) -> tuple[str, list[str]]:
    verdict, reasons = judge(cell, cls)
    return verdict, [r.code for r in reasons]


def test_cell_within_every_budget_passes() -> None:
    assert codes(*candidate_cell()) == ("pass", [])


def test_p99_lower_bound_above_budget_fails() -> None:
    verdict, why = codes(*candidate_cell(p99_ms=95, p99_upper_ms=99, p99_lower_ms=90))
    assert (verdict, why) == ("fail", ["p99_over_budget"])


def test_p99_bounds_straddling_the_budget_are_insufficient_not_a_pass() -> None:
    verdict, why = codes(*candidate_cell(p99_ms=79, p99_upper_ms=85, p99_lower_ms=70))
    assert (verdict, why) == ("insufficient", ["p99_insufficient"])


def test_too_few_samples_for_any_bound_are_insufficient() -> None:
    verdict, why = codes(*candidate_cell(p99_upper_ms=None, p99_lower_ms=None))
    assert (verdict, why) == ("insufficient", ["p99_insufficient"])


def test_fallback_beyond_the_allowance_fails_with_the_node_count() -> None:
    cell, cls = candidate_cell(fallback_nodes=3, expected_nodes=7)
    verdict, reasons = judge(cell, cls)
    assert verdict == "fail"
    (reason,) = [r for r in reasons if r.code == "provider_fallback"]
    assert reason.message.startswith("3 of 10 nodes ran on")


def test_expected_provider_with_no_node_fails_even_when_nothing_was_placed() -> None:
    verdict, why = codes(*candidate_cell(fallback_nodes=0, expected_nodes=0))
    assert verdict == "fail" and "expected_provider_missing" in why


def test_broken_parity_fails() -> None:
    verdict, why = codes(*candidate_cell(parity_passed=False))
    assert verdict == "fail" and "parity_failed" in why


@pytest.mark.parametrize(
    ("field", "code"), [("peak_rss_mb", "peak_rss_missing"), ("cold_init_ms", "cold_init_missing")]
)
def test_unmeasured_value_with_a_budget_is_not_a_pass(field: str, code: str) -> None:
    verdict, why = codes(*candidate_cell(**{field: None}))
    assert (verdict, why) == ("insufficient", [code])


@pytest.mark.parametrize(
    ("field", "code"),
    [("peak_rss_mb", "peak_rss_over_budget"), ("cold_init_ms", "cold_init_over_budget")],
)
def test_value_over_its_budget_fails(field: str, code: str) -> None:
    verdict, why = codes(*candidate_cell(**{field: 1e6}))
    assert (verdict, why) == ("fail", [code])


@given(
    upper=st.floats(0.1, 200),
    fallback=st.integers(0, 5),
    rss=st.floats(1, 1000),
    parity=st.booleans(),
)
def test_a_pass_means_every_gate_held(
    upper: float, fallback: int, rss: float, parity: bool
) -> None:
    cell, cls = candidate_cell(
        p99_upper_ms=upper,
        p99_lower_ms=upper / 2,
        p99_ms=upper * 0.75,
        fallback_nodes=fallback,
        peak_rss_mb=rss,
        parity_passed=parity,
    )
    verdict, _ = judge(cell, cls)
    if verdict == "pass":
        assert upper <= 80 and fallback == 0 and rss <= 512 and parity


def test_class_requesting_cuda_without_expected_fails_when_every_node_ran_on_the_cpu() -> None:
    cell, cpu_class = candidate_cell(fallback_nodes=0, expected_nodes=10)
    assert set(cell.placement.nodes_per_provider) == {"CPUExecutionProvider"}  # type: ignore[union-attr]
    cuda = cpu_class.provider.model_validate(
        {"execution_providers": ["CUDAExecutionProvider", "CPUExecutionProvider"]}
    )
    verdict, why = codes(cell, cpu_class.model_copy(update={"provider": cuda}))
    assert verdict == "fail"
    assert {"expected_provider_missing", "provider_fallback"} <= set(why)


def test_an_insufficient_p99_says_what_would_decide_it_and_which_setting_gives_it() -> None:
    cell, cls = candidate_cell(p99_ms=79, p99_upper_ms=85, p99_lower_ms=70)
    gate = cell.gate_latency
    assert gate is not None
    timed = gate.model_copy(update={"stopped": "time_cap", "duration_s": 10.0, "samples": 700})
    capped = gate.model_copy(update={"stopped": "max_samples", "samples": 700})
    for result, setting in ((timed, "set workload.time_cap_s to 48"), (capped, "max_samples")):
        _, reasons = judge(cell.model_copy(update={"latency": [result]}), cls)
        (reason,) = reasons
        assert reason.code == "p99_insufficient"
        assert "2800 samples" in reason.message or "2800 or more" in reason.message
        assert setting in reason.message
    _, reasons = judge(cell.model_copy(update={"latency": [timed]}), cls)
    assert "(70 samples/s)" in reasons[0].message and "would take 40 s" in reasons[0].message


def test_every_gate_reason_code_belongs_to_exactly_one_gate_and_has_a_meaning() -> None:
    owned = [code for gate in GATES for code in gate.codes]
    assert len(owned) == len(set(owned))
    assert set(owned) <= set(CELL_CODES)
    assert all(REASONS[code] for code in owned)
    assert len({gate.name for gate in GATES}) == len(GATES)


@pytest.mark.parametrize(
    "measured",
    [
        {},
        {"p99_ms": 95, "p99_upper_ms": 99, "p99_lower_ms": 90},
        {"p99_ms": 79, "p99_upper_ms": 85, "p99_lower_ms": 70},
        {"fallback_nodes": 3},
        {"fallback_nodes": 0, "expected_nodes": 0},
        {"parity_passed": False},
        {"peak_rss_mb": None},
        {"cold_init_ms": 1e6},
    ],
)
def test_judge_is_the_sum_of_the_gates_findings_and_each_reason_comes_from_its_own_gate(
    measured: dict[str, Any],
) -> None:
    cell, cls = candidate_cell(**measured)
    findings = assess(cell, cls)
    assert [gate.name for gate, _ in findings] == [gate.name for gate in GATES]
    for gate, finding in findings:
        assert {r.code for r in finding.reasons} <= set(gate.codes)
        assert (finding.reasons == ()) == (finding.outcome in ("pass", "off"))
    verdict, reasons = judge(cell, cls)
    outcomes = {f.outcome for _, f in findings}
    expected = (
        "fail" if "fail" in outcomes else "insufficient" if "undecided" in outcomes else "pass"
    )
    assert verdict == expected
    assert sorted(r.code for r in reasons) == sorted(
        r.code for _, f in findings if f.outcome in ("fail", "undecided") for r in f.reasons
    )


def test_a_skipped_gate_is_neither_applied_nor_reported() -> None:
    cell, cls = candidate_cell(parity_passed=False)
    assert "parity_failed" in codes(cell, cls)[1]
    verdict, reasons = judge(cell, cls, skip=("parity",))
    assert (verdict, reasons) == ("pass", [])
    assert "parity" not in [gate.name for gate, _ in assess(cell, cls, skip=("parity",))]


@pytest.mark.parametrize(
    ("floor", "verdict", "codes"),
    [(None, "pass", []), (1.0, "pass", []), (1e12, "fail", ["throughput_below_budget"])],
)
def test_min_throughput_gates_the_best_config_in_samples_per_second(
    floor: float | None, verdict: str, codes: list[str]
) -> None:
    cell, cls = candidate_cell()
    measured = [r.model_copy(update={"throughput_ips": 500.0}) for r in cell.latency]
    cell = cell.model_copy(update={"latency": measured})
    cls = cls.model_copy(
        update={"budgets": cls.budgets.model_copy(update={"min_throughput": floor})}
    )
    assert codes_of(judge(cell, cls)) == (verdict, codes)


def test_min_throughput_without_a_throughput_pass_is_not_a_pass() -> None:
    cell, cls = candidate_cell()
    cell = cell.model_copy(
        update={"latency": [r.model_copy(update={"throughput_ips": None}) for r in cell.latency]}
    )
    cls = cls.model_copy(update={"budgets": cls.budgets.model_copy(update={"min_throughput": 1.0})})
    assert codes_of(judge(cell, cls)) == ("insufficient", ["throughput_missing"])


def _with_rate(cls: Any, floor: float | None) -> Any:
    return cls.model_copy(
        update={"budgets": cls.budgets.model_copy(update={"min_rate_rps": floor})}
    )


def _searched(max_rate: float | None) -> OpenLoopResult:
    return OpenLoopResult(
        servers=1,
        budget_ms=5.0,
        closed_loop_rps=900.0,
        max_rate_rps=max_rate,
        probes=[],
        missing=None if max_rate is not None else "no probed rate met p99 <= 5 ms",
    )


@pytest.mark.parametrize(
    ("floor", "found", "verdict", "codes"),
    [
        (None, None, "pass", []),
        (400.0, 450.0, "pass", []),
        (500.0, 450.0, "fail", ["rate_below_budget"]),
        (1.0, None, "insufficient", ["rate_missing"]),
    ],
)
def test_min_rate_gates_the_highest_rate_the_open_loop_search_found(
    floor: float | None, found: float | None, verdict: str, codes: list[str]
) -> None:
    cell, cls = candidate_cell()
    cell = cell.model_copy(update={"open_loop": _searched(found)})
    assert codes_of(judge(cell, _with_rate(cls, floor))) == (verdict, codes)


def test_min_rate_without_a_search_is_not_a_pass_and_says_how_to_run_one() -> None:
    cell, cls = candidate_cell()
    verdict, reasons = judge(cell, _with_rate(cls, 10.0))
    assert (verdict, [r.code for r in reasons]) == ("insufficient", ["rate_missing"])
    assert "workload.open_loop" in reasons[0].message


def codes_of(judged: tuple[str, list[Any]]) -> tuple[str, list[str]]:
    return judged[0], [r.code for r in judged[1]]


def test_the_gate_config_of_a_one_config_cell_is_that_config_and_otherwise_the_highest_bound() -> (
    None
):
    cell, _ = candidate_cell()
    assert gate_of(cell) is cell.gate_latency is cell.latency[0]
    slower = cell.latency[0].model_copy(update={"p99_upper_ms": 60.0, "batch_size": 8})
    unbounded = cell.latency[0].model_copy(update={"p99_upper_ms": None, "batch_size": 4})
    for latency in ([cell.latency[0], slower], [slower, cell.latency[0]], [slower, unbounded]):
        several = cell.model_copy(update={"latency": latency})
        assert gate_of(several) is several.gate_latency
    assert gate_of(cell.model_copy(update={"latency": []})) is None


def test_with_no_bound_yet_the_gate_config_is_the_worst_case_not_the_first_tie() -> None:
    # An OCR model swept over widths: no config has a p99 bound yet (a missing bound counts as
    # the highest), so the gate and the evidence must name the slowest one, width 256.
    cell, _ = candidate_cell()
    narrow = cell.latency[0].model_copy(
        update={"p99_upper_ms": None, "p99_ms": 74.0, "dims": {"width": 128}}
    )
    wide = narrow.model_copy(update={"p99_ms": 352.0, "dims": {"width": 256}})
    for latency in ([narrow, wide], [wide, narrow]):
        several = cell.model_copy(update={"latency": latency})
        assert several.gate_latency is wide
        assert gate_of(several) is wide
    bounded = narrow.model_copy(update={"p99_upper_ms": 500.0, "p99_ms": 400.0})
    # A config with no bound still outranks one whose bound is known, however high.
    assert cell.model_copy(update={"latency": [bounded, wide]}).gate_latency is wide


def test_judge_skipping_gates_gives_what_assess_of_the_other_gates_gives() -> None:
    cell, cls = candidate_cell(
        p99_ms=79, p99_upper_ms=85, p99_lower_ms=70, fallback_nodes=3, parity_passed=False
    )
    for skip in ((), ("parity",), ("parity", "p99"), ("placement",)):
        findings = [finding for _, finding in assess(cell, cls, skip=skip)]
        fails = [r for f in findings if f.outcome == "fail" for r in f.reasons]
        unsure = [r for f in findings if f.outcome == "undecided" for r in f.reasons]
        verdict, reasons = judge(cell, cls, skip=skip)
        assert reasons == fails + unsure
        assert verdict == ("fail" if fails else "insufficient" if unsure else "pass")


@given(
    st.dictionaries(
        st.sampled_from(["CPUExecutionProvider", "CUDAExecutionProvider", "Azure", "x", ""]),
        st.integers(min_value=0, max_value=10**6),
    ),
    st.sampled_from(["CPUExecutionProvider", "CUDAExecutionProvider", "missing"]),
)
def test_fallback_counts_every_node_that_ran_off_the_expected_provider(
    nodes: dict[str, int], expected: str
) -> None:
    from schemas.rules import fallback_count

    assert fallback_count(nodes, expected) == sum(n for p, n in nodes.items() if p != expected)


BUDGETED = [gate for gate in GATES if gate.budget is not None]


@pytest.mark.parametrize("gate", BUDGETED, ids=[gate.name for gate in BUDGETED])
def test_a_gate_whose_budget_the_class_leaves_unset_is_off_on_every_cell(gate: Any) -> None:
    assert gate.budget in Budgets.model_fields
    measured: list[dict[str, Any]] = [
        {},
        {"peak_rss_mb": None, "cold_init_ms": None},
        {"peak_rss_mb": 1e6, "cold_init_ms": 1e6},
    ]
    for values in measured:
        cell, cls = candidate_cell(**values)
        unset = cls.model_copy(
            update={"budgets": cls.budgets.model_copy(update={gate.budget: None})}
        )
        assert gate.check(cell, unset).outcome == "off"
        assert gate.check not in class_checks(unset)
    # Set, it applies: a value the cell did not measure is not a pass.
    cell, cls = candidate_cell(peak_rss_mb=None, cold_init_ms=None)
    on = cls.model_copy(update={"budgets": cls.budgets.model_copy(update={gate.budget: 1.0})})
    assert gate.check(cell, on).outcome != "off" and gate.check in class_checks(on)


@given(
    unset=st.sets(st.sampled_from([gate.budget for gate in BUDGETED])),
    upper=st.floats(0.1, 200),
    fallback=st.integers(0, 5),
    expected_nodes=st.integers(0, 3),
    rss=st.none() | st.floats(1, 1000),
    cold=st.none() | st.floats(1, 3000),
    parity=st.booleans(),
    skip=st.sampled_from([(), ("parity",), ("parity", "p99")]),
)
def test_judging_by_a_classs_checks_gives_the_verdict_and_reasons_of_every_gate(
    unset: set[str],
    upper: float,
    fallback: int,
    expected_nodes: int,
    rss: float | None,
    cold: float | None,
    parity: bool,
    skip: tuple[str, ...],
) -> None:
    cell, cls = candidate_cell(
        p99_upper_ms=upper,
        p99_lower_ms=upper / 2,
        p99_ms=upper * 0.75,
        fallback_nodes=fallback,
        expected_nodes=expected_nodes,
        peak_rss_mb=rss,
        cold_init_ms=cold,
        parity_passed=parity,
    )
    budgets = {field: None for field in unset} | {
        field: 1.0 for gate in BUDGETED if (field := gate.budget) not in unset
    }
    cls = cls.model_copy(update={"budgets": cls.budgets.model_copy(update=budgets)})
    assert judge_with(cell, cls, class_checks(cls, skip=skip)) == judge(cell, cls, skip=skip)


def test_a_placement_judged_before_is_judged_again_under_another_allowance() -> None:
    # The placement gate remembers its failures by the counts, the expected provider and the
    # allowance: the same counts under another allowance are another finding.
    cell, cls = candidate_cell(fallback_nodes=3, expected_nodes=7)
    _, strict = judge(cell, cls)
    assert [r.message for r in strict] == [
        "3 of 10 nodes ran on AzureExecutionProvider, expected CPUExecutionProvider (allowance 0)"
    ]
    two = cls.model_copy(
        update={"provider": cls.provider.model_copy(update={"fallback_allowance": 2})}
    )
    assert [r.message for r in judge(cell, two)[1]] == [
        "3 of 10 nodes ran on AzureExecutionProvider, expected CPUExecutionProvider (allowance 2)"
    ]
    three = cls.model_copy(
        update={"provider": cls.provider.model_copy(update={"fallback_allowance": 3})}
    )
    assert judge(cell, three) == ("pass", [])
    assert judge(cell, cls) == ("fail", strict)
