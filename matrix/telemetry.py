"""Telemetry in the matrix: bulk, idempotent ingest of JSON-lines events and the window queries.

Owns reading ``qualify-telemetry/1`` files into the ``telemetry`` table in blocks (pyarrow, with
vectorised checks; a refused row or block is re-read with the pydantic model for its message),
the record of ingested prefixes (``telemetry_files``) and the aggregates a check reads. Does not
own the event model (``schemas.telemetry``) nor judging events (``qualify.telemetry.check``).
"""

from __future__ import annotations

import errno
import hashlib
import os
import queue
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from io import BufferedReader
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import duckdb
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
from pyarrow.compute import CastOptions, MatchSubstringOptions, SetLookupOptions

from matrix.errors import MatrixError, TelemetryFileError
from matrix.migrations import _rollback_quietly
from matrix.store import Store
from matrix.telemetry_scope import Attribution, Cohort, Versions, scope_sql
from schemas.settings import MAX_SETTINGS_CHARS, decode_settings
from schemas.telemetry_format import MAX_PROVIDERS, MAX_TEXT_CHARS, TELEMETRY_FORMAT

if TYPE_CHECKING:
    from pydantic import ValidationError

    from schemas.telemetry import TelemetryEvent

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

_Data = bytes | bytearray
"""A block of whole lines (or one line) as read: the buffer `_blocks` read it into, or bytes."""

BLOCK_BYTES = 6 << 20
"""Bytes read per block (whole lines); bounds memory whatever the file size. Smaller blocks
lower the peak and cost time per block: the measurements that chose 6 MiB are in
docs/measurements.md."""

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
        ("model", pa.string()),
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
"""The rows: the parsed columns less ``format``, typed for the table, plus ``line`` (inserted as
`_FAST_ROW_SCHEMA`)."""

_FAST_ROW_SCHEMA = _ROW_SCHEMA.set(
    _ROW_SCHEMA.get_field_index("nodes_per_provider"),
    pa.field(
        "nodes_per_provider",
        pa.dictionary(pa.int32(), _ROW_TYPES["nodes_per_provider"]),
    ),
)
"""The rows inserted, from either path: `_ROW_SCHEMA` with the node counts dictionary-encoded
(`_nodes_map`, `_model_rows`)."""

_PARSE_NAMES = frozenset(_PARSE_SCHEMA.names)

_PARSE_REQUIRED = (
    "format",
    "time",
    "source",
    "host_id",
    "host_class",
    "runtime_revision",
    "providers",
    "placement",
)
"""The fields pyarrow is told the type of: those every event carries (the time above all must
stay text, not become a timestamp pyarrow infers from it). An optional text field that pyarrow
infers as something else (every value of the block looks like a date) sends that block to the
model path: right, only slower."""

_PARSE_OPTIONS = pj.ParseOptions(
    explicit_schema=pa.schema([_PARSE_SCHEMA.field(name) for name in _PARSE_REQUIRED]),
    unexpected_field_behavior="infer",
    newlines_in_values=False,
)
"""The optional fields are inferred, then held to their type (`_conform`): measured on 8 MiB
blocks, each explicit field that a block lacks (an event need not send ``rollout``) costs
pyarrow ~2% of the parse, and the whole explicit schema ~9% over this one."""

# Strict RFC 3339 with an offset: a subset of what the model accepts, so a row that passes here
# passes there (anything else is re-validated by the model).
_TIME_RE = (
    r"^\d{4}-\d{2}-\d{2}T([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,6})?"
    r"(Z|[+-](0\d|1[0-4]):[0-5]\d)$"
)
_TIME_MATCH = MatchSubstringOptions(_TIME_RE)
_TO_TIMESTAMP = CastOptions.safe(pa.timestamp("us", tz="UTC"))
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# A null count inside nodes_per_provider reads like an absent key in Arrow; the model refuses it.
# Within a line (JSON's whitespace less the newline: a block pyarrow read has one object per
# line). Greedy: it matches on the lines the lazy ``[^}\n]*?`` matches on (a null before the
# map's end), in 5.5 ms per 6 MiB block against 7.5 ms; it runs on every block of a file that
# holds a null and more than one provider.
_NULL_COUNT = re.compile(rb'"nodes_per_provider"[ \t\r]*:[ \t\r]*\{[^}\n]*:[ \t\r]*null')
# Whether a block holds a null at all: sre's literal search takes ~60% of the time of
# ``b"null" in data`` (measured on 8 MiB blocks), whose last byte is a common one in JSON.
_NULL = re.compile(rb"null")
_OBJECT_FIRST = re.compile(rb"[ \t\r\n]*\{")


