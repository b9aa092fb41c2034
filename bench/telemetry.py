"""Benchmark: ``qualify telemetry ingest`` and ``qualify telemetry check`` at 10 million events.

Measures, on this machine and in this run:

* writing a synthetic JSON-lines file of ``--events`` events (8 classes, 10,000 hosts, one day;
  one class's p99 regressed in the second half of the day, one class's provider changed on 1% of
  its events), not part of the targets, reported for context;
* ``ingest`` of that file into a fresh DuckDB matrix (hash pass, parse, validate, insert, one
  transaction) in its own process: wall time, events/s, peak RSS of that process;
* a re-ingest of the same file (idempotent: hashing only, nothing written);
* ``check`` (profile query, latency tail query, the pure judgement) over a 24-hour window in its
  own process: wall time and peak RSS; the alerts it raised must be exactly the injected ones.

Peak RSS is the phase's own process's high-water mark (``VmHWM``; ``ru_maxrss`` without
``/proc``), DuckDB included (it runs in-process). Prints one markdown section on stdout.

Usage::

    .venv/bin/python bench/telemetry.py [--events 10000000] [--workdir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

from bench._synthetic import BASE, CAND, project_of, scripted_run  # noqa: E402
from manifest.build import build_manifest  # noqa: E402
from manifest.policy import decide  # noqa: E402
from manifest.signing import sign_document  # noqa: E402
from schemas.cell import (  # noqa: E402
    Cell,
    RunRecord,
)
from schemas.manifest import ArtifactRef, Manifest  # noqa: E402

NOW = datetime(2025, 6, 2, 12, 0, tzinfo=UTC)
CLASSES = 8
HOSTS = 10_000
REGRESSED = "c3"
MOVED = "c5"
CHUNK = 500_000


def _fleet() -> tuple[list[Cell], Manifest]:
    """Eight CPU classes, each qualified with an int8 candidate (p99 upper bound 41 ms)."""
    project = project_of(
        {
            f"c{i}": {
                "key": {"hardware": f"hw{i}", "runtime": "ort-r8", "provider": f"p{i}"},
                "match": {"arch": "x86_64", "cpu_flags": [f"flag{i}"]},
                "runtime": {"package": "onnxruntime", "version": "1.32.*"},
                "budgets": {"p99_ms": 80.0},
            }
            for i in range(CLASSES)
        }
    )
    clock = NOW - timedelta(days=3)
    cells: list[Cell] = []
    runs: dict[str, RunRecord] = {}
    for name, cls in project.host_classes.items():
        run, pair = scripted_run(name, cls, run_id=f"run-{name}", when=clock)
        runs[run.run_id] = run
        cells.extend(pair)
    decisions = decide(
        project, cells, runs, previous=None, digests={"rec-fp32": BASE, "rec-int8": CAND}
    )
    signed = build_manifest(
        project,
        decisions,
        release="bench",
        version=1,
        created=clock,
        expires=NOW + timedelta(days=30),
        snapshot="bench",
        artifacts={
            BASE: ArtifactRef(name="rec-fp32", uri="https://m.example/fp32.onnx", length=4),
            CAND: ArtifactRef(name="rec-int8", uri="https://m.example/int8.onnx", length=1),
        },
    )
    doc = sign_document(signed, Ed25519PrivateKey.generate())
    return cells, Manifest.model_validate_json(json.dumps(doc))


def _prefix(name: str, nodes: dict[str, int]) -> str:
    fallback = sum(n for p, n in nodes.items() if p != "CPUExecutionProvider")
    counts = json.dumps(nodes, separators=(",", ":"), sort_keys=True)
    providers = json.dumps(sorted(nodes), separators=(",", ":"))
    return (
        f'{{"decision":"candidate","fallback_nodes":{fallback},"format":"qualify-telemetry/1",'
        f'"host_class":"{name}","manifest_version":1,"model_digest":"{CAND}",'
        f'"nodes_per_provider":{counts},"placement":"actual","providers":{providers},'
        '"runtime_package":"onnxruntime","runtime_revision":"1.32.0","source":"session",'
    )


def generate(path: Path, events: int, seed: int = 1) -> None:
    """Write ``events`` lines, in time order over the day before NOW."""
    rng = np.random.default_rng(seed)
    healthy = [_prefix(f"c{i}", {"CPUExecutionProvider": 20}) for i in range(CLASSES)]
    moved = _prefix(MOVED, {"CPUExecutionProvider": 14, "OpenVINOExecutionProvider": 6})
    start_ms = int((NOW - timedelta(hours=23, minutes=59)).timestamp() * 1000)
    span_ms = 23 * 3600 * 1000
    half_ms = start_ms + span_ms // 2
    with open(path, "w", encoding="utf-8") as out:
        done = 0
        while done < events:
            n = min(CHUNK, events - done)
            stamps = start_ms + (np.arange(done, done + n, dtype=np.int64) * span_ms) // events
            times = np.datetime_as_string(stamps.astype("datetime64[ms]"), unit="ms")
            klass = rng.integers(0, CLASSES, n)
            hosts = klass * (HOSTS // CLASSES) + rng.integers(0, HOSTS // CLASSES, n)
            latency = 20.0 * np.exp(0.25 * rng.standard_normal(n))
            slow = (klass == int(REGRESSED[1:])) & (stamps >= half_ms)
            latency[slow] *= 4.0
            shifted = (klass == int(MOVED[1:])) & (rng.random(n) < 0.01)
            prefixes = [healthy[k] for k in klass.tolist()]
            for i in np.flatnonzero(shifted).tolist():
                prefixes[i] = moved
            out.write(
                "".join(
                    f'{p}"host_id":"h{h:05d}","latency_ms":{ms:.3f},"time":"{t}Z"}}\n'
                    for p, h, ms, t in zip(
                        prefixes, hosts.tolist(), latency.tolist(), times.tolist(), strict=True
                    )
                )
            )
            done += n


def _peak_rss_mb() -> float:
    """This process's own high-water mark: ``VmHWM``, not ``ru_maxrss``, which Linux carries
    over an exec from the parent (the generator's peak, reported for every phase before)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def phase_ingest(db: Path, file: Path) -> dict[str, Any]:
    from matrix.store import Store
    from matrix.telemetry.ingest import ingest_telemetry

    started = time.perf_counter()
    with Store.open(db) as store:
        report = ingest_telemetry(store, [file], now=NOW)
    wall = time.perf_counter() - started
    done = report.files[0]
    return {
        "wall_s": wall,
        "events": done.events,
        "bad": done.bad_lines,
        "status": done.status,
        "peak_rss_mb": _peak_rss_mb(),
    }


def phase_check(db: Path) -> dict[str, Any]:
    from matrix.store import Store
    from qualify.telemetry.check import check_telemetry
    from qualify.telemetry.watch import gather_aggregates
    from schemas.telemetry import CheckSettings

    cells, manifest = _fleet()
    settings = CheckSettings()
    started = time.perf_counter()
    with Store.open(db, read_only=True) as store:
        aggregates = gather_aggregates(
            store, manifest, start=NOW - timedelta(hours=24), end=NOW, settings=settings
        )
    gathered = time.perf_counter()
    check = check_telemetry(manifest, cells, aggregates, now=NOW, settings=settings)
    done = time.perf_counter()
    return {
        "wall_s": done - started,
        "query_s": gathered - started,
        "judge_s": done - gathered,
        "events": check.events,
        "alerts": sorted([a.host_class, a.kind] for a in check.alerts),
        "states": {s.host_class: s.state for s in check.classes},
        "peak_rss_mb": _peak_rss_mb(),
    }


def _run_phase(args: list[str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"phase {args[:2]} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the file and the database")
    parser.add_argument("--phase", choices=["ingest", "check"], help=argparse.SUPPRESS)
    parser.add_argument("--db", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.phase == "ingest":
        print(json.dumps(phase_ingest(args.db, args.file)))
        return 0
    if args.phase == "check":
        print(json.dumps(phase_check(args.db)))
        return 0

    work = Path(args.workdir or tempfile.mkdtemp(prefix="qualify-bench-telemetry-"))
    work.mkdir(parents=True, exist_ok=True)
    file, db = work / "telemetry.jsonl", work / "bench.duckdb"
    db.unlink(missing_ok=True)
    load_before = os.getloadavg()
    try:
        print(f"generating {args.events:,} events in {file}", file=sys.stderr)
        started = time.perf_counter()
        generate(file, args.events)
        gen_s = time.perf_counter() - started
        size_gb = file.stat().st_size / 1e9
        print(f"  {gen_s:.1f} s, {size_gb:.2f} GB; ingesting", file=sys.stderr)
        ingest = _run_phase(["--phase", "ingest", "--db", str(db), "--file", str(file)])
        print(f"  ingest {ingest['wall_s']:.1f} s; re-ingesting", file=sys.stderr)
        again = _run_phase(["--phase", "ingest", "--db", str(db), "--file", str(file)])
        db_gb = db.stat().st_size / 1e9
        print(f"  re-ingest {again['wall_s']:.1f} s; checking", file=sys.stderr)
        check = _run_phase(["--phase", "check", "--db", str(db)])
        print(f"  check {check['wall_s']:.1f} s", file=sys.stderr)
        load_after = os.getloadavg()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    expected = sorted(
        [[REGRESSED, "p99_regression"], [MOVED, "fallback_appeared"], [MOVED, "provider_changed"]]
    )
    verdict = "as injected" if check["alerts"] == expected else f"UNEXPECTED: {check['alerts']}"
    n = ingest["events"]
    print("## Telemetry: ingest and check at scale\n")
    print(
        f"Command: `python bench/telemetry.py --events {args.events}`. Machine: "
        f"{platform.machine()}, {os.cpu_count()} logical cores. A synthetic day of "
        f"`qualify-telemetry/1` events ({CLASSES} classes, {HOSTS:,} hosts, session events "
        f"with actual placement and latency), one JSON line each ({size_gb:.2f} GB). Each phase "
        "runs in its own process; peak RSS is that process's high-water mark (`VmHWM`, DuckDB "
        "included).\n"
    )
    print("| phase | wall time | rate | peak RSS |")
    print("|---|---|---|---|")
    print(
        f"| write the file (synthetic, numpy + f-strings; context only) | {gen_s:.1f} s | "
        f"{args.events / gen_s / 1e6:.2f} M lines/s | - |"
    )
    print(
        f"| `ingest` (hash, parse, validate, insert; one transaction) | {ingest['wall_s']:.1f} s "
        f"| {n / ingest['wall_s'] / 1e6:.2f} M events/s | {ingest['peak_rss_mb']:.0f} MiB |"
    )
    print(
        f"| `ingest` again (same bytes: {again['status']}, {again['events']} written) | "
        f"{again['wall_s']:.1f} s | {args.events / again['wall_s'] / 1e6:.2f} M lines/s | "
        f"{again['peak_rss_mb']:.0f} MiB |"
    )
    print(
        f"| `check`, 24 h window (queries {check['query_s']:.1f} s + judgement "
        f"{check['judge_s']:.2f} s) | {check['wall_s']:.1f} s | "
        f"{check['events'] / check['wall_s'] / 1e6:.2f} M events/s | "
        f"{check['peak_rss_mb']:.0f} MiB |"
    )
    print(
        f"\nEvents ingested: {n:,} ({ingest['bad']} bad lines); matrix file after ingest: "
        f"{db_gb:.2f} GB. Alerts raised by the check: {verdict} "
        f"({', '.join(f'{c} {k}' for c, k in check['alerts'])}); every other class `ok`. "
        f"Load average (1/5/15 min) before: {' / '.join(f'{x:.2f}' for x in load_before)}, "
        f"after: {' / '.join(f'{x:.2f}' for x in load_after)}."
    )
    return 0 if verdict == "as injected" else 1


if __name__ == "__main__":
    sys.exit(main())
