"""The per-line checks of a telemetry ingest: which rows of a parsed block the vectorised rules
vouch for, and the event model's verdict on each line they do not (a row, or a bad line with its
message).

The vectorised rules are a subset of ``schemas.telemetry.TelemetryEvent``'s: a row they pass,
the model passes too, and any other is read again by the model, which says what is wrong. Does
not own reading blocks (``matrix.telemetry.blocks``) nor the event model itself.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
from pyarrow.compute import MatchSubstringOptions, SetLookupOptions

from matrix.telemetry.arrow import not_null, numbers, truth
from schemas.settings import MAX_SETTINGS_CHARS, decode_settings
from schemas.telemetry_format import MAX_PROVIDERS, MAX_TEXT_CHARS, TELEMETRY_FORMAT

if TYPE_CHECKING:
    from pydantic import ValidationError

    from schemas.telemetry import TelemetryEvent

__all__ = [
    "MAX_LINE_BYTES",
    "BadLine",
    "Data",
    "absent_counts",
    "mark_null_counts",
    "suspect_rows",
    "too_long",
    "validate_lines",
]

Data = bytes | bytearray
"""A block of whole lines (or one line) as read: the buffer the ingest read it into, or bytes."""


MAX_LINE_BYTES = 1 << 20
"""Longest line read as an event (a real one is a few hundred bytes); a longer one is a bad
line, skipped without being held whole, so memory stays one block whatever a host wrote."""


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


# Strict RFC 3339 with an offset: a subset of what the model accepts, so a row that passes here
# passes there (anything else is re-validated by the model).
_TIME_RE = (
    r"^\d{4}-\d{2}-\d{2}T([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,6})?"
    r"(Z|[+-](0\d|1[0-4]):[0-5]\d)$"
)
_TIME_MATCH = MatchSubstringOptions(_TIME_RE)
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


def _excerpt(raw: Data) -> str:
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


def validate_lines(
    lines: Iterable[tuple[int, Data]], bad: list[BadLine], rows: list[dict[str, Any]]
) -> None:
    """The model's verdict on each (line number, bytes): a row (as `matrix.telemetry.blocks`
    stores it) appended to ``rows``, or a bad line appended to ``bad``."""
    # Loaded here: only the lines the fast path cannot vouch for need pydantic and the model.
    from pydantic import ValidationError

    from schemas.telemetry import TelemetryEvent

    for number, raw in lines:
        if len(raw) > MAX_LINE_BYTES:
            bad.append(BadLine(number, too_long(len(raw)), _excerpt(raw[:200])))
            continue
        try:
            event = TelemetryEvent.model_validate_json(raw)
        except ValidationError as error:
            bad.append(BadLine(number, _validation_message(error), _excerpt(raw)))
            continue
        rows.append(_row_of(event, number))


def too_long(size: int | None) -> str:
    """What a bad line longer than `MAX_LINE_BYTES` is told (``size``: its bytes, if known)."""
    got = "" if size is None else f" ({size:,} bytes)"
    return f"line longer than {MAX_LINE_BYTES:,} bytes{got}; not an event (skipped unread)"


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
    flags: npt.NDArray[np.bool_] = wrong[numbers(where, np.int32)] | ~not_null(where)
    return flags


def _bad_text(column: pa.Array | pa.ChunkedArray, *, nullable: bool) -> npt.NDArray[np.bool_]:
    """Rows whose text is null (unless ``nullable``), empty or over `MAX_TEXT_CHARS`; bytes
    bound characters, so characters are counted only where the bytes exceed the limit."""
    valid = not_null(column)
    size = numbers(pc.call_function("binary_length", [column]), np.int32)
    bad: npt.NDArray[np.bool_] = valid & (size == 0)
    if not nullable:
        bad |= ~valid
    long = valid & (size > MAX_TEXT_CHARS)
    if long.any():
        bad |= long & (
            numbers(pc.call_function("utf8_length", [column]), np.int32) > MAX_TEXT_CHARS
        )
    return bad


def suspect_rows(table: pa.Table) -> npt.NDArray[np.bool_]:
    """Rows of a parsed block the vectorised rules cannot vouch for (the model re-validates
    them)."""
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
    flags |= ~truth(pc.call_function("match_substring_regex", [time], _TIME_MATCH))
    providers = col("providers").combine_chunks()
    valid = not_null(providers)
    flags |= ~valid
    flags |= valid & (
        numbers(pc.call_function("list_value_length", [providers]), np.int32) > MAX_PROVIDERS
    )
    flat = pc.call_function("list_flatten", [providers])
    wrong_item = _bad_text(flat, nullable=False)
    if wrong_item.any():
        parents = numbers(pc.call_function("list_parent_indices", [providers]), np.int64)
        flags[np.unique(parents[wrong_item])] = True
    for name, low in (("fallback_nodes", 0), ("manifest_version", 1)):
        values = col(name)
        flags |= not_null(values) & (numbers(values, np.int64) < low)
    latency = col("latency_ms")
    with np.errstate(invalid="ignore"):
        values = numbers(latency, np.float64)
        flags |= not_null(latency) & ~(np.isfinite(values) & (values >= 0))
    nodes = col("nodes_per_provider").combine_chunks()
    names = [nodes.type.field(i).name for i in range(nodes.type.num_fields)]
    if len(names) > MAX_PROVIDERS or not all(_text(name) for name in names):
        return everything  # the model says which line and why
    for i in range(nodes.type.num_fields):
        child = nodes.field(i)
        if not pa.types.is_integer(child.type):
            return everything
        flags |= not_null(child) & (numbers(child, np.int64) < 0)
    return flags


def absent_counts(table: pa.Table) -> npt.NDArray[np.bool_]:
    """Rows that lack a provider key another row has (or give it null: Arrow cannot tell the
    two apart, the model can); their lines must be searched for null counts."""
    nodes = table.column("nodes_per_provider").combine_chunks()
    lacking = np.zeros(len(nodes), dtype=bool)
    for i in range(nodes.type.num_fields):
        lacking |= ~not_null(nodes.field(i))
    return lacking & not_null(nodes)


def mark_null_counts(
    data: Data,
    line_ends: npt.NDArray[np.int64],
    row_lines: npt.NDArray[np.int64],
    lacking: npt.NDArray[np.bool_],
    names: list[str],
    suspects: npt.NDArray[np.bool_],
) -> None:
    """Mark as suspect the rows whose line gives some provider a null node count.

    Args:
        data: The block.
        line_ends: Where its lines end (the offsets of its newlines).
        row_lines: The block line of each parsed row.
        lacking: The rows `absent_counts` found.
        names: The providers the block's node counts name.
        suspects: The rows already suspect, marked in place.
    """
    if any("}" in name for name in names):
        suspects |= lacking  # the search below stops at a brace; let the model read them
        return
    if _NULL.search(data) is None:
        return  # no line holds a null at all (one search of the block)
    line_of = line_ends
    for found in _NULL_COUNT.finditer(data):
        index = int(np.searchsorted(line_of, found.start()))
        hit = np.searchsorted(row_lines, index)
        if hit < row_lines.size and row_lines[hit] == index:
            suspects[hit] = True
