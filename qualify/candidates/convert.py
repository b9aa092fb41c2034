"""Candidate variants of a baseline ONNX model, each described by how it was made.

Owns running the converters in-process (onnxruntime's dynamic and static QDQ int8 quantizers,
its float16 converter, a structured magnitude pruning written here) and the lineage of what they
write: `VARIANTS`, in the order they are made. Does not measure, judge, store or record a variant,
nor add it to the project file (``qualify.candidates.make``). How each is made, and why:
docs/candidates.md. onnx and onnxruntime are imported when a variant is made.

Errors::

    QualifyError                qualify.errors
    └── ConversionError         a variant cannot be made: names the variant, the baseline file,
                                the op and node where known, and the fix
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from qualify.candidates.prune import (
    CRITERION,
    DEFAULT_DOMAINS,
    STRUCTURE,
    int_attribute,
    nodes,
    plan,
    shrink,
)
from qualify.errors import QualifyError
from schemas.atomic import remove_leftovers, temp_prefix

if TYPE_CHECKING:
    import onnx

__all__ = [
    "CALIBRATED",
    "VARIANTS",
    "ConversionError",
    "Variant",
    "calibration_digest",
    "make_variants",
]

VARIANTS: tuple[str, ...] = (
    "int8-dynamic",
    "int8-qdq-per-channel",
    "int8-qdq-reduce-range",
    "fp16",
    "pruned",
)
"""The variants `make_variants` knows, in the order it makes them. ``pruned`` is written as
``pruned-<pct>`` (``pruned-25`` for a prune ratio of 0.25)."""

CALIBRATED: frozenset[str] = frozenset({"int8-qdq-per-channel", "int8-qdq-reduce-range"})
"""The variants that calibrate on recorded inputs (static quantization): without any,
`make_variants` refuses them and ``qualify candidates`` skips them."""

_CALIBRATION_ROWS = 256
"""At most this many recorded rows calibrate a static variant: the first ones, in order."""
_CPU = ["CPUExecutionProvider"]
_FP16_NOTE = (
    "onnxruntime's CPU provider has no fp16 kernel for most ops and runs them in float32 "
    "through inserted casts: smaller on CPU, not faster; qualify it on the class that runs it"
)
_PRUNED_NOTE = "magnitude-pruned, not fine-tuned"


class ConversionError(QualifyError):
    """A variant could not be made. The message names the variant, the baseline file, the op
    and node where the failure can be traced to one, and the fix."""


@dataclass(frozen=True)
class Variant:
    """One made variant and everything needed to make it again."""

    name: str
    """``int8-dynamic``, ``int8-qdq-per-channel``, ``int8-qdq-reduce-range``, ``fp16`` or
    ``pruned-<pct>``."""
    precision: str
    """Its precision family in the project file: ``int8``, ``fp16`` or ``pruned``."""
    path: Path
    """The written model."""
    tool: str
    """The converter, e.g. ``onnxruntime.quantization.quantize_dynamic``."""
    tool_version: str
    """The version of the package the converter belongs to (onnxruntime, or onnx for
    ``pruned``), as imported."""
    params: dict[str, Any]
    """Every parameter the converter was given (JSON types; enums by name), how the input was
    prepared, and ``output_opset`` / ``output_ir_version`` of the written file."""
    note: str | None
    """A caveat a reader of the lineage should see, or None."""
    summary: str
    """What it is in one short line (under 90 characters), e.g. ``int8 per channel, 7-bit
    weights (quantize_dynamic, onnxruntime 1.32.0)``: the project file's ``how:``, which YAML
    keeps on one line; every parameter is in ``params``."""


def calibration_digest(calibration: Mapping[str, np.ndarray]) -> str:
    """``sha256:<hex>`` of calibration data, over a canonical encoding: the names sorted, each
    with its length, then the array's dtype (``dtype.str``), shape and C-order bytes.

    Raises:
        ValueError: an array of Python objects (its bytes are pointers, not data).
    """
    h = hashlib.sha256()
    for name in sorted(calibration):
        array = np.ascontiguousarray(calibration[name])
        if array.dtype.hasobject:
            raise ValueError(f"calibration input {name!r} holds Python objects; it has no digest")
        head = f"{len(name)}:{name}|{array.dtype.str}|{','.join(map(str, array.shape))}|"
        h.update(head.encode("utf-8"))
        h.update(array.tobytes())
    return "sha256:" + h.hexdigest()


# ---------------------------------------------------------------------------------------------
# The run: one job, one spec per variant.


@dataclass(frozen=True)
class _Job:
    """What every converter of one `make_variants` call shares."""

    baseline: Path
    feeds: list[dict[str, np.ndarray]] | None
    """The calibration rows, one feed each (None without calibration data)."""
    probe: dict[str, np.ndarray]
    """The feed each written variant must run: the first calibration row, else zeros."""
    prune_ratio: float


_Converter = Callable[[_Job, Path, Path], dict[str, Any]]
"""(job, output file, scratch folder) -> the parameters it used."""


@dataclass(frozen=True)
class _Spec:
    precision: str
    tool: str
    package: str
    convert: _Converter
    needs_calibration: bool = False


def make_variants(
    baseline: Path,
    out_dir: Path,
    calibration: Mapping[str, np.ndarray] | None,
    *,
    which: Sequence[str] | None = None,
    prune_ratio: float = 0.25,
) -> list[Variant]:
    """Make the variants asked for from ``baseline`` into ``out_dir``, in `VARIANTS` order.

    Args:
        baseline: the float model.
        out_dir: where ``<baseline stem>-<variant>.onnx`` files go (made if missing); a file of
            that name is replaced.
        calibration: input name -> samples along axis 0 (``qualify.measure.workload.build_pool``): an
            array of the input's rank is fed one row at a time as a batch of one, an array of
            one rank more one sample at a time as the whole input. Needed by the static int8
            variants; the first row is also what each written variant must run.
        which: names from `VARIANTS` (a single string is one name); None makes all.
        prune_ratio: share of each prunable layer's hidden units ``pruned`` removes.

    Returns:
        The variants made, in `VARIANTS` order.

    Raises:
        ValueError: an unknown variant name, or a prune ratio outside (0, 1).
        ConversionError: the baseline cannot be read, the calibration data does not fit it, a
            static variant was asked for without calibration data, or a converter failed or
            wrote a model onnxruntime cannot run. Variants made before it stay written; nothing
            of the failing one is left in ``out_dir``.
    """
    names = _selected(which)
    if not 0.0 < prune_ratio < 1.0:
        raise ValueError(f"prune ratio {prune_ratio} must be above 0 and below 1")
    job = _job(baseline.resolve(), calibration, prune_ratio)
    missing = [n for n in names if _SPECS[n].needs_calibration and job.feeds is None]
    if missing:
        raise ConversionError(
            f"{', '.join(missing)} of {job.baseline.name}: static quantization calibrates on "
            "recorded inputs, and none were given. Fix: record inputs in the workload (an input "
            "with source 'recorded' and a .npy file of real samples), or leave "
            f"{' and '.join(missing)} out with --variant"
        )
    out_dir = out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    remove_leftovers(out_dir)
    return [_make_one(job, name, out_dir) for name in names]


def _selected(which: Sequence[str] | None) -> list[str]:
    if which is None:
        return list(VARIANTS)
    asked = [which] if isinstance(which, str) else list(which)
    unknown = [n for n in asked if n not in VARIANTS]
    if unknown:
        raise ValueError(
            f"unknown variant(s) {', '.join(map(repr, unknown))}; known: {', '.join(VARIANTS)}"
        )
    return [n for n in VARIANTS if n in asked]


def _variant_name(key: str, prune_ratio: float) -> str:
    return f"pruned-{prune_ratio * 100:g}" if key == "pruned" else key


def _make_one(job: _Job, key: str, out_dir: Path) -> Variant:
    spec = _SPECS[key]
    name = _variant_name(key, job.prune_ratio)
    target = out_dir / f"{job.baseline.name.removesuffix('.onnx')}-{name}.onnx"
    with tempfile.TemporaryDirectory(
        prefix=temp_prefix(target.name), suffix=".tmp", dir=out_dir
    ) as scratch:
        work = Path(scratch)
        written = work / target.name
        try:
            params = spec.convert(job, written, work)
        except ConversionError:
            raise
        except Exception as exc:
            raise _converter_failed(name, job, spec, exc) from exc
        _check_converted(name, job, spec, written)
        _check_runs(name, job, spec, written)
        params.update(_stamp(written))
        _commit(written, target)
    version = _version(spec.package)
    return Variant(
        name=name,
        precision=spec.precision,
        path=target,
        tool=spec.tool,
        tool_version=version,
        params=params,
        note={"fp16": _FP16_NOTE, "pruned": _PRUNED_NOTE}.get(key),
        summary=_summary(key, spec, params, version),
    )


_SUMMARY_MAX = 88
"""Longest `Variant.summary` with the converter named: ``how: `` and a candidate's indent
stay within the 100 columns at which the project file's YAML folds a line."""


