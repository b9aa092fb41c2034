"""Latency percentiles and distribution-free p99 bounds (qualify.measure.stats)."""

from __future__ import annotations

import itertools
import math
import time
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qualify.measure import stats
from qualify.measure.stats import (
    AdaptiveP99,
    LookPlan,
    Percentiles,
    decide_p99,
    look_schedule,
    p99_bounds,
    percentiles,
    quantile_bound_ranks,
    spend_alpha,
)
from schemas.rules import order_rank

latencies = st.lists(
    st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False),
    min_size=1,
    max_size=300,
)


def exact_ranks(n: int, q: Fraction, alpha: Fraction) -> tuple[int | None, int | None]:
    """The bound ranks in exact integer arithmetic, straight from the definition."""
    a, b = q.numerator, q.denominator
    # P(B = k) = weight[k] / b**n
    weight = [math.comb(n, k) * a**k * (b - a) ** (n - k) for k in range(n + 1)]
    limit = alpha * b**n
    survival = list(itertools.accumulate(reversed(weight)))[::-1]  # survival[k] ~ P(B >= k)
    cdf = list(itertools.accumulate(weight))  # cdf[k] ~ P(B <= k)
    upper = next((u for u in range(1, n + 1) if survival[u] <= limit), None)
    lower = max((r for r in range(1, n + 1) if cdf[r - 1] <= limit), default=None)
    return lower, upper


# --- percentiles ---------------------------------------------------------------------------


@given(latencies)
def test_percentiles_are_ordered_for_any_sample(samples: list[float]) -> None:
    p = percentiles(samples)
    assert p.min <= p.p50 <= p.p90 <= p.p99 <= p.max
    slack = 1e-12 * max(abs(p.min), abs(p.max))  # the mean of equal floats may round
    assert p.min - slack <= p.mean <= p.max + slack
    assert p.n == len(samples)


@given(latencies)
def test_every_reported_percentile_is_an_observed_sample(samples: list[float]) -> None:
    p = percentiles(samples)
    assert {p.p50, p.p90, p.p99, p.min, p.max} <= set(samples)


def test_percentiles_use_the_inverted_cdf_order_statistic() -> None:
    samples = np.arange(1.0, 1001.0)[::-1]  # 1..1000, unsorted
    p = percentiles(samples)
    assert p == Percentiles(
        p50=500.0, p90=900.0, p99=990.0, max=1000.0, mean=500.5, min=1.0, n=1000
    )
    assert p.p99 == float(np.quantile(samples, 0.99, method="inverted_cdf"))


def test_percentiles_return_plain_python_floats() -> None:
    p = percentiles(np.array([1.0, 2.0, 3.0], dtype=np.float32))
    assert all(type(v) is float for v in (p.p50, p.p90, p.p99, p.max, p.mean, p.min))


def test_order_rank_ignores_floating_point_noise_in_n_times_q() -> None:
    # 100 * 0.99 is 98.99999999999999 or 99.00000000000001 depending on rounding: rank 99 either way
    assert order_rank(100, 0.99) == 99
    assert order_rank(1, 0.99) == 1
    assert order_rank(10, 0.0) == 1


@pytest.mark.parametrize("bad", [[], [[1.0, 2.0]], [1.0, float("nan")], [float("inf")]])
def test_percentiles_reject_empty_nested_or_non_finite_samples(bad: list[object]) -> None:
    with pytest.raises(ValueError):
        percentiles(bad)  # type: ignore[arg-type]


# --- bound ranks ---------------------------------------------------------------------------


def test_p99_upper_bound_first_exists_at_loadgens_459_samples() -> None:
    assert quantile_bound_ranks(458)[1] is None
    assert quantile_bound_ranks(459)[1] == 459


