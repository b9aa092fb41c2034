"""``qualify init``: a first project file written from the model itself.

Owns turning an ONNX model's declared inputs (names, element types, shapes) into a
``qualify.yaml`` that loads and runs as written: generated inputs with a seed, the batch axis
left to ``batch_sizes``, every other dynamic dimension the model names swept over sizes in
``workload.dims`` (an unnamed one given a value), each with a comment saying what to choose, one host class that matches this host, and budgets marked as placeholders to set.
Does not measure anything and does not guess budgets: a placeholder budget is a number written
so the file runs, flagged in a comment on its line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

from qualify.errors import ArtifactError, ProjectError
from qualify.project.graph import TensorSignature, read_signature
from schemas.base import NAME_RE
from schemas.project import DIM_RE, ITEMSIZE

__all__ = ["DYNAMIC_DEFAULT", "SWEEP_DEFAULT", "init_project", "write_initial_project"]

DYNAMIC_DEFAULT = 16
"""The value an unnamed dynamic dimension other than the batch axis gets (a width, a length)."""

SWEEP_DEFAULT = (16, 64, 256)
"""The sizes a named dynamic dimension other than the batch axis is swept over (``dims``) when
the model names one; with several, each gets the middle one, so that a first run stays short."""

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


_STATE_SUFFIXES = ("_out", "_new", "_next", "out", "_n")
"""How a recurrent model names the output that is its input's next value (``h`` / ``h_out``)."""


def _batch_symbol(inputs: Sequence[TensorSignature]) -> str | None:
    """The name of the batch dimension: the symbol most inputs have on axis 0, if any."""
    first = [s.shape[0] for s in inputs if s.shape and isinstance(s.shape[0], str) and s.shape[0]]
    return max(set(first), key=first.count) if first else None


def _batch_axis(sig: TensorSignature, symbol: str | None) -> int | None:
    """Where ``sig`` batches: the axis with the batch symbol (a state [layers, batch, hidden]
    has it on 1), else axis 0 (a fixed batch of a model exported with one); None for a scalar."""
    if not sig.shape:
        return None
    if symbol is not None and symbol in sig.shape:
        return sig.shape.index(symbol)
    return 0


def _state_source(sig: TensorSignature, outputs: Sequence[TensorSignature]) -> str | None:
    """The output that looks like this input's next value: named after it, same type and rank."""
    for output in outputs:
        named = any(output.name == sig.name + suffix for suffix in _STATE_SUFFIXES) or (
            sig.name.startswith("past") and output.name == "present" + sig.name[4:]
        )
        same = output.dtype == sig.dtype and (
            output.shape is None or sig.shape is None or len(output.shape) == len(sig.shape)
        )
        if named and same:
            return output.name
    return None


def _shown(symbol: str) -> str:
    """A model's symbol as a comment may show it: quoted and escaped, on one line, bounded."""
    return json.dumps(symbol[:64], ensure_ascii=True)


def _dim_name(symbol: str) -> str:
    """A model's symbolic dimension as a workload dimension name (`schemas.project.DIM_RE`)."""
    cleaned = re.sub(r"[^A-Za-z0-9_]+", "_", symbol).strip("_")[:60] or "dim"
    return cleaned if DIM_RE.fullmatch(cleaned) else f"d_{cleaned}"[:64]


def _shape_of(
    dims: Sequence[int | str | None],
    axis: int | None,
    swept: dict[str, str] | None,
    notes: list[str],
) -> tuple[list[int | str], int | None]:
    """The workload shape of an input's declared ``dims`` (1 on the batch axis, a named dynamic
    dimension by name when ``swept`` collects them, else a default size with a note), and the
    static batch size when the model fixes one."""
    shape: list[int | str] = []
    batch: int | None = None
    for k, dim in enumerate(dims):
        if k == axis:
            shape.append(1)  # the batch axis: batch_sizes replaces it
            batch = dim if isinstance(dim, int) and dim > 0 else None
        elif isinstance(dim, int) and dim > 0:
            shape.append(dim)
        elif isinstance(dim, str) and dim and swept is not None:
            name = _dim_name(dim)
            shape.append(name)
            swept.setdefault(name, dim)
        else:
            shape.append(DYNAMIC_DEFAULT)
            label = _shown(dim) if isinstance(dim, str) and dim else "unnamed"
            notes.append(
                f"axis {k} is dynamic ({label}): {DYNAMIC_DEFAULT} chosen; set the size "
                "your traffic sends"
            )
    return shape, batch


