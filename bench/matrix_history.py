"""Benchmark: what a matrix's history costs a release decision.

A matrix keeps every run's cells: a fleet re-qualified release after release holds many cells
per (key, artifact). Generation decides on ``Store.decision_cells`` and ``decision_runs`` (the
newest cell per key, digest, settings and emulation, and the runs those and the rollback checks
need). This measures, on one DuckDB matrix of ``--classes`` classes each qualified ``--history``
times (scripted runs of the baseline and an int8 candidate, ``bench/_synthetic.py``), reading
and deciding on those against reading and deciding on every cell and run, interleaved, medians
of ``--repeats``; the two must decide alike. Prints one markdown section.

Usage::

    .venv/bin/python bench/matrix_history.py [--classes 1000] [--history 10] [--repeats 3]
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._synthetic import project_of, scripted_run  # noqa: E402
from bench.generate import CLOCK, _bulk_write, _classes  # noqa: E402
from manifest.policy import decide  # noqa: E402
from matrix.store import Store  # noqa: E402
from schemas.cell import RunBundle  # noqa: E402

__all__ = ["main"]


def _matrix(path: Path, classes: int, history: int) -> None:
    project = project_of(_classes(classes))
    bundles = []
    for h in range(history):
        for i, (name, cls) in enumerate(project.host_classes.items()):
            run, pair = scripted_run(
                name, cls, run_id=f"run-{h:03d}-{i:06d}", when=CLOCK + timedelta(hours=h)
            )
            bundles.append(RunBundle(run=run, cells=pair))
    with Store.open(path, clock=lambda: CLOCK) as db:
        _bulk_write(db, bundles)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print its markdown section."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--history", type=int, default=10, help="runs per class")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if min(args.classes, args.history, args.repeats) < 1:
        parser.error("--classes, --history and --repeats must be at least 1")
    project = project_of(_classes(args.classes))
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="qualify-bench-history-") as tmp:
        path = Path(tmp) / "m.duckdb"
        _matrix(path, args.classes, args.history)
        times: dict[str, list[float]] = {"every": [], "decision": []}
        counts: dict[str, tuple[int, int]] = {}
        found: dict[str, object] = {}
        with Store.open(path, read_only=True) as db:
            reads = {
                "every": (db.cells, db.runs),
                "decision": (db.decision_cells, db.decision_runs),
            }
            for _ in range(args.repeats):
                for name, (read_cells, read_runs) in reads.items():
                    gc.collect()
                    gc.disable()  # as generation runs it (manifest._batch.paused_gc)
                    started = time.perf_counter()
                    cells = read_cells()
                    runs = {r.run_id: r for r in read_runs()}
                    found[name] = decide(project, cells, runs)
                    times[name].append(time.perf_counter() - started)
                    gc.enable()
                    counts[name] = (len(cells), len(runs))
    if found["every"] != found["decision"]:
        raise SystemExit("deciding on the decision cells differs from deciding on every cell")
    every, chosen = statistics.median(times["every"]), statistics.median(times["decision"])
    command = (
        f"python bench/matrix_history.py --classes {args.classes} --history {args.history} "
        f"--repeats {args.repeats}"
    )
    print("## A matrix's history and a release decision")
    print()
    print(
        f"Command: `{command}`; {platform.machine()}, {os.cpu_count()} logical CPUs, load "
        f"average {load[0]:.2f}. {args.classes:,} classes, each qualified {args.history} times; "
        "read the cells and runs, then decide every class (medians, interleaved; both decide "
        "alike)."
    )
    print()
    print("| read | cells | runs | read + decide | ratio |")
    print("|---|---|---|---|---|")
    for name, label, spent in (
        ("every", "every cell and run (`cells`, `runs`)", every),
        ("decision", "`decision_cells`, `decision_runs` (what generation reads)", chosen),
    ):
        cells_n, runs_n = counts[name]
        print(f"| {label} | {cells_n:,} | {runs_n:,} | {spent:.2f} s | {spent / every:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
