"""Output parity: does a candidate compute the same numbers, and give the same answers, as the
baseline on identical inputs?

Owns comparing two sets of outputs (each given as its samples, sample axis first) against a
precision family's `Tolerance` and the post hook's task-level tolerances, the resulting
`ParityResult`, and which output is what (`output_roles`). Does not run models, feed inputs or
choose the tolerance (`schemas.rules` resolves and applies it). The metrics, defined:
docs/concepts.md, "Parity metrics".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from schemas.cell import OutputParity, ParityResult
from schemas.project import OutputTolerance, TaskTolerance, Tolerance, Workload
from schemas.rules import task_failures, tolerance_failures
from schemas.tolerance import applicable, resolve_tolerance

__all__ = [
    "REL_EPS",
    "SHAPES_SUFFIX",
    "OutputRole",
    "Rows",
    "compare_outputs",
    "output_roles",
    "unpack",
]

REL_EPS = 1e-6
"""Floor of the denominator of the relative error: ``|a - b| / max(|a|, REL_EPS)``."""

SHAPES_SUFFIX = "#shapes"
"""In the child's outputs file, ``<name>#shapes`` holds the per-sample shapes of an output whose
samples differ in shape; ``<name>`` then holds their values one after another."""

_Array = npt.NDArray[np.float64]
Rows = npt.NDArray[np.generic] | list[npt.NDArray[np.generic]]
"""One output's samples: ``[N, ...]`` when all have one shape, else a list of N arrays."""
_Dim = int | str | None
"""One dimension of a graph's tensor: a size, a symbolic name, or None (undeclared)."""
_Kind = Literal["scores", "state", "values"]


@dataclass(frozen=True)
class OutputRole:
    """What one output is: where its batch axis lies and what kind of values it holds."""

    batch_axis: int | None = None
    """The axis of one inference's output that holds its sample; None when not known."""
    axis_from: str | None = None
    """Where ``batch_axis`` came from, for the cell's ``over``."""
    kind: _Kind | None = None
    """As the project or the workload says; None: told by the values (`compare_outputs`)."""
    kind_from: str | None = None
    """Why ``kind``, for the cell's ``skipped``."""


def output_roles(
    outputs: Mapping[str, Sequence[_Dim] | None],
    inputs: Mapping[str, Sequence[_Dim] | None],
    workload: Workload,
) -> dict[str, OutputRole]:
    """Each output's batch axis and kind, from the model's graph and the project.

    The batch axis is, first, ``workload.outputs.<name>.batch_axis``; else the one axis of the
    output the graph names with the symbol an input's batch axis carries (``N`` in ``x [N, 16]``
    and ``y [T, N, C]``); else, for an output fed back as an input (``state_from``), that input's
    ``batch_axis``. The kind is ``workload.outputs.<name>.kind``, else ``state`` for an output
    fed back.

    Args:
        outputs: The baseline's graph outputs: name -> declared dims (None: rank unknown).
        inputs: Its graph inputs the same way.
        workload: The project's workload.

    Returns:
        A role for every output named by the graph or the workload.
    """
    symbols: dict[str, str] = {}
    for name, spec in workload.inputs.items():
        dims = inputs.get(name)
        axis = spec.batch_axis if spec.batched else None
        symbol = dims[axis] if dims is not None and axis is not None and axis < len(dims) else None
        if isinstance(symbol, str):
            symbols.setdefault(symbol, name)
    fed = {
        str(spec.state_from): (name, spec)
        for name, spec in workload.inputs.items()
        if spec.state_from is not None
    }
    roles: dict[str, OutputRole] = {}
    for name in [*outputs, *(n for n in workload.outputs if n not in outputs)]:
        own = workload.outputs.get(name)
        axis, axis_from = _graph_axis(outputs.get(name), symbols)
        back = fed.get(name)
        if own is not None and own.batch_axis is not None:
            axis, axis_from = own.batch_axis, f"workload.outputs.{name}.batch_axis"
        elif axis is None and back is not None and back[1].batched:
            axis = back[1].batch_axis
            axis_from = f"the batch_axis of input {back[0]!r}, which it is fed back to"
        kind: _Kind | None = None
        kind_from = None
        if own is not None and own.kind is not None:
            kind, kind_from = own.kind, f"workload.outputs.{name}.kind is {own.kind}"
        elif back is not None:
            kind = "state"
            kind_from = f"a recurrent state, fed back as input {back[0]!r} (state_from)"
        roles[name] = OutputRole(axis, axis_from, kind, kind_from)
    return roles