def _summary(key: str, spec: _Spec, params: Mapping[str, Any], version: str) -> str:
    converter = "magnitude pruning" if key == "pruned" else spec.tool.rsplit(".", 1)[-1]
    full = f"{_gist(key, params)} ({converter}, {spec.package} {version})"
    if len(full) <= _SUMMARY_MAX:
        return full
    return f"{_gist(key, params)} ({spec.package} {version})"  # a long version string


def _gist(key: str, params: Mapping[str, Any]) -> str:
    """What a variant is, from the parameters it was made with, in a few words."""
    if key == "fp16":
        return (
            "float16, float32 inputs and outputs kept" if params.get("keep_io_types") else "float16"
        )
    if key == "pruned":
        return f"{params['ratio'] * 100:g}% of hidden units removed, not fine-tuned"
    words = ["int8 QDQ" if params.get("quant_format") == "QDQ" else "int8"]
    words.append("per channel" if params.get("per_channel") else "per tensor")
    if params.get("reduce_range"):
        words.append("7-bit weights")
    if "calibration_rows" in params:
        words.append(f"{params['calibration_rows']} recorded rows")
    return ", ".join(words).replace(", per", " per", 1)


_QUANTIZED_OPS = frozenset(
    {
        "QuantizeLinear",
        "DynamicQuantizeLinear",
        "MatMulInteger",
        "ConvInteger",
        "QLinearMatMul",
        "QLinearConv",
        "DynamicQuantizeMatMul",
        "MatMulIntegerToFloat",
        "QGemm",
        "QAttention",
    }
)
"""Ops whose presence says a quantizer quantized something (standard and com.microsoft)."""


