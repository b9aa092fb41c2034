"""Versioned schema migrations of the matrix database, recorded in ``schema_migrations``.

Owns the DDL (tables, the ``matrix`` view) and the rule for applying it: each migration runs in
its own transaction together with its ``schema_migrations`` row, in version order, once. A
database whose recorded version is newer than ``LATEST_VERSION`` is refused rather than guessed
at. Does not own connections, locking or any query over the data (``matrix.store`` does).

A new migration is appended to ``MIGRATIONS`` with the next version; applied ones never change.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import duckdb

from matrix.errors import SchemaVersionError

__all__ = [
    "LATEST_VERSION",
    "MIGRATIONS",
    "AppliedMigration",
    "Migration",
    "apply_migrations",
    "check_current",
    "current_version",
    "first_row",
    "refuse_newer",
    "rollback_quietly",
]


@dataclass(frozen=True)
class Migration:
    """One schema step: a version, a short name and the statements that make it."""

    version: int
    name: str
    statements: tuple[str, ...]


@dataclass(frozen=True)
class AppliedMigration:
    """A row of ``schema_migrations``."""

    version: int
    name: str
    applied_at: datetime


_BOOTSTRAP = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    INTEGER PRIMARY KEY,
    name       VARCHAR NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL
)
"""

_RUNS = """
CREATE TABLE runs (
    run_id            VARCHAR PRIMARY KEY,
    host_class        VARCHAR NOT NULL,
    hardware          VARCHAR NOT NULL,
    runtime           VARCHAR NOT NULL,
    provider          VARCHAR NOT NULL,
    model             VARCHAR NOT NULL,
    started_at        TIMESTAMPTZ NOT NULL,
    finished_at       TIMESTAMPTZ NOT NULL,
    emulated          BOOLEAN NOT NULL,
    mismatches        VARCHAR[] NOT NULL,
    settings_digest   VARCHAR NOT NULL,
    hostname          VARCHAR NOT NULL,
    runtime_version   VARCHAR NOT NULL,
    fingerprint       JSON NOT NULL,
    load_avg_before   DOUBLE[] NOT NULL,
    load_avg_after    DOUBLE[] NOT NULL,
    rollback_digest   VARCHAR,
    rollback_loaded   BOOLEAN,
    rollback_error    VARCHAR,
    bundle_format     VARCHAR NOT NULL,
    record            JSON NOT NULL,
    cell_count        INTEGER NOT NULL,
    sample_count      BIGINT NOT NULL,
    ingested_at       TIMESTAMPTZ NOT NULL
)
"""

_CELLS = """
CREATE TABLE cells (
    run_id             VARCHAR NOT NULL,
    artifact_digest    VARCHAR NOT NULL,
    host_class         VARCHAR NOT NULL,
    hardware           VARCHAR NOT NULL,
    runtime            VARCHAR NOT NULL,
    provider           VARCHAR NOT NULL,
    artifact_name      VARCHAR NOT NULL,
    role               VARCHAR NOT NULL,
    precision          VARCHAR NOT NULL,
    verdict            VARCHAR NOT NULL,
    reason_codes       VARCHAR[] NOT NULL,
    reasons            JSON NOT NULL,
    emulated           BOOLEAN NOT NULL,
    measured_at        TIMESTAMPTZ NOT NULL,
    settings_digest    VARCHAR NOT NULL,
    runtime_version    VARCHAR,
    cold_init_ms       DOUBLE,
    warm_init_ms       DOUBLE,
    peak_rss_mb        DOUBLE,
    expected_provider  VARCHAR,
    fallback_nodes     INTEGER,
    total_nodes        INTEGER,
    nodes_per_provider JSON,
    parity_passed      BOOLEAN,
    gate_batch_size    INTEGER,
    gate_concurrency   INTEGER,
    p50_ms             DOUBLE,
    p90_ms             DOUBLE,
    p99_ms             DOUBLE,
    p99_lower_ms       DOUBLE,
    p99_upper_ms       DOUBLE,
    p99_decision       VARCHAR,
    samples            INTEGER,
    throughput_ips     DOUBLE,
    error              VARCHAR,
    cell               JSON NOT NULL,
    PRIMARY KEY (run_id, artifact_digest)
)
"""

