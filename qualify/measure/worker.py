"""The measuring child: one artifact, one fresh interpreter, real onnxruntime.

Owns what happens inside the measured subprocess: the digest on the exact bytes it loads, cold and
warm init, node placement, parity outputs, latency with adaptive p99 sampling, throughput. It is the
only module (with conversion) that imports onnxruntime; it reads a `qualify.measure.job.WorkerJob`
and writes the result `qualify.measure.job.WorkerResult` reads. It judges nothing. Kept lean (no
pydantic, no pandas): its imports count towards the measured memory.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qualify.measure import contain, cpus, energy
from qualify.measure.job import FeedJob, JobError, WorkerJob
from qualify.measure.procfs import hwm_kb, reset_hwm
from schemas.rules import OFF_PROVIDER_KEPT, batched_on, fallback_count, sample_at, swept_axes
from schemas.settings import option_text

__all__ = ["classify_exception", "main", "probe"]

OOM_MARKERS = ("bad_alloc", "failed to allocate", "out of memory", "cannot allocate memory")


def classify_exception(exc: BaseException, stage: str) -> str:
    """Reason code for an exception raised at ``stage`` ('load' or 'run')."""
    text = f"{type(exc).__name__}: {exc}".lower()
    if isinstance(exc, MemoryError) or any(m in text for m in OOM_MARKERS):
        return "out_of_memory"
    return "load_failed" if stage == "load" else "run_failed"


def _die_with_parent(parent_pid: int | None) -> None:
    """Ask Linux to SIGKILL this child when the parent dies (a killed ``qualify run`` must not
    leave a hung model spinning); exit at once if the parent is already gone."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(3)


def _set_memory_limit(limit_mb: int | None) -> str | None:
    """Limit this process's address space to ``limit_mb``; why it could not be, else None (a
    limit above what the hard limit allows, or one the platform cannot represent)."""
    if not limit_mb:
        return None
    import resource

    limit = int(limit_mb) * 1024 * 1024
    try:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ValueError, OSError, OverflowError) as exc:
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        most = "unlimited" if hard == resource.RLIM_INFINITY else f"{hard // 2**20} MB"
        return (
            f"cannot limit the subprocess's address space to memory_limit_mb {limit_mb} "
            f"({exc}); this host's hard limit is {most}. Fix: lower budgets.memory_limit_mb"
        )
    return None


def _distribution() -> str | None:
    from importlib import metadata

    for name in (
        "onnxruntime",
        "onnxruntime-gpu",
        "onnxruntime-directml",
        "onnxruntime-openvino",
        "onnxruntime-qnn",
        "onnxruntime-silicon",
    ):
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        return name
    return None


def probe() -> dict[str, Any]:
    """The onnxruntime identity of this host: version, build info, providers, EP devices."""
    import onnxruntime as ort

    build = ort.get_build_info() if hasattr(ort, "get_build_info") else None
    devices: list[dict[str, str]] = []
    if hasattr(ort, "get_ep_devices"):
        for d in ort.get_ep_devices():
            devices.append(
                {
                    "ep_name": str(d.ep_name),
                    "ep_vendor": str(getattr(d, "ep_vendor", "")),
                    "device_type": str(d.device.type).rsplit(".", 1)[-1],
                    "device_vendor": str(getattr(d.device, "vendor", "")),
                }
            )
    return {
        "package": _distribution(),
        "version": ort.__version__,
        "build_info": build,
        "available_providers": list(ort.get_available_providers()),
        "ep_devices": devices,
    }


