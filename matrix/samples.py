"""The raw latency samples table: its Arrow schema and the check every input goes through.

Owns ``SAMPLES_SCHEMA`` (what the runner hands to ``Store.write_run`` and what a bundle's
``samples.parquet`` holds) and ``conform_samples``, which refuses a table with missing, extra,
null or badly typed columns with a message naming the column and the fix. Does not own storage.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from matrix.errors import BundleError

__all__ = ["SAMPLES_SCHEMA", "conform_samples", "empty_samples"]

SAMPLES_SCHEMA = pa.schema(
    [
        pa.field("artifact_digest", pa.string(), nullable=False),
        pa.field("batch_size", pa.int32(), nullable=False),
        pa.field("concurrency", pa.int32(), nullable=False),
        pa.field("dims", pa.string(), nullable=False),
        pa.field("seq", pa.int32(), nullable=False),
        pa.field("latency_ns", pa.int64(), nullable=False),
    ]
)
"""One row per timed inference: which artifact, which (batch size, concurrency, swept sizes as
`schemas.cell.dims_text` writes them), its sequence number within that config, and its latency
in nanoseconds (``perf_counter_ns`` delta). The store adds ``run_id``."""

_OPTIONAL = {"dims": ""}
"""Columns a table from before they existed may lack, and the value they then have (a bundle
written before swept dimensions swept none)."""


def empty_samples() -> pa.Table:
    """An empty samples table (for runs where nothing was timed, e.g. every artifact errored)."""
    return SAMPLES_SCHEMA.empty_table()


def conform_samples(table: pa.Table, *, source: str = "samples") -> pa.Table:
    """Check a samples table and return it with exactly ``SAMPLES_SCHEMA``, columns in order.

    Integer columns of another width are cast when every value fits; strings may be
    ``large_string`` or dictionary-encoded; a table without ``dims`` (written before swept
    dimensions existed) gets ``""`` in every row. Nothing else is coerced.

    Args:
        table: The samples, one row per timed inference.
        source: Where the table came from (a file path or "samples"), for messages.

    Returns:
        The same rows with exactly ``SAMPLES_SCHEMA``.

    Raises:
        BundleError: A column is missing, extra, null-bearing or of a type that cannot be cast.
    """
    expected = SAMPLES_SCHEMA.names
    for name, value in _OPTIONAL.items():
        if name not in table.column_names:
            table = table.append_column(name, pa.repeat(pa.scalar(value), table.num_rows))
    present = table.column_names
    missing = [name for name in expected if name not in present]
    extra = [name for name in present if name not in expected]
    problems = []
    if missing:
        problems.append(f"missing {missing}")
    if extra:
        problems.append(f"unexpected {extra}")
    duplicates = sorted({name for name in present if present.count(name) > 1})
    if duplicates:
        problems.append(f"duplicated {duplicates}")
    if problems:
        raise BundleError(f"{source}: columns must be exactly {expected}; " + "; ".join(problems))
    columns: list[pa.Array | pa.ChunkedArray] = []
    for field in SAMPLES_SCHEMA:
        column = table.column(field.name)
        if column.null_count:
            raise BundleError(
                f"{source}: column {field.name!r} has {column.null_count} null value(s); "
                "every timed inference needs a value"
            )
        if not _castable(column.type, field.type):
            raise BundleError(
                f"{source}: column {field.name!r} has type {column.type}, expected {field.type}"
            )
        try:
            columns.append(pc.cast(column, field.type, safe=True))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
            raise BundleError(
                f"{source}: column {field.name!r} does not fit {field.type}: {error}"
            ) from error
    return pa.Table.from_arrays(columns, schema=SAMPLES_SCHEMA)


def _castable(actual: pa.DataType, wanted: pa.DataType) -> bool:
    if pa.types.is_dictionary(actual):
        actual = actual.value_type
    if pa.types.is_string(wanted):
        return bool(pa.types.is_string(actual) or pa.types.is_large_string(actual))
    return bool(pa.types.is_integer(actual) and pa.types.is_integer(wanted))