def _graph_axis(
    dims: Sequence[_Dim] | None, symbols: Mapping[str, str]
) -> tuple[int | None, str | None]:
    if not dims:
        return None, None
    found = [k for k, d in enumerate(dims) if isinstance(d, str) and d in symbols]
    if len(found) != 1:
        return None, None
    k = found[0]
    return k, f"the model's graph: {dims[k]!r}, the batch axis of input {symbols[str(dims[k])]!r}"


def unpack(saved: Mapping[str, npt.NDArray[np.generic]]) -> dict[str, Rows]:
    """The outputs the measuring child saved (``qualify.measure.worker``), as samples per output: an
    output saved whole is ``[N, ...]``; one saved with its shapes is split back into a list."""
    found: dict[str, Rows] = {}
    for key, values in saved.items():
        if key.endswith(SHAPES_SUFFIX):
            continue
        shapes = saved.get(key + SHAPES_SUFFIX)
        if shapes is None:
            found[key] = np.asarray(values)
            continue
        flat = np.asarray(values).reshape(-1)
        rows: list[npt.NDArray[np.generic]] = []
        start = 0
        for shape in np.asarray(shapes, dtype=np.int64).reshape(len(shapes), -1):
            dims = tuple(int(d) for d in shape if d >= 0)
            size = int(np.prod(dims)) if dims else 1
            rows.append(flat[start : start + size].reshape(dims))
            start += size
        found[key] = rows
    return found


def _count(rows: Rows) -> int:
    return len(rows) if isinstance(rows, list) else int(rows.shape[0]) if rows.ndim else 1


def _samples(rows: Rows) -> list[npt.NDArray[np.generic]]:
    if isinstance(rows, list):
        return rows
    return list(rows) if rows.ndim else [rows]


def _is_text(rows: Rows) -> bool:
    first = rows[0] if isinstance(rows, list) and rows else rows
    return isinstance(first, np.ndarray) and first.dtype.kind in "USO"


def _is_float(rows: Rows) -> bool:
    first = rows[0] if isinstance(rows, list) and rows else rows
    return isinstance(first, np.ndarray) and bool(np.issubdtype(first.dtype, np.floating))


def _without_batch_axis(rows: Rows, axis: int | None) -> Rows:
    """Each sample without its own batch axis (one element, as one sample was fed)."""
    if axis is None:
        return rows
    if isinstance(rows, list):
        if all(r.ndim > axis and r.shape[axis] == 1 for r in rows):
            return [np.squeeze(r, axis=axis) for r in rows]
        return rows
    if rows.ndim > axis + 1 and rows.shape[axis + 1] == 1:
        return np.squeeze(rows, axis=axis + 1)
    return rows


def _structural_failure(
    name: str, reference: Rows | None, candidate: Rows | None, *, task: bool = False
) -> str | None:
    """Why two outputs cannot be compared at all, or None. With a task-level tolerance
    (``task``), samples of different shapes can still be (two detectors find different numbers
    of boxes): the tensor metrics then do not apply, and `_measure` says so."""
    if reference is None:
        return f"output '{name}' is produced by the candidate but not by the reference (baseline)"
    if candidate is None:
        return f"output '{name}' is missing from the candidate"
    if _is_text(reference) != _is_text(candidate):
        return f"output '{name}' is text on one side and numbers on the other"
    if isinstance(reference, list) or isinstance(candidate, list):
        ref, cand = _samples(reference), _samples(candidate)
        if len(ref) != len(cand):
            return f"output '{name}' has {len(cand)} samples, the reference {len(ref)}"
        for k, (a, b) in enumerate(zip(ref, cand, strict=True)):
            if a.shape != b.shape and not task:
                return (
                    f"sample {k} of output '{name}' has shape {list(b.shape)}, the reference's "
                    f"{list(a.shape)}"
                )
    elif reference.shape != candidate.shape and not (task and reference.ndim and candidate.ndim):
        return (
            f"shape {list(candidate.shape)} of output '{name}' differs from the reference's "
            f"{list(reference.shape)}"
        )
    for side, rows in (("reference (baseline)", reference), ("candidate", candidate)):
        bad = _nonfinite(rows)
        if bad:
            where = f"{side} output '{name}'"
            cause = "; parity cannot be judged" if side.startswith("reference") else ""
            return f"{where} has {bad} non-finite value(s) (NaN or Inf) of {_size(rows)}{cause}"
    return None


