"""The qualification gates: one table (`GATES`) that the runner, the policy and the report iterate.

Owns the rule "what makes a cell pass": parity, actual placement on the expected provider, the
p99 confidence bound against the budget, not being measurably slower than the baseline in the
interleaved A/B (``max_slowdown``), peak memory and cold init. Each `Gate` names the reason
codes it may give (their meanings are `schemas.reasons`), the cell fields it reads as evidence,
and its check: a pure function of the cell and the class that returns a `Finding`.

More: docs/internals.md, ``manifest.gates``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from schemas.cell import Cell, LatencyResult, Reason
from schemas.project import HostClass
from schemas.rules import fallback_count, p99_outcome, slower_than

__all__ = [
    "GATES",
    "Check",
    "Finding",
    "Gate",
    "GateOutcome",
    "assess",
    "class_checks",
    "gate_of",
    "judge",
    "judge_with",
]

GateOutcome = Literal["pass", "fail", "undecided", "off"]
"""One gate on one cell: passed, failed, could not be decided on this evidence, or not configured
(a budget that is not set)."""


@dataclass(frozen=True)
class Finding:
    """What one gate found on one cell: its outcome and, unless it passed, why."""

    outcome: GateOutcome
    reasons: tuple[Reason, ...] = ()


Check = Callable[[Cell, HostClass], Finding]
"""A gate's check: its finding on a cell under a class."""


@dataclass(frozen=True)
class Gate:
    """One row of the gates table."""

    name: str
    """Short name, as the report and the README show it."""
    meaning: str
    """What it requires, in one sentence."""
    evidence: str
    """The cell fields it reads."""
    codes: tuple[str, ...]
    """The reason codes it may give; each belongs to exactly one gate."""
    check: Check
    """The check: pure, of the cell and its class."""
    budget: str | None = None
    """The `Budgets` field that turns the gate on: left unset, the gate is off on every cell of
    the class (None: no budget does)."""


def _fmt(ms: float) -> str:
    return f"{ms:.3g} ms" if ms < 100 else f"{ms:.0f} ms"


def _more_evidence(samples: int, duration_s: float, stopped: str) -> str:
    """What would decide it: the samples and seconds, and the setting that gives them. A p99
    that sits near the budget needs more samples the nearer it is; four times the samples
    halves the width of the bound's rank interval, so that is the step proposed."""
    want = max(4 * samples, 662)
    rate = samples / duration_s if duration_s > 0 else None
    if stopped == "max_samples":
        return f"raise workload.max_samples to {want} or more"
    if rate is None:
        return f"allow about {want} samples (workload.time_cap_s, workload.max_samples)"
    seconds = want / rate
    return (
        f"sampling stopped at the time cap after {duration_s:.3g} s ({rate:,.0f} samples/s); "
        f"about {want} samples would take {seconds:.3g} s: set workload.time_cap_s to "
        f"{max(1, round(seconds * 1.2))} (and max_samples >= {want})"
    )


_PASS = Finding("pass")
_OFF = Finding("off")
"""The findings without reasons, made once: a fleet's cells pass or skip most gates, and a
finding is immutable."""


def _failed(*reasons: Reason) -> Finding:
    return Finding("fail", reasons)


def _undecided(code: str, message: str) -> Finding:
    return Finding("undecided", (Reason(code=code, message=message),))


def _parity(cell: Cell, host_class: HostClass) -> Finding:
    if cell.role != "candidate":
        return _OFF
    if cell.parity is None:
        known = tuple(r for r in cell.reasons if r.code in ("baseline_failed", "emulation_failed"))
        if known:
            return Finding("undecided", known)
        return _undecided("baseline_failed", "no parity evidence against the baseline")
    if cell.parity.passed:
        return _PASS
    worst = "; ".join(
        f"{o.name}: {', '.join(o.failures)}" for o in cell.parity.outputs if not o.passed
    )
    return _failed(Reason(code="parity_failed", message=f"parity failed: {worst}"))


