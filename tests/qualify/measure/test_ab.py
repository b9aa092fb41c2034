"""The interleaved A/B's sampling protocol, driven by scripted workers of known speed.

The real protocol runs in `test_run.py` on real models; here the workers only report what a
model of a given latency would, so that time caps of minutes are checked in milliseconds.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from qualify.measure.ab import (
    ROUND_SAMPLES,
    ConfigEvidence,
    aa_control,
    beyond_spread,
    interleave,
    needed_rounds,
    process_spread,
    round_quota,
    slowdowns,
)
from qualify.measure.stats import (
    AUTO_TIME_CAP_CEILING_S,
    AUTO_TIME_CAP_FLOOR_S,
    RatioBounds,
    time_cap,
)
from schemas.cell import LatencyConfig, RoundFigure
from schemas.project import InputSpec, Workload


class Scripted:
    """A worker whose every inference takes ``latency_s``; it answers at once with the samples
    and the time such a model would have spent."""

    def __init__(self, latency_s: float) -> None:
        self.latency_s = latency_s
        self.alive = True
        self.rounds = 0

    def round(self, cmd: dict[str, Any]) -> dict[str, Any]:
        self.rounds += 1
        n = max(1, min(int(cmd["max_samples"]), int(float(cmd["time_s"]) / self.latency_s)))
        return {"samples_ns": [int(self.latency_s * 1e9)] * n, "duration_s": n * self.latency_s}


def _workload(**extra: Any) -> Workload:
    return Workload(inputs={"x": InputSpec(shape=[1, 4], source="generated")}, warmup=0, **extra)


def _run(workers: list[Scripted], budget_ms: float, **extra: Any) -> Any:
    found = interleave(
        workers,  # type: ignore[arg-type]  # scripted stand-ins for ServedWorker
        [LatencyConfig(1, 1)],
        _workload(**extra),
        budget_ms,
        cores=10_000,
    )
    return [found.evidence[i][LatencyConfig(1, 1)] for i in range(len(workers))]


def test_unset_time_cap_adapts_so_a_slow_model_gets_the_samples_its_p99_needs() -> None:
    # 50 ms per inference: 459 samples (the fewest that bound a p99) take 23 s, past the
    # 20 s a fixed cap gave; the adaptive cap allows 4 x 662 samples, 132 s.
    (ev,) = _run([Scripted(0.05)], budget_ms=100.0)
    assert ev.time_cap_s == pytest.approx(4 * 662 * 0.05)
    assert ev.decision == "pass"
    assert ev.stopped == "decided"
    assert ev.duration_s > AUTO_TIME_CAP_FLOOR_S


def test_a_configured_time_cap_is_kept_and_says_insufficient_when_it_is_too_short() -> None:
    (ev,) = _run([Scripted(0.05)], budget_ms=100.0, time_cap_s=5.0)
    assert ev.time_cap_s == 5.0
    assert ev.decision == "insufficient"
    assert ev.stopped == "time_cap"
    assert ev.duration_s <= 5.0 + 0.05 + 1e-9  # the last round ends after its sample


def test_each_artifact_gets_the_cap_its_own_rate_needs() -> None:
    fast, slow = _run([Scripted(0.0001), Scripted(0.2)], budget_ms=1000.0)
    assert fast.time_cap_s == AUTO_TIME_CAP_FLOOR_S
    assert slow.time_cap_s == AUTO_TIME_CAP_CEILING_S
    assert slow.duration_s <= AUTO_TIME_CAP_CEILING_S + 0.2 + 1e-9
    # 0.2 s per sample: 300 s holds 1,500 samples, enough for this budget.
    assert slow.decision == "pass"


@pytest.mark.parametrize(
    ("configured", "rate", "cap"),
    [
        (7.5, 1e6, 7.5),  # configured wins, whatever the model
        (None, None, AUTO_TIME_CAP_FLOOR_S),  # nothing measured yet
        (None, 0.0, AUTO_TIME_CAP_FLOOR_S),
        (None, float("nan"), AUTO_TIME_CAP_FLOOR_S),
        (None, 1e6, AUTO_TIME_CAP_FLOOR_S),  # a fast model decides long before
        (None, 50.0, 4 * 662 / 50.0),
        (None, 0.5, AUTO_TIME_CAP_CEILING_S),  # a very slow one cannot stall a run
    ],
)
def test_time_cap_rule(configured: float | None, rate: float | None, cap: float) -> None:
    assert time_cap(configured, 662, rate) == pytest.approx(cap)


def test_a_fast_model_takes_the_samples_its_decision_needs_not_max_samples() -> None:
    # 0.05 ms per inference against a 20 ms budget decides at one of the first looks. The
    # minimum rounds share min_samples (at least ROUND_SAMPLES each); none fills max_samples.
    workload = _workload()
    rounds = needed_rounds(workload, 1)
    evs = _run([Scripted(0.00005), Scripted(0.00005)], budget_ms=20.0)
    for ev in evs:
        assert ev.decision == "pass" and ev.stopped == "decided"
        assert len(ev.rounds) >= rounds
        share = max(-(-workload.min_samples // rounds), ROUND_SAMPLES)
        assert [f.samples for f in ev.rounds[:rounds]] == [share] * rounds
        taken = sum(f.samples for f in ev.rounds)
        assert workload.min_samples <= taken <= rounds * ROUND_SAMPLES < workload.max_samples // 4


def test_round_quota_reaches_min_samples_in_the_minimum_rounds_then_grows_to_max() -> None:
    taken, sizes = 0, []
    while taken < 20_000:
        quota = round_quota(taken, 2000, 20_000, 10)
        assert quota > 0
        sizes.append(quota)
        taken += quota
    assert taken == 20_000  # never past max_samples
    assert sum(sizes[:10]) >= 2000 > sum(sizes[:9])
    assert sizes == sorted(sizes[:-1]) + sizes[-1:]  # it only grows, but for the last
    assert len(sizes) < 60  # geometric: tens of rounds from the first look to max_samples
    assert round_quota(20_000, 662, 20_000, 10) == 0
    # Never fewer than ROUND_SAMPLES a round: a p50 of a dozen samples is one disturbance's.
    assert round_quota(0, 662, 20_000, 40) == ROUND_SAMPLES
    assert round_quota(19_950, 662, 20_000, 40) == 50  # but never past max_samples


def _evidence(p50s: list[float]) -> ConfigEvidence:
    return ConfigEvidence(
        rounds=[
            RoundFigure(
                round=k,
                position=0,
                samples=100,
                p50_ms=v,
                p99_ms=2 * v,
                load_avg_1m=0.0,
                steal_fraction=None,
            )
            for k, v in enumerate(p50s)
        ]
    )


def _noisy(level: float, seed: int, n: int = 40) -> list[float]:
    rng = np.random.default_rng(seed)
    return list(level * (1 + 0.01 * rng.standard_normal(n)))


def test_a_candidate_within_the_spread_of_the_baselines_two_processes_is_not_slower() -> None:
    config = LatencyConfig(1, 1)
    base, control = _evidence(_noisy(1.0, 1)), _evidence(_noisy(1.06, 2))
    cand = _evidence(_noisy(1.04, 3))
    alone = slowdowns({config: cand}, {config: base}, 0.995)[config]
    assert alone.p50_lower is not None and alone.p50_lower > 1.0  # slower than one process
    ratio = slowdowns({config: cand}, {config: base}, 0.995, control={config: control})[config]
    assert ratio.p50_spread is not None and 1.04 < ratio.p50_spread < 1.06
    assert ratio.p50_lower is not None and ratio.p50_lower < 1.0  # not than both, beyond it
    assert ratio.p50_ratio == pytest.approx(1.04 / np.sqrt(1.06), rel=0.01)  # vs the pooled
    assert ratio.p50_detectable == pytest.approx(ratio.p50_ratio / ratio.p50_lower)
    aa = aa_control({config: control}, {config: base}, 0.995)[config]
    assert aa.p50_ratio == pytest.approx(1.06, rel=0.01) and aa.p50_spread == ratio.p50_spread


def test_a_candidate_slower_than_every_baseline_process_beyond_the_spread_is_slower() -> None:
    config = LatencyConfig(1, 1)
    base, control = _evidence(_noisy(1.0, 1)), _evidence(_noisy(1.03, 2))
    ratio = slowdowns(
        {config: _evidence(_noisy(1.15, 3))}, {config: base}, 0.995, control={config: control}
    )[config]
    assert ratio.p50_lower is not None and ratio.p50_lower > 1.0
    assert ratio.p50_upper is not None and ratio.p50_upper >= ratio.p50_ratio  # type: ignore[operator]


def test_the_spread_is_what_the_rounds_show_beyond_their_own_noise() -> None:
    # An interval that holds 1 shows no difference; otherwise its bound nearest 1.
    assert process_spread(RatioBounds(40, 1.01, 0.98, 1.03)) == 1.0
    assert process_spread(RatioBounds(40, 1.06, 1.04, 1.08)) == 1.04
    assert process_spread(RatioBounds(40, 0.94, 0.92, 0.96)) == pytest.approx(1 / 0.96)
    assert process_spread(RatioBounds(3, 1.06, None, None)) is None
    widened = beyond_spread(
        RatioBounds(40, 1.2, 1.1, 1.3), [RatioBounds(40, 1.2, 1.05, 1.35)], 1.04
    )
    assert widened.lower == pytest.approx(1.05) and widened.upper == pytest.approx(1.352)
