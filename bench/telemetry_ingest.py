"""Benchmark: ``qualify telemetry ingest`` against DuckDB's own ``read_json`` on the same file.

Writes one synthetic JSON-lines file of ``--events`` events (``bench/telemetry.py``'s
generator, deterministic), then measures, interleaved in the same run and each in a fresh
subprocess with a fresh DuckDB file:

* qualify: ``qualify.telemetry.watch.ingest_files`` (what ``qualify telemetry ingest FILE`` calls:
  hash, strict checks, bad lines by number, one transaction);
* reference: ``CREATE TABLE t AS SELECT * FROM read_json(path, format='newline_delimited')``,
  no checks at all.

Wall time is measured around the subprocess (interpreter start and imports included, as a user
of the command sees it); CPU time is the subprocess's user + system time over all its threads
(steadier than wall time on a shared machine; the reference parses on every core); peak memory
is the subprocess's own high-water mark (``VmHWM``; ``ru_maxrss`` where there is no ``/proc``).
Reports the medians and the ratios qualify / reference, with the load average. Prints one
markdown section.

Usage::

    .venv/bin/python bench/telemetry_ingest.py [--events 200000] [--workdir DIR] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.telemetry import generate  # noqa: E402

_QUALIFY = """
import sys
from datetime import UTC, datetime
from pathlib import Path
from qualify.telemetry.watch import ingest_files
report = ingest_files(Path(sys.argv[1]), [Path(sys.argv[2])], now=datetime.now(UTC))
print(report.events, report.bad_lines)
"""

_REFERENCE = """
import sys
import duckdb
conn = duckdb.connect(sys.argv[1])
conn.execute(
    "CREATE TABLE t AS SELECT * FROM read_json(?, format='newline_delimited')", [sys.argv[2]]
)
print(conn.execute("SELECT count(*) FROM t").fetchall()[0][0], 0)
conn.close()
"""

_WRAP = """
import resource, sys
exec(compile(sys.argv.pop(1), "<bench>", "exec"))
# VmHWM, not ru_maxrss: a forked child's ru_maxrss starts at its parent's (the generator's).
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")]
peak = int(hwm[0].split()[1]) if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print("PEAK", peak, file=sys.stderr)
"""


def _run(code: str, db: Path, file: Path) -> dict[str, Any]:
    """One measured run in a fresh process and a fresh database file."""
    for leftover in (db, db.with_name(db.name + ".wal")):
        leftover.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", _WRAP, code, str(db), str(file)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        check=False,
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if out.returncode != 0:
        raise SystemExit(f"run failed ({out.returncode}):\n{out.stderr[-3000:]}")
    peak_kib = int(out.stderr.strip().splitlines()[-1].split()[1])
    events, bad = (int(x) for x in out.stdout.split())
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "peak_mib": peak_kib / 1024.0,
        "events": events,
        "bad": bad,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="qualify-bench-ingest-"))
    work.mkdir(parents=True, exist_ok=True)
    file = work / f"telemetry-{args.events}.jsonl"
    load_before = os.getloadavg()
    try:
        if not file.exists():
            print(f"generating {args.events:,} events in {file}", file=sys.stderr)
            generate(file, args.events)
        size_gb = file.stat().st_size / 1e9
        ours: list[dict[str, Any]] = []
        ref: list[dict[str, Any]] = []
        for i in range(args.repeats):
            # Interleaved, alternating which goes first, so drift in load hits both alike.
            pair = [("ours", _QUALIFY), ("ref", _REFERENCE)]
            for name, code in pair if i % 2 == 0 else pair[::-1]:
                result = _run(code, work / f"{name}.duckdb", file)
                (ours if name == "ours" else ref).append(result)
                print(f"  {name}: {result}", file=sys.stderr)
    finally:
        for name in ("ours", "ref"):
            for leftover in work.glob(f"{name}.duckdb*"):
                leftover.unlink(missing_ok=True)
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    load_after = os.getloadavg()
    if any(r["events"] != args.events for r in ours + ref):
        raise SystemExit(f"event counts differ: {[r['events'] for r in ours + ref]}")

    def median(runs: list[dict[str, Any]], key: str) -> float:
        return float(statistics.median(r[key] for r in runs))

    t_ours, t_ref = median(ours, "wall_s"), median(ref, "wall_s")
    c_ours, c_ref = median(ours, "cpu_s"), median(ref, "cpu_s")
    m_ours, m_ref = median(ours, "peak_mib"), median(ref, "peak_mib")
    command = f"python bench/telemetry_ingest.py --events {args.events} --repeats {args.repeats}"
    print("## Telemetry ingest against DuckDB's read_json\n")
    print(
        f"Command: `{command}`. {args.events:,} synthetic `qualify-telemetry/1` events "
        f"({size_gb:.2f} GB of JSON lines); each run in a fresh process and a fresh DuckDB "
        f"file, the two interleaved, medians of {args.repeats}. The reference has no checks, no "
        "line numbers and no idempotency record: it is the floor, not a competitor.\n"
    )
    print(
        "| path | wall time | CPU time | peak RSS | time ratio | CPU ratio | memory ratio "
        "| load average |"
    )
    print("|---|---|---|---|---|---|---|---|")
    load = f"{load_before[0]:.2f} before, {load_after[0]:.2f} after"
    print(
        f"| `qualify telemetry ingest` (`ingest_files`) | {t_ours:.2f} s | {c_ours:.2f} s "
        f"| {m_ours:.0f} MiB | {t_ours / t_ref:.2f}x | {c_ours / c_ref:.2f}x "
        f"| {m_ours / m_ref:.2f}x | {load} |"
    )
    print(
        f"| reference: DuckDB `CREATE TABLE t AS SELECT * FROM read_json(...)` | {t_ref:.2f} s "
        f"| {c_ref:.2f} s | {m_ref:.0f} MiB | 1.00x | 1.00x | 1.00x | {load} |"
    )
    print(
        "\nTargets (issue 15): time ratio at most 2x, memory ratio at most 1.5x; at small files "
        "the block buffers weigh more against the reference's, so the memory ratio is highest "
        "there.\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
