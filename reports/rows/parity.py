"""Parity against the baseline: its row, its words in the heat map, its per-output table.

The limits shown are those the current verdict applied (the project's tolerances now); a stale
cell was not judged now, so the run's own limits are shown for it.
"""

from __future__ import annotations

from collections.abc import Sequence

from manifest.verdict import CurrentVerdict
from reports.formatting import NOT_MEASURED, number, tolerance
from reports.rows.table import Table
from reports.view import CompareRow, ParityRow, Tone
from schemas.cell import Cell, OutputParity
from schemas.project import OutputTolerance, TaskTolerance

__all__ = ["parity_row", "parity_rows", "parity_text"]


_PARITY_CHECKS: tuple[tuple[str, str, str], ...] = (
    # (check, measured attribute, tolerance attribute)
    ("max |a-b|", "max_abs", "max_abs"),
    ("mean |a-b|", "mean_abs", "mean_abs"),
    ("max relative", "max_rel", "max_rel"),
    ("min cosine", "cosine_min", "cosine_min"),
    ("top-1 agreement", "top1_agreement", "top1_agreement_min"),
)


_TASK_CHECKS: tuple[tuple[str, str, str], ...] = (
    # (check, measured attribute, task tolerance attribute): shown first, what users see
    ("exact match", "exact_match", "exact_match_min"),
    ("box F1", "box_f1", "box_f1_min"),
)


_TASK_PHRASES = tuple(attr for _, attr, _ in _TASK_CHECKS)
"""How `schemas.rules.task_failures` phrases begin (``exact_match 0.84 < 0.95``)."""


def parity_rows(cell: Cell, now: CurrentVerdict) -> list[ParityRow]:
    if cell.parity is None:
        return []
    # The limits the current verdict applied (the project's tolerances now, merged field by
    # field); a stale cell was not judged now, so the run's own limits are shown for it.
    judged = {o.name: o for o in now.parity}
    rows = []
    numerics = cell.numerics
    here = numerics.native_max_abs if numerics is not None else None
    # Task-level outputs first (what a user of the service sees), then the tensors.
    for out in sorted(cell.parity.outputs, key=lambda o: o.task_tolerance is None):
        found = judged.get(out.name)
        failures = out.failures if found is None else found.failures
        task = out.task_tolerance if found is None else found.task
        rows.extend(_task_rows(cell.artifact_name, out, task, failures))
        # The task-level failures have rows of their own (above): not repeated as the tensors'.
        tensors = [f for f in failures if not f.startswith(_TASK_PHRASES)]
        limits = out.tolerance if found is None else found.limits
        rows.extend(_output_rows(cell.artifact_name, out, limits, tensors))
        if numerics is not None and here is not None and out.name in here:
            # The difference the ISA makes: the same pair on the measuring host's own CPU.
            rows.append(
                ParityRow(
                    artifact=cell.artifact_name,
                    output=out.name,
                    check=f"max |a-b| on the measuring host, not {numerics.cpu}",
                    measured=number(here[out.name]),
                    tolerance="not judged",
                    min_passing="—",
                    tone="muted",
                )
            )
    return rows


def _task_rows(
    artifact: str, out: OutputParity, task: TaskTolerance | None, failures: Sequence[str]
) -> list[ParityRow]:
    """The task-level checks of one answer under ``task`` (``parity.post`` now, or the run's
    for a stale cell): exact match, box F1."""
    if task is None:
        return []
    rows = []
    for check, measured_attr, tol_attr in _TASK_CHECKS:
        limit = getattr(task, tol_attr)
        if limit is None:
            continue
        measured = getattr(out, measured_attr)
        label = f"{check} at IoU {number(task.iou)}" if measured_attr == "box_f1" else check
        failed = any(f.startswith(measured_attr) for f in failures)
        rows.append(
            ParityRow(
                artifact=artifact,
                output=out.name,
                check=label,
                measured=number(measured) if measured is not None else NOT_MEASURED,
                tolerance=f"≥ {tolerance(limit)}",
                min_passing=number(measured) if measured is not None else "none",
                tone="bad" if failed else "ok",
            )
        )
    return rows


def _output_rows(
    artifact: str, out: OutputParity, tol: OutputTolerance, failures: Sequence[str]
) -> list[ParityRow]:
    rows = []
    unchecked = []
    for check, measured_attr, tol_attr in _PARITY_CHECKS:
        measured = getattr(out, measured_attr)
        limit = getattr(tol, tol_attr)
        smallest = getattr(out.min_passing, tol_attr)
        at_run = getattr(out.tolerance, tol_attr)
        if limit is None:
            if measured is not None:
                unchecked.append(f"{check} {number(measured)}")
            continue
        failed = any(f.startswith(tol_attr) or f.startswith(measured_attr) for f in failures)
        rows.append(
            ParityRow(
                artifact=artifact,
                output=out.name,
                check=check,
                measured=number(measured),
                tolerance=tolerance(limit)
                + ("" if at_run == limit else f" (run: {tolerance(at_run) if at_run else 'off'})"),
                min_passing=number(smallest) if smallest is not None else "none",
                tone="bad" if failed else "ok",
            )
        )
    if failures and not any(r.tone == "bad" for r in rows):
        rows.append(
            ParityRow(
                artifact=artifact,
                output=out.name,
                check="failures",
                measured="; ".join(failures),
                tolerance="",
                min_passing="",
                tone="bad",
            )
        )
    if unchecked:
        rows.append(
            ParityRow(
                artifact=artifact,
                output=out.name,
                check="no tolerance",
                measured=", ".join(unchecked),
                tolerance="not checked",
                min_passing="",
                tone="muted",
            )
        )
    rows.extend(_output_notes(artifact, out))
    return rows


def _output_notes(artifact: str, out: OutputParity) -> list[ParityRow]:
    """What the metrics were taken over, and the metrics that do not apply, with why."""
    notes = [("measured over", out.over)] if out.over else []
    reasons: dict[str, list[str]] = {}
    for metric, why in out.skipped.items():
        reasons.setdefault(why, []).append(metric.replace("_", " "))
    notes += [(f"not applied: {', '.join(metrics)}", why) for why, metrics in reasons.items()]
    return [
        ParityRow(
            artifact=artifact,
            output=out.name,
            check=check,
            measured=text,
            tolerance="",
            min_passing="",
            tone="muted",
        )
        for check, text in notes
    ]


def parity_text(cell: Cell, now: CurrentVerdict) -> tuple[str, Tone]:
    if cell.role == "baseline":
        return "reference", "muted"
    if cell.parity is None:
        return "parity " + NOT_MEASURED, "muted"
    if now.stale:
        return "parity stale", "muted"
    verdict = "parity fail" if "parity_failed" in now.codes else "parity pass"
    # The task-level figures first where parity.post asks for them: what users see.
    applied = {o.name: o.task for o in now.parity}
    tasks = [
        f"{o.name} {check} {number(getattr(o, attr))}"
        for o in cell.parity.outputs
        if (task := applied.get(o.name, o.task_tolerance)) is not None
        for check, attr, limit in _TASK_CHECKS
        if getattr(task, limit) is not None and getattr(o, attr) is not None
    ]
    return (f"{verdict} ({'; '.join(tasks)})" if tasks else verdict), ""


def parity_row(table: Table) -> list[CompareRow]:
    return [table.row("parity", lambda c: parity_text(c, table.now(c)), "parity")]
