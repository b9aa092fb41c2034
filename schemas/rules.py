"""The parity tolerance rule, owned once: which limit applies to an output and what fails it.

The runner (`qualify.parity`) applies it to fresh measurements; the policy (`manifest.policy`)
re-applies it to stored ones against the current project file; both word a failure the same
way, with the limit printed exactly as configured (``cosine_min 0.162 < 0.9999``, never
``< 1``) and the measured value rounded only as far as keeps it on its side of the limit.
Lives beside the documents it reads so that every layer may import it.
"""

from __future__ import annotations

from schemas.project import OutputTolerance, Tolerance

__all__ = ["TOLERANCE_FIELDS", "resolve_tolerance", "show_pair", "tolerance_failures"]

TOLERANCE_FIELDS = ("max_abs", "mean_abs", "max_rel", "cosine_min", "top1_agreement_min")
"""The limits of an `OutputTolerance`, in the order failures are listed."""

_CEILINGS = ("max_abs", "mean_abs", "max_rel")
_FLOORS = (("cosine_min", "cosine_min"), ("top1_agreement", "top1_agreement_min"))


def resolve_tolerance(tolerance: Tolerance, name: str) -> OutputTolerance:
    """The tolerance applied to one output: the per-output override field by field, else the
    family level; a field None on both is not checked."""
    override = tolerance.outputs.get(name)
    values: dict[str, float | None] = {}
    for field in TOLERANCE_FIELDS:
        own = getattr(override, field) if override is not None else None
        values[field] = own if own is not None else getattr(tolerance, field)
    return OutputTolerance(**values)


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


def tolerance_failures(measured: OutputTolerance, limits: OutputTolerance) -> list[str]:
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