def _text(value: str | None) -> bool:
    return value is not None and 0 < len(value) <= MAX_TEXT_CHARS


def _settings_ok(value: str | None) -> bool:
    if value is None:
        return True
    if not 0 < len(value) <= MAX_SETTINGS_CHARS:
        return False
    try:
        decode_settings(value)
    except ValueError:
        return False
    return True


_VALUE_RULES: dict[str, Callable[[str | None], bool]] = {
    "format": lambda v: v == TELEMETRY_FORMAT,
    "source": lambda v: v in ("resolve", "session"),
    "placement": lambda v: v in ("actual", "registered", "requested"),
    "host_class": _text,
    "runtime_revision": _text,
    "runtime_package": lambda v: v is None or _text(v),
    "model_digest": lambda v: v is None or _DIGEST.fullmatch(v) is not None,
    "decision": lambda v: v in (None, "candidate", "baseline", "hold"),
    "rollout": lambda v: v is None or _text(v),
    "cohort": lambda v: v in (None, "canary", "rest"),
    "settings": _settings_ok,
    "model": lambda v: v is None or _text(v),
}
"""The model's rule for each low-cardinality text column, applied once per distinct value (a
fleet reports a handful of classes, digests, runtimes and settings, not one per event)."""


@dataclass
class _Block:
    """Rows parsed from one block of whole lines."""

    tables: list[pa.Table] = field(default_factory=list)
    bad: list[BadLine] = field(default_factory=list)
    lines: int = 0
    """Lines in the block (its newlines)."""


def _excerpt(raw: _Data) -> str:
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
        None if event.nodes_per_provider is None else sorted(event.nodes_per_provider.items())
    )
    row["line"] = line
    return row


def _validate_lines(
    lines: Iterable[tuple[int, _Data]], block: _Block, rows: list[dict[str, Any]]
) -> None:
    """The model's verdict on each (line number, bytes): a row, or a bad line."""
    # Loaded here: only the lines the fast path cannot vouch for need pydantic and the model.
    from pydantic import ValidationError

    from schemas.telemetry import TelemetryEvent

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


# Arrow <-> numpy through buffers: ``to_numpy``, ``pa.array`` and Python scalars make pyarrow
# import pandas (~0.12 s and ~35 MiB in a fresh process), which an ingest has no use for.


def _chunks(column: pa.Array | pa.ChunkedArray) -> list[pa.Array]:
    return list(column.chunks) if isinstance(column, pa.ChunkedArray) else [column]


def _bitmap(buffer: pa.Buffer | None, offset: int, length: int) -> npt.NDArray[np.bool_]:
    if buffer is None:
        return np.ones(length, dtype=bool)
    bits = np.unpackbits(np.frombuffer(buffer, dtype=np.uint8), bitorder="little")
    return bits[offset : offset + length].astype(bool)


def _join(parts: list[npt.NDArray[Any]], dtype: Any) -> npt.NDArray[Any]:
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def _valid(column: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.bool_]:
    """Where ``column`` is not null."""
    parts = []
    for chunk in _chunks(column):
        if chunk.null_count == 0:
            parts.append(np.ones(len(chunk), dtype=bool))
        elif chunk.null_count == len(chunk):
            parts.append(np.zeros(len(chunk), dtype=bool))
        else:
            parts.append(_bitmap(chunk.buffers()[0], chunk.offset, len(chunk)))
    return _join(parts, bool)


def _truth(column: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.bool_]:
    """A boolean column as numpy; null reads as False."""
    parts = [_bitmap(c.buffers()[1], c.offset, len(c)) for c in _chunks(column)]
    return _join(parts, bool) & _valid(column)


