"""The child's throughput pass (`qualify.measure.timing`): back-to-back calls on C threads, ended by
the evidence."""

from __future__ import annotations

import threading
import time
from typing import Any

from qualify.measure.timing import THROUGHPUT_FLOOR_S, THROUGHPUT_INFERENCES, throughput


class Counting:
    """A session whose every call takes ``latency_s``, counting its calls."""

    def __init__(self, latency_s: float) -> None:
        self.latency_s = latency_s
        self.calls = 0
        self._lock = threading.Lock()

    def run(self, _outputs: Any, _feed: Any) -> None:
        time.sleep(self.latency_s)
        with self._lock:
            self.calls += 1


def test_a_fast_model_ends_its_pass_once_enough_inferences_ran() -> None:
    session = Counting(0.0)
    started = time.perf_counter()
    rate = throughput(session, [{}], 2, duration_s=60.0)
    took = time.perf_counter() - started
    assert session.calls >= THROUGHPUT_INFERENCES
    assert THROUGHPUT_FLOOR_S <= took < 60.0  # the 60 s pass ended on the count
    assert rate > 0


def test_a_slow_model_runs_the_whole_pass() -> None:
    session = Counting(0.01)  # 100 calls per second and thread: far from the count in 0.3 s
    started = time.perf_counter()
    rate = throughput(session, [{}], 1, duration_s=0.3)
    took = time.perf_counter() - started
    assert took >= 0.3
    assert session.calls < THROUGHPUT_INFERENCES
    assert 0 < rate <= 1 / 0.01
