"""The DuckDB matrix: migrations, writes, queries and bundle ingest. The only SQL in qualify.

Modules: ``store`` (the database), ``migrations`` (the DDL), ``bundle`` (run bundles on disk),
``ingest`` (bundles into the store), ``samples`` (the raw samples table), ``errors`` (the tree).
"""

from matrix.bundle import check_bundle, read_bundle, write_bundle
from matrix.errors import (
    BundleError,
    ManifestVersionError,
    MatrixError,
    MatrixLockedError,
    SchemaVersionError,
)
from matrix.ingest import IngestedBundle, IngestReport, ingest_bundles
from matrix.migrations import LATEST_VERSION, AppliedMigration
from matrix.samples import SAMPLES_SCHEMA, conform_samples, empty_samples
from matrix.store import EXPORTED, MEMORY, LockWait, Store

__all__ = [
    "EXPORTED",
    "LATEST_VERSION",
    "MEMORY",
    "SAMPLES_SCHEMA",
    "AppliedMigration",
    "BundleError",
    "IngestReport",
    "IngestedBundle",
    "LockWait",
    "ManifestVersionError",
    "MatrixError",
    "MatrixLockedError",
    "SchemaVersionError",
    "Store",
    "check_bundle",
    "conform_samples",
    "empty_samples",
    "ingest_bundles",
    "read_bundle",
    "write_bundle",
]
