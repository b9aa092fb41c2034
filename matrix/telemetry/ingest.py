"""Telemetry into the matrix: bulk, idempotent ingest of JSON-lines event files.

Owns the one streaming pass over a ``qualify-telemetry/1`` file (read in blocks of whole lines,
each parsed in a thread of its own while DuckDB stores the one before, into the ``telemetry``
table in one transaction per file) and the record of ingested prefixes (``telemetry_files``)
that makes an ingest idempotent and a grown file resume. Does not own parsing a block
(``matrix.telemetry.blocks``), the per-line checks (``matrix.telemetry.checks``), the window
queries (``matrix.telemetry.queries``), the event model (``schemas.telemetry``) nor judging
events (``qualify.telemetry.check``).
"""

from __future__ import annotations

import errno
import hashlib
import os
import queue
import re
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from io import BufferedReader
from pathlib import Path
from typing import Any, Literal

import duckdb
import pyarrow as pa

from matrix.errors import MatrixError, TelemetryFileError
from matrix.migrations import rollback_quietly
from matrix.store import Store
from matrix.telemetry import checks
from matrix.telemetry.blocks import FAST_ROW_SCHEMA, parse_block

__all__ = [
    "BLOCK_BYTES",
    "MAX_REPORTED_BAD_LINES",
    "IngestedTelemetry",
    "TelemetryFileError",
    "TelemetryIngestReport",
    "ingest_telemetry",
]

BLOCK_BYTES = 6 << 20
"""Bytes read per block (whole lines); bounds memory whatever the file size. Smaller blocks
lower the peak and cost time per block: the measurements that chose 6 MiB are in
docs/measurements.md."""

MAX_REPORTED_BAD_LINES = 1000
"""Bad lines reported in detail per file; the rest are counted."""


@dataclass(frozen=True)
class IngestedTelemetry:
    """What happened to one telemetry file.

    Attributes:
        path: The file.
        sha256: Digest of the bytes ingested so far (the file up to its last newline).
        status: "ingested" (events written now; for a grown file, only the new lines) or
            "present" (these bytes were ingested before; nothing written).
        first_line: First line read by this ingest (1-based; after a resumed prefix).
        lines: Lines read by this ingest (blank lines included).
        events: Events written.
        bad_lines: Lines skipped as invalid (all of them, not only those in ``bad``).
        bad: The first ``MAX_REPORTED_BAD_LINES`` bad lines, in file order.
        pending_bytes: Bytes after the last newline, left for the next ingest.
    """

    path: Path
    sha256: str
    status: Literal["ingested", "present"]
    first_line: int
    lines: int
    events: int
    bad_lines: int
    bad: tuple[checks.BadLine, ...]
    pending_bytes: int


@dataclass(frozen=True)
class TelemetryIngestReport:
    """The outcome of ``ingest_telemetry``, one entry per path in the order given."""

    files: tuple[IngestedTelemetry, ...]

    @property
    def events(self) -> int:
        """Events written by this ingest, all files."""
        return sum(f.events for f in self.files)

    @property
    def bad_lines(self) -> int:
        """Lines skipped as invalid, all files."""
        return sum(f.bad_lines for f in self.files)


# -- idempotency -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    sha256: str
    end: int  # bytes up to and including the last newline
    size: int
    resume_at: int  # bytes already ingested (a recorded prefix)
    resume_lines: int


def _plan(path: Path, known: dict[int, tuple[str, int]], limit: int | None = None) -> _Plan:
    """Hash the file once (its first ``limit`` bytes, given one); find its last newline and the
    longest recorded prefix it extends.

    Read into one reused buffer and hashed through views of it: no block is copied.
    """
    digest = hashlib.sha256()
    position = 0
    end = 0
    end_hash = digest.copy()
    matched = (0, 0)
    lengths = sorted(known)
    buffer = bytearray(BLOCK_BYTES)
    view = memoryview(buffer)
    left = limit  # None: to the end of the file
    with open(path, "rb", buffering=0) as handle:
        while left != 0 and (size := handle.readinto(view if left is None else view[:left])):
            if left is not None:
                left -= size
            cuts = {length - position for length in lengths if position < length <= position + size}
            last_nl = buffer.rfind(b"\n", 0, size)
            if last_nl >= 0:
                cuts.add(last_nl + 1)
            done = 0
            for cut in sorted(cuts):
                digest.update(view[done:cut])
                done = cut
                at = position + cut
                if at in known and digest.hexdigest() == known[at][0]:
                    matched = (at, known[at][1])
                if last_nl >= 0 and cut == last_nl + 1:
                    end, end_hash = at, digest.copy()
            digest.update(view[done:size])
            position += size
    return _Plan(
        sha256="sha256:" + end_hash.hexdigest(),
        end=end,
        size=position,
        resume_at=matched[0],
        resume_lines=matched[1],
    )


