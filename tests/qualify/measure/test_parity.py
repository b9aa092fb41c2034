"""Baseline vs candidate output parity (qualify.measure.parity)."""

from __future__ import annotations

import json

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from qualify.measure import parity
from qualify.measure.parity import REL_EPS, compare_outputs
from schemas.cell import ParityResult
from schemas.project import (
    DEFAULT_TOLERANCES,
    InputSpec,
    OutputSpec,
    OutputTolerance,
    TaskTolerance,
    Tolerance,
    Workload,
)
from schemas.tolerance import resolve_tolerance

DIGEST = "sha256:" + "ab" * 32
Arrays = dict[str, npt.NDArray[np.generic]]


def scores(seed: int = 0, rows: int = 64, classes: int = 10) -> npt.NDArray[np.float64]:
    return np.random.default_rng(seed).normal(size=(rows, classes))


def test_identical_outputs_pass_with_zero_differences() -> None:
    ref: Arrays = {"logits": scores(), "embedding": scores(1, classes=1)}
    result = compare_outputs(ref, dict(ref), DEFAULT_TOLERANCES["fp32"], reference_digest=DIGEST)
    assert result.passed
    assert result.samples == 64
    assert [o.name for o in result.outputs] == ["logits", "embedding"]
    logits = result.outputs[0]
    assert (logits.max_abs, logits.mean_abs, logits.max_rel) == (0.0, 0.0, 0.0)
    assert logits.cosine_min == pytest.approx(1.0)
    assert logits.top1_agreement == 1.0
    assert logits.failures == []
    assert logits.min_passing.max_abs == 0.0


def test_perturbed_output_fails_with_a_sentence_naming_metric_value_and_limit() -> None:
    ref = np.ones((4, 8))
    cand = ref.copy()
    cand[2, 3] += 0.081
    result = compare_outputs(
        {"y": ref}, {"y": cand}, Tolerance(max_abs=0.05), reference_digest=DIGEST
    )
    assert not result.passed
    assert result.outputs[0].failures == ["max_abs 0.081 > 0.05"]
    assert result.outputs[0].max_abs == pytest.approx(0.081)


def test_failure_sentence_never_prints_measured_and_limit_the_same() -> None:
    ref = np.zeros((1, 2))
    cand = np.array([[0.0500001, 0.0]])
    result = compare_outputs(
        {"y": ref}, {"y": cand}, Tolerance(max_abs=0.05), reference_digest=DIGEST
    )
    assert result.outputs[0].failures == ["max_abs 0.0500001 > 0.05"]


def test_low_cosine_and_top1_disagreement_are_reported_as_below_their_minimum() -> None:
    ref = np.array([[1.0, 0.0], [0.0, 1.0]])
    cand = np.array([[0.0, 1.0], [0.0, 1.0]])
    result = compare_outputs(
        {"p": ref},
        {"p": cand},
        Tolerance(cosine_min=0.99, top1_agreement_min=0.98),
        reference_digest=DIGEST,
    )
    out = result.outputs[0]
    assert out.cosine_min == 0.0
    assert out.top1_agreement == 0.5
    assert out.failures == ["cosine_min 0 < 0.99", "top1_agreement 0.5 < 0.98"]


def test_per_output_override_wins_field_by_field_over_the_family_level() -> None:
    ref = np.ones((4, 8))
    cand = ref + 0.081
    tol = Tolerance(max_abs=0.05, mean_abs=0.01, outputs={"boxes": OutputTolerance(max_abs=0.1)})
    result = compare_outputs(
        {"boxes": ref, "scores": ref}, {"boxes": cand, "scores": cand}, tol, reference_digest=DIGEST
    )
    boxes, other = result.outputs
    assert boxes.tolerance == OutputTolerance(max_abs=0.1, mean_abs=0.01)
    assert boxes.failures == ["mean_abs 0.081 > 0.01"]  # max_abs overridden, mean_abs inherited
    assert other.failures == ["max_abs 0.081 > 0.05", "mean_abs 0.081 > 0.01"]
    assert resolve_tolerance(tol, "scores") == OutputTolerance(max_abs=0.05, mean_abs=0.01)


def test_unset_tolerances_are_not_checked() -> None:
    ref = scores()
    result = compare_outputs({"y": ref}, {"y": -ref}, Tolerance(), reference_digest=DIGEST)
    assert result.passed
    assert result.outputs[0].cosine_min == pytest.approx(-1.0)