def _placement(cell: Cell, host_class: HostClass) -> Finding:
    placement = cell.placement
    if placement is None:
        return _undecided(
            "expected_provider_missing",
            "node placement was not recorded (this onnxruntime does not report it)",
        )
    provider = host_class.provider
    expected = provider.expected
    nodes = placement.nodes_per_provider
    allowance = provider.fallback_allowance
    if fallback_count(nodes, expected) <= allowance and nodes.get(expected, 0) != 0:
        return _PASS  # most cells of a fleet: nothing to format
    return _misplaced(expected, allowance, placement.total_nodes, tuple(nodes.items()))


@lru_cache(maxsize=1024)
def _misplaced(
    expected: str, allowance: int, total_nodes: int, nodes: tuple[tuple[str, int], ...]
) -> Finding:
    """The placement gate's failure on these counts (in their recorded order, as the messages
    list them). Remembered: the classes of a fleet that share a provider setup place an
    artifact's nodes alike, so its failing cells repeat a few distinct placements."""
    per_provider = dict(nodes)
    found: list[Reason] = []
    if per_provider.get(expected, 0) == 0:
        others = ", ".join(f"{n} on {p}" for p, n in nodes)
        found.append(
            Reason(
                code="expected_provider_missing",
                message=f"{expected} executed no node ({others or 'no node recorded at all'})",
            )
        )
    fallback = fallback_count(per_provider, expected)
    if fallback > allowance:
        elsewhere = ", ".join(p for p, _ in nodes if p != expected)
        found.append(
            Reason(
                code="provider_fallback",
                message=f"{fallback} of {total_nodes} nodes ran on {elsewhere}, "
                f"expected {expected} (allowance {allowance})",
            )
        )
    return _failed(*found)


def gate_of(cell: Cell) -> LatencyResult | None:
    """``cell.gate_latency`` without its ``max`` over a one-config cell (most cells): the same
    result, for the policy that asks for it several times per cell of a fleet."""
    latency = cell.latency
    return latency[0] if len(latency) == 1 else cell.gate_latency


def _p99(cell: Cell, host_class: HostClass) -> Finding:
    gate = gate_of(cell)
    if gate is None:
        return _undecided("p99_insufficient", "no latency was measured")
    budget = host_class.budgets.p99_ms
    outcome = p99_outcome(gate.p99_lower_ms, gate.p99_upper_ms, budget)
    if outcome == "pass":
        return _PASS
    where = gate.config.label  # only for the message: a fleet's passing cells skip it
    if outcome == "fail" and gate.p99_lower_ms is not None:
        return _failed(
            Reason(
                code="p99_over_budget",
                message=f"p99 is at least {_fmt(gate.p99_lower_ms)} at "
                f"{int(gate.confidence * 100)}% confidence ({where}), budget {_fmt(budget)}",
            )
        )
    bound = "none" if gate.p99_upper_ms is None else _fmt(gate.p99_upper_ms)
    return _undecided(
        "p99_insufficient",
        f"{gate.samples} samples ({where}) do not decide p99 against {_fmt(budget)}: p99 "
        f"{_fmt(gate.p99_ms)}, upper bound {bound}; "
        + _more_evidence(gate.samples, gate.duration_s, gate.stopped),
    )


def _slowdown(cell: Cell, host_class: HostClass) -> Finding:
    """The candidate's paired ratio to the baseline is above ``max_slowdown`` at p50 or p99
    with confidence (the lower bound of the median per-round ratio exceeds it)."""
    max_slowdown = host_class.budgets.max_slowdown
    compared = False
    found: list[str] = []
    for result in cell.latency:
        ratio = result.vs_baseline
        if ratio is None:
            continue
        compared = True
        for metric, point, lower in (
            ("p50", ratio.p50_ratio, ratio.p50_lower),
            ("p99", ratio.p99_ratio, ratio.p99_lower),
        ):
            if point is not None and slower_than(lower, max_slowdown):
                spread = ratio.p50_spread if metric == "p50" else ratio.p99_spread
                beyond = f", net of the A/A control's spread x{spread:.3g}" if spread else ""
                found.append(
                    f"{metric} x{point:.3g} the baseline's at {result.config.label} "
                    f"(at least x{lower:.3g} over "
                    f"{ratio.rounds} paired rounds, {ratio.confidence:.2%} confidence{beyond})"
                )
    if found:
        return _failed(
            Reason(
                code="slower_than_baseline",
                message=f"slower than the baseline beyond max_slowdown {max_slowdown!r}: "
                + "; ".join(found),
            )
        )
    return _PASS if compared else _OFF


