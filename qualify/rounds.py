"""A run's artifacts measured side by side, each in its own live process.

Owns the steps between starting the measuring processes and letting them go: each artifact's
process prepared alone, the A/A control (the baseline's bytes in a second process), the
interleaved latency rounds, the soak and the open-loop search on the same processes, and what the
rounds' evidence becomes: each artifact's latency results, a candidate's with its slowdown against
the baseline. Does not check the host, store the artifacts, compare outputs, judge cells or write
the matrix (`qualify.run` does, around these steps).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from qualify.measure.ab import ConfigEvidence, Interleaved, aa_control, interleave, slowdowns
from qualify.measure.fingerprint import class_cpus
from qualify.measure.job import JobMode, WorkerJob, job_for
from qualify.measure.openloop import open_loop
from qualify.measure.runner import RoundWorker, WorkerOutcome, Workers
from qualify.measure.soak import soak
from qualify.measure.stats import percentiles
from qualify.project.load import LoadedProject
from reports.formatting import open_loop_text
from schemas.cell import (
    LatencyConfig,
    LatencyResult,
    OpenLoopResult,
    Slowdown,
    Soak,
    worst_first,
)
from schemas.host import Fingerprint
from schemas.project import ArtifactSpec, HostClass, OpenLoop, Workload

__all__ = [
    "EventSink",
    "Measurements",
    "RunContext",
    "latency_of",
    "latency_results",
    "measure_interleaved",
]

EventSink = Callable[[str], None]


@dataclass(frozen=True)
class RunContext:
    """What the steps of one run that start and drive the measuring processes work with: the
    project, the class, this host, the run's private folder, where its processes come from and
    where it says what it does (`qualify.run` adds the run's identity, options and clock)."""

    loaded: LoadedProject
    host_class: HostClass
    fp: Fingerprint
    work_root: Path
    """The run's private folder (``a<i>`` per artifact, ``control``, ``rollback``)."""
    workers: Workers
    on_event: EventSink
    on_worker_start: Callable[[str, int], None] | None
    on_progress: EventSink | None

    @property
    def inputs_path(self) -> Path:
        """The shared input pool every artifact is fed from."""
        return self.work_root / "inputs.npz"

    @property
    def workload(self) -> Workload:
        return self.loaded.project.workload

    @property
    def cores(self) -> int:
        """The cores the run may use (its affinity, else all)."""
        return len(self.fp.affinity) or self.fp.cores

    def job(self, path: Path, digest: str, work: Path, mode: JobMode) -> WorkerJob:
        """The job of one artifact in this run (pinned as the class says, the same CPUs for
        every artifact of the class)."""
        return job_for(
            artifact_path=path,
            digest=digest,
            host_class=self.host_class,
            workload=self.workload,
            root=self.loaded.root,
            cpus=class_cpus(self.fp, self.host_class)[0],
            inputs_path=self.inputs_path,
            work=work,
            mode=mode,
        )

    def serve(self, job: WorkerJob, work: Path, label: str) -> RoundWorker:
        """A live measuring process for ``job``."""
        return self.workers.serve(
            job,
            work,
            timeout_s=self.host_class.budgets.timeout_s,
            on_start=_bind_label(self.on_worker_start, label),
        )


@dataclass
class Measurements:
    """What the artifacts' live processes gave, per artifact in the run's order (baseline
    first): how each process ended, its rounds' evidence per config, its soak and its open-loop
    search (None where not asked or not measured)."""

    outcomes: list[WorkerOutcome]
    evidence: list[dict[LatencyConfig, ConfigEvidence]]
    host_busy: bool
    soaks: list[Soak | None]
    open_loops: list[OpenLoopResult | None]
    control: dict[LatencyConfig, ConfigEvidence] | None = None
    """The A/A control's evidence (the baseline's second process); None without one."""


def measure_interleaved(
    run: RunContext,
    stored: list[tuple[ArtifactSpec, str, Path]],
    configs: list[LatencyConfig],
    *,
    soak_seconds: float | None,
    open_loop_spec: OpenLoop | None,
) -> Measurements:
    """Prepare every artifact in its own process, one at a time, then interleave their latency
    rounds (and the soak and the open-loop search, if asked), then let each finish alone
    (throughput and profile)."""
    procs = _Live()
    try:
        _prepare_all(run, stored, procs)
        labels = [spec.label for spec, _, _ in stored]
        control = None
        if run.workload.aa_control and len(stored) > 1 and procs.live[0] is not None:
            control = _start_control(run, procs.jobs[0], labels[0])
            procs.opened.extend([control] if control is not None else [])
        measured = interleave(
            [*procs.live, *([control] if control is not None else [])],
            configs,
            run.workload,
            run.host_class.budgets.p99_ms,
            cores=run.cores,
            on_event=run.on_event,
            on_progress=run.on_progress,
            labels=[*labels, f"{labels[0]} (A/A control)"],
        )
        control_evidence = _control_evidence(measured, control)
        soaks = _soaks(run, procs.live, measured.evidence, soak_seconds)
        rates = _open_loops(run, stored, procs.live, open_loop_spec)
        wanted = [
            {
                "key": c.short,
                "batch_size": c.batch_size,
                "concurrency": c.concurrency,
                "dims": c.sizes,
            }
            for c in configs
        ]
        for index, each in enumerate(procs.live):
            if each is not None:
                procs.ended[index] = each.finish(wanted)
    finally:
        for worker in procs.opened:
            worker.close()
    return Measurements(
        outcomes=[procs.ended[i] for i in range(len(stored))],
        evidence=measured.evidence,
        host_busy=measured.host_busy,
        soaks=soaks,
        open_loops=rates,
        control=control_evidence,
    )


@dataclass
class _Live:
    """The artifacts' processes while they are measured in rounds."""

    live: list[RoundWorker | None] = field(default_factory=list)
    """Per artifact, its process, or None once it ended (its outcome is then in ``ended``)."""
    ended: dict[int, WorkerOutcome] = field(default_factory=dict)
    opened: list[RoundWorker] = field(default_factory=list)
    """Every process started, to close whatever happens."""
    jobs: list[WorkerJob] = field(default_factory=list)


def _prepare_all(
    run: RunContext, stored: list[tuple[ArtifactSpec, str, Path]], into: _Live
) -> None:
    """Start and prepare every artifact's process, one at a time (cold init, placement and
    parity alone on the machine)."""
    for index, (spec, digest, stored_path) in enumerate(stored):
        role = "baseline" if index == 0 else "candidate"
        run.on_event(f"{spec.label} ({role}, {digest[:19]}): preparing")
        work = run.work_root / f"a{index}"
        work.mkdir()
        # No re-hash here: ``store.add`` just hashed the copy, and the runner re-hashes it
        # before the child starts and once it has loaded it (`qualify.measure.digest`).
        job = run.job(stored_path, digest, work, "serve")
        into.jobs.append(job)
        worker = run.serve(job, work, spec.label)
        into.opened.append(worker)
        if worker.ready():
            into.live.append(worker)
        else:
            into.ended[index] = worker.finish([])
            into.live.append(None)


def _start_control(run: RunContext, job: WorkerJob, label: str) -> RoundWorker | None:
    """The A/A control: the baseline's bytes in a second fresh process, prepared like the
    first; None (said) when it ends before it is ready, and the slowdown is then judged
    without the between-process spread. It computes no parity and runs no profile."""
    work = run.work_root / "control"
    work.mkdir()
    job = dataclasses.replace(
        job,
        outputs_path=str(work / "outputs.npz"),
        samples_path=str(work / "samples.npz"),
        profile_runs=0,
    )
    run.on_event(f"{label} (A/A control: the baseline in a second process): preparing")
    worker = run.serve(job, work, f"{label} (A/A control)")
    if worker.ready():
        return worker
    ended = worker.finish([])
    run.on_event(
        f"{label} (A/A control): ended before measuring ({ended.error_code}: "
        f"{ended.error_message}); slowdowns are judged without the between-process spread"
    )
    return None


def _control_evidence(
    measured: Interleaved, control: RoundWorker | None
) -> dict[LatencyConfig, ConfigEvidence] | None:
    """The A/A control's evidence, taken off the artifacts' (it was measured last), and its
    process let go: its own outcome is no cell, only its rounds are evidence."""
    if control is None:
        return None
    evidence = measured.evidence.pop()
    control.finish([])
    return evidence


def _soaks(
    run: RunContext,
    live: list[RoundWorker | None],
    evidence: list[dict[LatencyConfig, ConfigEvidence]],
    soak_seconds: float | None,
) -> list[Soak | None]:
    """Each artifact's soak at the gate config, when the run soaks (``--soak`` or the
    workload's ``soak_s``); Nones otherwise."""
    wl = run.workload
    soak_s = soak_seconds if soak_seconds is not None else wl.soak_s
    config = _soak_config(evidence)
    if not soak_s or config is None:
        return [None] * len(live)
    run.on_event(f"soak: {soak_s:.0f} s at {config.label}")
    return soak(
        live,
        config,
        soak_s,
        confidence=wl.confidence,
        tolerance=wl.soak_tolerance,
        floor=wl.soak_floor,
        max_samples=wl.max_samples,
        on_progress=run.on_progress,
    )


def _soak_config(evidence: list[dict[LatencyConfig, ConfigEvidence]]) -> LatencyConfig | None:
    """The config a soak serves: the baseline's gate config (the worst case, as
    `schemas.cell.Cell.gate_latency` picks it), else the first artifact's that has evidence."""

    def worst(ev: ConfigEvidence) -> tuple[float, float]:
        ns = ev.samples_ns
        p99 = percentiles(ns.astype(np.float64) / 1e6).p99 if ns.size else -math.inf
        return worst_first(ev.p99_upper_ms, float(p99))

    for measured in evidence:
        if measured:
            return max(measured, key=lambda config: worst(measured[config]))
    return None


def _open_loops(
    run: RunContext,
    stored: list[tuple[ArtifactSpec, str, Path]],
    live: list[RoundWorker | None],
    spec: OpenLoop | None,
) -> list[OpenLoopResult | None]:
    """Each artifact's highest rate within the p99 budget, when asked; Nones otherwise."""
    if spec is None:
        return [None] * len(stored)
    budget = run.host_class.budgets.p99_ms
    run.on_event(
        f"open loop: Poisson arrivals on {spec.servers} server(s), "
        f"the highest rate with p99 <= {budget:g} ms"
    )
    rates = open_loop(
        live,
        spec,
        budget,
        confidence=run.workload.confidence,
        max_samples=run.workload.max_samples,
        on_progress=run.on_progress,
    )
    for (artifact, _, _), found in zip(stored, rates, strict=True):
        if found is not None:
            run.on_event(f"{artifact.label}: open loop: {open_loop_text(found)}")
    return rates


def latency_of(
    measured: Measurements, index: int, confidence: float, compared_at: float
) -> list[LatencyResult]:
    """Artifact ``index``'s latency results: a candidate's with its ratios to the baseline
    (net of the A/A control's spread), the baseline's with the control's rounds and ratio."""
    base = measured.evidence[0]
    if index > 0:
        ratios = slowdowns(measured.evidence[index], base, compared_at, control=measured.control)
        return latency_results(
            measured.evidence[index], measured.outcomes[index], confidence, ratios
        )
    control = measured.control
    aa = aa_control(control, base, compared_at) if control else {}
    return latency_results(base, measured.outcomes[0], confidence, {}, control=control, aa=aa)


def latency_results(
    evidence: dict[LatencyConfig, ConfigEvidence],
    outcome: WorkerOutcome,
    confidence: float,
    ratios: dict[LatencyConfig, Slowdown],
    control: dict[LatencyConfig, ConfigEvidence] | None = None,
    aa: dict[LatencyConfig, Slowdown] | None = None,
) -> list[LatencyResult]:
    """One artifact's latency results; the baseline's carry the A/A control's rounds
    (``control``) and its ratio to the baseline (``aa``)."""
    throughput = outcome.result.throughput_ips
    results = []
    for config, ev in evidence.items():
        ns = ev.samples_ns
        if ns.size == 0:
            continue
        pct = percentiles(ns.astype(np.float64) / 1e6)
        # The bounds and decision are those of the last scheduled look (a sequential test whose
        # looks share the error, qualify.measure.stats.spend_alpha), not a fresh look at all samples.
        ips = throughput.get(config.short)
        results.append(
            LatencyResult(
                batch_size=config.batch_size,
                concurrency=config.concurrency,
                dims=config.sizes,
                samples=int(ns.size),
                p50_ms=float(pct.p50),
                p90_ms=float(pct.p90),
                p99_ms=float(pct.p99),
                max_ms=float(pct.max),
                mean_ms=float(pct.mean),
                p99_lower_ms=ev.p99_lower_ms,
                p99_upper_ms=ev.p99_upper_ms,
                confidence=confidence,
                decision=ev.decision,  # type: ignore[arg-type]
                stopped=ev.stopped,  # type: ignore[arg-type]
                duration_s=ev.duration_s,
                time_cap_s=ev.time_cap_s,
                throughput_ips=None if ips is None else float(ips),
                rounds=ev.rounds,
                vs_baseline=ratios.get(config),
                control=(aa or {}).get(config),
                control_rounds=list(control[config].rounds)
                if control and config in control
                else [],
                **_stage_figures(ev),
                **_energy_figures(ev),
            )
        )
    return results


def _energy_figures(ev: ConfigEvidence) -> dict[str, Any]:
    """Energy per inference over the rounds, or why there is none."""
    if ev.energy_missing is not None or not ev.energy_j or ev.energy_samples <= 0:
        return {"energy_missing": ev.energy_missing or "no round read the energy counters"}
    return {
        "energy_mj": sum(ev.energy_j.values()) * 1000.0 / ev.energy_samples,
        "energy_source": sorted(ev.energy_j),
    }


def _stage_figures(ev: ConfigEvidence) -> dict[str, Any]:
    """With a pipeline: the model call's own p50/p99 and each stage's share of the time."""
    inference = ev.inference_ns
    total = sum(ev.stage_ns.values())
    if inference.size == 0 or total <= 0:
        return {}
    pct = percentiles(inference.astype(np.float64) / 1e6)
    return {
        "inference_p50_ms": float(pct.p50),
        "inference_p99_ms": float(pct.p99),
        "stage_share": {
            stage: ev.stage_ns.get(stage, 0) / total for stage in ("pre", "inference", "post")
        },
    }


def _bind_label(
    hook: Callable[[str, int], None] | None, label: str
) -> Callable[[int], None] | None:
    if hook is None:
        return None

    def on_start(pid: int) -> None:
        hook(label, pid)

    return on_start
