"""The measuring child: one artifact, one fresh interpreter, real onnxruntime.

Owns the child's process (its parent's death, its memory limit, its peak read last), its modes and
their order: cold and warm init, parity outputs, then the timed loops (``full``) or the parent's
rounds (``serve``). It is the only module (with conversion) that imports onnxruntime; it reads a
`qualify.measure.job.WorkerJob` and writes the result `qualify.measure.job.WorkerResult` reads. It
judges nothing, and does not hash the artifact (the parent does). Kept lean (no pydantic, no
pandas, no hashlib): its imports count towards the measured memory, so what only one mode runs
(the timed loops, open-loop arrivals, energy counters) is imported when that mode runs.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qualify.measure import contain, cpus
from qualify.measure.failures import Failure, classify_exception
from qualify.measure.feeds import (
    Recurrent,
    at_dims,
    batch,
    identity,
    postprocess,
    recurrent,
    save_parity_outputs,
)
from qualify.measure.hooks import Hook
from qualify.measure.job import FeedJob, JobError, WorkerJob
from qualify.measure.procfs import hwm_kb
from qualify.measure.session import cold_init, profile, warm_init

if TYPE_CHECKING:
    from collections.abc import Callable

    from qualify.measure.energy import Domain
    from qualify.measure.timing import Stages

__all__ = ["main", "probe"]


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


def _gpu_device(job: WorkerJob) -> int | None:
    """The CUDA device the session runs on when the class expects a GPU provider, else None."""
    from qualify.measure.energy import GPU_PROVIDERS

    expected = job.provider.expected
    if expected not in GPU_PROVIDERS:
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
        hooks: tuple[Hook | None, Hook | None] = (None, None),
    ) -> None:
        self.ort = ort
        self.model = model
        self.session = session
        self.pool = pool
        self.pre, self.post = hooks
        self._energy: tuple[list[Domain], str | None] | None = None
        self._raw: dict[tuple[int, str], list[dict[str, Any]]] = {}
        self._feeds: dict[tuple[int, str], list[dict[str, Any]]] = {}

    def energy_domains(self, job: WorkerJob) -> list[Domain]:
        """The energy counters this process can read (found once): the host's, and the GPU's
        when the class expects a GPU provider."""
        if self._energy is None:
            from qualify.measure.energy import discover

            self._energy = discover(gpu=_gpu_device(job))
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
            pool = at_dims(self.pool, job, dims or {})
            self._raw[key] = [batch(pool, job, k * batch_size, batch_size) for k in range(16)]
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
    ) -> Stages | None:
        """The pipeline for the timed loop; None without hooks."""
        if self.pre is None and self.post is None:
            return None
        from qualify.measure.timing import Stages

        return Stages(
            pre=self.pre,
            post=self.post if self.post is not None else identity,
            raw=self.raw_feeds(job, batch_size, dims)
            if self.pre is not None
            else self.feeds(job, batch_size, dims),
        )


def _place_on_cores(job: WorkerJob, result: dict[str, Any]) -> None:
    """Pin this process to the class's CPUs before anything starts a thread (onnxruntime's
    pools inherit it), and record where it runs."""
    wanted = job.provider.cpus
    if wanted is not None:
        try:
            cpus.pin(list(wanted))
        except OSError as exc:
            raise Failure(
                "run_failed",
                f"cannot run on CPUs {list(wanted)[:16]} (provider.cpu_affinity / numa_node): "
                f"{exc.strerror or exc}",
            ) from exc
    if hasattr(os, "sched_getaffinity"):
        result["cpus"] = sorted(os.sched_getaffinity(0))


def _prepare(job: WorkerJob, result: dict[str, Any]) -> _Prepared | None:
    """Cold init, placement, warm init and parity outputs; None in check mode
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
    # add the file's size to the peak, and external data would not resolve). The parent hashes
    # the file before this process starts and again once it has loaded it
    # (`qualify.measure.digest`): hashlib here would add OpenSSL's ~3.5 MB to the peak.
    model = job.artifact_path
    pool = dict(np.load(job.inputs_path))
    pre = Hook("pre", job.pre_hook, job.hook_root) if job.pre_hook else None
    post = Hook("post", job.post_hook, job.hook_root) if job.post_hook else None

    def model_feed(start: int) -> dict[str, Any]:
        raw = batch(pool, job, start, 1)
        return pre(raw) if pre is not None else raw

    session, first_feed = cold_init(ort, model, job, model_feed, result)
    if job.mode == "check":
        return None
    if job.mode == "parity":  # under an emulated CPU: its timings are QEMU's, not the class's
        save_parity_outputs(recurrent(session, job), job, model_feed, post)
        return None

    warm_init(ort, model, job, first_feed, result)
    # A recurrent model is compared, and timed, over sequences of steps, each from its start.
    session = recurrent(session, job)
    save_parity_outputs(session, job, model_feed, post)
    if isinstance(session, Recurrent):
        session.reset()
    return _Prepared(ort, model, session, pool, (pre, post))


