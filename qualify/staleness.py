"""What must be re-run: cells measured under settings the project file no longer has, and classes
whose hosts run an onnxruntime revision no cell of theirs ran on.

Owns ``stale_items`` (what ``qualify matrix stale`` lists), a pure function over the project
file, the cells and the runtime revisions telemetry reported, and the rule of which revisions a
class counts as qualified on (``qualified_revisions``; the telemetry check's
``unqualified_runtime`` alert applies the same rule). Does not own reading the matrix or the
telemetry window (``qualify.telemetry.run_stale``), the text people read
(``qualify.telemetry_render``) nor the settings digest a cell records
(``schemas.project.HostClass.settings_digest``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from manifest.policy import artifact_digests
from schemas.cell import Cell, latest
from schemas.project import Project
from schemas.telemetry import StaleItem

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


def stale_items(
    project: Project,
    cells: Sequence[Cell],
    telemetry_revisions: Mapping[str, Iterable[str]],
) -> list[StaleItem]:
    """Cells and classes that must be re-run.

    A cell is stale when its class's runtime, provider or graph settings in the project file
    differ from those it was measured under (``HostClass.settings_digest``) and no current cell
    of the same artifact on the same key replaces it; only the project's current artifacts
    count. A class is listed when telemetry shows its hosts on an onnxruntime revision no cell
    of its key ran on.

    Args:
        project: The project file as it is now.
        cells: Cells of the matrix (all runs).
        telemetry_revisions: host class -> runtime revisions its hosts reported.

    Returns:
        Items sorted by class, reason, artifact name.
    """
    digests = artifact_digests(project, cells)
    names = {digest: label for label, digest in digests.items()}
    items: list[StaleItem] = []
    for name in sorted(project.host_classes):
        cls = project.host_classes[name]
        key = cls.key.as_tuple()
        current = cls.settings_digest()
        on_key = [c for c in cells if c.key.as_tuple() == key]
        for digest in sorted(names, key=lambda d: names[d]):
            mine = [c for c in on_key if c.artifact_digest == digest]
            newest = latest(mine)
            if newest is None or any(c.settings_digest == current for c in mine):
                continue
            items.append(
                StaleItem(
                    host_class=name,
                    reason="settings_changed",
                    run_id=newest.run_id,
                    artifact_digest=digest,
                    artifact_name=names[digest],
                    measured_at=newest.measured_at,
                    runtime_revisions=[],
                    message=f"{names[digest]} on {name} was measured in run {newest.run_id} "
                    "under other runtime or provider settings than the project file's now; "
                    f"re-run: qualify run --host-class {name}",
                )
            )
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
    return items