def test_top1_agreement_is_measured_on_class_scores() -> None:
    ref = scores(rows=100)
    cand = ref.copy()
    cand[:10] = -cand[:10]  # flips the arg-max of the first ten rows
    result = compare_outputs(
        {"logits": ref}, {"logits": cand}, Tolerance(), reference_digest=DIGEST
    )
    assert result.outputs[0].top1_agreement == 0.9


@pytest.mark.parametrize(
    "ref",
    [
        np.linspace(0, 1, 32).reshape(32, 1),  # one regression value per row
        np.linspace(0, 1, 32),  # rank 1
        np.linspace(0, 1, 96).reshape(32, 3, 1),  # rank 3
        np.arange(64).reshape(32, 2),  # integer, not scores
    ],
)
def test_top1_agreement_is_none_for_outputs_that_are_not_class_scores(
    ref: npt.NDArray[np.generic],
) -> None:
    result = compare_outputs(
        {"y": ref}, {"y": ref}, DEFAULT_TOLERANCES["int8"], reference_digest=DIGEST
    )
    assert result.outputs[0].top1_agreement is None
    assert result.passed  # top1_agreement_min is set on the family, but not checked here


def test_cosine_of_two_zero_rows_is_one_and_of_zero_against_nonzero_is_zero() -> None:
    zeros = np.zeros((2, 3))
    both = compare_outputs({"y": zeros}, {"y": zeros}, Tolerance(), reference_digest=DIGEST)
    assert both.outputs[0].cosine_min == 1.0
    one = compare_outputs(
        {"y": zeros},
        {"y": np.array([[0.0, 0, 0], [1, 2, 3]])},
        Tolerance(),
        reference_digest=DIGEST,
    )
    assert one.outputs[0].cosine_min == 0.0


def test_cosine_is_exact_for_huge_and_tiny_magnitudes() -> None:
    ref = np.array([[1e300, 1e300], [1e-300, 2e-300]])
    result = compare_outputs({"y": ref}, {"y": ref * 2}, Tolerance(), reference_digest=DIGEST)
    assert result.outputs[0].cosine_min == pytest.approx(1.0)


def test_relative_error_floors_the_denominator_at_rel_eps() -> None:
    ref = np.array([[0.0, 2.0]])
    cand = np.array([[1e-7, 2.2]])
    result = compare_outputs({"y": ref}, {"y": cand}, Tolerance(), reference_digest=DIGEST)
    assert result.outputs[0].max_rel == pytest.approx(max(1e-7 / REL_EPS, 0.2 / 2.0))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_candidate_output_fails_parity(bad: float) -> None:
    ref = scores()
    cand = ref.copy()
    cand[5, 5] = bad
    result = compare_outputs(
        {"logits": ref}, {"logits": cand}, Tolerance(), reference_digest=DIGEST
    )
    out = result.outputs[0]
    assert not result.passed
    assert out.failures == [
        "candidate output 'logits' has 1 non-finite value(s) (NaN or Inf) of 640"
    ]
    assert (out.max_abs, out.mean_abs, out.max_rel, out.cosine_min) == (None, None, None, None)
    assert out.top1_agreement is None


def test_non_finite_reference_output_fails_parity() -> None:
    ref = np.array([[float("nan"), 1.0]])
    result = compare_outputs({"y": ref}, {"y": ref.copy()}, Tolerance(), reference_digest=DIGEST)
    assert not result.passed
    assert "reference (baseline) output 'y' has 1 non-finite" in result.outputs[0].failures[0]


def test_shape_mismatch_fails_that_output_only() -> None:
    ref: Arrays = {"a": np.ones((4, 3)), "b": np.ones((4, 2))}
    cand: Arrays = {"a": np.ones((4, 2)), "b": np.ones((4, 2))}
    result = compare_outputs(ref, cand, Tolerance(max_abs=0.1), reference_digest=DIGEST)
    a, b = result.outputs
    assert not result.passed
    assert a.failures == ["shape [4, 2] of output 'a' differs from the reference's [4, 3]"]
    assert a.max_abs is None and a.top1_agreement is None
    assert b.passed


