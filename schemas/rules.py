"""The rules every layer applies the same way, owned once: quantile rank (`order_rank`), p99
against a budget (`p99_outcome`), slowdown (`slower_than`), fallback count (`fallback_count`),
parity against its limits (`tolerance_failures`, `task_failures`; the limits themselves are
``schemas.tolerance``).

Owns the rules, not their inputs: the runner, the gates, the current verdict, the report and
telemetry call them (who uses which: docs/internals.md, ``schemas.rules``). Lives in the bottom
layer, standard library only when loaded: the measuring subprocess and the host-side telemetry
writer import it, and neither may pay for pydantic.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Literal, Protocol

    class Limits(Protocol):
        """What `tolerance_failures` reads of measured values and of their limits (an
        ``OutputTolerance``'s fields: ``schemas.tolerance``)."""

        @property
        def max_abs(self) -> float | None: ...
        @property
        def mean_abs(self) -> float | None: ...
        @property
        def max_rel(self) -> float | None: ...
        @property
        def cosine_min(self) -> float | None: ...
        @property
        def top1_agreement_min(self) -> float | None: ...

    class TaskLimits(Protocol):
        """What `task_failures` reads of a ``TaskTolerance`` (``schemas.tolerance``)."""

        @property
        def exact_match_min(self) -> float | None: ...
        @property
        def box_f1_min(self) -> float | None: ...
        @property
        def iou(self) -> float: ...

    Outcome = Literal["pass", "fail", "undecided"]

__all__ = [
    "OFF_PROVIDER_KEPT",
    "TOLERANCE_FIELDS",
    "batched_on",
    "fallback_count",
    "order_rank",
    "p99_outcome",
    "sample_at",
    "show_pair",
    "slower_than",
    "swept_axes",
    "task_failures",
    "tolerance_failures",
]

TOLERANCE_FIELDS = ("max_abs", "mean_abs", "max_rel", "cosine_min", "top1_agreement_min")
"""The limits of an `OutputTolerance`, in the order failures are listed."""

_CEILINGS = ("max_abs", "mean_abs", "max_rel")
_FLOORS = (("cosine_min", "cosine_min"), ("top1_agreement", "top1_agreement_min"))


def order_rank(n: int, q: float) -> int:
    """The 1-based rank of the sample reported as the q-quantile of n samples.

    The definition is numpy's ``inverted_cdf`` (Hyndman & Fan type 1): the smallest sample whose
    empirical CDF reaches q, i.e. ``X_(ceil(n*q))``, clamped to ``[1, n]``. ``n*q`` values within
    floating-point noise of an integer count as that integer (``100 * 0.99`` is 99, not 99.0000001).

    Args:
        n: Sample size, >= 1.
        q: Quantile, 0 <= q <= 1.

    Returns:
        The rank, 1 <= rank <= n.

    Raises:
        ValueError: n < 1 or q outside [0, 1].
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not (0.0 <= q <= 1.0):
        raise ValueError(f"q must be within [0, 1], got {q!r}")
    x = n * q
    nearest = round(x)
    rank = nearest if abs(x - nearest) <= 1e-9 * max(1.0, x) else math.ceil(x)
    return min(max(int(rank), 1), n)


def p99_outcome(lower: float | None, upper: float | None, budget: float) -> Outcome:
    """A p99's confidence bounds against its budget.

    Args:
        lower: The lower confidence bound (None: too few samples for one).
        upper: The upper confidence bound (None: too few samples for one).
        budget: The budget, in the bounds' unit.

    Returns:
        ``"pass"`` when the upper bound is at or below the budget, ``"fail"`` when the lower
        bound is above it, ``"undecided"`` otherwise (the bounds straddle it, or are missing).
    """
    if upper is not None and upper <= budget:
        return "pass"
    if lower is not None and lower > budget:
        return "fail"
    return "undecided"


def slower_than(lower: float | None, max_slowdown: float) -> bool:
    """Whether a paired candidate/baseline ratio shows the candidate measurably slower: its
    lower confidence bound (None: too few rounds) is above ``max_slowdown``."""
    return lower is not None and lower > max_slowdown


OFF_PROVIDER_KEPT = 20
"""How many of the nodes that ran off the expected provider a cell names (the first, in
onnxruntime's graph-assignment order); ``fallback_nodes`` counts them all."""


def fallback_count(nodes_per_provider: Mapping[str, int], expected: str) -> int:
    """Nodes that ran on any provider but ``expected``."""
    # All of them less the expected provider's (a key appears once): no per-item Python loop,
    # for the policy that asks once or twice per class of a fleet.
    return sum(nodes_per_provider.values()) - nodes_per_provider.get(expected, 0)


def show_pair(measured: float, limit: float) -> tuple[str, str]:
    """``(measured, limit)`` as text: the limit exactly (shortest round-trip repr), the measured
    value to 3 significant digits, or more when fewer would land on or across the limit."""
    exact = repr(float(limit))
    for digits in (3, 6, 9):
        text = f"{measured:.{digits}g}"
        shown = float(text)
        if (shown > limit) == (measured > limit) and (shown < limit) == (measured < limit):
            return text, exact
    return repr(float(measured)), exact


def tolerance_failures(measured: Limits, limits: Limits) -> list[str]:
    """What fails ``limits`` among the measured values of one output, one phrase each.

    Args:
        measured: The measured metrics (an `OutputParity`'s ``min_passing``): None where a metric
            was not measured. ``top1_agreement_min`` None means arg-max agreement does not
            apply to the output (not class scores), which a family-level limit tolerates; the
            load check refuses a per-output limit on such an output.
        limits: The resolved tolerance.

    Returns:
        ``max_abs 0.081 > 0.05``-style phrases; a set limit with nothing measured under it reads
        ``max_abs could not be compared``.
    """
    found: list[str] = []
    for field in _CEILINGS:
        value, limit = getattr(measured, field), getattr(limits, field)
        if limit is None:
            continue
        if value is None:
            found.append(f"{field} could not be compared")
        elif not value <= limit:
            shown, exact = show_pair(value, limit)
            found.append(f"{field} {shown} > {exact}")
    for label, field in _FLOORS:
        value, limit = getattr(measured, field), getattr(limits, field)
        if limit is None:
            continue
        if value is None:
            if field != "top1_agreement_min":
                found.append(f"{label} could not be compared")
        elif not value >= limit:
            shown, exact = show_pair(value, limit)
            found.append(f"{label} {shown} < {exact}")
    return found


def task_failures(
    exact_match: float | None,
    box_f1: float | None,
    iou: float | None,
    limits: TaskLimits | None,
) -> list[str]:
    """What fails a task-level tolerance (``parity.post``) among one answer's measured values,
    one phrase each, worded as `tolerance_failures` words the tensor ones.

    Args:
        exact_match: The measured exact-match rate (None: not measured, e.g. floats).
        box_f1: The measured box F1 (None: not measured).
        iou: The IoU the box F1 was measured at.
        limits: The tolerance (None: nothing to check).

    Returns:
        ``exact_match 0.84 < 0.95``-style phrases; a box F1 measured at another IoU than the
        tolerance's reads as not comparable (it must be measured again).
    """
    if limits is None:
        return []
    found: list[str] = []
    for label, value, limit in (
        ("exact_match", exact_match, limits.exact_match_min),
        ("box_f1", box_f1, limits.box_f1_min),
    ):
        if limit is None:
            continue
        if label == "box_f1" and value is not None and iou != limits.iou:
            found.append(f"box_f1 was measured at IoU {iou!r}, not {limits.iou!r}: run again")
        elif value is None:
            found.append(f"{label} could not be compared")
        elif not value >= limit:
            shown, exact = show_pair(value, limit)
            found.append(f"{label} {shown} < {exact}")
    return found


def batched_on(batch_axis: int | None, source: str, state_from: str | None) -> int | None:
    """The axis batch sizes apply to for a workload input, or None when it is fed whole.

    An input with a batch axis is batched unless it is a fixed value (a constant is fed as
    declared), except a fixed recurrent state (``state_from``), whose value fills each batch.
    Owned here, with the standard library alone, for the project model and the measuring child.
    """
    if batch_axis is None or (source == "fixed" and not state_from):
        return None
    return batch_axis


def swept_axes(shape: list[int | str], axis: int | None) -> list[int]:
    """The axes of one sample (``shape`` without the batch axis ``axis``, as `batched_on`
    gives it) that a swept dimension sizes: those the shape names instead of sizing. Owned here
    for the input pool (`qualify.measure.workload`) and the measuring child, which cuts them."""
    kept = [d for k, d in enumerate(shape) if k != axis]
    return [k for k, d in enumerate(kept) if isinstance(d, str)]


def sample_at(shape: list[int | str], axis: int | None, dims: dict[str, int]) -> list[int]:
    """The shape of one sample (``shape`` without the batch axis ``axis``) with each named
    dimension at its size in ``dims`` (1 where ``dims`` does not name it)."""
    kept = [d for k, d in enumerate(shape) if k != axis]
    return [d if isinstance(d, int) else dims.get(d, 1) for d in kept]
