"""One block of whole lines of a telemetry file, parsed into the rows the ``telemetry`` table
stores, and its bad lines.

A block is parsed whole by pyarrow where it can be (the fast path: vectorised checks, columns
built through their buffers, node counts dictionary-encoded), else line by line by the event
model; either way the rows are the same. Does not own the checks themselves
(``matrix.telemetry.checks``), reading the file in blocks or storing them
(``matrix.telemetry.ingest``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
from pyarrow.compute import CastOptions

from matrix.telemetry import checks
from matrix.telemetry.arrow import (
    arrow_bool,
    arrow_numbers,
    arrow_strings,
    dictionary_codes,
    not_null,
    numbers,
)

__all__ = ["FAST_ROW_SCHEMA", "Block", "parse_block"]

# What comes from ``checks`` is read through the module, ``checks.MAX_LINE_BYTES`` above all:
# one limit for the stream, the block and the line, wherever it is changed (tests lower it).

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
`FAST_ROW_SCHEMA`)."""

FAST_ROW_SCHEMA = _ROW_SCHEMA.set(
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


_TO_TIMESTAMP = CastOptions.safe(pa.timestamp("us", tz="UTC"))
_OBJECT_FIRST = re.compile(rb"[ \t\r\n]*\{")


@dataclass
class Block:
    """Rows parsed from one block of whole lines (`parse_block`)."""

    tables: list[pa.Table] = field(default_factory=list)
    bad: list[checks.BadLine] = field(default_factory=list)
    lines: int = 0
    """Lines in the block (its newlines)."""


def _line_ends(data: checks.Data) -> npt.NDArray[np.int64]:
    """Offsets of the newlines of a block (one per line; the block ends with one)."""
    return np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10).astype(np.int64)