def _numbers(column: pa.Array | pa.ChunkedArray, dtype: Any) -> npt.NDArray[Any]:
    """The values of a fixed-width column as numpy (what a null holds is unspecified)."""
    parts = []
    for chunk in _chunks(column):
        data = chunk.buffers()[1] if len(chunk.buffers()) > 1 else None
        if data is None:
            parts.append(np.zeros(len(chunk), dtype=dtype))
        else:
            values = np.frombuffer(data, dtype=dtype)
            parts.append(values[chunk.offset : chunk.offset + len(chunk)])
    return _join(parts, dtype)


def _arrow_bool(mask: npt.NDArray[np.bool_]) -> pa.Array:
    bits = np.packbits(mask, bitorder="little")
    return pa.Array.from_buffers(pa.bool_(), len(mask), [None, pa.py_buffer(bits)])


def _arrow_numbers(values: npt.NDArray[Any], kind: pa.DataType) -> pa.Array:
    return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(values)])


def _arrow_strings(values: Sequence[str]) -> pa.Array:
    encoded = [v.encode() for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    return pa.Array.from_buffers(
        pa.string(), len(encoded), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
    )


def _line_ends(data: _Data) -> npt.NDArray[np.int64]:
    """Offsets of the newlines of a block (one per line; the block ends with one)."""
    return np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10).astype(np.int64)


