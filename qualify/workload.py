"""Building the input pool a run feeds every artifact.

Owns turning the workload's input specs into arrays: rows of a recorded ``.npy`` file, seeded
uniform values, or a fixed value. Baseline and candidates receive the very same pool, so parity
compares like with like. Randomness comes only from each input's ``seed``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from qualify.errors import ProjectError
from schemas.project import POOL_ROWS, Workload

__all__ = ["POOL_ROWS", "build_pool"]


def build_pool(
    workload: Workload, resolve: Callable[[str], Path], *, min_rows: int = POOL_ROWS
) -> dict[str, np.ndarray]:
    """The input arrays for a run.

    Recorded and generated inputs are stacked along axis 0 (one row per sample, the batch axis
    of ``shape`` dropped); fixed inputs keep their exact ``shape``.

    Args:
        workload: the project's workload.
        resolve: maps a path written in the project file to a real path.
        min_rows: rows to generate for seeded inputs.

    Raises:
        ProjectError: a recorded file is unreadable or does not fit the declared shape/dtype.
    """
    pool: dict[str, np.ndarray] = {}
    for name, spec in workload.inputs.items():
        row_shape = tuple(spec.shape[1:])
        where = f"workload.inputs.{name}"
        if spec.source == "recorded":
            if spec.file is None:
                raise ProjectError(f"{where}.file: a recorded input needs a .npy file")
            path = resolve(spec.file)
            try:
                data = np.load(path, allow_pickle=False)
            except (OSError, ValueError) as exc:
                raise ProjectError(
                    f"{path}: {where}.file: cannot read as .npy ({exc}). "
                    "Fix: save the samples with numpy.save."
                ) from exc
            if data.ndim == len(row_shape):
                data = data[None, ...]
            if tuple(data.shape[1:]) != row_shape:
                raise ProjectError(
                    f"{path}: {where}.file: rows have shape {list(data.shape[1:])}, but "
                    f"{where}.shape {spec.shape} needs rows of {list(row_shape)}. "
                    "Fix: correct 'shape' or re-record the file."
                )
            if data.shape[0] == 0:
                raise ProjectError(f"{path}: {where}.file: holds no rows")
            pool[name] = np.ascontiguousarray(data.astype(spec.dtype, copy=False))
        elif spec.source == "generated":
            rng = np.random.default_rng(spec.seed)
            values = rng.uniform(spec.low, spec.high, size=(min_rows, *row_shape))
            if spec.dtype.startswith(("int", "uint")):
                values = np.floor(values)
            pool[name] = np.ascontiguousarray(values.astype(spec.dtype))
        else:
            pool[name] = np.full(spec.shape, spec.value, dtype=spec.dtype)
    return pool