def _measure(job: WorkerJob, result: dict[str, Any]) -> None:
    """``full`` mode: everything in one go, configs one after another (the bench harness's
    single-artifact protocol); ``check`` mode stops after the first inference."""
    import numpy as np

    prepared = _prepare(job, result)
    if prepared is None:
        return
    from qualify.measure.timing import latency_config

    post = postprocess(job.postprocess)
    samples: dict[str, Any] = {}
    configs: list[dict[str, Any]] = []
    for b, c in job.configs:
        try:
            flat, doc = latency_config(prepared.session, prepared.feeds(job, b), c, post, job)
        except Failure:
            raise
        except Exception as exc:
            raise Failure(classify_exception(exc, "run"), f"{type(exc).__name__}: {exc}") from exc
        samples[f"b{b}_c{c}"] = flat
        configs.append({"batch_size": b, "concurrency": c, **doc})
        result["configs"] = configs
    np.savez(job.samples_path, allow_pickle=False, **samples)
    _profile(prepared, job, result)


def _profile(prepared: _Prepared, job: WorkerJob, result: dict[str, Any]) -> None:
    """The profiled pass, on the feeds of batch size 1."""
    profile(prepared.ort, prepared.model, job, prepared.feeds(job, 1), result)


def _round(
    prepared: _Prepared, job: WorkerJob, post: Callable[[list[Any]], Any], cmd: dict[str, Any]
) -> dict[str, Any]:
    """One timed round of an interleaved A/B: a short warm-up, then ``time_s`` of samples."""
    b, c = int(cmd["batch_size"]), int(cmd["concurrency"])
    dims = {str(k): int(v) for k, v in dict(cmd.get("dims") or {}).items()}
    feeds = prepared.feeds(job, b, dims)
    session = prepared.session
    if "rate" in cmd:
        from qualify.measure.arrivals import serve_arrivals

        return serve_arrivals(session, feeds, post, prepared.stages(job, b, dims), cmd)
    for k in range(int(cmd["warmup"])):
        session.run(None, feeds[k % len(feeds)])
    limit_s, most = float(cmd["time_s"]), int(cmd["max_samples"])
    started = time.perf_counter()

    def should_stop(per_thread: list[list[int]]) -> bool:
        done = sum(len(x) for x in per_thread)
        return done >= most or time.perf_counter() - started >= limit_s

    from qualify.measure.energy import energy_between, read
    from qualify.measure.timing import timed_loop

    stages = prepared.stages(job, b, dims)
    domains = prepared.energy_domains(job)
    before = read(domains)
    per_thread = timed_loop(session, feeds, c, post, should_stop, check_every=8, stages=stages)
    spent = energy_between(domains, before, read(domains))
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
        raise Failure("crashed", "a serve job without its pipes (job.reply_fd, job.command_fd)")
    fd = job.reply_fd
    commands = os.fdopen(job.command_fd, "r", encoding="utf-8")
    prepared = _prepare(job, result)
    assert prepared is not None
    _reply(fd, {"ready": True})
    post = postprocess(job.postprocess)
    for line in commands:
        cmd = json.loads(line)
        if "rate" in cmd:  # the open-loop search's buffers are the harness's, not serving's
            result.setdefault("hwm_before_open_loop_kb", hwm_kb())
        if cmd.get("cmd") == "round":
            try:
                _reply(fd, _round(prepared, job, post, cmd))
            except Failure:
                raise
            except Exception as exc:
                code = classify_exception(exc, "run")
                raise Failure(code, f"{type(exc).__name__}: {exc}") from exc
            continue
        from qualify.measure.timing import throughput

        rates: dict[str, float] = {}
        for cfg in cmd.get("configs", []):
            b, c = int(cfg["batch_size"]), int(cfg["concurrency"])
            dims = {str(k): int(v) for k, v in dict(cfg.get("dims") or {}).items()}
            rates[str(cfg.get("key") or f"b{b}_c{c}")] = throughput(
                prepared.session, prepared.feeds(job, b, dims), c, job.throughput_s
            )
        result["throughput_ips"] = rates
        _profile(prepared, job, result)
        return
    raise Failure("crashed", "the parent closed the command pipe before 'finish'")


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
    pre = Hook("pre", job.pre_hook, job.hook_root)
    feeds = [pre({k: v[i : i + 1] for k, v in pool.items()}) for i in range(job.rows)]
    try:
        if not feeds or not isinstance(feeds[0], dict):
            raise TypeError(f"it returned {type(feeds[0]).__name__ if feeds else 'nothing'}")
        arrays = {str(k): np.concatenate([np.asarray(f[k]) for f in feeds]) for k in feeds[0]}
        np.savez(job.outputs_path, allow_pickle=False, **arrays)
    except (TypeError, KeyError, ValueError, IndexError) as exc:
        raise Failure(
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
            raise Failure("run_failed", limit_problem)
        if isinstance(job, FeedJob):
            _feed(job, result)
        else:
            (_serve if job.mode == "serve" else _measure)(job, result)
        result["ok"] = True
    except Failure as failure:
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
