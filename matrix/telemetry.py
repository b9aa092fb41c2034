"""Telemetry in the matrix: bulk, idempotent ingest of JSON-lines events and the queries a check needs.

Owns reading ``qualify-telemetry/1`` files into the ``telemetry`` table (the DDL is migration 2
in ``matrix.migrations``), the record of what was ingested (``telemetry_files``), and the
aggregate queries over a time window: a profile per (class, digest, runtime, providers,
fallback) and the latency tail of chosen (class, digest) pairs. Does not own the event model
(``schemas.telemetry``), what hosts write (``manifest.host_events``) or judging events against a
manifest (``qualify.telemetry_check``).

How a file is read (fast for millions of lines, exact about bad ones):

* The file is read in blocks of whole lines. Each block goes through ``pyarrow.json`` with the
  event's schema, then vectorised checks mirror ``TelemetryEvent``'s rules; a row that fails a
  check is re-validated alone with the pydantic model, which has the last word and the message.
  A block that pyarrow refuses (a malformed line, a wrong type, an unknown key) is re-read line
  by line with the model, so the good lines of that block are kept and each bad one is reported
  with its 1-based line number. Blank lines are skipped.
* Idempotent by content: ``telemetry_files`` records the sha256 of every prefix ingested (always
  ending at a newline) with its length and line count. Re-ingesting the same bytes writes
  nothing; a file that only grew (hosts append) resumes after the longest recorded prefix. An
  unterminated last line (a write in progress) is left for the next ingest.
* One transaction per file: its events and its ``telemetry_files`` row land together or not at
  all.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO, Literal

import duckdb
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
from pydantic import ValidationError

from matrix.errors import MatrixError, TelemetryFileError
from matrix.migrations import _rollback_quietly
from matrix.store import Store
from schemas.settings import decode_settings
from schemas.telemetry import MAX_PROVIDERS, MAX_TEXT_CHARS, TELEMETRY_FORMAT, TelemetryEvent

__all__ = [
    "BLOCK_BYTES",
    "MAX_LINE_BYTES",
    "MAX_REPORTED_BAD_LINES",
    "BadLine",
    "Cohort",
    "IngestedTelemetry",
    "ProfileRow",
    "TelemetryFileError",
    "TelemetryIngestReport",
    "TelemetryProfile",
    "ingest_telemetry",
    "latency_tails",
    "revisions_by_class",
    "rollout_reported",
    "telemetry_profile",
]

BLOCK_BYTES = 8 << 20
"""Bytes read per block (whole lines); bounds memory whatever the file size. Measured on 200,000
events (92 MB), fresh processes, interleaved: 8 MiB peaked at ~380 MiB RSS against ~500 MiB for
32 MiB blocks, and was no slower (pyarrow parses a block in 1 MiB chunks on every core either
way; the smaller block's buffers stay in cache)."""

MAX_REPORTED_BAD_LINES = 1000
"""Bad lines reported in detail per file; the rest are counted."""

MAX_LINE_BYTES = 1 << 20
"""Longest line read as an event (a real one is a few hundred bytes); a longer one is a bad
line, skipped without being held whole, so memory stays one block whatever a host wrote."""

_EXAMPLE_HOSTS = 5


@dataclass(frozen=True)
class BadLine:
    """A line that is not a valid event; it was skipped.

    Attributes:
        line: 1-based line number in the file.
        message: What is wrong (the field and the rule).
        text: The start of the line (at most 120 characters).
    """

    line: int
    message: str
    text: str


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
    bad: tuple[BadLine, ...]
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


# -- parsing ---------------------------------------------------------------------------------

_PARSE_SCHEMA = pa.schema(
    [
        ("format", pa.string()),
        ("time", pa.string()),
        ("source", pa.string()),
        ("host_id", pa.string()),
        ("host_class", pa.string()),
        ("model_digest", pa.string()),
        ("runtime_revision", pa.string()),
        ("runtime_package", pa.string()),
        ("providers", pa.list_(pa.string())),
        ("placement", pa.string()),
        ("nodes_per_provider", pa.struct([])),
        ("fallback_nodes", pa.int64()),
        ("latency_ms", pa.float64()),
        ("manifest_version", pa.int64()),
        ("decision", pa.string()),
        ("rollout", pa.string()),
        ("cohort", pa.string()),
        ("settings", pa.string()),
    ]
)

_ROW_TYPES = {
    "time": pa.timestamp("us", tz="UTC"),
    "nodes_per_provider": pa.map_(pa.string(), pa.int64()),
}
_ROW_SCHEMA = pa.schema(
    [(f.name, _ROW_TYPES.get(f.name, f.type)) for f in _PARSE_SCHEMA if f.name != "format"]
    + [("line", pa.int64())]
)
"""The rows inserted: the parsed columns less ``format``, typed for the table, plus ``line``."""

_PARSE_OPTIONS = pj.ParseOptions(
    explicit_schema=_PARSE_SCHEMA, unexpected_field_behavior="infer", newlines_in_values=False
)

# Strict RFC 3339 with an offset: a subset of what the model accepts, so a row that passes here
# passes there (anything else is re-validated by the model).
_TIME_RE = (
    r"^\d{4}-\d{2}-\d{2}T([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,6})?"
    r"(Z|[+-](0\d|1[0-4]):[0-5]\d)$"
)
_DIGEST_RE = r"^sha256:[0-9a-f]{64}$"
# A null count inside nodes_per_provider reads like an absent key in Arrow; the model refuses it.
_NULL_COUNT = re.compile(rb'"nodes_per_provider"\s*:\s*\{[^}\n]*?:\s*null')


@dataclass
class _Block:
    """Rows parsed from one block of whole lines."""

    tables: list[pa.Table] = field(default_factory=list)
    bad: list[BadLine] = field(default_factory=list)


def _excerpt(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace").rstrip("\r")
    return text if len(text) <= 120 else text[:117] + "..."


def _validation_message(error: ValidationError) -> str:
    parts = []
    for item in error.errors()[:3]:
        where = ".".join(str(p) for p in item["loc"]) or "(line)"
        parts.append(f"{where}: {item['msg']}")
    more = error.error_count() - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def _row_of(event: TelemetryEvent, line: int) -> dict[str, Any]:
    row = event.model_dump()
    del row["format"]
    row["nodes_per_provider"] = (
        None if event.nodes_per_provider is None else list(event.nodes_per_provider.items())
    )
    row["line"] = line
    return row


def _validate_lines(
    lines: Iterable[tuple[int, bytes]], block: _Block, rows: list[dict[str, Any]]
) -> None:
    """The model's verdict on each (line number, bytes): a row, or a bad line."""
    for number, raw in lines:
        if len(raw) > MAX_LINE_BYTES:
            block.bad.append(BadLine(number, _too_long(len(raw)), _excerpt(raw[:200])))
            continue
        try:
            event = TelemetryEvent.model_validate_json(raw)
        except ValidationError as error:
            block.bad.append(BadLine(number, _validation_message(error), _excerpt(raw)))
            continue
        rows.append(_row_of(event, number))


def _too_long(size: int | None) -> str:
    got = "" if size is None else f" ({size:,} bytes)"
    return f"line longer than {MAX_LINE_BYTES:,} bytes{got}; not an event (skipped unread)"


def _line_ends(data: bytes) -> npt.NDArray[np.int64]:
    """Offsets of the newlines of a block (one per line; the block ends with one)."""
    return np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10).astype(np.int64)


def _nonblank_lines(data: bytes, ends: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """0-based indices of the lines that hold something besides whitespace."""
    starts = np.concatenate(([0], ends[:-1] + 1)).astype(np.int64)
    lengths = ends - starts
    # Only short lines can be blank in practice; look at those one by one.
    keep = np.ones(ends.size, dtype=bool)
    for i in np.flatnonzero(lengths < 64).tolist():
        keep[i] = bool(data[int(starts[i]) : int(ends[i])].strip())
    for i in np.flatnonzero(lengths >= 64).tolist():
        if not data[int(starts[i]) : int(ends[i])].strip():
            keep[i] = False
    return np.flatnonzero(keep).astype(np.int64)


def _nodes_map(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """The inferred struct<provider: int64, ...> as map<string, int64> (absent keys dropped)."""
    struct = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    n = len(struct)
    names = [struct.type.field(i).name for i in range(struct.type.num_fields)]
    if not names:
        counts = np.zeros((n, 0), dtype=np.int64)
        present = np.zeros((n, 0), dtype=bool)
    else:
        children = [struct.field(i) for i in range(len(names))]
        counts = np.column_stack(
            [c.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64) for c in children]
        )
        present = np.column_stack([c.is_valid().to_numpy(zero_copy_only=False) for c in children])
    valid = struct.is_valid().to_numpy(zero_copy_only=False)
    present &= valid[:, None]
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(present.sum(axis=1), out=offsets[1:])
    keys = pa.array(np.broadcast_to(np.array(names, dtype=object), present.shape)[present])
    items = pa.array(counts[present], type=pa.int64())
    mask = pa.array(~valid)
    return pa.MapArray.from_arrays(pa.array(offsets), keys, items, mask=mask)


def _over(values: pa.Array | pa.ChunkedArray, most: int) -> npt.NDArray[np.bool_]:
    """Where ``values`` exceed ``most`` (a null is not over)."""
    return np.asarray(
        pc.greater(values, most).fill_null(False).to_numpy(zero_copy_only=False), dtype=bool
    )


def _suspects(table: pa.Table) -> npt.NDArray[np.bool_]:
    """Rows the vectorised rules cannot vouch for (the model re-validates them)."""

    def bad(expr: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.bool_]:
        return np.asarray(expr.fill_null(True).to_numpy(zero_copy_only=False), dtype=bool)

    def col(name: str) -> pa.ChunkedArray:
        return table.column(name)

    def nonempty_missing(name: str) -> npt.NDArray[np.bool_]:
        return bad(pc.invert(pc.greater(pc.utf8_length(col(name)), 0)))

    flags = bad(pc.not_equal(col("format"), TELEMETRY_FORMAT))
    flags |= bad(pc.invert(pc.match_substring_regex(col("time"), _TIME_RE)))
    flags |= bad(pc.invert(pc.is_in(col("source"), pa.array(["resolve", "session"]))))
    flags |= bad(
        pc.invert(pc.is_in(col("placement"), pa.array(["actual", "registered", "requested"])))
    )
    for name in ("host_id", "host_class", "runtime_revision"):
        flags |= nonempty_missing(name)
    for name in ("host_id", "host_class", "runtime_revision", "runtime_package", "rollout"):
        flags |= _over(pc.utf8_length(col(name)), MAX_TEXT_CHARS)
    flags |= nonempty_missing("rollout") & np.asarray(
        col("rollout").is_valid().to_numpy(zero_copy_only=False), dtype=bool
    )
    digest = col("model_digest")
    flags |= np.asarray(
        pc.and_(
            digest.is_valid(), pc.invert(pc.match_substring_regex(digest, _DIGEST_RE))
        ).to_numpy(zero_copy_only=False),
        dtype=bool,
    )
    decision = col("decision")
    flags |= np.asarray(
        pc.and_(
            decision.is_valid(),
            pc.invert(pc.is_in(decision, pa.array(["candidate", "baseline", "hold"]))),
        ).to_numpy(zero_copy_only=False),
        dtype=bool,
    )
    cohort = col("cohort")
    flags |= np.asarray(
        pc.and_(
            cohort.is_valid(), pc.invert(pc.is_in(cohort, pa.array(["canary", "rest"])))
        ).to_numpy(zero_copy_only=False),
        dtype=bool,
    )
    flags |= _bad_settings(col("settings"))
    providers = col("providers").combine_chunks()
    flags |= np.asarray(providers.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    flags |= _over(pc.list_value_length(providers), MAX_PROVIDERS)
    flat = pc.list_flatten(providers)
    too_long = _over(pc.utf8_length(flat), MAX_TEXT_CHARS)
    if flat.null_count or too_long.any():
        parents = pc.list_parent_indices(providers).to_numpy(zero_copy_only=False)
        wrong = flat.is_null().to_numpy(zero_copy_only=False) | too_long
        flags[np.unique(parents[wrong])] = True
    for name, low in (("fallback_nodes", 0), ("manifest_version", 1)):
        values = col(name)
        flags |= np.asarray(
            pc.less(values, low).fill_null(False).to_numpy(zero_copy_only=False), dtype=bool
        )
    latency = col("latency_ms").to_numpy(zero_copy_only=False)
    with np.errstate(invalid="ignore"):
        flags |= ~np.isnan(latency) & ~(np.isfinite(latency) & (latency >= 0))
    latency_valid = col("latency_ms").is_valid().to_numpy(zero_copy_only=False)
    flags |= latency_valid & np.isnan(latency)
    nodes = col("nodes_per_provider").combine_chunks()
    names = [nodes.type.field(i).name for i in range(nodes.type.num_fields)]
    if len(names) > MAX_PROVIDERS or any(len(n) > MAX_TEXT_CHARS for n in names):
        return np.ones(table.num_rows, dtype=bool)  # the model says which line and why
    for i in range(nodes.type.num_fields):
        child = nodes.field(i)
        if not pa.types.is_integer(child.type):
            return np.ones(table.num_rows, dtype=bool)
        flags |= np.asarray(
            pc.less(child, 0).fill_null(False).to_numpy(zero_copy_only=False), dtype=bool
        )
    return flags


def _bad_settings(column: pa.ChunkedArray) -> npt.NDArray[np.bool_]:
    """Rows whose ``settings`` do not decode: each distinct value is decoded once (a fleet
    runs a handful of settings, not one per event)."""
    flags = np.zeros(len(column), dtype=bool)
    if column.null_count == len(column):
        return flags
    wrong = []
    for value in pc.unique(column).to_pylist():
        if value is None:
            continue
        try:
            decode_settings(value)
        except ValueError:
            wrong.append(value)
    if wrong:
        hit = pc.is_in(column, pa.array(wrong, type=pa.string())).fill_null(False)
        flags |= np.asarray(hit.to_numpy(zero_copy_only=False), dtype=bool)
    return flags


def _absent_counts(table: pa.Table) -> bool:
    """Whether some row lacks a provider key another row has (or gives it null: Arrow cannot
    tell the two apart, the model can), so the block must be searched for null counts."""
    nodes = table.column("nodes_per_provider").combine_chunks()
    valid = nodes.is_valid()
    return any(
        pc.any(pc.and_(valid, nodes.field(i).is_null())).as_py()
        for i in range(nodes.type.num_fields)
    )


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _arrow_table(data: bytes) -> pa.Table | None:
    """The block as Arrow parsed it; None when only the model path can say what is wrong (an
    overlong line, a syntax error, an unknown key, node counts that are not an object)."""
    if len(data) > MAX_LINE_BYTES:
        newlines = _line_ends(data)
        if newlines.size and int(np.diff(newlines, prepend=-1).max()) > MAX_LINE_BYTES + 1:
            return None  # an overlong line: the model path reports it without parsing it
    if not data.isascii() and not _is_utf8(data):
        # pyarrow.json passes invalid UTF-8 inside strings through, and DuckDB then refuses the
        # whole insert: the model path reports the line instead.
        return None
    try:
        table = pj.read_json(io.BytesIO(data), parse_options=_PARSE_OPTIONS)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if table.num_columns != len(_PARSE_SCHEMA):
        return None  # an unknown key somewhere: the model names it
    if table.num_rows and not pa.types.is_struct(table.schema.field("nodes_per_provider").type):
        return None
    return table


def _mark_null_counts(
    data: bytes, row_lines: npt.NDArray[np.int64], suspects: npt.NDArray[np.bool_]
) -> None:
    """Mark as suspect the rows whose line gives some provider a null node count."""
    for found in _NULL_COUNT.finditer(data):
        index = data.count(b"\n", 0, found.start())
        hit = np.searchsorted(row_lines, index)
        if hit < row_lines.size and row_lines[hit] == index:
            suspects[hit] = True


def _fast(data: bytes, first_line: int, block: _Block) -> bool:
    """Parse a block with pyarrow; False when it must be read line by line instead."""
    table = _arrow_table(data)
    if table is None:
        return False
    if table.num_rows == 0:
        return not data.strip()
    row_lines, ends = _row_lines(data, table.num_rows)
    if row_lines is None:
        return False
    suspects = _suspects(table)
    if _absent_counts(table):
        _mark_null_counts(data, row_lines, suspects)
    keep = ~suspects
    rows: list[dict[str, Any]] = []
    if suspects.any():
        if ends is None:
            ends = _line_ends(data)
        starts = np.concatenate(([0], ends[:-1] + 1))
        _validate_lines(
            (
                (first_line + int(i), data[int(starts[i]) : int(ends[i])])
                for i in row_lines[suspects]
            ),
            block,
            rows,
        )
    good = table.filter(pa.array(keep)) if suspects.any() else table
    if good.num_rows:
        converted = _rows_table(good, row_lines[keep] + first_line)
        if converted is None:
            return False  # an impossible date; let the model say which line
        block.tables.append(converted)
    if rows:
        block.tables.append(pa.Table.from_pylist(rows, schema=_ROW_SCHEMA))
    return True


def _row_lines(
    data: bytes, rows: int
) -> tuple[npt.NDArray[np.int64] | None, npt.NDArray[np.int64] | None]:
    """The block line of each parsed row (and the line ends, when they had to be found); None
    when the rows cannot be mapped onto the lines."""
    line_count = data.count(b"\n")
    if rows == line_count:
        return np.arange(line_count, dtype=np.int64), None  # row i is line i of the block
    ends = _line_ends(data)  # Arrow skipped blank lines: map rows onto the others
    row_lines = _nonblank_lines(data, ends)
    return (row_lines, ends) if row_lines.size == rows else (None, ends)


def _rows_table(good: pa.Table, lines: npt.NDArray[np.int64]) -> pa.Table | None:
    """Parsed, validated rows in the stored schema; None when a time is not a real date."""
    try:
        times = pc.cast(good.column("time"), pa.timestamp("us", tz="UTC"))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return pa.table(
        {
            "time": times,
            "source": good.column("source"),
            "host_id": good.column("host_id"),
            "host_class": good.column("host_class"),
            "model_digest": good.column("model_digest"),
            "runtime_revision": good.column("runtime_revision"),
            "runtime_package": good.column("runtime_package"),
            "providers": good.column("providers"),
            "placement": good.column("placement"),
            "nodes_per_provider": _nodes_map(good.column("nodes_per_provider")),
            "fallback_nodes": good.column("fallback_nodes"),
            "latency_ms": good.column("latency_ms"),
            "manifest_version": good.column("manifest_version"),
            "decision": good.column("decision"),
            "rollout": good.column("rollout"),
            "cohort": good.column("cohort"),
            "settings": good.column("settings"),
            "line": pa.array(lines, type=pa.int64()),
        },
        schema=_ROW_SCHEMA,
    )


def _slow(data: bytes, first_line: int, block: _Block) -> None:
    rows: list[dict[str, Any]] = []
    lines = data.split(b"\n")[:-1]  # the block ends with a newline
    _validate_lines(
        ((first_line + i, raw) for i, raw in enumerate(lines) if raw.strip()), block, rows
    )
    if rows:
        block.tables.append(pa.Table.from_pylist(rows, schema=_ROW_SCHEMA))


def _parse_block(data: bytes, first_line: int) -> _Block:
    block = _Block()
    if not _fast(data, first_line, block):
        block = _Block()
        _slow(data, first_line, block)
    return block


# -- idempotency -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    sha256: str
    end: int  # bytes up to and including the last newline
    size: int
    resume_at: int  # bytes already ingested (a recorded prefix)
    resume_lines: int


def _read_blocks(handle: io.BufferedReader, size: int) -> Iterator[bytes]:
    while chunk := handle.read(size):
        yield chunk


def _plan(path: Path, known: dict[int, tuple[str, int]]) -> _Plan:
    """Hash the file once; find its last newline and the longest recorded prefix it extends."""
    digest = hashlib.sha256()
    position = 0
    end = 0
    end_hash = digest.copy()
    matched = (0, 0)
    lengths = sorted(known)
    with open(path, "rb") as handle:
        for chunk in _read_blocks(handle, BLOCK_BYTES):
            cuts = {
                length - position
                for length in lengths
                if position < length <= position + len(chunk)
            }
            last_nl = chunk.rfind(b"\n")
            if last_nl >= 0:
                cuts.add(last_nl + 1)
            done = 0
            for cut in sorted(cuts):
                digest.update(chunk[done:cut])
                done = cut
                at = position + cut
                if at in known and digest.hexdigest() == known[at][0]:
                    matched = (at, known[at][1])
                if last_nl >= 0 and cut == last_nl + 1:
                    end, end_hash = at, digest.copy()
            digest.update(chunk[done:])
            position += len(chunk)
    return _Plan(
        sha256="sha256:" + end_hash.hexdigest(),
        end=end,
        size=position,
        resume_at=matched[0],
        resume_lines=matched[1],
    )


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
    conn: duckdb.DuckDBPyConnection, table: pa.Table, columns: list[str], sha: str
) -> None:
    """Append one block's events, tagged with the file's digest, inside the open transaction.

    Through a relation over the Arrow table, not a registered view: a view dropped inside a
    transaction stays in the catalog, holding its Arrow table, until COMMIT, so every block of
    a file stayed in memory (measured: +290 MB per million events, 3.5 GB peak at 10 million).
    The projection lists the table's own columns in order, so the positional append cannot
    shift a column whatever order a migration left them in.
    """
    if not _SHA256_RE.fullmatch(sha):  # it goes into SQL text below
        raise ValueError(f"not a sha256 digest: {sha!r}")
    exprs = [f"'{sha}' AS file_sha256" if c == "file_sha256" else f'"{c}"' for c in columns]
    conn.from_arrow(table).project(", ".join(exprs)).insert_into("telemetry")


def _ingest_one(conn: duckdb.DuckDBPyConnection, path: Path, *, now: datetime) -> IngestedTelemetry:
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise TelemetryFileError(
                f"{path}: not a file; pass JSON-lines telemetry files", path=path
            )
        plan = _plan(path, _known_prefixes(conn, size))
    except OSError as error:
        raise TelemetryFileError(
            f"{path}: cannot read the telemetry file ({error.strerror}); check the path",
            path=path,
        ) from error
    pending = plan.size - plan.end
    first_line = plan.resume_lines + 1
    if plan.end == plan.resume_at:
        return IngestedTelemetry(path, plan.sha256, "present", first_line, 0, 0, 0, (), pending)
    tally = _Tally()
    conn.execute("BEGIN TRANSACTION")
    try:
        present = conn.execute(
            "SELECT count(*) FROM telemetry_files WHERE sha256 = ?", [plan.sha256]
        ).fetchall()
        if present[0][0]:
            conn.execute("ROLLBACK")
            return IngestedTelemetry(path, plan.sha256, "present", first_line, 0, 0, 0, (), pending)
        columns = _table_columns(conn, "telemetry")
        with open(path, "rb") as handle:
            handle.seek(plan.resume_at)
            for table in _blocks(handle, plan.end - plan.resume_at, first_line, tally):
                tally.events += table.num_rows
                _insert_events(conn, table, columns, plan.sha256)
        conn.execute(
            "INSERT INTO telemetry_files (sha256, path, start_byte, end_byte, start_line, "
            "end_line, events, bad_lines, ingested_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                plan.sha256,
                str(path),
                plan.resume_at,
                plan.end,
                first_line,
                first_line + tally.lines - 1,
                tally.events,
                tally.bad_count,
                now,
            ],
        )
        conn.execute("COMMIT")
    except BaseException:
        _rollback_quietly(conn)
        raise
    return IngestedTelemetry(
        path,
        plan.sha256,
        "ingested",
        first_line,
        tally.lines,
        tally.events,
        tally.bad_count,
        tuple(tally.bad),
        pending,
    )


@dataclass
class _Tally:
    """What one file's ingest has counted so far."""

    lines: int = 0
    events: int = 0
    bad_count: int = 0
    bad: list[BadLine] = field(default_factory=list)
    """The first `MAX_REPORTED_BAD_LINES` bad lines."""

    def report(self, lines: Sequence[BadLine]) -> None:
        self.bad.extend(lines[: max(0, MAX_REPORTED_BAD_LINES - len(self.bad))])


def _blocks(handle: BinaryIO, length: int, first_line: int, tally: _Tally) -> Iterator[pa.Table]:
    """The valid events of the next ``length`` bytes of ``handle``, a table per block of whole
    lines; bad lines, and lines longer than `MAX_LINE_BYTES` (dropped as they stream past,
    never held), are counted into ``tally``."""
    remaining = length
    carry = b""
    skipping = False  # inside a line longer than MAX_LINE_BYTES, dropped as it comes
    line_no = first_line
    while remaining > 0 or carry:
        chunk = handle.read(min(BLOCK_BYTES, remaining)) if remaining > 0 else b""
        remaining -= len(chunk)
        data = carry + chunk
        if skipping:
            nl = data.find(b"\n")
            if nl < 0:
                carry = b""
                continue
            data, skipping = data[nl + 1 :], False
            line_no += 1
            tally.lines += 1
        cut = data.rfind(b"\n") + 1 if remaining > 0 else len(data)
        data, carry = data[:cut], data[cut:]
        overlong: list[BadLine] = []
        if len(carry) > MAX_LINE_BYTES:
            overlong.append(BadLine(line_no + data.count(b"\n"), _too_long(None), ""))
            carry, skipping = b"", True
            tally.bad_count += 1
        if data:
            block = _parse_block(data, line_no)
            count = data.count(b"\n")
            line_no += count
            tally.lines += count
            tally.bad_count += len(block.bad)
            tally.report(block.bad)
            yield from block.tables
        tally.report(overlong)


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


# -- queries ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProfileRow:
    """Events of one (class, digest, runtime, placement kind, providers, fallback, settings) in
    the window.

    Attributes:
        host_class: The class the hosts reported.
        model_digest: The digest they ran (None: nothing, e.g. a class on hold).
        runtime_revision: The onnxruntime version they reported.
        placement: "actual", "registered" or "requested".
        providers: The providers, as reported (sorted).
        fallback_nodes: Nodes off the expected provider (None: placement unknown).
        events: Events.
        hosts: Distinct hosts.
        example_hosts: Up to five host ids, sorted.
        latency_samples: Events with a latency.
        first: Earliest event time.
        last: Latest event time.
        manifest_versions: Manifest versions the hosts reported, sorted (unknown left out).
        settings: The session settings the hosts reported (`schemas.settings` encoding; None:
            not reported).
    """

    host_class: str
    model_digest: str | None
    runtime_revision: str
    placement: str
    providers: tuple[str, ...]
    fallback_nodes: int | None
    events: int
    hosts: int
    example_hosts: tuple[str, ...]
    latency_samples: int
    first: datetime
    last: datetime
    manifest_versions: tuple[int, ...]
    settings: str | None = None


@dataclass(frozen=True)
class TelemetryProfile:
    """The window's events, grouped. ``class_hosts`` counts distinct hosts per class."""

    start: datetime
    end: datetime
    rows: tuple[ProfileRow, ...]
    class_events: dict[str, int]
    class_hosts: dict[str, int]


_PROFILE_SQL = """
WITH w AS (
    SELECT host_class, model_digest, runtime_revision, placement,
           list_sort(providers) AS providers, fallback_nodes, settings, host_id, latency_ms,
           time, manifest_version
    FROM telemetry
    WHERE time >= $start AND time <= $end {cohort}
),
h AS (
    SELECT host_class, model_digest, runtime_revision, placement, providers, fallback_nodes,
           settings, host_id, count(*) AS events, count(latency_ms) AS latency_samples,
           min(time) AS first, max(time) AS last,
           list(DISTINCT manifest_version) FILTER (WHERE manifest_version IS NOT NULL) AS mv
    FROM w
    GROUP BY ALL
)
SELECT host_class, model_digest, runtime_revision, placement, providers, fallback_nodes,
       sum(events)::BIGINT, count(*)::BIGINT, min(host_id, $examples),
       sum(latency_samples)::BIGINT, min(first), max(last),
       list_sort(list_distinct(flatten(list(mv)))), settings
FROM h
GROUP BY host_class, model_digest, runtime_revision, placement, providers, fallback_nodes,
         settings
ORDER BY host_class, model_digest NULLS FIRST, runtime_revision, placement, providers,
         fallback_nodes NULLS FIRST, settings NULLS FIRST
"""

_CLASS_SQL = """
SELECT host_class, count(*)::BIGINT, count(DISTINCT host_id)::BIGINT
FROM telemetry
WHERE time >= $start AND time <= $end {cohort}
GROUP BY host_class
"""

Cohort = tuple[str, str]
"""(rollout id, 'canary' or 'rest'): only the events of that side of that rollout; the rest
are every event not reported from its canary (hosts that report no rollout count as the rest)."""


def _cohort_filter(cohort: Cohort | None, alias: str = "") -> tuple[str, dict[str, str]]:
    if cohort is None:
        return "", {}
    rollout, side = cohort
    canary = f"coalesce({alias}rollout = $rollout AND {alias}cohort = 'canary', false)"
    if side == "canary":
        return f"AND {canary}", {"rollout": rollout}
    if side == "rest":
        return f"AND NOT {canary}", {"rollout": rollout}
    raise ValueError(f"a cohort is 'canary' or 'rest', not {side!r}")


def rollout_reported(store: Store, rollout: str, *, start: datetime, end: datetime) -> bool:
    """Whether any event of the window says it came from ``rollout``'s canary cohort."""
    row = store.connection.execute(
        "SELECT count(*) FROM telemetry WHERE time >= $start AND time <= $end AND "
        "rollout = $rollout AND cohort = 'canary'",
        {"start": start, "end": end, "rollout": rollout},
    ).fetchall()
    return bool(row and row[0][0])


def telemetry_profile(
    store: Store, *, start: datetime, end: datetime, cohort: Cohort | None = None
) -> TelemetryProfile:
    """The events of a time window, grouped for a check.

    Args:
        store: An open store (read-only is fine).
        start: Window start (inclusive, aware).
        end: Window end (inclusive, aware).
        cohort: Only one side of a staged rollout (see `Cohort`).

    Returns:
        One row per (class, digest, runtime, placement kind, providers, fallback), sorted, plus
        events and distinct hosts per class.
    """
    conn = store.connection
    where, extra = _cohort_filter(cohort)
    params: dict[str, Any] = {"start": start, "end": end, **extra}
    rows = conn.execute(
        _PROFILE_SQL.format(cohort=where), {**params, "examples": _EXAMPLE_HOSTS}
    ).fetchall()
    per_class = conn.execute(_CLASS_SQL.format(cohort=where), params).fetchall()
    return TelemetryProfile(
        start=start,
        end=end,
        rows=tuple(
            ProfileRow(
                host_class=str(r[0]),
                model_digest=r[1],
                runtime_revision=str(r[2]),
                placement=str(r[3]),
                providers=tuple(r[4] or ()),
                fallback_nodes=None if r[5] is None else int(r[5]),
                events=int(r[6]),
                hosts=int(r[7]),
                example_hosts=tuple(sorted(r[8] or ())),
                latency_samples=int(r[9]),
                first=r[10],
                last=r[11],
                manifest_versions=tuple(int(v) for v in r[12] or ()),
                settings=r[13],
            )
            for r in rows
        ),
        class_events={str(r[0]): int(r[1]) for r in per_class},
        class_hosts={str(r[0]): int(r[2]) for r in per_class},
    )


def latency_tails(
    store: Store,
    *,
    start: datetime,
    end: datetime,
    wanted: dict[tuple[str, str], int],
    cohort: Cohort | None = None,
) -> dict[tuple[str, str], npt.NDArray[np.float64]]:
    """The largest latencies of chosen (class, digest) pairs in a window, largest first.

    A p99 and its confidence bounds are order statistics near the top, so only the tail is
    read, never every sample: one pass over the window keeping the top ``max(wanted)`` values
    per pair.

    Args:
        store: An open store.
        start: Window start (inclusive).
        end: Window end (inclusive).
        wanted: (host class, model digest) -> how many of the largest latencies to return.
        cohort: Only one side of a staged rollout (see `Cohort`).

    Returns:
        (host class, model digest) -> latencies in ms, descending, at most the number asked
        (fewer when the pair has fewer samples); pairs with no latency are absent.
    """
    wanted = {pair: count for pair, count in wanted.items() if count > 0}
    if not wanted:
        return {}
    pairs = pa.table(
        {
            "host_class": [pair[0] for pair in wanted],
            "model_digest": [pair[1] for pair in wanted],
        }
    )
    conn = store.connection
    where, extra = _cohort_filter(cohort, "t.")
    conn.register("_wanted_pairs", pairs)
    try:
        rows = conn.execute(
            "SELECT t.host_class, t.model_digest, max(t.latency_ms, $top) "
            "FROM telemetry AS t SEMI JOIN _wanted_pairs AS p "
            "ON t.host_class = p.host_class AND t.model_digest = p.model_digest "
            f"WHERE t.time >= $start AND t.time <= $end AND t.latency_ms IS NOT NULL {where} "
            "GROUP BY t.host_class, t.model_digest",
            {"start": start, "end": end, "top": max(wanted.values()), **extra},
        ).fetchall()
    finally:
        conn.unregister("_wanted_pairs")
    found: dict[tuple[str, str], npt.NDArray[np.float64]] = {}
    for host_class, digest, values in rows:
        pair = (str(host_class), str(digest))
        tail = np.sort(np.asarray(values, dtype=np.float64))[::-1]
        found[pair] = tail[: wanted[pair]].copy()
    return found


def revisions_by_class(
    store: Store, *, start: datetime, end: datetime
) -> dict[str, dict[str, int]]:
    """Runtime revisions reported per class in a window, with the number of distinct hosts.

    Args:
        store: An open store.
        start: Window start (inclusive).
        end: Window end (inclusive).

    Returns:
        host class -> {runtime revision: hosts}.
    """
    rows = store.connection.execute(
        "SELECT host_class, runtime_revision, count(DISTINCT host_id) FROM telemetry "
        "WHERE time >= $start AND time <= $end GROUP BY ALL",
        {"start": start, "end": end},
    ).fetchall()
    found: dict[str, dict[str, int]] = {}
    for host_class, revision, hosts in rows:
        found.setdefault(str(host_class), {})[str(revision)] = int(hosts)
    return found
