"""The matrix store: one DuckDB file holding runs, cells, latency, raw samples and manifests.

Owns the connection (opening it, waiting politely for another process's file lock, migrating),
writing a run in one transaction, the queries over runs and cells, Parquet export and the
snapshot id a manifest cites. Its parts record releases (``matrix.releases``) and annotations
(``matrix.annotations``). Only the ``matrix`` package holds SQL (``matrix.migrations`` the DDL).

Does not own the decision policy, manifest building or signing (``manifest``), bundle files
(``matrix.bundle``) or what to print (callers pass ``on_wait``).

DuckDB lets one process write a database file at a time. Callers keep a store open briefly
(open, write, close), so concurrent ``qualify run`` processes serialise on ``Store.open``::

    with Store.open(path) as store:
        store.write_run(bundle, samples)
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

import duckdb

from matrix import lines
from matrix.annotations import Annotations
from matrix.errors import MatrixError, MatrixLockedError
from matrix.migrations import (
    AppliedMigration,
    _first,
    _refuse_newer,
    _rollback_quietly,
    apply_migrations,
    check_current,
    current_version,
)
from matrix.releases import ReleaseRecords
from schemas.atomic import read_bounded

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import pyarrow as pa

    from schemas.cell import Cell, LatencyConfig, RunBundle, RunRecord

__all__ = ["EXPORTED", "MEMORY", "LockWait", "Store"]

MEMORY = ":memory:"
"""Path that opens a private in-memory database (tests, dry runs)."""

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

_MATRIX_ORDER = "hardware, runtime, provider, role, artifact_name, artifact_digest"

_EXPORT_ORDER: dict[str, str] = {
    "schema_migrations": "version",
    "runs": "started_at, run_id",
    "cells": "measured_at, run_id, artifact_digest",
    "latency": "run_id, artifact_digest, batch_size, concurrency, dims",
    "samples": "run_id, artifact_digest, batch_size, concurrency, dims, seq",
    "manifests": "version",
    "matrix": _MATRIX_ORDER,
}

_LOCK_MARK = "Could not set lock on file"
_ANNOUNCE_EVERY_S = 10.0
"""A wait for the file lock is said when it starts, when the holder changes, and this often."""
_PID_RE = re.compile(r"PID (\d+)")
_DUCKDB_MAGIC_START, _DUCKDB_MAGIC_END = 8, 12
"""Where a DuckDB file's header says ``DUCK``."""
_FIRST_DELAY_S = 0.05
_MAX_DELAY_S = 1.0
_T = TypeVar("_T")


@dataclass(frozen=True)
class LockWait:
    """Handed to ``on_wait`` when ``Store.open`` finds the file locked by another process.

    Attributes:
        path: The database file.
        pid: The process holding the lock, as DuckDB reported it (None if it did not say).
        waited_s: Seconds waited so far.
        detail: DuckDB's message.
    """

    path: Path
    pid: int | None
    waited_s: float
    detail: str


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _run_row(bundle: RunBundle, sample_count: int, ingested_at: datetime) -> dict[str, Any]:
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


def _insert_rows(conn: duckdb.DuckDBPyConnection, table: str, rows: list[dict[str, Any]]) -> None:
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


def _cell_row(cell: Cell) -> dict[str, Any]:
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


def _latency_rows(cell: Cell) -> list[dict[str, Any]]:
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


def _check_duckdb_file(file: Path) -> None:
    """Refuse, by name, an existing file that is not a DuckDB database (DuckDB's own message
    for one is about in-memory databases or invalid files, and says nothing of what to do)."""
    try:
        head = read_bounded(file, _DUCKDB_MAGIC_END)
    except FileNotFoundError:
        return
    except OSError as error:
        raise MatrixError(f"cannot use {file} as the matrix: {error.strerror}") from error
    if head and head[_DUCKDB_MAGIC_START:_DUCKDB_MAGIC_END] != b"DUCK":
        raise MatrixError(
            f"{file} is not a qualify matrix (not a DuckDB database file); pass the path of a "
            "matrix qualify wrote, or a new path to create one"
        )