def _within(
    value: float | None, budget: float | None, what: str, code: str, shown: Callable[[], str]
) -> Finding:
    """A measured value against an optional budget: ``<code>_missing`` when the budget is set
    but nothing was measured, ``<code>_over_budget`` when it is exceeded (``shown()`` says by
    how much: formatted only then, as most cells of a fleet are within budget)."""
    if budget is None:
        return _OFF
    if value is None:
        return _undecided(f"{code}_missing", f"{what} was not measured; budget is set")
    if value > budget:
        return _failed(Reason(code=f"{code}_over_budget", message=shown()))
    return _PASS


def _peak_rss(cell: Cell, host_class: HostClass) -> Finding:
    budget, value = host_class.budgets.peak_rss_mb, cell.peak_rss_mb
    if budget is not None and value is not None and value <= budget:
        return _PASS  # what _within finds, without making its message's closure
    return _within(
        value,
        budget,
        "peak memory",
        "peak_rss",
        lambda: f"peak RSS {value or 0:.0f} MB > budget {budget or 0:g} MB",
    )


def _cold_init(cell: Cell, host_class: HostClass) -> Finding:
    budget, value = host_class.budgets.cold_init_ms, cell.cold_init_ms
    if budget is not None and value is not None and value <= budget:
        return _PASS  # what _within finds, without making its message's closure
    return _within(
        value,
        budget,
        "cold init",
        "cold_init",
        lambda: f"cold init {_fmt(value or 0.0)} > budget {_fmt(budget or 0.0)}",
    )


def _throughput(cell: Cell, host_class: HostClass) -> Finding:
    budget = host_class.budgets.min_throughput
    if budget is None:
        return _OFF
    served = [
        (r.throughput_ips * r.batch_size, r) for r in cell.latency if r.throughput_ips is not None
    ]
    if not served:
        return _undecided("throughput_missing", "throughput was not measured; budget is set")
    best, result = max(served, key=lambda pair: pair[0])
    if best >= budget:
        return _PASS
    return _failed(
        Reason(
            code="throughput_below_budget",
            message=f"at most {best:,.0f} samples/s ({result.config.label}) "
            f"< min_throughput {budget:g}",
        )
    )


def _rate(cell: Cell, host_class: HostClass) -> Finding:
    budget = host_class.budgets.min_rate_rps
    if budget is None:
        return _OFF
    found = cell.open_loop
    if found is None:
        return _undecided(
            "rate_missing", "no open-loop rate search ran (workload.open_loop); budget is set"
        )
    if found.max_rate_rps is None:
        return _undecided("rate_missing", f"the open-loop search found no rate: {found.missing}")
    if found.max_rate_rps >= budget:
        return _PASS
    return _failed(
        Reason(
            code="rate_below_budget",
            message=f"p99 meets {_fmt(found.budget_ms)} up to {found.max_rate_rps:,.0f} "
            f"requests/s ({found.servers} server{'s' if found.servers != 1 else ''}) < "
            f"min_rate_rps {budget:g}",
        )
    )


def _energy(cell: Cell, host_class: HostClass) -> Finding:
    budget = host_class.budgets.energy_mj
    if budget is None:
        return _OFF  # what _within says, without looking for the gate config
    gate = gate_of(cell)
    value = gate.energy_mj if gate else None
    if value is not None and value <= budget:
        return _PASS  # what _within finds, without making its message's closure
    found = _within(
        value,
        budget,
        "energy",
        "energy",
        lambda: f"{value or 0:.3g} mJ per inference > budget {budget or 0:g} mJ",
    )
    if found.outcome == "undecided" and gate is not None and gate.energy_missing:
        why = f"energy was not measured ({gate.energy_missing}); budget is set"
        return _undecided("energy_missing", why)
    return found


