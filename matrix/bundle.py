"""Portable run bundles: ``<dir>/<run_id>/run.json`` plus ``samples.parquet``, written atomically.

Owns the on-disk bundle layout, writing it (build in a hidden temp directory beside the target,
fsync every file, rename the directory into place) and reading it back with errors that name the
file and the field, and ``check_bundle``, the consistency rule every bundle passes before it is
written anywhere (to disk or to the store). Does not own the database (``matrix.store``) nor the
loop that ingests many bundles (``matrix.ingest``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import ValidationError

from matrix.errors import BundleError
from matrix.samples import conform_samples
from schemas.atomic import open_binary, read_bounded, temp_prefix
from schemas.cell import BUNDLE_FORMAT, RunBundle

__all__ = [
    "RUN_JSON",
    "SAMPLES_PARQUET",
    "bundle_paths",
    "check_bundle",
    "fsync_path",
    "read_bundle",
    "read_run",
    "write_bundle",
]

RUN_JSON = "run.json"
SAMPLES_PARQUET = "samples.parquet"

_RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:+-]*$")
_MAX_LISTED_ERRORS = 8


def check_bundle(bundle: RunBundle, samples: pa.Table, *, source: str) -> pa.Table:
    """Check that a bundle is internally consistent and return its conformed samples.

    Rules: every cell belongs to the run (same run id, host class and key); artifact digests
    are unique within the run; each cell has at most one latency result per (batch size,
    concurrency, dims); every sample row names an artifact that has a cell; the samples table has
    exactly ``matrix.samples.SAMPLES_SCHEMA``.

    Args:
        bundle: The run and its cells.
        samples: Raw latency samples (``SAMPLES_SCHEMA`` columns).
        source: What to call the bundle in messages (a path, or "run <id>").

    Returns:
        The samples with exactly ``SAMPLES_SCHEMA``.

    Raises:
        BundleError: A rule does not hold; the message names the cell and field.
    """
    run = bundle.run
    seen: set[str] = set()
    for index, cell in enumerate(bundle.cells):
        where = f"{source}: cells.{index} ({cell.artifact_name})"
        if cell.run_id != run.run_id:
            raise BundleError(
                f"{where}: run_id {cell.run_id!r} differs from run.run_id {run.run_id!r}"
            )
        if cell.host_class != run.host_class:
            raise BundleError(
                f"{where}: host_class {cell.host_class!r} differs from run.host_class "
                f"{run.host_class!r}"
            )
        if cell.key != run.key:
            raise BundleError(
                f"{where}: key {cell.key.as_tuple()} differs from run.key {run.key.as_tuple()}"
            )
        if cell.artifact_digest in seen:
            raise BundleError(
                f"{where}: artifact_digest {cell.artifact_digest} appears in more than one cell; "
                "a run measures each artifact once"
            )
        seen.add(cell.artifact_digest)
        configs = [r.config for r in cell.latency]
        if len(set(configs)) != len(configs):
            raise BundleError(
                f"{where}: latency has more than one result for the same (batch_size, "
                "concurrency, dims)"
            )
    conformed = conform_samples(samples, source=f"{source}: samples")
    if conformed.num_rows:
        digests = pc.unique(conformed.column("artifact_digest")).to_pylist()
        orphans = sorted(str(d) for d in digests if d not in seen)
        if orphans:
            raise BundleError(
                f"{source}: samples name artifact_digest {orphans[0]}"
                + (f" (and {len(orphans) - 1} more)" if len(orphans) > 1 else "")
                + ", which has no cell in the run"
            )
    return conformed


def bundle_paths(path: str | Path) -> tuple[Path, Path, Path]:
    """Resolve a bundle path given as its directory or its run.json.

    Args:
        path: The run directory ``<dir>/<run_id>/`` or the ``run.json`` inside it.

    Returns:
        (directory, run.json path, samples.parquet path); the files may not exist.
    """
    given = Path(path)
    directory = given.parent if given.name == RUN_JSON and not given.is_dir() else given
    return directory, directory / RUN_JSON, directory / SAMPLES_PARQUET


def read_run(path: str | Path) -> RunBundle:
    """Read and validate a bundle's ``run.json`` alone (its samples are not read).

    Raises:
        BundleError: As `read_bundle`, for the directory and ``run.json``.
    """
    directory, run_json, _ = bundle_paths(path)
    if not directory.is_dir():
        raise BundleError(
            f"run bundle {directory}: no such directory; expected <dir>/<run_id>/ holding "
            f"{RUN_JSON} and {SAMPLES_PARQUET}",
            path=directory,
        )
    return _read_run_json(run_json)


def read_bundle(path: str | Path) -> tuple[RunBundle, pa.Table]:
    """Read and check a run bundle.

    Args:
        path: The run directory or its ``run.json``.

    Returns:
        The validated bundle and its samples (``SAMPLES_SCHEMA``).

    Raises:
        BundleError: A file is missing or unreadable, run.json is not valid JSON, is of another
            bundle format, or fails validation (the message gives the field path), or the
            bundle is inconsistent. ``error.path`` names the file at fault.
    """
    directory, _, samples_path = bundle_paths(path)
    bundle = read_run(directory)
    samples = _read_samples(samples_path)
    try:
        conformed = check_bundle(bundle, samples, source=str(directory))
    except BundleError as error:
        raise BundleError(str(error), path=directory) from error
    return bundle, conformed


MAX_RUN_JSON_BYTES = 512 * 2**20
"""The largest ``run.json`` read (its cells; the samples are in the Parquet file)."""


def _read_run_json(run_json: Path) -> RunBundle:
    if not run_json.exists():
        raise BundleError(
            f"{run_json}: not found; a run bundle directory holds {RUN_JSON} and {SAMPLES_PARQUET}",
            path=run_json,
        )
    try:
        raw = read_bounded(run_json, MAX_RUN_JSON_BYTES)  # a pipe or a device is refused
        if len(raw) > MAX_RUN_JSON_BYTES:
            raise BundleError(
                f"{run_json}: larger than {MAX_RUN_JSON_BYTES // 2**20} MiB; not a run bundle",
                path=run_json,
            )
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        why = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise BundleError(f"{run_json}: cannot read: {why}", path=run_json) from error
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise BundleError(
            f"{run_json}: invalid JSON at line {error.lineno} column {error.colno}: {error.msg}",
            path=run_json,
        ) from error
    if not isinstance(data, dict):
        raise BundleError(
            f"{run_json}: expected a JSON object with 'format', 'run' and 'cells', "
            f"found {type(data).__name__}",
            path=run_json,
        )
    found = data.get("format")
    if found != BUNDLE_FORMAT:
        what = "has no 'format' field" if found is None else f"has format {found!r}"
        raise BundleError(
            f"{run_json}: {what}; this qualify reads {BUNDLE_FORMAT!r}: write the bundle with a "
            "matching qualify version, or upgrade qualify",
            path=run_json,
        )
    try:
        return RunBundle.model_validate_json(text)
    except ValidationError as error:
        raise BundleError(
            f"{run_json}: {error.error_count()} invalid field(s): {_describe(error)}",
            path=run_json,
        ) from error


def _describe(error: ValidationError) -> str:
    parts = []
    for item in error.errors()[:_MAX_LISTED_ERRORS]:
        location = ".".join(str(part) for part in item["loc"]) or "(document)"
        parts.append(f"{location}: {item['msg']}")
    more = error.error_count() - _MAX_LISTED_ERRORS
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def _read_samples(samples_path: Path) -> pa.Table:
    if not samples_path.exists():
        raise BundleError(
            f"{samples_path}: not found; a run bundle holds {SAMPLES_PARQUET} beside {RUN_JSON} "
            "(an empty table when nothing was timed)",
            path=samples_path,
        )
    try:
        # One file, so ParquetFile rather than read_table (whose dataset layer imports pandas).
        with open_binary(samples_path) as handle, pq.ParquetFile(handle) as parquet:
            table = parquet.read()
    except (OSError, pa.ArrowException) as error:
        raise BundleError(
            f"{samples_path}: not a readable Parquet file: {error}", path=samples_path
        ) from error
    try:
        return conform_samples(table, source=str(samples_path))
    except BundleError as error:
        raise BundleError(str(error), path=samples_path) from error


def write_bundle(bundle: RunBundle, samples: pa.Table, directory: str | Path) -> Path:
    """Write ``<directory>/<run_id>/`` atomically: it appears whole or not at all.

    The files are written into a hidden temp directory beside the target, fsynced, and the
    directory is renamed into place (then the parent is fsynced).

    Args:
        bundle: The run and its cells.
        samples: Raw latency samples (``SAMPLES_SCHEMA`` columns).
        directory: Where bundles live; created if missing.

    Returns:
        The bundle directory.

    Raises:
        BundleError: The bundle is inconsistent (see ``check_bundle``), its run id cannot be a
            directory name, or a bundle with that run id already exists there.
    """
    run_id = bundle.run.run_id
    if not _RUN_ID_RE.match(run_id):
        raise BundleError(
            f"run.run_id {run_id!r} cannot name a bundle directory: use letters, digits and "
            "'.', '_', '-', ':', '+' (not starting with a dot)"
        )
    conformed = check_bundle(bundle, samples, source=f"run {run_id}")
    parent = Path(directory)
    parent.mkdir(parents=True, exist_ok=True)
    target = parent / run_id
    if target.exists():
        raise BundleError(
            f"{target}: a bundle for run {run_id} already exists; a run id is written once",
            path=target,
        )
    staging = Path(tempfile.mkdtemp(prefix=temp_prefix(run_id), suffix=".tmp", dir=parent))
    try:
        os.chmod(staging, 0o755)
        with open(staging / RUN_JSON, "w", encoding="utf-8") as handle:
            handle.write(bundle.model_dump_json(indent=2))
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        pq.write_table(conformed, staging / SAMPLES_PARQUET, compression="zstd")
        fsync_path(staging / SAMPLES_PARQUET)
        fsync_path(staging)
        os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    fsync_path(parent)
    return target


def fsync_path(path: Path) -> None:
    """fsync ``path`` (a file or, after a rename into it, a directory)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