_LATENCY = """
CREATE TABLE latency (
    run_id          VARCHAR NOT NULL,
    artifact_digest VARCHAR NOT NULL,
    batch_size      INTEGER NOT NULL,
    concurrency     INTEGER NOT NULL,
    is_gate         BOOLEAN NOT NULL,
    samples         INTEGER NOT NULL,
    p50_ms          DOUBLE NOT NULL,
    p90_ms          DOUBLE NOT NULL,
    p99_ms          DOUBLE NOT NULL,
    max_ms          DOUBLE NOT NULL,
    mean_ms         DOUBLE NOT NULL,
    p99_lower_ms    DOUBLE,
    p99_upper_ms    DOUBLE,
    confidence      DOUBLE NOT NULL,
    decision        VARCHAR NOT NULL,
    stopped         VARCHAR NOT NULL,
    duration_s      DOUBLE NOT NULL,
    throughput_ips  DOUBLE,
    PRIMARY KEY (run_id, artifact_digest, batch_size, concurrency)
)
"""

# Raw samples carry no key constraint: an index over millions of rows would cost more at insert
# than it protects, and the run-level idempotency check already keeps a run from landing twice.
_SAMPLES = """
CREATE TABLE samples (
    run_id          VARCHAR NOT NULL,
    artifact_digest VARCHAR NOT NULL,
    batch_size      INTEGER NOT NULL,
    concurrency     INTEGER NOT NULL,
    seq             INTEGER NOT NULL,
    latency_ns      BIGINT NOT NULL
)
"""

_MANIFESTS = """
CREATE TABLE manifests (
    version    INTEGER PRIMARY KEY,
    release    VARCHAR NOT NULL,
    created    TIMESTAMPTZ NOT NULL,
    expires    TIMESTAMPTZ NOT NULL,
    document   JSON NOT NULL,
    stored_at  TIMESTAMPTZ NOT NULL
)
"""

_MATRIX_VIEW = """
CREATE VIEW matrix AS
SELECT
    hardware, runtime, provider, host_class, artifact_digest, artifact_name, role, precision,
    run_id, verdict, reason_codes, parity_passed,
    p50_ms, p90_ms, p99_ms, p99_lower_ms, p99_upper_ms, p99_decision, samples, throughput_ips,
    gate_batch_size, gate_concurrency,
    expected_provider, fallback_nodes, total_nodes, peak_rss_mb, cold_init_ms, warm_init_ms,
    emulated, measured_at, settings_digest, runtime_version
FROM (
    SELECT
        *,
        row_number() OVER (
            PARTITION BY hardware, runtime, provider, artifact_digest
            ORDER BY measured_at DESC, run_id DESC
        ) AS recency
    FROM cells
)
WHERE recency = 1
"""

# Telemetry from deployed hosts (matrix.telemetry.ingest). No key constraint on the events, as
# for raw samples: idempotency is per file prefix (telemetry_files), and an index over tens of
# millions of rows would cost more at insert than it protects. DuckDB's zone maps make the time
# filter cheap as events arrive roughly in time order.
_TELEMETRY = """
CREATE TABLE telemetry (
    time               TIMESTAMPTZ NOT NULL,
    source             VARCHAR NOT NULL,
    host_id            VARCHAR NOT NULL,
    host_class         VARCHAR NOT NULL,
    model_digest       VARCHAR,
    runtime_revision   VARCHAR NOT NULL,
    runtime_package    VARCHAR,
    providers          VARCHAR[] NOT NULL,
    placement          VARCHAR NOT NULL,
    nodes_per_provider MAP(VARCHAR, BIGINT),
    fallback_nodes     BIGINT,
    latency_ms         DOUBLE,
    manifest_version   BIGINT,
    decision           VARCHAR,
    line               BIGINT NOT NULL,
    file_sha256        VARCHAR NOT NULL
)
"""

