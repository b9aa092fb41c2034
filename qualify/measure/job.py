"""The typed contract between the parent and the measuring child: the job in, the result out.

Owns `WorkerJob` (built from the project's models by `job_for`, refused by the child when a field
is missing or unknown: `JobError`) and `WorkerResult` (the child's answer, read once by the parent
and refused when damaged: `ResultError`). Standard library only: the child imports it before it
reads its own peak memory. It does not spawn, measure or judge.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from schemas.rules import OFF_PROVIDER_KEPT

if TYPE_CHECKING:
    from pathlib import Path

    from schemas.project import HostClass, Workload

__all__ = [
    "RESULT_MOST_BYTES",
    "FeedJob",
    "JobError",
    "JobMode",
    "OffNode",
    "PlacementReport",
    "ProviderJob",
    "ResultError",
    "WorkerError",
    "WorkerJob",
    "WorkerResult",
    "job_for",
]

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
    """sha256 of the bytes; the parent hashes the file before the child starts and again once it
    has loaded it (`qualify.measure.digest`); the child itself does not hash."""
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


# --- What the child answers -------------------------------------------------------------------

RESULT_MOST_BYTES = 32 * 1024 * 1024
"""The largest result document the parent reads (a real one is a few kB; a hook's warnings or a
damaged file must not be read whole)."""


class ResultError(ValueError):
    """A result document the child could not have written: not JSON, a field unknown here, or
    a value of the wrong kind (named)."""


@dataclass(frozen=True)
class WorkerError:
    """Why the child could not measure: a ``REASON_CODES`` key and one sentence."""

    code: str
    message: str
    traceback: str | None = None
    """The last frames, for an error the worker did not expect."""


@dataclass(frozen=True)
class OffNode:
    """A node onnxruntime placed on another provider than the expected one."""

    name: str
    op_type: str
    domain: str
    provider: str
    """The provider it was placed on."""


@dataclass(frozen=True)
class PlacementReport:
    """Where onnxruntime put the graph's nodes, as the child counted them."""

    nodes_per_provider: dict[str, int]
    total_nodes: int
    expected_provider: str
    fallback_nodes: int
    session_providers: tuple[str, ...]
    source: str
    """``graph_assignment`` (onnxruntime's own record) or ``profiler`` (older builds)."""
    off_provider_nodes: tuple[OffNode, ...] = ()
    """The first `schemas.rules.OFF_PROVIDER_KEPT` nodes off the expected provider;
    ``fallback_nodes`` counts them all."""


@dataclass(frozen=True)
class WorkerResult:
    """The child's result document (``result.json``), typed: what one measuring process reports.

    Every field has a default because a child reports what it got to: a rollback check has no
    latency, a child that failed to load has no placement. The parent reads it once
    (`WorkerResult.from_json`, in `qualify.measure.runner`); everything after reads fields.
    """

    ok: bool = False
    error: WorkerError | None = None
    pid: int | None = None
    subreaper: bool | None = None
    """Whether the child became a subreaper (`qualify.measure.contain`)."""
    cpus: tuple[int, ...] | None = None
    """The CPUs it ran on, sorted; None where the platform cannot say."""
    runtime_import_ms: float | None = None
    import_ms: float | None = None
    """numpy and onnxruntime imported, before any model."""
    import_hwm_kb: int | None = None
    """The child's peak RSS with numpy and onnxruntime loaded, before any model."""
    runtime_version: str | None = None
    warnings: tuple[str, ...] = ()
    """What Python's warnings said while the session was created, and the worker's own notes."""
    session_create_ms: float | None = None
    cold_init_ms: float | None = None
    warm_init_ms: float | None = None
    placement: PlacementReport | None = None
    hwm_before_warm_kb: int | None = None
    hwm_before_profile_kb: int | None = None
    hwm_before_open_loop_kb: int | None = None
    kernel_ms_per_provider: dict[str, float] | None = None
    configs: tuple[dict[str, Any], ...] = ()
    """``full`` mode: each config's figures (the bench harness reads them), in order."""
    throughput_ips: dict[str, float] = dataclasses.field(default_factory=dict)
    """``serve`` mode: inferences per second by config key (``b1_c2``)."""
    rows: int | None = None
    """``--feed``: how many rows it fed."""
    vm_hwm_kb: int | None = None
    """The peak of serving the model (see the worker's ``main``)."""
    imported_at_peak: tuple[str, ...] = ()
    """Top-level third-party packages loaded when the peak was read."""

    @classmethod
    def from_json(cls, data: bytes | str) -> WorkerResult:
        """Read a result document.

        Raises:
            ResultError: over `RESULT_MOST_BYTES`, not JSON, not an object, a field unknown
                here or of the wrong kind (the message names it).
        """
        if len(data) > RESULT_MOST_BYTES:
            raise ResultError(f"the result is {len(data):,} bytes, over {RESULT_MOST_BYTES:,}")
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise ResultError(f"the result is not JSON: {str(exc)[:200]}") from None
        return cls.from_doc(doc)

    @classmethod
    def from_doc(cls, doc: object) -> WorkerResult:
        """Read a result already parsed from JSON (see `from_json`)."""
        fields = _known(cls, doc, "result")
        return cls(**{k: _RESULT_FIELDS[k](v, f"result.{k}") for k, v in fields.items()})


