"""Whole tables of the matrix for analysis, as Arrow tables: raw samples with their cell's names,
telemetry events, and the stored manifest documents.

Owns these read queries only. Does not own the typed reads of cells and runs (`Store.cells`,
`Store.runs`), the frames an analyst gets (``qualify.reader`` makes pandas DataFrames of these
tables) or any write. Every function takes an open `Store` (read-only is enough) and returns rows
in a fixed order, so that two reads of an unchanged matrix are equal.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

    from matrix.store import Store

__all__ = ["manifest_documents", "raw_samples", "telemetry_events"]


def raw_samples(
    store: Store,
    *,
    run_id: str | None = None,
    artifact: str | None = None,
    host_class: str | None = None,
) -> pa.Table:
    """Every timed inference of the matching cells, one row each.

    Args:
        store: The matrix.
        run_id: Only this run's samples; None for every run.
        artifact: Only this artifact's, by label or ``sha256:`` digest; None for all.
        host_class: Only cells measured under this class name; None for all.

    Returns:
        Columns run_id, host_class, artifact_name, artifact_digest, batch_size, concurrency,
        dims (``""`` when no dimension is swept), seq, latency_ms (float64) and latency_ns
        (int64), ordered by run, artifact, config and sequence.
    """
    return store.connection.sql(
        "SELECT s.run_id, c.host_class, c.artifact_name, s.artifact_digest, s.batch_size, "
        "s.concurrency, s.dims, s.seq, s.latency_ns / 1e6 AS latency_ms, s.latency_ns "
        "FROM samples AS s JOIN cells AS c USING (run_id, artifact_digest) "
        "WHERE ($run_id IS NULL OR s.run_id = $run_id) "
        "AND ($artifact IS NULL OR s.artifact_digest = $artifact OR c.artifact_name = $artifact) "
        "AND ($host_class IS NULL OR c.host_class = $host_class) "
        "ORDER BY s.run_id, c.artifact_name, s.artifact_digest, s.batch_size, s.concurrency, "
        "s.dims, s.seq",
        params={"run_id": run_id, "artifact": artifact, "host_class": host_class},
    ).to_arrow_table()


def telemetry_events(
    store: Store,
    *,
    host_class: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> pa.Table:
    """The telemetry events hosts sent (``qualify telemetry ingest``), one row each.

    Args:
        store: The matrix.
        host_class: Only events of this class; None for all.
        since: Only events at or after this time (aware; naive is taken as UTC); None for all.
        until: Only events before this time; None for all.

    Returns:
        Columns time, host_id, host_class, model (the model line; null when the host did not
        say), model_digest, runtime_revision, runtime_package,
        providers (list of strings), placement, nodes_per_provider (map of string to int64),
        fallback_nodes, latency_ms, manifest_version, decision, rollout, cohort, settings,
        source (``resolve`` or ``session``) and line (in the file it was ingested from),
        ordered by time, source and line.
    """
    return store.connection.sql(
        "SELECT time, host_id, host_class, model, model_digest, runtime_revision, "
        "runtime_package, "
        "providers, placement, nodes_per_provider, fallback_nodes, latency_ms, "
        "manifest_version, decision, rollout, cohort, settings, source, line FROM telemetry "
        "WHERE ($host_class IS NULL OR host_class = $host_class) "
        "AND ($since IS NULL OR time >= $since) AND ($until IS NULL OR time < $until) "
        "ORDER BY time, source, line",
        params={"host_class": host_class, "since": since, "until": until},
    ).to_arrow_table()


def manifest_documents(store: Store) -> list[tuple[int, str, datetime | None, str]]:
    """Every recorded manifest version, oldest first.

    Returns:
        (version, state, published_at or None, the document as stored: canonical JSON of the
        envelope, with no signature for a draft). The state is `Store.manifest_state`'s:
        ``draft``, ``publishing`` (begun, neither finished nor discarded), ``published`` or
        ``discarded``.
    """
    rows = store.connection.execute(
        "SELECT version, CASE WHEN published_at IS NOT NULL THEN 'published' "
        "WHEN discarded_at IS NOT NULL THEN 'discarded' WHEN pending IS NOT NULL THEN "
        "'publishing' ELSE 'draft' END, published_at, document FROM manifests ORDER BY version"
    ).fetchall()
    return [(int(v), str(state), at, str(doc)) for v, state, at, doc in rows]
