"""Benchmark: how often the interleaved A/B calls a candidate slower, with and without the A/A
control, under load.

Runs ``qualify run`` (the real thing: fresh serving processes, interleaved rounds, the
``max_slowdown`` gate at its default 1.0, every workload setting at its default) ``--runs``
times with the A/A control (``workload.aa_control: true``, the default) and as many times
without it, alternately, side by side in one bench run, while ``--hogs`` CPU hogs (busy Python
loops started and stopped here) compete for the cores. The project has two candidates beside
the baseline ``identity_mlp`` (16 -> 32 -> 4, intra-op threads 1, batch 1, concurrency 1):

* ``twin``: the baseline's graph in other bytes: any ``slower_than_baseline`` is a false alarm
  (target: at most 1 in 20 runs);
* ``slow``: the same MLP behind ``--extra`` MatMuls by the identity (same numbers, ~10% more
  work; the measured ratio is printed): target: called slower in at least 18 of 20 runs.

Prints a markdown section for docs/benchmarks.md: alarms per mode, the run-time cost of the
control, the ratios and the slowdown each run could have seen. ``--dump FILE`` also writes every
run's per-round figures as JSON.

Usage::

    .venv/bin/python bench/ab.py [--runs 20] [--hogs 2] [--extra 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from qualify.project.load import load_project  # noqa: E402
from qualify.run import RunOptions, qualify_run  # noqa: E402
from schemas.cell import Cell  # noqa: E402
from tests.models import build, padded_mlp  # noqa: E402

FALSE_ALARMS_MAX = 1
"""Of 20 runs: the twin may be called slower at most this often."""
DETECTIONS_MIN = 18
"""Of 20 runs: the ~10% slower candidate must be called slower at least this often."""
NAMES = ("twin", "slow", "slight")
"""The candidates: judged (twin, slow), and reported (slight: half the extra MatMuls)."""


def _project(tmp: Path, extra: int, control: bool, rounds: int | None) -> Path:
    models = tmp / "models"
    rounds_line = f"\n          rounds: {rounds}" if rounds else ""
    build("identity_mlp", models)
    padded_mlp(models, 0, "twin")
    padded_mlp(models, extra, "slow")
    padded_mlp(models, extra // 2, "slight")
    text = textwrap.dedent(
        f"""\
        model: ab-bench
        artifacts:
          baseline: {{path: models/identity_mlp.onnx}}
          candidates:
            - {{path: models/twin.onnx}}
            - {{path: models/slow.onnx}}
            - {{path: models/slight.onnx}}
        workload:
          inputs: {{x: {{shape: [1, 16], source: generated, seed: 7}}}}
          aa_control: {str(control).lower()}{rounds_line}
        host_classes:
          here-cpu:
            key: {{hardware: here, runtime: ort-any, provider: cpu}}
            match: {{arch: {platform.machine()}}}
            provider: {{execution_providers: [CPUExecutionProvider], intra_op_threads: 1}}
            budgets: {{p99_ms: 50}}
        """
    )
    path = tmp / f"qualify-{'control' if control else 'plain'}.yaml"
    path.write_text(text)
    return path


def _start_hogs(count: int) -> list[subprocess.Popen[bytes]]:
    """``count`` busy loops, each its own process, for the bench to stop by pid."""
    return [
        subprocess.Popen(
            [sys.executable, "-c", "while True: pass"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(count)
    ]


def _stop_hogs(hogs: list[subprocess.Popen[bytes]]) -> None:
    for hog in hogs:
        if hog.poll() is None:
            os.kill(hog.pid, signal.SIGKILL)
        hog.wait()


@dataclass
class Mode:
    """One side of the comparison: every run's verdicts and figures."""

    control: bool
    walls: list[float] = field(default_factory=list)
    alarms: dict[str, int] = field(default_factory=lambda: dict.fromkeys(NAMES, 0))
    ratios: dict[str, list[float]] = field(default_factory=lambda: {n: [] for n in NAMES})
    lowers: dict[str, list[float]] = field(default_factory=lambda: {n: [] for n in NAMES})
    seen: list[float] = field(default_factory=list)
    """Per run: the smallest p50 slowdown it could have called (the cell's figure)."""
    spreads: list[float] = field(default_factory=list)
    dumps: list[dict[str, object]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return "with A/A control" if self.control else "without control"

    def record(self, cells: list[Cell], wall: float) -> None:
        self.walls.append(wall)
        dump: dict[str, object] = {"wall_s": wall}
        for cell in cells:
            gate = cell.latency[0] if cell.latency else None
            if gate is None:
                continue
            dump[cell.artifact_name] = [f.p50_ms for f in gate.rounds]
            if cell.role == "baseline":
                dump["control"] = [f.p50_ms for f in gate.control_rounds]
                continue
            slower = any(r.code == "slower_than_baseline" for r in cell.reasons)
            self.alarms[cell.artifact_name] += slower
            ratio = gate.vs_baseline
            if ratio is None or ratio.p50_ratio is None:
                continue
            self.ratios[cell.artifact_name].append(ratio.p50_ratio)
            if ratio.p50_lower is not None:
                self.lowers[cell.artifact_name].append(ratio.p50_lower)
            if cell.artifact_name == "twin":
                if ratio.p50_detectable is not None:
                    self.seen.append(ratio.p50_detectable)
                if ratio.p50_spread is not None:
                    self.spreads.append(ratio.p50_spread)
        self.dumps.append(dump)


def _run(project: Path, tmp: Path, mode: Mode) -> None:
    loaded = load_project(project)
    started = time.perf_counter()
    outcome = qualify_run(
        loaded, "here-cpu", RunOptions(db_path=tmp / f"m-{int(mode.control)}.duckdb")
    )
    mode.record(list(outcome.bundle.cells), time.perf_counter() - started)


def _spread_text(values: list[float]) -> str:
    if not values:
        return "none"
    return f"median {statistics.median(values):.3f} (range {min(values):.3f} to {max(values):.3f})"


def _print(modes: list[Mode], runs: int, args: argparse.Namespace, loads: list[float]) -> bool:
    scale = runs / 20
    allowed = int(FALSE_ALARMS_MAX * scale)
    needed = -(-DETECTIONS_MIN * runs // 20)
    print("## Interleaved A/B under load: false alarms and detection, with and without the A/A")
    print("control (`max_slowdown` 1.0, default settings)\n")
    print(
        f"Machine: {platform.machine()}, {os.cpu_count()} logical CPUs, Python "
        f"{platform.python_version()}; {args.hogs} CPU hogs (busy Python loops) running "
        f"throughout; 1-minute load average {min(loads):.2f} to {max(loads):.2f} over the bench"
    )
    print(
        f"Command: `python bench/ab.py --runs {runs} --hogs {args.hogs} --extra {args.extra}` "
        "(baseline identity_mlp, batch 1, concurrency 1, intra-op threads 1, every workload "
        "setting at its default; the two modes alternate run by run)\n"
    )
    print("| mode | candidate | runs called slower | target | met | median run |")
    print("|---|---|---:|---|---|---:|")
    ok = True
    for mode in modes:
        wall = statistics.median(mode.walls)
        twin_ok = mode.alarms["twin"] <= allowed
        slow_ok = mode.alarms["slow"] >= needed
        if mode.control:
            ok = ok and twin_ok and slow_ok
        print(
            f"| {mode.name} | twin (same graph, other bytes) | {mode.alarms['twin']} of {runs} | "
            f"<= {allowed} | {'yes' if twin_ok else 'NO'} | {wall:.1f} s |"
        )
        print(
            f"| {mode.name} | slow (+{args.extra} identity MatMuls) | {mode.alarms['slow']} of "
            f"{runs} | >= {needed} | {'yes' if slow_ok else 'NO'} | {wall:.1f} s |"
        )
        print(
            f"| {mode.name} | slight (+{args.extra // 2} identity MatMul) | "
            f"{mode.alarms['slight']} of {runs} | reported | | {wall:.1f} s |"
        )
    with_c, without = modes
    cost = statistics.median(with_c.walls) / statistics.median(without.walls)
    print(
        f"\nRun-time cost of the control: median run {statistics.median(with_c.walls):.1f} s "
        f"with it, {statistics.median(without.walls):.1f} s without (x{cost:.2f}).\n"
    )
    for mode in modes:
        for name in NAMES:
            print(
                f"- {mode.name}, {name}: p50 ratio {_spread_text(mode.ratios[name])}; "
                f"lower bound {_spread_text(mode.lowers[name])}"
            )
    print(
        f"- with A/A control: between-process spread (x) {_spread_text(with_c.spreads)}; "
        f"smallest p50 slowdown each run could have called {_spread_text(with_c.seen)}\n"
    )
    return ok


def main(argv: list[str] | None = None) -> int:
    """Run both modes ``--runs`` times each under the hogs and print the section."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--hogs", type=int, default=2)
    parser.add_argument("--extra", type=int, default=2, help="identity MatMuls of 'slow'")
    parser.add_argument("--rounds", type=int, default=None, help="workload.rounds (default: its)")
    parser.add_argument("--dump", type=Path, default=None, help="write per-round figures here")
    args = parser.parse_args(argv)
    modes = [Mode(control=True), Mode(control=False)]
    loads = [os.getloadavg()[0]]
    hogs = _start_hogs(args.hogs)
    try:
        with tempfile.TemporaryDirectory(prefix="qualify-bench-ab-") as name:
            tmp = Path(name)
            projects = {m.control: _project(tmp, args.extra, m.control, args.rounds) for m in modes}
            for run in range(args.runs):
                for mode in modes if run % 2 == 0 else modes[::-1]:
                    _run(projects[mode.control], tmp, mode)
                    loads.append(os.getloadavg()[0])
                print(
                    f"run {run + 1}/{args.runs}: "
                    + ", ".join(f"{m.name} {m.walls[-1]:.1f} s" for m in modes)
                    + f"; load {loads[-1]:.2f}",
                    file=sys.stderr,
                )
    finally:
        _stop_hogs(hogs)
    if args.dump is not None:
        args.dump.write_text(json.dumps({m.name: m.dumps for m in modes}))
    return 0 if _print(modes, args.runs, args, loads) else 1


if __name__ == "__main__":
    sys.exit(main())