def test_one_sample_over_the_bound_first_allowed_at_loadgens_662_samples() -> None:
    assert quantile_bound_ranks(661)[1] == 661
    assert quantile_bound_ranks(662)[1] == 661
    smallest = next(n for n in range(459, 1000) if quantile_bound_ranks(n)[1] == n - 1)
    assert smallest == 662


@pytest.mark.parametrize("n", [1, 2, 50, 459, 662, 1000])
def test_bound_ranks_match_exact_rational_arithmetic(n: int) -> None:
    expected = exact_ranks(n, Fraction(99, 100), Fraction(1, 100))
    assert quantile_bound_ranks(n, 0.99, 0.99) == expected


def test_bound_ranks_match_exact_arithmetic_for_another_quantile_and_confidence() -> None:
    for n in (10, 37, 200):
        assert quantile_bound_ranks(n, 0.9, 0.95) == exact_ranks(
            n, Fraction(9, 10), Fraction(5, 100)
        )


@given(st.integers(min_value=1, max_value=5000))
def test_bound_ranks_bracket_the_point_estimate(n: int) -> None:
    lower, upper = quantile_bound_ranks(n)
    if lower is not None:
        assert 1 <= lower <= order_rank(n, 0.99)
    if upper is not None:
        assert order_rank(n, 0.99) <= upper <= n


def test_bound_ranks_are_fast_enough_for_adaptive_sampling() -> None:
    quantile_bound_ranks.cache_clear()
    start = time.perf_counter()
    lower, upper = quantile_bound_ranks(200_000)
    elapsed = time.perf_counter() - start
    assert lower is not None and upper is not None and lower < 198_000 < upper
    assert elapsed < 1.0  # measured ~10 ms here; the bound only catches an accidental O(n^2)


@pytest.mark.parametrize(
    ("n", "q", "confidence"), [(0, 0.99, 0.99), (10, 1.0, 0.99), (10, 0.99, 0.5), (10, 0.0, 0.9)]
)
def test_bound_ranks_reject_out_of_range_arguments(n: int, q: float, confidence: float) -> None:
    with pytest.raises(ValueError):
        quantile_bound_ranks(n, q, confidence)


# --- bound values --------------------------------------------------------------------------


@settings(max_examples=50)
@given(
    st.lists(st.floats(min_value=0.0, max_value=1e3, allow_nan=False), min_size=1, max_size=1500)
)
def test_lower_bound_le_p99_le_upper_bound_when_defined(samples: list[float]) -> None:
    lower, upper = p99_bounds(samples)
    p99 = percentiles(samples).p99
    if lower is not None:
        assert lower <= p99
    if upper is not None:
        assert p99 <= upper


def test_p99_bounds_are_none_below_459_samples_for_the_upper_side() -> None:
    lower, upper = p99_bounds(np.arange(458.0))
    assert upper is None
    assert lower is not None


def test_upper_bound_covers_the_true_p99_of_an_exponential_at_99_percent() -> None:
    rng = np.random.default_rng(20240601)
    true_p99 = -math.log(0.01)
    runs = rng.exponential(size=(2000, 1000))
    uppers = np.array([p99_bounds(row)[1] for row in runs], dtype=np.float64)
    coverage = float(np.mean(uppers >= true_p99))
    # Nominal >= 99%; 98.5% leaves ~2 binomial standard deviations of slack for 2,000 runs.
    assert coverage >= 0.985
    # And the bound is not trivially wide: on average within 35% of the true quantile.
    assert float(np.mean(uppers)) < 1.35 * true_p99


def test_lower_bound_covers_the_true_p99_from_below_at_99_percent() -> None:
    rng = np.random.default_rng(7)
    true_p99 = -math.log(0.01)
    lowers = np.array([p99_bounds(row)[0] for row in rng.exponential(size=(2000, 1000))])
    assert float(np.mean(lowers <= true_p99)) >= 0.985
    assert float(np.mean(lowers)) > 0.75 * true_p99


# --- decisions -----------------------------------------------------------------------------


