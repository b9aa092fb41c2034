"""Benchmark: the open-loop rate search on a real model against an M/D/1 queue's prediction.

A model whose every inference does the same work (the test MLP behind ``--extra`` MatMuls by
the identity, one intra-op thread) is close to a queue with a fixed service time. This runs
``qualify run`` (real serving process) once to read its p50, sets the class's p99 budget to
``--budget-x`` times it, then runs again with ``workload.open_loop``, and compares the highest
rate the search found with the rate an M/D/1 queue (Poisson arrivals, one server, a fixed
service time: ``qualify.measure.openloop.md1_max_rate``) predicts for the same budget, taking as the
service time the median of the probes' own times in service. Target (issue 11): within 15%.
Repeated ``--repeat`` times; each row is one search. A real service time varies a little (an
M/G/1 queue, whose tail is longer than M/D/1's), so the search finds somewhat less than the
prediction.

Usage::

    .venv/bin/python bench/openloop.py [--repeat 3] [--extra 300] [--budget-x 10]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from qualify.measure.openloop import md1_max_rate  # noqa: E402
from qualify.project.load import load_project  # noqa: E402
from qualify.run import RunOptions, qualify_run  # noqa: E402
from tests.models import padded_mlp  # noqa: E402
from tests.qualify.projects import write_project  # noqa: E402

CLASS = "here-cpu"


def _project(tmp: Path, extra: int, budget_ms: float, open_loop: bool) -> Path:
    project = write_project(tmp, [])
    padded_mlp(tmp / "models", extra, "fixed")
    text = project.read_text().replace("models/identity_mlp.onnx", "models/fixed.onnx")
    text = text.replace("  concurrency: [1, 2]\n", "  concurrency: [1]\n")
    if open_loop:
        text = text.replace("  warmup: 10\n", "  warmup: 10\n  open_loop: {probes: 8}\n")
    text = text.replace("budgets: {p99_ms: 50,", f"budgets: {{p99_ms: {budget_ms:.4f},", 1)
    project.write_text(text)
    return project


def _service_ms(tmp: Path, extra: int) -> float:
    loaded = load_project(_project(tmp, extra, 1000.0, open_loop=False))
    outcome = qualify_run(loaded, CLASS, RunOptions(db_path=tmp / "pre.duckdb"))
    [cell] = outcome.bundle.cells
    gate = cell.gate_latency
    assert gate is not None, cell.error
    return gate.p50_ms


def main(argv: list[str] | None = None) -> int:
    """Run the searches and print the section."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--extra", type=int, default=300, help="identity MatMuls after the MLP")
    parser.add_argument("--budget-x", type=float, default=10.0, help="p99 budget / service time")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    rows: list[tuple[float, float, float, float, float, int]] = []
    for k in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="qualify-bench-openloop-") as tmp:
            root = Path(tmp)
            service = _service_ms(root / "pre", args.extra)
            budget = args.budget_x * service
            loaded = load_project(_project(root / "run", args.extra, budget, open_loop=True))
            outcome = qualify_run(loaded, CLASS, RunOptions(db_path=root / "m.duckdb"))
            [cell] = outcome.bundle.cells
            found = cell.open_loop
            assert found is not None and found.closed_loop_rps, cell.error
            # The service time the queue had: the median of the probes' own service times.
            measured = statistics.median(p.service_p50_ms for p in found.probes)
            predicted = md1_max_rate(measured / 1000.0, budget / 1000.0)
            rate = found.max_rate_rps or 0.0
            rows.append((measured, budget, predicted, rate, rate / predicted, len(found.probes)))
            print(
                f"search {k + 1}: service {measured:.3f} ms, budget {budget:.3f} ms, "
                f"found {rate:,.0f}/s, M/D/1 {predicted:,.0f}/s",
                file=sys.stderr,
            )
    median = statistics.median(r[4] for r in rows)
    print("## Open-loop rate search vs an M/D/1 queue\n")
    print(
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs, "
        f"Python {platform.python_version()}; load average {load_before:.2f} before, "
        f"{os.getloadavg()[0]:.2f} after"
    )
    print(
        f"Command: `python bench/openloop.py --repeat {args.repeat} --extra {args.extra} "
        f"--budget-x {args.budget_x:g}` (the test MLP behind {args.extra} identity MatMuls, one "
        f"intra-op thread, one server; the p99 budget {args.budget_x:g}x its service time)\n"
    )
    print(
        "| search | service time | p99 budget | M/D/1 max rate | found | found / M/D/1 | probes |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for k, (service, budget, predicted, rate, ratio, probes) in enumerate(rows, 1):
        print(
            f"| {k} | {service:.3f} ms | {budget:.3f} ms | {predicted:,.0f}/s | {rate:,.0f}/s | "
            f"{ratio:.2f} | {probes} |"
        )
    met = abs(median - 1.0) <= 0.15
    print(
        f"\nMedian found / predicted: **{median:.2f}** (target: within 15%, 0.85-1.15: "
        f"{'met' if met else 'NOT met'}). The service time is the median of the probes' "
        "median times in service (no queueing), from the search itself.\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