def _last_line_end(path: Path, size: int) -> int:
    """Bytes up to and including the last newline of the file's first ``size`` bytes; 0 when
    they hold none. Read backwards from ``size``: a file ending in whole lines costs one read."""
    at = size
    with open(path, "rb", buffering=0) as handle:
        while at > 0:
            step = min(_TAIL_BYTES, at)
            at -= step
            handle.seek(at)
            newline = handle.read(step).rfind(b"\n")
            if newline >= 0:
                return at + newline + 1
    return 0


_TAIL_BYTES = 1 << 16


# -- ingest ----------------------------------------------------------------------------------


def _known_prefixes(conn: duckdb.DuckDBPyConnection, size: int) -> dict[int, tuple[str, int]]:
    rows = conn.execute(
        "SELECT end_byte, sha256, end_line FROM telemetry_files WHERE end_byte <= ?", [size]
    ).fetchall()
    known: dict[int, tuple[str, int]] = {}
    for end_byte, sha, end_line in rows:
        known[int(end_byte)] = (str(sha).removeprefix("sha256:"), int(end_line))
    return known


_SHA256_RE = re.compile(r"sha256:[0-9a-f]{64}")


def _table_columns(conn: duckdb.DuckDBPyConnection, table: str) -> list[str]:
    rows = conn.execute(
        "SELECT column_name FROM duckdb_columns() WHERE table_name = ? ORDER BY column_index",
        [table],
    ).fetchall()
    return [str(r[0]) for r in rows]


def _insert_events(
    conn: duckdb.DuckDBPyConnection,
    batches: Iterator[pa.RecordBatch],
    columns: list[str],
    sha: str,
) -> None:
    """Append a file's events, tagged with its digest, inside the open transaction: one INSERT
    that pulls the batches as it goes (the next block is parsed while DuckDB stores the one
    before, in its own threads: ~25% less wall time than an INSERT per block, measured on
    1,000,000 events, and a lower peak, as DuckDB holds no block longer than it needs it).

    Through a relation over an Arrow stream, not a registered view: a view dropped inside a
    transaction stays in the catalog, holding its Arrow data, until COMMIT. The projection lists
    the table's own columns in order, so the positional append cannot shift a column whatever
    order a migration left them in. An exception raised while the batches are made (the file
    shrank, an interrupt) reaches DuckDB as a message; it is raised again here as itself.
    """
    if not _SHA256_RE.fullmatch(sha):  # it goes into SQL text below
        raise ValueError(f"not a sha256 digest: {sha!r}")
    failure: list[BaseException] = []

    def watched() -> Iterator[pa.RecordBatch]:
        try:
            yield from batches
        except BaseException as exc:
            failure.append(exc)
            raise

    exprs = [f"'{sha}' AS file_sha256" if c == "file_sha256" else f'"{c}"' for c in columns]
    reader = pa.RecordBatchReader.from_batches(FAST_ROW_SCHEMA, watched())
    try:
        conn.from_arrow(reader).project(", ".join(exprs)).insert_into("telemetry")
    except duckdb.Error:
        if failure:
            raise failure[0] from None
        raise


def _batches(tables: Iterable[pa.Table], tally: _Tally) -> Iterator[pa.RecordBatch]:
    """The blocks' events as batches (`FAST_ROW_SCHEMA`), counted into ``tally`` as they go;
    after each block, the allocator's freed pages go back to the system (it keeps them for
    reuse otherwise: at 8 MiB blocks ~20 MiB of peak RSS)."""
    pool = pa.default_memory_pool()
    for table in tables:
        tally.events += table.num_rows
        yield from table.to_batches()
        del table
        pool.release_unused()