class _Failure(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _session_options(ort: Any, job: WorkerJob, record_placement: bool) -> Any:
    so = ort.SessionOptions()
    provider = job.provider
    if provider.intra_op_threads is not None:
        so.intra_op_num_threads = provider.intra_op_threads
    if provider.inter_op_threads is not None:
        so.inter_op_num_threads = provider.inter_op_threads
    level = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[provider.graph_optimization_level]
    so.graph_optimization_level = level
    if provider.execution_mode == "parallel":
        so.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    for key, value in provider.session_config.items():
        so.add_session_config_entry(str(key), option_text(value))
    if provider.strict_fallback:
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    if record_placement:
        so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    return so


def _sha256_file(path: str) -> str:
    """sha256 of a file, read in bounded chunks, with CPython's built-in implementation where it
    has one: ``hashlib`` loads OpenSSL's libcrypto, 3.7 MB of resident memory the measured peak
    would carry."""
    import importlib

    hasher: Any = None
    for name in ("_sha2", "_sha256"):  # CPython 3.12+, then 3.11
        try:
            hasher = importlib.import_module(name).sha256()
            break
        except ImportError:
            continue
    if hasher is None:
        import hashlib

        hasher = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            hasher.update(chunk)
    return "sha256:" + str(hasher.hexdigest())


def _verify(job: WorkerJob, when: str) -> None:
    """The artifact's bytes on disk are the ones the job names, or a ``digest_mismatch``."""
    try:
        digest = _sha256_file(job.artifact_path)
    except OSError as exc:
        raise _Failure("load_failed", f"cannot read {job.artifact_path}: {exc}") from exc
    if digest != job.expected_digest:
        raise _Failure(
            "digest_mismatch",
            f"{job.artifact_path} has {digest} {when}, expected {job.expected_digest}; "
            "the stored copy was modified",
        )


def _trim_heap() -> None:
    """Hand freed heap back to the kernel (glibc's ``malloc_trim``), so that what the warm-init
    session left behind is not counted in the served peak that follows; a no-op elsewhere."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        return


def _create(
    ort: Any,
    model: str,
    job: WorkerJob,
    record_placement: bool,
    profile_prefix: str | None = None,
) -> Any:
    provider = job.provider
    names = list(provider.execution_providers)
    options = [
        {str(k): option_text(v) for k, v in provider.provider_options.get(n, {}).items()}
        for n in names
    ]
    so = _session_options(ort, job, record_placement)
    if profile_prefix is not None:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    return ort.InferenceSession(model, so, providers=names, provider_options=options)


def _placement_doc(
    counts: dict[str, int],
    expected: str,
    session: Any,
    source: str,
    off: list[dict[str, str]],
) -> dict[str, Any]:
    total = sum(counts.values())
    return {
        "nodes_per_provider": dict(sorted(counts.items())),
        "total_nodes": total,
        "expected_provider": expected,
        "fallback_nodes": fallback_count(counts, expected),
        "session_providers": list(session.get_providers()),
        "source": source,
        "off_provider_nodes": off,
    }


def _off_node(name: str, op_type: str, domain: str, provider: str) -> dict[str, str]:
    """A node that ran off the expected provider, its texts cut to what the cell keeps."""
    return {
        "name": str(name)[:512],
        "op_type": str(op_type)[:256],
        "domain": str(domain)[:256],
        "provider": str(provider)[:256],
    }


def _placement(session: Any, expected: str) -> dict[str, Any] | None:
    """Nodes per provider from ``get_provider_graph_assignment_info()``, and the first
    `OFF_PROVIDER_KEPT` nodes off ``expected`` by name; None on older builds."""
    getter = getattr(session, "get_provider_graph_assignment_info", None)
    if getter is None:
        return None
    counts: dict[str, int] = {}
    off: list[dict[str, str]] = []
    for subgraph in getter():
        nodes = subgraph.get_nodes()
        counts[subgraph.ep_name] = counts.get(subgraph.ep_name, 0) + len(nodes)
        if subgraph.ep_name == expected:
            continue
        for node in nodes[: max(0, OFF_PROVIDER_KEPT - len(off))]:
            off.append(_off_node(node.name, node.op_type, node.domain, subgraph.ep_name))
    return _placement_doc(counts, expected, session, "graph_assignment", off)


def _profile_events(
    ort: Any, model: str, job: WorkerJob, feeds: list[dict[str, Any]], runs: int, name: str
) -> list[dict[str, Any]]:
    """onnxruntime's profiler events for ``runs`` inferences on a fresh profiled session."""
    prefix = str(Path(job.outputs_path).with_name(name))
    session = _create(ort, model, job, record_placement=False, profile_prefix=prefix)
    for k in range(runs):
        session.run(None, feeds[k % len(feeds)])
    path = Path(session.end_profiling())
    try:
        events: list[dict[str, Any]] = json.loads(path.read_text(encoding="utf-8"))
    finally:
        path.unlink(missing_ok=True)
    return events


def _node_events(events: list[dict[str, Any]]) -> Iterator[tuple[str, str, float, str]]:
    """(node name, provider, duration us, op type) of each kernel the profiler saw run."""
    suffix = "_kernel_time"
    for event in events:
        name = str(event.get("name", ""))
        if event.get("cat") == "Node" and name.endswith(suffix):
            args = event.get("args", {})
            provider = str(args.get("provider", "unknown"))
            op = str(args.get("op_name", ""))
            yield name[: -len(suffix)], provider, float(event.get("dur", 0)), op


def _placement_from_profile(
    ort: Any, model: str, job: WorkerJob, feed: dict[str, Any], session: Any
) -> dict[str, Any]:
    """Nodes per provider from one profiled inference, for builds without the placement API.

    onnxruntime before 1.31 has no ``get_provider_graph_assignment_info``, but its profiler
    names the provider that executed every kernel: each node that ran, counted once, under that
    provider. It counts what ran, so it is evidence of actual placement (``source: profiler``);
    it counts kernels after fusion, so a QDQ graph shows fewer nodes than the graph assignment
    reports (measured on the bench CNN's int8 QDQ build: 10 against 28; fp32: 7 against 9).
    """
    first: dict[str, tuple[str, str]] = {}
    events = _profile_events(ort, model, job, [feed], 1, "place")
    for node, provider, _, op in _node_events(events):
        first.setdefault(node, (provider, op))
    counts: dict[str, int] = {}
    off: list[dict[str, str]] = []
    expected = job.provider.expected
    for node, (provider, op) in first.items():
        counts[provider] = counts.get(provider, 0) + 1
        if provider != expected and len(off) < OFF_PROVIDER_KEPT:
            off.append(_off_node(node, op, "", provider))
    return _placement_doc(counts, expected, session, "profiler", off)


def _batch(pool: dict[str, Any], job: WorkerJob, start: int, size: int) -> dict[str, Any]:
    """``size`` samples from row ``start`` of the pool (rows on axis 0), each input batched on
    its own axis; an input fed whole takes the one sample at ``start``."""
    import numpy as np

    feed: dict[str, Any] = {}
    for name, array in pool.items():
        n = array.shape[0]
        spec = job.inputs[name]
        axis = batched_on(spec.get("batch_axis", 0), spec["source"], spec.get("state_from"))
        if axis is None:
            # A 0-d array for a scalar, not a number; copied (C order) when a swept axis was cut.
            whole = array[start % n, ...]
            feed[name] = whole if whole.flags.c_contiguous else whole.copy()
            continue
        idx = (np.arange(start, start + size) % n).astype(np.int64)
        rows = array[idx]
        feed[name] = np.ascontiguousarray(np.moveaxis(rows, 0, axis) if axis else rows)
    return feed


def _at_dims(pool: dict[str, Any], job: WorkerJob, dims: dict[str, int]) -> dict[str, Any]:
    """The pool (built at each swept dimension's largest size) at the sizes ``dims`` gives:
    the leading part of every swept axis, as views; the pool itself when nothing is swept."""
    if not dims:
        return pool
    cut: dict[str, Any] = {}
    for name, array in pool.items():
        spec = job.inputs[name]
        axis = batched_on(spec.get("batch_axis", 0), spec["source"], spec.get("state_from"))
        shape = list(spec["shape"])
        sizes = sample_at(shape, axis, dims)
        swept = set(swept_axes(shape, axis))
        index = [slice(0, sizes[k]) if k in swept else slice(None) for k in range(len(sizes))]
        cut[name] = array[(slice(None), *index)]
    return cut


def _postprocess(kind: str) -> Callable[[list[Any]], Any]:
    import numpy as np

    if kind == "argmax":
        return lambda outs: np.argmax(outs[0], axis=-1)
    if kind == "softmax":

        def softmax(outs: list[Any]) -> Any:
            x = outs[0] - np.max(outs[0], axis=-1, keepdims=True)
            e = np.exp(x)
            return e / e.sum(axis=-1, keepdims=True)

        return softmax
    return lambda outs: outs


class _Recurrent:
    """A session whose ``state_from`` inputs take what the previous inference returned.

    Each thread carries its own state (a serving thread follows its own sequence), one per input
    and shape (batch sizes differ between configs); the first step of a sequence feeds the
    workload's own value of the input. Everything else is the wrapped session's.
    """

    def __init__(self, session: Any, links: dict[str, str]) -> None:
        outputs = [o.name for o in session.get_outputs()]
        missing = sorted(f"{n} <- {s}" for n, s in links.items() if s not in outputs)
        if missing:
            raise _Failure(
                "load_failed",
                f"workload state_from names outputs this model lacks ({', '.join(missing)}); "
                f"its outputs are {outputs[:20]}",
            )
        self._session = session
        self._links = [(name, outputs.index(source)) for name, source in links.items()]
        self._local = threading.local()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    def reset(self) -> None:
        """Start this thread's sequences again from the workload's values."""
        self._local.state = {}

    def run(self, names: Any, feed: dict[str, Any]) -> Any:
        state: dict[tuple[str, Any], Any] | None = getattr(self._local, "state", None)
        if state is None:
            state = self._local.state = {}
        shapes = {name: feed[name].shape for name, _ in self._links}
        feed = dict(feed)
        for name, _ in self._links:
            carried = state.get((name, shapes[name]))
            if carried is not None:
                feed[name] = carried
        outs = self._session.run(names, feed)
        for name, k in self._links:
            state[(name, shapes[name])] = outs[k]
        return outs


def _recurrent(session: Any, job: WorkerJob) -> Any:
    links = {n: str(i["state_from"]) for n, i in job.inputs.items() if i.get("state_from")}
    return _Recurrent(session, links) if links else session


class _Hook:
    """A ``workload.pipeline`` hook imported in this process. Calling it turns anything it
    raises into ``hook_failed``, naming the hook and the line of its own code that raised."""

    def __init__(self, stage: str, spec: str, root: str) -> None:
        import importlib

        self.stage, self.spec = stage, spec
        module_name, _, name = spec.partition(":")
        if module_name.partition(".")[0] in sys.stdlib_module_names:
            raise _Failure(
                "hook_failed",
                f"workload.pipeline.{stage} {spec}: {module_name!r} is a module of Python's "
                "standard library, not a hook of the project's",
            )
        if root not in sys.path:
            sys.path.insert(0, root)
        try:
            module = importlib.import_module(module_name)
            self.fn: Callable[[Any], Any] = getattr(module, name)
        except Exception as exc:
            raise _Failure("hook_failed", self._said(exc, "could not be imported")) from exc
        if not callable(self.fn):
            raise _Failure("hook_failed", f"workload.pipeline.{stage} {spec}: not a function")
        self.file = str(getattr(module, "__file__", "") or "")

    def __call__(self, value: Any) -> Any:
        try:
            return self.fn(value)
        except Exception as exc:
            raise _Failure("hook_failed", self._said(exc, "raised")) from exc

    def _said(self, exc: BaseException, what: str) -> str:
        frames = traceback.extract_tb(exc.__traceback__)
        own = [f for f in frames if getattr(self, "file", None) and f.filename == self.file]
        at = own[-1] if own else frames[-1] if frames else None
        where = f" at {Path(at.filename).name}:{at.lineno}" if at is not None else ""
        return (
            f"workload.pipeline.{self.stage} {self.spec} {what}{where}: "
            f"{type(exc).__name__}: {str(exc)[:300]}"
        )


@dataclass
class _Stages:
    """A pipeline's hooks in the timed loop, and what each stage cost per thread."""

    pre: _Hook | None
    post: Callable[[Any], Any]
    raw: list[dict[str, Any]]
    """The workload's batches, before ``pre`` (the timed loop calls it on each)."""
    inference_ns: list[list[int]] = field(default_factory=list)
    pre_ns: list[int] = field(default_factory=list)
    post_ns: list[int] = field(default_factory=list)

    def reset(self, concurrency: int) -> None:
        self.inference_ns = [[] for _ in range(concurrency)]
        self.pre_ns = [0] * concurrency
        self.post_ns = [0] * concurrency

    def figures(self) -> dict[str, Any]:
        """The round's inference-only samples and each stage's total time."""
        inference = [x for lst in self.inference_ns for x in lst]
        return {
            "inference_ns": inference,
            "stage_ns": {
                "pre": sum(self.pre_ns),
                "inference": sum(inference),
                "post": sum(self.post_ns),
            },
        }


@dataclass
class _Loop:
    """What the timed loop's threads share: the session and feeds, where each records its
    samples, and how they stop together (the first error stops all)."""

    session: Any
    feeds: list[dict[str, Any]]
    concurrency: int
    post: Callable[[list[Any]], Any]
    should_stop: Callable[[list[list[int]]], bool]
    check_every: int
    per_thread: list[list[int]]
    stop: threading.Event = field(default_factory=threading.Event)
    errors: list[BaseException] = field(default_factory=list)

    def plain(self, slot: int) -> None:
        """One thread: time run() + post around each inference."""
        out, session, feeds, post = self.per_thread[slot], self.session, self.feeds, self.post
        stop, i = self.stop, slot
        clock = time.perf_counter_ns
        try:
            while not stop.is_set():
                feed = feeds[i % len(feeds)]
                t0 = clock()
                post(session.run(None, feed))
                out.append(clock() - t0)
                i += self.concurrency
                if (
                    slot == 0
                    and len(out) % self.check_every == 0
                    and self.should_stop(self.per_thread)
                ):
                    stop.set()
        except BaseException as exc:
            self.errors.append(exc)
            stop.set()

    def staged(self, stages: _Stages) -> Callable[[int], None]:
        """One thread with a pipeline: pre + run() + post timed, inference alone as well."""

        def loop(slot: int) -> None:
            out, inference = self.per_thread[slot], stages.inference_ns[slot]
            pre, session, post = stages.pre, self.session, self.post
            stop, i = self.stop, slot
            clock = time.perf_counter_ns
            try:
                while not stop.is_set():
                    raw = stages.raw[i % len(stages.raw)]
                    t0 = clock()
                    feed = pre(raw) if pre is not None else raw
                    t1 = clock()
                    outs = session.run(None, feed)
                    t2 = clock()
                    stages.post(post(outs))
                    t3 = clock()
                    out.append(t3 - t0)
                    inference.append(t2 - t1)
                    stages.pre_ns[slot] += t1 - t0
                    stages.post_ns[slot] += t3 - t2
                    i += self.concurrency
                    if (
                        slot == 0
                        and len(out) % self.check_every == 0
                        and self.should_stop(self.per_thread)
                    ):
                        stop.set()
            except BaseException as exc:
                self.errors.append(exc)
                stop.set()

        return loop


def _timed_loop(
    session: Any,
    feeds: list[dict[str, Any]],
    concurrency: int,
    post: Callable[[list[Any]], Any],
    should_stop: Callable[[list[list[int]]], bool],
    check_every: int = 64,
    stages: _Stages | None = None,
) -> list[list[int]]:
    """C threads share one session; each records perf_counter_ns around run() + post (with a
    pipeline: around pre + run() + post, and inference alone into ``stages``).

    There is no watcher thread: thread 0 checks ``should_stop`` between its own inferences
    (outside the timed region) every ``check_every`` samples, so the harness adds no thread that
    competes with onnxruntime's for the cores while timing.
    """
    per_thread: list[list[int]] = [[] for _ in range(concurrency)]
    shared = _Loop(session, feeds, concurrency, post, should_stop, check_every, per_thread)
    loop: Callable[[int], None] = shared.plain
    if stages is not None:
        stages.reset(concurrency)
        loop = shared.staged(stages)
    _on_threads(loop, concurrency)
    if shared.errors:
        raise shared.errors[0]
    return per_thread


_SPIN_NS = 2_000_000
"""With ``wait: sleep``, how close to a request's arrival a waiting server stops sleeping and
spins (a sleep can overshoot by milliseconds on a VM, which would count as latency)."""


def _wait_until(due_ns: int, sleep: bool) -> None:
    """Return at ``due_ns`` (perf_counter_ns): by busy-polling the clock, so that the core
    stays awake as a loaded server's does; with ``sleep``, by sleeping until shortly before.
    Measured on a 2-vCPU VM with a 0.35 ms model: sleeping between requests made the next
    inference 2x slower at p50 and 8x at p99 (the idle vCPU's wake-up), polling did not."""
    clock = time.perf_counter_ns
    while (left := due_ns - clock()) > 0:
        if sleep and left > _SPIN_NS:
            time.sleep((left - _SPIN_NS) / 1e9)


def _arrivals(rate: float, count: int, seed: int) -> Any:
    """When each of ``count`` Poisson arrivals at ``rate``/s is due, ns from the start."""
    import random  # numpy.random would add 6.5 MB of modules to the process
    from array import array

    draw = random.Random(seed).expovariate
    due, at = array("q", bytes(8 * count)), 0.0
    for k in range(count):
        at += draw(rate)
        due[k] = int(at * 1e9)
    return due


def _open_loop(
    session: Any,
    feeds: list[dict[str, Any]],
    post: Callable[[list[Any]], Any],
    stages: _Stages | None,
    cmd: dict[str, Any],
) -> dict[str, Any]:
    """Serve Poisson arrivals at ``cmd['rate']`` requests/s: ``servers`` threads take requests
    from one queue in arrival order, each waits for its request's scheduled arrival if it is
    early, and a request's latency runs from that scheduled arrival to its answer, so that time
    spent queued behind earlier requests counts (a closed loop never sees it)."""
    from array import array

    count, servers = int(cmd["arrivals"]), int(cmd["servers"])
    sleep = cmd.get("wait") == "sleep"
    due = _arrivals(float(cmd["rate"]), count, int(cmd["seed"]))
    latency, service = array("q", bytes(8 * count)), array("q", bytes(8 * count))
    taken = iter(range(count))
    lock = threading.Lock()
    errors: list[BaseException] = []
    pre = stages.pre if stages is not None else None
    answer = stages.post if stages is not None else _identity
    raw = stages.raw if stages is not None else feeds
    clock = time.perf_counter_ns
    start = clock() + 2_000_000  # the first arrival's clock starts once every server is up

    def serve(slot: int) -> None:
        try:
            while not errors:
                with lock:
                    i = next(taken, None)
                if i is None:
                    return
                arrives = start + due[i]
                _wait_until(arrives, sleep)
                t0 = clock()
                batch = raw[i % len(raw)]
                answer(post(session.run(None, pre(batch) if pre is not None else batch)))
                done = clock()
                latency[i], service[i] = done - arrives, done - t0
        except BaseException as exc:
            errors.append(exc)

    # A polling server holds the GIL between checks of the clock: hand it over every 50 us, not
    # every 5 ms, so that a thread returning from onnxruntime is not kept waiting for it.
    switch = sys.getswitchinterval()
    sys.setswitchinterval(5e-5)
    try:
        _on_threads(serve, servers)
    finally:
        sys.setswitchinterval(switch)
    if errors:
        raise errors[0]
    return {
        "samples_ns": latency.tolist(),
        "service_ns": service.tolist(),
        "duration_s": (clock() - start) / 1e9,
    }


def _on_threads(loop: Callable[[int], None], concurrency: int) -> None:
    """Run ``loop(slot)`` on ``concurrency`` threads, slot 0 on this one, and wait for all."""
    threads = [threading.Thread(target=loop, args=(k,), daemon=True) for k in range(1, concurrency)]
    for t in threads:
        t.start()
    loop(0)
    for t in threads:
        t.join()


THROUGHPUT_INFERENCES = 1000
"""A throughput pass ends once this many inferences ran (and `THROUGHPUT_FLOOR_S` passed), or
at the workload's ``throughput_s``, whichever comes first: a rate over 1,000 back-to-back calls
is known to a few percent, and a fast model need not spend the whole pass to show it."""
THROUGHPUT_FLOOR_S = 0.05
_THROUGHPUT_POLL_S = 0.005


def _throughput(
    session: Any, feeds: list[dict[str, Any]], concurrency: int, duration_s: float
) -> float:
    """Inferences per second with C threads back to back; no per-call timing. Runs for
    ``duration_s`` at most, and ends earlier once `THROUGHPUT_INFERENCES` ran."""
    counts = [0] * concurrency
    stop = threading.Event()

    def work(slot: int) -> None:
        i = slot
        while not stop.is_set():
            session.run(None, feeds[i % len(feeds)])
            counts[slot] += 1
            i += concurrency

    threads = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    while True:
        elapsed = time.perf_counter() - t0
        if elapsed >= duration_s or (
            elapsed >= THROUGHPUT_FLOOR_S and sum(counts) >= THROUGHPUT_INFERENCES
        ):
            break
        time.sleep(min(_THROUGHPUT_POLL_S, duration_s - elapsed))
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    return sum(counts) / elapsed


def _warm_up(
    session: Any, feeds: list[dict[str, Any]], warmup: int, concurrency: int
) -> float | None:
    """Run the warm-up inferences; one thread's rate times the threads (the adaptive time cap
    needs only its order), None without a warm-up."""
    t0 = time.perf_counter()
    for k in range(warmup):
        session.run(None, feeds[k % len(feeds)])
    warm_s = time.perf_counter() - t0
    return warmup * concurrency / warm_s if warmup and warm_s > 0 else None


def _latency_config(
    session: Any,
    feeds: list[dict[str, Any]],
    concurrency: int,
    post: Callable[[list[Any]], Any],
    job: WorkerJob,
) -> tuple[Any, dict[str, Any]]:
    """Warm up, sample until the p99 evidence decides (or a cap), then measure throughput."""
    import numpy as np

    from qualify.measure.stats import AdaptiveP99, look_schedule, time_cap

    min_n, max_n = job.min_samples, job.max_samples
    cap = time_cap(job.time_cap_s, min_n, _warm_up(session, feeds, job.warmup, concurrency))
    tracker = AdaptiveP99(
        budget_ms=job.budget_p99_ms,
        confidence=job.confidence,
        min_samples=min_n,
        schedule=look_schedule(min_n, max_n),
    )
    seen = [0] * concurrency
    started = time.perf_counter()
    stopped = "time_cap"

    def should_stop(per_thread: list[list[int]]) -> bool:
        nonlocal stopped
        for k, lst in enumerate(per_thread):
            n = len(lst)
            if n > seen[k]:
                tracker.add([x / 1e6 for x in lst[seen[k] : n]])
                seen[k] = n
        if tracker.n >= max_n:
            stopped = "max_samples"
            return True
        if tracker.decision != "insufficient":
            stopped = "decided"
            return True
        return time.perf_counter() - started >= cap

    per_thread = _timed_loop(session, feeds, concurrency, post, should_stop)
    duration = time.perf_counter() - started
    flat = np.array([x for lst in per_thread for x in lst], dtype=np.int64)
    ips = _throughput(session, feeds, concurrency, job.throughput_s)
    return flat, {
        "stopped": stopped,
        "duration_s": duration,
        "time_cap_s": cap,
        "throughput_ips": ips,
        "decision": tracker.decision,
        "p99_lower_ms": tracker.bounds[0],
        "p99_upper_ms": tracker.bounds[1],
        "look_n": tracker.look_n,
        "look_confidence": tracker.look_confidence,
    }


def _kernel_time_per_provider(
    ort: Any, model: str, job: WorkerJob, feeds: list[dict[str, Any]]
) -> dict[str, float] | None:
    """Mean kernel time per inference by provider, from onnxruntime's profiler.

    A separate session and pass: profiling slows every node, so it never overlaps the timed
    loop. Sums the ``Node`` events' durations per ``args.provider``.
    """
    runs = job.profile_runs
    if runs <= 0:
        return None
    totals: dict[str, float] = {}
    for _, name, dur, _ in _node_events(_profile_events(ort, model, job, feeds, runs, "profile")):
        totals[name] = totals.get(name, 0.0) + dur
    # The first run (session warm-up inside the profiler) counts too; over `runs` it averages out.
    return {name: us / 1000.0 / runs for name, us in sorted(totals.items())}


def _gpu_device(job: WorkerJob) -> int | None:
    """The CUDA device the session runs on when the class expects a GPU provider, else None."""
    expected = job.provider.expected
    if expected not in energy.GPU_PROVIDERS:
        return None
    device = dict(job.provider.provider_options.get(expected) or {}).get("device_id", 0)
    try:
        return max(0, int(device))
    except (TypeError, ValueError):
        return 0


class _Prepared:
    """A loaded, verified session after cold/warm init, placement and parity outputs."""

    def __init__(
        self,
        ort: Any,
        model: str,
        session: Any,
        pool: dict[str, Any],
        hooks: tuple[_Hook | None, _Hook | None] = (None, None),
    ) -> None:
        self.ort = ort
        self.model = model
        self.session = session
        self.pool = pool
        self.pre, self.post = hooks
        self._energy: tuple[list[energy.Domain], str | None] | None = None
        self._raw: dict[tuple[int, str], list[dict[str, Any]]] = {}
        self._feeds: dict[tuple[int, str], list[dict[str, Any]]] = {}

    def energy_domains(self, job: WorkerJob) -> list[energy.Domain]:
        """The energy counters this process can read (found once): the host's, and the GPU's
        when the class expects a GPU provider."""
        if self._energy is None:
            self._energy = energy.discover(gpu=_gpu_device(job))
        return self._energy[0]

    @property
    def energy_missing(self) -> str | None:
        """Why there are no energy counters, once looked for."""
        return self._energy[1] if self._energy is not None else None

    def raw_feeds(
        self, job: WorkerJob, batch_size: int, dims: dict[str, int] | None = None
    ) -> list[dict[str, Any]]:
        """Sixteen batches of ``batch_size`` rows as the workload builds them, at the swept
        sizes ``dims`` (none: the pool as built, each at its largest), once per config."""
        key = (batch_size, json.dumps(dims or {}, sort_keys=True))
        if key not in self._raw:
            pool = _at_dims(self.pool, job, dims or {})
            self._raw[key] = [_batch(pool, job, k * batch_size, batch_size) for k in range(16)]
        return self._raw[key]

    def feeds(
        self, job: WorkerJob, batch_size: int, dims: dict[str, int] | None = None
    ) -> list[dict[str, Any]]:
        """The model's feeds of `raw_feeds` (through the ``pre`` hook, if any), once per config."""
        key = (batch_size, json.dumps(dims or {}, sort_keys=True))
        if key not in self._feeds:
            raw = self.raw_feeds(job, batch_size, dims)
            self._feeds[key] = raw if self.pre is None else [self.pre(f) for f in raw]
        return self._feeds[key]

    def stages(
        self, job: WorkerJob, batch_size: int, dims: dict[str, int] | None = None
    ) -> _Stages | None:
        """The pipeline for the timed loop; None without hooks."""
        if self.pre is None and self.post is None:
            return None
        return _Stages(
            pre=self.pre,
            post=self.post if self.post is not None else _identity,
            raw=self.raw_feeds(job, batch_size, dims)
            if self.pre is not None
            else self.feeds(job, batch_size, dims),
        )


def _identity(value: Any) -> Any:
    return value


def _answer_arrays(answer: Any) -> dict[str, Any]:
    """What a ``post`` hook answered, as arrays parity can compare: ``post`` for one value,
    ``post.<key>`` for each of a mapping's; numbers, booleans and strings (a string, or a list
    of them), nothing for an answer of another kind."""
    import numpy as np

    items = answer.items() if isinstance(answer, dict) else [(None, answer)]
    found: dict[str, Any] = {}
    for key, value in items:
        try:
            arr = np.asarray(value)
        except (ValueError, TypeError):  # ragged nested lists: not an answer parity can read
            continue
        if arr.dtype.kind in "biufUS":
            found["post" if key is None else f"post.{key}"] = arr
    return found


def _pack(name: str, rows: list[Any]) -> dict[str, Any]:
    """One output's samples for the outputs file: stacked (sample axis first) when they share a
    shape and kind; else their values one after another and ``<name>#shapes`` (the layout
    `qualify.measure.parity.unpack` reads)."""
    import numpy as np

    shapes = {(r.shape, r.dtype.kind) for r in rows}
    if len(shapes) == 1:
        return {name: np.stack(rows)}
    rank = max(r.ndim for r in rows)
    table = np.full((len(rows), max(rank, 1)), -1, dtype=np.int64)
    for k, r in enumerate(rows):
        table[k, : r.ndim] = r.shape
    values = [r.reshape(-1) for r in rows]
    return {name: np.concatenate(values) if values else np.zeros(0), f"{name}#shapes": table}


def _place_on_cores(job: WorkerJob, result: dict[str, Any]) -> None:
    """Pin this process to the class's CPUs before anything starts a thread (onnxruntime's
    pools inherit it), and record where it runs."""
    wanted = job.provider.cpus
    if wanted is not None:
        try:
            cpus.pin(list(wanted))
        except OSError as exc:
            raise _Failure(
                "run_failed",
                f"cannot run on CPUs {list(wanted)[:16]} (provider.cpu_affinity / numa_node): "
                f"{exc.strerror or exc}",
            ) from exc
    if hasattr(os, "sched_getaffinity"):
        result["cpus"] = sorted(os.sched_getaffinity(0))


def _save_parity_outputs(
    session: Any, job: WorkerJob, model_feed: Callable[[int], dict[str, Any]], post: _Hook | None
) -> None:
    """The model's outputs (and, with a ``post`` hook, what it answers) on identical rows, one
    row at a time (works for fixed batch dims too), for the parent's parity check."""
    import numpy as np

    names = [o.name for o in session.get_outputs()]
    rows = job.parity_rows
    collected: dict[str, list[Any]] = {n: [] for n in names}
    builtin = _postprocess(job.postprocess)
    try:
        for r in range(rows):
            outs = session.run(None, model_feed(r))
            for n, o in zip(names, outs, strict=True):
                # One sample's whole output: samples are stacked on a new first axis, so that
                # parity compares per sample whatever axis the output batches on ([T, N, C]).
                collected[n].append(np.asarray(o))
            if post is not None:  # what the service answers is compared too
                for key, arr in _answer_arrays(post(builtin(outs))).items():
                    # An answer a sample lacks is empty, so the samples stay aligned.
                    have = collected.setdefault(key, [np.zeros(0)] * r)
                    have.extend([np.zeros(0)] * (r - len(have)))
                    have.append(arr)
    except _Failure:
        raise
    except Exception as exc:
        raise _Failure(classify_exception(exc, "run"), f"{type(exc).__name__}: {exc}") from exc
    packed: dict[str, Any] = {}
    for n, v in collected.items():
        v.extend([np.zeros(0)] * (rows - len(v)))
        packed.update(_pack(n, v))
    np.savez(job.outputs_path, allow_pickle=False, **packed)


def _cold_init(
    ort: Any,
    model: str,
    job: WorkerJob,
    model_feed: Callable[[int], dict[str, Any]],
    result: dict[str, Any],
) -> tuple[Any, dict[str, Any]]:
    """Cold init: session creation plus first inference in this fresh process, the bytes
    verified again after the load, then where the nodes were placed."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.perf_counter_ns()
        try:
            session = _create(ort, model, job, record_placement=True)
        except Exception as exc:
            raise _Failure(classify_exception(exc, "load"), f"{type(exc).__name__}: {exc}") from exc
        t1 = time.perf_counter_ns()
    result["warnings"] = [str(w.message) for w in caught]
    first_feed = model_feed(0)
    try:
        session.run(None, first_feed)
    except Exception as exc:
        raise _Failure(classify_exception(exc, "run"), f"{type(exc).__name__}: {exc}") from exc
    t2 = time.perf_counter_ns()
    _verify(job, "after loading")
    result["session_create_ms"] = (t1 - t0) / 1e6
    result["cold_init_ms"] = (t2 - t0) / 1e6
    result["placement"] = _placement(session, job.provider.expected)
    if result["placement"] is None:
        try:
            result["placement"] = _placement_from_profile(ort, model, job, first_feed, session)
        except Exception as exc:  # then placement stays unknown, and the verdict says so
            result["warnings"].append(f"placement from the profiler failed: {exc}")
    return session, first_feed


def _warm_init(
    ort: Any, model: str, job: WorkerJob, first_feed: dict[str, Any], result: dict[str, Any]
) -> None:
    """Warm init: a second session in the same process. A host never holds two, so the peak
    reported is that of serving one: the high-water mark so far, then a fresh one from here."""
    before_warm = hwm_kb()
    t0 = time.perf_counter_ns()
    second = _create(ort, model, job, record_placement=False)
    second.run(None, first_feed)
    result["warm_init_ms"] = (time.perf_counter_ns() - t0) / 1e6
    del second
    _trim_heap()
    if before_warm is not None and reset_hwm():
        result["hwm_before_warm_kb"] = before_warm


def _prepare(job: WorkerJob, result: dict[str, Any]) -> _Prepared | None:
    """Digest check, cold init, placement, warm init and parity outputs; None in check mode
    and in parity mode (which saves the parity outputs and nothing more)."""
    _place_on_cores(job, result)
    t_numpy = time.perf_counter_ns()
    import numpy as np

    t_import = time.perf_counter_ns()
    import onnxruntime as ort

    t_done = time.perf_counter_ns()
    result["runtime_import_ms"] = (t_done - t_import) / 1e6
    # The interpreter with numpy and onnxruntime loaded, before any model: what a reader
    # subtracts from the peak to see the model's own memory.
    result["import_ms"] = (t_done - t_numpy) / 1e6
    result["import_hwm_kb"] = hwm_kb()
    result["runtime_version"] = ort.__version__

    # onnxruntime loads the file itself, as a host does (holding the model's bytes here would
    # add the file's size to the peak, and external data would not resolve); the bytes are
    # hashed before and again after the load, so what was measured is what the digest names.
    model = job.artifact_path
    _verify(job, "before loading")
    pool = dict(np.load(job.inputs_path))
    pre = _Hook("pre", job.pre_hook, job.hook_root) if job.pre_hook else None
    post = _Hook("post", job.post_hook, job.hook_root) if job.post_hook else None

    def model_feed(start: int) -> dict[str, Any]:
        raw = _batch(pool, job, start, 1)
        return pre(raw) if pre is not None else raw

    session, first_feed = _cold_init(ort, model, job, model_feed, result)
    if job.mode == "check":
        return None
    if job.mode == "parity":  # under an emulated CPU: its timings are QEMU's, not the class's
        _save_parity_outputs(_recurrent(session, job), job, model_feed, post)
        return None

    _warm_init(ort, model, job, first_feed, result)
    # A recurrent model is compared, and timed, over sequences of steps, each from its start.
    session = _recurrent(session, job)
    _save_parity_outputs(session, job, model_feed, post)
    if isinstance(session, _Recurrent):
        session.reset()
    return _Prepared(ort, model, session, pool, (pre, post))


def _profile(prepared: _Prepared, job: WorkerJob, result: dict[str, Any]) -> None:
    # The profiled pass builds its own session beside the served one, which no host does: the
    # peak reported is the one reached before it (see main).
    result["hwm_before_profile_kb"] = hwm_kb()
    try:
        result["kernel_ms_per_provider"] = _kernel_time_per_provider(
            prepared.ort, prepared.model, job, prepared.feeds(job, 1)
        )
    except Exception as exc:  # the profile is extra evidence; its failure is said, not fatal
        result["kernel_ms_per_provider"] = None
        result.setdefault("warnings", []).append(f"profiling pass failed: {exc}")


def _measure(job: WorkerJob, result: dict[str, Any]) -> None:
    """``full`` mode: everything in one go, configs one after another (the bench harness's
    single-artifact protocol); ``check`` mode stops after the first inference."""
    import numpy as np

    prepared = _prepare(job, result)
    if prepared is None:
        return
    post = _postprocess(job.postprocess)
    samples: dict[str, Any] = {}
    configs: list[dict[str, Any]] = []
    for b, c in job.configs:
        try:
            flat, doc = _latency_config(prepared.session, prepared.feeds(job, b), c, post, job)
        except _Failure:
            raise
        except Exception as exc:
            raise _Failure(classify_exception(exc, "run"), f"{type(exc).__name__}: {exc}") from exc
        samples[f"b{b}_c{c}"] = flat
        configs.append({"batch_size": b, "concurrency": c, **doc})
        result["configs"] = configs
    np.savez(job.samples_path, allow_pickle=False, **samples)
    _profile(prepared, job, result)


def _round(
    prepared: _Prepared, job: WorkerJob, post: Callable[[list[Any]], Any], cmd: dict[str, Any]
) -> dict[str, Any]:
    """One timed round of an interleaved A/B: a short warm-up, then ``time_s`` of samples."""
    b, c = int(cmd["batch_size"]), int(cmd["concurrency"])
    dims = {str(k): int(v) for k, v in dict(cmd.get("dims") or {}).items()}
    feeds = prepared.feeds(job, b, dims)
    session = prepared.session
    if "rate" in cmd:
        return _open_loop(session, feeds, post, prepared.stages(job, b, dims), cmd)
    for k in range(int(cmd["warmup"])):
        session.run(None, feeds[k % len(feeds)])
    limit_s, most = float(cmd["time_s"]), int(cmd["max_samples"])
    started = time.perf_counter()

    def should_stop(per_thread: list[list[int]]) -> bool:
        done = sum(len(x) for x in per_thread)
        return done >= most or time.perf_counter() - started >= limit_s

    stages = prepared.stages(job, b, dims)
    domains = prepared.energy_domains(job)
    before = energy.read(domains)
    per_thread = _timed_loop(session, feeds, c, post, should_stop, check_every=8, stages=stages)
    spent = energy.energy_between(domains, before, energy.read(domains))
    return {
        "samples_ns": [x for lst in per_thread for x in lst],
        "duration_s": time.perf_counter() - started,
        "energy_j": spent.joules,
        "energy_missing": None
        if spent.joules is not None
        else prepared.energy_missing or spent.missing,
        **(stages.figures() if stages is not None else {}),
    }


def _reply(fd: int, doc: dict[str, Any]) -> None:
    data = (json.dumps(doc) + "\n").encode()
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _serve(job: WorkerJob, result: dict[str, Any]) -> None:
    """``serve`` mode: prepare, say ready, then answer the parent's commands one per line on
    the command pipe (``round`` -> samples on the reply pipe; ``finish`` -> throughput and the
    profile, then exit) so that one fresh process per artifact can be measured in rounds
    interleaved with the others'. Idle between rounds, it blocks on a read and takes no CPU from
    them. Both pipes are the child's own: stdin is ``/dev/null``, so a hook that reads it reads
    nothing, and cannot eat a command."""
    if job.reply_fd is None or job.command_fd is None:
        raise _Failure("crashed", "a serve job without its pipes (job.reply_fd, job.command_fd)")
    fd = job.reply_fd
    commands = os.fdopen(job.command_fd, "r", encoding="utf-8")
    prepared = _prepare(job, result)
    assert prepared is not None
    _reply(fd, {"ready": True})
    post = _postprocess(job.postprocess)
    for line in commands:
        cmd = json.loads(line)
        if "rate" in cmd:  # the open-loop search's buffers are the harness's, not serving's
            result.setdefault("hwm_before_open_loop_kb", hwm_kb())
        if cmd.get("cmd") == "round":
            try:
                _reply(fd, _round(prepared, job, post, cmd))
            except _Failure:
                raise
            except Exception as exc:
                code = classify_exception(exc, "run")
                raise _Failure(code, f"{type(exc).__name__}: {exc}") from exc
            continue
        throughput: dict[str, float] = {}
        for cfg in cmd.get("configs", []):
            b, c = int(cfg["batch_size"]), int(cfg["concurrency"])
            dims = {str(k): int(v) for k, v in dict(cfg.get("dims") or {}).items()}
            throughput[str(cfg.get("key") or f"b{b}_c{c}")] = _throughput(
                prepared.session, prepared.feeds(job, b, dims), c, job.throughput_s
            )
        result["throughput_ips"] = throughput
        _profile(prepared, job, result)
        return
    raise _Failure("crashed", "the parent closed the command pipe before 'finish'")


def _third_party_modules() -> list[str]:
    """Top-level packages outside the standard library loaded in this process, sorted."""
    top = {name.partition(".")[0] for name in list(sys.modules)}
    return sorted(n for n in top if n not in sys.stdlib_module_names and not n.startswith("_"))


def _write_json(path: str, doc: dict[str, Any]) -> None:
    from schemas.atomic import write_atomic

    write_atomic(path, json.dumps(doc))


def _feed(job: FeedJob, result: dict[str, Any]) -> None:
    """``--feed``: the model's feed for the first ``job.rows`` rows, one row at a time through
    the ``pre`` hook as serving would, concatenated per input for calibration."""
    import numpy as np

    pool = dict(np.load(job.inputs_path))
    pre = _Hook("pre", job.pre_hook, job.hook_root)
    feeds = [pre({k: v[i : i + 1] for k, v in pool.items()}) for i in range(job.rows)]
    try:
        if not feeds or not isinstance(feeds[0], dict):
            raise TypeError(f"it returned {type(feeds[0]).__name__ if feeds else 'nothing'}")
        arrays = {str(k): np.concatenate([np.asarray(f[k]) for f in feeds]) for k in feeds[0]}
        np.savez(job.outputs_path, allow_pickle=False, **arrays)
    except (TypeError, KeyError, ValueError, IndexError) as exc:
        raise _Failure(
            "hook_failed",
            f"workload.pipeline.pre {job.pre_hook} must return {{input name: array}} with one "
            f"row per row it was given; calibration could not use it ({type(exc).__name__}: "
            f"{str(exc)[:200]})",
        ) from exc
    result["rows"] = job.rows


def _read_job(args: list[str]) -> WorkerJob | FeedJob | int:
    """The job the command line names, or the exit status of a refusal (said on stderr)."""
    feed = args[:1] == ["--feed"]
    if len(args) != 1 + feed:
        print(
            "usage: python -m qualify.measure.worker JOB.json | --feed JOB.json | --probe",
            file=sys.stderr,
        )
        return 2
    try:
        data = Path(args[-1]).read_bytes()
        job: WorkerJob | FeedJob = FeedJob.from_json(data) if feed else WorkerJob.from_json(data)
    except (OSError, JobError, TypeError) as exc:
        print(f"qualify.measure.worker: {args[-1]}: {exc}", file=sys.stderr)
        return 2
    if job.result_path is None:
        print(f"qualify.measure.worker: {args[-1]}: job.result_path is not set", file=sys.stderr)
        return 2
    return job


def _run_job(job: WorkerJob | FeedJob, result: dict[str, Any]) -> None:
    """Run ``job`` and put how it ended into ``result`` (never raises for what it ran)."""
    try:
        limit_problem = _set_memory_limit(job.memory_limit_mb)
        if limit_problem is not None:
            raise _Failure("run_failed", limit_problem)
        if isinstance(job, FeedJob):
            _feed(job, result)
        else:
            (_serve if job.mode == "serve" else _measure)(job, result)
        result["ok"] = True
    except _Failure as failure:
        result["ok"] = False
        result["error"] = {"code": failure.code, "message": str(failure)}
    except MemoryError as exc:
        result["ok"] = False
        result["error"] = {"code": "out_of_memory", "message": f"MemoryError: {exc}"}
    except Exception as exc:
        result["ok"] = False
        result["error"] = {
            "code": classify_exception(exc, "run"),
            "message": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(limit=5),
        }


def main(argv: list[str] | None = None) -> int:
    """Entry point of the child process."""
    args = sys.argv[1:] if argv is None else argv
    if args == ["--probe"]:
        json.dump(probe(), sys.stdout)
        return 0
    job = _read_job(args)
    if isinstance(job, int):
        return job
    _die_with_parent(job.parent_pid)
    # The parent asks for every thread's stack (SIGUSR1) before it kills a child at its
    # timeout, so that the error can say where a hung hook was.
    import faulthandler

    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    # Before any of the user's code runs: a daemon a hook double-forks is re-parented here.
    result: dict[str, Any] = {"pid": os.getpid(), "subreaper": contain.make_subreaper()}
    _run_job(job, result)
    # The peak of serving the model: the high-water mark before the open-loop search (whose
    # request buffers are the harness's) or the profiling session (or now), and before the
    # warm-init session, each a second session only the harness creates. Record
    # what was loaded when it was read, so a reader (and a test) can tell the model's memory
    # from the interpreter's.
    peak = result.get("hwm_before_open_loop_kb") or result.get("hwm_before_profile_kb") or hwm_kb()
    before_warm = result.get("hwm_before_warm_kb")
    result["vm_hwm_kb"] = max(peak, before_warm) if peak is not None and before_warm else peak
    result["imported_at_peak"] = _third_party_modules()
    assert job.result_path is not None  # _read_job refused a job without one
    _write_json(job.result_path, result)
    # Nothing the user's code started outlives the measurement.
    contain.kill_children()
    return 0


def _leave(code: int) -> None:
    """Exit with ``code``; at once when a hook left a thread that is not a daemon, so that the
    interpreter does not wait for it at shutdown with the result already written."""
    import contextlib

    main_thread = threading.main_thread()
    lingering = [t for t in threading.enumerate() if t is not main_thread and not t.daemon]
    if not lingering:
        sys.exit(code)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    _leave(main())
