"""Arrow columns as numpy arrays and back, through their buffers.

``to_numpy``, ``pa.array`` and Python scalars make pyarrow import pandas (~0.12 s and ~35 MiB
in a fresh process), which a telemetry ingest has no use for; these read and make columns from
their validity and data buffers instead. Owns nothing else: what the columns mean is
``matrix.telemetry.checks``' and ``matrix.telemetry.blocks``'.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "arrow_bool",
    "arrow_numbers",
    "arrow_strings",
    "dictionary_codes",
    "not_null",
    "numbers",
    "truth",
]


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


def not_null(column: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.bool_]:
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


def truth(column: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.bool_]:
    """A boolean column as numpy; null reads as False."""
    parts = [_bitmap(c.buffers()[1], c.offset, len(c)) for c in _chunks(column)]
    return _join(parts, bool) & not_null(column)


def numbers(column: pa.Array | pa.ChunkedArray, dtype: Any) -> npt.NDArray[Any]:
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


def arrow_bool(mask: npt.NDArray[np.bool_]) -> pa.Array:
    """``mask`` as a boolean Arrow array without nulls."""
    bits = np.packbits(mask, bitorder="little")
    return pa.Array.from_buffers(pa.bool_(), len(mask), [None, pa.py_buffer(bits)])


def arrow_numbers(values: npt.NDArray[Any], kind: pa.DataType) -> pa.Array:
    """``values`` (contiguous, of ``kind``'s width) as an Arrow array without nulls, sharing
    their memory."""
    return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(values)])


def arrow_strings(values: Sequence[str]) -> pa.Array:
    """``values`` as an Arrow string array without nulls."""
    encoded = [v.encode() for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    return pa.Array.from_buffers(
        pa.string(), len(encoded), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
    )


def dictionary_codes(values: pa.Array) -> tuple[npt.NDArray[np.int32], int]:
    """Per row, the index of its value among the distinct values (in order of first
    appearance; hashed, not sorted), and how many distinct values there are; a null's index is
    unspecified."""
    encoded = pc.call_function("dictionary_encode", [values])
    return numbers(encoded.indices, np.int32), len(encoded.dictionary)
