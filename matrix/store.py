"""The matrix store: one DuckDB file holding runs, cells, latency, raw samples and manifests.

Owns the connection (opening it, migrating), writing a run in one transaction, the queries over
runs, cells and samples, and the snapshot id a manifest cites. Its parts record releases
(``matrix.releases``) and annotations (``matrix.annotations``) and export Parquet
(``matrix.export``); the lock wait is ``matrix.lock``'s, the row encoders ``matrix.rows``'. Only
the ``matrix`` package holds SQL (``matrix.migrations`` the DDL).

Does not own the decision policy, manifest building or signing (``manifest``), bundle files
(``matrix.bundle``) or what to print (callers pass ``on_wait``).

DuckDB lets one process write a database file at a time. Callers keep a store open briefly
(open, write, close), so concurrent ``qualify run`` processes serialise on ``Store.open``::

    with Store.open(path) as store:
        store.write_run(bundle, samples)
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import duckdb

from matrix import lines
from matrix.annotations import Annotations
from matrix.errors import MatrixError
from matrix.export import MATRIX_ORDER, ParquetExport
from matrix.lock import LockWait, wait_for_lock
from matrix.migrations import (
    AppliedMigration,
    apply_migrations,
    check_current,
    current_version,
    first_row,
    refuse_newer,
    rollback_quietly,
)
from matrix.releases import ReleaseRecords
from matrix.rows import cell_row, insert_rows, latency_rows, run_row
from schemas.atomic import read_bounded

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import pyarrow as pa

    from schemas.cell import Cell, LatencyConfig, RunBundle, RunRecord

__all__ = ["MEMORY", "Store"]

MEMORY = ":memory:"
"""Path that opens a private in-memory database (tests, dry runs)."""

_DUCKDB_MAGIC_START, _DUCKDB_MAGIC_END = 8, 12
"""Where a DuckDB file's header says ``DUCK``."""


def _utc_now() -> datetime:
    return datetime.now(UTC)


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


def _attached_version(conn: duckdb.DuckDBPyConnection) -> int:
    """The schema version of the database attached as ``source`` (0 without migrations)."""
    row = first_row(
        conn.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE database_name = 'source' "
            "AND schema_name = 'main' AND table_name = 'schema_migrations'"
        )
    )
    if row is None or row[0] == 0:
        return 0
    row = first_row(conn.execute("SELECT coalesce(max(version), 0) FROM source.schema_migrations"))
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


class Store(ReleaseRecords, Annotations, ParquetExport):
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
            wait_for_lock(
                lambda: conn.execute(f"ATTACH '{quoted}' AS source (READ_ONLY)"),
                str(file),
                wait_s=wait_s,
                on_wait=on_wait,
                sleep=sleep,
                monotonic=monotonic,
            )
            refuse_newer(_attached_version(conn), str(file))
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
        conn = wait_for_lock(
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
            ("runs", [run_row(bundle, conformed.num_rows, self._clock())]),
            ("cells", [cell_row(c) for c in bundle.cells]),
            ("latency", [row for c in bundle.cells for row in latency_rows(c)]),
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
                insert_rows(conn, table, values)
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
            rollback_quietly(conn)
            raise
        finally:
            for source in registered:
                conn.unregister(source)
        return True

    def _before_commit(self, run_id: str) -> None:
        """Test seam: runs inside the write transaction, after every insert, before COMMIT."""

    # -- queries -----------------------------------------------------------------------------

    def _has_run(self, run_id: str) -> bool:
        row = first_row(self._conn.execute("SELECT count(*) FROM runs WHERE run_id = ?", [run_id]))
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

    def latest_warnings(
        self, keys: Collection[tuple[str, str, str]] | None = None
    ) -> list[tuple[str, str, list[tuple[str, int]]]]:
        """What the runtime warned while measuring each latest cell, for ``matrix show``.

        Read from the stored cells with the standard library (``matrix show`` loads no
        pydantic); a warning stored as a plain string (cells before counts) counts once.

        Args:
            keys: only the cells on these (hardware, runtime, provider) keys (a project's
                classes'); None: every latest cell.

        Returns:
            ``(class, artifact name, [(message, count), ...])`` per latest cell that has
            warnings, in the order of `latest_cells`.
        """
        rows = self._conn.execute(
            "SELECT m.host_class, m.artifact_name, c.cell, m.hardware, m.runtime, m.provider "
            "FROM matrix AS m JOIN cells AS c USING (run_id, artifact_digest) "
            "ORDER BY m.hardware, m.runtime, m.provider, m.role, m.artifact_name, "
            "m.artifact_digest"
        ).fetchall()
        found = []
        for host_class, name, text, *key in rows:
            if keys is not None and tuple(key) not in keys:
                continue
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
        result = self._conn.execute(f"SELECT * FROM matrix ORDER BY {MATRIX_ORDER}")
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

        row = first_row(self._conn.execute("SELECT record FROM runs WHERE run_id = ?", [run_id]))
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