def _nonfinite(rows: Rows) -> int:
    if not _is_float(rows):
        return 0
    return sum(int(np.count_nonzero(~np.isfinite(r))) for r in _blocks(rows))


def _size(rows: Rows) -> int:
    return sum(int(r.size) for r in _blocks(rows))


def _blocks(rows: Rows) -> list[npt.NDArray[np.generic]]:
    """The arrays holding the samples: the one array, or each sample of a list."""
    return rows if isinstance(rows, list) else [rows]


def _flat(rows: npt.NDArray[np.generic]) -> _Array:
    """float64 copy shaped (samples, elements per sample); a 0-d array is one sample."""
    flat = np.asarray(rows, dtype=np.float64)
    if flat.ndim == 0:
        return flat.reshape(1, 1)
    return flat.reshape(flat.shape[0], -1)


def _cosines(a: _Array, b: _Array) -> _Array:
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
    return np.clip(cos, -1.0, 1.0)


@dataclass
class _Tensor:
    """The tensor metrics of one output, accumulated over its arrays of samples."""

    max_abs: float = 0.0
    abs_sum: float = 0.0
    elements: int = 0
    max_rel: float = 0.0
    cosine_min: float = 1.0
    agree: int = 0
    positions: int = 0

    def add(self, ref: npt.NDArray[np.generic], cand: npt.NDArray[np.generic], top1: bool) -> None:
        """One array of samples (sample axis first) of each side."""
        a, b = _flat(ref), _flat(cand)
        if a.size:
            diff = np.abs(a - b)
            self.max_abs = max(self.max_abs, float(np.max(diff)))
            self.abs_sum += float(np.sum(diff))
            self.elements += int(diff.size)
            self.max_rel = max(self.max_rel, float(np.max(diff / np.maximum(np.abs(a), REL_EPS))))
            self.cosine_min = min(self.cosine_min, float(np.min(_cosines(a, b))))
        if top1:
            agree = np.argmax(ref, axis=-1) == np.argmax(cand, axis=-1)
            self.agree += int(np.count_nonzero(agree))
            self.positions += int(agree.size)


def _top1_skipped(rows: Rows, role: OutputRole) -> str | None:
    """Why top-1 agreement does not apply to an output, or None when it does."""
    if role.kind == "scores":
        return None
    if role.kind is not None:
        return str(role.kind_from)
    first = _samples(rows)[0] if _count(rows) else None
    if first is None or not _is_float(rows):
        return "not class scores: not floating-point"
    if first.ndim < 1:
        return "not class scores: one value per sample"
    if first.shape[-1] <= 1:
        return "not class scores: its last axis has one element"
    return None


def _shapes_differ(ref: Rows, cand: Rows) -> bool:
    if isinstance(ref, list) or isinstance(cand, list):
        pairs = zip(_samples(ref), _samples(cand), strict=True)
        return any(a.shape != b.shape for a, b in pairs)
    return bool(ref.shape != cand.shape)


def _exact_match(ref: Rows, cand: Rows) -> float:
    pairs = list(zip(_samples(ref), _samples(cand), strict=True))
    if not pairs:
        return 1.0
    return sum(bool(np.array_equal(a, b)) for a, b in pairs) / len(pairs)


def _boxes(sample: npt.NDArray[np.generic]) -> _Array | None:
    """A sample's boxes as [K, 4] corners, or None when it is not an array of boxes."""
    arr = np.asarray(sample, dtype=np.float64) if sample.dtype.kind in "biuf" else None
    if arr is None:
        return None
    if arr.size == 0:
        return np.zeros((0, 4))
    while arr.ndim > 2 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim != 2 or arr.shape[1] < 4:
        return None
    return arr[:, :4]


def _iou(a: _Array, b: _Array) -> _Array:
    """IoU of every box of ``a`` with every box of ``b`` (x1, y1, x2, y2)."""
    area_a = np.clip(a[:, 2] - a[:, 0], 0, None) * np.clip(a[:, 3] - a[:, 1], 0, None)
    area_b = np.clip(b[:, 2] - b[:, 0], 0, None) * np.clip(b[:, 3] - b[:, 1], 0, None)
    w = np.clip(
        np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0]), 0, None
    )
    h = np.clip(
        np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1]), 0, None
    )
    inter = w * h
    union = area_a[:, None] + area_b[None, :] - inter
    found: _Array = np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)
    return found


