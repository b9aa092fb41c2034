"""The matrix as the project file sees it today: what every command that shows or uses a verdict
as current reads, so that none of them can give another answer.

Owns gathering the inputs of ``manifest.verdict`` at the edge: the digests of the project's
artifact files as they are now (artifacts are their bytes, never their names: a model re-exported
in place is a new artifact), and the matrix's decision cells and runs; then one `Judge` and every
class x artifact's `Standing`. ``matrix show``, ``matrix stale``, the release gate
(``matrix gate``, ``run --gate``), the report, ``manifest generate`` and ``rollout start`` read
the matrix through it (or through the same `file_digests` and ``Store.decision_cells_by_key``).
Also owns the row of a standing as ``matrix show`` prints it (`standing_rows`).

Does not own the rule (``manifest.verdict``), the decision (``manifest.policy``), coverage
(``qualify.release.coverage``) or the SQL (``matrix.store``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from manifest.gates import gate_of
from manifest.verdict import Judge, Standing, standings
from qualify.artifacts import digest_file

if TYPE_CHECKING:
    from matrix.store import Store
    from qualify.project.load import LoadedProject
    from qualify.release.coverage import CoverageItem
    from schemas.cell import Cell, RunRecord

__all__ = ["MatrixNow", "Shown", "file_digests", "read_now", "show_now", "standing_rows"]

_Key = tuple[str, str, str]


def file_digests(loaded: LoadedProject) -> dict[str, str]:
    """Artifact label -> ``sha256:`` of its file's bytes now.

    Raises:
        ArtifactError: a file cannot be read (the message names it).
    """
    artifacts = loaded.project.artifacts
    return {
        spec.label: digest_file(loaded.resolve(spec.path))
        for spec in [artifacts.baseline, *artifacts.candidates]
    }


@dataclass(frozen=True)
class MatrixNow:
    """The matrix judged under the project file today."""

    judge: Judge
    """The project, its artifacts' digests now, and the current-verdict rule."""
    by_key: Mapping[_Key, Sequence[Cell]]
    """The decision cells (``Store.decision_cells_by_key``)."""
    runs: Mapping[str, RunRecord]
    """The decision runs by id (``Store.decision_runs``)."""
    standings: list[Standing]
    """Every class x artifact of the project: the cell it rests on and its current verdict."""

    @property
    def digests(self) -> dict[str, str]:
        return self.judge.digests

    def orphans(self) -> int:
        """Cells on keys no class of the project has (shown by no command that has a project)."""
        keys = {cls.key.as_tuple() for cls in self.judge.project.host_classes.values()}
        return sum(len(cells) for key, cells in self.by_key.items() if key not in keys)


def read_now(
    loaded: LoadedProject, db: Store, *, digests: Mapping[str, str] | None = None
) -> MatrixNow:
    """Judge the matrix under the project file today.

    Args:
        loaded: The project file as it is now.
        db: The matrix (read-only is enough).
        digests: The artifacts' digests, when the caller hashed the files already.

    Raises:
        ArtifactError: an artifact file cannot be read.
    """
    judge = Judge(loaded.project, digests if digests is not None else file_digests(loaded))
    by_key = db.decision_cells_by_key()
    runs = {r.run_id: r for r in db.decision_runs()}
    return MatrixNow(judge, by_key, runs, standings(judge, by_key))


def standing_rows(now: MatrixNow) -> list[dict[str, Any]]:
    """One row per class x artifact with a cell, in ``matrix show``'s columns: the matrix view's
    (``Store.matrix_rows``), with ``verdict`` and ``reason_codes`` as they are under the project
    now, ``measured_verdict`` the runner's, and ``p99_budget_ms`` the class's budget now."""
    project = now.judge.project
    rows: list[dict[str, Any]] = []
    for standing in now.standings:
        cell, current = standing.cell, standing.current
        if cell is None or current is None:
            continue
        cls = project.host_classes[standing.host_class]
        rows.append(
            {
                **_cell_columns(cell),
                "host_class": standing.host_class,
                "artifact_name": standing.label,
                "role": standing.role,
                "verdict": current.verdict,
                "reason_codes": current.codes,
                "measured_verdict": cell.verdict,
                "p99_budget_ms": cls.budgets.p99_ms,
            }
        )
    return rows


def _cell_columns(cell: Cell) -> dict[str, Any]:
    """The matrix view's columns of one cell (``matrix.migrations``' ``matrix`` view)."""
    gate = gate_of(cell)
    placement = cell.placement
    hardware, runtime, provider = cell.key.as_tuple()
    return {
        "hardware": hardware,
        "runtime": runtime,
        "provider": provider,
        "host_class": cell.host_class,
        "artifact_digest": cell.artifact_digest,
        "artifact_name": cell.artifact_name,
        "role": cell.role,
        "precision": cell.precision,
        "run_id": cell.run_id,
        "verdict": cell.verdict,
        "reason_codes": [r.code for r in cell.reasons],
        "parity_passed": cell.parity.passed if cell.parity else None,
        "p50_ms": gate.p50_ms if gate else None,
        "p90_ms": gate.p90_ms if gate else None,
        "p99_ms": gate.p99_ms if gate else None,
        "p99_lower_ms": gate.p99_lower_ms if gate else None,
        "p99_upper_ms": gate.p99_upper_ms if gate else None,
        "p99_decision": gate.decision if gate else None,
        "samples": gate.samples if gate else None,
        "throughput_ips": gate.throughput_ips if gate else None,
        "gate_batch_size": gate.batch_size if gate else None,
        "gate_concurrency": gate.concurrency if gate else None,
        "expected_provider": placement.expected_provider if placement else None,
        "fallback_nodes": placement.fallback_nodes if placement else None,
        "total_nodes": placement.total_nodes if placement else None,
        "off_provider_nodes": (
            [n.model_dump() for n in placement.off_provider_nodes]
            if placement and placement.off_provider_nodes is not None
            else None
        ),
        "peak_rss_mb": cell.peak_rss_mb,
        "cold_init_ms": cell.cold_init_ms,
        "warm_init_ms": cell.warm_init_ms,
        "emulated": cell.emulated,
        "isa_mismatch": list(cell.isa_mismatch),
        "numerics": cell.numerics_source,
        "numerics_cpu": cell.numerics.cpu if cell.numerics is not None else None,
        "measured_at": cell.measured_at,
        "settings_digest": cell.settings_digest,
        "runtime_version": cell.runtime_version,
    }


@dataclass(frozen=True)
class Shown:
    """What ``matrix show`` prints with a project file."""

    rows: list[dict[str, Any]]
    """`standing_rows`: one per class x artifact with a cell, verdicts under the project now."""
    items: list[CoverageItem]
    """Coverage of every class x artifact (``qualify.release.coverage.coverage``)."""
    orphans: int
    """Cells on keys no class of the project has (not shown)."""


def show_now(loaded: LoadedProject, db: Store, *, unserved: Iterable[str] = ()) -> Shown:
    """The matrix under the project file today, as ``matrix show`` prints it.

    Raises:
        ArtifactError: an artifact file cannot be read.
    """
    from qualify.release.coverage import coverage

    now = read_now(loaded, db)
    budgets = {name: c.budgets.p99_ms for name, c in loaded.project.host_classes.items()}
    items = coverage(now.standings, budgets=budgets, unserved=unserved)
    return Shown(standing_rows(now), items, now.orphans())