def _check_converted(name: str, job: _Job, spec: _Spec, written: Path) -> None:
    """Refuse a precision variant in which the converter changed nothing: a graph of integer
    tensors only (int64 ids and counts) comes back from the int8 and fp16 converters as the
    baseline under another name, which must never be offered as a candidate.

    Raises:
        ConversionError: "nothing to quantize", naming the variant, the baseline and the fix.
    """
    if spec.precision not in ("int8", "fp16"):
        return
    import onnx

    model = onnx.load(str(written), load_external_data=False)
    if spec.precision == "int8":
        changed = any(node.op_type in _QUANTIZED_OPS for node in nodes(model.graph))
    else:
        half = onnx.TensorProto.FLOAT16
        changed = any(t.data_type == half for t in model.graph.initializer) or any(
            node.op_type == "Cast" and int_attribute(node, "to", 0) == half
            for node in nodes(model.graph)
        )
    if changed:
        return
    kinds = sorted(
        {onnx.TensorProto.DataType.Name(t.data_type).lower() for t in model.graph.initializer}
        | {
            onnx.TensorProto.DataType.Name(v.type.tensor_type.elem_type).lower()
            for v in [*model.graph.input, *model.graph.output]
        }
    )
    raise ConversionError(
        f"{name} of {job.baseline.name}: nothing to quantize: the converter changed no tensor "
        f"(the model's tensors are {', '.join(kinds) or 'none'}; {spec.precision} applies to "
        "float weights and activations), so the variant would be the baseline under another "
        f"name and was not added. Fix: leave {name} out with --variant"
    )


