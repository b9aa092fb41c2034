"""The interleaved A/B's sampling protocol, driven by scripted workers of known speed.

The real protocol runs in `test_run.py` on real models; here the workers only report what a
model of a given latency would, so that time caps of minutes are checked in milliseconds.
"""

from __future__ import annotations

from typing import Any

import pytest

from qualify.ab import interleave, needed_rounds, round_quota
from qualify.stats import AUTO_TIME_CAP_CEILING_S, AUTO_TIME_CAP_FLOOR_S, time_cap
from schemas.cell import LatencyConfig
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
    # minimum rounds share min_samples; later rounds grow by a tenth; none fills to max_samples.
    workload = _workload()
    rounds = needed_rounds(workload, 1)
    evs = _run([Scripted(0.00005), Scripted(0.00005)], budget_ms=20.0)
    for ev in evs:
        assert ev.decision == "pass" and ev.stopped == "decided"
        assert len(ev.rounds) >= rounds
        share = -(-workload.min_samples // rounds)
        assert [f.samples for f in ev.rounds[:rounds]] == [share] * rounds
        taken = sum(f.samples for f in ev.rounds)
        assert workload.min_samples <= taken < workload.max_samples // 10


def test_round_quota_reaches_min_samples_in_the_minimum_rounds_then_grows_to_max() -> None:
    taken, sizes = 0, []
    while taken < 20_000:
        quota = round_quota(taken, 662, 20_000, 10)
        assert quota > 0
        sizes.append(quota)
        taken += quota
    assert taken == 20_000  # never past max_samples
    assert sum(sizes[:10]) >= 662 > sum(sizes[:9])
    assert sizes == sorted(sizes[:-1]) + sizes[-1:]  # it only grows, but for the last
    assert len(sizes) < 60  # geometric: tens of rounds from the first look to max_samples
    assert round_quota(20_000, 662, 20_000, 10) == 0