def _sustained(cell: Cell, host_class: HostClass) -> Finding:
    soak = cell.soak
    if soak is None:
        return _OFF
    if soak.drifted is None:
        return _undecided(
            "soak_insufficient",
            "a soak window had too few samples to bound its p99: soak longer "
            "(qualify run --soak) or at a faster config",
        )
    if not soak.drifted:
        return _PASS
    first, last = soak.windows[0], soak.windows[-1]
    added = (last.p99_lower_ms or 0.0) - (first.p99_upper_ms or 0.0)
    floor_ms = soak.floor * host_class.budgets.p99_ms
    if added < floor_ms:
        return _PASS  # beyond the tolerance, but too little to matter against the budget
    return _failed(
        Reason(
            code="sustained_drift",
            message=f"after {soak.seconds:.0f} s at {soak.config.label}, p99 is at least "
            f"{_fmt(last.p99_lower_ms or 0.0)} against at most {_fmt(first.p99_upper_ms or 0.0)} "
            f"in the first window (tolerance {soak.tolerance:.0%}): {_fmt(added)} more, at "
            f"least {soak.floor:.0%} of the {_fmt(host_class.budgets.p99_ms)} budget",
        )
    )


GATES: tuple[Gate, ...] = (
    Gate(
        "parity",
        "a candidate's outputs agree with the baseline's within its precision's tolerance",
        "parity (per output: the task-level agreement parity.post asks for first, then the "
        "tightest limits that would pass and what they were taken over)",
        ("parity_failed", "baseline_failed", "emulation_failed"),
        _parity,
    ),
    Gate(
        "placement",
        "the expected provider executed nodes, and no more than fallback_allowance ran elsewhere",
        "placement (nodes per provider, from onnxruntime's graph assignment)",
        ("expected_provider_missing", "provider_fallback"),
        _placement,
    ),
    Gate(
        "p99",
        "the p99's upper confidence bound at the gate config is within budgets.p99_ms",
        "gate_latency (p99 and its distribution-free bounds)",
        ("p99_over_budget", "p99_insufficient"),
        _p99,
    ),
    Gate(
        "slowdown",
        "a candidate is not measurably slower than the baseline at p50 or p99 "
        "(budgets.max_slowdown)",
        "latency[].vs_baseline (paired per-round ratios of the interleaved A/B, net of the "
        "between-process spread the baseline's A/A control showed)",
        ("slower_than_baseline",),
        _slowdown,
    ),
    Gate(
        "memory",
        "peak resident memory of the serving process is within budgets.peak_rss_mb",
        "peak_rss_mb",
        ("peak_rss_over_budget", "peak_rss_missing"),
        _peak_rss,
        "peak_rss_mb",
    ),
    Gate(
        "cold init",
        "the first session of a fresh process initialises within budgets.cold_init_ms",
        "cold_init_ms",
        ("cold_init_over_budget", "cold_init_missing"),
        _cold_init,
        "cold_init_ms",
    ),
    Gate(
        "throughput",
        "the best latency config serves at least budgets.min_throughput samples per second",
        "latency[].throughput_ips x batch_size (the separate throughput pass)",
        ("throughput_below_budget", "throughput_missing"),
        _throughput,
        "min_throughput",
    ),
    Gate(
        "rate",
        "under Poisson arrivals the p99 meets budgets.p99_ms up to budgets.min_rate_rps "
        "requests per second",
        "open_loop.max_rate_rps (the bisection over request rates)",
        ("rate_below_budget", "rate_missing"),
        _rate,
        "min_rate_rps",
    ),
    Gate(
        "energy",
        "energy per inference at the gate config is within budgets.energy_mj",
        "gate_latency.energy_mj (powercap RAPL counters, and NVML for a GPU class, read around the "
        "timed rounds)",
        ("energy_over_budget", "energy_missing"),
        _energy,
        "energy_mj",
    ),
    Gate(
        "sustained",
        "under sustained load (a soak) the p99 does not drift beyond workload.soak_tolerance "
        "by at least workload.soak_floor of the p99 budget",
        "soak (windows of the soak, their p99 bounds)",
        ("sustained_drift", "soak_insufficient"),
        _sustained,
    ),
)
"""The gates, in the order their reasons are listed."""