def test_missing_and_extra_outputs_fail_with_their_names() -> None:
    ref: Arrays = {"a": np.ones((2, 1)), "b": np.ones((2, 1))}
    cand: Arrays = {"a": np.ones((2, 1)), "c": np.ones((2, 1))}
    result = compare_outputs(ref, cand, Tolerance(), reference_digest=DIGEST)
    assert [o.name for o in result.outputs] == ["a", "b", "c"]
    assert [o.passed for o in result.outputs] == [True, False, False]
    assert result.outputs[1].failures == ["output 'b' is missing from the candidate"]
    assert result.outputs[2].failures == [
        "output 'c' is produced by the candidate but not by the reference (baseline)"
    ]
    assert result.outputs[2].top1_agreement is None


def test_empty_reference_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="no outputs"):
        compare_outputs({}, {}, Tolerance(), reference_digest=DIGEST)


def test_result_holds_plain_floats_and_round_trips_through_json() -> None:
    ref = scores(rows=8).astype(np.float32)
    cand = (ref + np.float32(0.01)).astype(np.float32)
    result = compare_outputs(
        {"y": ref}, {"y": cand}, DEFAULT_TOLERANCES["int8"], reference_digest=DIGEST
    )
    out = result.outputs[0]
    for value in (out.max_abs, out.mean_abs, out.max_rel, out.cosine_min, out.top1_agreement):
        assert type(value) is float
    text = json.dumps(result.model_dump(mode="json"))
    assert ParityResult.model_validate_json(text) == result


float_rows = hnp.arrays(
    np.float64,
    hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=6),
    elements=st.floats(-1e3, 1e3, allow_nan=False),
)


@settings(max_examples=60, deadline=None)
@given(float_rows, st.data())
def test_min_passing_is_the_measured_values_and_passes_when_used_as_the_tolerance(
    ref: npt.NDArray[np.float64], data: st.DataObject
) -> None:
    cand = data.draw(
        hnp.arrays(np.float64, ref.shape, elements=st.floats(-1e3, 1e3, allow_nan=False))
    )
    strict = Tolerance(
        max_abs=1e-12, mean_abs=1e-12, max_rel=1e-12, cosine_min=1.0, top1_agreement_min=1.0
    )
    first = compare_outputs({"y": ref}, {"y": cand}, strict, reference_digest=DIGEST).outputs[0]
    mp = first.min_passing
    assert mp.max_abs == first.max_abs
    assert mp.mean_abs == first.mean_abs
    assert mp.max_rel == first.max_rel
    assert mp.cosine_min == first.cosine_min
    assert mp.top1_agreement_min == first.top1_agreement

    again = compare_outputs(
        {"y": ref}, {"y": cand}, Tolerance(**mp.model_dump()), reference_digest=DIGEST
    )
    assert again.passed, again.outputs[0].failures


def test_all_is_complete() -> None:
    public = {n for n in vars(parity) if not n.startswith("_")} - {
        "annotations",
        "math",
        "np",
        "npt",
        "Mapping",
        "Sequence",
        "Literal",
        "dataclass",
        "OutputParity",
        "ParityResult",
        "OutputTolerance",
        "TaskTolerance",
        "Tolerance",
        "Workload",
        "applicable",
        "resolve_tolerance",
        "task_failures",
        "tolerance_failures",
    }
    assert public == set(parity.__all__)


def test_uncomparable_output_round_trips_through_json() -> None:
    result = compare_outputs(
        {"y": np.ones((2, 2))}, {"y": np.ones((2, 3))}, Tolerance(), reference_digest=DIGEST
    )
    assert ParityResult.model_validate_json(result.model_dump_json()) == result


def test_sequence_output_fails_when_its_per_step_argmax_agreement_is_below_the_limit() -> None:
    # A CTC recogniser's [N, steps, classes]: 14% of steps change label, yet each sample's
    # cosine stays high, which is what let such a candidate pass when only rank 2 was checked.
    rng = np.random.default_rng(3)
    ref = rng.normal(size=(8, 50, 12))
    ref[..., 0] += 4.0  # a dominant blank class, as CTC emits
    cand = ref.copy()
    flips = rng.choice(8 * 50, size=56, replace=False)
    n, t = np.unravel_index(flips, (8, 50))
    cand[n, t, 0] -= 8.0  # the blank loses its lead on 56 of 400 steps
    result = compare_outputs(
        {"logits": ref},
        {"logits": cand},
        Tolerance(cosine_min=0.7, top1_agreement_min=0.98),
        reference_digest=DIGEST,
    )
    out = result.outputs[0]
    assert out.top1_agreement == pytest.approx(1 - 56 / 400)
    assert out.cosine_min is not None and out.cosine_min > 0.7
    assert not result.passed
    assert out.failures == ["top1_agreement 0.86 < 0.98"]


