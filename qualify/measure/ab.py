"""Interleaved A/B: the baseline and every candidate of one class measured in alternating rounds.

Owns the latency protocol across artifacts. Measuring one artifact after another lets machine
load pick the winner (a candidate measured in a quieter minute looks faster); here each artifact
keeps its own fresh process (`qualify.measure.runner.ServedWorker`) and, per latency config, they sample
in turn for one short slice each, round after round, in an order that rotates and reverses so
that each takes every position equally often and load hits all alike. Sampling per artifact is sequential p99 evidence (`AdaptiveP99` fed
round by round); the rounds go on until every artifact has decided (or reached ``max_samples``)
and at least ``rounds`` rounds are done, or an artifact's sampled time reaches the time cap.

Each round records, per artifact, its sample count, p50, p99, the 1-minute load average and the
share of CPU time stolen by the hypervisor. Paired rounds give the candidate/baseline ratios
(`slowdowns`). Does not judge: `manifest.gates` applies ``max_slowdown``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from qualify.measure.procfs import cpu_times
from qualify.measure.runner import RoundWorker
from qualify.measure.stats import (
    AUTO_TIME_CAP_FLOOR_S,
    AdaptiveP99,
    RatioBounds,
    look_schedule,
    paired_ratio,
    percentiles,
    rounds_for_median_bound,
    time_cap,
)
from schemas.cell import LatencyConfig, RoundFigure, Slowdown
from schemas.project import Workload

__all__ = [
    "ROUND_SAMPLES",
    "ConfigEvidence",
    "Interleaved",
    "aa_control",
    "beyond_spread",
    "comparison_confidence",
    "interleave",
    "needed_rounds",
    "process_spread",
    "round_quota",
    "slowdowns",
]

ROUND_WARMUP = 5
"""Inferences discarded at the start of every round after the first (the first uses the
workload's ``warmup``): caches are cold again after the other artifacts ran."""

ROUND_SAMPLES = 100
"""Fewest samples a round asks of an artifact (its slice's time may end it sooner): each round
gives one paired ratio of p50s, and a p50 of a dozen samples of a fast model moved with every
passing disturbance of a loaded machine."""

Config = LatencyConfig
"""(batch size, concurrency, swept sizes)."""


@dataclass
class ConfigEvidence:
    """One artifact's samples at one latency config, over all its rounds."""

    rounds: list[RoundFigure] = field(default_factory=list)
    per_round_ns: list[np.ndarray] = field(default_factory=list)
    decision: str = "insufficient"
    p99_lower_ms: float | None = None
    p99_upper_ms: float | None = None
    stopped: str = "time_cap"
    duration_s: float = 0.0
    time_cap_s: float = AUTO_TIME_CAP_FLOOR_S
    """Its sampling time cap: ``workload.time_cap_s``, else adapted after the first round."""
    inference_round_ns: list[np.ndarray] = field(default_factory=list)
    """With a pipeline: the model call alone, per round (empty without one)."""
    stage_ns: dict[str, int] = field(default_factory=dict)
    """With a pipeline: total time per stage (pre, inference, post) over the rounds."""
    energy_j: dict[str, float] = field(default_factory=dict)
    """Joules per energy domain over the rounds whose counters were read."""
    energy_samples: int = 0
    """The samples of those rounds."""
    energy_missing: str | None = None
    """Why a round had no energy figure (the first reason seen)."""

    @property
    def inference_ns(self) -> np.ndarray:
        """Every inference-only sample (empty without a pipeline)."""
        if not self.inference_round_ns:
            return np.empty(0, dtype=np.int64)
        return np.concatenate(self.inference_round_ns).astype(np.int64)

    @property
    def samples_ns(self) -> np.ndarray:
        """Every timed sample, in round order."""
        if not self.per_round_ns:
            return np.empty(0, dtype=np.int64)
        return np.concatenate(self.per_round_ns).astype(np.int64)


@dataclass
class Interleaved:
    """What the rounds measured: per artifact index, per config."""

    evidence: list[dict[Config, ConfigEvidence]]
    host_busy: bool
    """Some round started with the 1-minute load average above the usable cores."""


def comparison_confidence(confidence: float, configs: int) -> float:
    """One-sided confidence of each slowdown bound: Bonferroni over p50, p99 and the configs,
    so that a candidate is wrongly called slower with chance at most ``1 - confidence``."""
    return 1.0 - (1.0 - confidence) / (2 * max(1, configs))


def needed_rounds(workload: Workload, configs: int) -> int:
    """Rounds per config: the workload's ``rounds``, raised to the fewest that bound a ratio."""
    return max(
        workload.rounds,
        rounds_for_median_bound(comparison_confidence(workload.confidence, configs)),
    )


def round_quota(taken: int, min_samples: int, max_samples: int, rounds: int) -> int:
    """Most samples an artifact takes in its next round: what the evidence still needs, spread
    over the minimum rounds.

    The minimum rounds together reach ``min_samples``, the first size at which the p99 evidence
    can decide, so a fast model that decides there stops after them instead of filling every
    round towards ``max_samples``. Undecided after them, each round takes 1/``rounds`` of what
    the artifact has, so its total grows geometrically towards the next look, and never past
    ``max_samples``. Never fewer than `ROUND_SAMPLES` (the slice's time ends a slow model's
    round sooner).
    """
    share = max(-(-max(min_samples, taken) // rounds), ROUND_SAMPLES)
    return max(0, min(max_samples - taken, share))


def _slice_s(cap_s: float, rounds: int) -> float:
    """Sampling time per artifact per round: a quarter of the time cap spread over the minimum
    rounds, kept between 50 ms and 1 s (short enough to interleave finely, long enough that a
    round holds many samples of a fast model)."""
    return min(1.0, max(0.05, cap_s / (4 * rounds)))


def _steal(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    if before is None or after is None or after[0] <= before[0]:
        return None
    return (after[1] - before[1]) / (after[0] - before[0])


def _figure(
    ns: np.ndarray, index: int, position: int, load: float, steal: float | None
) -> RoundFigure:
    pct = percentiles(ns.astype(np.float64) / 1e6) if ns.size else None
    return RoundFigure(
        round=index,
        position=position,
        samples=int(ns.size),
        p50_ms=pct.p50 if pct else None,  # observed samples, as every qualify percentile
        p99_ms=pct.p99 if pct else None,
        load_avg_1m=load,
        steal_fraction=steal,
    )


def _order(active: list[int], index: int) -> list[int]:
    """Round ``index``'s order: rotated by one every two rounds and reversed every other round,
    so that each artifact takes every position equally often (two artifacts go A B, B A, B A,
    A B, ...: balanced against load that rises or falls steadily, too)."""
    k = (index // 2) % len(active)
    turned = active[k:] + active[:k]
    return turned if index % 2 == 0 else turned[::-1]


def interleave(
    workers: Sequence[RoundWorker | None],
    configs: Sequence[Config],
    workload: Workload,
    budget_p99_ms: float,
    *,
    cores: int,
    on_event: Callable[[str], None] = lambda _msg: None,
    on_progress: Callable[[str], None] | None = None,
    labels: Sequence[str] | None = None,
) -> Interleaved:
    """Measure every live worker at every config in interleaved rounds.

    Args:
        workers: One per artifact, in project order; None for an artifact whose process ended
            before it was ready (it gets no evidence).
        configs: The latency configs.
        workload: Warm-up, sample limits, time cap, rounds, confidence.
        budget_p99_ms: The class's p99 budget (what each artifact's p99 evidence decides on).
        cores: Usable CPUs; a round that starts with a higher load average marks the host busy.
        on_event: Receives one line per config.
        on_progress: Receives, after every round, where each artifact stands (samples, its
            p99 bound against the budget) and at most how long the config can still take.
        labels: The artifacts' names for progress lines (default: their positions).

    Returns:
        The evidence; a worker that dies mid-way keeps what it had measured.
    """
    minimum = needed_rounds(workload, len(configs))
    slice_s = _slice_s(time_cap(workload.time_cap_s, workload.min_samples, None), minimum)
    evidence: list[dict[Config, ConfigEvidence]] = [{} for _ in workers]
    busy = False
    for config in configs:
        live = {i: w for i, w in enumerate(workers) if w is not None and w.alive}
        trackers = {i: _tracker(workload, budget_p99_ms) for i in live}
        for i in live:
            evidence[i][config] = ConfigEvidence(
                time_cap_s=time_cap(workload.time_cap_s, workload.min_samples, None)
            )
        index = 0
        while True:
            active = [
                i
                for i, w in live.items()
                if w.alive
                and trackers[i].n < workload.max_samples
                and evidence[i][config].duration_s < evidence[i][config].time_cap_s
            ]
            decided = all(trackers[i].decision != "insufficient" for i in active)
            if not active or (decided and index >= minimum):
                break
            for position, i in enumerate(_order(active, index)):
                ev, tracker = evidence[i][config], trackers[i]
                load = os.getloadavg()[0]
                busy = busy or load > cores
                quota = round_quota(tracker.n, workload.min_samples, workload.max_samples, minimum)
                request = _request(config, workload, ev, index, (slice_s, quota))
                taken = _measure_round(live[i], ev, tracker, request, (index, position, load))
                if taken is not None and index == 0:  # the cap adapts to the rate it showed
                    rate = taken / ev.duration_s if ev.duration_s > 0 else None
                    ev.time_cap_s = time_cap(workload.time_cap_s, workload.min_samples, rate)
            index += 1
            if on_progress is not None:
                on_progress(
                    _progress(config, index, minimum, trackers, evidence, labels, budget_p99_ms)
                )
        for i in live:
            _conclude(evidence[i][config], trackers[i], workload.max_samples)
        on_event(f"{config.label}: {index} interleaved rounds of at most {slice_s:.2g} s")
    return Interleaved(evidence=evidence, host_busy=busy)


def _tracker(workload: Workload, budget_p99_ms: float) -> AdaptiveP99:
    return AdaptiveP99(
        budget_ms=budget_p99_ms,
        confidence=workload.confidence,
        min_samples=workload.min_samples,
        schedule=look_schedule(workload.min_samples, workload.max_samples),
    )


def _request(
    config: Config,
    workload: Workload,
    ev: ConfigEvidence,
    index: int,
    limits: tuple[float, int],
) -> dict[str, Any]:
    """A round's request to a worker; ``limits`` is (the round's time slice, its sample quota)."""
    slice_s, quota = limits
    return {
        "batch_size": config.batch_size,
        "concurrency": config.concurrency,
        "dims": config.sizes,
        "warmup": workload.warmup if index == 0 else min(workload.warmup, ROUND_WARMUP),
        "time_s": min(slice_s, ev.time_cap_s - ev.duration_s),
        "max_samples": quota,
    }


def _measure_round(
    worker: RoundWorker,
    ev: ConfigEvidence,
    tracker: AdaptiveP99,
    request: dict[str, Any],
    at: tuple[int, int, float],
) -> int | None:
    """One round of one worker, added to its evidence and tracker; ``at`` is (round index,
    position in the round, load average before it). Returns the samples it took; None when the
    worker ended (it adds nothing: its outcome says why)."""
    index, position, load = at
    before = cpu_times()
    reply = worker.round(request)
    if reply is None:
        return None
    ns = np.asarray(reply["samples_ns"], dtype=np.int64)
    ev.per_round_ns.append(ns)
    _add_stages(ev, reply)
    _add_energy(ev, reply, int(ns.size))
    ev.duration_s += float(reply["duration_s"])
    ev.rounds.append(_figure(ns, index, position, load, _steal(before, cpu_times())))
    if ns.size:
        tracker.add(ns.astype(np.float64) / 1e6)
    return int(ns.size)


def _conclude(ev: ConfigEvidence, tracker: AdaptiveP99, max_samples: int) -> None:
    """A config's evidence once its rounds are over: the decision, bounds and why it stopped."""
    ev.decision = tracker.decision
    ev.p99_lower_ms, ev.p99_upper_ms = tracker.bounds
    if tracker.decision != "insufficient":
        ev.stopped = "decided"
    elif tracker.n >= max_samples:
        ev.stopped = "max_samples"
    else:
        ev.stopped = "time_cap"


def _progress(
    config: Config,
    index: int,
    minimum: int,
    trackers: dict[int, AdaptiveP99],
    evidence: list[dict[Config, ConfigEvidence]],
    labels: Sequence[str] | None,
    budget_ms: float,
) -> str:
    """One line: the config's round, each artifact's samples and p99 bound, and the most time
    the config can still take (every artifact sampling to its time cap)."""
    parts = []
    left_s = 0.0
    for i, tracker in trackers.items():
        ev = evidence[i][config]
        upper = tracker.bounds[1]
        bound = f"p99 <= {upper:.3g} ms" if upper is not None else "no p99 bound yet"
        name = labels[i] if labels is not None and i < len(labels) else f"#{i}"
        parts.append(f"{name} {tracker.n} samples, {bound}, {tracker.decision}")
        if tracker.decision == "insufficient":
            left_s += max(0.0, ev.time_cap_s - ev.duration_s)
    return (
        f"{config.label}: round {index} (at least {minimum}); "
        + "; ".join(parts)
        + f"; budget {budget_ms:g} ms; at most {left_s:.0f} s left"
    )


def _add_stages(ev: ConfigEvidence, reply: dict[str, Any]) -> None:
    """A pipeline round's inference-only samples and stage times, kept beside its samples."""
    if "inference_ns" not in reply:
        return
    ev.inference_round_ns.append(np.asarray(reply["inference_ns"], dtype=np.int64))
    for stage, ns in dict(reply.get("stage_ns") or {}).items():
        ev.stage_ns[str(stage)] = ev.stage_ns.get(str(stage), 0) + int(ns)


def _add_energy(ev: ConfigEvidence, reply: dict[str, Any], samples: int) -> None:
    """A round's joules per domain, or why it had none (then the config's figure is null: a
    total over only some rounds would not be the energy of the samples it is divided by)."""
    joules = reply.get("energy_j")
    if not isinstance(joules, dict) or ev.energy_missing is not None:
        ev.energy_missing = ev.energy_missing or str(reply.get("energy_missing") or "not read")
        ev.energy_j.clear()
        return
    for domain, value in joules.items():
        ev.energy_j[str(domain)] = ev.energy_j.get(str(domain), 0.0) + float(value)
    ev.energy_samples += samples


def slowdowns(
    candidate: dict[Config, ConfigEvidence],
    baseline: dict[Config, ConfigEvidence],
    confidence: float,
    *,
    control: dict[Config, ConfigEvidence] | None = None,
) -> dict[Config, Slowdown]:
    """Candidate/baseline ratios of p50 and p99 per config, over the rounds both sampled in.

    With an A/A ``control`` (the baseline's bytes in a second process, in the same rounds) the
    ratio is against the baseline pooled over its two processes (each round's geometric mean),
    and its bounds are widened by the between-process spread (`beyond_spread`): the lower bound
    is the least of the bound against each baseline process and the pooled bound over the
    spread the control showed, so the gate's ``lower > max_slowdown`` calls a candidate slower
    only when it is slower than every process the baseline ran in, and by more than two
    processes of the same bytes differed.
    """
    found: dict[Config, Slowdown] = {}
    for config, cand in candidate.items():
        base = baseline.get(config)
        if base is None:
            continue
        twin = control.get(config) if control is not None else None
        found[config] = _slowdown(cand, base, twin, confidence)
    return found


def _slowdown(
    cand: ConfigEvidence, base: ConfigEvidence, twin: ConfigEvidence | None, confidence: float
) -> Slowdown:
    def vs(other: ConfigEvidence, metric: str) -> RatioBounds:
        return _paired(cand, other, metric, confidence)

    if twin is None:
        p50, p99 = vs(base, "p50_ms"), vs(base, "p99_ms")
        return Slowdown(
            rounds=p50.rounds,
            confidence=confidence,
            p50_ratio=p50.ratio,
            p50_lower=p50.lower,
            p50_upper=p50.upper,
            p99_ratio=p99.ratio,
            p99_lower=p99.lower,
            p99_upper=p99.upper,
            p50_detectable=_detectable(p50.ratio, p50.lower),
        )
    pooled = _pooled_evidence(base, twin)
    figures: dict[str, tuple[RatioBounds, float | None]] = {}
    for metric in ("p50_ms", "p99_ms"):
        aa = _paired(twin, base, metric, confidence)
        spread = process_spread(aa)
        figures[metric] = (
            beyond_spread(vs(pooled, metric), [vs(base, metric), vs(twin, metric)], spread),
            spread,
        )
    (p50, p50_spread), (p99, p99_spread) = figures["p50_ms"], figures["p99_ms"]
    return Slowdown(
        rounds=p50.rounds,
        confidence=confidence,
        p50_ratio=p50.ratio,
        p50_lower=p50.lower,
        p50_upper=p50.upper,
        p99_ratio=p99.ratio,
        p99_lower=p99.lower,
        p99_upper=p99.upper,
        p50_spread=p50_spread,
        p99_spread=p99_spread,
        p50_detectable=_detectable(p50.ratio, p50.lower),
    )


def aa_control(
    control: dict[Config, ConfigEvidence],
    baseline: dict[Config, ConfigEvidence],
    confidence: float,
) -> dict[Config, Slowdown]:
    """The A/A control against the baseline per config: their paired ratios, and the spread
    (`process_spread`) each candidate's bounds were widened by."""
    found = {}
    for config, ratio in slowdowns(control, baseline, confidence).items():
        found[config] = ratio.model_copy(
            update={
                "p50_spread": process_spread(_bounds(ratio, "p50")),
                "p99_spread": process_spread(_bounds(ratio, "p99")),
            }
        )
    return found


def _bounds(ratio: Slowdown, metric: str) -> RatioBounds:
    return RatioBounds(
        ratio.rounds,
        getattr(ratio, f"{metric}_ratio"),
        getattr(ratio, f"{metric}_lower"),
        getattr(ratio, f"{metric}_upper"),
    )


def _timed(figure: RoundFigure) -> bool:
    return bool(figure.p50_ms and figure.p99_ms)


def _paired(
    cand: ConfigEvidence, base: ConfigEvidence, metric: str, confidence: float
) -> RatioBounds:
    """`paired_ratio` of one figure (``p50_ms`` or ``p99_ms``) over the rounds both timed."""
    by_round = {f.round: f for f in base.rounds if _timed(f)}
    pairs = [(f, by_round[f.round]) for f in cand.rounds if _timed(f) and f.round in by_round]
    return paired_ratio(
        [getattr(f, metric) for f, _ in pairs], [getattr(g, metric) for _, g in pairs], confidence
    )


def _pooled_evidence(base: ConfigEvidence, twin: ConfigEvidence) -> ConfigEvidence:
    """The baseline over its two processes: per round both timed, the geometric mean of their
    p50 and of their p99."""
    other = {f.round: f for f in twin.rounds if _timed(f)}
    rounds = [
        f.model_copy(
            update={
                "p50_ms": math.sqrt(f.p50_ms * other[f.round].p50_ms),  # type: ignore[operator]
                "p99_ms": math.sqrt(f.p99_ms * other[f.round].p99_ms),  # type: ignore[operator]
            }
        )
        for f in base.rounds
        if _timed(f) and f.round in other
    ]
    return ConfigEvidence(rounds=rounds)


def process_spread(aa: RatioBounds) -> float | None:
    """How far two processes of the same bytes were shown to differ (a factor >= 1).

    ``aa`` is the A/A control's paired ratio to the baseline. The spread is the bound nearest
    1 of that ratio (its lower bound when the control was slower, the inverse of its upper
    bound when it was faster): the difference the rounds demonstrate, beyond their own noise,
    which the candidate's bounds already carry. 1.0 when the interval holds 1; None with too
    few rounds for bounds.
    """
    if aa.lower is None or aa.upper is None or not aa.upper > 0:
        return None
    return max(1.0, aa.lower, 1.0 / aa.upper)


def beyond_spread(
    pooled: RatioBounds, each: Sequence[RatioBounds], spread: float | None
) -> RatioBounds:
    """A candidate's ratio to the pooled baseline with bounds that carry the process noise.

    The lower bound is the least of the lower bound against each baseline process and the
    pooled lower bound over ``spread``; the upper bound the greatest of the upper bounds
    against each and the pooled upper bound times ``spread``. Measured with two CPU hogs on a
    2-core machine (bench/ab.py), this kept an identical twin from being called slower where
    the bound against one process alone called it so in 3 to 4 runs of 20. A missing bound (too
    few rounds) stays missing.
    """
    factor = spread or 1.0
    lowers = [b.lower for b in each]
    uppers = [b.upper for b in each]
    lower = None
    if pooled.lower is not None and all(x is not None for x in lowers):
        lower = min([pooled.lower / factor, *(x for x in lowers if x is not None)])
    upper = None
    if pooled.upper is not None and all(x is not None for x in uppers):
        upper = max([pooled.upper * factor, *(x for x in uppers if x is not None)])
    return RatioBounds(pooled.rounds, pooled.ratio, lower, upper)


def _detectable(ratio: float | None, lower: float | None) -> float | None:
    """The smallest median ratio this run would have called slower at max_slowdown 1.0: its
    ratio over its (spread-widened) lower bound."""
    if ratio is None or lower is None or not lower > 0:
        return None
    return ratio / lower
