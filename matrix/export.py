"""The matrix as Parquet files: one per table and one for the ``matrix`` view, in a fixed row
order, each written atomically, the old set kept whole when a write fails.

A part of `matrix.store.Store`. Does not own the tables (``matrix.migrations``) nor the
portable run bundle (``matrix.bundle``).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import duckdb

from matrix.connected import Connected
from matrix.errors import MatrixError

__all__ = ["EXPORTED", "MATRIX_ORDER", "ParquetExport"]

EXPORTED: tuple[str, ...] = (
    "schema_migrations",
    "runs",
    "cells",
    "latency",
    "samples",
    "manifests",
    "matrix",
)
"""Tables (and the ``matrix`` view) that ``Store.export_parquet`` writes, one file each."""

MATRIX_ORDER = "hardware, runtime, provider, role, artifact_name, artifact_digest"
"""How the ``matrix`` view's rows are ordered: by key, then role (baseline first), name, digest."""

_EXPORT_ORDER: dict[str, str] = {
    "schema_migrations": "version",
    "runs": "started_at, run_id",
    "cells": "measured_at, run_id, artifact_digest",
    "latency": "run_id, artifact_digest, batch_size, concurrency, dims",
    "samples": "run_id, artifact_digest, batch_size, concurrency, dims, seq",
    "manifests": "version",
    "matrix": MATRIX_ORDER,
}


class ParquetExport(Connected):
    """Parquet export (a part of `matrix.store.Store`)."""

    def _write_parquet(self, name: str, temp: Path, final: Path) -> None:
        """One table into ``temp`` (synced), or a `MatrixError` naming ``final``."""
        from matrix.bundle import fsync_path

        try:
            self._conn.sql(f"SELECT * FROM {name} ORDER BY {_EXPORT_ORDER[name]}").write_parquet(
                str(temp), compression="zstd"
            )
            fsync_path(temp)
        except (duckdb.Error, OSError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise MatrixError(
                f"{final}: cannot write the export ({' '.join(why.split())[:300]}); no file of "
                "the export was replaced"
            ) from exc

    def export_parquet(
        self, directory: str | Path, *, tables: Sequence[str] = EXPORTED
    ) -> list[Path]:
        """Write one Parquet file per table and one for the ``matrix`` view, each atomically.

        Each file is written to a temp file beside it, fsynced and renamed over
        ``<directory>/<name>.parquet``. Rows are in a fixed order.

        Args:
            directory: Where to write; created if missing.
            tables: Which of ``EXPORTED`` to write (all by default).

        Returns:
            The written paths, in the order of ``tables``.

        Raises:
            MatrixError: A name in ``tables`` is not one of ``EXPORTED``.
        """
        from matrix.bundle import fsync_path

        unknown = [name for name in tables if name not in _EXPORT_ORDER]
        if unknown:
            raise MatrixError(f"cannot export {unknown}: choose from {list(EXPORTED)}")
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        # Every file is written to its temp first, and only then are they renamed over the old
        # ones: a disk that fills up half-way leaves the old set whole, not half replaced.
        staged: list[tuple[Path, Path]] = []
        try:
            for name in tables:
                final = out / f"{name}.parquet"
                fd, temp_name = tempfile.mkstemp(prefix=f".{name}.", suffix=".parquet.tmp", dir=out)
                os.close(fd)
                staged.append((Path(temp_name), final))
                self._write_parquet(name, Path(temp_name), final)
            for temp, final in staged:
                os.replace(temp, final)
        except BaseException:
            for temp, _ in staged:
                temp.unlink(missing_ok=True)
                (temp.parent / f"tmp_{temp.name}").unlink(missing_ok=True)  # DuckDB's own
            raise
        written = [final for _, final in staged]
        fsync_path(out)
        return written
