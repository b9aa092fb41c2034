"""Ingest run bundles into the matrix, idempotently by run id.

Owns the loop ``qualify matrix ingest`` runs: check that every bundle is a run of the matrix's
model line (one matrix holds one line: a bundle of another refuses the whole ingest before
anything is written), then read each bundle, check it, write it in its own transaction, and
report per path whether it was ingested or already present. A bad bundle
stops the ingest with an error naming its path; nothing of that bundle is written (bundles
before it stay ingested, each having committed whole). Does not own the bundle format
(``matrix.bundle``) or the SQL (``matrix.store``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from matrix.bundle import bundle_paths, read_bundle, read_run
from matrix.errors import BundleError, ModelLineError
from matrix.store import Store

__all__ = ["IngestReport", "IngestedBundle", "ingest_bundles"]


@dataclass(frozen=True)
class IngestedBundle:
    """What happened to one bundle.

    Attributes:
        path: The bundle directory.
        run_id: Its run id.
        status: "ingested" (written now) or "present" (already in the matrix; nothing written).
        cells: Number of cells in the bundle.
        samples: Number of raw latency samples in the bundle.
    """

    path: Path
    run_id: str
    status: Literal["ingested", "present"]
    cells: int
    samples: int


@dataclass(frozen=True)
class IngestReport:
    """The outcome of ``ingest_bundles``, one entry per path in the order given."""

    bundles: tuple[IngestedBundle, ...]

    @property
    def ingested(self) -> list[IngestedBundle]:
        """Bundles written by this ingest."""
        return [b for b in self.bundles if b.status == "ingested"]

    @property
    def present(self) -> list[IngestedBundle]:
        """Bundles whose run was already in the matrix."""
        return [b for b in self.bundles if b.status == "present"]


def ingest_bundles(store: Store, paths: Iterable[str | Path]) -> IngestReport:
    """Read each bundle and write its run unless the matrix already has it.

    Args:
        store: An open, writable store.
        paths: Bundle directories or their ``run.json`` files.

    Returns:
        Per path: run id and whether it was ingested or already present.

    Raises:
        ModelLineError: A bundle is of another model line than the matrix holds (or than the
            first bundle, for a matrix of no line yet); the message names the bundle, both
            lines and the fix, and nothing of any bundle was written.
        BundleError: A bundle is missing, invalid or inconsistent; the message names its path
            and nothing of that bundle was written.
        MatrixError: The store was opened read-only.
    """
    given_paths = list(paths)
    _one_line(store, given_paths)
    results: list[IngestedBundle] = []
    for given in given_paths:
        directory, _, _ = bundle_paths(given)
        bundle, samples = read_bundle(directory)
        written = store.write_run(bundle, samples)
        results.append(
            IngestedBundle(
                path=directory,
                run_id=bundle.run.run_id,
                status="ingested" if written else "present",
                cells=len(bundle.cells),
                samples=samples.num_rows,
            )
        )
    return IngestReport(bundles=tuple(results))


def _one_line(store: Store, paths: list[str | Path]) -> None:
    """Refuse the whole ingest, before anything is written, when a bundle is of another model
    line than the matrix holds (or, for a matrix of no line yet, than the first bundle). Bundles
    after one that cannot be read are never ingested, so the check stops there."""
    stamped = store.model_line()
    line = stamped
    for given in paths:
        directory, _, _ = bundle_paths(given)
        try:
            model = read_run(directory).run.model
        except BundleError:
            return  # the ingest stops there, after the bundles before it, and says why
        if line is None:
            line = model
            continue
        if model != line:
            raise ModelLineError(
                f"bundle {directory} is a run of model line {model!r}, and matrix {store.path} "
                f"{'holds' if stamped else 'would hold'} {line!r}: one matrix holds "
                f"one model line, so nothing was ingested. Fix: ingest {model!r}'s bundles into "
                "its own matrix (qualify matrix ingest ... --db ANOTHER.duckdb)",
                path=Path(store.path),
                held=(line,),
                wanted=model,
            )