def _wait_for_lock(
    attempt: Callable[[], _T],
    target: str,
    *,
    wait_s: float,
    on_wait: Callable[[LockWait], None] | None,
    sleep: Callable[[float], None],
    monotonic: Callable[[], float],
) -> _T:
    """``attempt()`` (a connect or an attach of ``target``), retried with exponential backoff
    while another process holds the file lock, for up to ``wait_s`` seconds.

    Raises:
        MatrixLockedError: The lock was still held after ``wait_s``.
        MatrixError: Any other failure to open the file.
    """
    started = monotonic()
    delay = _FIRST_DELAY_S
    announced: tuple[int | None] | None = None
    last_said = 0.0
    while True:
        try:
            return attempt()
        except duckdb.Error as error:
            detail = str(error)
            if _LOCK_MARK not in detail:
                raise MatrixError(f"cannot open matrix {target}: {detail}") from error
            found = _PID_RE.search(detail)
            pid = int(found.group(1)) if found else None
            waited = monotonic() - started
            if waited >= wait_s:
                holder = f"PID {pid}" if pid is not None else "another process"
                raise MatrixLockedError(
                    f"matrix {target} is locked by {holder}; gave up after waiting "
                    f"{waited:.1f} s. Let that process (another `qualify run` or ingest) "
                    "finish, or stop it, then retry",
                    path=Path(target),
                    pid=pid,
                    waited_s=waited,
                ) from error
            if on_wait is not None and (
                announced != (pid,) or waited - last_said >= _ANNOUNCE_EVERY_S
            ):
                announced, last_said = (pid,), waited
                on_wait(LockWait(path=Path(target), pid=pid, waited_s=waited, detail=detail))
            sleep(min(delay, max(wait_s - waited, 0.0)))
            delay = min(delay * 2, _MAX_DELAY_S)


def _attached_version(conn: duckdb.DuckDBPyConnection) -> int:
    """The schema version of the database attached as ``source`` (0 without migrations)."""
    row = _first(
        conn.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE database_name = 'source' "
            "AND schema_name = 'main' AND table_name = 'schema_migrations'"
        )
    )
    if row is None or row[0] == 0:
        return 0
    row = _first(conn.execute("SELECT coalesce(max(version), 0) FROM source.schema_migrations"))
    return int(row[0]) if row is not None else 0


_DECISION_CELLS = (
    "FROM cells AS c LEFT JOIN runs AS r USING (run_id) "
    "QUALIFY row_number() OVER ("
    "  PARTITION BY c.hardware, c.runtime, c.provider, c.artifact_digest, c.settings_digest, "
    "    c.emulated OR coalesce(r.emulated, false) "
    "  ORDER BY c.measured_at DESC, c.run_id DESC) = 1"
)
"""The newest cell of each (key, digest, settings, emulated) group: the cells
`Store.decision_cells` reads (a ``SELECT`` list goes before it)."""
_CELL_ORDER = "ORDER BY c.measured_at, c.run_id, c.role, c.artifact_name, c.artifact_digest"
"""How `Store.decision_cells` orders them."""