def test_a_limit_is_printed_exactly_as_configured() -> None:
    ref = np.array([[1.0, 0.2], [0.3, 1.0]])
    cand = np.array([[0.2, 1.0], [0.3, 1.0]])
    result = compare_outputs(
        {"p": ref}, {"p": cand}, Tolerance(cosine_min=0.9999), reference_digest=DIGEST
    )
    (failure,) = result.outputs[0].failures
    assert failure.startswith("cosine_min 0.") and failure.endswith(" < 0.9999")


def test_a_measured_value_is_never_rounded_onto_or_across_its_limit() -> None:
    ref = np.array([[1.0, 0.0]])
    cand = np.array([[1.0, 0.01414]])  # cosine 0.99990004..., just under 0.99991
    result = compare_outputs(
        {"p": ref}, {"p": cand}, Tolerance(cosine_min=0.99991), reference_digest=DIGEST
    )
    assert result.outputs[0].failures == ["cosine_min 0.9999 < 0.99991"]


@settings(max_examples=300, deadline=None)
@given(
    measured=st.floats(-1e6, 1e6, allow_nan=False),
    limit=st.floats(-1e6, 1e6, allow_nan=False),
)
def test_shown_values_keep_the_side_of_the_limit_they_were_measured_on(
    measured: float, limit: float
) -> None:
    from schemas.rules import show_pair

    shown, exact = show_pair(measured, limit)
    assert float(exact) == limit
    assert (float(shown) > limit) == (measured > limit)
    assert (float(shown) < limit) == (measured < limit)


# --- what each metric is taken over: the output's samples, its batch axis, its kind ---------


def _time_first(rng: np.random.Generator, n: int = 8) -> npt.NDArray[np.float64]:
    """n samples of a [T=6, N=1, C=5] output, stacked as the child saves them."""
    return rng.normal(size=(n, 6, 1, 5))


