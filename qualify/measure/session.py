"""The onnxruntime session inside the measuring child: built, placed and profiled.

Owns the session's options from the class's ``provider`` settings, cold and warm init, where the
graph's nodes were placed (onnxruntime's graph assignment, else its profiler) and the profiled
pass's kernel time per provider. Takes the onnxruntime module as an argument: the worker alone
imports it. Does not feed the model (`qualify.measure.feeds`), time it (`qualify.measure.timing`)
or hash its file (the parent does, around the load: `qualify.measure.digest`).
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from qualify.measure.failures import Failure, classify_exception
from qualify.measure.job import WorkerJob
from qualify.measure.procfs import hwm_kb, reset_hwm
from schemas.rules import OFF_PROVIDER_KEPT, fallback_count
from schemas.settings import option_text

__all__ = ["cold_init", "create", "profile", "warm_init"]


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


def create(
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
    session = create(ort, model, job, record_placement=False, profile_prefix=prefix)
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


def cold_init(
    ort: Any,
    model: str,
    job: WorkerJob,
    model_feed: Callable[[int], dict[str, Any]],
    result: dict[str, Any],
) -> tuple[Any, dict[str, Any]]:
    """Cold init: session creation plus first inference in this fresh process, then where the
    nodes were placed."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.perf_counter_ns()
        try:
            session = create(ort, model, job, record_placement=True)
        except Exception as exc:
            raise Failure(classify_exception(exc, "load"), f"{type(exc).__name__}: {exc}") from exc
        t1 = time.perf_counter_ns()
    result["warnings"] = [str(w.message) for w in caught]
    first_feed = model_feed(0)
    try:
        session.run(None, first_feed)
    except Exception as exc:
        raise Failure(classify_exception(exc, "run"), f"{type(exc).__name__}: {exc}") from exc
    t2 = time.perf_counter_ns()
    result["session_create_ms"] = (t1 - t0) / 1e6
    result["cold_init_ms"] = (t2 - t0) / 1e6
    result["placement"] = _placement(session, job.provider.expected)
    if result["placement"] is None:
        try:
            result["placement"] = _placement_from_profile(ort, model, job, first_feed, session)
        except Exception as exc:  # then placement stays unknown, and the verdict says so
            result["warnings"].append(f"placement from the profiler failed: {exc}")
    return session, first_feed


def warm_init(
    ort: Any, model: str, job: WorkerJob, first_feed: dict[str, Any], result: dict[str, Any]
) -> None:
    """Warm init: a second session in the same process. A host never holds two, so the peak
    reported is that of serving one: the high-water mark so far, then a fresh one from here."""
    before_warm = hwm_kb()
    t0 = time.perf_counter_ns()
    second = create(ort, model, job, record_placement=False)
    second.run(None, first_feed)
    result["warm_init_ms"] = (time.perf_counter_ns() - t0) / 1e6
    del second
    _trim_heap()
    if before_warm is not None and reset_hwm():
        result["hwm_before_warm_kb"] = before_warm


def profile(
    ort: Any, model: str, job: WorkerJob, feeds: list[dict[str, Any]], result: dict[str, Any]
) -> None:
    """The profiled pass's kernel time per provider into ``result``; its failure is said there
    as a warning, not fatal (the profile is extra evidence)."""
    # The profiled pass builds its own session beside the served one, which no host does: the
    # peak reported is the one reached before it (see the worker's main).
    result["hwm_before_profile_kb"] = hwm_kb()
    try:
        result["kernel_ms_per_provider"] = _kernel_time_per_provider(ort, model, job, feeds)
    except Exception as exc:
        result["kernel_ms_per_provider"] = None
        result.setdefault("warnings", []).append(f"profiling pass failed: {exc}")
