"""The harness-vs-LoadGen benchmark: its model, its statistics and one real end-to-end round."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
import pytest

from bench import _cnn
from bench import harness_vs_loadgen as hvl


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_bench_cnn_builds_byte_identical_files_with_modest_ir_and_opset(tmp_path: Path) -> None:
    first = _cnn.build(tmp_path / "a")
    second = _cnn.build(tmp_path / "b")
    assert [_digest(p) for p in first] == [_digest(p) for p in second]
    for path in first:
        model = onnx.load(path)
        assert model.ir_version == _cnn.IR_VERSION
        assert {(o.domain or "ai.onnx", o.version) for o in model.opset_import} == {
            ("ai.onnx", _cnn.OPSET)
        }
    int8 = onnx.load(first[1])
    assert any(n.op_type == "QuantizeLinear" for n in int8.graph.node)


def test_bench_cnn_fp32_and_int8_agree_on_most_classes(tmp_path: Path) -> None:
    import onnxruntime as ort

    fp32, int8 = _cnn.build(tmp_path)
    images = np.random.default_rng(1).random((64, *_cnn.IMAGE), dtype=np.float32)
    scores = [
        ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(
            None, {_cnn.INPUT_NAME: images}
        )[0]
        for p in (fp32, int8)
    ]
    assert scores[0].shape == (64, 10)
    agreement = float(np.mean(scores[0].argmax(1) == scores[1].argmax(1)))
    assert agreement >= 0.8, f"int8 agrees with fp32 on only {agreement:.0%} of images"


def _m(case: str, side: str, rnd: int, p50: float, p99: float) -> hvl.Measurement:
    extra = (
        {
            "inner_p50_us": p50 * 0.99,
            "inner_p99_us": p99 * 0.99,
            "inner_mean_us": p50 * 0.99,
            "hot_p50_us": p50 * 0.98,
            "hot_p99_us": p99 * 0.98,
        }
        if side == "loadgen"
        else {}
    )
    return hvl.Measurement(
        case=case, side=side, round=rnd, n=1024, p50_us=p50, p99_us=p99, mean_us=p50, **extra
    )


def _rounds(case: str, q_over_l: float, modes: list[float]) -> list[hvl.Measurement]:
    """Both sides see the machine's mode of each round; qualify is q_over_l times LoadGen."""
    out = []
    for rnd, speed in enumerate(modes):
        out.append(_m(case, "qualify", rnd, 400.0 * speed * q_over_l, 600.0 * speed * q_over_l))
        out.append(_m(case, "loadgen", rnd, 400.0 * speed, 600.0 * speed))
    return out


JUDGED = (hvl.CASES[0],)


def test_verdict_rests_on_paired_rounds_not_on_medians_of_a_bimodal_machine() -> None:
    # The machine flips between a fast and a slow mode; qualify happens to land on the slow mode
    # more often, so the ratio of the two medians is 1.33 while every round agrees to 1%.
    modes_q = [1.0] * 6 + [1.33] * 7
    ms = []
    for rnd, speed in enumerate(modes_q):
        lg_speed = speed if rnd != 6 else 1.0
        ms.append(_m(JUDGED[0].label, "qualify", rnd, 400.0 * speed * 1.01, 600.0 * speed))
        ms.append(_m(JUDGED[0].label, "loadgen", rnd, 400.0 * lg_speed, 600.0 * lg_speed))
    (summary,) = hvl.summarise(ms, JUDGED)
    assert hvl._med(summary.q_p50) / hvl._med(summary.lg_p50) > 1.3
    assert summary.ratio_p50 == pytest.approx(1.01)
    text = hvl.render_markdown(ms, loadgen_version="test", rounds=13, queries=4096, cases=JUDGED)
    assert "**Result: PASS**" in text


def test_a_judged_ratio_outside_three_percent_fails_and_says_so() -> None:
    ms = _rounds(JUDGED[0].label, 1.05, [1.0, 1.1, 0.9, 1.0, 1.2, 1.0, 0.95])
    text = hvl.render_markdown(ms, loadgen_version="test", rounds=7, queries=4096, cases=JUDGED)
    assert "**Result: FAIL**" in text
    assert "1.050 (+5.0%) **FAIL**" in text


def test_reported_cases_never_decide_the_result() -> None:
    cases = (hvl.CASES[0], hvl.CASES[3])
    ms = _rounds(cases[0].label, 1.0, [1.0] * 7) + _rounds(cases[1].label, 0.8, [1.0] * 7)
    text = hvl.render_markdown(ms, loadgen_version="test", rounds=7, queries=4096, cases=cases)
    assert "**Result: PASS**" in text
    assert "0.800 (-20.0%) outside +-3%" in text


def test_median_interval_brackets_the_median_and_needs_six_rounds() -> None:
    assert hvl.median_interval([1.0, 2.0, 3.0, 4.0, 5.0]) == (None, None)
    low, high = hvl.median_interval([float(v) for v in range(1, 26)])
    assert low is not None and high is not None
    assert low < 13.0 < high
    assert (low, high) == (8.0, 18.0)


def test_unpaired_rounds_are_an_error_not_a_silent_truncation() -> None:
    ms = _rounds(JUDGED[0].label, 1.0, [1.0, 1.0])[:-1]
    (summary,) = hvl.summarise(ms, JUDGED)
    with pytest.raises(hvl.BenchError, match="unpaired"):
        _ = summary.ratio_p50


@pytest.mark.slow
@pytest.mark.quiet  # compares two cases' measured latencies: a timing judgement, run alone
def test_one_real_round_times_the_same_queries_on_both_sides(tmp_path: Path) -> None:
    pytest.importorskip("mlperf_loadgen")
    cases = (hvl.CASES[1], hvl.CASES[3])  # cnn int8, digits int8
    ms = hvl.run_benchmark(workdir=tmp_path, rounds=1, queries=256, cases=cases)
    assert [(m.case, m.side) for m in ms] == [
        ("cnn int8", "qualify"),
        ("cnn int8", "loadgen"),
        ("digits int8", "loadgen"),
        ("digits int8", "qualify"),
    ]
    for m in ms:
        assert m.n == hvl.queries_for(next(c for c in cases if c.label == m.case), 256)
        assert 0.0 < m.p50_us <= m.p99_us
        assert m.notes == [], m.notes  # LoadGen VALID, exactly N queries on both sides
    cnn = [m for m in ms if m.case == "cnn int8"]
    digits = [m for m in ms if m.case == "digits int8"]
    # The CNN does real convolution work: far slower per query than the digits MLP (about 30x on
    # a quiet machine; a loaded one inflates the MLP's ~20 us queries most, 7x once, so the
    # bound is 2x). Against the digits side less disturbed (min): noise must slow both of its
    # measurements 15x to invert it, while a side that timed no work fails it either way.
    assert min(m.p50_us for m in cnn) > 2 * min(m.p50_us for m in digits)
    text = hvl.render_markdown(ms, loadgen_version="test", rounds=1, queries=256, cases=cases)
    assert "n/a (too few rounds)" in text
