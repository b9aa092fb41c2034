"""The worker's job: the typed contract between the parent and the measuring subprocess.

Owns the fields a job carries (`WorkerJob`, `ProviderJob`), building one from the project file
(`job_for`) and reading one back in the child (`WorkerJob.from_json`). Every setting comes from
the project's models (`schemas.project`), which hold the one set of defaults: no field of a job
has a default of its own, so a job that lacks a field, or carries one this version does not
know, is refused (`JobError`) instead of measured under a guess. The parent (`qualify.run`,
`qualify.measure.runner`) writes it as JSON; the child (`qualify.measure.worker`) reads it.

Standard library only when imported: the child imports it before it reads its own peak memory.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from pathlib import Path

    from schemas.project import HostClass, Workload

__all__ = ["FeedJob", "JobError", "JobMode", "ProviderJob", "WorkerJob", "job_for"]

JobMode = Literal["full", "serve", "check", "parity"]
"""``full``: measure everything in one go; ``serve``: prepare, then answer interleaved rounds;
``check``: only prove the artifact loads (the rollback check); ``parity``: only the parity
outputs (the pass on an emulated CPU, `qualify.measure.emulators`)."""

_MODES = ("full", "serve", "check", "parity")


class JobError(ValueError):
    """A job document that does not match this contract."""


@dataclass(frozen=True)
class ProviderJob:
    """How the session is built: the class's ``provider`` settings."""

    execution_providers: tuple[str, ...]
    expected: str
    provider_options: dict[str, dict[str, Any]]
    session_config: dict[str, Any]
    graph_optimization_level: str
    execution_mode: str | None
    intra_op_threads: int | None
    inter_op_threads: int | None
    strict_fallback: bool
    cpus: tuple[int, ...] | None
    """The CPUs to pin the process to (``provider.cpu_affinity`` and ``numa_node`` resolved on
    this host by the parent); None: no pinning."""