def _nonblank_lines(data: _Data, ends: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
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


def _has_overlong_line(data: _Data) -> bool:
    """Whether two newlines of the block (or its start and a newline) are more than
    `MAX_LINE_BYTES` apart: a jump of a window at a time, not a look at every byte."""
    start = 0
    while len(data) - start > MAX_LINE_BYTES + 1:
        last = data.rfind(b"\n", start, start + MAX_LINE_BYTES + 1)
        if last < 0:
            return True
        start = last + 1
    return False


def _dictionary_codes(values: pa.Array) -> tuple[npt.NDArray[np.int32], int]:
    """Per row, the index of its value among the distinct values (in order of first
    appearance; hashed, not sorted), and how many distinct values there are; a null's index is
    unspecified."""
    encoded = pc.call_function("dictionary_encode", [values])
    return _numbers(encoded.indices, np.int32), len(encoded.dictionary)


def _nodes_map(column: pa.ChunkedArray | pa.Array) -> pa.DictionaryArray:
    """The inferred struct<provider: int64, ...> as map<string, int64> (absent keys dropped),
    dictionary-encoded: each distinct map once, and an index per row (null for a null row).

    DuckDB checks every MAP value it takes in for duplicate keys, row by row (measured: ~70% of
    the whole Arrow insert went to this one column); through a dictionary it checks each
    distinct map once, and a fleet reports a handful of them (node counts are per model and
    provider). The stored values are the same MAPs.
    """
    struct = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    n = len(struct)
    # Keys in sorted order, as the model path stores them (`_row_of`): the same counts make the
    # same MAP whichever order a host wrote them in, and whichever path read the line.
    fields = sorted(range(struct.type.num_fields), key=lambda f: struct.type.field(f).name)
    names = [struct.type.field(f).name for f in fields]
    valid = _valid(struct)
    counts = np.zeros((n, len(names)), dtype=np.int64)
    present = np.zeros((n, len(names)), dtype=bool)
    # One int64 key per row, equal for rows with the same map: per provider, 0 when absent, else
    # 1 + the index of its count among that provider's distinct counts (mixed radix, re-coded
    # before it could overflow).
    key = np.zeros(n, dtype=np.int64)
    span = 1
    for i, f in enumerate(fields):
        child = struct.field(f)
        present[:, i] = _valid(child) & valid
        counts[:, i] = _numbers(child, np.int64)
        code, distinct = _dictionary_codes(child)
        radix = distinct + 1
        if span * radix >= 1 << 62:
            recoded, span = _dictionary_codes(_arrow_numbers(key, pa.int64()))
            key = recoded.astype(np.int64)
        key = key * radix + np.where(present[:, i], code + 1, 0)
        span *= radix
    index, distinct = _dictionary_codes(_arrow_numbers(key, pa.int64()))
    # Indices come in order of first appearance: a row shows a new map where their running
    # maximum grows. The dictionary holds the map of that row.
    seen = np.maximum.accumulate(index)
    first = np.flatnonzero(np.diff(seen, prepend=-1) > 0)
    present, counts = present[first], counts[first]
    offsets = np.zeros(distinct + 1, dtype=np.int32)
    np.cumsum(present.sum(axis=1), out=offsets[1:])
    which = np.broadcast_to(np.arange(len(names), dtype=np.int32), present.shape)[present]
    keys = pc.call_function(
        "take", [_arrow_strings(names), _arrow_numbers(np.ascontiguousarray(which), pa.int32())]
    )
    items = _arrow_numbers(np.ascontiguousarray(counts[present]), pa.int64())
    maps = pa.MapArray.from_arrays(_arrow_numbers(offsets, pa.int32()), keys, items)
    return _dictionary(index, valid, maps)


def _dictionary(
    index: npt.NDArray[np.int32], valid: npt.NDArray[np.bool_], maps: pa.MapArray
) -> pa.DictionaryArray:
    """Node counts as DuckDB takes them in (`_FAST_ROW_SCHEMA`): row i is ``maps[index[i]]``,
    null where ``valid`` is False."""
    bits = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    indices = pa.Array.from_buffers(pa.int32(), len(index), [bits, pa.py_buffer(index)])
    return pa.DictionaryArray.from_arrays(indices, maps)


def _model_rows(rows: list[dict[str, Any]]) -> pa.Table:
    """Rows the model read (`_row_of`) in the schema of the fast path's: their node counts a
    dictionary of their own maps (Arrow cannot dictionary-encode a map)."""
    table = pa.Table.from_pylist(rows, schema=_ROW_SCHEMA)
    at = table.schema.get_field_index("nodes_per_provider")
    maps = table.column(at).combine_chunks()
    encoded = _dictionary(np.arange(len(maps), dtype=np.int32), _valid(maps), maps)
    return pa.Table.from_arrays(
        [encoded if i == at else table.column(i) for i in range(table.num_columns)],
        schema=_FAST_ROW_SCHEMA,
    )


def _bad_values(
    column: pa.ChunkedArray, ok: Callable[[str | None], bool]
) -> npt.NDArray[np.bool_] | None:
    """Rows whose value breaks ``ok``, judged once per distinct value; None when none does."""
    distinct = pc.call_function("unique", [column])
    try:
        values = distinct.to_pylist()
    except UnicodeDecodeError:
        return np.ones(len(column), dtype=bool)
    wrong = np.array([not ok(v) for v in values], dtype=bool)
    if not wrong.any():
        return None
    where = pc.call_function("index_in", [column], SetLookupOptions(distinct))
    flags: npt.NDArray[np.bool_] = wrong[_numbers(where, np.int32)] | ~_valid(where)
    return flags


def _bad_text(column: pa.Array | pa.ChunkedArray, *, nullable: bool) -> npt.NDArray[np.bool_]:
    """Rows whose text is null (unless ``nullable``), empty or over `MAX_TEXT_CHARS`; bytes
    bound characters, so characters are counted only where the bytes exceed the limit."""
    valid = _valid(column)
    size = _numbers(pc.call_function("binary_length", [column]), np.int32)
    bad: npt.NDArray[np.bool_] = valid & (size == 0)
    if not nullable:
        bad |= ~valid
    long = valid & (size > MAX_TEXT_CHARS)
    if long.any():
        bad |= long & (
            _numbers(pc.call_function("utf8_length", [column]), np.int32) > MAX_TEXT_CHARS
        )
    return bad


def _suspects(table: pa.Table) -> npt.NDArray[np.bool_]:
    """Rows the vectorised rules cannot vouch for (the model re-validates them)."""
    n = table.num_rows
    everything = np.ones(n, dtype=bool)

    def col(name: str) -> pa.ChunkedArray:
        return table.column(name)

    flags = np.zeros(n, dtype=bool)
    for name, ok in _VALUE_RULES.items():
        wrong = _bad_values(col(name), ok)
        if wrong is not None:
            flags |= wrong
    flags |= _bad_text(col("host_id"), nullable=False)
    time = col("time")
    flags |= ~_truth(pc.call_function("match_substring_regex", [time], _TIME_MATCH))
    providers = col("providers").combine_chunks()
    valid = _valid(providers)
    flags |= ~valid
    flags |= valid & (
        _numbers(pc.call_function("list_value_length", [providers]), np.int32) > MAX_PROVIDERS
    )
    flat = pc.call_function("list_flatten", [providers])
    wrong_item = _bad_text(flat, nullable=False)
    if wrong_item.any():
        parents = _numbers(pc.call_function("list_parent_indices", [providers]), np.int64)
        flags[np.unique(parents[wrong_item])] = True
    for name, low in (("fallback_nodes", 0), ("manifest_version", 1)):
        values = col(name)
        flags |= _valid(values) & (_numbers(values, np.int64) < low)
    latency = col("latency_ms")
    with np.errstate(invalid="ignore"):
        values = _numbers(latency, np.float64)
        flags |= _valid(latency) & ~(np.isfinite(values) & (values >= 0))
    nodes = col("nodes_per_provider").combine_chunks()
    names = [nodes.type.field(i).name for i in range(nodes.type.num_fields)]
    if len(names) > MAX_PROVIDERS or not all(_text(name) for name in names):
        return everything  # the model says which line and why
    for i in range(nodes.type.num_fields):
        child = nodes.field(i)
        if not pa.types.is_integer(child.type):
            return everything
        flags |= _valid(child) & (_numbers(child, np.int64) < 0)
    return flags


def _absent_counts(table: pa.Table) -> npt.NDArray[np.bool_]:
    """Rows that lack a provider key another row has (or give it null: Arrow cannot tell the
    two apart, the model can); their lines must be searched for null counts."""
    nodes = table.column("nodes_per_provider").combine_chunks()
    lacking = np.zeros(len(nodes), dtype=bool)
    for i in range(nodes.type.num_fields):
        lacking |= ~_valid(nodes.field(i))
    return lacking & _valid(nodes)


def _is_utf8(data: _Data) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _arrow_table(data: _Data) -> pa.Table | None:
    """The block as Arrow parsed it; None when only the model path can say what is wrong (an
    overlong line, a syntax error, an unknown key, node counts that are not an object)."""
    if len(data) > MAX_LINE_BYTES and _has_overlong_line(data):
        return None  # an overlong line: the model path reports it without parsing it
    if not data.isascii() and not _is_utf8(data):
        # pyarrow.json passes invalid UTF-8 inside strings through, and DuckDB then refuses the
        # whole insert: the model path reports the line instead.
        return None
    if _OBJECT_FIRST.match(data) is None:
        # pyarrow.json (26.0.1) crashes the process on a block whose first value is ``null``;
        # an event is an object, so the model path reads such a block and reports that line.
        return None
    try:
        table = pj.read_json(pa.BufferReader(data), parse_options=_PARSE_OPTIONS)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return _conform(table)


def _conform(table: pa.Table) -> pa.Table | None:
    """``table`` with `_PARSE_SCHEMA`'s columns, in its order and of its types; None when a
    column is of another type (a value pyarrow would not have read as that type: the model says
    which line), or is not a field of the event at all (an unknown key: the model names it).

    A field no line of the block gave, or gave only as null, is a column of nulls. Integral
    latencies alone read as int64 and are widened (exactly, or not at all)."""
    if not set(table.column_names) <= _PARSE_NAMES:
        return None
    columns: list[pa.Array | pa.ChunkedArray] = []
    for wanted in _PARSE_SCHEMA:
        if wanted.name not in table.column_names:
            columns.append(pa.nulls(table.num_rows, wanted.type))
            continue
        column = table.column(wanted.name)
        kind = column.type
        if kind == wanted.type or (
            wanted.name == "nodes_per_provider" and pa.types.is_struct(kind)
        ):
            columns.append(column)
        elif pa.types.is_null(kind):
            columns.append(pa.nulls(table.num_rows, wanted.type))
        elif wanted.type == pa.float64() and kind == pa.int64():
            try:
                columns.append(pc.call_function("cast", [column], CastOptions.safe(pa.float64())))
            except pa.ArrowInvalid:
                return None
        else:
            return None
    return pa.Table.from_arrays(columns, names=_PARSE_SCHEMA.names)


class _Lines:
    """A block and where its lines end (`_line_ends`)."""

    def __init__(self, data: _Data, ends: npt.NDArray[np.int64]) -> None:
        self.data = data
        self.ends = ends
        self.count = ends.size

    def text(self, index: int) -> _Data:
        ends = self.ends
        start = int(ends[index - 1]) + 1 if index else 0
        return self.data[start : int(ends[index])]


def _mark_null_counts(
    lines: _Lines,
    row_lines: npt.NDArray[np.int64],
    lacking: npt.NDArray[np.bool_],
    names: list[str],
    suspects: npt.NDArray[np.bool_],
) -> None:
    """Mark as suspect the rows whose line gives some provider a null node count."""
    if any("}" in name for name in names):
        suspects |= lacking  # the search below stops at a brace; let the model read them
        return
    if _NULL.search(lines.data) is None:
        return  # no line holds a null at all (one search of the block)
    line_of = lines.ends
    for found in _NULL_COUNT.finditer(lines.data):
        index = int(np.searchsorted(line_of, found.start()))
        hit = np.searchsorted(row_lines, index)
        if hit < row_lines.size and row_lines[hit] == index:
            suspects[hit] = True


def _fast(lines: _Lines, first_line: int, block: _Block) -> bool:
    """Parse a block with pyarrow; False when it must be read line by line instead."""
    data = lines.data
    table = _arrow_table(data)
    if table is None:
        return False
    if table.num_rows == 0:
        return not data.strip()
    row_lines = _row_lines(lines, table.num_rows)
    if row_lines is None:
        return False
    suspects = _suspects(table)
    lacking = _absent_counts(table)
    if lacking.any():
        nodes = table.schema.field("nodes_per_provider").type
        names = [nodes.field(i).name for i in range(nodes.num_fields)]
        _mark_null_counts(lines, row_lines, lacking, names, suspects)
    rows: list[dict[str, Any]] = []
    if suspects.any():
        _validate_lines(
            ((first_line + int(i), lines.text(int(i))) for i in row_lines[suspects]),
            block,
            rows,
        )
        keep = ~suspects
        good = pc.call_function("filter", [table, _arrow_bool(keep)])
        good_lines = row_lines[keep]
    else:
        good, good_lines = table, row_lines
    if good.num_rows:
        converted = _rows_table(good, good_lines + first_line)
        if converted is None:
            return False  # an impossible date; let the model say which line
        block.tables.append(converted)
    if rows:
        block.tables.append(_model_rows(rows))
    return True


def _row_lines(lines: _Lines, rows: int) -> npt.NDArray[np.int64] | None:
    """The block line of each parsed row; None when the rows cannot be mapped onto the lines.

    pyarrow gives no row for a blank line and at least one for any other (a line holding two
    values gives two): only as many rows as non-blank lines means one row per line. As many
    rows as lines is not enough by itself (a blank line and a line of two events make up for
    each other, and every row after them would be tagged with the wrong line).
    """
    if rows == lines.count and _no_blank_line(lines):
        return np.arange(rows, dtype=np.int64)  # row i is line i of the block
    row_lines = _nonblank_lines(lines.data, lines.ends)  # Arrow skipped blank lines
    return row_lines if row_lines.size == rows else None


def _no_blank_line(lines: _Lines) -> bool:
    """Whether every line of the block opens with ``{`` (as every line an event writer writes
    does): then none is blank. False says only that a line must be looked at."""
    ends = lines.ends
    starts = np.concatenate(([0], ends[:-1] + 1))
    return bool(np.all(np.frombuffer(lines.data, dtype=np.uint8)[starts] == ord("{")))


def _rows_table(good: pa.Table, lines: npt.NDArray[np.int64]) -> pa.Table | None:
    """Parsed, validated rows in the stored schema; None when a time is not a real date."""
    try:
        times = pc.call_function("cast", [good.column("time")], _TO_TIMESTAMP)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    columns = [
        times if name == "time" else good.column(name)
        for name in _ROW_SCHEMA.names
        if name not in ("nodes_per_provider", "line")
    ]
    at = _ROW_SCHEMA.get_field_index("nodes_per_provider")
    columns.insert(at, _nodes_map(good.column("nodes_per_provider")))
    columns.append(_arrow_numbers(np.ascontiguousarray(lines, dtype=np.int64), pa.int64()))
    return pa.Table.from_arrays(columns, schema=_FAST_ROW_SCHEMA)


def _slow(data: _Data, first_line: int, block: _Block) -> None:
    rows: list[dict[str, Any]] = []
    lines: list[_Data] = []
    lines.extend(data.split(b"\n")[:-1])  # the block ends with a newline
    _validate_lines(
        ((first_line + i, raw) for i, raw in enumerate(lines) if raw.strip()), block, rows
    )
    if rows:
        block.tables.append(_model_rows(rows))


def _parse_block(data: _Data, first_line: int) -> _Block:
    """The events of a block of whole lines (it ends with a newline), its bad lines and its
    line count."""
    # numpy compares every byte at once: ~5x faster than ``bytes.count`` on an 8 MiB block, and
    # the fast path maps rows onto these lines.
    lines = _Lines(data, _line_ends(data))
    count = lines.count
    block = _Block(lines=count)
    if not _fast(lines, first_line, block):
        block = _Block(lines=count)
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
    reader = pa.RecordBatchReader.from_batches(_FAST_ROW_SCHEMA, watched())
    try:
        conn.from_arrow(reader).project(", ".join(exprs)).insert_into("telemetry")
    except duckdb.Error:
        if failure:
            raise failure[0] from None
        raise


def _batches(tables: Iterable[pa.Table], tally: _Tally) -> Iterator[pa.RecordBatch]:
    """The blocks' events as batches (`_FAST_ROW_SCHEMA`), counted into ``tally`` as they go;
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
        _rollback_quietly(conn)
        raise _unreadable(path, error) from error
    except BaseException:
        _rollback_quietly(conn)
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
    bad: list[BadLine] = field(default_factory=list)
    """The first `MAX_REPORTED_BAD_LINES` bad lines."""

    def report(self, lines: Sequence[BadLine]) -> None:
        self.bad.extend(lines[: max(0, MAX_REPORTED_BAD_LINES - len(self.bad))])


def _blocks(
    handle: BufferedReader, length: int, first_line: int, tally: _Tally
) -> Iterator[pa.Table]:
    """The valid events of the next ``length`` bytes of ``handle``, a table per block of whole
    lines; bad lines, and lines longer than `MAX_LINE_BYTES` (dropped as they stream past,
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
            block = _parse_block(buffer, line_no)
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
        if len(carry) > MAX_LINE_BYTES:
            tally.report([BadLine(line_no, _too_long(None), "")])
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


# -- queries ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProfileRow:
    """Events of one (class, digest, runtime, placement kind, providers, fallback, settings,
    judged version) in the window.

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
        version: The manifest version these events are judged against
            (``matrix.telemetry_scope``): the one they report, or the one published at their
            time; None without versions given and none reported.
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
    version: int | None = None


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
           time, manifest_version, {judged} AS judged
    FROM telemetry
    WHERE {where}
),
h AS (
    SELECT host_class, model_digest, runtime_revision, placement, providers, fallback_nodes,
           settings, judged, host_id, count(*) AS events, count(latency_ms) AS latency_samples,
           min(time) AS first, max(time) AS last,
           list(DISTINCT manifest_version) FILTER (WHERE manifest_version IS NOT NULL) AS mv
    FROM w
    GROUP BY ALL
)
SELECT host_class, model_digest, runtime_revision, placement, providers, fallback_nodes,
       sum(events)::BIGINT, count(*)::BIGINT, min(host_id, $examples),
       sum(latency_samples)::BIGINT, min(first), max(last),
       list_sort(list_distinct(flatten(list(mv)))), settings, judged
FROM h
GROUP BY host_class, model_digest, runtime_revision, placement, providers, fallback_nodes,
         settings, judged
ORDER BY host_class, model_digest NULLS FIRST, runtime_revision, placement, providers,
         fallback_nodes NULLS FIRST, settings NULLS FIRST, judged NULLS FIRST
"""

_CLASS_SQL = """
SELECT host_class, count(*)::BIGINT, count(DISTINCT host_id)::BIGINT
FROM telemetry
WHERE {where}
GROUP BY host_class
"""


def rollout_reported(store: Store, rollout: str, *, start: datetime, end: datetime) -> bool:
    """Whether any event of the window says it came from ``rollout``'s canary cohort."""
    row = store.connection.execute(
        "SELECT count(*) FROM telemetry WHERE time >= $start AND time <= $end AND "
        "rollout = $rollout AND cohort = 'canary'",
        {"start": start, "end": end, "rollout": rollout},
    ).fetchall()
    return bool(row and row[0][0])


def _profile_row(r: tuple[Any, ...]) -> ProfileRow:
    """One row of ``_PROFILE_SQL`` as a `ProfileRow`."""
    return ProfileRow(
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
        version=None if r[14] is None else int(r[14]),
    )


def telemetry_profile(
    store: Store,
    *,
    start: datetime,
    end: datetime,
    cohort: Cohort | None = None,
    attribution: Attribution | None = None,
    versions: Versions | None = None,
) -> TelemetryProfile:
    """The events of a time window, grouped for a check.

    Args:
        store: An open store (read-only is fine).
        start: Window start (inclusive, aware).
        end: Window end (inclusive, aware).
        cohort: Only one side of a staged rollout (see `Cohort`).
        attribution: Only this model line's events (``matrix.telemetry_scope.Attribution``).
        versions: The published versions each group's judged version is read from
            (``matrix.telemetry_scope.Versions``).

    Returns:
        One row per (class, digest, runtime, placement kind, providers, fallback, settings,
        judged version), sorted, plus events and distinct hosts per class.
    """
    conn = store.connection
    where, judged, params = scope_sql(
        start=start, end=end, cohort=cohort, attribution=attribution, versions=versions
    )
    rows = conn.execute(
        _PROFILE_SQL.format(where=where, judged=judged), {**params, "examples": _EXAMPLE_HOSTS}
    ).fetchall()
    class_where, _, class_params = scope_sql(
        start=start, end=end, cohort=cohort, attribution=attribution
    )
    per_class = conn.execute(_CLASS_SQL.format(where=class_where), class_params).fetchall()
    return TelemetryProfile(
        start=start,
        end=end,
        rows=tuple(_profile_row(r) for r in rows),
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
    attribution: Attribution | None = None,
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
        attribution: Only this model line's events.

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
    where, _, params = scope_sql(
        start=start, end=end, cohort=cohort, attribution=attribution, alias="t."
    )
    conn.register("_wanted_pairs", pairs)
    try:
        rows = conn.execute(
            "SELECT t.host_class, t.model_digest, max(t.latency_ms, $top) "
            "FROM telemetry AS t SEMI JOIN _wanted_pairs AS p "
            "ON t.host_class = p.host_class AND t.model_digest = p.model_digest "
            f"WHERE t.latency_ms IS NOT NULL AND {where} "
            "GROUP BY t.host_class, t.model_digest",
            {**params, "top": max(wanted.values())},
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
    store: Store, *, start: datetime, end: datetime, attribution: Attribution | None = None
) -> dict[str, dict[str, int]]:
    """Runtime revisions reported per class in a window, with the number of distinct hosts.

    Args:
        store: An open store.
        start: Window start (inclusive).
        end: Window end (inclusive).
        attribution: Only this model line's events.

    Returns:
        host class -> {runtime revision: hosts}.
    """
    where, _, params = scope_sql(start=start, end=end, attribution=attribution)
    rows = store.connection.execute(
        "SELECT host_class, runtime_revision, count(DISTINCT host_id) FROM telemetry "
        f"WHERE {where} GROUP BY ALL",
        params,
    ).fetchall()
    found: dict[str, dict[str, int]] = {}
    for host_class, revision, hosts in rows:
        found.setdefault(str(host_class), {})[str(revision)] = int(hosts)
    return found
