"""Scripted stand-ins for the measuring subprocesses, for `qualify.run.qualify_run`'s seam
(`qualify.measure.runner.Workers`): each artifact behaves as its `Script` says, in milliseconds and
without onnxruntime, so a test can drive every way a worker ends through the whole run."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from qualify.measure.job import OffNode, PlacementReport, WorkerJob, WorkerResult
from qualify.measure.runner import Launch, WorkerOutcome, Workers
from schemas.rules import OFF_PROVIDER_KEPT, fallback_count

CPU = "CPUExecutionProvider"


@dataclass(frozen=True)
class Script:
    """How one artifact's process behaves."""

    latency_s: float = 0.002
    """Every inference takes this long (with 1% seeded jitter)."""
    placement: Mapping[str, int] = field(default_factory=lambda: {CPU: 10})
    off_provider: tuple[tuple[str, str], ...] | None = None
    """(name, op type) of the nodes its session places off the expected provider, in order;
    None: ``node<i>``/``Op`` for as many as ``placement`` puts there (the first 20 named)."""
    outputs: Mapping[str, np.ndarray] = field(
        default_factory=lambda: {"y": np.linspace(0.0, 1.0, 64, dtype=np.float32).reshape(4, 16)}
    )
    """What it writes as its parity outputs."""
    dies: str | None = None
    """``"ready"``: ends before it is ready; ``"round"``: ends at its first round."""
    load_error: str | None = None
    """The rollback check (``run``) reports this error code."""
    cold_init_ms: float = 12.0
    energy_mj: float | None = None
    """Millijoules per inference the package counter reports; None: no counters."""
    per_process: tuple[float, ...] = ()
    """Latency factor of each process started for this artifact, in order (the baseline's
    second is its A/A control): two processes of the same bytes differ; 1.0 past the end."""
    emulated_outputs: Mapping[str, np.ndarray] | None = None
    """What its parity pass on an emulated CPU writes; None: the same as ``outputs``."""
    emulated_error: str | None = None
    """Its parity pass on an emulated CPU ends with this error code instead."""


def digest_of(path: Path) -> str:
    """The digest a run's store gives the file (what scripts are keyed by)."""
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def _result(job: WorkerJob, script: Script) -> WorkerResult:
    expected = job.provider.expected
    nodes = dict(script.placement)
    return WorkerResult(
        ok=True,
        runtime_version="1.32.0",
        cold_init_ms=script.cold_init_ms,
        warm_init_ms=script.cold_init_ms / 2,
        placement=PlacementReport(
            nodes_per_provider=nodes,
            total_nodes=sum(nodes.values()),
            expected_provider=expected,
            fallback_nodes=fallback_count(nodes, expected),
            session_providers=tuple(job.provider.execution_providers),
            source="graph_assignment",
            off_provider_nodes=_off_nodes(nodes, expected, script),
        ),
    )


def _off_nodes(nodes: Mapping[str, int], expected: str, script: Script) -> tuple[OffNode, ...]:
    """The nodes the script places off ``expected``, as the worker names them."""
    elsewhere = [p for p, n in nodes.items() if p != expected for _ in range(n)]
    named = script.off_provider or tuple((f"node{i}", "Op") for i in range(len(elsewhere)))
    return tuple(
        OffNode(name=name, op_type=op, domain="", provider=provider)
        for (name, op), provider in zip(named, elsewhere, strict=False)
    )[:OFF_PROVIDER_KEPT]


def queue_reply(rate: float, arrivals: int, seed: int, service_s: float) -> dict[str, Any]:
    """What the worker's open-loop round answers for an M/D/1 queue: Poisson arrivals at
    ``rate`` served one at a time for exactly ``service_s`` each (Lindley's recursion)."""
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, arrivals)
    due = np.cumsum(gaps)
    latency = np.empty(arrivals)
    free = 0.0  # when the server next falls idle
    for i, arrives in enumerate(due.tolist()):
        done = max(free, arrives) + service_s
        latency[i], free = done - arrives, done
    return {
        "samples_ns": (latency * 1e9).astype(np.int64).tolist(),
        "service_ns": [int(service_s * 1e9)] * arrivals,
        "duration_s": free,
    }


