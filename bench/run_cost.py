"""Benchmark: a qualification run's fixed cost against what its evidence needs.

Lays out the demo project (its model, recorded data and project file), then, ``--repeats`` times
and interleaved with the reference, runs ``qualify run --host-class CLASS`` in a fresh process
as a user would. The reference, measured in the same repetition, is what the evidence needs:

* the run's own timed loops (every latency config's sampled seconds, summed over its rounds and
  artifacts, as the matrix stores them in ``latency.duration_s``);
* each artifact's cold init (``cold_init_ms`` of its cell);
* one bare ``python -c "import numpy, onnxruntime"`` per artifact, measured now.

The ratio is the run's wall time over that sum (the issue's target: at most 4). It also prints
where one more run's time goes, stage by stage, from a cProfile of that run's parent process.

Usage::

    .venv/bin/python bench/run_cost.py [--repeats 5] [--host-class x86-v3-1t]
"""

from __future__ import annotations

import argparse
import os
import platform
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from matrix.store import Store  # noqa: E402
from qualify.demo.story import lay_out  # noqa: E402

STAGES = (
    ("parent imports (qualify.run and what it pulls in)", "qualify/run.py", "<module>"),
    ("runtime probe (a subprocess)", "qualify/measure/runner.py", "probe_runtime"),
    ("workers preparing (import, session, parity outputs)", "qualify/measure/runner.py", "ready"),
    ("interleaved rounds", "qualify/measure/ab.py", "interleave"),
    ("throughput and profiling passes, worker exit", "qualify/measure/runner.py", "finish"),
    ("rollback check", "qualify/run.py", "_rollback_check"),
    ("sample tables (pyarrow, pandas on first use)", "qualify/run.py", "_sample_tables"),
)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _wall(args: list[str], cwd: Path) -> float:
    started = time.perf_counter()
    subprocess.run(args, cwd=cwd, env=_env(), check=True, capture_output=True)
    return time.perf_counter() - started


def _evidence_s(db: Path) -> tuple[float, float, int]:
    """(timed loops s, cold inits s, artifacts) of the latest run in ``db``."""
    with Store.open(db, read_only=True) as store:
        run = store.runs()[-1]
        cells = store.cells(run_id=run.run_id)
    loops = sum(r.duration_s or 0.0 for c in cells for r in c.latency)
    inits = sum((c.cold_init_ms or 0.0) / 1000.0 for c in cells)
    return loops, inits, len(cells)


def _stage_profile(project: Path, host_class: str) -> list[tuple[str, float | None]]:
    """Seconds per stage of one in-process run (cProfile's cumulative time per function)."""
    out = project.parent / "profile.out"
    script = project.parent / "profiled_run.py"
    script.write_text(
        "import sys\n"
        f"sys.argv = ['qualify', 'run', '--host-class', {host_class!r}, '--db', 'prof.duckdb']\n"
        "from qualify.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
    )
    subprocess.run(
        [sys.executable, "-m", "cProfile", "-o", str(out), str(script)],
        cwd=project.parent,
        env=_env(),
        check=True,
        capture_output=True,
    )
    stats = pstats.Stats(str(out)).stats  # type: ignore[attr-defined]
    total = max(ct for (_, _, _), (_, _, _, ct, _) in stats.items())
    found: list[tuple[str, float | None]] = [("whole run (profiled)", total)]
    for label, path, function in STAGES:
        seconds = None
        for (file, _, name), (_, _, _, ct, _) in stats.items():
            if file.endswith(path) and name == function:
                seconds = max(seconds or 0.0, ct)
        found.append((label, seconds))
    return found


def main(argv: list[str] | None = None) -> int:
    """Measure ``--repeats`` runs against their references and print the section."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--host-class", default="x86-v3-1t")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    rows: list[tuple[float, float, float, float, int, float]] = []
    with tempfile.TemporaryDirectory(prefix="qualify-bench-run-") as tmp:
        project = lay_out(Path(tmp) / "demo")
        cwd = project.parent
        qualify = [sys.executable, "-m", "qualify", "run", "--host-class", args.host_class]
        bare = [sys.executable, "-c", "import numpy, onnxruntime"]
        _wall([*qualify, "--db", "warm.duckdb"], cwd)  # page cache, compiled bytecode
        for k in range(args.repeats):
            db = cwd / f"m{k}.duckdb"
            run_s = _wall([*qualify, "--db", db.name], cwd)
            import_s = _wall(bare, cwd)
            loops, inits, artifacts = _evidence_s(db)
            reference = loops + inits + artifacts * import_s
            rows.append((run_s, loops, inits, import_s, artifacts, run_s / reference))
            print(f"run {k}: {run_s:.2f} s, reference {reference:.2f} s", file=sys.stderr)
        stages = _stage_profile(project, args.host_class)
    load_after = os.getloadavg()[0]
    ratios = [r[-1] for r in rows]
    print(f"## A run's fixed cost (`qualify run --host-class {args.host_class}` on the demo)\n")
    print(
        f"`python bench/run_cost.py --repeats {args.repeats}` on {platform.node()} "
        f"({os.cpu_count()} CPUs), load average {load_before:.2f} before, {load_after:.2f} "
        "after. Each repetition runs the command in a fresh process, then one bare "
        '`python -c "import numpy, onnxruntime"`; the reference is the run\'s own timed loops '
        "+ its artifacts' cold inits + one bare import per artifact.\n"
    )
    print("| rep | run s | timed loops s | cold inits s | bare import s | artifacts | ratio |")
    print("|---|---|---|---|---|---|---|")
    for k, (run_s, loops, inits, import_s, artifacts, ratio) in enumerate(rows):
        print(
            f"| {k} | {run_s:.2f} | {loops:.3f} | {inits:.3f} | {import_s:.3f} | {artifacts} | "
            f"{ratio:.2f}x |"
        )
    print(
        f"\nMedian ratio **{statistics.median(ratios):.2f}x** (target at most 4x), range "
        f"{min(ratios):.2f}x to {max(ratios):.2f}x.\n"
    )
    print("Where one run's time goes (cProfile of the parent, cumulative seconds per stage;")
    print("the stages overlap where one calls another, and profiling slows the parent):\n")
    print("| stage | s |")
    print("|---|---|")
    for label, seconds in stages:
        print(f"| {label} | {'not seen' if seconds is None else f'{seconds:.2f}'} |")
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