def _version(package: str) -> str:
    if package == "onnx":
        import onnx

        return str(onnx.__version__)
    import onnxruntime

    return str(onnxruntime.__version__)


def _commit(written: Path, target: Path) -> None:
    """Flush ``written`` to disk and rename it onto ``target`` (same folder tree, so atomic)."""
    fd = os.open(written, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(written, 0o644)
    os.replace(written, target)
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _stamp(path: Path) -> dict[str, Any]:
    """The IR version and default-domain opset the written file declares."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    opset = next((o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS), None)
    return {"output_opset": opset, "output_ir_version": int(model.ir_version)}


# ---------------------------------------------------------------------------------------------
# Inputs: the calibration rows and the probe feed.


def _job(baseline: Path, calibration: Mapping[str, np.ndarray] | None, ratio: float) -> _Job:
    import onnx

    from schemas.atomic import open_regular

    try:
        os.close(open_regular(baseline))  # a pipe or a device is refused by name, not opened
        model = onnx.load(str(baseline), load_external_data=False)
    except Exception as exc:
        raise ConversionError(
            f"{baseline}: cannot read the baseline model: {_one_line(exc)}. Fix: point the "
            "project's baseline at a readable .onnx file"
        ) from exc
    inputs = _graph_inputs(model)
    feeds = None if calibration is None else _feeds(baseline, inputs, calibration)
    probe = feeds[0] if feeds else {name: _zeros(vi) for name, vi in inputs.items()}
    return _Job(baseline=baseline, feeds=feeds, probe=probe, prune_ratio=ratio)


def _graph_inputs(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """The inputs a caller feeds (older IRs also list initializers as inputs)."""
    initializers = {i.name for i in model.graph.initializer}
    return {i.name: i for i in model.graph.input if i.name not in initializers}


def _zeros(value: onnx.ValueInfoProto) -> np.ndarray:
    import onnx

    tensor = value.type.tensor_type
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type or onnx.TensorProto.FLOAT)
    shape = [d.dim_value if d.dim_value > 0 else 1 for d in tensor.shape.dim]
    return np.zeros(shape, dtype=dtype)


def _feeds(
    baseline: Path,
    inputs: Mapping[str, onnx.ValueInfoProto],
    calibration: Mapping[str, np.ndarray],
) -> list[dict[str, np.ndarray]]:
    """The first `_CALIBRATION_ROWS` rows as feeds, after checking they fit the model."""
    import onnx

    arrays: dict[str, np.ndarray] = {}
    for name, value in inputs.items():
        where = f"calibration input {name!r} for {baseline.name}"
        if name not in calibration:
            given = ", ".join(map(repr, sorted(calibration))) or "none"
            raise ConversionError(
                f"{where}: missing (given: {given}). Fix: record every model input in the workload"
            )
        arrays[name] = np.asarray(calibration[name])
        elem_type = value.type.tensor_type.elem_type
        expected = onnx.helper.tensor_dtype_to_np_dtype(elem_type) if elem_type else None
        if expected is not None and arrays[name].dtype != expected:
            raise ConversionError(
                f"{where}: dtype {arrays[name].dtype}, the model takes {expected}. Fix: record "
                f"it as {expected}"
            )
    rows = min((len(a) if a.ndim else 0) for a in arrays.values()) if arrays else 0
    if rows == 0:
        raise ConversionError(
            f"calibration data for {baseline.name} has no rows. Fix: record real samples"
        )
    ranks = {name: _rank(value) for name, value in inputs.items()}
    return [
        {name: _row(a, i, ranks[name]) for name, a in arrays.items()}
        for i in range(min(rows, _CALIBRATION_ROWS))
    ]


def _rank(value: onnx.ValueInfoProto) -> int | None:
    tensor = value.type.tensor_type
    return len(tensor.shape.dim) if tensor.HasField("shape") else None


def _row(array: np.ndarray, index: int, rank: int | None) -> np.ndarray:
    """Row ``index`` as a feed: a batch of one, or the whole input when the array has one more
    axis than the model input."""
    return array[index] if rank is not None and array.ndim == rank + 1 else array[index : index + 1]


class _Reader:
    """onnxruntime's ``CalibrationDataReader`` protocol over prepared feeds, one per call."""

    def __init__(self, feeds: Sequence[dict[str, np.ndarray]]) -> None:
        self._feeds: Iterator[dict[str, np.ndarray]] = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)


