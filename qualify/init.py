"""``qualify init``: a first project file written from the model itself.

Owns turning an ONNX model's declared inputs (names, element types, shapes) into a
``qualify.yaml`` that loads and runs as written: generated inputs with a seed, the batch axis
left to ``batch_sizes``, every other dynamic dimension given a value with a comment saying what
to choose, one host class that matches this host, and budgets marked as placeholders to set.
Does not measure anything and does not guess budgets: a placeholder budget is a number written
so the file runs, flagged in a comment on its line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

from qualify.errors import ArtifactError, ProjectError
from qualify.graph import TensorSignature, read_signature
from schemas.base import NAME_RE
from schemas.project import ITEMSIZE

__all__ = ["DYNAMIC_DEFAULT", "init_project"]

DYNAMIC_DEFAULT = 16
"""The value a dynamic dimension other than the batch axis gets (a sequence length, a width)."""

_PRECISIONS = (
    ("int8", "int8"),
    ("qdq", "int8"),
    ("quant", "int8"),
    ("fp16", "fp16"),
    ("half", "fp16"),
    ("prun", "pruned"),
)


def _q(text: str) -> str:
    """A YAML double-quoted scalar (JSON strings are valid YAML)."""
    return json.dumps(text, ensure_ascii=False)


def _name(stem: str, fallback: str) -> str:
    """A name in the project's charset (`schemas.base.NAME_RE`) derived from a file stem."""
    cleaned = re.sub(r"[^A-Za-z0-9._+-]+", "-", stem).strip("-._+")[:64]
    return cleaned if cleaned and NAME_RE.fullmatch(cleaned) else fallback


def _precision(path: Path) -> str:
    lowered = path.stem.lower()
    return next((p for mark, p in _PRECISIONS if mark in lowered), "fp32")


def _relative(path: Path, base: Path) -> str:
    try:
        return path.resolve().relative_to(base.resolve()).as_posix()
    except ValueError:
        return str(path.resolve())


def _input_lines(sig: TensorSignature, model: Path) -> tuple[list[str], int | None]:
    """The YAML lines of one input, and its static batch size when the model fixes one."""
    if sig.dtype is None or sig.dtype not in ITEMSIZE:
        raise ProjectError(
            f"{model}: input {sig.name!r} has element type {sig.dtype or 'unknown'}, which a "
            f"workload cannot generate ({', '.join(ITEMSIZE)}). Fix: write that input's entry "
            "by hand (source: recorded, from a .npy file)."
        )
    notes: list[str] = []
    if sig.shape is None:
        shape: list[int] = [1]
        notes.append("the model declares no shape for this input: write its real shape")
        batch = None
    else:
        shape = []
        batch = sig.shape[0] if sig.shape and isinstance(sig.shape[0], int) else None
        for axis, dim in enumerate(sig.shape):
            if isinstance(dim, int) and dim > 0:
                shape.append(dim)
            elif axis == 0:
                shape.append(1)  # the batch axis: batch_sizes replaces it
            else:
                shape.append(DYNAMIC_DEFAULT)
                label = f"'{dim}'" if isinstance(dim, str) else "unnamed"
                notes.append(
                    f"axis {axis} is dynamic ({label}): {DYNAMIC_DEFAULT} chosen; set the size "
                    "your traffic sends"
                )
    if not shape:
        raise ProjectError(
            f"{model}: input {sig.name!r} is a scalar (rank 0), which a workload cannot feed "
            "yet. Fix: give the model a rank-1 input, or write the entry by hand."
        )
    low, high = (0, 2) if sig.dtype.startswith(("int", "uint", "bool")) else (0, 1)
    line = (
        f"    {_q(sig.name)}: {{shape: {json.dumps(shape)}, dtype: {sig.dtype}, "
        f"source: generated, seed: 7, low: {low}, high: {high}}}"
    )
    return [*(f"    # {note}" for note in notes), line], batch


def init_project(
    model: Path,
    candidates: Sequence[Path],
    out: Path,
    *,
    arch: str,
    runtime_version: str,
) -> str:
    """The text of a project file for ``model`` (and its ``candidates``), to be written at
    ``out``: paths are relative to ``out``'s folder.

    Raises:
        ArtifactError: the model or a candidate is not a readable ONNX file.
        ProjectError: an input cannot be generated (a type or rank a workload does not feed).
    """
    base = out.parent
    signature = read_signature(model)
    for candidate in candidates:
        read_signature(candidate)  # refuse a non-ONNX candidate now, not at the first run
    inputs: list[str] = []
    batches: set[int] = set()
    for sig in signature.inputs:
        lines, batch = _input_lines(sig, model)
        inputs += lines
        if batch is not None:
            batches.add(batch)
    if not inputs:
        raise ArtifactError(f"{model}: the model declares no inputs to feed")
    batch_sizes = sorted(batches) if len(batches) == 1 else [1]
    major_minor = ".".join(runtime_version.split(".")[:2])
    seen: set[str] = set()
    cands: list[str] = []
    for index, path in enumerate(candidates, start=1):
        label = _name(path.stem, f"candidate-{index}")
        while label in seen or label == _name(model.stem, "baseline"):
            label = f"{label}-{index}"[:64]
        seen.add(label)
        cands.append(
            f"    - {{path: {_q(_relative(path, base))}, name: {label}, "
            f"precision: {_precision(path)}, derived_from: baseline}}"
            f"  # check the precision family"
        )
    arch_name = _name(arch, "host")
    lines = [
        f"# Written by `qualify init` from {model.name}. Review every line marked CHOOSE or SET.",
        f"model: {_name(model.stem, 'model')}",
        "artifacts:",
        f"  baseline: {{path: {_q(_relative(model, base))}, name: {_name(model.stem, 'baseline')}"
        ", precision: fp32}",
        "  candidates:" + ("" if cands else " []"),
        *cands,
        "workload:",
        "  # Generated inputs (uniform, seeded). For real traffic, record it as .npy files and",
        "  # use {source: recorded, file: data/NAME.npy}.",
        "  inputs:",
        *inputs,
        f"  batch_sizes: {json.dumps(batch_sizes)}  # CHOOSE: the batch sizes you serve",
        "  concurrency: [1]  # CHOOSE: requests served at once",
        "host_classes:",
        "  this-host:  # one class that matches this host; add one per kind of host you run",
        f"    key: {{hardware: {arch_name}, runtime: ort-{major_minor}, provider: cpu}}",
        f"    match: {{arch: {arch_name}}}",
        f"    runtime: {{package: onnxruntime, version: {_q(major_minor + '.*')}}}",
        "    provider: {execution_providers: [CPUExecutionProvider]}",
        "    # SET: placeholders so the file runs; replace them with your service's budgets.",
        "    budgets: {p99_ms: 1000, peak_rss_mb: 4096, cold_init_ms: 10000}",
        "",
    ]
    return "\n".join(lines)
