"""Benchmark of the HTML report: build-context + render time and page size by fleet size.

Synthetic fleets (``tests.reports.factories.synthetic_fleet``) of 10, 100 and 1,000 host
classes, two artifacts per class, two latency configs per artifact, ~1,000 raw samples per
config, and a manifest entry per class. For each size: the median of 3 timed runs of
``build_report`` + ``render_report`` (the fleet itself is built once, outside the timing), and
the page's size in bytes. Prints a markdown section (machine, command, table) for
``bench/run_all.py``, which collects it into ``docs/benchmarks.md``.

Targets (the report issue): <= 5 s and <= 5 MB at 1,000 classes.

Run: ``.venv/bin/python bench/report.py`` (or ``make bench`` for every benchmark).
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from reports import build_report, render_report  # noqa: E402
from tests.reports.factories import CLOCK, synthetic_fleet  # noqa: E402

SIZES = (10, 100, 1000)
REPEATS = 3
TARGET_S = 5.0
TARGET_BYTES = 5_000_000


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def measure(classes: int) -> tuple[float, int]:
    """Median seconds of build + render over ``REPEATS`` runs, and the page's size in bytes."""
    fleet = synthetic_fleet(classes, samples=1000)
    manifest = fleet.manifest()
    times = []
    size = 0
    for _ in range(REPEATS):
        start = time.perf_counter()
        view = build_report(
            fleet.project,
            fleet.cells,
            fleet.runs,
            fleet.samples,
            now=CLOCK,
            tool_version="bench",
            snapshot=fleet.snapshot,
            manifest=manifest,
            signature_status="unsigned",
        )
        html = render_report(view)
        times.append(time.perf_counter() - start)
        size = len(html.encode("utf-8"))
    return statistics.median(times), size


def main() -> int:
    """Print the markdown section (a target missed is shown as **no**, not an exit status)."""
    print(
        f"Machine: {_cpu_model()}, {os.cpu_count()} logical CPUs, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}"
    )
    print(
        f"Command: `{Path(sys.executable).name} bench/report.py` (synthetic fleets: 2 artifacts "
        f"per class, 2 latency configs per artifact, 1,000 samples per config; build_report + "
        f"render_report, median of {REPEATS})"
    )
    print()
    print("| host classes | build + render | page size | target | met |")
    print("|---:|---:|---:|---|---|")
    for classes in SIZES:
        seconds, size = measure(classes)
        target, met = "", ""
        if classes == 1000:
            target = f"<= {TARGET_S:.0f} s, <= {TARGET_BYTES / 1e6:.0f} MB"
            met = "yes" if seconds <= TARGET_S and size <= TARGET_BYTES else "**no**"
        print(f"| {classes:,} | {seconds:.2f} s | {size / 1e6:.2f} MB | {target} | {met} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
