"""An open-loop round inside the measuring child: Poisson arrivals at a rate, served in order.

Owns serving one ``rate`` round: when each request is due (seeded Poisson arrivals), the servers
that take them from one queue and wait for each one's arrival, and each request's latency counted
from its scheduled arrival, so that time queued behind earlier requests counts. Imported only when
such a round comes. The search over rates, and its verdict, are the parent's
(`qualify.measure.openloop`).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from qualify.measure.feeds import identity
from qualify.measure.timing import Stages, on_threads

__all__ = ["serve_arrivals"]


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


def serve_arrivals(
    session: Any,
    feeds: list[dict[str, Any]],
    post: Callable[[list[Any]], Any],
    stages: Stages | None,
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
    answer = stages.post if stages is not None else identity
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
        on_threads(serve, servers)
    finally:
        sys.setswitchinterval(switch)
    if errors:
        raise errors[0]
    return {
        "samples_ns": latency.tolist(),
        "service_ns": service.tolist(),
        "duration_s": (clock() - start) / 1e9,
    }
