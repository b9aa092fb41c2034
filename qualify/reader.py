"""The Python API: a matrix read as pandas DataFrames and typed documents, no SQL needed::

    import qualify

    m = qualify.open("qualify.duckdb")
    m.cells(latest=True)        # one row per cell: class, key, artifact, verdict, p99, parity, ...

Owns the `Matrix` object, the columns of each frame and the rules of reading (read-only, never in
a writer's way, an older matrix migrated in memory, missing evidence null): docs/python.md, which
a test holds equal to the columns. Does not own any SQL (`matrix.tables`, `matrix.store`) or any
write. pandas is imported when a frame is first made, never with this module.

Errors::

    MatrixError                 matrix.errors: the file is missing, not a matrix, or unreadable
    ├── MatrixLockedError       a writer held it for longer than wait_s
    ├── SchemaVersionError      written by a newer qualify
    └── ModelLineError          its records mix model lines (``qualify matrix split`` them)
    KeyError                    cell, run or manifest version not in the matrix
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self

from matrix.errors import MatrixError, SchemaVersionError
from matrix.store import Store

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

    from schemas.cell import Cell, LatencyResult, OutputParity, RunRecord
    from schemas.manifest import Manifest, ManifestEntry

__all__ = [
    "CELL_COLUMNS",
    "LATENCY_COLUMNS",
    "LINEAGE_COLUMNS",
    "MANIFEST_COLUMNS",
    "RUN_COLUMNS",
    "SAMPLE_COLUMNS",
    "TELEMETRY_COLUMNS",
    "Matrix",
    "open",
]

Kind = Literal["str", "float", "int", "bool", "time", "object"]
"""How a column is typed in its frame: str (text), float (float64, NaN when null), int (Int64,
<NA> when null), bool (boolean, <NA> when null), time (UTC timestamps) or object (a list or a
dict per row)."""

Columns = tuple[tuple[str, Kind], ...]

_KEY: Columns = (
    ("host_class", "str"),
    ("hardware", "str"),
    ("runtime", "str"),
    ("provider", "str"),
)
_ARTIFACT: Columns = (("artifact_name", "str"), ("artifact_digest", "str"), ("role", "str"))

CELL_COLUMNS: Columns = (
    ("run_id", "str"),
    ("model", "str"),
    *_KEY,
    *_ARTIFACT,
    ("precision", "str"),
    ("verdict", "str"),
    ("reason_codes", "object"),
    ("reasons", "object"),
    ("p50_ms", "float"),
    ("p90_ms", "float"),
    ("p99_ms", "float"),
    ("p99_lower_ms", "float"),
    ("p99_upper_ms", "float"),
    ("p99_decision", "str"),
    ("samples", "int"),
    ("gate_batch_size", "int"),
    ("gate_concurrency", "int"),
    ("gate_dims", "str"),
    ("throughput_ips", "float"),
    ("parity_passed", "bool"),
    ("parity_max_abs", "float"),
    ("parity_cosine_min", "float"),
    ("parity_top1_agreement", "float"),
    ("expected_provider", "str"),
    ("fallback_nodes", "int"),
    ("total_nodes", "int"),
    ("nodes_per_provider", "object"),
    ("peak_rss_mb", "float"),
    ("cold_init_ms", "float"),
    ("warm_init_ms", "float"),
    ("emulated", "bool"),
    ("isa_mismatch", "object"),
    ("runtime_version", "str"),
    ("settings_digest", "str"),
    ("measured_at", "time"),
    ("error", "str"),
)
"""`Matrix.cells`: one row per cell."""

LATENCY_COLUMNS: Columns = (
    ("run_id", "str"),
    *_KEY,
    *_ARTIFACT,
    ("batch_size", "int"),
    ("concurrency", "int"),
    ("dims", "str"),
    ("gate", "bool"),
    ("samples", "int"),
    ("p50_ms", "float"),
    ("p90_ms", "float"),
    ("p99_ms", "float"),
    ("max_ms", "float"),
    ("mean_ms", "float"),
    ("p99_lower_ms", "float"),
    ("p99_upper_ms", "float"),
    ("confidence", "float"),
    ("decision", "str"),
    ("stopped", "str"),
    ("duration_s", "float"),
    ("throughput_ips", "float"),
    ("p50_vs_baseline", "float"),
    ("p99_vs_baseline", "float"),
    ("measured_at", "time"),
)
"""`Matrix.latency`: one row per latency config of each cell."""

SAMPLE_COLUMNS: Columns = (
    ("run_id", "str"),
    ("host_class", "str"),
    ("artifact_name", "str"),
    ("artifact_digest", "str"),
    ("batch_size", "int"),
    ("concurrency", "int"),
    ("dims", "str"),
    ("seq", "int"),
    ("latency_ms", "float"),
    ("latency_ns", "int"),
)
"""`Matrix.samples`: one row per timed inference."""

RUN_COLUMNS: Columns = (
    ("run_id", "str"),
    ("model", "str"),
    *_KEY,
    ("started_at", "time"),
    ("finished_at", "time"),
    ("emulated", "bool"),
    ("mismatches", "object"),
    ("hostname", "str"),
    ("runtime_version", "str"),
    ("host_busy", "bool"),
    ("load_avg_before", "object"),
    ("load_avg_after", "object"),
    ("rollback_digest", "str"),
    ("rollback_loaded", "bool"),
)
"""`Matrix.runs`: one row per run."""

TELEMETRY_COLUMNS: Columns = (
    ("time", "time"),
    ("host_id", "str"),
    ("host_class", "str"),
    ("model", "str"),
    ("model_digest", "str"),
    ("runtime_revision", "str"),
    ("runtime_package", "str"),
    ("providers", "object"),
    ("placement", "str"),
    ("nodes_per_provider", "object"),
    ("fallback_nodes", "int"),
    ("latency_ms", "float"),
    ("manifest_version", "int"),
    ("decision", "str"),
    ("rollout", "str"),
    ("cohort", "str"),
    ("settings", "str"),
    ("source", "str"),
    ("line", "int"),
)
"""`Matrix.telemetry`: one row per event a host sent."""

MANIFEST_COLUMNS: Columns = (
    ("version", "int"),
    ("release", "str"),
    ("state", "str"),
    ("created", "time"),
    ("expires", "time"),
    ("published_at", "time"),
    *_KEY,
    ("decision", "str"),
    ("artifact_name", "str"),
    ("artifact_digest", "str"),
    ("rollback_name", "str"),
    ("rollback_digest", "str"),
    ("rollback_proven", "bool"),
    ("rollout_percent", "int"),
    ("evidence_run_id", "str"),
    ("reason_codes", "object"),
    ("summary", "str"),
)
"""`Matrix.manifests`: one row per host class of each recorded manifest version."""

LINEAGE_COLUMNS: Columns = (
    ("artifact_name", "str"),
    ("artifact_digest", "str"),
    ("precision", "str"),
    ("parent_name", "str"),
    ("parent_digest", "str"),
    ("tool", "str"),
    ("tool_version", "str"),
    ("params", "object"),
    ("calibration_digest", "str"),
    ("note", "str"),
    ("created_at", "time"),
)
"""`Matrix.lineage`: one row per artifact ``qualify candidates`` made."""

_WAIT_S = 30.0


def open(path: str | Path = "qualify.duckdb", *, wait_s: float = _WAIT_S) -> Matrix:
    """Open the matrix at ``path`` for reading.

    Args:
        path: The matrix file (``qualify.duckdb`` in the current folder by default, as for the
            commands).
        wait_s: How long each read waits for a writer (``qualify run``, an ingest) to finish.

    Returns:
        The matrix, read-only. An older matrix is read through a migrated copy in memory.

    Raises:
        MatrixError: No file there, or not a matrix.
        MatrixLockedError: A writer held it for longer than ``wait_s``.
        SchemaVersionError: A newer qualify wrote it.
    """
    file = Path(path)
    try:
        with Store.open(file, read_only=True, wait_s=wait_s) as store:
            return Matrix(file, store.schema_version, store.model_line(), wait_s=wait_s)
    except SchemaVersionError as error:
        if not error.older or error.found is None:
            raise
        found = error.found
    copy = Store.open_copy(file, wait_s=wait_s)
    try:
        model = copy.model_line()
    except BaseException:
        copy.close()
        raise
    return Matrix(file, found, model, wait_s=wait_s, copy=copy)


class Matrix:
    """A matrix opened for reading (`open`). Each method reads the file afresh, except for an
    older matrix, read from the copy made when it was opened; `close` (or ``with``) frees that
    copy's memory."""

    def __init__(
        self,
        path: Path,
        schema_version: int,
        model: str | None,
        *,
        wait_s: float,
        copy: Store | None = None,
    ) -> None:
        """Use `open`."""
        self._path = path
        self._schema_version = schema_version
        self._model = model
        self._wait_s = wait_s
        self._copy = copy
        self._closed = False

    @property
    def path(self) -> Path:
        """The matrix file."""
        return self._path

    @property
    def model(self) -> str | None:
        """The model line the matrix holds (a matrix holds one), None while it has no record."""
        return self._model

    @property
    def schema_version(self) -> int:
        """The schema version of the file as opened (older than this qualify's when `copied`)."""
        return self._schema_version

    @property
    def copied(self) -> bool:
        """Whether it is read from an in-memory copy (an older matrix: a snapshot as opened)."""
        return self._copy is not None

    def __repr__(self) -> str:
        how = ", an in-memory copy migrated from it" if self.copied else ""
        return (
            f"<qualify matrix {str(self._path)!r}: model {self._model!r}, "
            f"schema {self._schema_version}{how}>"
        )

    def close(self) -> None:
        """Free the in-memory copy of an older matrix (nothing else is held); reading after it
        is refused. Idempotent."""
        self._closed = True
        if self._copy is not None:
            self._copy.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    @contextmanager
    def _store(self) -> Iterator[Store]:
        if self._closed:
            raise MatrixError(f"{self._path}: read after close(); open it again: qualify.open")
        if self._copy is not None:
            yield self._copy
            return
        with Store.open(self._path, read_only=True, wait_s=self._wait_s) as store:
            yield store

    # -- frames ------------------------------------------------------------------------------

    def cells(
        self, *, latest: bool = False, host_class: str | None = None, run_id: str | None = None
    ) -> pd.DataFrame:
        """One row per cell (columns: `CELL_COLUMNS`), oldest first, or with ``latest`` the
        latest cell of each (hardware, runtime, provider, artifact digest), as ``qualify
        matrix show`` has them. The p50/p99 columns are the gating latency config's (the one
        with the highest p99 upper bound); the parity ones the worst output's.

        Args:
            latest: Only the latest cell per key and artifact.
            host_class: Only cells measured under this class name.
            run_id: Only this run's cells.
        """
        with self._store() as store:
            models = {run.run_id: run.model for run in store.runs()}
            found = (
                store.latest_cells(host_class=host_class)
                if latest
                else store.cells(host_class=host_class)
            )
        rows = [_cell_row(c, models.get(c.run_id)) for c in found if run_id in (None, c.run_id)]
        return _frame(rows, CELL_COLUMNS)

    def latency(
        self, *, latest: bool = False, host_class: str | None = None, run_id: str | None = None
    ) -> pd.DataFrame:
        """One row per latency config (batch size, concurrency, swept sizes) of each cell
        (columns: `LATENCY_COLUMNS`); the arguments select cells as for `cells`."""
        with self._store() as store:
            found = (
                store.latest_cells(host_class=host_class)
                if latest
                else store.cells(host_class=host_class)
            )
        rows = [
            _latency_row(cell, result)
            for cell in found
            if run_id in (None, cell.run_id)
            for result in cell.latency
        ]
        return _frame(rows, LATENCY_COLUMNS)

    def samples(
        self,
        *,
        run_id: str | None = None,
        artifact: str | None = None,
        host_class: str | None = None,
    ) -> pd.DataFrame:
        """Every timed inference of the matching cells (columns: `SAMPLE_COLUMNS`), ordered by
        run, artifact, config and sequence. A matrix keeps every sample of every run: narrow
        by run or artifact on a large one.

        Args:
            run_id: Only this run's.
            artifact: Only this artifact's, by label or ``sha256:`` digest.
            host_class: Only cells measured under this class name.
        """
        from matrix.tables import raw_samples

        with self._store() as store:
            table = raw_samples(store, run_id=run_id, artifact=artifact, host_class=host_class)
        return _arrow_frame(table, SAMPLE_COLUMNS)

    def runs(self) -> pd.DataFrame:
        """One row per run (columns: `RUN_COLUMNS`), by start time."""
        with self._store() as store:
            found = store.runs()
        return _frame([_run_row(run) for run in found], RUN_COLUMNS)

    def telemetry(
        self,
        *,
        host_class: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> pd.DataFrame:
        """The events hosts sent, as ``qualify telemetry ingest`` stored them (columns:
        `TELEMETRY_COLUMNS`), by time.

        Args:
            host_class: Only this class's events.
            since: Only events at or after this time (naive is UTC).
            until: Only events before this time.
        """
        from matrix.tables import telemetry_events

        with self._store() as store:
            table = telemetry_events(store, host_class=host_class, since=since, until=until)
        frame = _arrow_frame(table, TELEMETRY_COLUMNS)
        frame["providers"] = _each(frame["providers"], list)
        frame["nodes_per_provider"] = _each(frame["nodes_per_provider"], dict)
        return frame

    def manifests(self) -> pd.DataFrame:
        """One row per host class of each recorded manifest version, drafts included (columns:
        `MANIFEST_COLUMNS`; ``state`` is ``draft``, ``publishing``, ``published`` or
        ``discarded``: a publication that failed), by version and class."""
        rows: list[dict[str, Any]] = []
        for version, state, published_at, manifest in self._manifests():
            rows.extend(_manifest_rows(version, state, published_at, manifest))
        return _frame(rows, MANIFEST_COLUMNS)

    def lineage(self) -> pd.DataFrame:
        """How each artifact ``qualify candidates`` made was derived (columns:
        `LINEAGE_COLUMNS`; ``params`` holds every parameter the converter was given)."""
        with self._store() as store:
            found = store.lineage()
        rows = [
            {**item.model_dump(), "artifact_name": item.name}
            for item in sorted(found.values(), key=lambda i: (i.created_at, i.name))
        ]
        return _frame(rows, LINEAGE_COLUMNS)

    # -- typed documents ---------------------------------------------------------------------

    def cell(self, run_id: str, artifact: str) -> Cell:
        """The cell of ``artifact`` (label or digest) in run ``run_id``, as the run stored it.

        Raises:
            KeyError: No such cell.
        """
        with self._store() as store:
            found = store.cells(run_id=run_id)
        for cell in found:
            if artifact in (cell.artifact_name, cell.artifact_digest):
                return cell
        raise KeyError(f"no cell of artifact {artifact!r} in run {run_id!r} in {self._path}")

    def run(self, run_id: str) -> RunRecord:
        """The run ``run_id``: its host's fingerprint, load, rollback check and settings.

        Raises:
            KeyError: No such run.
        """
        with self._store() as store:
            found = store.run(run_id)
        if found is None:
            raise KeyError(f"no run {run_id!r} in {self._path}")
        return found

    def manifest(self, version: int | None = None) -> Manifest:
        """Manifest ``version`` as recorded (a draft has no signature), or by default the
        latest published one: what hosts were last given.

        Raises:
            KeyError: No such version, or (by default) none published yet.
        """
        for number, state, _, manifest in reversed(self._manifests()):
            if number == version or (version is None and state == "published"):
                return manifest
        what = f"manifest version {version}" if version is not None else "published manifest"
        raise KeyError(f"no {what} in {self._path}")

    def _manifests(self) -> list[tuple[int, str, datetime | None, Manifest]]:
        from matrix.tables import manifest_documents
        from schemas.manifest import Manifest

        with self._store() as store:
            found = manifest_documents(store)
        return [(v, state, at, Manifest.model_validate_json(doc)) for v, state, at, doc in found]


# -- rows ------------------------------------------------------------------------------------


def _cell_row(cell: Cell, model: str | None) -> dict[str, Any]:
    gate = cell.gate_latency
    placement = cell.placement
    return {
        **cell.model_dump(include={"run_id", "host_class", "artifact_name", "artifact_digest"}),
        **cell.key.model_dump(),
        "model": model,
        "role": cell.role,
        "precision": cell.precision,
        "verdict": cell.verdict,
        "reason_codes": [r.code for r in cell.reasons],
        "reasons": [r.message for r in cell.reasons],
        **_gate_fields(gate),
        **_parity_fields(cell.parity.passed if cell.parity else None, _outputs(cell)),
        **(placement.model_dump(include=_PLACEMENT) if placement else {}),
        "peak_rss_mb": cell.peak_rss_mb,
        "cold_init_ms": cell.cold_init_ms,
        "warm_init_ms": cell.warm_init_ms,
        "emulated": cell.emulated,
        "isa_mismatch": list(cell.isa_mismatch),
        "runtime_version": cell.runtime_version,
        "settings_digest": cell.settings_digest,
        "measured_at": cell.measured_at,
        "error": cell.error,
    }


_PLACEMENT = {"expected_provider", "fallback_nodes", "total_nodes", "nodes_per_provider"}


def _outputs(cell: Cell) -> list[OutputParity]:
    return list(cell.parity.outputs) if cell.parity is not None else []


def _gate_fields(gate: LatencyResult | None) -> dict[str, Any]:
    if gate is None:
        return {}
    return {
        **gate.model_dump(include={"p50_ms", "p90_ms", "p99_ms", "p99_lower_ms", "p99_upper_ms"}),
        "p99_decision": gate.decision,
        "samples": gate.samples,
        "gate_batch_size": gate.batch_size,
        "gate_concurrency": gate.concurrency,
        "gate_dims": gate.config.dims,
        "throughput_ips": gate.throughput_ips,
    }


def _parity_fields(passed: bool | None, outputs: Sequence[OutputParity]) -> dict[str, Any]:
    """The worst output's figures: the largest error, the lowest cosine and top-1 agreement."""
    return {
        "parity_passed": passed,
        "parity_max_abs": _worst((o.max_abs for o in outputs), max),
        "parity_cosine_min": _worst((o.cosine_min for o in outputs), min),
        "parity_top1_agreement": _worst((o.top1_agreement for o in outputs), min),
    }


def _worst(values: Iterable[float | None], pick: Callable[[list[float]], float]) -> float | None:
    known = [v for v in values if v is not None]
    return pick(known) if known else None


def _latency_row(cell: Cell, result: LatencyResult) -> dict[str, Any]:
    versus = result.vs_baseline
    return {
        **cell.model_dump(include={"run_id", "host_class", "artifact_name", "artifact_digest"}),
        **cell.key.model_dump(),
        "role": cell.role,
        **result.model_dump(exclude={"dims", "rounds", "vs_baseline", "stage_share"}),
        "dims": result.config.dims,
        "gate": result is cell.gate_latency,
        "p50_vs_baseline": versus.p50_ratio if versus else None,
        "p99_vs_baseline": versus.p99_ratio if versus else None,
        "measured_at": cell.measured_at,
    }


def _run_row(run: RunRecord) -> dict[str, Any]:
    rollback = run.rollback
    return {
        **run.model_dump(exclude={"key", "fingerprint", "rollback"}),
        **run.key.model_dump(),
        "hostname": run.fingerprint.hostname,
        "runtime_version": run.fingerprint.runtime.version,
        "rollback_digest": rollback.artifact_digest if rollback else None,
        "rollback_loaded": rollback.loaded if rollback else None,
    }


def _manifest_rows(
    version: int, state: str, published_at: datetime | None, manifest: Manifest
) -> Iterator[dict[str, Any]]:
    signed = manifest.signed
    head = {
        "version": version,
        "release": signed.release,
        "state": state,
        "created": signed.created,
        "expires": signed.expires,
        "published_at": published_at,
    }
    for name in sorted(signed.entries):
        yield {**head, **_entry_fields(signed.entries[name])}


def _entry_fields(entry: ManifestEntry) -> dict[str, Any]:
    artifact, rollback = entry.artifact, entry.rollback
    return {
        "host_class": entry.host_class,
        **entry.key.model_dump(),
        "decision": entry.decision,
        "artifact_name": artifact.name if artifact else None,
        "artifact_digest": artifact.digest if artifact else None,
        "rollback_name": rollback.name if rollback else None,
        "rollback_digest": rollback.digest if rollback else None,
        "rollback_proven": rollback.proven_to_load if rollback else None,
        "rollout_percent": entry.rollout.percent if entry.rollout else None,
        "evidence_run_id": entry.evidence.run_id if entry.evidence else None,
        "reason_codes": [r.code for r in entry.reasons],
        "summary": entry.summary,
    }


# -- frames ----------------------------------------------------------------------------------


def _frame(rows: list[dict[str, Any]], columns: Columns) -> pd.DataFrame:
    """``rows`` as a frame of exactly ``columns``, each typed by its kind (a missing key is a
    null), whether there are rows or not."""
    import pandas as pd

    names = [name for name, _ in columns]
    frame = pd.DataFrame.from_records(
        [{name: row.get(name) for name in names} for row in rows], columns=names
    )
    return _typed(frame, columns)


def _arrow_frame(table: pa.Table, columns: Columns) -> pd.DataFrame:
    frame = table.select([name for name, _ in columns]).to_pandas()
    return _typed(frame, columns)


_DTYPES: Mapping[Kind, str] = {"float": "float64", "int": "Int64", "bool": "boolean"}


def _typed(frame: pd.DataFrame, columns: Columns) -> pd.DataFrame:
    import pandas as pd

    frame = frame.astype({name: _DTYPES[kind] for name, kind in columns if kind in _DTYPES})
    for name, kind in columns:
        if kind == "time":
            frame[name] = pd.to_datetime(frame[name], utc=True)
    return frame


def _each(column: pd.Series[Any], convert: Callable[[Any], Any]) -> pd.Series[Any]:
    """Each value of an Arrow list or map column as a Python list or dict (None kept)."""
    import pandas as pd

    values = [convert(value) if value is not None else None for value in column]
    return pd.Series(values, index=column.index, dtype=object)