_TELEMETRY_FILES = """
CREATE TABLE telemetry_files (
    sha256      VARCHAR PRIMARY KEY,
    path        VARCHAR NOT NULL,
    start_byte  BIGINT NOT NULL,
    end_byte    BIGINT NOT NULL,
    start_line  BIGINT NOT NULL,
    end_line    BIGINT NOT NULL,
    events      BIGINT NOT NULL,
    bad_lines   BIGINT NOT NULL,
    ingested_at TIMESTAMPTZ NOT NULL
)
"""

_LATENCY_V5 = """
CREATE TABLE latency_v5 (
    run_id          VARCHAR NOT NULL,
    artifact_digest VARCHAR NOT NULL,
    batch_size      INTEGER NOT NULL,
    concurrency     INTEGER NOT NULL,
    dims            VARCHAR NOT NULL,
    is_gate         BOOLEAN NOT NULL,
    samples         INTEGER NOT NULL,
    p50_ms          DOUBLE NOT NULL,
    p90_ms          DOUBLE NOT NULL,
    p99_ms          DOUBLE NOT NULL,
    max_ms          DOUBLE NOT NULL,
    mean_ms         DOUBLE NOT NULL,
    p99_lower_ms    DOUBLE,
    p99_upper_ms    DOUBLE,
    confidence      DOUBLE NOT NULL,
    decision        VARCHAR NOT NULL,
    stopped         VARCHAR NOT NULL,
    duration_s      DOUBLE NOT NULL,
    throughput_ips  DOUBLE,
    PRIMARY KEY (run_id, artifact_digest, batch_size, concurrency, dims)
)
"""
"""Migration 5's latency table: keyed by the swept dimensions' sizes too."""

_FLEET_GAPS = """
CREATE TABLE fleet_gaps (
    host_class VARCHAR NOT NULL,
    hardware   VARCHAR NOT NULL,
    runtime    VARCHAR NOT NULL,
    provider   VARCHAR NOT NULL,
    reason     VARCHAR NOT NULL,
    detail     VARCHAR NOT NULL,
    noted_at   TIMESTAMPTZ NOT NULL
)
"""
"""What ``qualify fleet run`` found it could not run (``unserved``: no host advertised the class),
so that coverage can say so until a cell of that key is measured after it."""

_TUNES = """
CREATE TABLE tunes (
    tune_id     VARCHAR PRIMARY KEY,
    host_class  VARCHAR NOT NULL,
    started_at  TIMESTAMPTZ NOT NULL,
    record      JSON NOT NULL
)
"""
"""What ``qualify tune`` raced (``schemas.tune.TuneRecord``): its trials are cells, kept out of
``cells`` so that no decision rests on a brief measurement without parity."""

_LINEAGE = """
CREATE TABLE lineage (
    artifact_digest     VARCHAR PRIMARY KEY,
    name                VARCHAR NOT NULL,
    precision           VARCHAR NOT NULL,
    parent_digest       VARCHAR NOT NULL,
    parent_name         VARCHAR NOT NULL,
    tool                VARCHAR NOT NULL,
    tool_version        VARCHAR NOT NULL,
    params              JSON NOT NULL,
    calibration_digest  VARCHAR,
    note                VARCHAR,
    created_at          TIMESTAMPTZ NOT NULL
)
"""
"""What ``qualify candidates`` made (``schemas.lineage.Lineage``): one row per artifact digest,
the parent it was derived from, the converter and its version, every parameter, and the
digest of the calibration data."""

_PROJECT_VIEWS = """
CREATE TABLE project_views (
    view_key    VARCHAR PRIMARY KEY,
    view        VARCHAR NOT NULL,
    recorded_at TIMESTAMPTZ NOT NULL
)
"""
"""What a writing command validated: per project file (``view_key``: the digest of its bytes
and of the view's format), the part ``matrix show`` reads (``qualify.project.view.ProjectView``),
so that showing the matrix of an unchanged project file needs neither pydantic nor YAML."""

