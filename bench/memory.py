"""Benchmark: the worker's measured peak memory against a bare onnxruntime process.

qualify reports each artifact's peak RSS from its own fresh subprocess. That number should be
the model's memory plus what any service needs to run it (an interpreter with numpy and
onnxruntime), not qualify's harness. This runs the demo project (``qualify run``, emulated on
its x86-v3-1t class so that any host can) and, side by side, a bare ``python -c`` that imports
numpy and onnxruntime, creates one session on the same fp32 model with the same thread count
and runs it on the recorded inputs at the workload's concurrency levels (1, then 2 threads), reading its own VmHWM at the end. Target (issue 9): the
worker's fp32 peak within 10% of the bare process's. Also shows the import-only share recorded
in the cell. Interleaved ``--repeat`` times; medians.

Usage::

    .venv/bin/python bench/memory.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from qualify.demo.story import lay_out  # noqa: E402
from qualify.project.load import load_project  # noqa: E402
from qualify.run import RunOptions, qualify_run  # noqa: E402

BARE = """
import sys
import numpy as np, onnxruntime as ort
so = ort.SessionOptions(); so.intra_op_num_threads = 1
s = ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"])
x = np.load(sys.argv[2]).astype(np.float32)
name = s.get_inputs()[0].name
def work(offset):
    for i in range(2000):
        s.run(None, {name: x[(i + offset) % len(x)][None, :]})
work(0)
import threading  # the workload's concurrency 2: two threads share the session
threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
for t in threads: t.start()
for t in threads: t.join()
print(next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")))
"""


def _bare_mb(model: Path, inputs: Path) -> float:
    out = subprocess.run(
        [sys.executable, "-c", BARE, str(model), str(inputs)],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip().splitlines()[-1]) / 1024.0


def main(argv: list[str] | None = None) -> int:
    """Measure and print the section."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    bare: list[float] = []
    worker: list[float] = []
    imports: list[float] = []
    with tempfile.TemporaryDirectory(prefix="qualify-bench-mem-") as tmp:
        root = Path(tmp)
        project = lay_out(root)
        loaded = load_project(project)
        model = root / "models" / "digits-mlp-fp32.onnx"
        inputs = root / "data" / "digits_inputs.npy"
        for k in range(args.repeat):
            bare.append(_bare_mb(model, inputs))
            outcome = qualify_run(
                loaded, "x86-v3-1t", RunOptions(db_path=root / f"m{k}.duckdb", emulate=True)
            )
            fp32 = next(c for c in outcome.bundle.cells if c.artifact_name == "fp32")
            assert fp32.peak_rss_mb is not None, fp32.error
            worker.append(fp32.peak_rss_mb)
            if fp32.import_rss_mb is not None:
                imports.append(fp32.import_rss_mb)
            print(
                f"round {k + 1}: bare {bare[-1]:.1f} MB, worker {worker[-1]:.1f} MB",
                file=sys.stderr,
            )
    b, w = statistics.median(bare), statistics.median(worker)
    ratio = w / b
    print("## Worker peak memory vs a bare onnxruntime process\n")
    print(
        f"Machine: {platform.machine()}, {os.cpu_count()} logical CPUs, Python "
        f"{platform.python_version()}"
    )
    print(
        f"Command: `python bench/memory.py --repeat {args.repeat}` (the demo's fp32 digits MLP; "
        "median of interleaved runs)\n"
    )
    print("| process | peak RSS | vs bare | target | met |")
    print("|---|---:|---:|---|---|")
    print(
        f"| bare `python -c`: import numpy, onnxruntime; one session; 2,000 runs at concurrency 1 and 2 | {b:.1f} MB | 1.00x | | |"
    )
    imp = f"{statistics.median(imports):.1f} MB" if imports else "not recorded"
    print(
        f"| qualify worker's reported peak (cold init, parity, interleaved rounds, throughput; its warm-init and profiling sessions excluded) | "
        f"{w:.1f} MB | {ratio:.2f}x | <= 1.10x | {'yes' if ratio <= 1.10 else 'NO'} |"
    )
    print(
        f"| of which the interpreter with numpy and onnxruntime imported (`import_rss_mb`) | {imp} | | | |\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