def _matched(a: _Array, b: _Array, threshold: float) -> int:
    """Boxes of ``b`` matched one to one to boxes of ``a`` at IoU >= threshold, the best
    overlaps first (greedy, as detection benchmarks match)."""
    if not len(a) or not len(b):
        return 0
    ious = _iou(a, b)
    pairs = np.argwhere(ious >= threshold)
    order = np.argsort(-ious[pairs[:, 0], pairs[:, 1]], kind="stable")
    used_a: set[int] = set()
    used_b: set[int] = set()
    for i, j in pairs[order].tolist():
        if i not in used_a and j not in used_b:
            used_a.add(i)
            used_b.add(j)
    return len(used_a)


def _box_f1(ref: Rows, cand: Rows, threshold: float) -> float | None:
    matched = total = 0
    for a, b in zip(_samples(ref), _samples(cand), strict=True):
        boxes_a, boxes_b = _boxes(a), _boxes(b)
        if boxes_a is None or boxes_b is None:
            return None
        total += len(boxes_a) + len(boxes_b)
        matched += _matched(boxes_a, boxes_b, threshold)
    return 1.0 if total == 0 else 2.0 * matched / total


def _over(n: int, role: OutputRole, top1: _Tensor | None, text: bool) -> str:
    """What the metrics of one output were taken over, in one sentence."""
    said = f"{n} samples, one inference each"
    if role.batch_axis is not None:
        said += f"; its batch axis {role.batch_axis} from {role.axis_from}"
    else:
        said += "; no batch axis known: each inference's whole output is one sample"
    if text:
        return said + "; compared by exact match"
    said += "; cosine per sample"
    if top1 is not None and top1.positions:
        per = top1.positions // max(1, n)
        where = "one per sample" if per == 1 else f"{per} per sample (arg-max over the last axis)"
        said += f"; top-1 over {top1.positions} positions, {where}"
    return said


@dataclass(frozen=True)
class _Measured:
    max_abs: float | None = None
    mean_abs: float | None = None
    max_rel: float | None = None
    cosine_min: float | None = None
    top1: float | None = None
    exact_match: float | None = None
    box_f1: float | None = None


def _measure(
    ref: Rows, cand: Rows, role: OutputRole, task: TaskTolerance | None, skipped: dict[str, str]
) -> tuple[_Measured, _Tensor | None]:
    """Every metric that applies; those that do not are named in ``skipped``."""
    text = _is_text(ref)
    exact = None if _is_float(ref) else _exact_match(ref, cand)
    f1 = None
    if task is not None and task.box_f1_min is not None:
        f1 = _box_f1(ref, cand, task.iou)
    unlike = _shapes_differ(ref, cand)
    if text or unlike:
        unfit = (
            "text: compared by exact match"
            if text
            else "its samples differ in shape from the reference's: compared by the task-level "
            "metrics alone"
        )
        for metric in ("max_abs", "mean_abs", "max_rel", "cosine_min", "top1_agreement"):
            skipped[metric] = unfit
        return _Measured(exact_match=exact, box_f1=f1), None
    why = _top1_skipped(ref, role)
    if why is not None:
        skipped["top1_agreement"] = why
    tensor = _Tensor()
    for a, b in zip(_blocks(ref), _blocks(cand), strict=True):
        one = isinstance(ref, list)
        tensor.add(a[None] if one else a, b[None] if one else b, why is None)
    if tensor.elements == 0:  # empty samples compare vacuously
        tensor.cosine_min = 1.0
    return (
        _Measured(
            max_abs=tensor.max_abs,
            mean_abs=tensor.abs_sum / tensor.elements if tensor.elements else 0.0,
            max_rel=tensor.max_rel,
            cosine_min=tensor.cosine_min,
            top1=(tensor.agree / tensor.positions if tensor.positions else 1.0)
            if why is None
            else None,
            exact_match=exact,
            box_f1=f1,
        ),
        tensor if why is None else None,
    )