class ScriptedWorker:
    """One artifact's scripted process (`qualify.measure.runner.RoundWorker`)."""

    def __init__(self, job: WorkerJob, script: Script, pid: int, factor: float = 1.0) -> None:
        self.job, self.script, self.pid = job, script, pid
        self.latency_s = script.latency_s * factor
        self.alive = script.dies != "ready"
        self.rounds = 0
        self._rng = np.random.default_rng(pid)
        if self.alive:
            np.savez(job.outputs_path, allow_pickle=False, **dict(script.outputs))

    def ready(self) -> bool:
        return self.alive

    def round(self, cmd: dict[str, Any]) -> dict[str, Any] | None:
        if self.script.dies == "round":
            self.alive = False
            return None
        self.rounds += 1
        if "rate" in cmd:
            return queue_reply(
                float(cmd["rate"]), int(cmd["arrivals"]), int(cmd["seed"]), self.script.latency_s
            )
        n = max(1, min(int(cmd["max_samples"]), int(float(cmd["time_s"]) / self.latency_s)))
        samples = self.latency_s * (1 + 0.01 * self._rng.random(n))
        ns = (samples * 1e9).astype(np.int64)
        energy = self.script.energy_mj
        return {
            "samples_ns": ns.tolist(),
            "duration_s": float(samples.sum()),
            "energy_j": None if energy is None else {"intel-rapl:0 (package-0)": energy * n / 1e3},
            "energy_missing": "no powercap counters (scripted)" if energy is None else None,
        }

    def finish(self, configs: list[dict[str, int]]) -> WorkerOutcome:
        self.alive = False
        died = self.script.dies
        result = WorkerResult() if died else _result(self.job, self.script)
        return WorkerOutcome(
            result=result,
            error_code="crashed" if died else None,
            error_message=f"the scripted process ended at {died}" if died else None,
            peak_rss_mb=None if died else 80.0,
            peak_rss_source=None if died else "vmhwm",
            exit_status=1 if died else 0,
            signal_name=None,
            wall_s=0.01,
        )

    def close(self) -> None:
        self.alive = False


@dataclass
class ScriptedWorkers:
    """Scripts by artifact digest; what was started, for the test to inspect."""

    scripts: Mapping[str, Script]
    started: list[ScriptedWorker] = field(default_factory=list)
    checked: list[WorkerJob] = field(default_factory=list)
    emulated_jobs: list[tuple[WorkerJob, Launch]] = field(default_factory=list)
    runtime_version: str = "1.32.0"

    def _script(self, job: WorkerJob) -> Script:
        return self.scripts.get(job.expected_digest, Script())

    def serve(
        self,
        job: WorkerJob,
        workdir: Path,
        *,
        timeout_s: float,
        on_start: Callable[[int], None] | None = None,
    ) -> ScriptedWorker:
        script = self._script(job)
        mine = sum(w.job.expected_digest == job.expected_digest for w in self.started)
        factor = script.per_process[mine] if mine < len(script.per_process) else 1.0
        worker = ScriptedWorker(job, script, pid=1000 + len(self.started), factor=factor)
        self.started.append(worker)
        if on_start is not None:
            on_start(worker.pid)
        return worker

    def run(self, job: WorkerJob, workdir: Path, *, timeout_s: float) -> WorkerOutcome:
        self.checked.append(job)
        error = self._script(job).load_error
        return WorkerOutcome(
            result=WorkerResult(ok=not error),
            error_code=error,
            error_message=f"scripted {error}" if error else None,
            peak_rss_mb=None,
            exit_status=0,
            signal_name=None,
            wall_s=0.01,
        )

    def emulated(
        self, job: WorkerJob, workdir: Path, *, timeout_s: float, launch: Launch
    ) -> WorkerOutcome:
        """A parity pass under QEMU (`qualify.measure.emulators`), as its script says."""
        self.emulated_jobs.append((job, launch))
        script = self._script(job)
        error = script.emulated_error
        if error is None:
            outputs = script.emulated_outputs or script.outputs
            np.savez(job.outputs_path, allow_pickle=False, **dict(outputs))
        return WorkerOutcome(
            result=WorkerResult()
            if error
            else WorkerResult(ok=True, runtime_version=self.runtime_version),
            error_code=error,
            error_message=f"scripted {error} under QEMU" if error else None,
            peak_rss_mb=None,
            exit_status=0,
            signal_name=None,
            wall_s=0.01,
        )

    def probe(self) -> dict[str, Any]:
        return {
            "package": "onnxruntime",
            "version": self.runtime_version,
            "build_info": "scripted",
            "available_providers": [CPU],
            "ep_devices": [],
        }

    def seam(self) -> Workers:
        """The seam `qualify_run` takes."""
        return Workers(serve=self.serve, run=self.run, probe=self.probe, emulated=self.emulated)
