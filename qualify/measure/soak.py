"""Sustained load: every artifact served for minutes, in windows, and a verdict on drift.

Owns the soak protocol that follows a run's interleaved rounds (``qualify run --soak 10m``,
``workload.soak_s``): the artifacts keep their processes and go on sampling the gate config in
alternating rounds, the time split into `WINDOWS` equal windows. Each window keeps its p50, p99
and the p99's distribution-free bounds (`qualify.measure.stats.p99_bounds`), and the CPU frequency and
temperatures the host exposes at its end (``/sys/devices/system/cpu/*/cpufreq``,
``/sys/class/thermal``; null where it exposes none). The drift rule: the last window's p99
lower bound above the first window's p99 upper bound times ``1 + workload.soak_tolerance``, so
a slowdown is only called when the evidence excludes noise. Does not judge the cell (the
``sustained`` gate of ``manifest.gates`` reads the verdict, and counts a drift only where it
adds at least ``workload.soak_floor`` of the class's p99 budget).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from qualify.measure.runner import RoundWorker
from qualify.measure.stats import p99_bounds, percentiles
from schemas.cell import LatencyConfig, Soak, SoakWindow, soak_drifted

__all__ = ["CPUFREQ", "THERMAL", "WINDOWS", "drifted", "host_heat", "soak"]

WINDOWS = 5
"""Windows a soak is split into."""

THERMAL = Path("/sys/class/thermal")
CPUFREQ = Path("/sys/devices/system/cpu")
_SLICE_S = 0.5
"""Sampling time per artifact per round while soaking."""


def _read_number(path: Path) -> float | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            text = os.read(fd, 64).strip()
        finally:
            os.close(fd)
    except OSError:
        return None
    return float(text) if text.isdigit() else None


def host_heat(
    thermal: Path = THERMAL, cpufreq: Path = CPUFREQ
) -> tuple[float | None, float | None]:
    """The mean current CPU frequency (MHz) and the hottest thermal zone (°C) now; each None
    where the host does not expose it."""
    freqs = [
        v / 1000.0
        for p in sorted(cpufreq.glob("cpu[0-9]*/cpufreq/scaling_cur_freq"))[:1024]
        if (v := _read_number(p)) is not None
    ]
    temps = [
        v / 1000.0
        for p in sorted(thermal.glob("thermal_zone[0-9]*/temp"))[:256]
        if (v := _read_number(p)) is not None
    ]
    return (sum(freqs) / len(freqs) if freqs else None), (max(temps) if temps else None)


def _window(
    samples: list[np.ndarray], start_s: float, confidence: float, heat: tuple[float | None, ...]
) -> SoakWindow:
    ns = np.concatenate(samples) if samples else np.empty(0, dtype=np.int64)
    if ns.size == 0:
        return SoakWindow(start_s=start_s, samples=0, cpu_mhz=heat[0], temp_c=heat[1])
    ms = ns.astype(np.float64) / 1e6
    pct = percentiles(ms)
    lower, upper = p99_bounds(ms, confidence)
    return SoakWindow(
        start_s=start_s,
        samples=int(ns.size),
        p50_ms=float(pct.p50),
        p99_ms=float(pct.p99),
        p99_lower_ms=lower,
        p99_upper_ms=upper,
        cpu_mhz=heat[0],
        temp_c=heat[1],
    )


def drifted(windows: Sequence[SoakWindow], tolerance: float) -> bool | None:
    """Whether the last window is slower than the first beyond ``tolerance`` with confidence;
    None when the bounds needed are missing (too few samples in a window). The rule the current
    verdict applies again under today's tolerance (`schemas.cell.soak_drifted`)."""
    return soak_drifted(windows, tolerance)


def _alive(worker: RoundWorker | None) -> bool:
    return worker is not None and worker.alive


def soak(
    workers: Sequence[RoundWorker | None],
    config: LatencyConfig,
    seconds: float,
    *,
    confidence: float,
    tolerance: float,
    max_samples: int,
    floor: float = 0.1,
    on_progress: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    heat: Callable[[], tuple[float | None, float | None]] = host_heat,
) -> list[Soak | None]:
    """Serve every live worker for ``seconds`` at ``config``, in alternating rounds.

    Returns:
        Per worker (in order), its soak; None for a worker that was not alive.
    """
    live = [i for i, w in enumerate(workers) if w is not None and w.alive]
    window_s = seconds / WINDOWS
    per_window: dict[int, list[list[np.ndarray]]] = {i: [[] for _ in range(WINDOWS)] for i in live}
    heats: list[tuple[float | None, float | None]] = []
    started = clock()
    rounds = 0
    for w in range(WINDOWS):
        ends = started + (w + 1) * window_s
        rounds = _serve_window(
            workers, live, config, max_samples, (ends, clock, rounds), w, per_window
        )
        heats.append(heat())
        if on_progress is not None:
            on_progress(f"soak: window {w + 1} of {WINDOWS} done ({window_s:.0f} s each)")
    found: list[Soak | None] = [None] * len(workers)
    for i in live:
        windows = [
            _window(per_window[i][w], w * window_s, confidence, heats[w]) for w in range(WINDOWS)
        ]
        found[i] = Soak(
            batch_size=config.batch_size,
            concurrency=config.concurrency,
            dims=config.sizes,
            seconds=seconds,
            tolerance=tolerance,
            floor=floor,
            windows=windows,
            drifted=drifted(windows, tolerance),
        )
    return found


def _serve_window(
    workers: Sequence[RoundWorker | None],
    live: list[int],
    config: LatencyConfig,
    max_samples: int,
    timing: tuple[float, Callable[[], float], int],
    window: int,
    per_window: dict[int, list[list[np.ndarray]]],
) -> int:
    """Alternating rounds until the window ends (``timing``: its end, the clock, the rounds
    served so far), each round's samples added to the window; returns the rounds served."""
    ends, clock, rounds = timing
    while clock() < ends and any(_alive(workers[i]) for i in live):
        order = live if rounds % 2 == 0 else live[::-1]
        for i in order:
            worker = workers[i]
            if worker is None or not worker.alive:
                continue
            left = ends - clock()
            if left <= 0:
                break
            reply = worker.round(
                {
                    "batch_size": config.batch_size,
                    "concurrency": config.concurrency,
                    "dims": config.sizes,
                    "warmup": 0,
                    "time_s": min(_SLICE_S, left),
                    "max_samples": max_samples,
                }
            )
            if reply is not None:
                per_window[i][window].append(np.asarray(reply["samples_ns"], dtype=np.int64))
        rounds += 1
    return rounds
