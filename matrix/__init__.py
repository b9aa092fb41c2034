"""The DuckDB matrix: migrations, writes, queries and bundle ingest. The only SQL in qualify.

Modules: ``store`` (the database; its parts ``releases``, ``annotations`` and ``export``, over
``connected``, with ``lock`` and ``rows``), ``migrations`` (the DDL), ``publications`` (the
publish journal), ``bundle`` (run bundles on disk), ``ingest`` (bundles into the store),
``lines`` (model lines), ``samples`` (the raw samples table), ``tables`` (whole tables read for
analysis), ``telemetry/`` (host events: their ingest and queries), ``errors`` (the tree).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from schemas.lazy import attribute

if TYPE_CHECKING:
    from matrix.bundle import check_bundle, read_bundle, write_bundle
    from matrix.errors import (
        BundleError,
        ManifestVersionError,
        MatrixError,
        MatrixLockedError,
        SchemaVersionError,
    )
    from matrix.export import EXPORTED
    from matrix.ingest import IngestedBundle, IngestReport, ingest_bundles
    from matrix.lock import LockWait
    from matrix.migrations import LATEST_VERSION, AppliedMigration
    from matrix.samples import SAMPLES_SCHEMA, conform_samples, empty_samples
    from matrix.store import MEMORY, Store

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

_WHERE = {
    "AppliedMigration": "matrix.migrations",
    "BundleError": "matrix.errors",
    "EXPORTED": "matrix.export",
    "IngestReport": "matrix.ingest",
    "IngestedBundle": "matrix.ingest",
    "LATEST_VERSION": "matrix.migrations",
    "LockWait": "matrix.lock",
    "MEMORY": "matrix.store",
    "ManifestVersionError": "matrix.errors",
    "MatrixError": "matrix.errors",
    "MatrixLockedError": "matrix.errors",
    "SAMPLES_SCHEMA": "matrix.samples",
    "SchemaVersionError": "matrix.errors",
    "Store": "matrix.store",
    "check_bundle": "matrix.bundle",
    "conform_samples": "matrix.samples",
    "empty_samples": "matrix.samples",
    "ingest_bundles": "matrix.ingest",
    "read_bundle": "matrix.bundle",
    "write_bundle": "matrix.bundle",
}
"""Where each public name lives: imported on first use, so that one light module of
the package does not pull in its heavy siblings (pyarrow, Jinja2)."""


def __getattr__(name: str) -> Any:
    return attribute(globals(), _WHERE, name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