# ---------------------------------------------------------------------------------------------
# The onnxruntime converters.


def _as_enums(params: Mapping[str, Any], enums: Mapping[str, type[Enum]]) -> dict[str, Any]:
    """Converter keyword arguments from recorded parameters: enum names become members."""
    return {k: enums[k][v] if k in enums else v for k, v in params.items()}


def _pre_process(source: Path, output: Path, *, optimize: bool) -> dict[str, Any]:
    """``quant_pre_process`` from ``source`` to ``output``, then unused domains dropped."""
    import onnx
    from onnxruntime.quantization.shape_inference import quant_pre_process

    kwargs: dict[str, Any] = {
        "skip_optimization": not optimize,
        "skip_onnx_shape": False,
        "skip_symbolic_shape": True,
        "auto_merge": False,
        "int_max": 2**31 - 1,
        "guess_output_rank": False,
        "verbose": 0,
        "save_as_external_data": False,
        "all_tensors_to_one_file": False,
        "external_data_location": None,
        "external_data_size_threshold": 1024,
    }
    quant_pre_process(str(source), str(output), **kwargs)
    model = onnx.load(str(output))
    dropped = _drop_unused_domains(model)
    if dropped:
        onnx.save(model, str(output))
    return {
        "tool": "onnxruntime.quantization.shape_inference.quant_pre_process",
        **kwargs,
        "unused_domains_dropped": dropped,
    }


def _drop_unused_domains(model: onnx.ModelProto) -> list[str]:
    """Remove opset imports of domains no node or function uses; returns those domains."""
    used = {*DEFAULT_DOMAINS, *(n.domain for n in nodes(model.graph))}
    for function in model.functions:
        used.add(function.domain)
        used.update(n.domain for n in function.node)
    keep = [o for o in model.opset_import if o.domain in used]
    dropped = sorted(o.domain for o in model.opset_import if o.domain not in used)
    del model.opset_import[:]
    model.opset_import.extend(keep)
    return dropped


