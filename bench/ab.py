"""Benchmark: how often the interleaved A/B calls a candidate slower than the baseline.

Runs ``qualify run`` (the real thing: fresh serving processes, interleaved rounds, the
``max_slowdown`` gate at its default 1.0) ``--runs`` times on the small test project, with two
candidates beside the baseline ``identity_mlp``:

* ``twin``: the baseline's graph in other bytes: any ``slower_than_baseline`` is a false alarm
  (the issue's target: it passes in at least 19 of 20 runs);
* ``slow``: the same MLP behind 40 MatMuls by the identity (same numbers, ~4x the work): every
  run should call it slower.

Prints a markdown section for docs/benchmarks.md with the per-run p50 ratios and bounds.

Usage::

    .venv/bin/python bench/ab.py [--runs 20]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from qualify.project import load_project  # noqa: E402
from qualify.run import RunOptions, qualify_run  # noqa: E402
from tests.models import padded_mlp  # noqa: E402
from tests.qualify.projects import write_project  # noqa: E402


def _project(tmp: Path) -> Path:
    project = write_project(tmp, [])
    padded_mlp(tmp / "models", 0, "twin")
    padded_mlp(tmp / "models", 40, "slow")
    listing = "    - {path: models/twin.onnx}\n    - {path: models/slow.onnx}\n"
    text = project.read_text().replace("  candidates:\n    []\n", "  candidates:\n" + listing)
    project.write_text(text)
    return project


def main(argv: list[str] | None = None) -> int:
    """Run the A/B ``--runs`` times and print the section."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    rows: list[tuple[int, str, str, float, float | None, str]] = []
    alarms = {"twin": 0, "slow": 0}
    walls: list[float] = []
    with tempfile.TemporaryDirectory(prefix="qualify-bench-ab-") as tmp:
        loaded = load_project(_project(Path(tmp)))
        for run in range(args.runs):
            started = time.perf_counter()
            outcome = qualify_run(loaded, "here-cpu", RunOptions(db_path=Path(tmp) / "m.duckdb"))
            walls.append(time.perf_counter() - started)
            for cell in outcome.bundle.cells:
                if cell.role != "candidate":
                    continue
                slower = any(r.code == "slower_than_baseline" for r in cell.reasons)
                alarms[cell.artifact_name] += slower
                for result in cell.latency:
                    ratio = result.vs_baseline
                    if ratio is None or ratio.p50_ratio is None:
                        continue
                    rows.append(
                        (
                            run,
                            cell.artifact_name,
                            f"c{result.concurrency}",
                            ratio.p50_ratio,
                            ratio.p50_lower,
                            "slower" if slower else "not slower",
                        )
                    )
            print(f"run {run + 1}/{args.runs}: {walls[-1]:.1f} s", file=sys.stderr)
    n = args.runs
    print("## Interleaved A/B: false alarms and detection (`max_slowdown` 1.0)\n")
    print(
        f"Machine: {platform.machine()}, {os.cpu_count()} logical CPUs, Python "
        f"{platform.python_version()}; load average {load_before:.2f} before, "
        f"{os.getloadavg()[0]:.2f} after"
    )
    print(
        f"Command: `python bench/ab.py --runs {n}` (the test project: batch 1, concurrency 1 and "
        f"2, 10+ rounds each; median run {statistics.median(walls):.1f} s)\n"
    )
    print("| candidate | what it is | runs called slower | target | met |")
    print("|---|---|---:|---|---|")
    twin_ok = n - alarms["twin"] >= round(0.95 * n)
    print(
        f"| twin | the baseline's graph, other bytes | {alarms['twin']} of {n} | "
        f"passes in >= 19 of 20 | {'yes' if twin_ok else 'NO'} |"
    )
    slow_ok = alarms["slow"] == n
    print(
        f"| slow | +40 identity MatMuls | {alarms['slow']} of {n} | every run | "
        f"{'yes' if slow_ok else 'NO'} |\n"
    )
    for name in ("twin", "slow"):
        mine = [r for r in rows if r[1] == name]
        ratios = [r[3] for r in mine]
        lowers = [r[4] for r in mine if r[4] is not None]
        print(
            f"{name}: p50 ratio over runs and configs median {statistics.median(ratios):.3f} "
            f"(range {min(ratios):.3f} to {max(ratios):.3f}); lower bound range "
            f"{min(lowers):.3f} to {max(lowers):.3f}\n"
        )
    return 0 if twin_ok and slow_ok else 1


if __name__ == "__main__":
    sys.exit(main())
