"""The model line of a matrix: one matrix holds exactly one model line (the project's ``model``).

Owns the stamp (the ``model_line`` table: written by the first run or command of a line, or by
migration 13 from the runs and manifests of a matrix older than it), the refusal of every
record, read and decision of another line (`require`), and splitting a matrix whose earlier
records mixed lines into one matrix per line (`split`). ``matrix.store`` calls it on open, on
every run written and on ingest; nothing here prints.

Why one line per matrix rather than a matrix keyed by model: every query, the matrix view, the
snapshot id, the manifest versions and the rollout log are then the line's by construction, and
a project pointed at the wrong database is refused by name instead of decided on another
model's cells.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import duckdb

from matrix.errors import MatrixError, ModelLineError

__all__ = ["held", "model_line", "require", "split"]


def held(conn: duckdb.DuckDBPyConnection) -> list[str]:
    """The lines the matrix is stamped with, sorted (one, or none for a new matrix; several
    only for a matrix whose records mixed lines before the stamp existed)."""
    return [
        row[0] for row in conn.execute("SELECT model FROM model_line ORDER BY model").fetchall()
    ]


def _other_path(path: str, model: str) -> str:
    """Where a line's own matrix could be: beside this one, named after the line (a model name
    is letters, digits, '.', '_', '+', '-': a file name as it is)."""
    if path == ":memory:":
        return f"qualify-{model}.duckdb"
    return str(Path(path).with_name(f"qualify-{model}.duckdb"))


def _mixed(conn: duckdb.DuckDBPyConnection, path: str, lines: list[str]) -> ModelLineError:
    counts = dict(conn.execute("SELECT model, count(*) FROM runs GROUP BY model").fetchall())
    said = ", ".join(f"{line!r} ({counts.get(line, 0)} runs)" for line in lines)
    first, rest = lines[0], lines[1:]
    return ModelLineError(
        f"matrix {path} mixes model lines {said}, written before qualify kept one model line "
        "per matrix; it is refused until it is split. Fix: qualify matrix split --db "
        f"{path} --model {first} --out {_other_path(path, first)}"
        + "".join(f", and --model {line} --out {_other_path(path, line)}" for line in rest)
        + "; then give each project its own matrix (--db)",
        path=Path(path),
        held=tuple(lines),
        wanted=None,
    )


def model_line(conn: duckdb.DuckDBPyConnection, path: str) -> str | None:
    """The one line the matrix holds; None while it holds none (nothing written yet).

    Raises:
        ModelLineError: the matrix mixes lines (it must be split first).
    """
    lines = held(conn)
    if len(lines) > 1:
        raise _mixed(conn, path, lines)
    return lines[0] if lines else None


def require(
    conn: duckdb.DuckDBPyConnection,
    path: str,
    model: str,
    *,
    what: str,
    stamp: bool,
    now: datetime,
) -> None:
    """Refuse ``model`` unless it is the matrix's line; ``stamp``: a matrix of no line yet
    becomes ``model``'s (within the caller's transaction, if any).

    Args:
        conn: The matrix's connection.
        path: The matrix file, for messages.
        model: The line the caller works on.
        what: What carries ``model``, for the message ("the project file", "bundle X").
        stamp: Stamp an unstamped matrix (a writer).
        now: When (the stamp's time).

    Raises:
        ModelLineError: the matrix holds another line, or mixes lines.
    """
    line = model_line(conn, path)
    if line is None:
        if stamp:
            conn.execute("INSERT INTO model_line (model, stamped_at) VALUES (?, ?)", [model, now])
        return
    if line != model:
        raise ModelLineError(
            f"matrix {path} holds model line {line!r}, and {what} is model line {model!r}: one "
            f"matrix holds one model line, and nothing of {model!r} is read, written or decided "
            f"in it. Fix: give {model!r} its own matrix (--db {_other_path(path, model)}), or "
            f"use the project file of {line!r} with this one",
            path=Path(path),
            held=(line,),
            wanted=model,
        )


_SPLIT: tuple[tuple[str, str], ...] = (
    ("runs", "model = $model"),
    ("cells", "run_id IN (SELECT run_id FROM src.runs WHERE model = $model)"),
    ("latency", "run_id IN (SELECT run_id FROM src.runs WHERE model = $model)"),
    ("samples", "run_id IN (SELECT run_id FROM src.runs WHERE model = $model)"),
    ("manifests", "json_extract_string(document, '$.signed.model') = $model"),
    (
        "rollouts",
        "version IN (SELECT version FROM src.manifests "
        "WHERE json_extract_string(document, '$.signed.model') = $model)",
    ),
    ("telemetry", "model_digest IN (SELECT artifact_digest FROM digests)"),
    ("telemetry_files", "true"),
    ("fleet_gaps", "true"),
    ("tunes", "json_extract_string(record, '$.artifact_digest') IN (SELECT * FROM digests)"),
    (
        "lineage",
        "artifact_digest IN (SELECT * FROM digests) OR parent_digest IN (SELECT * FROM digests)",
    ),
)
"""What of a mixed matrix belongs to one line: its runs and everything of them, the manifests
that name it and the rollouts that published them, the telemetry, tunes and lineage of the
artifacts its cells measured; which files were ingested and where no host was found are facts of
the fleet, kept in every split. (Telemetry of an artifact no cell of the line measured cannot be
told apart, and stays behind.)"""


def split(
    source: Path,
    model: str,
    out: Path,
    *,
    connect: Callable[[Path], duckdb.DuckDBPyConnection],
    now: datetime,
) -> dict[str, int]:
    """Copy model line ``model`` of the matrix at ``source`` into a new matrix at ``out``,
    stamped with it, in one transaction (``out`` is deleted again if it fails). The source is
    only read.

    Args:
        source: A matrix at the latest schema version (any line, or mixed).
        model: The line to copy.
        out: A path where nothing is yet.
        connect: Opens a new, migrated matrix at ``out`` (``Store.open``'s connection).
        now: The stamp's time.

    Returns:
        Rows copied per table.

    Raises:
        MatrixError: ``out`` exists, or the source has no run or manifest of ``model``.
    """
    if out.exists():
        raise MatrixError(f"{out} exists already; split into a new file")
    conn = connect(out)
    try:
        copied = _copy(conn, source, model, now)
    except BaseException as error:
        conn.close()
        out.unlink(missing_ok=True)
        Path(f"{out}.wal").unlink(missing_ok=True)
        if isinstance(error, duckdb.Error):
            raise MatrixError(f"cannot split matrix {source} into {out}: {error}") from error
        raise
    conn.close()
    return copied


def _copy(
    conn: duckdb.DuckDBPyConnection, source: Path, model: str, now: datetime
) -> dict[str, int]:
    conn.execute(f"ATTACH '{_quoted(source)}' AS src (READ_ONLY)")
    conn.execute("BEGIN TRANSACTION")
    conn.execute(
        "CREATE TEMP TABLE digests AS SELECT DISTINCT artifact_digest FROM src.cells "
        "WHERE run_id IN (SELECT run_id FROM src.runs WHERE model = $model)",
        {"model": model},
    )
    copied: dict[str, int] = {}
    for table, where in _SPLIT:
        params = {"model": model} if "$model" in where else None
        row = conn.execute(
            f"INSERT INTO main.{table} BY NAME SELECT * FROM src.{table} WHERE {where}", params
        ).fetchall()
        copied[table] = int(row[0][0]) if row else 0
    if not copied["runs"] and not copied["manifests"]:
        conn.execute("ROLLBACK")
        raise MatrixError(
            f"matrix {source} has no run or manifest of model line {model!r}; lines there: "
            + (", ".join(repr(m) for m in _held_in(conn)) or "none")
        )
    conn.execute("INSERT INTO model_line (model, stamped_at) VALUES (?, ?)", [model, now])
    conn.execute("COMMIT")
    conn.execute("DETACH src")
    return copied


def _held_in(conn: duckdb.DuckDBPyConnection) -> list[str]:
    """The lines of the attached source matrix ``src``."""
    return [
        row[0] for row in conn.execute("SELECT model FROM src.model_line ORDER BY 1").fetchall()
    ]


def _quoted(path: Path) -> str:
    """A path as a SQL string literal's contents (ATTACH takes no parameter)."""
    return str(path).replace("'", "''")
