"""What every part of the matrix store shares: the open connection, its path, mode and clock.

`matrix.store.Store` is made of parts by what they record (runs and cells in ``store``,
releases in ``releases``, annotations in ``annotations``) and Parquet export (``export``); each
part is a `Connected`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import duckdb

from matrix.errors import MatrixError

__all__ = ["Connected"]


class Connected:
    """An open, migrated DuckDB connection to a matrix file (use ``Store.open``)."""

    def __init__(
        self,
        conn: duckdb.DuckDBPyConnection,
        *,
        path: str,
        read_only: bool,
        clock: Callable[[], datetime],
    ) -> None:
        """Wrap an already configured and migrated connection (use ``Store.open`` instead)."""
        self._conn = conn
        self._path = path
        self._read_only = read_only
        self._clock = clock
        self._closed = False

    @property
    def path(self) -> str:
        """The database path as opened (``":memory:"`` for an in-memory store)."""
        return self._path

    @property
    def connection(self) -> duckdb.DuckDBPyConnection:
        """The DuckDB connection, for the other modules of ``matrix`` (never used outside it).

        Use it from the thread that owns the store, and finish every result (``fetchall``)
        before the next statement.
        """
        return self._conn

    @property
    def read_only(self) -> bool:
        """Whether the store was opened read-only."""
        return self._read_only

    def now(self) -> datetime:
        """The store's clock (what it stamps rows with), for the other modules of ``matrix``."""
        return self._clock()

    def _require_writable(self, what: str) -> None:
        if self._read_only:
            raise MatrixError(f"cannot {what}: matrix {self._path} was opened read-only")
