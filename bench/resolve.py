"""Benchmark: ``resolve-artifact`` start-to-exit against bare Python, and manifest generation.

Measures, on this machine and in this run:

* the wall time of the whole ``resolve-artifact`` process (median of ``--repeat`` runs, signature
  verification included) next to ``python -c pass``, interleaved so drift hits both alike, for a
  1,000-class manifest, for one per-class document of a 100,000-class fleet, and (no target) for
  the whole 100,000-class manifest;
* the time to generate a 10,000-class manifest: decide, build, sign, write.

Targets (from the issue): resolve <= 3.5x bare Python start, generation of 10,000 classes <= 2 s.
Prints a markdown table for docs/benchmarks.md with the machine and the command.

Usage::

    .venv/bin/python bench/resolve.py [--repeat 20] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import compileall
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._synthetic import BASE, CAND, project_of, scripted_run  # noqa: E402
from manifest import envelope  # noqa: E402
from manifest.build import build_manifest, per_class_documents, write_manifest  # noqa: E402
from manifest.policy import decide  # noqa: E402
from manifest.signing import (  # noqa: E402
    generate_keypair,
    load_private_key,
    sign_document,
    sign_encoded,
)
from schemas.cell import (  # noqa: E402
    Cell,
    RunRecord,
)
from schemas.manifest import ArtifactRef  # noqa: E402
from schemas.project import Project  # noqa: E402

CLOCK = datetime.now(UTC).replace(microsecond=0)


def _fleet(n: int) -> tuple[Project, list[Cell], dict[str, RunRecord]]:
    """A project of ``n`` classes and one scripted run each (baseline + int8 candidate).

    Every third class falls back to the CPU, every fifth is over its p99 budget, every seventh
    was never measured: the decisions are mixed, as in a real fleet.
    """
    classes = {
        f"c{i:06d}": {
            "key": {"hardware": f"hw{i}", "runtime": "ort-r8", "provider": f"p{i}"},
            "match": {"arch": "x86_64", "cpu_flags": [f"flag{i % 17}"], "min_cores": 2},
            "runtime": {"package": "onnxruntime", "version": "1.32.*"},
            "provider": {"execution_providers": ["CPUExecutionProvider"]},
            "budgets": {"p99_ms": 80.0, "peak_rss_mb": 512.0, "cold_init_ms": 1500.0},
        }
        for i in range(n)
    }
    project = project_of(classes)
    cells: list[Cell] = []
    runs: dict[str, RunRecord] = {}
    for i, (name, cls) in enumerate(project.host_classes.items()):
        if i % 7 == 6:
            continue
        run, pair = scripted_run(
            name,
            cls,
            run_id=f"run-{i:06d}",
            when=CLOCK,
            upper_ms=95.0 if i % 5 == 4 else 41.0,
            fallback=4 if i % 3 == 2 else 0,
        )
        runs[run.run_id] = run
        cells.extend(pair)
    return project, cells, runs


ARTIFACTS = {
    BASE: ArtifactRef(
        name="rec-fp32", uri="https://models.example/rec-fp32.onnx", length=4_000_000
    ),
    CAND: ArtifactRef(
        name="rec-int8", uri="https://models.example/rec-int8.onnx", length=1_000_000
    ),
}


def _generate(n: int, key: Any, out: Path) -> dict[str, float]:
    project, cells, runs = _fleet(n)
    t0 = time.perf_counter()
    decisions = decide(project, cells, runs, digests={"rec-fp32": BASE, "rec-int8": CAND})
    t1 = time.perf_counter()
    signed = build_manifest(
        project,
        decisions,
        release="bench",
        version=1,
        created=CLOCK - timedelta(hours=1),
        expires=CLOCK + timedelta(days=30),
        snapshot="bench",
        artifacts=ARTIFACTS,
    )
    t2 = time.perf_counter()
    _, doc = sign_encoded(signed, key)
    t3 = time.perf_counter()
    write_manifest(doc, out)
    t4 = time.perf_counter()
    return {
        "decide": t1 - t0,
        "build": t2 - t1,
        "sign": t3 - t2,
        "write": t4 - t3,
        "total": t4 - t0,
    }


def _clone_fleet(template: dict[str, Any], n: int) -> dict[str, Any]:
    """A ``signed`` part of ``n`` classes, each a copy of one real entry under its own name/key."""
    entries = {}
    for i in range(n):
        name = f"c{i:06d}"
        entry = dict(template)
        entry["host_class"] = name
        entry["key"] = {"hardware": f"hw{i}", "runtime": "ort-r8", "provider": f"p{i}"}
        entry["match"] = {**template["match"], "cpu_flags": [f"flag{i % 17}"]}
        entries[name] = entry
    return {**template["_signed"], "entries": entries}


def _answered(code: int, cmd: list[str]) -> None:
    """A full answer: resolved (0) or on hold (3, the synthetic class's decision) both verify
    and parse the whole document; anything else means the benchmark measured a refusal."""
    if code not in (0, 3):
        raise SystemExit(f"{' '.join(cmd)} exited {code}: not an answer, nothing to time")


def _median_runs(commands: dict[str, list[str]], repeat: int) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in commands}
    for cmd in commands.values():  # warm the page cache and the state dir, untimed
        _answered(subprocess.run(cmd, stdout=subprocess.DEVNULL, cwd=ROOT).returncode, cmd)
    for _ in range(repeat):
        for label, cmd in commands.items():
            t0 = time.perf_counter()
            code = subprocess.run(cmd, stdout=subprocess.DEVNULL, cwd=ROOT).returncode
            _answered(code, cmd)
            times[label].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print the markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeat", type=int, default=20, help="runs per command (median)")
    parser.add_argument("--workdir", type=Path, help="keep the files here (default: a temp dir)")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        key_path, pub_path = generate_keypair("bench", work, overwrite=True)
        key = load_private_key(key_path)

        gen = min(
            (_generate(10_000, key, work / "m10000.json") for _ in range(3)),
            key=lambda r: r["total"],
        )
        _generate(1_000, key, work / "m1000.json")
        import json

        doc1000 = json.loads((work / "m1000.json").read_bytes())
        template = dict(doc1000["signed"]["entries"]["c000500"])
        template["_signed"] = {k: v for k, v in doc1000["signed"].items() if k != "entries"}
        signed100k = _clone_fleet(template, 100_000)
        t0 = time.perf_counter()
        write_manifest(sign_encoded(signed100k, key)[1], work / "m100000.json")
        t_big = time.perf_counter() - t0
        t0 = time.perf_counter()
        docs = per_class_documents(signed100k)
        t_split = time.perf_counter() - t0
        classes = work / "classes"
        classes.mkdir(exist_ok=True)
        one = "c050000"
        write_manifest(sign_document(docs[one], key), classes / envelope.class_filename(one))

        for state in (
            "s1",
            "s2",
            "s3",
            "s4",
            "s5",
        ):  # fresh host state: a kept one trusts another key
            shutil.rmtree(work / state, ignore_errors=True)
        # An installed wheel ships its bytecode (pip compiles it); a checkout under
        # PYTHONDONTWRITEBYTECODE would compile manifest.resolve in every timed run instead.
        for package in ("manifest", "schemas"):
            compileall.compile_dir(str(ROOT / package), quiet=1, maxlevels=0)
        py = sys.executable
        resolve = [py, "-m", "manifest.resolve", "--pubkey", str(pub_path), "--host-class"]
        script = [py, "-c", "import sys; from manifest.resolve import main; sys.exit(main())"]
        script += ["--pubkey", str(pub_path), "--host-class"]
        commands = {
            "bare": [py, "-c", "pass"],
            "m1000": [
                *resolve,
                "c000500",
                "--manifest",
                str(work / "m1000.json"),
                "--state-dir",
                str(work / "s1"),
            ],
            "m1000-script": [
                *script,
                "c000500",
                "--manifest",
                str(work / "m1000.json"),
                "--state-dir",
                str(work / "s2"),
            ],
            "class": [*resolve, one, "--manifest", str(classes), "--state-dir", str(work / "s3")],
            "class-script": [
                *script,
                one,
                "--manifest",
                str(classes),
                "--state-dir",
                str(work / "s4"),
            ],
        }
        med = _median_runs(commands, args.repeat)
        big_cmd = {
            "m100000": [
                *resolve,
                one,
                "--manifest",
                str(work / "m100000.json"),
                "--max-bytes",
                str(1 << 30),
                "--state-dir",  # its own: the host's default one may trust another bench's key
                str(work / "s5"),
            ]
        }
        med.update(_median_runs(big_cmd, max(3, args.repeat // 4)))
        sizes = {
            "m1000": (work / "m1000.json").stat().st_size,
            "class": (classes / envelope.class_filename(one)).stat().st_size,
            "m100000": (work / "m100000.json").stat().st_size,
            "m10000": (work / "m10000.json").stat().st_size,
        }

    bare = med["bare"]

    def row(
        label: str, key_: str, size: int | None, target: str, check: Callable[[float], bool]
    ) -> str:
        ms, ratio = med[key_] * 1000, med[key_] / bare
        ok = "" if target == "none" else "yes" if check(ratio) else "**no**"
        size_s = (
            "" if size is None else f"{size / 1e6:.2f} MB" if size > 1e5 else f"{size / 1e3:.1f} kB"
        )
        return f"| {label} | {size_s} | {ms:.1f} ms | {ratio:.2f}x | {target} | {ok} |"

    def within(ratio: float) -> bool:
        return ratio <= 3.5

    load_after = os.getloadavg()
    print(
        f"Machine: {_cpu_model()}, {os.cpu_count()} logical CPUs, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}; load average "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after"
    )
    print(
        f"Command: `{Path(sys.executable).name} bench/resolve.py --repeat {args.repeat}` "
        f"(median of {args.repeat} interleaved runs; whole process, signature included)"
    )
    print()
    print("| resolve-artifact | document | median wall | vs `python -c pass` | target | met |")
    print("|---|---|---|---|---|---|")
    print(f"| `python -c pass` | | {bare * 1000:.1f} ms | 1.00x | | |")
    print(
        row(
            "1,000-class manifest (`python -m manifest.resolve`)",
            "m1000",
            sizes["m1000"],
            "<= 3.5x",
            within,
        )
    )
    print(
        row("1,000-class manifest (console-script entry)", "m1000-script", None, "<= 3.5x", within)
    )
    print(
        row(
            "per-class document of a 100,000-class fleet (`-m`)",
            "class",
            sizes["class"],
            "<= 3.5x",
            within,
        )
    )
    print(
        row(
            "per-class document of a 100,000-class fleet (console-script entry)",
            "class-script",
            None,
            "<= 3.5x",
            within,
        )
    )
    print(
        row(
            "whole 100,000-class manifest (`-m`)",
            "m100000",
            sizes["m100000"],
            "none",
            lambda r: True,
        )
    )
    print()
    print("| manifest generation | time | target | met |")
    print("|---|---|---|---|")
    total_ok = "yes" if gen["total"] <= 2.0 else "**no**"
    print(
        f"| 10,000 classes: decide + build + sign + write ({sizes['m10000'] / 1e6:.1f} MB) | "
        f"{gen['total']:.2f} s (decide {gen['decide']:.2f}, build {gen['build']:.2f}, "
        f"sign {gen['sign']:.2f}, write {gen['write']:.2f}) | <= 2 s | {total_ok} |"
    )
    print(f"| 100,000 classes: sign + write the whole manifest | {t_big:.2f} s | none | |")
    print(
        f"| 100,000 classes: split into per-class documents (unsigned) | {t_split:.2f} s | none | |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