class Store(ReleaseRecords, Annotations):
    """An open matrix database. Create with ``Store.open``; use as a context manager.

    One store wraps one DuckDB connection: use it from one thread at a time. Keep it open only
    as long as a command needs it, since a read-write store holds the file lock.
    """

    # -- lifecycle ---------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str | Path,
        *,
        wait_s: float = 120.0,
        on_wait: Callable[[LockWait], None] | None = None,
        read_only: bool = False,
        clock: Callable[[], datetime] = _utc_now,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
        model: str | None = None,
    ) -> Self:
        """Open (creating and migrating if needed) the matrix at ``path``.

        When another process holds the file lock, wait and retry with exponential backoff
        (50 ms doubling to 1 s) for up to ``wait_s`` seconds. Prints nothing.

        Args:
            path: The DuckDB file, or ``":memory:"``. Missing parent directories are created
                (read-write only).
            wait_s: How long to wait for another process's lock before giving up.
            on_wait: Called when the lock is found held, again whenever the holding PID
                changes and every 10 s, so a CLI can say "waiting for the matrix lock held by
                PID ... for N s".
            read_only: Open without the write lock (several readers may share the file, but
                not with a writer). The schema must already be current.
            clock: UTC clock for ``applied_at``, ``ingested_at`` and ``stored_at``.
            sleep: Sleeps between retries (a parameter so tests need not wait).
            monotonic: Measures the wait.
            model: The model line the caller works on (the project's ``model``): a matrix of
                another line, or one that mixes lines, is refused (`require_model_line`); a
                new matrix opened read-write becomes this line's.

        Returns:
            The open store.

        Raises:
            ModelLineError: The matrix holds another model line than ``model``, or mixes lines.
            MatrixLockedError: The lock was still held after ``wait_s``.
            SchemaVersionError: The database is newer than this code, or (read-only) older.
            MatrixError: The file is missing (read-only), not a DuckDB database, or unreadable.
        """
        target = str(path)
        if target == MEMORY:
            if read_only:
                raise MatrixError("a ':memory:' matrix cannot be opened read-only")
        else:
            file = Path(target)
            if read_only and not file.is_file():
                raise MatrixError(
                    f"no matrix at {file}: run `qualify run` or `qualify matrix ingest` to create "
                    "it, or pass the path of an existing matrix"
                )
            _check_duckdb_file(file)
            if not read_only:
                try:
                    file.parent.mkdir(parents=True, exist_ok=True)
                except OSError as error:
                    raise MatrixError(
                        f"cannot create the directory of matrix {file}: {error}"
                    ) from error
        conn = cls._connect(
            target,
            read_only=read_only,
            wait_s=wait_s,
            on_wait=on_wait,
            sleep=sleep,
            monotonic=monotonic,
        )
        try:
            conn.execute("SET TimeZone = 'UTC'")
            if read_only:
                check_current(conn, source=target)
            else:
                apply_migrations(conn, source=target, now=clock)
            store = cls(conn, path=target, read_only=read_only, clock=clock)
            if model is not None:
                store.require_model_line(model)
        except BaseException:
            conn.close()
            raise
        return store

    @classmethod
    def open_copy(
        cls,
        path: str | Path,
        *,
        wait_s: float = 120.0,
        on_wait: Callable[[LockWait], None] | None = None,
        clock: Callable[[], datetime] = _utc_now,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> Self:
        """A private in-memory copy of the matrix at ``path``, migrated to this code's schema:
        how an older matrix is read without changing its file (a migration would lock it for
        writing and leave it unreadable by the qualify that wrote it).

        The file is attached read-only, waiting for another process's lock as `open` does, only
        while it is copied; the copy is read-only. It holds the whole matrix in memory.

        Args:
            path: The DuckDB file.
            wait_s, on_wait, clock, sleep, monotonic: As for `open` (``clock`` stamps the
                copy's migrations).

        Returns:
            The open copy (its ``path`` is the file's).

        Raises:
            MatrixLockedError: The lock was still held after ``wait_s``.
            SchemaVersionError: The database is newer than this code (refused before copying).
            MatrixError: The file is missing, not a DuckDB database, or unreadable.
        """
        file = Path(path)
        if not file.is_file():
            raise MatrixError(
                f"no matrix at {file}: run `qualify run` or `qualify matrix ingest` to create it, "
                "or pass the path of an existing matrix"
            )
        _check_duckdb_file(file)
        conn = duckdb.connect(MEMORY)
        try:
            conn.execute("SET enable_progress_bar = false")
            conn.execute("SET TimeZone = 'UTC'")
            quoted = str(file).replace("'", "''")
            _wait_for_lock(
                lambda: conn.execute(f"ATTACH '{quoted}' AS source (READ_ONLY)"),
                str(file),
                wait_s=wait_s,
                on_wait=on_wait,
                sleep=sleep,
                monotonic=monotonic,
            )
            _refuse_newer(_attached_version(conn), str(file))
            conn.execute("COPY FROM DATABASE source TO memory")
            conn.execute("DETACH source")
            apply_migrations(conn, source=str(file), now=clock)
        except duckdb.Error as error:
            conn.close()
            raise MatrixError(f"cannot copy matrix {file}: {error}") from error
        except BaseException:
            conn.close()
            raise
        return cls(conn, path=str(file), read_only=True, clock=clock)

    @staticmethod
    def _connect(
        target: str,
        *,
        read_only: bool,
        wait_s: float,
        on_wait: Callable[[LockWait], None] | None,
        sleep: Callable[[float], None],
        monotonic: Callable[[], float],
    ) -> duckdb.DuckDBPyConnection:
        conn = _wait_for_lock(
            lambda: duckdb.connect(target, read_only=read_only),
            target,
            wait_s=wait_s,
            on_wait=on_wait,
            sleep=sleep,
            monotonic=monotonic,
        )
        # No progress bar: DuckDB draws one on stdout for any statement over two seconds (a
        # large telemetry file's single INSERT), into a command's output.
        conn.execute("SET enable_progress_bar = false")
        return conn

    def close(self) -> None:
        """Close the connection (releasing the file lock). Closing twice is harmless."""
        if not self._closed:
            self._closed = True
            self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def schema_version(self) -> int:
        """The highest applied migration version."""
        return current_version(self._conn)

    def migrations(self) -> list[AppliedMigration]:
        """The applied migrations, oldest first."""
        rows = self._conn.execute(
            "SELECT version, name, applied_at FROM schema_migrations ORDER BY version"
        ).fetchall()
        return [AppliedMigration(version=v, name=n, applied_at=a) for v, n, a in rows]

    # -- the model line --------------------------------------------------------------------

    def model_line(self) -> str | None:
        """The model line this matrix holds (the ``model`` of every project, run, bundle and
        manifest in it); None while nothing has been written.

        Raises:
            ModelLineError: The matrix's earlier records mix lines (``qualify matrix split``).
        """
        return lines.model_line(self._conn, self._path)

    def require_model_line(self, model: str, *, what: str = "the project file") -> None:
        """Refuse to go on for model line ``model`` unless it is this matrix's (a read-write
        matrix of no line yet becomes ``model``'s).

        Args:
            model: The line the caller works on.
            what: What names ``model``, for the message.

        Raises:
            ModelLineError: The matrix holds another line, or mixes lines; the message names
                both, the file and the fix (another ``--db``).
        """
        lines.require(
            self._conn,
            self._path,
            model,
            what=what,
            stamp=not self._read_only,
            now=self._clock(),
        )

    @staticmethod
    def split_model_line(
        source: str | Path, model: str, out: str | Path, *, clock: Callable[[], datetime] = _utc_now
    ) -> dict[str, int]:
        """Copy model line ``model`` of the matrix at ``source`` (one whose earlier records mix
        lines) into a new matrix at ``out`` stamped with it; the source is only read (after
        migrating it to this version's schema).

        Returns:
            Rows copied per table.

        Raises:
            MatrixError: ``out`` exists, ``source`` has nothing of ``model``, or either file
                cannot be used.
        """
        Store.open(source, clock=clock).close()  # at the latest schema, as ``out`` will be

        def connect(path: Path) -> duckdb.DuckDBPyConnection:
            return Store.open(path, clock=clock).connection

        return lines.split(Path(source), model, Path(out), connect=connect, now=clock())

    # -- writes ------------------------------------------------------------------------------

    def write_run(self, bundle: RunBundle, samples: pa.Table) -> bool:
        """Write a run, its cells, latency results and raw samples in one transaction.

        Idempotent by run id: if the run is already stored nothing is written. Either every row
        of the run lands or none does, even if the process is killed mid-write.

        Args:
            bundle: The run and its cells.
            samples: Raw latency samples with columns artifact_digest (string), batch_size
                (int32), concurrency (int32), seq (int32), latency_ns (int64); the store adds
                run_id. Use ``matrix.samples.empty_samples()`` when nothing was timed.

        Returns:
            True if the run was written, False if it was already present.

        Raises:
            BundleError: The bundle is inconsistent or the samples table has the wrong columns.
            ModelLineError: The run is of another model line than the matrix holds (nothing is
                written); a matrix of no line yet becomes the run's.
            MatrixError: The store was opened read-only.
        """

        from matrix.bundle import check_bundle

        self._require_writable("write a run")
        run_id = bundle.run.run_id
        conformed = check_bundle(bundle, samples, source=f"run {run_id}")
        # The run's own rows go in as parameters; only the samples, which can be millions, go
        # through Arrow (pa.Table.from_pylist would make pyarrow import pandas, ~0.25 s).
        rows = [
            ("runs", [_run_row(bundle, conformed.num_rows, self._clock())]),
            ("cells", [_cell_row(c) for c in bundle.cells]),
            ("latency", [row for c in bundle.cells for row in _latency_rows(c)]),
        ]
        incoming: list[tuple[str, pa.Table, str]] = [
            ("samples", conformed, "$run_id AS run_id, *"),
        ]
        conn = self._conn
        registered: list[str] = []
        conn.execute("BEGIN TRANSACTION")
        try:
            if self._has_run(run_id):
                conn.execute("ROLLBACK")
                return False
            # One matrix, one model line: the run's, or the run is refused whole.
            lines.require(
                conn,
                self._path,
                bundle.run.model,
                what=f"run {run_id}",
                stamp=True,
                now=self._clock(),
            )
            for table, values in rows:
                _insert_rows(conn, table, values)
            for table, arrow, select in incoming:
                source = f"_incoming_{table}"
                conn.register(source, arrow)
                registered.append(source)
                conn.execute(
                    f"INSERT INTO {table} BY NAME SELECT {select} FROM {source}",
                    {"run_id": run_id} if "$run_id" in select else None,
                )
            self._before_commit(run_id)
            conn.execute("COMMIT")
        except BaseException:
            _rollback_quietly(conn)
            raise
        finally:
            for source in registered:
                conn.unregister(source)
        return True

    def _before_commit(self, run_id: str) -> None:
        """Test seam: runs inside the write transaction, after every insert, before COMMIT."""

    # -- queries -----------------------------------------------------------------------------

    def _has_run(self, run_id: str) -> bool:
        row = _first(self._conn.execute("SELECT count(*) FROM runs WHERE run_id = ?", [run_id]))
        return row is not None and row[0] > 0

    def has_run(self, run_id: str) -> bool:
        """Whether a run with this id is stored."""
        return self._has_run(run_id)

    def latest_cells(self, *, host_class: str | None = None) -> list[Cell]:
        """The latest cell per (hardware, runtime, provider, artifact digest), as stored.

        Latest is by ``measured_at``, ties broken by the larger run id. The key, not the class
        name, is the identity: ``host_class`` filters the latest cells by the class name they
        were measured under.

        Args:
            host_class: Only cells of this class; None for all.

        Returns:
            Cells rebuilt exactly from their stored JSON, ordered by key, role, name, digest.
        """
        from schemas.cell import Cell

        rows = self._conn.execute(
            "SELECT c.cell FROM matrix AS m JOIN cells AS c USING (run_id, artifact_digest) "
            "WHERE $host_class IS NULL OR m.host_class = $host_class "
            "ORDER BY m.hardware, m.runtime, m.provider, m.role, m.artifact_name, "
            "m.artifact_digest",
            {"host_class": host_class},
        ).fetchall()
        return [Cell.model_validate_json(row[0]) for row in rows]

    def latest_warnings(self) -> list[tuple[str, str, list[tuple[str, int]]]]:
        """What the runtime warned while measuring each latest cell, for ``matrix show``.

        Read from the stored cells with the standard library (``matrix show`` loads no
        pydantic); a warning stored as a plain string (cells before counts) counts once.

        Returns:
            ``(class, artifact name, [(message, count), ...])`` per latest cell that has
            warnings, in the order of `latest_cells`.
        """
        rows = self._conn.execute(
            "SELECT m.host_class, m.artifact_name, c.cell FROM matrix AS m "
            "JOIN cells AS c USING (run_id, artifact_digest) "
            "ORDER BY m.hardware, m.runtime, m.provider, m.role, m.artifact_name, "
            "m.artifact_digest"
        ).fetchall()
        found = []
        for host_class, name, text in rows:
            placement = json.loads(text).get("placement") or {}
            said: list[tuple[str, int]] = []
            for item in placement.get("warnings") or []:
                if isinstance(item, str):
                    said.append((item, 1))
                elif isinstance(item, dict) and isinstance(item.get("message"), str):
                    said.append((item["message"], int(item.get("count") or 1)))
            if said:
                found.append((str(host_class), str(name), said))
        return found

    def decision_cells(self) -> list[Cell]:
        """The cells a release decision can rest on: per (hardware, runtime, provider, artifact
        digest, settings digest, emulated), the latest one.

        ``manifest.policy.decide`` uses, per key and digest, the latest cell measured under the
        class's current settings (else the latest of any), and for the rollback's proof the
        latest current one that is not emulated (a cell's own flag or its run's): each is the
        latest of one of these groups, so deciding on them equals deciding on every cell, while
        a matrix's history (cells of every run, release after release) is read once per group.
        ``bench/matrix_history.py``: 1,000 classes qualified 10 times, reading and deciding on
        these 2,000 cells and 1,000 runs takes 0.26 s, on all 20,000 and 10,000 0.63 s.

        Returns:
            Cells rebuilt from their stored JSON, ordered as `cells` orders them.
        """
        from schemas.cell import Cell

        rows = self._conn.execute(f"SELECT c.cell {_DECISION_CELLS} {_CELL_ORDER}").fetchall()
        return [Cell.model_validate_json(row[0]) for row in rows]

    def decision_cells_by_key(self) -> dict[tuple[str, str, str], list[Cell]]:
        """`decision_cells`, grouped by (hardware, runtime, provider), the key its row was
        stored under (``write_run`` takes it from the cell's own key): what
        ``manifest.policy.decide`` takes instead of grouping a fleet's cells itself, a pass
        that touched every cell again once a matrix's cells were read (a tenth of deciding
        10,000 classes).

        Returns:
            key -> its cells, each group ordered as `decision_cells` orders them.
        """
        from schemas.cell import Cell

        rows = self._conn.execute(
            f"SELECT c.hardware, c.runtime, c.provider, c.cell {_DECISION_CELLS} {_CELL_ORDER}"
        ).fetchall()
        grouped: dict[tuple[str, str, str], list[Cell]] = {}
        validate = Cell.model_validate_json
        for hardware, runtime, provider, text in rows:
            grouped.setdefault((hardware, runtime, provider), []).append(validate(text))
        return grouped

    def decision_runs(self) -> list[RunRecord]:
        """The runs a release decision on `decision_cells` reads: those cells' runs, and per
        (hardware, runtime, provider, settings digest, emulated, rollback digest) the latest run
        that checked a rollback (the policy takes the latest current check of the class's
        rollback artifact, among runs that are not emulated unless the policy allows them).

        Returns:
            Run records, ordered as `runs` orders them.
        """
        from schemas.cell import RunRecord

        rows = self._conn.execute(
            f"SELECT record FROM runs WHERE run_id IN (SELECT c.run_id {_DECISION_CELLS}) "
            "OR run_id IN ("
            "  SELECT run_id FROM runs WHERE rollback_digest IS NOT NULL "
            "  QUALIFY row_number() OVER ("
            "    PARTITION BY hardware, runtime, provider, settings_digest, emulated, "
            "      rollback_digest "
            "    ORDER BY finished_at DESC, run_id DESC) = 1"
            ") ORDER BY started_at, run_id"
        ).fetchall()
        return [RunRecord.model_validate_json(row[0]) for row in rows]

    def cells(self, *, run_id: str | None = None, host_class: str | None = None) -> list[Cell]:
        """Every stored cell (not only the latest), oldest first.

        Args:
            run_id: Only cells of this run; None for all.
            host_class: Only cells of this class; None for all.

        Returns:
            Cells ordered by measured_at, run id, role, artifact name.
        """
        from schemas.cell import Cell

        rows = self._conn.execute(
            "SELECT cell FROM cells "
            "WHERE ($run_id IS NULL OR run_id = $run_id) "
            "AND ($host_class IS NULL OR host_class = $host_class) "
            "ORDER BY measured_at, run_id, role, artifact_name, artifact_digest",
            {"run_id": run_id, "host_class": host_class},
        ).fetchall()
        return [Cell.model_validate_json(row[0]) for row in rows]

    def matrix_rows(self) -> list[dict[str, Any]]:
        """The ``matrix`` view: one row per latest cell per key and digest.

        Returns:
            Rows as dicts (column name to value; timestamps are UTC datetimes), ordered by
            hardware, runtime, provider, role (baseline first), artifact name, digest.
        """
        result = self._conn.execute(f"SELECT * FROM matrix ORDER BY {_MATRIX_ORDER}")
        names = [column[0] for column in result.description or ()]
        return [dict(zip(names, row, strict=True)) for row in result.fetchall()]

    def runs(self) -> list[RunRecord]:
        """Every stored run, ordered by start time then run id."""
        from schemas.cell import RunRecord

        rows = self._conn.execute("SELECT record FROM runs ORDER BY started_at, run_id").fetchall()
        return [RunRecord.model_validate_json(row[0]) for row in rows]

    def run(self, run_id: str) -> RunRecord | None:
        """The stored run with this id, or None."""
        from schemas.cell import RunRecord

        row = _first(self._conn.execute("SELECT record FROM runs WHERE run_id = ?", [run_id]))
        return RunRecord.model_validate_json(row[0]) if row is not None else None

    def samples(self, run_id: str, artifact_digest: str) -> pa.Table:
        """Raw latency samples of one cell.

        Args:
            run_id: The run.
            artifact_digest: The artifact.

        Returns:
            Columns batch_size, concurrency (int32), dims (string, `schemas.cell.dims_text`),
            seq (int32) and latency_ns (int64), ordered by (batch_size, concurrency, dims,
            seq); empty if the cell has none or does not exist.
        """
        return self._conn.sql(
            "SELECT batch_size, concurrency, dims, seq, latency_ns FROM samples "
            "WHERE run_id = $run_id AND artifact_digest = $digest "
            "ORDER BY batch_size, concurrency, dims, seq",
            params={"run_id": run_id, "digest": artifact_digest},
        ).to_arrow_table()

    def samples_by_config(
        self, run_id: str, artifact_digest: str
    ) -> dict[LatencyConfig, npt.NDArray[np.int64]]:
        """Raw latencies of one cell per latency config, in sequence order.

        Args:
            run_id: The run.
            artifact_digest: The artifact.

        Returns:
            ``{LatencyConfig: latency_ns array}``; empty if there are none.
        """
        import numpy as np

        from schemas.cell import LatencyConfig

        table = self.samples(run_id, artifact_digest)
        grouped: dict[LatencyConfig, npt.NDArray[np.int64]] = {}
        if table.num_rows == 0:
            return grouped
        batch = table.column("batch_size").to_numpy()
        concurrency = table.column("concurrency").to_numpy()
        dims = table.column("dims").combine_chunks().dictionary_encode()
        dim_ids = dims.indices.to_numpy(zero_copy_only=False)
        latency = table.column("latency_ns").to_numpy().astype(np.int64, copy=False)
        # Rows arrive sorted by config, so each config is one contiguous slice.
        change = (np.diff(batch) != 0) | (np.diff(concurrency) != 0) | (np.diff(dim_ids) != 0)
        starts = np.concatenate(([0], np.flatnonzero(change) + 1))
        ends = np.concatenate((starts[1:], [table.num_rows]))
        names = dims.dictionary.to_pylist()
        for start, end in zip(starts, ends, strict=True):
            config = LatencyConfig(
                int(batch[start]), int(concurrency[start]), str(names[dim_ids[start]])
            )
            grouped[config] = latency[start:end].copy()
        return grouped

    def snapshot_id(self) -> str:
        """A stable digest of the runs present: ``sha256:`` over the sorted run ids.

        Runs are immutable once written, so the same set of runs always gives the same id; a
        manifest cites it as its source matrix snapshot.
        """
        import hashlib

        run_ids = sorted(
            str(row[0]) for row in self._conn.execute("SELECT run_id FROM runs").fetchall()
        )
        return "sha256:" + hashlib.sha256("\n".join(run_ids).encode("utf-8")).hexdigest()

    # -- export ------------------------------------------------------------------------------

    def _write_parquet(self, name: str, temp: Path, final: Path) -> None:
        """One table into ``temp`` (synced), or a `MatrixError` naming ``final``."""
        from matrix.bundle import _fsync_path

        try:
            self._conn.sql(f"SELECT * FROM {name} ORDER BY {_EXPORT_ORDER[name]}").write_parquet(
                str(temp), compression="zstd"
            )
            _fsync_path(temp)
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
        from matrix.bundle import _fsync_path

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
        _fsync_path(out)
        return written
