"""Benchmark: the read commands' start-up against the one library each needs.

Lays out the demo project, runs one class so that the matrix holds real cells, publishes an
unsigned manifest, then measures, ``--repeats`` times and interleaved, each command in a fresh
process as a user's shell starts it:

* ``qualify matrix show`` against ``python -c "import duckdb"`` (the issue's target: at most 2x);
* ``qualify manifest show manifest.json`` and ``qualify --help`` against ``python -c pass``.

Prints a markdown section with the medians and ratios, the load average and the command.

Usage::

    .venv/bin/python bench/read_commands.py [--repeats 15]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from qualify.demo.story import lay_out  # noqa: E402

TARGETS = {"matrix show": 2.0}


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _wall(args: list[str], cwd: Path) -> float:
    started = time.perf_counter()
    subprocess.run(args, cwd=cwd, env=_env(), check=True, capture_output=True)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    """Measure every command against its reference and print the section."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    py = sys.executable
    qualify = [py, "-m", "qualify"]
    pairs = {
        "matrix show": ([*qualify, "matrix", "show"], [py, "-c", "import duckdb"]),
        "manifest show": ([*qualify, "manifest", "show", "manifest.json"], [py, "-c", "pass"]),
        "--help": ([*qualify, "--help"], [py, "-c", "pass"]),
    }
    load_before = os.getloadavg()[0]
    times: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in pairs}
    with tempfile.TemporaryDirectory(prefix="qualify-bench-read-") as tmp:
        cwd = lay_out(Path(tmp) / "demo").parent
        subprocess.run(
            [*qualify, "run", "--host-class", "x86-v3-1t", "--emulate"],
            cwd=cwd,
            env=_env(),
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [*qualify, "manifest", "generate", "--release", "bench", "--unsigned", "--publish"],
            cwd=cwd,
            env=_env(),
            check=True,
            capture_output=True,
        )
        for command, reference in pairs.values():  # warm the page cache and bytecode
            _wall(command, cwd)
            _wall(reference, cwd)
        for _ in range(args.repeats):
            for label, (command, reference) in pairs.items():
                times[label][0].append(_wall(command, cwd))
                times[label][1].append(_wall(reference, cwd))
    load_after = os.getloadavg()[0]
    print("## Read commands: start-up against the library each needs\n")
    print(
        f"`python bench/read_commands.py --repeats {args.repeats}` on {platform.node()} "
        f"({os.cpu_count()} CPUs), load average {load_before:.2f} before, {load_after:.2f} "
        "after. Each command and its reference run in fresh processes, alternately, on the "
        "demo project after one run of x86-v3-1t; medians of the wall times.\n"
    )
    print("| command | qualify ms | reference | reference ms | ratio | target |")
    print("|---|---|---|---|---|---|")
    for label, (_, reference) in pairs.items():
        ours, ref = (statistics.median(v) for v in times[label])
        target = TARGETS.get(label)
        print(
            f"| `qualify {label}` | {ours * 1000:.0f} | `{' '.join(reference[1:])}` | "
            f"{ref * 1000:.0f} | {ours / ref:.2f}x | "
            f"{'at most ' + format(target, 'g') + 'x' if target else 'none'} |"
        )
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