@dataclass(frozen=True)
class WorkerJob:
    """One artifact's measurement, as the child receives it."""

    mode: JobMode
    artifact_path: str
    expected_digest: str
    """sha256 of the bytes; the child re-hashes what it hands to onnxruntime."""
    provider: ProviderJob
    memory_limit_mb: int | None
    inputs_path: str
    """The shared input pool (``.npz``)."""
    inputs: dict[str, dict[str, Any]]
    """Per input, the workload's description of it (``source``, ``batch_axis`` and
    ``state_from`` decide how rows are drawn: `schemas.rules.batched_on`)."""
    outputs_path: str
    samples_path: str
    parity_rows: int
    configs: tuple[tuple[int, int], ...]
    """(batch size, concurrency) pairs, in the order they are measured."""
    warmup: int
    min_samples: int
    max_samples: int
    time_cap_s: float | None
    """None: the adaptive cap (`qualify.measure.stats.time_cap`)."""
    throughput_s: float
    confidence: float
    budget_p99_ms: float
    postprocess: str
    pre_hook: str | None
    """``workload.pipeline.pre`` (``module:function``), None without one."""
    post_hook: str | None
    """``workload.pipeline.post``, None without one."""
    hook_root: str
    """The project file's folder: hooks are imported from there first."""
    profile_runs: int
    result_path: str | None
    """Set by `qualify.measure.runner` when it spawns the child; None until then."""
    parent_pid: int | None
    """Set by `qualify.measure.runner`: the child exits when its parent is gone."""
    reply_fd: int | None
    """Set by `qualify.measure.runner` in ``serve`` mode: the pipe the child answers rounds on."""
    command_fd: int | None
    """Set by `qualify.measure.runner` in ``serve`` mode: the pipe the child reads commands from (its
    own, not stdin, which is ``/dev/null``: a hook that reads stdin must not eat them)."""

    def to_json(self) -> str:
        """The job as the JSON document the child reads."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> WorkerJob:
        """Read a job document, refusing one that lacks a field or has one unknown here.

        Raises:
            JobError: not JSON, not an object, a field missing or unknown, a bad mode.
        """
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise JobError(f"the job is not JSON: {exc}") from None
        fields = _fields(cls, doc, "job")
        provider = _fields(ProviderJob, fields["provider"], "job.provider")
        if fields["mode"] not in _MODES:
            raise JobError(f"job.mode is {fields['mode']!r}; one of {', '.join(_MODES)}")
        try:
            provider["execution_providers"] = tuple(provider["execution_providers"])
            if provider["cpus"] is not None:
                provider["cpus"] = tuple(int(c) for c in provider["cpus"])
            fields["configs"] = tuple((int(b), int(c)) for b, c in fields["configs"])
        except (TypeError, ValueError, OverflowError) as exc:  # int(inf) overflows
            raise JobError(f"job.configs or job.provider.execution_providers: {exc}") from None
        fields["provider"] = ProviderJob(**provider)
        return cls(**fields)


@dataclass(frozen=True)
class FeedJob:
    """The model's feed for calibration rows, made by the workload's ``pre`` hook in the same
    supervised child as a measurement (``python -m qualify.measure.worker --feed JOB.json``): the user's
    code never runs inside qualify's own process."""

    inputs_path: str
    """The workload's rows as built (``.npz``, rows on axis 0)."""
    rows: int
    """How many rows, from the first, to feed one at a time."""
    pre_hook: str
    """``workload.pipeline.pre`` (``module:function``)."""
    hook_root: str
    """The project file's folder: hooks are imported from there first."""
    outputs_path: str
    """Where the child writes the feeds, concatenated per input (``.npz``)."""
    memory_limit_mb: int | None
    result_path: str | None
    """Set by `qualify.measure.runner` when it spawns the child; None until then."""
    parent_pid: int | None
    """Set by `qualify.measure.runner`: the child exits when its parent is gone."""

    def to_json(self) -> str:
        """The job as the JSON document the child reads."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> FeedJob:
        """Read a feed job, refusing one that lacks a field or has one unknown here.

        Raises:
            JobError: not JSON, not an object, a field missing or unknown.
        """
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise JobError(f"the job is not JSON: {exc}") from None
        return cls(**_fields(cls, doc, "feed job"))


def _fields(kind: type, doc: object, where: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise JobError(f"{where} is not an object")
    names = {f.name for f in dataclasses.fields(kind)}
    missing = sorted(names - doc.keys())
    unknown = sorted(doc.keys() - names)
    if missing or unknown:
        raise JobError(
            f"{where} does not match this qualify's worker: missing {missing or 'none'}, "
            f"unknown {unknown or 'none'} (parent and worker must be the same version)"
        )
    return dict(doc)


def job_for(
    *,
    artifact_path: Path,
    digest: str,
    host_class: HostClass,
    workload: Workload,
    root: Path,
    inputs_path: Path,
    work: Path,
    mode: JobMode,
    cpus: list[int] | None = None,
) -> WorkerJob:
    """The job of one artifact on one class, every setting from the project file's models
    (``root``: the project file's folder, where hooks are imported from)."""
    wl = workload
    provider = host_class.provider
    return WorkerJob(
        mode=mode,
        artifact_path=str(artifact_path),
        expected_digest=digest,
        provider=ProviderJob(
            execution_providers=tuple(provider.execution_providers),
            expected=provider.expected,
            provider_options={k: dict(v) for k, v in provider.provider_options.items()},
            session_config=dict(provider.session_config),
            graph_optimization_level=provider.graph_optimization_level,
            execution_mode=provider.execution_mode,
            intra_op_threads=provider.intra_op_threads,
            inter_op_threads=provider.inter_op_threads,
            strict_fallback=provider.strict_fallback,
            cpus=tuple(cpus) if cpus is not None else None,
        ),
        memory_limit_mb=host_class.budgets.memory_limit_mb,
        inputs_path=str(inputs_path),
        inputs={k: v.model_dump() for k, v in wl.inputs.items()},
        outputs_path=str(work / "outputs.npz"),
        samples_path=str(work / "samples.npz"),
        parity_rows=wl.parity_samples,
        configs=tuple((b, c) for b in wl.batch_sizes for c in wl.concurrency),
        warmup=wl.warmup,
        min_samples=wl.min_samples,
        max_samples=wl.max_samples,
        time_cap_s=wl.time_cap_s,
        throughput_s=wl.throughput_s,
        confidence=wl.confidence,
        budget_p99_ms=host_class.budgets.p99_ms,
        postprocess=wl.postprocess,
        pre_hook=wl.pipeline.pre if wl.pipeline else None,
        post_hook=wl.pipeline.post if wl.pipeline else None,
        hook_root=str(root),
        profile_runs=wl.profile_runs,
        result_path=None,
        parent_pid=None,
        reply_fd=None,
        command_fd=None,
    )
