"""Interleaved A/B: the baseline and every candidate of one class measured in alternating rounds.

Owns the latency protocol across artifacts. Measuring one artifact after another lets machine
load pick the winner (a candidate measured in a quieter minute looks faster); here each artifact
keeps its own fresh process (`qualify.runner.ServedWorker`) and, per latency config, they sample
in turn for one short slice each, round after round, in an order that rotates and reverses so
that each takes every position equally often and load hits all alike. Sampling per artifact is sequential p99 evidence (`AdaptiveP99` fed
round by round); the rounds go on until every artifact has decided (or reached ``max_samples``)
and at least ``rounds`` rounds are done, or an artifact's sampled time reaches the time cap.

Each round records, per artifact, its sample count, p50, p99, the 1-minute load average and the
share of CPU time stolen by the hypervisor. Paired rounds give the candidate/baseline ratios
(`slowdowns`). Does not judge: `manifest.gates` applies ``max_slowdown``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from qualify.procfs import cpu_times
from qualify.runner import RoundWorker
from qualify.stats import (
    AUTO_TIME_CAP_FLOOR_S,
    AdaptiveP99,
    look_schedule,
    paired_ratio,
    percentiles,
    rounds_for_median_bound,
    time_cap,
)
from schemas.cell import LatencyConfig, RoundFigure, Slowdown
from schemas.project import Workload

__all__ = [
    "ConfigEvidence",
    "Interleaved",
    "comparison_confidence",
    "interleave",
    "needed_rounds",
    "round_quota",
    "slowdowns",
]

ROUND_WARMUP = 5
"""Inferences discarded at the start of every round after the first (the first uses the
workload's ``warmup``): caches are cold again after the other artifacts ran."""

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
    ``max_samples``.
    """
    share = -(-max(min_samples, taken) // rounds)
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
        trackers = {
            i: AdaptiveP99(
                budget_ms=budget_p99_ms,
                confidence=workload.confidence,
                min_samples=workload.min_samples,
                schedule=look_schedule(workload.min_samples, workload.max_samples),
            )
            for i in live
        }
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
            order = _order(active, index)
            for position, i in enumerate(order):
                worker = live[i]
                ev = evidence[i][config]
                load = os.getloadavg()[0]
                busy = busy or load > cores
                before = cpu_times()
                reply = worker.round(
                    {
                        "batch_size": config.batch_size,
                        "concurrency": config.concurrency,
                        "dims": config.sizes,
                        "warmup": workload.warmup
                        if index == 0
                        else min(workload.warmup, ROUND_WARMUP),
                        "time_s": min(slice_s, ev.time_cap_s - ev.duration_s),
                        "max_samples": round_quota(
                            trackers[i].n, workload.min_samples, workload.max_samples, minimum
                        ),
                    }
                )
                if reply is None:
                    continue  # it ended; its outcome says why
                ns = np.asarray(reply["samples_ns"], dtype=np.int64)
                ev.per_round_ns.append(ns)
                _add_stages(ev, reply)
                _add_energy(ev, reply, int(ns.size))
                ev.duration_s += float(reply["duration_s"])
                ev.rounds.append(_figure(ns, index, position, load, _steal(before, cpu_times())))
                if ns.size:
                    trackers[i].add(ns.astype(np.float64) / 1e6)
                if index == 0:  # the cap adapts to the rate this artifact showed
                    rate = ns.size / ev.duration_s if ev.duration_s > 0 else None
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
) -> dict[Config, Slowdown]:
    """Candidate/baseline ratios of p50 and p99 per config, over the rounds both sampled in."""
    found: dict[Config, Slowdown] = {}
    for config, cand in candidate.items():
        base = baseline.get(config)
        if base is None:
            continue
        by_round = {f.round: f for f in base.rounds if f.p50_ms and f.p99_ms}
        pairs = [
            (f, by_round[f.round])
            for f in cand.rounds
            if f.p50_ms and f.p99_ms and f.round in by_round
        ]
        p50 = paired_ratio([f.p50_ms for f, _ in pairs], [g.p50_ms for _, g in pairs], confidence)  # type: ignore[misc]
        p99 = paired_ratio([f.p99_ms for f, _ in pairs], [g.p99_ms for _, g in pairs], confidence)  # type: ignore[misc]
        found[config] = Slowdown(
            rounds=len(pairs),
            confidence=confidence,
            p50_ratio=p50.ratio,
            p50_lower=p50.lower,
            p50_upper=p50.upper,
            p99_ratio=p99.ratio,
            p99_lower=p99.lower,
            p99_upper=p99.upper,
        )
    return found
