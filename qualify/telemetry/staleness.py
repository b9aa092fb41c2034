"""What must be re-run: each class x artifact of the project whose current verdict is stale (the
evidence cannot answer under the project now) or whose artifact's bytes now were never run where
earlier bytes were (a model re-exported in place), and classes whose hosts run an onnxruntime
revision no cell of theirs ran on.

Owns ``stale_items`` (what ``qualify matrix stale`` lists), a pure function over the project
file, the artifacts' digests now, the cells and the runtime revisions telemetry reported, and
the rule of which revisions a class counts as qualified on (``qualified_revisions``; the
telemetry check's ``unqualified_runtime`` alert applies the same rule). What is stale is
``manifest.verdict``'s rule, the one ``matrix show``, the gate and ``manifest generate`` apply.
Does not own reading the matrix or the telemetry window (``qualify.telemetry.watch.run_stale``), the
text people read (``qualify.telemetry.render``) nor the settings digest a cell records
(``schemas.project.HostClass.settings_digest``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from manifest.verdict import Judge, Standing, standings
from schemas.cell import Cell
from schemas.project import Project
from schemas.telemetry import StaleItem, StaleReason

__all__ = ["qualified_revisions", "stale_items"]


def qualified_revisions(cells: Sequence[Cell], key: tuple[str, str, str]) -> set[str]:
    """The onnxruntime revisions a key was qualified on: those of its cells that did not error.

    Args:
        cells: Cells of the matrix (all runs).
        key: The class key, ``HostClassKey.as_tuple()``.

    Returns:
        The runtime versions, unordered.
    """
    return {
        c.runtime_version
        for c in cells
        if c.key.as_tuple() == key and c.runtime_version and c.verdict != "error"
    }


_REASONS: dict[str, StaleReason] = {
    "stale": "settings_changed",
    "artifact_changed": "artifact_changed",
    "workload_changed": "workload_changed",
    "parity_reference_mismatch": "baseline_changed",
    "budget_changed": "budget_changed",
}
"""The stale reason of a current verdict (``manifest.verdict.STALE_CODES``) as listed here."""


def stale_items(
    project: Project,
    cells: Sequence[Cell],
    telemetry_revisions: Mapping[str, Iterable[str]],
    *,
    digests: Mapping[str, str],
) -> list[StaleItem]:
    """Cells and classes that must be re-run.

    A class x artifact of the project is listed when the cell it rests on is stale under the
    project now (its class's runtime or provider settings changed, the workload feeds or times
    something else, a candidate's parity was measured against another baseline, a budget
    changed that its evidence cannot answer for), or when its artifact's bytes now were never
    run on the key but earlier bytes of it were. A
    class is listed when telemetry shows its hosts on an onnxruntime revision no cell of its key
    ran on.

    Args:
        project: The project file as it is now.
        cells: Cells of the matrix (all runs).
        telemetry_revisions: host class -> runtime revisions its hosts reported.
        digests: Artifact label -> the digest of its file now.

    Returns:
        Items sorted by class, reason, artifact name.
    """
    by_key: dict[tuple[str, str, str], list[Cell]] = {}
    for cell in cells:
        by_key.setdefault(cell.key.as_tuple(), []).append(cell)
    items = [
        item
        for standing in standings(Judge(project, digests), by_key)
        if (item := _stale_item(standing)) is not None
    ]
    for name in project.host_classes:
        key = project.host_classes[name].key.as_tuple()
        seen = set(telemetry_revisions.get(name, ()))
        unqualified = sorted(seen - qualified_revisions(cells, key))
        if unqualified:
            items.append(
                StaleItem(
                    host_class=name,
                    reason="runtime_unqualified",
                    run_id=None,
                    artifact_digest=None,
                    artifact_name=None,
                    measured_at=None,
                    runtime_revisions=unqualified,
                    message=f"hosts of {name} run onnxruntime {', '.join(unqualified)}, which no "
                    f"cell of the class ran on; re-run on such a host: qualify run "
                    f"--host-class {name}",
                )
            )
    return sorted(items, key=lambda i: (i.host_class, i.reason, i.artifact_name or ""))


def _stale_item(standing: Standing) -> StaleItem | None:
    """The item of one class x artifact, or None when it has a current cell or none at all."""
    name, label = standing.host_class, standing.label
    rerun = f"re-run: qualify run --host-class {name}"
    cell, current = standing.cell, standing.current
    if cell is not None and current is not None and current.stale:
        first = current.reasons[0]
        return StaleItem(
            host_class=name,
            reason=_REASONS.get(first.code, "settings_changed"),
            run_id=cell.run_id,
            artifact_digest=cell.artifact_digest,
            artifact_name=label,
            measured_at=cell.measured_at,
            runtime_revisions=[],
            message=f"{label} on {name}: {first.message}; {rerun}",
        )
    earlier = standing.replaced
    if cell is None and earlier is not None:
        return StaleItem(
            host_class=name,
            reason="artifact_changed",
            run_id=earlier.run_id,
            artifact_digest=earlier.artifact_digest,
            artifact_name=label,
            measured_at=earlier.measured_at,
            runtime_revisions=[],
            message=f"{label} on {name}: its file is now {(standing.digest or '')[:19]}, which "
            f"was never run; run {earlier.run_id} measured its earlier bytes "
            f"{earlier.artifact_digest[:19]}; {rerun}",
        )
    return None