def _known(kind: type, doc: object, where: str) -> dict[str, Any]:
    """``doc``'s fields, each one ``kind`` has (a missing one takes its default)."""
    if not isinstance(doc, dict):
        raise ResultError(f"{where} is {type(doc).__name__}, not an object")
    unknown = sorted(str(k)[:40] for k in doc.keys() - {f.name for f in dataclasses.fields(kind)})
    if unknown:
        raise ResultError(
            f"{where} has fields this qualify does not know: {unknown[:5]} (parent and worker "
            "must be the same version)"
        )
    return dict(doc)


def _bad(value: object, where: str, kind: str) -> ResultError:
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return ResultError(f"{where} is {shown}, not {kind}")


def _int(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(value, where, "an integer")
    return value


def _float(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(value, where, "a number")
    return float(value)


def _str(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise _bad(value, where, "a string")
    return value


def _bool(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise _bad(value, where, "true or false")
    return value


def _list(value: object, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise _bad(value, where, "a list")
    return value


def _optional(read: Any) -> Any:
    def optional(value: object, where: str) -> Any:
        return None if value is None else read(value, where)

    return optional


def _tuple_of(read: Any) -> Any:
    def items(value: object, where: str) -> tuple[Any, ...]:
        return tuple(read(v, f"{where}[{i}]") for i, v in enumerate(_list(value, where)))

    return items


def _map_of(read: Any) -> Any:
    def mapping(value: object, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise _bad(value, where, "an object")
        return {str(k): read(v, f"{where}.{str(k)[:40]}") for k, v in value.items()}

    return mapping


def _scalar(value: object, where: str) -> Any:
    if value is not None and not isinstance(value, str | int | float):
        raise _bad(value, where, "a number, a string or null")
    return value


def _error(value: object, where: str) -> WorkerError:
    fields = _known(WorkerError, value, where)
    return WorkerError(
        code=_str(fields.get("code"), f"{where}.code"),
        message=_str(fields.get("message"), f"{where}.message"),
        traceback=_optional(_str)(fields.get("traceback"), f"{where}.traceback"),
    )


def _off_node(value: object, where: str) -> OffNode:
    fields = _known(OffNode, value, where)
    return OffNode(**{k: _str(fields.get(k), f"{where}.{k}") for k in _OFF_NODE_FIELDS})


_OFF_NODE_FIELDS = ("name", "op_type", "domain", "provider")


def _off_nodes(value: object, where: str) -> tuple[OffNode, ...]:
    found = _tuple_of(_off_node)(value, where)
    if len(found) > OFF_PROVIDER_KEPT:
        raise ResultError(f"{where} names {len(found)} nodes, over {OFF_PROVIDER_KEPT}")
    return found  # type: ignore[no-any-return]


_PLACEMENT_FIELDS: dict[str, Any] = {
    "nodes_per_provider": _map_of(_int),
    "total_nodes": _int,
    "expected_provider": _str,
    "fallback_nodes": _int,
    "session_providers": _tuple_of(_str),
    "source": _str,
}
_PLACEMENT_OPTIONAL: dict[str, Any] = {"off_provider_nodes": _off_nodes}


def _placement(value: object, where: str) -> PlacementReport:
    fields = _known(PlacementReport, value, where)
    missing = sorted(_PLACEMENT_FIELDS.keys() - fields.keys())
    if missing:
        raise ResultError(f"{where} lacks {missing}")
    given = {k: read(fields[k], f"{where}.{k}") for k, read in _PLACEMENT_FIELDS.items()}
    for k, read in _PLACEMENT_OPTIONAL.items():
        if k in fields:
            given[k] = read(fields[k], f"{where}.{k}")
    return PlacementReport(**given)


_RESULT_FIELDS: dict[str, Any] = {
    "ok": _bool,
    "error": _optional(_error),
    "pid": _optional(_int),
    "subreaper": _optional(_bool),
    "cpus": _optional(_tuple_of(_int)),
    "runtime_import_ms": _optional(_float),
    "import_ms": _optional(_float),
    "import_hwm_kb": _optional(_int),
    "runtime_version": _optional(_str),
    "warnings": _tuple_of(_str),
    "session_create_ms": _optional(_float),
    "cold_init_ms": _optional(_float),
    "warm_init_ms": _optional(_float),
    "placement": _optional(_placement),
    "hwm_before_warm_kb": _optional(_int),
    "hwm_before_profile_kb": _optional(_int),
    "hwm_before_open_loop_kb": _optional(_int),
    "kernel_ms_per_provider": _optional(_map_of(_float)),
    "configs": _tuple_of(_map_of(_scalar)),
    "throughput_ips": _map_of(_float),
    "rows": _optional(_int),
    "vm_hwm_kb": _optional(_int),
    "imported_at_peak": _tuple_of(_str),
}
"""How each field of `WorkerResult` is read (a test holds it to the dataclass's fields)."""
