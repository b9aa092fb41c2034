"""Parity tolerances of the project file, and how a family's and an output's limits are found.

Owns the tolerance models (`OutputTolerance`, `Tolerance`, `TaskTolerance`) and the merging of
limits (a family's over the built-in default, an output's over its family's, the metrics that do
not apply to an output left out). Does not judge measured values against them
(``schemas.rules.tolerance_failures``, ``task_failures``).
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import Field

from schemas.rules import TOLERANCE_FIELDS
from schemas.workload import ProjectPart

__all__ = [
    "OutputTolerance",
    "TaskTolerance",
    "Tolerance",
    "applicable",
    "merge_tolerance",
    "resolve_tolerance",
]

_INHERITED = (
    " Left out: inherited (per output from its family's entry, a family's from the built-in "
    "default); null: not checked."
)


class OutputTolerance(ProjectPart):
    """Parity tolerances for one output. A limit left out is inherited field by field (an
    output's from its family's entry, a family's from the built-in defaults); a limit set to
    null is not checked (`schemas.tolerance.merge_tolerance`)."""

    max_abs: float | None = Field(
        default=None, ge=0, description="Largest allowed |a-b|." + _INHERITED
    )
    mean_abs: float | None = Field(
        default=None, ge=0, description="Largest allowed mean |a-b|." + _INHERITED
    )
    max_rel: float | None = Field(
        default=None, ge=0, description="Largest allowed |a-b| / max(|a|, eps)." + _INHERITED
    )
    cosine_min: float | None = Field(
        default=None,
        ge=-1,
        le=1,
        description="Smallest allowed cosine similarity per sample." + _INHERITED,
    )
    top1_agreement_min: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Smallest allowed share of positions whose arg-max over the last axis agrees "
        "(class-score outputs of rank 2 or more: per row, or per step of a sequence)." + _INHERITED,
    )


class Tolerance(OutputTolerance):
    """Parity tolerances of one precision family, overridable per output."""

    outputs: dict[str, OutputTolerance] = Field(
        default_factory=dict,
        description="Per-output overrides, by output name: each limit given here replaces the "
        "family's for that output alone (null turns it off there); the others are the family's.",
    )


class TaskTolerance(ProjectPart):
    """Task-level parity of one answer of the workload's post hook: what a user of the service
    sees, compared as a task is scored (tensor parity can pass a detector that lost every box)."""

    exact_match_min: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Smallest share of samples whose answer (a string, integers: the whole "
        "answer to one sample) equals the baseline's exactly.",
    )
    box_f1_min: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Smallest F1 of the candidate's boxes against the baseline's over all "
        "samples. Each sample's answer is an array of boxes [K, 4 or more]: columns x1, y1, x2, "
        "y2 (then anything, e.g. score and class); a candidate box matches one baseline box of "
        "IoU at least iou, one to one, the best overlaps first.",
    )
    iou: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Intersection over union at which two boxes match, for box_f1_min.",
    )


def merge_tolerance(base: Tolerance, entry: Tolerance) -> Tolerance:
    """A precision family's tolerance: ``base`` (the built-in default) with each limit that
    ``entry`` (the project's family entry) sets in its place, a null included (that check is
    off), and ``entry``'s per-output overrides. A limit ``entry`` leaves out keeps ``base``'s:
    setting ``max_abs`` alone does not drop the family's cosine or top-1 limits."""
    given = entry.model_fields_set
    values: dict[str, float | None] = {
        field: getattr(entry if field in given else base, field) for field in TOLERANCE_FIELDS
    }
    return Tolerance(**values, outputs={**base.outputs, **entry.outputs})


def resolve_tolerance(tolerance: Tolerance, name: str) -> OutputTolerance:
    """The limits applied to one output: each limit its per-output override sets (a null
    included: that check is off for this output), else the family's (`merge_tolerance`)."""
    override = tolerance.outputs.get(name)
    given = override.model_fields_set if override is not None else frozenset()
    values: dict[str, float | None] = {
        field: getattr(override if field in given else tolerance, field)
        for field in TOLERANCE_FIELDS
    }
    return OutputTolerance(**values)


def applicable(limits: OutputTolerance, skipped: Iterable[str]) -> OutputTolerance:
    """``limits`` without those of the metrics that do not apply to an output (an
    `OutputParity`'s ``skipped``: ``top1_agreement`` on a recurrent state, the tensor metrics
    on strings), so that a family-level limit is not failed by a metric nobody measured."""
    names = {("top1_agreement_min" if m == "top1_agreement" else m) for m in skipped}
    drop = {field: None for field in TOLERANCE_FIELDS if field in names}
    return limits.model_copy(update=drop) if drop else limits
