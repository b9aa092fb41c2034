"""The timed loops of the measuring child: threads sharing one session, each timing its own calls.

Owns the closed loop (C threads back to back, each recording ``perf_counter_ns`` around its
inferences; with a pipeline, around pre + run + post and the inference alone), how its threads stop
together, the adaptive p99 sampling of a ``full`` job (`qualify.measure.stats.AdaptiveP99`), and
the throughput pass. Does not build the session or the feeds, nor serve Poisson arrivals
(`qualify.measure.arrivals`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from qualify.measure.job import WorkerJob

__all__ = [
    "THROUGHPUT_FLOOR_S",
    "THROUGHPUT_INFERENCES",
    "Stages",
    "latency_config",
    "on_threads",
    "throughput",
    "timed_loop",
]


@dataclass
class Stages:
    """A pipeline's hooks in the timed loop, and what each stage cost per thread."""

    pre: Callable[[Any], Any] | None
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

    def staged(self, stages: Stages) -> Callable[[int], None]:
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


def timed_loop(
    session: Any,
    feeds: list[dict[str, Any]],
    concurrency: int,
    post: Callable[[list[Any]], Any],
    should_stop: Callable[[list[list[int]]], bool],
    check_every: int = 64,
    stages: Stages | None = None,
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
    on_threads(loop, concurrency)
    if shared.errors:
        raise shared.errors[0]
    return per_thread


def on_threads(loop: Callable[[int], None], concurrency: int) -> None:
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


def throughput(
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


def latency_config(
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

    per_thread = timed_loop(session, feeds, concurrency, post, should_stop)
    duration = time.perf_counter() - started
    flat = np.array([x for lst in per_thread for x in lst], dtype=np.int64)
    ips = throughput(session, feeds, concurrency, job.throughput_s)
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
