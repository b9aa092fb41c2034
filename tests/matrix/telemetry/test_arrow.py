"""Arrow columns read and made through their buffers agree with their values, whatever their
chunks and offsets."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from matrix.telemetry.arrow import arrow_bool, not_null, numbers, truth


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.one_of(st.none(), st.integers(-(2**40), 2**40)), max_size=70),
    cut=st.integers(0, 70),
    parts=st.integers(1, 4),
)
def test_arrow_columns_read_through_buffers_match_their_values(
    values: list[int | None], cut: int, parts: int
) -> None:
    import numpy as np
    import pyarrow as pa

    start = min(cut, len(values))

    def in_pieces(array: pa.Array) -> pa.ChunkedArray:
        """``array`` from ``start`` on, in chunks that are slices of its buffers (offsets)."""
        tail = array.slice(start)
        size = max(1, -(-len(tail) // parts))
        chunks = [tail.slice(i, size) for i in range(0, len(tail), size)] or [tail]
        return pa.chunked_array(chunks, type=array.type)

    chunked = in_pieces(pa.array(values, type=pa.int64()))
    expected = values[start:]
    valid = [v is not None for v in expected]
    assert not_null(chunked).tolist() == valid
    read = numbers(chunked, np.int64)
    assert [int(n) for n, ok in zip(read, valid, strict=True) if ok] == [
        v for v in expected if v is not None
    ]
    positive = in_pieces(pa.array([None if v is None else v > 0 for v in values], pa.bool_()))
    assert truth(positive).tolist() == [v is not None and v > 0 for v in expected]
    mask = np.array([v is not None for v in expected], dtype=bool)
    assert arrow_bool(mask).to_pylist() == mask.tolist()
