"""Benchmark: the matrix's single writer, ingesting run bundles as a fleet run brings them back.

Measures, on this machine and in this run: ``Store.write_run`` of ``--runs`` runs (two cells,
one latency config of 700 raw samples each, the shape of a demo run) into a fresh DuckDB file,
one transaction per run as ``qualify fleet run`` and ``qualify matrix ingest`` do; and, side by
side as the reference, DuckDB inserting the same rows with no checks (one ``INSERT ... SELECT``
of the samples per run). Reports runs/s and samples/s of each, their ratio, and the file's bytes
per run. Prints one markdown section on stdout (``docs/scale.md`` reads its numbers).

Usage::

    .venv/bin/python bench/ingest.py [--runs 300]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._synthetic import project_of, scripted_run  # noqa: E402
from matrix.samples import SAMPLES_SCHEMA  # noqa: E402
from matrix.store import Store  # noqa: E402
from schemas.cell import RunBundle  # noqa: E402

WHEN = datetime(2025, 6, 2, tzinfo=UTC)


def _bundles(runs: int) -> list[tuple[RunBundle, pa.Table]]:
    project = project_of(
        {
            f"c{k}": {
                "key": {"hardware": f"hw{k}", "runtime": "ort-1.32", "provider": "cpu"},
                "match": {"arch": "x86_64"},
                "budgets": {"p99_ms": 80.0},
            }
            for k in range(runs)
        }
    )
    rng = np.random.default_rng(0)
    made = []
    for k, (name, cls) in enumerate(project.host_classes.items()):
        run, cells = scripted_run(name, cls, run_id=f"run-{k:06d}", when=WHEN + timedelta(k))
        parts = []
        for cell in cells:
            for result in cell.latency:
                n = result.samples
                parts.append(
                    pa.table(
                        [
                            pa.repeat(pa.scalar(cell.artifact_digest), n),
                            pa.array(np.full(n, result.batch_size, np.int32)),
                            pa.array(np.full(n, result.concurrency, np.int32)),
                            pa.repeat(pa.scalar(""), n),
                            pa.array(np.arange(n, dtype=np.int32)),
                            pa.array(rng.integers(1_000_000, 40_000_000, n, dtype=np.int64)),
                        ],
                        schema=SAMPLES_SCHEMA,
                    )
                )
        made.append((RunBundle(run=run, cells=cells), pa.concat_tables(parts)))
    return made


def _reference(path: Path, bundles: list[tuple[RunBundle, pa.Table]]) -> float:
    conn = duckdb.connect(str(path))
    conn.execute(
        "CREATE TABLE samples (run_id VARCHAR, artifact_digest VARCHAR, batch_size INTEGER, "
        "concurrency INTEGER, dims VARCHAR, seq INTEGER, latency_ns BIGINT)"
    )
    started = time.perf_counter()
    for bundle, samples in bundles:
        conn.register("incoming", samples)
        conn.execute("BEGIN TRANSACTION")
        conn.execute(
            "INSERT INTO samples SELECT $run_id, * FROM incoming", {"run_id": bundle.run.run_id}
        )
        conn.execute("COMMIT")
        conn.unregister("incoming")
    spent = time.perf_counter() - started
    conn.close()
    return spent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args(argv)
    bundles = _bundles(args.runs)
    samples = sum(t.num_rows for _, t in bundles)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "m.duckdb"
        with Store.open(db) as store:
            started = time.perf_counter()
            for bundle, table in bundles:
                store.write_run(bundle, table)
            spent = time.perf_counter() - started
            again = time.perf_counter()
            written = sum(store.write_run(b, t) for b, t in bundles[:50])
            again_s = time.perf_counter() - again
        size = db.stat().st_size
        reference = _reference(Path(tmp) / "ref.duckdb", bundles)
    load_after = os.getloadavg()
    print("## Matrix ingest: the single writer")
    print()
    print(
        f"Command: `python bench/ingest.py --runs {args.runs}`; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} logical CPUs, Python {platform.python_version()}, DuckDB "
        f"{duckdb.__version__}; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after"
    )
    print()
    print("| path | runs | samples | time | runs/s | samples/s | vs reference |")
    print("|---|---|---|---|---|---|---|")
    print(
        f"| `Store.write_run` (checks, runs + cells + latency + samples, one transaction each) "
        f"| {args.runs:,} | {samples:,} | {spent:.2f} s | {args.runs / spent:,.0f} | "
        f"{samples / spent:,.0f} | {spent / reference:.2f}x |"
    )
    print(
        f"| reference: DuckDB `INSERT ... SELECT` of the samples alone, one transaction each "
        f"| {args.runs:,} | {samples:,} | {reference:.2f} s | {args.runs / reference:,.0f} | "
        f"{samples / reference:,.0f} | 1.00x |"
    )
    print()
    print(
        f"Matrix file after ingest: {size / args.runs / 1024:,.1f} KiB per run "
        f"({size / 2**20:,.1f} MiB). Re-writing 50 runs already present wrote {written} "
        f"(idempotent by run id) in {again_s:.2f} s."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
