"""The qualification gates: one pure function that judges a cell against a class's budgets.

Owns the rule "what makes a cell pass": parity, the p99 confidence bound against the budget,
actual placement on the expected provider, not being measurably slower than the baseline in the
interleaved A/B (``max_slowdown``), peak memory and cold init. The runner uses it to give
a fresh cell its verdict; the decision policy uses it again against the class's *current* budgets,
so a budget tightened after a run is honoured. It does not look at emulation, staleness or the
rollback check: those are properties of the evidence, not of the measurement, and belong to
``manifest.policy``.
"""

from __future__ import annotations

from schemas.cell import Cell, Reason
from schemas.project import HostClass

__all__ = ["judge"]


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


def _slower_than_baseline(cell: Cell, max_slowdown: float) -> Reason | None:
    """The candidate's paired ratio to the baseline is above ``max_slowdown`` at p50 or p99
    with confidence (the lower bound of the median per-round ratio exceeds it)."""
    found: list[str] = []
    for result in cell.latency:
        ratio = result.vs_baseline
        if ratio is None:
            continue
        for metric, point, lower in (
            ("p50", ratio.p50_ratio, ratio.p50_lower),
            ("p99", ratio.p99_ratio, ratio.p99_lower),
        ):
            if lower is not None and point is not None and lower > max_slowdown:
                found.append(
                    f"{metric} x{point:.3g} the baseline's at batch {result.batch_size}, "
                    f"concurrency {result.concurrency} (at least x{lower:.3g} over "
                    f"{ratio.rounds} paired rounds, {ratio.confidence:.2%} confidence)"
                )
    if not found:
        return None
    return Reason(
        code="slower_than_baseline",
        message=f"slower than the baseline beyond max_slowdown {max_slowdown!r}: "
        + "; ".join(found),
    )


def judge(cell: Cell, host_class: HostClass) -> tuple[str, list[Reason]]:
    """Verdict and reasons for a measured cell under a class's budgets and provider rules.

    Args:
        cell: the measurements. A cell with ``error`` set keeps verdict ``error`` and its reasons.
        host_class: the class whose budgets and expected provider apply.

    Returns:
        ``(verdict, reasons)``: ``fail`` if any gate failed, else ``insufficient`` if the p99 could
        not be decided (or parity could not be judged), else ``pass``.
    """
    if cell.error is not None:
        return "error", list(cell.reasons)
    budgets = host_class.budgets
    provider = host_class.provider
    fails: list[Reason] = []
    unsure: list[Reason] = []

    if cell.role == "candidate":
        if cell.parity is None:
            unsure.extend(r for r in cell.reasons if r.code == "baseline_failed")
            if not unsure:
                unsure.append(
                    Reason(
                        code="baseline_failed", message="no parity evidence against the baseline"
                    )
                )
        elif not cell.parity.passed:
            worst = "; ".join(
                f"{o.name}: {', '.join(o.failures)}" for o in cell.parity.outputs if not o.passed
            )
            fails.append(Reason(code="parity_failed", message=f"parity failed: {worst}"))

    placement = cell.placement
    if placement is None:
        unsure.append(
            Reason(
                code="expected_provider_missing",
                message="node placement was not recorded (this onnxruntime does not report it)",
            )
        )
    else:
        expected = provider.expected
        on_expected = placement.nodes_per_provider.get(expected, 0)
        fallback = placement.total_nodes - on_expected
        if on_expected == 0:
            others = ", ".join(f"{n} on {p}" for p, n in placement.nodes_per_provider.items())
            fails.append(
                Reason(
                    code="expected_provider_missing",
                    message=f"{expected} executed no node ({others})",
                )
            )
        if fallback > provider.fallback_allowance:
            elsewhere = ", ".join(p for p in placement.nodes_per_provider if p != expected)
            fails.append(
                Reason(
                    code="provider_fallback",
                    message=f"{fallback} of {placement.total_nodes} nodes ran on {elsewhere}, "
                    f"expected {expected} (allowance {provider.fallback_allowance})",
                )
            )

    gate = cell.gate_latency
    if gate is None:
        unsure.append(Reason(code="p99_insufficient", message="no latency was measured"))
    else:
        where = f"batch {gate.batch_size}, concurrency {gate.concurrency}"
        budget = budgets.p99_ms
        if gate.p99_upper_ms is not None and gate.p99_upper_ms <= budget:
            pass
        elif gate.p99_lower_ms is not None and gate.p99_lower_ms > budget:
            fails.append(
                Reason(
                    code="p99_over_budget",
                    message=f"p99 is at least {_fmt(gate.p99_lower_ms)} at "
                    f"{int(gate.confidence * 100)}% confidence ({where}), budget {_fmt(budget)}",
                )
            )
        else:
            bound = "none" if gate.p99_upper_ms is None else _fmt(gate.p99_upper_ms)
            unsure.append(
                Reason(
                    code="p99_insufficient",
                    message=f"{gate.samples} samples ({where}) do not decide p99 against "
                    f"{_fmt(budget)}: p99 {_fmt(gate.p99_ms)}, upper bound {bound}; "
                    + _more_evidence(gate.samples, gate.duration_s, gate.stopped),
                )
            )

    slower = _slower_than_baseline(cell, budgets.max_slowdown)
    if slower is not None:
        fails.append(slower)

    if budgets.peak_rss_mb is not None and cell.peak_rss_mb is None:
        unsure.append(
            Reason(code="peak_rss_missing", message="peak memory was not measured; budget is set")
        )
    if budgets.cold_init_ms is not None and cell.cold_init_ms is None:
        unsure.append(
            Reason(code="cold_init_missing", message="cold init was not measured; budget is set")
        )
    if (
        budgets.peak_rss_mb is not None
        and cell.peak_rss_mb is not None
        and cell.peak_rss_mb > budgets.peak_rss_mb
    ):
        fails.append(
            Reason(
                code="peak_rss_over_budget",
                message=f"peak RSS {cell.peak_rss_mb:.0f} MB > budget {budgets.peak_rss_mb:g} MB",
            )
        )
    if (
        budgets.cold_init_ms is not None
        and cell.cold_init_ms is not None
        and cell.cold_init_ms > budgets.cold_init_ms
    ):
        fails.append(
            Reason(
                code="cold_init_over_budget",
                message=f"cold init {_fmt(cell.cold_init_ms)} > budget "
                f"{_fmt(budgets.cold_init_ms)}",
            )
        )

    if fails:
        return "fail", fails + unsure
    if unsure:
        return "insufficient", unsure
    return "pass", []
