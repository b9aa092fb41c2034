"""A block's columns as the fast path builds them (whole files through both paths are tested in
``test_ingest``)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import matrix.telemetry.blocks as tb


@settings(max_examples=80, deadline=None)
@given(
    rows=st.lists(
        st.one_of(
            st.none(),
            st.dictionaries(
                st.sampled_from([f"P{i}" for i in range(32)]),
                st.one_of(st.none(), st.integers(0, 2**62)),
                max_size=32,
            ),
        ),
        min_size=1,
        max_size=60,
    ),
    spread=st.integers(1, 40),
)
def test_node_counts_are_dictionary_encoded_without_changing_a_map(
    rows: list[dict[str, int | None] | None], spread: int
) -> None:
    import pyarrow as pa

    # Many providers and many distinct counts push the per-row key past 2**62 (re-coded).
    rows = [
        None if row is None else {k: None if v is None else v % spread for k, v in row.items()}
        for row in rows
    ] + [{f"P{i}": (i + j) % 8 for i in range(32)} for j in range(8)]
    names = sorted({name for row in rows if row for name in row})
    struct = pa.array(rows, type=pa.struct([(name, pa.int64()) for name in names]))
    encoded = tb._nodes_map(struct)
    expected = [
        None if row is None else [(k, v) for k, v in sorted(row.items()) if v is not None]
        for row in rows
    ]
    maps = encoded.dictionary.take(encoded.indices).to_pylist()
    assert [None if m is None else sorted(m) for m in maps] == expected
    # Each distinct map once (a null row shares the empty map's entry, behind a null index).
    assert len(encoded.dictionary) == len({tuple(m or ()) for m in expected})
    assert encoded.dictionary.null_count == 0
