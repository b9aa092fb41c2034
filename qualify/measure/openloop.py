"""Open-loop request rates: Poisson arrivals, latency from the scheduled arrival, and the highest
rate whose p99 meets the class's budget.

Owns the search that follows a run's interleaved rounds when ``workload.open_loop`` is set: the
ceiling (back to back), then a bisection of Poisson rates below it, the artifacts stepping in
turn. Does not serve requests (the child's ``rate`` round, `qualify.measure.arrivals`) or gate
the result (``manifest.gates``). How and why: docs/project-file.md ("Request rates") and
docs/internals.md, ``qualify.measure.openloop``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, localcontext

import numpy as np

from qualify.measure.runner import RoundWorker
from qualify.measure.stats import p99_bounds, percentiles
from schemas.cell import OpenLoopResult, RateProbe
from schemas.project import OpenLoop

__all__ = [
    "CEILING_S",
    "STABLE_BUDGETS",
    "RateSearch",
    "arrivals",
    "md1_max_rate",
    "md1_sojourn_quantile",
    "md1_wait_cdf",
    "open_loop",
    "rate_probe",
]

CEILING_S = 0.5
"""Seconds of back-to-back serving that measure the closed-loop rate (the search's ceiling)."""


def md1_wait_cdf(t: float, rate: float, service: float) -> float:
    """P(W <= t) for the waiting time W of an M/D/1 queue (first come, first served).

    Erlang's formula: ``(1 - rho) * sum_{k=0}^{floor(t/D)} (lam*(k*D - t))^k / k! *
    exp(-lam*(k*D - t))``. Its terms alternate and grow like ``exp(lam*t)``, so it is summed in
    decimal arithmetic with enough digits for the cancellation.

    Args:
        t: Waiting time, seconds (>= 0).
        rate: Arrival rate lam, per second (> 0).
        service: The fixed service time D, seconds (> 0).
    """
    rho = rate * service
    if rho >= 1.0:
        return 0.0
    if t < 0:
        return 0.0
    n = int(t // service)
    with localcontext() as ctx:
        ctx.prec = 40 + int(rate * t / 2.0)
        lam, d, tt = Decimal(rate), Decimal(service), Decimal(t)
        total = Decimal(0)
        fact = Decimal(1)
        for k in range(n + 1):
            if k:
                fact *= k
            x = lam * (k * d - tt)
            total += (x**k if k else Decimal(1)) / fact * (-x).exp()
        value = float((1 - Decimal(rho)) * total)
    return min(1.0, max(0.0, value))


def md1_sojourn_quantile(rate: float, service: float, q: float = 0.99) -> float:
    """The ``q``-quantile of an M/D/1 queue's time in system (waiting plus ``service``), seconds;
    infinite at or above full load (``rate * service >= 1``)."""
    rho = rate * service
    if rho >= 1.0:
        return math.inf
    if md1_wait_cdf(0.0, rate, service) >= q:  # P(W = 0) = 1 - rho already covers q
        return service
    lo, hi = 0.0, service
    while md1_wait_cdf(hi, rate, service) < q:
        lo, hi = hi, hi * 2
        if hi > 1e4 * service:
            return math.inf
    for _ in range(60):
        mid = (lo + hi) / 2
        if md1_wait_cdf(mid, rate, service) >= q:
            hi = mid
        else:
            lo = mid
        if hi - lo < 1e-6 * service:
            break
    return hi + service


def md1_max_rate(service: float, budget: float, q: float = 0.99) -> float:
    """The highest arrival rate (per second) at which an M/D/1 queue's ``q``-quantile time in
    system is within ``budget`` seconds; 0 when the service time alone exceeds it."""
    if service > budget:
        return 0.0
    lo, hi = 0.0, 1.0 / service
    for _ in range(50):
        mid = (lo + hi) / 2
        if md1_sojourn_quantile(mid, service, q) <= budget:
            lo = mid
        else:
            hi = mid
    return lo


def rate_probe(
    rate: float, reply: dict[str, object], budget_ms: float, confidence: float
) -> RateProbe:
    """A probed rate from the worker's reply (latencies and service times in ns)."""
    latency = np.asarray(reply["samples_ns"], dtype=np.float64) / 1e6
    service = np.asarray(reply["service_ns"], dtype=np.float64) / 1e6
    pct = percentiles(latency)
    lower, upper = p99_bounds(latency, confidence)
    duration = float(reply["duration_s"])  # type: ignore[arg-type]
    return RateProbe(
        rate_rps=rate,
        arrivals=int(latency.size),
        achieved_rps=latency.size / duration if duration > 0 else 0.0,
        p50_ms=float(pct.p50),
        p99_ms=float(pct.p99),
        p99_lower_ms=lower,
        p99_upper_ms=upper,
        service_p50_ms=float(np.median(service)),
        met=float(pct.p99) <= budget_ms,
    )


@dataclass
class RateSearch:
    """One artifact's bisection over request rates between zero and ``ceiling``: the rate known
    to meet the budget (``lo``) and the lowest known not to (``hi``)."""

    ceiling: float
    lo: float = 0.0
    hi: float = 0.0
    probes: list[RateProbe] = field(default_factory=list)
    best: RateProbe | None = None

    def __post_init__(self) -> None:
        self.hi = self.ceiling

    def next_rate(self) -> float:
        """The rate to probe next: halfway between what met the budget and what did not."""
        return (self.lo + self.hi) / 2

    def record(self, probe: RateProbe) -> None:
        """Narrow the interval by a probe's verdict."""
        self.probes.append(probe)
        if probe.met:
            self.lo = probe.rate_rps
            if self.best is None or probe.rate_rps > self.best.rate_rps:
                self.best = probe
        else:
            self.hi = probe.rate_rps


STABLE_BUDGETS = 50
"""A probe lasts at least this many p99 budgets: at a rate 2% beyond what the servers sustain,
the queue then grows by a whole budget before it ends, and the p99 says so."""


def arrivals(rate: float, spec: OpenLoop, budget_ms: float) -> int:
    """Requests in a probe at ``rate``: ``probe_s`` (at least `STABLE_BUDGETS` budgets) of
    arrivals, at least 100 and at most ``max_arrivals``."""
    seconds = max(spec.probe_s, STABLE_BUDGETS * budget_ms / 1000.0)
    return max(100, min(spec.max_arrivals, math.ceil(rate * seconds)))


def _ceiling(worker: RoundWorker, servers: int, max_samples: int) -> float | None:
    reply = worker.round(
        {
            "batch_size": 1,
            "concurrency": servers,
            "warmup": 10,
            "time_s": CEILING_S,
            "max_samples": max_samples,
        }
    )
    if reply is None:
        return None
    served, spent = len(reply["samples_ns"]), float(reply["duration_s"])
    return served / spent if served and spent > 0 else None


def open_loop(
    workers: Sequence[RoundWorker | None],
    spec: OpenLoop,
    budget_ms: float,
    *,
    confidence: float,
    max_samples: int,
    on_progress: Callable[[str], None] | None = None,
) -> list[OpenLoopResult | None]:
    """Search every live worker's highest rate within ``budget_ms``, the searches in turn.

    Returns:
        Per worker (in order), its search; None for a worker that was not alive.
    """
    searches: dict[int, RateSearch] = {}
    found: list[OpenLoopResult | None] = [None] * len(workers)
    ended: dict[int, str] = {}
    for i, worker in enumerate(workers):
        if worker is None or not worker.alive:
            continue
        ceiling = _ceiling(worker, spec.servers, max_samples)
        if ceiling is None:
            ended[i] = "the worker ended before its closed-loop rate was measured"
            found[i] = _result(spec, budget_ms, None, None, ended[i])
            continue
        searches[i] = RateSearch(ceiling=ceiling)
    for step in range(spec.probes):
        for i, search in searches.items():
            worker = workers[i]
            if i in ended or worker is None or not worker.alive:
                ended.setdefault(i, "the worker ended during the search")
                continue
            rate = search.next_rate()
            reply = worker.round(
                {
                    "batch_size": 1,
                    "concurrency": spec.servers,
                    "rate": rate,
                    "arrivals": arrivals(rate, spec, budget_ms),
                    "servers": spec.servers,
                    "seed": spec.seed + step,
                    "wait": spec.wait,
                }
            )
            if reply is None:
                ended[i] = "the worker ended during the search"
                continue
            search.record(rate_probe(rate, reply, budget_ms, confidence))
        if on_progress is not None:
            on_progress(f"open loop: probe {step + 1} of {spec.probes} done")
    for i, search in searches.items():
        missing = ended.get(i)
        if search.best is None and missing is None:
            lowest = min(p.rate_rps for p in search.probes)
            missing = (
                f"no probed rate met p99 <= {budget_ms:g} ms, down to {lowest:,.3g} requests/s"
            )
        found[i] = _result(spec, budget_ms, search.ceiling, search, missing)
    return found


def _result(
    spec: OpenLoop,
    budget_ms: float,
    ceiling: float | None,
    search: RateSearch | None,
    missing: str | None,
) -> OpenLoopResult:
    best = search.best if search is not None else None
    return OpenLoopResult(
        servers=spec.servers,
        budget_ms=budget_ms,
        closed_loop_rps=ceiling,
        max_rate_rps=best.rate_rps if best is not None else None,
        probes=search.probes if search is not None else [],
        missing=None if best is not None else missing,
    )