def _where(conn: duckdb.DuckDBPyConnection, path: Path) -> tuple[Any, int, int]:
    """``(plan, size, end)`` of a file to ingest: the plan of a file some recorded prefix fits
    (None otherwise: it is read from its start and hashed as its first blocks parse, the hash
    being a tenth of an ingest), its size, and where its last whole line ends."""
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise TelemetryFileError(
                f"{path}: not a file; pass JSON-lines telemetry files", path=path
            )
        known = _known_prefixes(conn, size)
        end = 0 if known else _last_line_end(path, size)
        plan = _plan(path, known) if end == 0 else None
    except OSError as error:
        raise _unreadable(path, error) from error
    return plan, size, end


def _ingest_one(conn: duckdb.DuckDBPyConnection, path: Path, *, now: datetime) -> IngestedTelemetry:
    plan, size, end = _where(conn, path)
    if plan is not None:
        start, end, pending = plan.resume_at, plan.end, plan.size - plan.end
        first_line = plan.resume_lines + 1
        if plan.end == plan.resume_at:
            return IngestedTelemetry(path, plan.sha256, "present", first_line, 0, 0, 0, (), pending)
    else:
        start, pending, first_line = 0, size - end, 1
    tally = _Tally()
    conn.execute("BEGIN TRANSACTION")
    try:
        columns = _table_columns(conn, "telemetry")
        with (
            open(path, "rb") as handle,
            _ahead(_blocks(_at(handle, start), end - start, first_line, tally)) as blocks,
        ):
            if plan is None:
                plan = _plan(path, {}, limit=end)
                if plan.end != end:
                    raise OSError(errno.EIO, "the file changed while it was read")
            present = conn.execute(
                "SELECT count(*) FROM telemetry_files WHERE sha256 = ?", [plan.sha256]
            ).fetchall()
            if present[0][0]:
                conn.execute("ROLLBACK")
                return IngestedTelemetry(
                    path, plan.sha256, "present", first_line, 0, 0, 0, (), pending
                )
            _insert_events(conn, _batches(blocks, tally), columns, plan.sha256)
        conn.execute(
            "INSERT INTO telemetry_files (sha256, path, start_byte, end_byte, start_line, "
            "end_line, events, bad_lines, ingested_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [plan.sha256, str(path), start, end, first_line, first_line + tally.lines - 1,
             tally.events, tally.bad_count, now],
        )  # fmt: skip
        conn.execute("COMMIT")
    except OSError as error:
        rollback_quietly(conn)
        raise _unreadable(path, error) from error
    except BaseException:
        rollback_quietly(conn)
        raise
    return IngestedTelemetry(path, plan.sha256, "ingested", first_line, tally.lines,
                             tally.events, tally.bad_count, tuple(tally.bad), pending)  # fmt: skip


def _unreadable(path: Path, error: OSError) -> TelemetryFileError:
    return TelemetryFileError(
        f"{path}: cannot read the telemetry file ({error.strerror}); check the path", path=path
    )


def _at(handle: BufferedReader, offset: int) -> BufferedReader:
    handle.seek(offset)
    return handle