def _compare_one(
    name: str,
    reference: Rows | None,
    candidate: Rows | None,
    tol: OutputTolerance,
    role: OutputRole,
    task: TaskTolerance | None,
) -> OutputParity:
    structural = _structural_failure(name, reference, candidate, task=task is not None)
    skipped: dict[str, str] = {}
    failures: list[str] = []
    measured = _Measured()
    over = None
    n = None
    if structural is None and reference is not None and candidate is not None:
        ref = _without_batch_axis(reference, role.batch_axis)
        cand = _without_batch_axis(candidate, role.batch_axis)
        if isinstance(ref, list) != isinstance(cand, list) or _shapes_differ(ref, cand):
            ref, cand = _samples(ref), _samples(cand)  # samples of their own shapes
        n = _count(ref)
        measured, tensor = _measure(ref, cand, role, task, skipped)
        over = _over(n, role, tensor, _is_text(ref))
    else:
        failures.append(structural or f"output '{name}' cannot be compared")

    tensors = OutputTolerance(
        max_abs=measured.max_abs,
        mean_abs=measured.mean_abs,
        max_rel=measured.max_rel,
        cosine_min=measured.cosine_min,
        top1_agreement_min=measured.top1,
    )
    if not failures:  # the worst-case values of an uncomparable output would only repeat it
        iou = task.iou if task is not None and measured.box_f1 is not None else None
        failures.extend(task_failures(measured.exact_match, measured.box_f1, iou, task))
        failures.extend(tolerance_failures(tensors, applicable(tol, skipped)))
    return OutputParity(
        name=name,
        max_abs=measured.max_abs,
        mean_abs=measured.mean_abs,
        max_rel=measured.max_rel,
        cosine_min=measured.cosine_min,
        top1_agreement=measured.top1,
        exact_match=measured.exact_match,
        box_f1=measured.box_f1,
        iou=task.iou if task is not None and measured.box_f1 is not None else None,
        task_tolerance=task,
        samples=n,
        over=over,
        skipped=skipped,
        tolerance=applicable(tol, skipped),
        passed=not failures,
        failures=failures,
        min_passing=tensors,
    )


def compare_outputs(
    reference: Mapping[str, Rows],
    candidate: Mapping[str, Rows],
    tolerance: Tolerance,
    *,
    reference_digest: str,
    roles: Mapping[str, OutputRole] | None = None,
    tasks: Mapping[str, TaskTolerance] | None = None,
) -> ParityResult:
    """Compare a candidate's outputs with the reference (baseline) outputs on the same inputs.

    Args:
        reference: Baseline outputs by name, as samples (see the module's docstring).
        candidate: Candidate outputs by name, the same samples in the same order.
        tolerance: The candidate's precision-family tolerance with per-output overrides.
        reference_digest: ``sha256:<hex>`` of the baseline artifact.
        roles: Per output, its batch axis and kind (`output_roles`); unnamed outputs have no
            known batch axis and a kind told by their values.
        tasks: Task-level tolerances by output name (``parity.post``, `Parity.task`).

    Returns:
        The parity result: one `OutputParity` per output name: those with a task-level
        tolerance first, then in reference order, then names only the candidate produced;
        ``passed`` only if every output passed. ``samples`` is the
        sample count of the first reference output.

    Raises:
        ValueError: the reference has no outputs.
        pydantic.ValidationError: reference_digest is not ``sha256:`` + 64 hex digits.
    """
    if not reference:
        raise ValueError("the reference (baseline) has no outputs to compare against")
    names = [*reference, *(n for n in candidate if n not in reference)]
    known = roles or {}
    wanted = tasks or {}
    outputs = [
        _compare_one(
            name,
            _rows(reference.get(name)),
            _rows(candidate.get(name)),
            resolve_tolerance(tolerance, name),
            known.get(name, OutputRole()),
            wanted.get(name),
        )
        for name in names
    ]
    # Task-level outputs first: what a user of the service sees is read before the tensors.
    outputs.sort(key=lambda o: o.task_tolerance is None)
    first = _rows(next(iter(reference.values())))
    return ParityResult(
        reference_digest=reference_digest,
        samples=_count(first) if first is not None else 0,
        passed=all(o.passed for o in outputs),
        outputs=outputs,
    )


def _rows(value: Rows | None) -> Rows | None:
    if value is None or isinstance(value, list):
        return value
    return np.asarray(value)
