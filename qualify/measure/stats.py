"""Latency statistics: percentiles and distribution-free evidence about the p99.

Owns the percentile summary of a sample (`percentiles`), the binomial order-statistic
confidence bounds of a quantile (`quantile_bound_ranks`, `p99_bounds`), the p99 decision over
samples (`decide_p99`), its incremental form for the runner's adaptive sampling loop
(`AdaptiveP99`), paired ratios (`paired_ratio`) and how long that loop may sample
(`time_cap`). The rules these apply (which order statistic is a quantile, what a bound decides
against a budget) are `schemas.rules`, shared with the gates, the report and telemetry. Does
not time anything, read files or pick budgets: samples and budgets are arguments. Imported
inside the runner subprocess, so it imports only the standard library, numpy and
`schemas.rules` (itself standard library only).

More: docs/internals.md, ``qualify.measure.stats``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import numpy as np
import numpy.typing as npt

from schemas.rules import order_rank, p99_outcome

__all__ = [
    "AUTO_TIME_CAP_CEILING_S",
    "AUTO_TIME_CAP_FLOOR_S",
    "AdaptiveP99",
    "LookPlan",
    "P99Decision",
    "Percentiles",
    "RatioBounds",
    "decide_p99",
    "look_schedule",
    "p99_bounds",
    "paired_ratio",
    "percentiles",
    "quantile_bound_ranks",
    "rounds_for_median_bound",
    "spend_alpha",
    "time_cap",
]

P99Decision = Literal["pass", "fail", "insufficient"]
"""A p99 against a budget: pass (upper bound <= budget), fail (lower bound > budget), or not yet."""

_FloatArray = npt.NDArray[np.float64]
_Samples = Sequence[float] | npt.NDArray[np.floating] | npt.NDArray[np.integer]

# Relative slack when comparing a computed binomial tail with 1 - confidence: the tails are sums
# of exponentials with ~1e-12 relative error, and exact ties (n = 1 for the lower bound) must not
# flip on the last bit. 1e-9 is far below any difference that matters for a confidence level.
_TAIL_SLACK = 1e-9


@dataclass(frozen=True)
class Percentiles:
    """Summary of a latency sample, in the sample's unit (milliseconds in qualify).

    Every percentile is an observed sample (see `order_rank`), never an interpolation.
    """

    p50: float
    p90: float
    p99: float
    max: float
    mean: float
    min: float
    n: int


def _as_samples(samples_ms: _Samples) -> _FloatArray:
    arr = np.asarray(samples_ms, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"samples must be one-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError("samples are empty; at least one sample is needed")
    if not bool(np.isfinite(arr).all()):
        bad = int(np.count_nonzero(~np.isfinite(arr)))
        raise ValueError(f"samples contain {bad} non-finite value(s) (NaN or Inf)")
    return arr


def _check_unit_interval(name: str, value: float, low: float = 0.0) -> None:
    if not (low < value < 1.0):
        raise ValueError(f"{name} must be strictly between {low} and 1, got {value!r}")


def percentiles(samples_ms: _Samples) -> Percentiles:
    """p50, p90, p99, max, mean, min and n of a sample.

    Percentiles use the order statistic of `order_rank` (numpy's ``inverted_cdf`` method), so a
    reported p99 is a latency that was actually observed. With fewer than 100 samples the p99 is
    the maximum.

    Args:
        samples_ms: One-dimensional latencies, any order.

    Returns:
        The summary, as plain Python floats.

    Raises:
        ValueError: the sample is empty, not one-dimensional or holds NaN/Inf.
    """
    arr = np.sort(_as_samples(samples_ms))
    n = int(arr.size)

    def at(q: float) -> float:
        return float(arr[order_rank(n, q) - 1])

    return Percentiles(
        p50=at(0.50),
        p90=at(0.90),
        p99=at(0.99),
        max=float(arr[-1]),
        mean=float(np.mean(arr)),
        min=float(arr[0]),
        n=n,
    )


def _binomial_pmf(n: int, q: float) -> _FloatArray:
    """P(Binomial(n, q) = k) for k = 0..n, computed in log space (no overflow, no scipy)."""
    k = np.arange(n + 1, dtype=np.float64)
    # log C(n, k) = sum_{j=1..k} log((n - j + 1) / j): one O(n) cumulative sum.
    j = k[1:]
    log_comb = np.concatenate(([0.0], np.cumsum(np.log(n - j + 1.0) - np.log(j))))
    log_pmf = log_comb + k * math.log(q) + (n - k) * math.log1p(-q)
    pmf: _FloatArray = np.exp(log_pmf)
    return pmf


@lru_cache(maxsize=4096)
def quantile_bound_ranks(
    n: int, q: float = 0.99, confidence: float = 0.99
) -> tuple[int | None, int | None]:
    """1-based ranks of distribution-free one-sided confidence bounds of the q-quantile.

    ``upper`` is the smallest rank u with ``P(X_(u) >= true quantile) >= confidence``, that is
    ``P(Binomial(n, q) <= u - 1) >= confidence``. ``lower`` is the largest rank l with
    ``P(X_(l) <= true quantile) >= confidence``, that is ``P(Binomial(n, q) >= l) >= confidence``.
    Each holds for any distribution (continuous or not). For q = 0.99 at 99% confidence the first
    upper bound appears at n = 459 (the maximum) and rank n - 1 at n = 662, as in MLPerf LoadGen.

    O(n) in numpy and cached per (n, q, confidence) (its cost: docs/measurements.md).

    Args:
        n: Sample size, >= 1.
        q: The quantile, 0 < q < 1.
        confidence: One-sided confidence of each bound, 0.5 < confidence < 1 (above one half so
            that ``lower <= order_rank(n, q) <= upper``).

    Returns:
        ``(lower, upper)``; either is None when n is too small for that side.

    Raises:
        ValueError: n < 1, q or confidence out of range.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    _check_unit_interval("q", q)
    _check_unit_interval("confidence", confidence, low=0.5)
    alpha = (1.0 - confidence) * (1.0 + _TAIL_SLACK)
    pmf = _binomial_pmf(n, q)
    # Sum each tail from its own end so small tails are not lost to cancellation.
    cdf = np.cumsum(pmf)  # cdf[k] = P(B <= k)
    survival = np.cumsum(pmf[::-1])[::-1]  # survival[k] = P(B >= k)

    # upper: smallest u in 1..n with P(B >= u) <= alpha (survival is non-increasing).
    ok_upper = np.flatnonzero(survival[1:] <= alpha)
    upper = int(ok_upper[0]) + 1 if ok_upper.size else None
    # lower: largest l in 1..n with P(B <= l - 1) <= alpha (cdf is non-decreasing).
    ok_lower = np.flatnonzero(cdf[:n] <= alpha)
    lower = int(ok_lower[-1]) + 1 if ok_lower.size else None
    return lower, upper


def _values_at_ranks(
    arr: _FloatArray, ranks: tuple[int | None, int | None]
) -> tuple[float | None, float | None]:
    wanted = sorted({r - 1 for r in ranks if r is not None})
    if not wanted:
        return None, None
    part = np.partition(arr, wanted)
    lower, upper = ranks
    return (
        float(part[lower - 1]) if lower is not None else None,
        float(part[upper - 1]) if upper is not None else None,
    )


def p99_bounds(
    samples_ms: _Samples, confidence: float = 0.99, q: float = 0.99
) -> tuple[float | None, float | None]:
    """Distribution-free one-sided confidence bounds of the q-quantile (p99 by default).

    Args:
        samples_ms: One-dimensional latencies, any order.
        confidence: One-sided confidence of each bound, 0.5 < confidence < 1.
        q: The quantile, 0 < q < 1.

    Returns:
        ``(lower, upper)`` sample values from `quantile_bound_ranks`; None where n is too small.

    Raises:
        ValueError: the sample is empty, not one-dimensional or holds NaN/Inf; q or confidence
            out of range.
    """
    arr = _as_samples(samples_ms)
    return _values_at_ranks(arr, quantile_bound_ranks(int(arr.size), q, confidence))


def _decide(
    n: int,
    bounds: tuple[float | None, float | None],
    budget_ms: float,
    min_samples: int,
) -> P99Decision:
    if n < min_samples:
        return "insufficient"
    outcome = p99_outcome(*bounds, budget_ms)
    return "insufficient" if outcome == "undecided" else outcome


def _check_decision_args(budget_ms: float, min_samples: int) -> None:
    if not math.isfinite(budget_ms):
        raise ValueError(f"budget_ms must be a finite number, got {budget_ms!r}")
    if min_samples < 1:
        raise ValueError(f"min_samples must be >= 1, got {min_samples}")


def decide_p99(
    samples_ms: _Samples,
    budget_ms: float,
    *,
    confidence: float = 0.99,
    min_samples: int = 662,
    q: float = 0.99,
) -> P99Decision:
    """Decide a p99 (or any q-quantile) against a budget from the confidence bounds.

    ``"pass"`` when the upper bound is <= budget, ``"fail"`` when the lower bound is > budget,
    ``"insufficient"`` when fewer than ``min_samples`` samples were taken (whatever their values)
    or the bounds straddle the budget. Both bounds use the same one-sided ``confidence``.

    Args:
        samples_ms: One-dimensional latencies, any order.
        budget_ms: The budget, in the samples' unit.
        confidence: One-sided confidence of each bound, 0.5 < confidence < 1.
        min_samples: Fewest samples any decision is made on (662: LoadGen's minimum for p99 at
            99% confidence with one sample over the bound).
        q: The quantile, 0 < q < 1.

    Returns:
        ``"pass"``, ``"fail"`` or ``"insufficient"``.

    Raises:
        ValueError: bad samples, a non-finite budget, min_samples < 1, q or confidence out of
            range.
    """
    _check_decision_args(budget_ms, min_samples)
    arr = _as_samples(samples_ms)
    bounds = _values_at_ranks(arr, quantile_bound_ranks(int(arr.size), q, confidence))
    return _decide(int(arr.size), bounds, budget_ms, min_samples)


def look_schedule(min_samples: int, max_samples: int, growth: float = 1.5) -> tuple[int, ...]:
    """Sample sizes at which `AdaptiveP99` looks: geometric from min_samples, ending at max_samples.

    Few, geometrically spaced looks keep the Bonferroni correction small: 662 to 20,000 with
    growth 1.5 is 10 looks (662, 993, 1490, ..., 16977, 20000).

    Args:
        min_samples: The first look, >= 1.
        max_samples: The last look, >= min_samples.
        growth: Ratio between consecutive looks, > 1.

    Returns:
        Strictly increasing sample sizes.

    Raises:
        ValueError: arguments out of range.
    """
    if min_samples < 1 or max_samples < min_samples:
        raise ValueError(
            f"need 1 <= min_samples <= max_samples, got {min_samples} and {max_samples}"
        )
    if not growth > 1.0:
        raise ValueError(f"growth must be > 1, got {growth!r}")
    looks = [min_samples]
    while looks[-1] < max_samples:
        looks.append(min(max(math.ceil(looks[-1] * growth), looks[-1] + 1), max_samples))
    return tuple(looks)


@dataclass(frozen=True)
class LookPlan:
    """Where a sequential p99 test looks and at what confidence (`spend_alpha`)."""

    looks: tuple[int, ...]
    """Sample sizes of the looks, strictly increasing."""
    confidences: tuple[float, ...]
    """One-sided confidence of each look's bounds; their error shares sum to at most
    ``1 - confidence``."""


def spend_alpha(schedule: Sequence[int], confidence: float = 0.99, q: float = 0.99) -> LookPlan:
    """Share the error ``1 - confidence`` out over the looks so that the first can decide both
    ways.

    A q-quantile's upper bound exists at n samples only when the look's error share is at least
    ``q ** n`` (the largest sample is then the bound). An equal (Bonferroni) split gives each of
    the default 10 looks 0.1%, where a p99 needs 688 samples: a first look at 662 could fail a
    p99 but never pass one. So the first look gets ``q ** n`` when the equal share is smaller (at
    662 and 99%: 0.129%, its bound the largest sample; still a distribution-free bound), never
    more than half of the whole error; the later looks share what is left equally. Where even
    half does not let the first look decide (a small first look or a high confidence), it moves
    to the smallest n at which half does (459 at 99% becomes 528; a single look, where the
    whole error does). Any split whose shares sum to
    the error keeps the chance of a wrong pass, and of a wrong fail, over all looks within it
    (the union bound).

    Args:
        schedule: The planned looks (`look_schedule`), each >= 1.
        confidence: The whole sequential test's one-sided confidence, 0.5 < confidence < 1.
        q: The quantile, 0 < q < 1.

    Returns:
        The looks (the first possibly moved later; none dropped but those it passed) and each
        one's confidence.

    Raises:
        ValueError: an empty or non-positive schedule, q or confidence out of range.
    """
    _check_unit_interval("q", q)
    _check_unit_interval("confidence", confidence, low=0.5)
    looks = sorted({int(x) for x in schedule})
    if not looks or looks[0] < 1:
        raise ValueError(f"schedule must hold sample sizes >= 1, got {list(schedule)}")
    alpha = 1.0 - confidence
    most = alpha if len(looks) == 1 else alpha / 2.0
    if q ** looks[0] > most:  # not even that lets it decide: look first where it does
        first = math.ceil(math.log(most) / math.log(q) - 1e-9)
        looks = [first, *(n for n in looks if n > first)]
    if len(looks) == 1:
        return LookPlan((looks[0],), (confidence,))
    share = max(q ** looks[0], alpha / len(looks))
    rest = (alpha - share) / (len(looks) - 1)
    return LookPlan(tuple(looks), (1.0 - share, *(1.0 - rest for _ in looks[1:])))


class AdaptiveP99:
    """Incremental `decide_p99` for sampling until the evidence decides.

    Feed chunks with `add`; read `decision` after each. Samples live in one growing buffer
    (amortised doubling); bounds are computed with an O(n) partition, not a full sort.

    Looking after every chunk and stopping at the first decision is a sequential test, and each
    look is another chance to be wrong. Measured with exponential latencies whose true p99 equals
    the budget, looking every 50 samples from 662 to 20,000 declared ``pass`` in 9% of 400 runs
    (every 200 samples: 5%), not the nominal 1%. Pass ``schedule`` (see `look_schedule`) to
    bound that: the decision is then re-evaluated only when n reaches the next scheduled size,
    and each look uses its share of ``1 - confidence`` (`spend_alpha`: the first look gets
    what lets it pass as well as fail, the others an equal split of the rest), so the chance of
    any wrong pass (or any wrong fail) over all looks is at most ``1 - confidence``. Without a
    schedule, every `add` is a look at the nominal confidence.

    `decision` and `bounds` are those of the latest look; ``look_n`` is its sample size.

    Raises (constructor):
        ValueError: a non-finite budget, min_samples < 1, q or confidence out of range, an empty
            or non-positive schedule.
    """

    def __init__(
        self,
        budget_ms: float,
        *,
        confidence: float = 0.99,
        min_samples: int = 662,
        q: float = 0.99,
        schedule: Sequence[int] | None = None,
    ) -> None:
        _check_decision_args(budget_ms, min_samples)
        _check_unit_interval("q", q)
        _check_unit_interval("confidence", confidence, low=0.5)
        self.budget_ms = float(budget_ms)
        self.confidence = float(confidence)
        self.min_samples = int(min_samples)
        self.q = float(q)
        self.schedule: tuple[int, ...] | None = None
        self._confidences: tuple[float, ...] = ()
        self.look_confidence = self.confidence
        """The confidence of the latest look's bounds (before any: the first look's)."""
        if schedule is not None:
            plan = spend_alpha(schedule, self.confidence, self.q)
            self.schedule, self._confidences = plan.looks, plan.confidences
            self.look_confidence = plan.confidences[0]
        self._next_look = 0
        self._buf: _FloatArray = np.empty(1024, dtype=np.float64)
        self._n = 0
        self._look_n = 0
        self._bounds: tuple[float | None, float | None] = (None, None)
        self._decision: P99Decision = "insufficient"

    @property
    def n(self) -> int:
        """Samples added so far."""
        return self._n

    @property
    def look_n(self) -> int:
        """Sample size at the latest look (0 before the first)."""
        return self._look_n

    @property
    def samples(self) -> _FloatArray:
        """A copy of the samples added so far, in the order added."""
        return self._buf[: self._n].copy()

    @property
    def bounds(self) -> tuple[float | None, float | None]:
        """``(lower, upper)`` bounds at ``look_confidence`` as of the latest look."""
        return self._bounds

    @property
    def decision(self) -> P99Decision:
        """The decision as of the latest look (see `decide_p99`); insufficient before one."""
        return self._decision

    def add(self, samples_ms: _Samples) -> P99Decision:
        """Append a chunk of samples, look if it is time, and return the decision.

        Args:
            samples_ms: One-dimensional latencies; an empty chunk is allowed and changes nothing.

        Returns:
            The decision as of the latest look.

        Raises:
            ValueError: the chunk is not one-dimensional or holds NaN/Inf.
        """
        chunk = np.asarray(samples_ms, dtype=np.float64)
        if chunk.ndim == 1 and chunk.size == 0:
            return self._decision
        chunk = _as_samples(chunk)
        need = self._n + chunk.size
        if need > self._buf.size:
            grown = np.empty(max(need, 2 * self._buf.size), dtype=np.float64)
            grown[: self._n] = self._buf[: self._n]
            self._buf = grown
        self._buf[self._n : need] = chunk
        self._n = need
        if self._due():
            self._look()
        return self._decision

    def _due(self) -> bool:
        if self.schedule is None:
            return True
        due = False
        while self._next_look < len(self.schedule) and self._n >= self.schedule[self._next_look]:
            # Looks passed over at once (a big chunk) are not taken: only the last one's share
            # is spent, so the error stays within its whole.
            self.look_confidence = self._confidences[self._next_look]
            self._next_look += 1
            due = True
        return due

    def _look(self) -> None:
        ranks = quantile_bound_ranks(self._n, self.q, self.look_confidence)
        self._bounds = _values_at_ranks(self._buf[: self._n], ranks)
        self._look_n = self._n
        self._decision = _decide(self._n, self._bounds, self.budget_ms, self.min_samples)

    def percentiles(self) -> Percentiles:
        """`percentiles` of all samples so far.

        Raises:
            ValueError: no samples yet.
        """
        return percentiles(self._buf[: self._n])


@dataclass(frozen=True)
class RatioBounds:
    """Median of paired per-round ratios with distribution-free bounds (see `paired_ratio`)."""

    rounds: int
    ratio: float | None
    lower: float | None
    upper: float | None


def rounds_for_median_bound(confidence: float) -> int:
    """Fewest paired rounds for which `paired_ratio` has both bounds at ``confidence``: the
    smallest n with ``0.5 ** n <= 1 - confidence`` (then the extreme ratios are the bounds)."""
    _check_unit_interval("confidence", confidence, low=0.5)
    return max(1, math.ceil(math.log(1.0 - confidence) / math.log(0.5) - 1e-9))


def paired_ratio(
    candidate: Sequence[float], baseline: Sequence[float], confidence: float
) -> RatioBounds:
    """How much slower a candidate is than a baseline measured in the same rounds.

    Each round gives one ratio ``candidate[i] / baseline[i]`` (a round's p50, or its p99); the
    result is their median with one-sided distribution-free confidence bounds of the median
    (`quantile_bound_ranks` at q = 0.5). Rounds interleave the two under the same machine load,
    so each ratio compares like with like; the median keeps one disturbed round from deciding.

    Args:
        candidate: The candidate's figure per round.
        baseline: The baseline's figure in the same rounds (same length, all > 0).
        confidence: One-sided confidence of each bound.

    Returns:
        The bounds; ``lower``/``upper`` are None with too few rounds, and everything is None
        without any.

    Raises:
        ValueError: lengths differ, or a figure is not finite and positive.
    """
    if len(candidate) != len(baseline):
        raise ValueError(f"{len(candidate)} candidate rounds but {len(baseline)} baseline rounds")
    c = np.asarray(candidate, dtype=np.float64)
    b = np.asarray(baseline, dtype=np.float64)
    if not (np.all(np.isfinite(c)) and np.all(np.isfinite(b)) and np.all(c > 0) and np.all(b > 0)):
        raise ValueError("every per-round figure must be finite and positive")
    if c.size == 0:
        return RatioBounds(0, None, None, None)
    ratios = c / b
    lower, upper = _values_at_ranks(ratios, quantile_bound_ranks(int(ratios.size), 0.5, confidence))
    return RatioBounds(int(ratios.size), float(np.median(ratios)), lower, upper)


AUTO_TIME_CAP_FLOOR_S = 20.0
"""The adaptive time cap's least value: what a fast model gets (it decides long before)."""
AUTO_TIME_CAP_CEILING_S = 300.0
"""The adaptive time cap's greatest value, so that a very slow model cannot stall a run; past
it the verdict is ``insufficient`` and says which ``time_cap_s`` would decide it."""
_AUTO_TIME_CAP_SAMPLES = 4
"""The adaptive cap allows this many times ``min_samples`` at the measured rate: a p99 near its
budget needs more than the minimum, and four times the samples halve the bound's rank width."""


def time_cap(configured: float | None, min_samples: int, samples_per_s: float | None) -> float:
    """The sampling time cap of one artifact at one latency config.

    Args:
        configured: ``workload.time_cap_s``; when set it is the cap, whatever the model.
        min_samples: ``workload.min_samples``.
        samples_per_s: The rate measured in the first round (or the warm-up); None, or not
            positive, when nothing was measured yet.

    Returns:
        The configured cap; else the time for ``4 * min_samples`` at the measured rate, kept
        between `AUTO_TIME_CAP_FLOOR_S` and `AUTO_TIME_CAP_CEILING_S` (the floor without a rate).
    """
    if configured is not None:
        return float(configured)
    if samples_per_s is None or not samples_per_s > 0:
        return AUTO_TIME_CAP_FLOOR_S
    wanted = _AUTO_TIME_CAP_SAMPLES * min_samples / samples_per_s
    return min(AUTO_TIME_CAP_CEILING_S, max(AUTO_TIME_CAP_FLOOR_S, wanted))