@contextmanager
def _ahead(items: Iterator[pa.Table]) -> Iterator[Iterator[pa.Table]]:
    """``items``, each made in a thread of its own while the one before is consumed.

    The blocks of a file parse (pyarrow and numpy, mostly outside the GIL) while DuckDB stores
    the one before: one block waits at most, and the thread holds the next until it is taken,
    so memory stays bounded by a few blocks. An exception raised making them is raised again,
    as itself, where the next would be taken. Leaving the block stops the thread and waits for
    it: nothing reads the file afterwards.
    """
    slot: queue.Queue[tuple[bool, Any]] = queue.Queue(maxsize=1)
    stop = threading.Event()

    def hand(entry: tuple[bool, Any]) -> bool:
        while not stop.is_set():
            try:
                slot.put(entry, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not hand((True, item)):
                    return
                del item  # not held while the next block parses
            hand((False, None))
        except BaseException as exc:  # handed over, raised again in the consumer
            hand((False, exc))

    def taken() -> Iterator[pa.Table]:
        while True:
            more, item = slot.get()
            if not more:
                if item is not None:
                    raise item
                return
            yield item
            del item

    thread = threading.Thread(target=produce, name="qualify-telemetry-parse", daemon=True)
    thread.start()
    try:
        yield taken()
    finally:
        stop.set()
        thread.join()


@dataclass
class _Tally:
    """What one file's ingest has counted so far."""

    lines: int = 0
    events: int = 0
    bad_count: int = 0
    bad: list[checks.BadLine] = field(default_factory=list)
    """The first `MAX_REPORTED_BAD_LINES` bad lines."""

    def report(self, lines: Sequence[checks.BadLine]) -> None:
        self.bad.extend(lines[: max(0, MAX_REPORTED_BAD_LINES - len(self.bad))])


def _blocks(
    handle: BufferedReader, length: int, first_line: int, tally: _Tally
) -> Iterator[pa.Table]:
    """The valid events of the next ``length`` bytes of ``handle``, a table per block of whole
    lines; bad lines, and lines longer than ``MAX_LINE_BYTES`` (dropped as they stream past,
    never held), are counted into ``tally``. The range ends at a newline (`_Plan.end`).

    Raises:
        OSError: the file ended before ``length`` bytes (it was truncated while read).
    """
    remaining = length
    carry = b""  # the start of a line that the next read completes
    skipping = False  # inside a line longer than MAX_LINE_BYTES, dropped as it comes
    line_no = first_line
    while remaining > 0:
        # Read in after the carried start of a line, into a buffer of this block's own: the
        # block is the buffer up to its last newline, never a copy of it (joining the carry and
        # the read copied every block).
        want = min(BLOCK_BYTES, remaining)
        buffer = bytearray(len(carry) + want)
        buffer[: len(carry)] = carry
        got = handle.readinto(memoryview(buffer)[len(carry) :])
        if not got:
            raise OSError(errno.EIO, "the file shrank while it was read")
        remaining -= got
        end = len(carry) + got
        start = 0
        if skipping:
            nl = buffer.find(b"\n", 0, end)
            if nl < 0:
                continue  # still inside the overlong line (the carry is empty while skipping)
            start, skipping = nl + 1, False
            line_no += 1
            tally.lines += 1
        cut = buffer.rfind(b"\n", start, end) + 1 if remaining > 0 else end
        if cut <= start:
            carry = bytes(buffer[start:end])  # no newline yet: all of it is the carry
        else:
            carry = bytes(buffer[cut:end])
            del buffer[cut:]  # in place: what follows the last newline waits in the carry
            if start:
                del buffer[:start]  # the end of a line too long to read (rare)
            block = parse_block(buffer, line_no)
            # The bytes are parsed: not held while the consumer stores the rows (two blocks'
            # worth of peak memory otherwise).
            del buffer
            line_no += block.lines
            tally.lines += block.lines
            tally.bad_count += len(block.bad)
            tally.report(block.bad)
            tables, block.tables = block.tables, []
            while tables:
                yield tables.pop(0)
        if len(carry) > checks.MAX_LINE_BYTES:
            tally.report([checks.BadLine(line_no, checks.too_long(None), "")])
            tally.bad_count += 1
            carry, skipping = b"", True


def ingest_telemetry(
    store: Store, paths: Iterable[str | os.PathLike[str]], *, now: datetime
) -> TelemetryIngestReport:
    """Load JSON-lines telemetry files into the matrix, each in its own transaction.

    Bad lines are skipped and reported with their line numbers; the good lines of the same file
    are kept. Re-ingesting the same bytes writes nothing; a file that grew is read from where
    the last ingest stopped.

    Args:
        store: An open, writable store.
        paths: JSON-lines files of ``qualify-telemetry/1`` events.
        now: UTC time recorded as ``ingested_at``.

    Returns:
        Per path: what was written and which lines were bad.

    Raises:
        TelemetryFileError: a path is missing or unreadable (files before it stay ingested).
        MatrixError: the store was opened read-only.
    """
    if store.read_only:
        raise MatrixError(f"cannot ingest telemetry: matrix {store.path} was opened read-only")
    conn = store.connection
    return TelemetryIngestReport(tuple(_ingest_one(conn, Path(p), now=now) for p in paths))