_ROLLOUTS = """
CREATE TABLE rollouts (
    rollout_id VARCHAR NOT NULL,
    host_class VARCHAR NOT NULL,
    action     VARCHAR NOT NULL,
    version    INTEGER NOT NULL,
    step       INTEGER NOT NULL,
    percent    INTEGER NOT NULL,
    artifact   VARCHAR NOT NULL,
    actor      VARCHAR NOT NULL,
    why        VARCHAR NOT NULL,
    acted_at   TIMESTAMPTZ NOT NULL
)
"""
"""What ``qualify rollout`` did (``qualify.rollout``): one row per published step, abort or
halted advance (a halt publishes nothing: its version is the one still current)."""

_MODEL_LINE = """
CREATE TABLE model_line (
    model      VARCHAR PRIMARY KEY,
    stamped_at TIMESTAMPTZ NOT NULL
)
"""
"""The model line the matrix holds (``matrix.lines``): one row; a matrix whose earlier records
mixed lines holds a row per line and is refused until split."""

_STAMP_FROM_RECORDS = """
INSERT INTO model_line
SELECT model, now() FROM (
    SELECT model FROM runs
    UNION
    SELECT json_extract_string(document, '$.signed.model') AS model FROM manifests
) WHERE model IS NOT NULL
"""
"""A matrix from before the stamp is stamped with the lines its runs and manifests name."""

_MATRIX_VIEW_16 = _MATRIX_VIEW.replace(
    "emulated, measured_at", "emulated, isa_mismatch, numerics, numerics_cpu, measured_at"
)
_OFF_PROVIDER_NODES = "STRUCT(name VARCHAR, op_type VARCHAR, domain VARCHAR, provider VARCHAR)[]"

MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        version=1,
        name="runs, cells, latency, samples, manifests and the matrix view",
        statements=(_RUNS, _CELLS, _LATENCY, _SAMPLES, _MANIFESTS, _MATRIX_VIEW),
    ),
    Migration(
        version=2,
        name="telemetry events and the telemetry files ingested",
        statements=(_TELEMETRY, _TELEMETRY_FILES),
    ),
    Migration(
        version=3,
        name="cells.isa_mismatch (numerics from another ISA) and the matrix view showing it",
        statements=(
            "DROP VIEW matrix",
            "ALTER TABLE cells ADD COLUMN isa_mismatch VARCHAR[]",
            # Cells from before: what the cell document says (empty: it did not know).
            "UPDATE cells SET isa_mismatch = coalesce("
            "CAST(json_extract(cell, '$.isa_mismatch') AS VARCHAR[]), [])",
            _MATRIX_VIEW.replace("emulated, measured_at", "emulated, isa_mismatch, measured_at"),
        ),
    ),
    Migration(
        version=4,
        name="manifests.published_at: a version is reserved before its file is written, and "
        "readers see only published ones",
        statements=(
            "ALTER TABLE manifests ADD COLUMN published_at TIMESTAMPTZ",
            # Manifests stored before: recorded after their file was written, so published.
            "UPDATE manifests SET published_at = stored_at",
        ),
    ),
    Migration(
        version=5,
        name="latency and samples keyed by the swept dimensions' sizes too (dims, '' when none)",
        statements=(
            # A primary key cannot be altered in place: the latency table is rebuilt.
            _LATENCY_V5,
            "INSERT INTO latency_v5 BY NAME SELECT *, '' AS dims FROM latency",
            "DROP TABLE latency",
            "ALTER TABLE latency_v5 RENAME TO latency",
            "ALTER TABLE samples ADD COLUMN dims VARCHAR DEFAULT ''",
            "ALTER TABLE samples ALTER COLUMN dims SET NOT NULL",
        ),
    ),
    Migration(
        version=6,
        name="fleet_gaps: classes a fleet run found no host for, and when",
        statements=(_FLEET_GAPS,),
    ),
    Migration(
        version=7,
        name="rollouts: every staged-rollout action, the version it published, who and why",
        statements=(_ROLLOUTS,),
    ),
    Migration(
        version=8,
        name="telemetry.rollout and telemetry.cohort: which side of a staged rollout a host was on",
        statements=(
            "ALTER TABLE telemetry ADD COLUMN rollout VARCHAR",
            "ALTER TABLE telemetry ADD COLUMN cohort VARCHAR",
        ),
    ),
    Migration(
        version=9,
        name="telemetry.settings: the session settings a host's session ran with",
        statements=("ALTER TABLE telemetry ADD COLUMN settings VARCHAR",),
    ),
    Migration(
        version=10,
        name="tunes: every qualify tune, its trials as cells, apart from the decision matrix",
        statements=(_TUNES,),
    ),
    Migration(
        version=11,
        name="lineage: how each candidate qualify made was derived from its parent",
        statements=(_LINEAGE,),
    ),
    Migration(
        version=12,
        name="project_views: what matrix show reads of a project file a writer validated",
        statements=(_PROJECT_VIEWS,),
    ),
    Migration(
        version=13,
        name="manifests.pending, pending_document and discarded_at: publishing is a transaction "
        "the next command completes or discards",
        statements=(
            "ALTER TABLE manifests ADD COLUMN pending JSON",
            "ALTER TABLE manifests ADD COLUMN pending_document JSON",
            "ALTER TABLE manifests ADD COLUMN discarded_at TIMESTAMPTZ",
            # Before, a signed version recorded but never marked published was a publish that
            # failed or was killed (a draft is unsigned): it must never be published as a
            # draft, and where its file went was not recorded, so it is discarded.
            "UPDATE manifests SET discarded_at = stored_at WHERE published_at IS NULL AND "
            "json_array_length(json_extract(document, '$.signatures')) > 0",
        ),
    ),
    Migration(
        version=14,
        name="telemetry.model: the model line an event is about (one host may serve several)",
        statements=("ALTER TABLE telemetry ADD COLUMN model VARCHAR",),
    ),
    Migration(
        version=15,
        name="model_line: the one model line a matrix holds, stamped from its runs and manifests",
        statements=(_MODEL_LINE, _STAMP_FROM_RECORDS),
    ),
    Migration(
        version=16,
        name="cells.numerics and numerics_cpu (parity computed natively, on an emulated CPU of "
        "the class's ISA, or on another ISA) and the matrix view showing them",
        statements=(
            "DROP VIEW matrix",
            "ALTER TABLE cells ADD COLUMN numerics VARCHAR",
            "ALTER TABLE cells ADD COLUMN numerics_cpu VARCHAR",
            # What the cell document says; a cell from before it said: another ISA's where
            # isa_mismatch says so, else native (nothing was emulated before).
            "UPDATE cells SET numerics = coalesce(json_extract_string(cell, '$.numerics.source'), "
            "CASE WHEN len(isa_mismatch) > 0 THEN 'other_isa' ELSE 'native' END), "
            "numerics_cpu = json_extract_string(cell, '$.numerics.cpu')",
            _MATRIX_VIEW_16,
        ),
    ),
    Migration(
        version=17,
        name="cells.off_provider_nodes: the nodes (name, op type) that ran off the expected "
        "provider, the first 20, and the matrix view showing them",
        statements=(
            "DROP VIEW matrix",
            f"ALTER TABLE cells ADD COLUMN off_provider_nodes {_OFF_PROVIDER_NODES}",
            # What the cell document names; null for a cell recorded before nodes were named.
            "UPDATE cells SET off_provider_nodes = from_json(json_extract(cell, "
            '\'$.placement.off_provider_nodes\'), \'[{"name": "VARCHAR", "op_type": '
            '"VARCHAR", "domain": "VARCHAR", "provider": "VARCHAR"}]\')',
            _MATRIX_VIEW_16.replace(
                "total_nodes, peak_rss_mb", "total_nodes, off_provider_nodes, peak_rss_mb"
            ),
        ),
    ),
    Migration(
        version=18,
        name="manifests.published_by and publish_reason: who published each version and why",
        # No backfill: a version published before this records neither, and reads as null
        # ("not recorded"), never as a name or a reason made up for it.
        statements=(
            "ALTER TABLE manifests ADD COLUMN published_by VARCHAR",
            "ALTER TABLE manifests ADD COLUMN publish_reason VARCHAR",
        ),
    ),
)

