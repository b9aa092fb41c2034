"""Building the input pool a run feeds every artifact.

Owns turning the workload's input specs into arrays: rows of a recorded ``.npy`` file, seeded
uniform values, or a fixed value. Baseline and candidates receive the very same pool, so parity
compares like with like. Randomness comes only from each input's ``seed``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from qualify.errors import ProjectError
from schemas.atomic import open_binary
from schemas.project import MAX_INPUT_BYTES, POOL_ROWS, InputSpec, Workload
from schemas.rules import swept_axes

__all__ = ["POOL_ROWS", "build_pool"]


def build_pool(
    workload: Workload, resolve: Callable[[str], Path], *, min_rows: int = POOL_ROWS
) -> dict[str, np.ndarray]:
    """The input arrays for a run, each with one sample per row along axis 0.

    A batched input's sample is its ``shape`` without the batch axis (a recorded file holds the
    samples along ``batch_axis``, as the model takes them; a file of one sample may leave that
    axis out); an input fed whole (``batch_axis: null``) has its whole ``shape`` as a sample; a
    fixed input is one sample of its value. A swept dimension (``workload.dims``) is built at
    its largest size; each latency config takes the leading part of it (`at_dims`).

    Args:
        workload: the project's workload.
        resolve: maps a path written in the project file to a real path.
        min_rows: rows to generate for seeded inputs.

    Raises:
        ProjectError: a recorded file is unreadable or does not fit the declared shape/dtype.
    """
    pool: dict[str, np.ndarray] = {}
    largest = workload.largest_dims
    for name, spec in workload.inputs.items():
        sample = tuple(spec.sample_shape_at(largest))
        where = f"workload.inputs.{name}"
        if spec.source == "recorded":
            pool[name] = _recorded(spec, largest, resolve, where)
        elif spec.source == "generated":
            rng = np.random.default_rng(spec.seed)
            values = rng.uniform(spec.low, spec.high, size=(min_rows, *sample))
            if spec.dtype.startswith(("int", "uint")):
                values = np.floor(values)
            pool[name] = np.ascontiguousarray(values.astype(spec.dtype))
        else:
            pool[name] = np.full((1, *sample), spec.value, dtype=spec.dtype)
    return pool


def _recorded(
    spec: InputSpec, largest: dict[str, int], resolve: Callable[[str], Path], where: str
) -> np.ndarray:
    if spec.file is None:
        raise ProjectError(f"{where}.file: a recorded input needs a .npy file")
    path = resolve(spec.file)
    try:
        with open_binary(path) as handle:  # a pipe or a device is refused by name
            size = os.fstat(handle.fileno()).st_size
            if size > MAX_INPUT_BYTES:
                raise ProjectError(
                    f"{path}: {where}.file: {size / 2**30:.3g} GiB, more than the "
                    f"{MAX_INPUT_BYTES // 2**30} GiB of input data a run holds per input. Fix: "
                    "record fewer samples"
                )
            data = np.load(handle, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ProjectError(
            f"{path}: {where}.file: cannot read as .npy ({exc}). "
            "Fix: save the samples with numpy.save."
        ) from exc
    sample = spec.sample_shape_at(largest)
    axis = spec.batch_axis if spec.batched else None
    held = list(data.shape)
    if axis is not None and data.ndim == len(sample):
        data = np.expand_dims(data, axis)  # one sample, without its batch axis
    if axis is not None and data.ndim == len(spec.shape):
        data = np.moveaxis(data, axis, 0)  # the samples along axis 0, as the pool keeps them
    swept = swept_axes(spec.shape, axis)
    fits = data.ndim == len(sample) + 1 and all(
        have >= want if k in swept else have == want
        for k, (have, want) in enumerate(zip(data.shape[1:], sample, strict=False))
    )
    if not fits:
        declared = [d for k, d in enumerate(spec.shape) if k != axis]
        wanted: list[int | str] = [
            f">={size}" if k in swept else size for k, size in enumerate(sample)
        ]
        wanted = ["N", *wanted] if axis is None else [*wanted[:axis], "N", *wanted[axis:]]
        raise ProjectError(
            f"{path}: {where}.file: holds an array of shape {held}, but {where}.shape "
            f"{spec.shape} (batch_axis {axis if axis is not None else 'null'}"
            + (f", {declared} at the largest dims {largest}" if swept else "")
            + f") needs {wanted}, N samples. Fix: correct 'shape' (or 'batch_axis') or "
            "re-record the file."
        )
    if swept:  # the leading part of each swept axis, up to its largest size
        data = data[(slice(None), *(slice(0, size) for size in sample))]
    if data.shape[0] == 0:
        raise ProjectError(f"{path}: {where}.file: holds no samples")
    return np.ascontiguousarray(data.astype(spec.dtype, copy=False))