def test_tiny_latencies_are_insufficient_below_min_samples() -> None:
    assert decide_p99(np.full(661, 0.001), budget_ms=100.0) == "insufficient"


def test_fast_model_passes_once_it_has_enough_samples() -> None:
    samples = np.random.default_rng(1).exponential(scale=1.0, size=2000)
    assert decide_p99(samples, budget_ms=10.0) == "pass"


def test_slow_model_fails_when_the_lower_bound_is_over_budget() -> None:
    samples = np.random.default_rng(2).exponential(scale=1.0, size=2000)
    assert decide_p99(samples, budget_ms=2.0) == "fail"


def test_bounds_straddling_the_budget_are_insufficient() -> None:
    samples = np.random.default_rng(3).exponential(scale=1.0, size=1000)
    lower, upper = p99_bounds(samples)
    assert lower is not None and upper is not None and lower < upper
    assert decide_p99(samples, budget_ms=(lower + upper) / 2) == "insufficient"


def test_one_slow_outlier_in_662_samples_still_passes() -> None:
    samples = np.concatenate([np.full(661, 5.0), [500.0]])
    assert decide_p99(samples, budget_ms=10.0) == "pass"
    two = np.concatenate([np.full(660, 5.0), [500.0, 500.0]])
    assert decide_p99(two, budget_ms=10.0) == "insufficient"


def test_decide_rejects_a_non_finite_budget() -> None:
    with pytest.raises(ValueError, match="budget_ms"):
        decide_p99(np.ones(1000), budget_ms=float("nan"))


# --- adaptive ------------------------------------------------------------------------------


def test_adaptive_decision_matches_decide_p99_on_the_same_samples() -> None:
    rng = np.random.default_rng(4)
    adaptive = AdaptiveP99(budget_ms=4.8)
    everything: list[float] = []
    for _ in range(40):
        chunk = rng.exponential(size=50)
        everything.extend(chunk.tolist())
        got = adaptive.add(chunk)
        assert got == adaptive.decision == decide_p99(everything, budget_ms=4.8)
        assert adaptive.bounds == p99_bounds(everything)
    assert adaptive.n == len(everything) == 2000
    assert adaptive.percentiles() == percentiles(everything)
    assert adaptive.samples.tolist() == everything


def test_adaptive_stops_early_for_a_clearly_fast_model() -> None:
    rng = np.random.default_rng(5)
    adaptive = AdaptiveP99(budget_ms=50.0)
    while adaptive.decision == "insufficient" and adaptive.n < 20_000:
        adaptive.add(rng.exponential(size=100))
    assert adaptive.decision == "pass"
    assert adaptive.n == 700  # the first chunk boundary at or after min_samples=662


def test_adaptive_with_a_schedule_looks_only_at_scheduled_sizes() -> None:
    schedule = look_schedule(662, 20_000)
    assert schedule[0] == 662 and schedule[-1] == 20_000 and len(schedule) == 10
    adaptive = AdaptiveP99(budget_ms=50.0, schedule=schedule)
    assert adaptive.look_confidence == pytest.approx(1 - 0.99**662)  # the first look's share
    rng = np.random.default_rng(6)
    adaptive.add(rng.exponential(size=900))
    assert adaptive.look_n == 900  # crossed 662
    adaptive.add(rng.exponential(size=50))
    assert adaptive.look_n == 900  # 950 < 993: no new look
    adaptive.add(rng.exponential(size=50))
    assert adaptive.look_n == 1000
    assert adaptive.decision == "pass"


def test_adaptive_with_a_schedule_rarely_passes_a_model_exactly_at_budget() -> None:
    rng = np.random.default_rng(8)
    budget = -math.log(0.01)  # the true p99 of the unit exponential
    schedule = look_schedule(662, 5000)
    passes = 0
    for _ in range(200):
        adaptive = AdaptiveP99(budget_ms=budget, schedule=schedule)
        while adaptive.decision == "insufficient" and adaptive.n < 5000:
            adaptive.add(rng.exponential(size=100))
        passes += adaptive.decision == "pass"
    assert passes <= 6  # at most 1% expected; 3% leaves room for the binomial spread of 200 runs