def test_a_time_first_output_is_compared_per_sample_not_per_time_step() -> None:
    rng = np.random.default_rng(5)
    ref = _time_first(rng)
    cand = ref.copy()
    cand[:, 0] = rng.normal(size=cand[:, 0].shape)  # the first step of every sample replaced
    roles = parity.output_roles(
        {"y": (6, "N", 5)}, {"x": ("N", 16)}, Workload(inputs={"x": _x_spec()})
    )
    assert roles["y"].batch_axis == 1 and "graph" in (roles["y"].axis_from or "")
    out = compare_outputs(
        {"y": ref}, {"y": cand}, Tolerance(), reference_digest=DIGEST, roles=roles
    ).outputs[0]
    a, b = ref.reshape(8, -1), cand.reshape(8, -1)
    per_sample = np.sum(a * b, 1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    steps_a, steps_b = ref.reshape(48, 5), cand.reshape(48, 5)
    per_step = np.sum(steps_a * steps_b, 1) / np.linalg.norm(steps_a, axis=1)
    per_step /= np.linalg.norm(steps_b, axis=1)
    assert out.cosine_min == pytest.approx(per_sample.min(), abs=1e-12)
    assert out.cosine_min > per_step.min() + 0.1  # what concatenating along axis 0 measured
    assert out.samples == 8
    assert out.over is not None and "batch axis 1" in out.over and "'N'" in out.over
    assert "top-1 over 48 positions, 6 per sample" in out.over


def _x_spec() -> InputSpec:
    return InputSpec(shape=[1, 16], source="generated")


def test_a_recurrent_state_gets_no_top1_agreement_and_says_why() -> None:
    rng = np.random.default_rng(6)
    h = rng.normal(size=(16, 1, 1, 8))  # [layers, N, hidden] per sample
    cand = h.copy()
    cand[:, ..., 0] += 3.0  # the arg-max of every sample moves: what top-1 would fail
    wl = Workload(
        inputs={
            "x": _x_spec(),
            "h": InputSpec(
                shape=[1, 1, 8], batch_axis=1, source="fixed", value=0, state_from="h_out"
            ),
        }
    )
    roles = parity.output_roles({"h_out": (1, "N", 8)}, {"x": ("N", 16), "h": (1, "N", 8)}, wl)
    result = compare_outputs(
        {"h_out": h},
        {"h_out": cand},
        DEFAULT_TOLERANCES["fp16"].model_copy(update={"max_abs": None, "cosine_min": None}),
        reference_digest=DIGEST,
        roles=roles,
    )
    out = result.outputs[0]
    assert out.top1_agreement is None
    assert "recurrent state" in out.skipped["top1_agreement"]
    assert "'h'" in out.skipped["top1_agreement"]
    assert out.tolerance.top1_agreement_min is None  # the family's limit did not apply here
    assert result.passed


def test_the_project_can_say_an_output_is_not_class_scores() -> None:
    ref = scores(rows=32)
    cand = -ref
    wl = Workload(inputs={"x": _x_spec()}, outputs={"emb": OutputSpec(kind="values")})
    roles = parity.output_roles({"emb": ("N", 10)}, {"x": ("N", 16)}, wl)
    tol = Tolerance(top1_agreement_min=0.99)
    out = compare_outputs(
        {"emb": ref}, {"emb": cand}, tol, reference_digest=DIGEST, roles=roles
    ).outputs[0]
    assert out.top1_agreement is None and out.passed
    assert out.skipped == {"top1_agreement": "workload.outputs.emb.kind is values"}
    # Without the setting, a floating-point [N, classes] output is class scores.
    plain = compare_outputs({"emb": ref}, {"emb": cand}, tol, reference_digest=DIGEST)
    assert plain.outputs[0].top1_agreement == 0.0 and not plain.passed


def test_a_project_batch_axis_wins_over_the_graph() -> None:
    wl = Workload(inputs={"x": _x_spec()}, outputs={"y": OutputSpec(batch_axis=2)})
    roles = parity.output_roles({"y": ("N", 6, 1)}, {"x": ("N", 16)}, wl)
    assert roles["y"].batch_axis == 2
    assert roles["y"].axis_from == "workload.outputs.y.batch_axis"


def test_strings_are_compared_by_exact_match_and_failures_of_tasks_come_first() -> None:
    ref = np.array(["cat", "dog", "cow", "hen"])
    cand = np.array(["cat", "dog", "cov", "hen"])
    logits = scores(rows=4)
    result = compare_outputs(
        {"y": logits, "post.text": ref},
        {"y": logits + 0.5, "post.text": cand},
        Tolerance(max_abs=0.1),
        reference_digest=DIGEST,
        tasks={"post.text": TaskTolerance(exact_match_min=0.9)},
    )
    text, y = result.outputs
    assert text.name == "post.text"  # the task-level output is listed first
    assert text.exact_match == 0.75
    assert text.failures == ["exact_match 0.75 < 0.9"]
    assert text.max_abs is None and "text" in text.skipped["max_abs"]
    assert text.tolerance.max_abs is None  # the family's max_abs is not held against text
    assert y.failures == ["max_abs 0.5 > 0.1"]


def test_integers_get_an_exact_match_rate_beside_the_tensor_metrics() -> None:
    ref = np.array([[3], [1], [4], [1]])
    out = compare_outputs(
        {"post": ref},
        {"post": np.array([[3], [1], [5], [1]])},
        Tolerance(),
        reference_digest=DIGEST,
    ).outputs[0]
    assert out.exact_match == 0.75 and out.max_abs == 1.0
    assert out.passed  # no task tolerance asked for it


def _boxes(*rows: list[list[float]]) -> list[npt.NDArray[np.float64]]:
    return [np.asarray(r, dtype=np.float64).reshape(-1, 6) for r in rows]


def test_boxes_are_matched_one_to_one_at_the_iou_and_scored_by_f1() -> None:
    # Sample 0: both boxes found (one shifted a little); sample 1: the candidate lost its box
    # and found a wrong one; sample 2: nothing on either side.
    ref = _boxes(
        [[0, 0, 10, 10, 0.9, 1], [20, 20, 30, 30, 0.8, 2]],
        [[5, 5, 15, 15, 0.7, 0]],
        [],
    )
    cand = _boxes(
        [[1, 0, 11, 10, 0.9, 1], [20, 20, 30, 30, 0.8, 2]],
        [[50, 50, 60, 60, 0.7, 0]],
        [],
    )
    task = TaskTolerance(box_f1_min=0.9, iou=0.5)
    out = compare_outputs(
        {"post.boxes": ref},
        {"post.boxes": cand},
        Tolerance(max_abs=100.0),
        reference_digest=DIGEST,
        tasks={"post.boxes": task},
    ).outputs[0]
    assert out.box_f1 == pytest.approx(2 * 2 / (3 + 3))
    assert out.iou == 0.5
    assert out.failures[0] == "box_f1 0.667 < 0.9"
    strict = TaskTolerance(box_f1_min=0.5, iou=0.95)  # the shifted box no longer matches
    again = compare_outputs(
        {"post.boxes": ref},
        {"post.boxes": cand},
        Tolerance(),
        reference_digest=DIGEST,
        tasks={"post.boxes": strict},
    ).outputs[0]
    assert again.box_f1 == pytest.approx(2 * 1 / 6)


def test_a_detector_that_lost_every_box_fails_however_close_its_tensors_are() -> None:
    ref = _boxes([[0, 0, 10, 10, 0.9, 1]] * 3, [[5, 5, 9, 9, 0.6, 1]])
    cand = [np.zeros((0, 6)), np.zeros((0, 6))]
    out = compare_outputs(
        {"post.boxes": ref},
        {"post.boxes": cand},
        Tolerance(),
        reference_digest=DIGEST,
        tasks={"post.boxes": TaskTolerance(box_f1_min=0.5)},
    ).outputs[0]
    # Different numbers of boxes per sample: not comparable as tensors, scored as boxes.
    assert out.box_f1 == 0.0
    assert out.failures == ["box_f1 0 < 0.5"]
    assert "differ in shape" in out.skipped["cosine_min"]
    without = compare_outputs(
        {"post.boxes": ref}, {"post.boxes": cand}, Tolerance(), reference_digest=DIGEST
    ).outputs[0]
    assert "sample 0 of output 'post.boxes' has shape [0, 6]" in without.failures[0]


def test_samples_of_different_shapes_round_trip_through_the_childs_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from qualify.measure.feeds import pack

    rows = [np.arange(12.0).reshape(2, 6), np.zeros((0, 6)), np.ones((1, 6))]
    texts = [np.array("ab"), np.array("abcd"), np.array("")]
    path = tmp_path / "outputs.npz"
    np.savez(path, allow_pickle=False, **pack("post.boxes", rows), **pack("post.text", texts))
    with np.load(path) as saved:
        back = parity.unpack(dict(saved))
    assert isinstance(back["post.boxes"], list)
    for got, want in zip(back["post.boxes"], rows, strict=True):
        np.testing.assert_array_equal(got, want)
    assert back["post.text"].tolist() == ["ab", "abcd", ""]  # one shape: stacked


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.floats(-100, 100, allow_nan=False), min_size=0, max_size=12).map(
            lambda v: v[: len(v) // 4 * 4]
        ),
        min_size=1,
        max_size=6,
    ),
    st.floats(0.05, 1.0),
)
def test_box_f1_of_identical_sets_is_one_and_never_leaves_zero_to_one(
    samples: list[list[float]], iou: float
) -> None:
    ref = [np.asarray(s, dtype=np.float64).reshape(-1, 4) for s in samples]
    shifted = [r + 1.0 for r in ref]
    task = TaskTolerance(box_f1_min=0.0, iou=iou)
    same = compare_outputs(
        {"b": ref},
        {"b": [r.copy() for r in ref]},
        Tolerance(),
        reference_digest=DIGEST,
        tasks={"b": task},
    ).outputs[0]
    # A degenerate box (no area) overlaps nothing, itself included.
    degenerate = any(((r[:, 2] <= r[:, 0]) | (r[:, 3] <= r[:, 1])).any() for r in ref)
    assert same.box_f1 is not None
    assert same.box_f1 == 1.0 or degenerate
    moved = compare_outputs(
        {"b": ref}, {"b": shifted}, Tolerance(), reference_digest=DIGEST, tasks={"b": task}
    ).outputs[0]
    assert moved.box_f1 is not None and 0.0 <= moved.box_f1 <= 1.0