LATEST_VERSION: int = MIGRATIONS[-1].version


def first_row(result: duckdb.DuckDBPyConnection) -> tuple[Any, ...] | None:
    """The first row of ``result`` (all of it read), or None when it has none."""
    # fetchall, not fetchone: DuckDB 2 keeps a half-read result open and refuses other work
    # (register, the next statement's arrow scan) on the connection until it is finished.
    rows = result.fetchall()
    return tuple(rows[0]) if rows else None


def current_version(conn: duckdb.DuckDBPyConnection) -> int:
    """The highest applied migration version, 0 for a database without ``schema_migrations``.

    Args:
        conn: An open connection.

    Returns:
        The recorded schema version.
    """
    exists = first_row(
        conn.execute(
            "SELECT count(*) FROM information_schema.tables "
            "WHERE table_schema = 'main' AND table_name = 'schema_migrations'"
        )
    )
    if exists is None or exists[0] == 0:
        return 0
    row = first_row(conn.execute("SELECT coalesce(max(version), 0) FROM schema_migrations"))
    return int(row[0]) if row is not None else 0


def refuse_newer(version: int, source: str) -> None:
    """Raise `SchemaVersionError` for a matrix a newer qualify wrote (``source`` names it)."""
    if version > LATEST_VERSION:
        raise SchemaVersionError(
            f"matrix {source} has schema version {version}, but this qualify knows versions up to "
            f"{LATEST_VERSION}: upgrade qualify to read it, or point at a matrix this version wrote",
            found=version,
            known=LATEST_VERSION,
        )


def apply_migrations(
    conn: duckdb.DuckDBPyConnection, *, source: str, now: Callable[[], datetime]
) -> list[int]:
    """Apply every migration the database lacks, all in one transaction: a database is upgraded
    whole or not at all (a failed upgrade leaves the version it had), and a new matrix is made
    with one commit rather than one per migration (each commit syncs the file: ~0.03 s of every
    fresh matrix).

    Idempotent: a database already at ``LATEST_VERSION`` is left untouched.

    Args:
        conn: A read-write connection not inside a transaction.
        source: The database path, for messages.
        now: Clock for ``applied_at`` (UTC).

    Returns:
        The versions applied by this call, in order (empty if none).

    Raises:
        SchemaVersionError: The database records a version newer than this code knows.
    """
    conn.execute(_BOOTSTRAP)
    version = current_version(conn)
    refuse_newer(version, source)
    pending = [m for m in MIGRATIONS if m.version > version]
    if not pending:
        return []
    conn.execute("BEGIN TRANSACTION")
    try:
        for migration in pending:
            for statement in migration.statements:
                conn.execute(statement)
            conn.execute(
                "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                [migration.version, migration.name, now()],
            )
        conn.execute("COMMIT")
    except BaseException:
        rollback_quietly(conn)
        raise
    return [m.version for m in pending]


def check_current(conn: duckdb.DuckDBPyConnection, *, source: str) -> None:
    """Refuse a database whose schema is not exactly ``LATEST_VERSION`` (for read-only opens).

    Args:
        conn: An open connection (read-only is fine).
        source: The database path, for messages.

    Raises:
        SchemaVersionError: The schema is newer than this code, or older and needs migrating.
    """
    version = current_version(conn)
    refuse_newer(version, source)
    if version < LATEST_VERSION:
        raise SchemaVersionError(
            f"matrix {source} has schema version {version}, this qualify needs {LATEST_VERSION}: "
            "open it once read-write (any `qualify matrix` write, or `qualify run`) to migrate it",
            found=version,
            known=LATEST_VERSION,
        )


def rollback_quietly(conn: duckdb.DuckDBPyConnection) -> None:
    """ROLLBACK the open transaction, if there still is one."""
    # A failed COMMIT has already rolled back; a second ROLLBACK would raise and mask the cause.
    with contextlib.suppress(duckdb.Error):
        conn.execute("ROLLBACK")
