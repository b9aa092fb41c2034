"""Scripted run bundles for the matrix tests: real schema objects with chosen numbers, no mocks.

``make_bundle`` builds a RunBundle for one class with a baseline and any candidates;
``make_samples`` builds the matching raw samples table (seeded, so reproducible).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from matrix.migrations import MIGRATIONS, Migration
from matrix.samples import SAMPLES_SCHEMA
from schemas.base import Precision, Role, Verdict
from schemas.cell import (
    Cell,
    LatencyResult,
    OutputParity,
    ParityResult,
    Placement,
    Reason,
    RollbackCheck,
    RunBundle,
    RunRecord,
)
from schemas.host import EpDevice, Fingerprint, RuntimeIdentity
from schemas.project import HostClassKey, OutputTolerance

__all__ = [
    "EPOCH",
    "KEY",
    "digest_of",
    "make_bundle",
    "make_cell",
    "make_samples",
]

EPOCH = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
KEY = HostClassKey(hardware="x86-avx512", runtime="ort-r8", provider="cpu-fp32")


def digest_of(name: str) -> str:
    """A stable fake artifact digest for a label."""
    return "sha256:" + hashlib.sha256(name.encode()).hexdigest()


def _fingerprint() -> Fingerprint:
    return Fingerprint(
        hostname="bench-01",
        arch="x86_64",
        cpu_model="Test CPU @ 3.0GHz",
        cpu_flags=["avx2", "avx512_vnni", "sse4_2"],
        cores=2,
        affinity=[0, 1],
        memory_mb=8192,
        os="Linux 6.8",
        python="3.11.7",
        runtime=RuntimeIdentity(
            package="onnxruntime",
            version="1.32.0",
            build_info="ORT Build Info: test",
            available_providers=["CPUExecutionProvider"],
            ep_devices=[EpDevice(ep_name="CPUExecutionProvider", device_type="CPU")],
        ),
    )


def _latency(batch_size: int, concurrency: int, p99_ms: float, samples: int) -> LatencyResult:
    return LatencyResult(
        batch_size=batch_size,
        concurrency=concurrency,
        samples=samples,
        p50_ms=p99_ms * 0.6,
        p90_ms=p99_ms * 0.8,
        p99_ms=p99_ms,
        max_ms=p99_ms * 1.3,
        mean_ms=p99_ms * 0.62,
        p99_lower_ms=p99_ms * 0.95,
        p99_upper_ms=p99_ms * 1.05 + concurrency,
        confidence=0.99,
        decision="pass",
        stopped="decided",
        duration_s=1.25,
        throughput_ips=1000.0 / (p99_ms * 0.6) * concurrency,
    )


def make_cell(
    *,
    run_id: str,
    name: str,
    role: Role = "candidate",
    precision: Precision = "int8",
    verdict: Verdict = "pass",
    measured_at: datetime = EPOCH,
    key: HostClassKey = KEY,
    host_class: str = "x86-fast",
    p99_ms: float = 10.0,
    samples: int = 8,
    configs: tuple[tuple[int, int], ...] = ((1, 1), (1, 2)),
    fallback_nodes: int = 0,
    emulated: bool = False,
) -> Cell:
    """One scripted cell; an ``error`` verdict has no placement, latency or parity."""
    digest = digest_of(name)
    errored = verdict == "error"
    reasons = (
        [Reason(code="load_failed", message="the runtime refused the model")] if errored else []
    )
    if verdict == "fail":
        reasons = [Reason(code="p99_over_budget", message=f"p99 lower bound {p99_ms} ms > budget")]
    tolerance = OutputTolerance(max_abs=0.05, cosine_min=0.99)
    parity = (
        None
        if role == "baseline" or errored
        else ParityResult(
            reference_digest=digest_of("baseline"),
            samples=16,
            passed=verdict != "fail",
            outputs=[
                OutputParity(
                    name="logits",
                    max_abs=0.01,
                    mean_abs=0.002,
                    max_rel=0.03,
                    cosine_min=0.9995,
                    top1_agreement=1.0,
                    tolerance=tolerance,
                    passed=verdict != "fail",
                    min_passing=OutputTolerance(max_abs=0.01, cosine_min=0.9995),
                )
            ],
        )
    )
    return Cell(
        run_id=run_id,
        host_class=host_class,
        key=key,
        artifact_digest=digest,
        artifact_name=name,
        role=role,
        precision=precision,
        verdict=verdict,
        reasons=reasons,
        emulated=emulated,
        measured_at=measured_at,
        settings_digest="sha256:" + "ab" * 32,
        runtime_version=None if errored else "1.32.0",
        cold_init_ms=None if errored else 120.5,
        warm_init_ms=None if errored else 40.25,
        peak_rss_mb=None if errored else 210.0,
        placement=None
        if errored
        else Placement(
            nodes_per_provider={"CPUExecutionProvider": 12 - fallback_nodes}
            | ({"CUDAExecutionProvider": fallback_nodes} if fallback_nodes else {}),
            total_nodes=12,
            expected_provider="CPUExecutionProvider",
            fallback_nodes=fallback_nodes,
            session_providers=["CPUExecutionProvider"],
            warnings=[],
        ),
        latency=[]
        if errored
        else [_latency(b, c, p99_ms + i, samples) for i, (b, c) in enumerate(configs)],
        parity=parity,
        error="InvalidProtobuf: failed to parse" if errored else None,
    )


def make_bundle(
    run_id: str,
    *,
    candidates: tuple[str, ...] = ("int8",),
    measured_at: datetime = EPOCH,
    key: HostClassKey = KEY,
    host_class: str = "x86-fast",
    p99_ms: float = 10.0,
    samples: int = 8,
    verdicts: dict[str, Verdict] | None = None,
    emulated: bool = False,
) -> RunBundle:
    """A run with a baseline cell plus one candidate cell per name in ``candidates``."""
    verdicts = verdicts or {}
    cells = [
        make_cell(
            run_id=run_id,
            name="baseline",
            role="baseline",
            precision="fp32",
            measured_at=measured_at,
            key=key,
            host_class=host_class,
            p99_ms=p99_ms * 1.5,
            samples=samples,
            emulated=emulated,
        )
    ] + [
        make_cell(
            run_id=run_id,
            name=name,
            measured_at=measured_at + timedelta(seconds=i + 1),
            key=key,
            host_class=host_class,
            p99_ms=p99_ms,
            samples=samples,
            verdict=verdicts.get(name, "pass"),
            emulated=emulated,
        )
        for i, name in enumerate(candidates)
    ]
    run = RunRecord(
        run_id=run_id,
        host_class=host_class,
        key=key,
        model="ocr-rec",
        started_at=measured_at - timedelta(minutes=5),
        finished_at=measured_at + timedelta(minutes=1),
        emulated=emulated,
        mismatches=["cpu_flags: avx512_vnni missing"] if emulated else [],
        settings_digest="sha256:" + "ab" * 32,
        fingerprint=_fingerprint(),
        load_avg_before=[0.5, 0.4, 0.3],
        load_avg_after=[1.5, 0.7, 0.35],
        rollback=RollbackCheck(artifact_digest=digest_of("baseline"), loaded=True),
    )
    return RunBundle(run=run, cells=cells)


def make_samples(bundle: RunBundle, *, seed: int = 0) -> pa.Table:
    """Raw samples matching every latency result of every cell (``samples`` rows per config)."""
    rng = np.random.default_rng(seed)
    digests: list[str] = []
    batch: list[int] = []
    concurrency: list[int] = []
    dims: list[str] = []
    seq: list[int] = []
    latency: list[int] = []
    for cell in bundle.cells:
        for result in cell.latency:
            count = result.samples
            digests += [cell.artifact_digest] * count
            batch += [result.batch_size] * count
            concurrency += [result.concurrency] * count
            dims += [result.config.dims] * count
            seq += list(range(count))
            latency += rng.integers(5_000_000, 15_000_000, size=count).tolist()
    return pa.Table.from_pydict(
        {
            "artifact_digest": digests,
            "batch_size": batch,
            "concurrency": concurrency,
            "dims": dims,
            "seq": seq,
            "latency_ns": latency,
        },
        schema=SAMPLES_SCHEMA,
    )


def older_matrix(path: Path, migrations: Sequence[Migration]) -> duckdb.DuckDBPyConnection:
    """A matrix file at ``path`` as an older qualify left it: the schema of ``migrations`` only,
    each recorded as applied. Returns the open connection, for the caller's rows (close it)."""
    conn = duckdb.connect(str(path))
    conn.execute(
        "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, "
        "applied_at TIMESTAMPTZ NOT NULL)"
    )
    for migration in migrations:
        for statement in migration.statements:
            conn.execute(statement)
        conn.execute(
            "INSERT INTO schema_migrations VALUES (?, ?, ?)",
            [migration.version, migration.name, _APPLIED],
        )
    return conn


def before(name: str) -> Sequence[Migration]:
    """The migrations before the one whose name starts with ``name`` (found by name: another
    migration may land before it)."""
    upto = next(i for i, m in enumerate(MIGRATIONS) if m.name.startswith(name))
    return MIGRATIONS[:upto]


_APPLIED = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