def test_adaptive_ignores_empty_chunks_and_rejects_nan() -> None:
    adaptive = AdaptiveP99(budget_ms=1.0)
    assert adaptive.add([]) == "insufficient"
    assert adaptive.n == 0
    with pytest.raises(ValueError, match="non-finite"):
        adaptive.add([1.0, float("nan")])
    assert adaptive.n == 0


def test_stats_imports_only_numpy_and_the_standard_library() -> None:
    import subprocess
    import sys

    code = (
        "import sys, qualify.measure.stats; "
        "bad = [m for m in ('pydantic', 'pandas', 'scipy', 'onnxruntime') if m in sys.modules]; "
        "print(bad)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_all_is_complete() -> None:
    public = {n for n in vars(stats) if not n.startswith("_")} - {
        "annotations",
        "math",
        "np",
        "npt",
        "Sequence",
        "dataclass",
        "lru_cache",
        "Literal",
        "order_rank",
        "p99_outcome",
    }
    assert public == set(stats.__all__)


def test_the_first_look_at_662_can_pass_as_well_as_fail() -> None:
    """With the default 10 looks an equal split gives each 0.1%, where a p99 upper bound needs
    688 samples: a first look at 662 could only fail. Its share is now what lets it decide."""
    schedule = look_schedule(662, 20_000)
    rng = np.random.default_rng(9)
    fast = AdaptiveP99(budget_ms=1000.0, schedule=schedule)
    fast.add(rng.exponential(20.0, size=662))  # p99 ~ 92 ms against a 1,000 ms budget
    assert (fast.look_n, fast.decision) == (662, "pass")
    assert fast.bounds[1] == pytest.approx(float(np.max(fast.samples)))  # the largest sample
    slow = AdaptiveP99(budget_ms=10.0, schedule=schedule)
    slow.add(rng.exponential(20.0, size=662))
    assert (slow.look_n, slow.decision) == (662, "fail")


def test_spending_keeps_the_whole_error_and_gives_the_first_look_what_it_needs() -> None:
    plan = spend_alpha(look_schedule(662, 20_000), 0.99)
    errors = [1 - c for c in plan.confidences]
    assert sum(errors) == pytest.approx(0.01)
    assert errors[0] == pytest.approx(0.99**662)
    assert quantile_bound_ranks(662, 0.99, plan.confidences[0])[1] == 662
    assert all(e == pytest.approx(errors[1]) for e in errors[1:])


def test_a_first_look_too_small_to_pass_moves_to_the_first_size_that_can() -> None:
    plan = spend_alpha(look_schedule(459, 20_000), 0.99)
    assert plan.looks[0] == 528  # 0.99**528 <= 0.5% < 0.99**527
    assert quantile_bound_ranks(528, 0.99, plan.confidences[0])[1] == 528
    assert sum(1 - c for c in plan.confidences) == pytest.approx(0.01)
    assert spend_alpha((700,), 0.99) == LookPlan((700,), (0.99,))


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 5000), st.integers(0, 30_000), st.sampled_from([0.9, 0.95, 0.99, 0.999]))
def test_spending_never_exceeds_the_error_and_every_first_look_can_decide(
    first: int, extra: int, confidence: float
) -> None:
    plan = spend_alpha(look_schedule(first, first + extra), confidence)
    assert sum(1 - c for c in plan.confidences) <= (1 - confidence) * (1 + 1e-9)
    assert list(plan.looks) == sorted(set(plan.looks)) and plan.looks[0] >= first
    assert quantile_bound_ranks(plan.looks[0], 0.99, plan.confidences[0])[1] is not None