def _nonblank_lines(data: checks.Data, ends: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
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


def _has_overlong_line(data: checks.Data) -> bool:
    """Whether two newlines of the block (or its start and a newline) are more than
    ``MAX_LINE_BYTES`` apart: a jump of a window at a time, not a look at every byte."""
    start = 0
    while len(data) - start > checks.MAX_LINE_BYTES + 1:
        last = data.rfind(b"\n", start, start + checks.MAX_LINE_BYTES + 1)
        if last < 0:
            return True
        start = last + 1
    return False


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
    # Keys in sorted order, as the model path stores them (``checks.validate_lines``): the same
    # counts make the same MAP whichever order a host wrote them in, and whichever path read it.
    fields = sorted(range(struct.type.num_fields), key=lambda f: struct.type.field(f).name)
    names = [struct.type.field(f).name for f in fields]
    valid = not_null(struct)
    counts = np.zeros((n, len(names)), dtype=np.int64)
    present = np.zeros((n, len(names)), dtype=bool)
    # One int64 key per row, equal for rows with the same map: per provider, 0 when absent, else
    # 1 + the index of its count among that provider's distinct counts (mixed radix, re-coded
    # before it could overflow).
    key = np.zeros(n, dtype=np.int64)
    span = 1
    for i, f in enumerate(fields):
        child = struct.field(f)
        present[:, i] = not_null(child) & valid
        counts[:, i] = numbers(child, np.int64)
        code, distinct = dictionary_codes(child)
        radix = distinct + 1
        if span * radix >= 1 << 62:
            recoded, span = dictionary_codes(arrow_numbers(key, pa.int64()))
            key = recoded.astype(np.int64)
        key = key * radix + np.where(present[:, i], code + 1, 0)
        span *= radix
    index, distinct = dictionary_codes(arrow_numbers(key, pa.int64()))
    # Indices come in order of first appearance: a row shows a new map where their running
    # maximum grows. The dictionary holds the map of that row.
    seen = np.maximum.accumulate(index)
    first = np.flatnonzero(np.diff(seen, prepend=-1) > 0)
    present, counts = present[first], counts[first]
    offsets = np.zeros(distinct + 1, dtype=np.int32)
    np.cumsum(present.sum(axis=1), out=offsets[1:])
    which = np.broadcast_to(np.arange(len(names), dtype=np.int32), present.shape)[present]
    keys = pc.call_function(
        "take", [arrow_strings(names), arrow_numbers(np.ascontiguousarray(which), pa.int32())]
    )
    items = arrow_numbers(np.ascontiguousarray(counts[present]), pa.int64())
    maps = pa.MapArray.from_arrays(arrow_numbers(offsets, pa.int32()), keys, items)
    return _dictionary(index, valid, maps)


def _dictionary(
    index: npt.NDArray[np.int32], valid: npt.NDArray[np.bool_], maps: pa.MapArray
) -> pa.DictionaryArray:
    """Node counts as DuckDB takes them in (`FAST_ROW_SCHEMA`): row i is ``maps[index[i]]``,
    null where ``valid`` is False."""
    bits = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    indices = pa.Array.from_buffers(pa.int32(), len(index), [bits, pa.py_buffer(index)])
    return pa.DictionaryArray.from_arrays(indices, maps)


def _model_rows(rows: list[dict[str, Any]]) -> pa.Table:
    """Rows the model read (``checks.validate_lines``) in the schema of the fast path's: their
    node counts a dictionary of their own maps (Arrow cannot dictionary-encode a map)."""
    table = pa.Table.from_pylist(rows, schema=_ROW_SCHEMA)
    at = table.schema.get_field_index("nodes_per_provider")
    maps = table.column(at).combine_chunks()
    encoded = _dictionary(np.arange(len(maps), dtype=np.int32), not_null(maps), maps)
    return pa.Table.from_arrays(
        [encoded if i == at else table.column(i) for i in range(table.num_columns)],
        schema=FAST_ROW_SCHEMA,
    )


def _is_utf8(data: checks.Data) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _arrow_table(data: checks.Data) -> pa.Table | None:
    """The block as Arrow parsed it; None when only the model path can say what is wrong (an
    overlong line, a syntax error, an unknown key, node counts that are not an object)."""
    if len(data) > checks.MAX_LINE_BYTES and _has_overlong_line(data):
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

    def __init__(self, data: checks.Data, ends: npt.NDArray[np.int64]) -> None:
        self.data = data
        self.ends = ends
        self.count = ends.size

    def text(self, index: int) -> checks.Data:
        ends = self.ends
        start = int(ends[index - 1]) + 1 if index else 0
        return self.data[start : int(ends[index])]


def _fast(lines: _Lines, first_line: int, block: Block) -> bool:
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
    suspects = checks.suspect_rows(table)
    lacking = checks.absent_counts(table)
    if lacking.any():
        nodes = table.schema.field("nodes_per_provider").type
        names = [nodes.field(i).name for i in range(nodes.num_fields)]
        checks.mark_null_counts(lines.data, lines.ends, row_lines, lacking, names, suspects)
    rows: list[dict[str, Any]] = []
    if suspects.any():
        checks.validate_lines(
            ((first_line + int(i), lines.text(int(i))) for i in row_lines[suspects]),
            block.bad,
            rows,
        )
        keep = ~suspects
        good = pc.call_function("filter", [table, arrow_bool(keep)])
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
    columns.append(arrow_numbers(np.ascontiguousarray(lines, dtype=np.int64), pa.int64()))
    return pa.Table.from_arrays(columns, schema=FAST_ROW_SCHEMA)


def _slow(data: checks.Data, first_line: int, block: Block) -> None:
    rows: list[dict[str, Any]] = []
    lines: list[checks.Data] = []
    lines.extend(data.split(b"\n")[:-1])  # the block ends with a newline
    checks.validate_lines(
        ((first_line + i, raw) for i, raw in enumerate(lines) if raw.strip()), block.bad, rows
    )
    if rows:
        block.tables.append(_model_rows(rows))


def parse_block(data: checks.Data, first_line: int) -> Block:
    """The events of a block of whole lines (it ends with a newline), its bad lines and its
    line count.

    Args:
        data: The block (the ingest's own buffer; only read).
        first_line: The file's line number of its first line (1-based).
    """
    # numpy compares every byte at once: ~5x faster than ``bytes.count`` on an 8 MiB block, and
    # the fast path maps rows onto these lines.
    lines = _Lines(data, _line_ends(data))
    count = lines.count
    block = Block(lines=count)
    if not _fast(lines, first_line, block):
        block = Block(lines=count)
        _slow(data, first_line, block)
    return block