class _NoPreProcessNag(logging.Filter):
    """``quantize_dynamic`` logs a warning on the root logger that suggests pre-processing;
    the dynamic variant skips it on purpose (see the module docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing before quantization" not in record.getMessage()


def _int8_dynamic(job: _Job, output: Path, work: Path) -> dict[str, Any]:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    params: dict[str, Any] = {
        "weight_type": "QInt8",
        "per_channel": True,
        "reduce_range": True,
        "op_types_to_quantize": None,
        "nodes_to_quantize": None,
        "nodes_to_exclude": None,
        "use_external_data_format": False,
        "extra_options": {},
    }
    root, nag = logging.getLogger(), _NoPreProcessNag()
    root.addFilter(nag)
    try:
        quantize_dynamic(
            str(job.baseline), str(output), **_as_enums(params, {"weight_type": QuantType})
        )
    finally:
        root.removeFilter(nag)
    return {**params, "pre_process": None}


def _int8_static(per_channel: bool, reduce_range: bool) -> _Converter:
    def convert(job: _Job, output: Path, work: Path) -> dict[str, Any]:
        from onnxruntime.quantization import (
            CalibrationMethod,
            QuantFormat,
            QuantType,
            quantize_static,
        )

        if job.feeds is None:  # make_variants refuses this before any variant is made
            raise ConversionError(f"{job.baseline.name}: static quantization needs calibration")
        prepared = work / "pre-processed.onnx"
        pre = _pre_process(job.baseline, prepared, optimize=True)
        params: dict[str, Any] = {
            "quant_format": "QDQ",
            "activation_type": "QUInt8",
            "weight_type": "QInt8",
            "per_channel": per_channel,
            "reduce_range": reduce_range,
            "calibrate_method": "MinMax",
            "op_types_to_quantize": None,
            "nodes_to_quantize": None,
            "nodes_to_exclude": None,
            "use_external_data_format": False,
            "calibration_providers": list(_CPU),
            "extra_options": {},
            "calibration_cache_path": None,
        }
        enums: dict[str, type[Enum]] = {
            "quant_format": QuantFormat,
            "activation_type": QuantType,
            "weight_type": QuantType,
            "calibrate_method": CalibrationMethod,
        }
        quantize_static(str(prepared), str(output), _Reader(job.feeds), **_as_enums(params, enums))
        rows = {"calibration_rows": len(job.feeds), "calibration_rows_per_feed": 1}
        return {**params, **rows, "pre_process": pre}

    return convert


def _fp16(job: _Job, output: Path, work: Path) -> dict[str, Any]:
    import onnx
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    params: dict[str, Any] = {
        "min_positive_val": 5.96e-08,
        "max_finite_val": 65504.0,
        "keep_io_types": True,
        "disable_shape_infer": False,
        "op_block_list": list(DEFAULT_OP_BLOCK_LIST),
        "node_block_list": None,
        "force_fp16_initializers": False,
        "force_fp16_inputs": None,
        "use_bfloat16_as_blocked_nodes_dtype": False,
    }
    model = convert_float_to_float16(onnx.load(str(job.baseline)), **params)
    onnx.save(model, str(output))
    return params


def _pruned(job: _Job, output: Path, work: Path) -> dict[str, Any]:
    import onnx

    model = onnx.load(str(job.baseline))
    cuts, layers, pairs = plan(model, job.prune_ratio)
    if not layers:
        raise _not_prunable(job, model, pairs)
    shrink(model, cuts)
    hidden = {t for layer in layers for t in layer["hidden_tensors"]}
    kept = [v for v in model.graph.value_info if v.name not in hidden]
    del model.graph.value_info[:]  # the hidden tensors' declared shapes no longer hold
    model.graph.value_info.extend(kept)
    onnx.save(model, str(output))
    return {
        "ratio": job.prune_ratio,
        "criterion": CRITERION,
        "structure": STRUCTURE,
        "fine_tuned": False,
        "layers": layers,
    }


def _not_prunable(job: _Job, model: onnx.ModelProto, pairs: int) -> ConversionError:
    name = _variant_name("pruned", job.prune_ratio)
    if pairs:
        return ConversionError(
            f"{name} of {job.baseline.name}: its {pairs} prunable layer(s) are too narrow to "
            f"lose a whole unit at ratio {job.prune_ratio}. Fix: a larger prune ratio, or leave "
            "pruned out with --variant"
        )
    ops = ", ".join(sorted({n.op_type for n in model.graph.node}))
    return ConversionError(
        f"{name} of {job.baseline.name}: the model has no MatMul/Gemm/Conv pair whose hidden "
        "channels can be removed (a node with a constant weight whose output reaches exactly "
        "one more such node only through elementwise ops with constants and unary "
        f"activations; its ops are {ops}). Fix: leave pruned out with --variant"
    )


_SPECS: dict[str, _Spec] = {
    "int8-dynamic": _Spec(
        "int8", "onnxruntime.quantization.quantize_dynamic", "onnxruntime", _int8_dynamic
    ),
    "int8-qdq-per-channel": _Spec(
        "int8",
        "onnxruntime.quantization.quantize_static",
        "onnxruntime",
        _int8_static(per_channel=True, reduce_range=False),
        needs_calibration=True,
    ),
    "int8-qdq-reduce-range": _Spec(
        "int8",
        "onnxruntime.quantization.quantize_static",
        "onnxruntime",
        _int8_static(per_channel=False, reduce_range=True),
        needs_calibration=True,
    ),
    "fp16": _Spec(
        "fp16", "onnxruntime.transformers.float16.convert_float_to_float16", "onnxruntime", _fp16
    ),
    "pruned": _Spec("pruned", "qualify.convert.structured_magnitude_pruning", "onnx", _pruned),
}


# ---------------------------------------------------------------------------------------------
# Checking a written variant, and the words of a failure.

_LOCATIONS = (
    re.compile(r"implementation for (?P<op>\w+)\(\d+\) node with name '(?P<node>[^']*)'"),
    re.compile(r"running (?P<op>\w+) node\. Name:'(?P<node>[^']*)'"),
    re.compile(r"In Node, \(\"(?P<node>[^\"]*)\", (?P<op>\w+),"),
    re.compile(r"of operator \((?P<op>\w+)\) in node \((?P<node>[^)]*)\)"),
    re.compile(r"Node \((?P<node>[^)]*)\) Op \((?P<op>\w+)\)"),
)
"""Where onnxruntime's messages name the op type and node."""


