"""The host classes section: each class's decision, table, chart, parity and evidence.

Also builds each class's heat-map row (``reports.sections.matrix`` shows them), from the same
judged cells: every verdict is the cell's under the project file now (``manifest.verdict``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from manifest.verdict import CurrentVerdict
from reports.charts import latency_chart
from reports.formatting import mb, ms, plural, provider_name
from reports.inputs import Classes, Inputs
from reports.rows import compare
from reports.rows.parity import parity_rows
from reports.rows.placement import warnings
from reports.rows.table import Table
from reports.rows.verdict import emulated
from reports.sections.evidence import rollback_entry, run_views
from reports.sections.matrix import heat_cell
from reports.view import ArtifactColumn, ClassView, HeatRow, ReasonView
from schemas.cell import Cell, recency
from schemas.manifest import DECISION_REASON_CODES, ManifestEntry
from schemas.project import HostClass
from schemas.reasons import REASONS

__all__ = ["build", "build_classes", "reason_views"]


def reason_views(items: Iterable[Any], codes: Mapping[str, str]) -> tuple[ReasonView, ...]:
    """Reason codes with their sentences and the meaning ``codes`` gives each."""
    return tuple(
        ReasonView(code=r.code, message=r.message, meaning=codes.get(r.code, "")) for r in items
    )


@dataclass(frozen=True)
class _Place:
    """One class on the page: its place, name, project entry and manifest entry."""

    index: int
    name: str
    cls: HostClass | None
    entry: ManifestEntry | None
    has_manifest: bool

    @property
    def anchor(self) -> str:
        return f"class-{self.index}"

    @property
    def key_text(self) -> str:
        key = self.cls.key if self.cls else (self.entry.key if self.entry else None)
        return " · ".join(key.as_tuple()) if key else ""


def _latest_by_artifact(cells: Iterable[Cell]) -> dict[str, Cell]:
    latest: dict[str, Cell] = {}
    for cell in cells:
        found = latest.get(cell.artifact_name)
        if found is None or recency(cell) > recency(found):
            latest[cell.artifact_name] = cell
    return latest


def _judged_cells(
    place: _Place, cells: Sequence[Cell], inputs: Inputs
) -> list[tuple[Cell, CurrentVerdict] | None]:
    """Per column, the cell the class rests on and its current verdict (``manifest.verdict``):
    a project artifact's cell of its bytes now on the class's key, or for an artifact or class
    the project file does not have, its latest cell (stale: not in the project)."""
    latest = _latest_by_artifact(cells)
    found: list[tuple[Cell, CurrentVerdict] | None] = []
    for col in inputs.columns:
        if place.cls is not None and col.in_project:
            standing = inputs.judge.standing(place.name, col.name, cells)
            cell, now = standing.cell, standing.current
        else:
            cell = latest.get(col.name)
            now = inputs.judge.verdict(cell) if cell is not None else None
        found.append((cell, now) if cell is not None and now is not None else None)
    return found


def _entry_text(entry: ManifestEntry | None, has_manifest: bool) -> tuple[str, str, str]:
    if entry is None:
        if has_manifest:
            return "none", "not in the manifest", "The manifest has no entry for this class."
        return "none", "no decision", "No manifest yet: this report shows measurements only."
    what = "hold" if entry.artifact is None else f"{entry.decision}: {entry.artifact.name}"
    return entry.decision, what, entry.summary


def _budgets_text(cls: HostClass | None) -> str:
    # The class's budgets and provider expectation in one line; "" for a class not in the project.
    if cls is None:
        return ""
    b = cls.budgets
    parts = [f"p99 {ms(b.p99_ms)}"]
    parts.append(f"peak memory {mb(b.peak_rss_mb)}" if b.peak_rss_mb else "no memory budget")
    parts.append(f"cold init {ms(b.cold_init_ms)}" if b.cold_init_ms else "no cold-init budget")
    parts.append(
        f"expected provider {provider_name(cls.provider.expected)}, "
        f"{plural(cls.provider.fallback_allowance, 'fallback node', 'fallback nodes')} allowed"
    )
    return " · ".join(parts)


def _heat_row(
    place: _Place,
    columns: Sequence[ArtifactColumn],
    judged: Sequence[tuple[Cell, CurrentVerdict] | None],
    emulated_by: Mapping[str, bool],
) -> HeatRow:
    decision, decision_text, _ = _entry_text(place.entry, place.has_manifest)
    return HeatRow(
        host_class=place.name,
        anchor=place.anchor,
        key_text=place.key_text,
        decision=decision,
        decision_text=decision_text,
        cells=tuple(
            heat_cell(
                col.name,
                pair[0] if pair else None,
                pair[1] if pair else None,
                place.cls,
                emulated_by.get(col.name, False),
            )
            for col, pair in zip(columns, judged, strict=True)
        ),
    )


def _class_view(place: _Place, cells: Sequence[Cell], inputs: Inputs) -> tuple[ClassView, HeatRow]:
    cls, entry = place.cls, place.entry
    judged = _judged_cells(place, cells, inputs)
    present = [pair for pair in judged if pair is not None]
    shown_cells = [cell for cell, _ in present]
    nows = [now for _, now in present]
    emulated_by = {c.artifact_name: emulated(c, inputs.runs) for c in shown_cells}
    budget = cls.budgets.p99_ms if cls else None
    decision, decision_text, summary = _entry_text(entry, place.has_manifest)
    shown = [col.name for col, pair in zip(inputs.columns, judged, strict=True) if pair]
    chart, chart_note = latency_chart(place.index, shown_cells, budget, inputs.samples)
    rollback_text, rollback_tone = rollback_entry(place.name, entry, inputs.runs)
    table = Table(cells=shown_cells, nows=nows, cls=cls, runs=inputs.runs)
    view = ClassView(
        name=place.name,
        anchor=place.anchor,
        key_text=place.key_text,
        in_project=cls is not None,
        decision=decision,
        decision_text=decision_text,
        summary=summary,
        reasons=reason_views(entry.reasons, DECISION_REASON_CODES) if entry else (),
        emulated=any(emulated_by.values()),
        stale=any(now.stale for now in nows),
        budgets_text=_budgets_text(cls),
        artifacts=tuple(shown),
        compare=compare(table) if shown_cells else (),
        cell_reasons=tuple(
            (c.artifact_name, now.verdict, reason_views(now.reasons, REASONS), c.error)
            for c, now in present
            if now.reasons or c.error
        ),
        chart=chart,
        chart_note=chart_note,
        parity=tuple(row for c, now in present for row in parity_rows(c, now)),
        warnings=warnings(shown_cells),
        rollback_text=rollback_text,
        rollback_tone=rollback_tone,
        runs=run_views(shown_cells, inputs.runs, cls),
    )
    return view, _heat_row(place, inputs.columns, judged, emulated_by)


def build_classes(inputs: Inputs) -> Classes:
    """Each class's section and heat-map row, in page order, and how many cells no class has.

    The project's classes come first in file order, then classes only the manifest names, by
    name; a class's cells are those measured on its exact key.
    """
    current = inputs.current
    entries = current.entries if current else {}
    by_key: dict[tuple[str, str, str], list[Cell]] = {}
    for cell in inputs.cells:
        by_key.setdefault(cell.key.as_tuple(), []).append(cell)
    names: list[tuple[str, HostClass | None]] = list(inputs.project.host_classes.items())
    names += [(n, None) for n in sorted(set(entries) - set(inputs.project.host_classes))]
    used_keys: set[tuple[str, str, str]] = set()
    views: list[ClassView] = []
    heat: list[HeatRow] = []
    for index, (name, cls) in enumerate(names, start=1):
        entry = entries.get(name)
        key = cls.key if cls else (entry.key if entry else None)
        class_cells = by_key.get(key.as_tuple(), []) if key else []
        if key:
            used_keys.add(key.as_tuple())
        place = _Place(index, name, cls, entry, current is not None)
        view, row = _class_view(place, class_cells, inputs)
        views.append(view)
        heat.append(row)
    orphans = sum(len(v) for k, v in by_key.items() if k not in used_keys)
    return Classes(views=tuple(views), heat=tuple(heat), orphans=orphans)


def build(inputs: Inputs, classes: Classes) -> tuple[ClassView, ...]:
    return classes.views
