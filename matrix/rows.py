"""A run's records as table rows: the columns of ``runs``, ``cells`` and ``latency`` that
`matrix.store.Store.write_run` inserts, and the insert itself.

Pure but for `insert_rows`, which runs inside the caller's transaction. Does not own the
transaction, the raw samples (they go in through Arrow, ``matrix.samples``) nor the DDL
(``matrix.migrations``).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

import duckdb

if TYPE_CHECKING:
    from schemas.cell import Cell, RunBundle

__all__ = ["cell_row", "insert_rows", "latency_rows", "run_row"]


def run_row(bundle: RunBundle, sample_count: int, ingested_at: datetime) -> dict[str, Any]:
    run = bundle.run
    rollback = run.rollback
    row: dict[str, Any] = {
        "run_id": run.run_id,
        "host_class": run.host_class,
        "hardware": run.key.hardware,
        "runtime": run.key.runtime,
        "provider": run.key.provider,
        "model": run.model,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "emulated": run.emulated,
        "mismatches": list(run.mismatches),
        "settings_digest": run.settings_digest,
        "hostname": run.fingerprint.hostname,
        "runtime_version": run.fingerprint.runtime.version,
        "fingerprint": run.fingerprint.model_dump_json(),
        "load_avg_before": list(run.load_avg_before),
        "load_avg_after": list(run.load_avg_after),
        "rollback_digest": rollback.artifact_digest if rollback else None,
        "rollback_loaded": rollback.loaded if rollback else None,
        "rollback_error": rollback.error if rollback else None,
        "bundle_format": bundle.format,
        "record": run.model_dump_json(),
        "cell_count": len(bundle.cells),
        "sample_count": sample_count,
        "ingested_at": ingested_at,
    }
    return row


def cell_row(cell: Cell) -> dict[str, Any]:
    gate = cell.gate_latency
    placement = cell.placement
    return {
        "run_id": cell.run_id,
        "artifact_digest": cell.artifact_digest,
        "host_class": cell.host_class,
        "hardware": cell.key.hardware,
        "runtime": cell.key.runtime,
        "provider": cell.key.provider,
        "artifact_name": cell.artifact_name,
        "role": cell.role,
        "precision": cell.precision,
        "verdict": cell.verdict,
        "reason_codes": [reason.code for reason in cell.reasons],
        "reasons": json.dumps([reason.model_dump(mode="json") for reason in cell.reasons]),
        "emulated": cell.emulated,
        "measured_at": cell.measured_at,
        "settings_digest": cell.settings_digest,
        "runtime_version": cell.runtime_version,
        "cold_init_ms": cell.cold_init_ms,
        "warm_init_ms": cell.warm_init_ms,
        "peak_rss_mb": cell.peak_rss_mb,
        "expected_provider": placement.expected_provider if placement else None,
        "fallback_nodes": placement.fallback_nodes if placement else None,
        "total_nodes": placement.total_nodes if placement else None,
        "nodes_per_provider": (
            json.dumps(placement.nodes_per_provider, sort_keys=True) if placement else None
        ),
        "off_provider_nodes": _off_provider_nodes(cell),
        "parity_passed": cell.parity.passed if cell.parity else None,
        "gate_batch_size": gate.batch_size if gate else None,
        "gate_concurrency": gate.concurrency if gate else None,
        "p50_ms": gate.p50_ms if gate else None,
        "p90_ms": gate.p90_ms if gate else None,
        "p99_ms": gate.p99_ms if gate else None,
        "p99_lower_ms": gate.p99_lower_ms if gate else None,
        "p99_upper_ms": gate.p99_upper_ms if gate else None,
        "p99_decision": gate.decision if gate else None,
        "samples": gate.samples if gate else None,
        "throughput_ips": gate.throughput_ips if gate else None,
        "error": cell.error,
        "cell": cell.model_dump_json(),
        "isa_mismatch": list(cell.isa_mismatch),
        **_numerics_columns(cell),
    }


def _off_provider_nodes(cell: Cell) -> list[dict[str, str]] | None:
    """The nodes that ran off the expected provider, as the column holds them; None where
    the cell does not name them."""
    nodes = cell.placement.off_provider_nodes if cell.placement is not None else None
    return None if nodes is None else [n.model_dump() for n in nodes]


def _numerics_columns(cell: Cell) -> dict[str, str | None]:
    """How the cell's parity outputs were computed (`schemas.cell.Cell.numerics_source`)."""
    return {
        "numerics": cell.numerics_source,
        "numerics_cpu": cell.numerics.cpu if cell.numerics is not None else None,
    }


def latency_rows(cell: Cell) -> list[dict[str, Any]]:
    from schemas.cell import dims_text

    gate = cell.gate_latency
    gate_config = gate.config if gate else None
    return [
        {
            "run_id": cell.run_id,
            "artifact_digest": cell.artifact_digest,
            "batch_size": result.batch_size,
            "concurrency": result.concurrency,
            "dims": dims_text(result.dims),
            "is_gate": result.config == gate_config,
            "samples": result.samples,
            "p50_ms": result.p50_ms,
            "p90_ms": result.p90_ms,
            "p99_ms": result.p99_ms,
            "max_ms": result.max_ms,
            "mean_ms": result.mean_ms,
            "p99_lower_ms": result.p99_lower_ms,
            "p99_upper_ms": result.p99_upper_ms,
            "confidence": result.confidence,
            "decision": result.decision,
            "stopped": result.stopped,
            "duration_s": result.duration_s,
            "throughput_ips": result.throughput_ips,
        }
        for result in cell.latency
    ]


def insert_rows(conn: duckdb.DuckDBPyConnection, table: str, rows: list[dict[str, Any]]) -> None:
    """``rows`` (dicts with the same keys: the table's column names) into ``table``."""
    if not rows:
        return
    columns = list(rows[0])
    names = ", ".join(f'"{c}"' for c in columns)
    marks = ", ".join("?" for _ in columns)
    conn.executemany(
        f"INSERT INTO {table} ({names}) VALUES ({marks})",
        [[row[c] for c in columns] for row in rows],
    )