def _run(path: Path, feed: Mapping[str, np.ndarray]) -> None:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=_CPU)
    session.run(None, dict(feed))


def _check_runs(name: str, job: _Job, spec: _Spec, path: Path) -> None:
    """Raise `ConversionError` unless the written variant loads and runs the probe feed."""
    try:
        _run(path, job.probe)
    except Exception as exc:
        op, node = _location(exc)
        try:
            _run(job.baseline, job.probe)
        except Exception as base_exc:
            fix = (
                "the baseline itself does not run on this onnxruntime's CPU provider "
                f"({_one_line(base_exc)}); make it run first"
            )
        else:
            fix = _run_fix(name, spec, op, str(exc))
        raise ConversionError(
            f"{name} of {job.baseline.name}: the written model does not run in onnxruntime "
            f"{_version('onnxruntime')} on the CPU{_where(op, node)}: {_one_line(exc)}. "
            f"Fix: {fix}"
        ) from exc


def _run_fix(name: str, spec: _Spec, op: str | None, message: str) -> str:
    leave = f"leave {name} out with --variant"
    if op and "Could not find an implementation" in message:
        return (
            f"this runtime has no {spec.precision} kernel for {op}; qualify {name} on a class "
            f"whose provider has one, or {leave}"
        )
    if op and spec.precision == "fp16" and "Type 'tensor(float16)'" in message:
        return (
            f"{op} takes no float16 in ONNX and the converter did not keep it in float32; {leave}"
        )
    return leave


def _converter_failed(name: str, job: _Job, spec: _Spec, exc: BaseException) -> ConversionError:
    op, node = _location(exc)
    fixes = {
        "int8": f"leave {name} out with --variant, or change that node in the baseline so the "
        "quantizer accepts it (it wants constant weights as initializers)",
        "pruned": f"leave {name} out with --variant, and report this qualify bug",
    }
    fix = fixes.get(spec.precision, f"leave {name} out with --variant")
    return ConversionError(
        f"{name} of {job.baseline.name}: {spec.tool} failed{_where(op, node)}: "
        f"{_one_line(exc)}. Fix: {fix}"
    )


def _where(op: str | None, node: str | None) -> str:
    if op is None:
        return ""
    return f" at {op} node {node!r}" if node else f" at a {op} node"


def _location(exc: BaseException) -> tuple[str | None, str | None]:
    """(op type, node name) of the node a failure concerns: the innermost ``node`` local (or
    ``self.node``) in the converter's traceback, else what onnxruntime's message names."""
    import onnx

    found: onnx.NodeProto | None = None
    tb = exc.__traceback__
    while tb is not None:
        scope = tb.tb_frame.f_locals
        owner = getattr(scope.get("self"), "__dict__", {})
        for candidate in (owner.get("node"), scope.get("node")):
            if isinstance(candidate, onnx.NodeProto):
                found = candidate
        tb = tb.tb_next
    if found is not None:
        return found.op_type, found.name or None
    for pattern in _LOCATIONS:
        match = pattern.search(str(exc))
        if match:
            return match["op"], match["node"] or None
    return None, None


_SCRATCH = re.compile(r"\S*/\.[^/\s]+\.p\d+\.[^/\s]*\.tmp/")
"""The scratch folder in a path onnxruntime quotes: the reader knows the file by its name."""


def _one_line(exc: BaseException, limit: int = 300) -> str:
    """The message on one line, without onnxruntime's status prefix or scratch paths."""
    text = " ".join(str(exc).split())
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)
    text = re.sub(r"^Load model from \S+ failed:\s*", "", text)
    text = _SCRATCH.sub("", text).rstrip(".") or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