def assess(
    cell: Cell, host_class: HostClass, *, skip: Collection[str] = ()
) -> list[tuple[Gate, Finding]]:
    """Every gate's finding on a measured cell, in table order.

    Args:
        cell: The measurements (a cell whose run errored is assessed on what it has).
        host_class: The class whose budgets and expected provider apply.
        skip: Names of gates not to apply (the policy re-judges parity itself).
    """
    return [(gate, gate.check(cell, host_class)) for gate in GATES if gate.name not in skip]


def judge(
    cell: Cell, host_class: HostClass, *, skip: Collection[str] = ()
) -> tuple[str, list[Reason]]:
    """Verdict and reasons for a measured cell under a class's budgets and provider rules.

    Args:
        cell: the measurements. A cell with ``error`` set keeps verdict ``error`` and its reasons.
        host_class: the class whose budgets and expected provider apply.
        skip: Names of gates not to apply.

    Returns:
        ``(verdict, reasons)``: ``fail`` if any gate failed, else ``insufficient`` if any could
        not be decided, else ``pass``. Reasons list the failures first, then the undecided.
    """
    return judge_with(cell, host_class, _checks(frozenset(skip)) if skip else _ALL_CHECKS)


def class_checks(host_class: HostClass, *, skip: Collection[str] = ()) -> tuple[Check, ...]:
    """The checks that can find anything on a cell of ``host_class``, in table order: the
    gates not in ``skip``, less those whose budget the class leaves unset (off on every cell of
    it). Asked once per class by a caller that judges its cells (`judge_with`)."""
    budgets = host_class.budgets
    off = [name for name, budget in _BUDGETED if getattr(budgets, budget) is None]
    return _checks(frozenset((*skip, *off)))


def judge_with(
    cell: Cell, host_class: HostClass, checks: Sequence[Check]
) -> tuple[str, list[Reason]]:
    """`judge` by the given checks, a class's `class_checks` made once for its cells: the same
    verdict and reasons as `judge` with the same ``skip``.

    Args:
        cell: the measurements (``error`` set: verdict ``error`` and its reasons).
        host_class: the class whose budgets and expected provider apply.
        checks: the checks to apply, in table order.
    """
    if cell.error is not None:
        return "error", list(cell.reasons)
    fails: list[Reason] = []
    unsure: list[Reason] = []
    # `assess`, without the pairs: the policy judges every cell of a fleet
    for check in checks:
        finding = check(cell, host_class)
        if finding is _PASS or finding is _OFF:
            continue  # most gates of most cells: nothing to add
        if finding.outcome == "fail":
            fails.extend(finding.reasons)
        elif finding.outcome == "undecided":
            unsure.extend(finding.reasons)
    if fails:
        return "fail", fails + unsure
    if unsure:
        return "insufficient", unsure
    return "pass", []


_ALL_CHECKS: tuple[Check, ...] = tuple(gate.check for gate in GATES)
_BUDGETED: tuple[tuple[str, str], ...] = tuple(
    (gate.name, gate.budget) for gate in GATES if gate.budget is not None
)
"""Each gate a budget turns on, and that budget's field."""


@lru_cache(maxsize=256)
def _checks(skip: frozenset[str]) -> tuple[Check, ...]:
    """The checks of the gates not in ``skip``, in table order (a few dozen distinct skips at
    most: a gate or two skipped by the caller, and the budgets a class leaves unset)."""
    return tuple(gate.check for gate in GATES if gate.name not in skip)