def _input_lines(
    sig: TensorSignature,
    model: Path,
    symbol: str | None = None,
    outputs: Sequence[TensorSignature] = (),
    swept: dict[str, str] | None = None,
) -> tuple[list[str], int | None]:
    """The YAML lines of one input, and its static batch size when the model fixes one; each
    named dynamic dimension off the batch axis goes into ``shape`` by name and into ``swept``
    (workload dimension name -> the model's symbol)."""
    if sig.dtype is None or sig.dtype not in ITEMSIZE:
        raise ProjectError(
            f"{model}: input {sig.name!r} has element type {sig.dtype or 'unknown'}, which a "
            f"workload cannot generate ({', '.join(ITEMSIZE)}). Fix: write that input's entry "
            "by hand (source: recorded, from a .npy file)."
        )
    notes: list[str] = []
    extra = ""
    batch: int | None = None
    if sig.shape is None:
        shape: list[int | str] = [1]
        notes.append("the model declares no shape for this input: write its real shape")
    else:
        axis = _batch_axis(sig, symbol) if sig.shape else None
        shape, batch = _shape_of(sig.shape, axis, swept, notes)
        if axis is None:
            extra = ", batch_axis: null"
            notes.append("a scalar: fed whole to every inference")
        elif axis:
            extra = f", batch_axis: {axis}"
            notes.append(f"batches on axis {axis} ('{symbol}', as the other inputs' axis 0)")
        source = _state_source(sig, outputs)
        if source is not None:
            extra += f", state_from: {_q(source)}"
            notes.append(
                f"CHECK: {source!r} looks like this input's next value, fed back at each step "
                "(remove state_from if it is not)"
            )
    low, high = (0, 2) if sig.dtype.startswith(("int", "uint", "bool")) else (0, 1)
    line = (
        f"    {_q(sig.name)}: {{shape: {json.dumps(shape)}, dtype: {sig.dtype}, "
        f"source: generated, seed: 7, low: {low}, high: {high}{extra}}}"
    )
    return [*(f"    # {note}" for note in notes), line], batch


def _dims_lines(swept: dict[str, str]) -> list[str]:
    """``workload.dims``: the sizes each named dynamic dimension is measured at."""
    if not swept:
        return []
    sizes = list(SWEEP_DEFAULT) if len(swept) == 1 else [SWEEP_DEFAULT[1]]
    lines = ["  # CHOOSE: the sizes your traffic sends on each dynamic dimension the model names;"]
    lines.append("  # every combination is measured as a latency config of its own.")
    lines.append("  dims:")
    for name, symbol in swept.items():
        note = f"  # the model's {_shown(symbol)}" if symbol != name else ""
        lines.append(f"    {name}: {json.dumps(sizes)}{note}")
    return lines


MAX_INPUT_NAME = 1000
"""The longest input name a project file can key (YAML's implicit keys stop at 1024)."""


def _check_names(model: Path, names: Sequence[str]) -> None:
    """Refuse inputs a workload cannot name: one name twice, or a name YAML cannot key.

    Raises:
        ArtifactError: naming the input (shortened) and the model.
    """
    seen: set[str] = set()
    for name in names:
        if len(name) > MAX_INPUT_NAME:
            raise ArtifactError(
                f"{model}: input {_shown(name)}... has a name of {len(name)} characters, longer "
                f"than the {MAX_INPUT_NAME} a project file can key; rename it in the model"
            )
        if name in seen:
            raise ArtifactError(
                f"{model}: declares two inputs named {_shown(name)} (not a valid ONNX graph); "
                "fix the model"
            )
        seen.add(name)


def _candidate_lines(model: Path, candidates: Sequence[Path], base: Path) -> list[str]:
    """One YAML line per candidate, each with a name of its own (never the baseline's)."""
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
    return cands


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
    _check_names(model, [sig.name for sig in signature.inputs])
    for candidate in candidates:
        read_signature(candidate)  # refuse a non-ONNX candidate now, not at the first run
    inputs: list[str] = []
    batches: set[int] = set()
    symbol = _batch_symbol(signature.inputs)
    swept: dict[str, str] = {}
    for sig in signature.inputs:
        lines, batch = _input_lines(sig, model, symbol, signature.outputs, swept)
        inputs += lines
        if batch is not None:
            batches.add(batch)
    if not inputs:
        raise ArtifactError(f"{model}: the model declares no inputs to feed")
    batch_sizes = sorted(batches) if len(batches) == 1 else [1]
    major_minor = ".".join(runtime_version.split(".")[:2])
    cands = _candidate_lines(model, candidates, base)
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
        *_dims_lines(swept),
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


def write_initial_project(
    model: Path,
    candidates: Sequence[Path],
    out: Path,
    *,
    arch: str,
    runtime_version: str,
) -> str:
    """Write `init_project`'s text at ``out``, only once it loads as that file would
    (`qualify.project.load.load_project_text`): a model whose inputs no workload can describe (a
    dimension of 2^40, two inputs of one name, a name of 10,000 characters) is refused before
    anything touches the disk, and a file already at ``out`` is kept unless the new one loads.

    Returns:
        The text written.

    Raises:
        ArtifactError: the model or a candidate is not a readable ONNX file (a pipe or a device
            is refused by name).
        ProjectError: the project written from the model would not load; nothing was written.
    """
    from qualify.project.load import load_project_text
    from schemas.atomic import write_atomic

    text = init_project(model, candidates, out, arch=arch, runtime_version=runtime_version)
    try:
        load_project_text(text, out)
    except ProjectError as exc:
        kept = f"; {out} was left as it was" if out.exists() else ""
        raise ProjectError(
            f"{model}: cannot write a project file from this model's inputs that loads{kept}. "
            f"Write its workload by hand. What the written file would have said: "
            f"{_first_lines(str(exc))}"
        ) from exc
    write_atomic(out, text)
    return text


def _first_lines(message: str, most: int = 3) -> str:
    lines = [line.strip()[:300] for line in message.splitlines() if line.strip()]
    return " / ".join(lines[:most]) + (
        f" (and {len(lines) - most} more)" if len(lines) > most else ""
    )
