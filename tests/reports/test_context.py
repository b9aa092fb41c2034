"""The view model: honest numbers, staleness, emulation, charts drawn from real samples."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reports import ReportView, SignatureStatus, build_report
from reports.charts import CHART_POINTS
from reports.view import ClassView
from tests.reports.factories import (
    CANDIDATE,
    CLOCK,
    HOSTILE,
    VERSION,
    Fleet,
    scripted_fleet,
    synthetic_fleet,
)


def _class(view: ReportView, name: str) -> ClassView:
    return next(c for c in view.classes if c.name == name)


def _row(cls: ClassView, label: str) -> tuple[tuple[str, str], ...]:
    return next(r.values for r in cls.compare if r.label == label)


def _view(fleet: Fleet) -> ReportView:
    return build_report(
        fleet.project,
        fleet.cells,
        fleet.runs,
        fleet.samples,
        now=datetime(2025, 1, 1, tzinfo=UTC),
        tool_version="x",
    )


def _one_class(
    seed: int, candidate_p99: Callable[[float], float], samples: int
) -> tuple[Fleet, str, ReportView]:
    """One class, one run: a baseline and a candidate whose p99 is a function of the budget."""
    fleet = Fleet(project=synthetic_fleet(1).project, seed=seed)
    name = next(iter(fleet.project.host_classes))
    budget = fleet.project.host_classes[name].budgets.p99_ms
    fleet.qualify(name, candidate_p99_ms=candidate_p99(budget), samples=samples)
    view = _view(fleet)
    return fleet, name, view


def test_class_without_measurement_says_not_measured(golden_view: ReportView) -> None:
    new = _class(golden_view, "new-class")
    assert new.artifacts == ()
    assert new.chart is None
    row = next(r for r in golden_view.heatmap if r.host_class == "new-class")
    assert [c.verdict_text for c in row.cells] == ["not measured", "not measured"]


def test_crashed_candidate_shows_no_invented_numbers(golden_view: ReportView) -> None:
    hostile = _class(golden_view, HOSTILE)
    for label in ("p50", "p99", "p99 bound", "cold init", "peak memory", "nodes per provider"):
        assert _row(hostile, label)[1] == ("not measured", "muted"), label


def test_stale_and_emulated_cells_are_marked(golden_view: ReportView) -> None:
    hostile = _class(golden_view, HOSTILE)
    assert hostile.stale and hostile.emulated
    row = next(r for r in golden_view.heatmap if r.host_class == HOSTILE)
    assert all(c.stale and c.emulated for c in row.cells if c.verdict != "missing")
    arm = _class(golden_view, "arm-r5")
    assert not arm.stale and not arm.emulated


def test_fallback_is_highlighted(golden_view: ReportView) -> None:
    gpu = _class(golden_view, "gpu-t4")
    assert _row(gpu, "fallback")[1] == ("5 of 24 nodes", "bad")
    nodes = next(r for r in gpu.compare if r.label == "nodes per provider")
    candidate = nodes.parts[gpu.artifacts.index(CANDIDATE)]
    assert candidate == (("CUDA 19", False), ("CPU 5 (fallback)", True))
    assert nodes.parts[0] == (("CUDA 24", False),)
    assert (CANDIDATE, "5 nodes placed on CPUExecutionProvider", 1) in gpu.warnings


def test_fallback_names_the_nodes_that_ran_off_the_expected_provider() -> None:
    from schemas.cell import OffProviderNode

    fleet, _, _ = scripted_fleet()
    named = [
        OffProviderNode(name=f"layer{i}/Gelu", op_type="Gelu", provider="CPUExecutionProvider")
        for i in range(6)
    ]
    for index, cell in enumerate(fleet.cells):
        if cell.host_class == "gpu-t4" and cell.role == "candidate" and cell.placement:
            placement = cell.placement.model_copy(update={"off_provider_nodes": named[:5]})
            fleet.cells[index] = cell.model_copy(update={"placement": placement})
    text, tone = _row(_class(_view(fleet), "gpu-t4"), "fallback")[1]
    assert tone == "bad"
    assert text.startswith("5 of 24 nodes: layer0/Gelu (Gelu) on CPU, layer1/Gelu (Gelu) on CPU")
    assert "layer4/Gelu" in text and "more" not in text


def test_p99_over_budget_is_bad_and_within_is_ok(golden_view: ReportView) -> None:
    x86 = next(r for r in golden_view.heatmap if r.host_class == "x86-v4")
    assert [c.p99_tone for c in x86.cells] == ["ok", "bad"]
    assert "of 20.0 ms" in x86.cells[1].p99_text


def test_decisions_come_from_the_manifest(golden_view: ReportView) -> None:
    decisions = {r.host_class: r.decision for r in golden_view.heatmap}
    assert decisions == {
        "arm-r5": "candidate",
        "x86-v4": "baseline",
        "gpu-t4": "hold",
        HOSTILE: "hold",
        "new-class": "hold",
    }
    gpu = _class(golden_view, "gpu-t4")
    assert [r.code for r in gpu.reasons] == ["provider_fallback", "hold"]
    assert gpu.reasons[0].meaning  # the code's plain-words meaning


def test_chart_curve_comes_from_the_samples(golden_view: ReportView) -> None:
    fleet, _, _ = scripted_fleet()
    arm = _class(golden_view, "arm-r5")
    assert arm.chart is not None
    data = arm.chart.data
    assert data["points"] == CHART_POINTS
    assert data["nines_max"] == pytest.approx(3.0)  # 1,000 samples: up to the 99.9th
    for series in data["series"]:
        y = series["y"]
        assert y == sorted(y)  # a quantile function never goes down
        assert y[0] > 0
    cell = next(c for c in fleet.cells if c.host_class == "arm-r5" and c.role == "candidate")
    gate = cell.gate_latency
    assert gate is not None
    raw = fleet.samples[(cell.run_id, cell.artifact_digest)][gate.config]
    assert data["series"][1]["y"][0] == pytest.approx(raw.min() / 1e6, rel=5e-3)
    assert data["series"][1]["hi"] == pytest.approx(gate.p99_upper_ms, rel=5e-3)


def test_quantiles_beyond_a_series_sample_count_are_null() -> None:
    fleet, _, _ = scripted_fleet()
    cells = [c for c in fleet.cells if c.host_class == "arm-r5"]
    base = next(c for c in cells if c.role == "baseline")
    samples = dict(fleet.samples)
    gate = base.gate_latency
    assert gate is not None
    key = (base.run_id, base.artifact_digest)
    samples[key] = {gate.config: samples[key][gate.config][:100]}
    view = build_report(fleet.project, cells, fleet.runs, samples, now=CLOCK, tool_version=VERSION)
    chart = _class(view, "arm-r5").chart
    assert chart is not None
    y = chart.data["series"][0]["y"]
    grid = np.linspace(0, chart.data["nines_max"], CHART_POINTS)
    assert all((v is None) == (x > math.log10(100) + 1e-9) for v, x in zip(y, grid, strict=True))


def test_missing_samples_give_no_chart_but_a_note() -> None:
    fleet, _, _ = scripted_fleet()
    view = build_report(fleet.project, fleet.cells, fleet.runs, None, now=CLOCK, tool_version="x")
    arm = _class(view, "arm-r5")
    assert arm.chart is None
    assert "not in the matrix" in arm.chart_note


def test_cells_of_unknown_keys_are_counted_not_shown() -> None:
    fleet, _, _ = scripted_fleet()
    other = synthetic_fleet(1)
    view = build_report(
        fleet.project, fleet.cells + other.cells, fleet.runs, {}, now=CLOCK, tool_version="x"
    )
    assert any("2 cells were measured on keys" in n for n in view.notes)


@pytest.mark.parametrize(
    ("text", "state", "detail"),
    [
        ("verified", "verified", None),
        ("unsigned", "unsigned", None),
        ("invalid: bad signature by key 12ab", "invalid", "bad signature by key 12ab"),
    ],
)
def test_signature_status_parses_the_three_forms(text: str, state: str, detail: str | None) -> None:
    status = SignatureStatus.parse(text)
    assert (status.state, status.detail) == (state, detail)


def test_unknown_signature_status_is_refused() -> None:
    with pytest.raises(ValueError, match="expected 'verified'"):
        SignatureStatus.parse("probably fine")


def test_manifest_snapshot_other_than_the_matrix_is_said() -> None:
    fleet, current, _ = scripted_fleet()
    view = build_report(
        fleet.project,
        fleet.cells,
        fleet.runs,
        fleet.samples,
        now=CLOCK,
        tool_version=VERSION,
        snapshot="sha256:" + "f" * 64,
        manifest=current,
        signature_status="invalid: bad signature",
    )
    assert "matrix has changed since" in view.header.snapshot_note
    assert view.header.signature_tone == "bad"


@settings(max_examples=25, deadline=None)
@given(
    p99=st.floats(min_value=0.05, max_value=500.0),
    n=st.integers(min_value=1, max_value=3000),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_chart_values_stay_within_the_samples(p99: float, n: int, seed: int) -> None:
    fleet, _, view = _one_class(seed, lambda _budget: p99, n)
    chart = view.classes[0].chart
    assert chart is not None
    for series, cell in zip(chart.data["series"], fleet.cells, strict=True):
        gate = cell.gate_latency
        assert gate is not None
        raw = fleet.samples[(cell.run_id, cell.artifact_digest)][gate.config] / 1e6
        values = [v for v in series["y"] if v is not None]
        assert values, "the 0th percentile is always supported"
        # Three significant digits: within half a unit of the third digit of the samples.
        assert min(values) >= raw.min() * (1 - 5e-3)
        assert max(values) <= raw.max() * (1 + 5e-3)


def test_report_says_how_memory_and_placement_were_measured() -> None:
    fleet, current, previous = scripted_fleet()
    arm = [c for c in fleet.cells if c.host_class == "arm-r5"]
    assert arm and all(c.placement is not None and c.peak_rss_mb for c in arm)
    swapped = {
        id(c): c.model_copy(
            update={
                "peak_rss_source": "vmhwm",
                "placement": c.placement.model_copy(update={"source": "profiler"})  # type: ignore[union-attr]
                if c.role == "candidate"
                else c.placement,
            }
        )
        for c in arm
    }
    cells = [swapped.get(id(c), c) for c in fleet.cells]
    view = build_report(
        fleet.project, cells, fleet.runs, fleet.samples, now=CLOCK, tool_version=VERSION,
        snapshot=fleet.snapshot, manifest=current, signature_status="unsigned", previous=previous,
    )  # fmt: skip
    cls = _class(view, "arm-r5")
    memory = _row(cls, "peak memory")
    assert all(text.endswith(", by child's VmHWM") for text, _ in memory), memory
    nodes = next(r for r in cls.compare if r.label == "nodes per provider")
    candidate = nodes.parts[cls.artifacts.index(CANDIDATE)]
    baseline = nodes.parts[1 - cls.artifacts.index(CANDIDATE)]
    assert candidate[-1][0].startswith("counted from the profiler")
    assert not any(text.startswith("counted from") for text, _ in baseline)
    # The golden fleet records no source: nothing is claimed about how memory was measured.
    assert not any(", by " in t for t, _ in _row(_class(view, "x86-v4"), "peak memory"))


@settings(max_examples=30, deadline=None)
@given(
    ratio=st.floats(min_value=0.5, max_value=1.5),
    n=st.integers(min_value=50, max_value=2000),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_the_report_colours_a_p99_exactly_as_the_gate_judges_it(
    ratio: float, n: int, seed: int
) -> None:
    # One rule (schemas.rules.p99_outcome through manifest.gates): a p99 whose bounds straddle
    # the budget is undecided (warn) in the heatmap and the comparison, never failed or passed.
    from manifest.gates import assess

    fleet, name, view = _one_class(seed, lambda budget: budget * ratio, n)
    cls = fleet.project.host_classes[name]
    heat = next(r for r in view.heatmap if r.host_class == name)
    bounds = _row(_class(view, name), "p99 bound")
    tones = {"pass": "ok", "fail": "bad", "undecided": "warn"}
    for index, cell in enumerate(fleet.cells):
        outcome = dict((g.name, f.outcome) for g, f in assess(cell, cls))["p99"]
        gate = cell.gate_latency
        assert gate is not None
        if gate.p99_upper_ms is not None and gate.p99_lower_ms is not None:
            assert heat.cells[index].p99_tone == tones[outcome]
            assert bounds[index][1] == tones[outcome]


def test_a_pipeline_shows_end_to_end_inference_alone_and_stage_shares() -> None:
    fleet, name, _ = _one_class(3, lambda budget: budget / 2, 1000)
    for index, cell in enumerate(fleet.cells):
        gate = cell.gate_latency
        assert gate is not None
        staged = gate.model_copy(
            update={
                "inference_p50_ms": gate.p50_ms / 4,
                "inference_p99_ms": gate.p99_ms / 4,
                "stage_share": {"pre": 0.7, "inference": 0.25, "post": 0.05},
            }
        )
        fleet.cells[index] = cell.model_copy(update={"latency": [staged]})
    view = _view(fleet)
    cls = _class(view, name)
    labels = [r.label for r in cls.compare]
    assert "p50 end to end" in labels and "inference alone" in labels
    stages = _row(cls, "stages")
    assert stages[0] == ("pre 70%, inference 25%, post 5%", "warn")
    assert _row(cls, "inference alone")[0][0].startswith("p50 ")


def test_an_open_loop_search_shows_the_highest_rate_and_its_ceiling_or_why_there_is_none() -> None:
    from schemas.cell import OpenLoopResult, RateProbe

    fleet, name, plain = _one_class(4, lambda budget: budget / 2, 1000)
    assert "request rate" not in [r.label for r in _class(plain, name).compare]
    probe = RateProbe(
        rate_rps=450.0,
        arrivals=900,
        achieved_rps=449.0,
        p50_ms=1.1,
        p99_ms=3.2,
        service_p50_ms=1.0,
        met=True,
    )
    found = [
        OpenLoopResult(
            servers=1,
            budget_ms=5.0,
            closed_loop_rps=900.0,
            max_rate_rps=450.0,
            probes=[probe, probe.model_copy(update={"rate_rps": 675.0, "met": False})],
        ),
        OpenLoopResult(
            servers=1,
            budget_ms=5.0,
            closed_loop_rps=None,
            max_rate_rps=None,
            probes=[],
            missing="the worker ended during the search",
        ),
    ]
    for index, result in enumerate(found):
        fleet.cells[index] = fleet.cells[index].model_copy(update={"open_loop": result})
    row = _row(_class(_view(fleet), name), "request rate")
    assert row[0] == (
        "450 requests/s within p99 5 ms (of 900/s back to back; p99 3.20 ms at it, 2 rates probed)",
        "",
    )
    assert row[1] == ("no rate within p99 5 ms: the worker ended during the search", "muted")


def test_task_level_parity_is_shown_first_with_what_each_metric_was_taken_over() -> None:
    from schemas.cell import OutputParity, ParityResult
    from schemas.project import OutputTolerance, TaskTolerance

    fleet, name, _ = _one_class(3, lambda budget: budget * 0.5, 1000)
    index = next(i for i, c in enumerate(fleet.cells) if c.role == "candidate")
    cell = fleet.cells[index]
    assert cell.parity is not None
    text = OutputParity(
        name="post.text",
        max_abs=None,
        mean_abs=None,
        max_rel=None,
        cosine_min=None,
        top1_agreement=None,
        exact_match=0.84,
        task_tolerance=TaskTolerance(exact_match_min=0.95),
        samples=256,
        over="256 samples, one inference each; compared by exact match",
        skipped={"max_abs": "text: compared by exact match"},
        tolerance=OutputTolerance(),
        passed=False,
        failures=["exact_match 0.84 < 0.95"],
        min_passing=OutputTolerance(),
    )
    state = cell.parity.outputs[0].model_copy(
        update={"name": "h_out", "skipped": {"top1_agreement": "a recurrent state, fed back"}}
    )
    parity = ParityResult(
        reference_digest=cell.parity.reference_digest,
        samples=256,
        passed=False,
        outputs=[state, text],
    )
    fleet.cells[index] = cell.model_copy(update={"parity": parity})
    # Under a project that no longer asks for the exact match, the answer is not judged by it.
    unasked = _class(_view(fleet), name)
    assert not any(r.check == "exact match" for r in unasked.parity)
    # The project now asks for it (parity.post.text): the task-level row leads, and fails.
    asks = fleet.project.parity.model_copy(
        update={"post": {"text": TaskTolerance(exact_match_min=0.95)}}
    )
    fleet.project = fleet.project.model_copy(update={"parity": asks})
    cls = _class(_view(fleet), name)
    first = cls.parity[0]
    assert (first.output, first.check, first.measured, first.tolerance, first.tone) == (
        "post.text",
        "exact match",
        "0.84",
        "≥ 0.95",
        "bad",
    )
    checks = [(r.output, r.check) for r in cls.parity]
    assert ("h_out", "not applied: top1 agreement") in checks
    assert ("post.text", "measured over") in checks
    assert _row(cls, "parity")[1][0] == "parity fail (post.text exact match 0.84)"


def test_parity_on_an_emulated_cpu_is_marked_and_this_hosts_figure_shown_beside() -> None:
    from schemas.cell import Numerics

    fleet, name, _ = _one_class(5, lambda budget: budget / 2, 1000)
    n1 = Numerics(source="emulated", arch="aarch64", cpu="neoverse-n1", qemu="7.2.22")
    for index, cell in enumerate(fleet.cells):
        here = {o.name: 0.004 for o in cell.parity.outputs} if cell.parity else None
        fleet.cells[index] = cell.model_copy(
            update={"numerics": n1.model_copy(update={"native_max_abs": here})}
        )
    cls = _class(_view(fleet), name)
    measured = _row(cls, "measured")
    assert all(
        value == ("numerics of this ISA, emulated on neoverse-n1 (QEMU 7.2.22)", "warn")
        for value in measured
    )
    beside = [p for p in cls.parity if p.check.startswith("max |a-b| on the measuring host")]
    assert beside and all(p.measured == "0.004" and p.tolerance == "not judged" for p in beside)
    assert "not neoverse-n1" in beside[0].check
