"""Output parity: does a candidate compute the same numbers as the baseline on identical inputs?

Owns the comparison of two sets of model outputs (name -> array, axis 0 = the sample axis, the
same rows in the same order) against a precision family's `Tolerance`, and the resulting
`ParityResult`. Does not run models, feed inputs or choose the tolerance: the runner hands over
the arrays, the project file supplies the tolerance.

Metrics per output, all over float64 copies of the arrays (``a`` = reference, ``b`` = candidate):

- ``max_abs``, ``mean_abs``: largest and mean ``|a - b|`` over all elements.
- ``max_rel``: largest ``|a - b| / max(|a|, REL_EPS)``; `REL_EPS` keeps reference values near
  zero from turning rounding noise into huge relative errors.
- ``cosine_min``: the smallest per-sample cosine similarity, each sample flattened over the axes
  after the first. Two all-zero samples have cosine 1.0; an all-zero sample against a non-zero one
  has 0.0. Clipped to [-1, 1] (rounding can land a hair outside).
- ``top1_agreement``: for class-score outputs (a floating-point reference of rank 2 or more whose
  last axis is longer than 1), the share of positions whose arg-max over the last axis agrees:
  one per row of [N, classes], one per step of a sequence [N, steps, classes] (a CTC
  recogniser's per-step labels). None for any other output.

Outputs that cannot be compared fail with a sentence saying why, and every metric is None
(not measured, never a made-up number); the metric checks are skipped for them, so the one
sentence says why. That covers an
output missing from either side, a shape mismatch, and NaN or Inf in either output (a non-finite
reference makes every difference meaningless; a non-finite candidate is a broken model). Empty outputs (no rows, or no elements per row) compare vacuously: zero
differences, cosine 1.0.

Tolerances are resolved and applied by `schemas.rules` (the one owner of that rule, shared with
the policy). ``min_passing`` records the measured values: the tightest tolerance that would have
passed.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from schemas.cell import OutputParity, ParityResult
from schemas.project import OutputTolerance, Tolerance
from schemas.rules import resolve_tolerance, tolerance_failures

__all__ = ["REL_EPS", "compare_outputs"]

REL_EPS = 1e-6
"""Floor of the denominator of the relative error: ``|a - b| / max(|a|, REL_EPS)``."""

_Array = npt.NDArray[np.float64]


def _is_class_scores(arr: npt.NDArray[np.generic]) -> bool:
    """Floating-point scores over classes on the last axis: [N, classes] or [N, ..., classes]."""
    return bool(np.issubdtype(arr.dtype, np.floating)) and arr.ndim >= 2 and arr.shape[-1] > 1


def _rows(arr: npt.NDArray[np.generic]) -> _Array:
    """float64 copy shaped (samples, elements per sample); a 0-d array is one sample."""
    flat = np.asarray(arr, dtype=np.float64)
    if flat.ndim == 0:
        return flat.reshape(1, 1)
    return flat.reshape(flat.shape[0], -1)


def _cosine_min(a: _Array, b: _Array) -> float:
    # Scale each row by its own largest magnitude first: cosine is scale-invariant, and this keeps
    # the dot products away from overflow and underflow.
    scale_a = np.max(np.abs(a), axis=1, keepdims=True)
    scale_b = np.max(np.abs(b), axis=1, keepdims=True)
    a = np.divide(a, scale_a, out=np.zeros_like(a), where=scale_a > 0)
    b = np.divide(b, scale_b, out=np.zeros_like(b), where=scale_b > 0)
    norm_a = np.sqrt(np.sum(a * a, axis=1))
    norm_b = np.sqrt(np.sum(b * b, axis=1))
    dot = np.sum(a * b, axis=1)
    both = (norm_a > 0) & (norm_b > 0)
    cos = np.where((norm_a == 0) & (norm_b == 0), 1.0, 0.0)
    np.divide(dot, norm_a * norm_b, out=cos, where=both)
    return float(np.clip(np.min(cos), -1.0, 1.0))


def _nonfinite(arr: npt.NDArray[np.generic]) -> int:
    if not np.issubdtype(arr.dtype, np.floating):
        return 0
    return int(np.count_nonzero(~np.isfinite(arr)))


def _structural_failure(
    name: str,
    reference: npt.NDArray[np.generic] | None,
    candidate: npt.NDArray[np.generic] | None,
) -> str | None:
    if reference is None:
        return f"output '{name}' is produced by the candidate but not by the reference (baseline)"
    if candidate is None:
        return f"output '{name}' is missing from the candidate"
    if reference.shape != candidate.shape:
        return (
            f"shape {list(candidate.shape)} of output '{name}' differs from the reference's "
            f"{list(reference.shape)}"
        )
    bad_ref = _nonfinite(reference)
    if bad_ref:
        return (
            f"reference (baseline) output '{name}' has {bad_ref} non-finite value(s) (NaN or Inf) "
            f"of {reference.size}; parity cannot be judged"
        )
    bad_cand = _nonfinite(candidate)
    if bad_cand:
        return (
            f"candidate output '{name}' has {bad_cand} non-finite value(s) (NaN or Inf) "
            f"of {candidate.size}"
        )
    return None


def _compare_one(
    name: str,
    reference: npt.NDArray[np.generic] | None,
    candidate: npt.NDArray[np.generic] | None,
    tol: OutputTolerance,
) -> OutputParity:
    class_scores = reference is not None and _is_class_scores(reference)
    structural = _structural_failure(name, reference, candidate)
    failures: list[str] = []
    top1: float | None
    max_abs: float | None
    mean_abs: float | None
    max_rel: float | None
    cosine_min: float | None
    if structural is None and reference is not None and candidate is not None:
        a, b = _rows(reference), _rows(candidate)
        if a.size == 0:
            max_abs = mean_abs = max_rel = 0.0
            cosine_min = 1.0
        else:
            diff = np.abs(a - b)
            max_abs = float(np.max(diff))
            mean_abs = float(np.mean(diff))
            max_rel = float(np.max(diff / np.maximum(np.abs(a), REL_EPS)))
            cosine_min = _cosine_min(a, b)
        top1 = None
        if class_scores:  # one arg-max per position: per row, or per step of a sequence
            agree = np.argmax(reference, axis=-1) == np.argmax(candidate, axis=-1)
            top1 = float(np.mean(agree)) if agree.size else 1.0
    else:
        failures.append(structural or f"output '{name}' cannot be compared")
        max_abs = mean_abs = max_rel = cosine_min = top1 = None

    measured = OutputTolerance(
        max_abs=max_abs,
        mean_abs=mean_abs,
        max_rel=max_rel,
        cosine_min=cosine_min,
        top1_agreement_min=top1,
    )
    if not failures:  # the worst-case values of an uncomparable output would only repeat it
        failures.extend(tolerance_failures(measured, tol))

    return OutputParity(
        name=name,
        max_abs=max_abs,
        mean_abs=mean_abs,
        max_rel=max_rel,
        cosine_min=cosine_min,
        top1_agreement=top1,
        tolerance=tol,
        passed=not failures,
        failures=failures,
        min_passing=measured,
    )


def compare_outputs(
    reference: Mapping[str, npt.NDArray[np.generic]],
    candidate: Mapping[str, npt.NDArray[np.generic]],
    tolerance: Tolerance,
    *,
    reference_digest: str,
) -> ParityResult:
    """Compare a candidate's outputs with the reference (baseline) outputs on the same inputs.

    Args:
        reference: Baseline outputs by name; axis 0 is the sample axis.
        candidate: Candidate outputs by name, the same rows in the same order.
        tolerance: The candidate's precision-family tolerance with per-output overrides.
        reference_digest: ``sha256:<hex>`` of the baseline artifact.

    Returns:
        The parity result: one `OutputParity` per output name (reference order, then names only
        the candidate produced); ``passed`` only if every output passed. ``samples`` is axis 0 of
        the first reference output (1 for a 0-d output).

    Raises:
        ValueError: the reference has no outputs.
        pydantic.ValidationError: reference_digest is not ``sha256:`` + 64 hex digits.
    """
    if not reference:
        raise ValueError("the reference (baseline) has no outputs to compare against")
    names = [*reference, *(n for n in candidate if n not in reference)]
    outputs = [
        _compare_one(
            name,
            np.asarray(reference[name]) if name in reference else None,
            np.asarray(candidate[name]) if name in candidate else None,
            resolve_tolerance(tolerance, name),
        )
        for name in names
    ]
    first = np.asarray(next(iter(reference.values())))
    samples = int(first.shape[0]) if first.ndim else 1
    return ParityResult(
        reference_digest=reference_digest,
        samples=samples,
        passed=all(o.passed for o in outputs),
        outputs=outputs,
    )
