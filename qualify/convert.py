"""Candidate variants of a baseline: int8 dynamic, int8 static QDQ, fp16 and a pruned model.

Owns running the converters (onnxruntime's quantization tools, its float16 converter, and a
structured magnitude pruning of MatMul/Gemm pairs written here) and describing each result with
the parameters it was made with. It does not decide what is kept (``qualify.candidates``
stores, records lineage and edits the project file) and never measures: a variant only has to
load and run one row before it is handed on, and ``qualify run`` qualifies it like any other.

onnxruntime is imported here (the converters live in its package) and in ``qualify.worker``;
``qualify candidates`` is a separate command, so no measuring process pays for it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

__all__ = [
    "VARIANTS",
    "ConversionError",
    "Variant",
    "calibration_digest",
    "make_variants",
]

VARIANTS = (
    "int8-dynamic",
    "int8-qdq-per-channel",
    "int8-qdq-reduce-range",
    "fp16",
    "pruned",
)
"""The variants `make_variants` knows, in the order it makes them."""

_CALIBRATION_ROWS = 256
_WHERE = (
    # onnxruntime's and the converters' ways of naming the op and the node that failed
    re.compile(r"implementation for (?P<op>\w+)\(\d+\) node with name '(?P<node>[^']*)'"),
    re.compile(r"In Node, \(\"(?P<node>[^\"]*)\", (?P<op>\w+),"),
    re.compile(r"of operator \((?P<op>\w+)\) in node \((?P<node>[^)]*)\)"),
    re.compile(r"of node \((?P<node>[^)]*)\)"),
    re.compile(r"No Op registered for (?P<op>\w+)"),
    re.compile(r"op_type[=: ]+'?(?P<op>[A-Z]\w+)"),
)


class ConversionError(Exception):
    """A converter could not make a variant; the message names the variant, the op and the fix."""


@dataclass(frozen=True)
class Variant:
    """One made variant and how it was made."""

    name: str
    precision: str
    path: Path
    tool: str
    tool_version: str
    params: dict[str, Any] = field(default_factory=dict)
    note: str | None = None


def calibration_digest(calibration: Mapping[str, np.ndarray]) -> str:
    """``sha256:<hex>`` of the calibration data: names sorted, each with dtype, shape and bytes."""
    h = hashlib.sha256()
    for name in sorted(calibration):
        array = np.ascontiguousarray(calibration[name])
        h.update(f"{name}\0{array.dtype.str}\0{list(array.shape)}\0".encode())
        h.update(array.tobytes())
    return "sha256:" + h.hexdigest()


def _ort() -> Any:
    import onnxruntime

    return onnxruntime


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."


def _op_and_node(message: str) -> tuple[str | None, str | None]:
    op = node = None
    for pattern in _WHERE:
        found = pattern.search(message)
        if found is not None:
            named = found.groupdict()
            op = op or named.get("op")
            node = node or named.get("node")
    return op, node


def _failure(
    variant: str, exc: BaseException, fix: str, model: onnx.ModelProto | None = None
) -> ConversionError:
    """A converter's or onnxruntime's exception as one message naming the op and the node."""
    message = str(exc)
    op, node = _op_and_node(message)
    if op is None and node is not None and model is not None:
        op = next((n.op_type for n in model.graph.node if n.name == node), None)
    where = (f" on op {op}" if op else "") + (f" (node {node!r})" if node else "")
    text = re.sub(r"\S*\.tmp\b", f"the {variant} model", _one_line(exc))
    return ConversionError(f"{variant}: the converter failed{where}: {text}. Fix: {fix}")


@contextlib.contextmanager
def _atomic_target(target: Path) -> Iterator[Path]:
    """A temporary path beside ``target``, renamed onto it when the block succeeds."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _feed(model: onnx.ModelProto, calibration: Mapping[str, np.ndarray] | None) -> dict[str, Any]:
    """One row of each input: from the calibration data, else zeros (symbolic dims as 1)."""
    feed: dict[str, Any] = {}
    initializers = {i.name for i in model.graph.initializer}
    for inp in model.graph.input:
        if inp.name in initializers:
            continue
        if calibration is not None and inp.name in calibration:
            feed[inp.name] = np.asarray(calibration[inp.name][:1])
            continue
        tensor = inp.type.tensor_type
        shape = [d.dim_value if d.dim_value > 0 else 1 for d in tensor.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        feed[inp.name] = np.zeros(shape, dtype=dtype)
    return feed


def _check_loads(variant: str, path: Path, feed: dict[str, Any]) -> None:
    ort = _ort()
    try:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        session.run(None, feed)
    except Exception as exc:
        raise _failure(
            variant,
            exc,
            "this runtime cannot run the variant on the CPU; leave it out with --variant, or "
            "qualify it on a class whose provider has the kernel",
            onnx.load(str(path), load_external_data=False),
        ) from None


class _Reader:
    """onnxruntime's CalibrationDataReader protocol over recorded rows, one row per feed."""

    def __init__(self, calibration: Mapping[str, np.ndarray], rows: int) -> None:
        self._feeds = iter(
            [{k: np.asarray(v[i : i + 1]) for k, v in calibration.items()} for i in range(rows)]
        )

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)


def _dynamic(baseline: Path, target: Path) -> dict[str, Any]:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    params = {"weight_type": "QInt8", "per_channel": True, "reduce_range": True}
    quantize_dynamic(
        str(baseline), str(target), weight_type=QuantType.QInt8, per_channel=True, reduce_range=True
    )
    return params


def _static(
    baseline: Path,
    target: Path,
    calibration: Mapping[str, np.ndarray],
    *,
    per_channel: bool,
    reduce_range: bool,
) -> dict[str, Any]:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    rows = min(_CALIBRATION_ROWS, min(len(v) for v in calibration.values()))
    params = {
        "quant_format": "QDQ",
        "activation_type": "QUInt8",
        "weight_type": "QInt8",
        "per_channel": per_channel,
        "reduce_range": reduce_range,
        "calibrate_method": "MinMax",
        "calibration_rows": rows,
        "pre_processing": "none",
    }
    # The calibrator's augmented model goes to a temporary directory of onnxruntime's own.
    quantize_static(
        str(baseline),
        str(target),
        _Reader(calibration, rows),
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        per_channel=per_channel,
        reduce_range=reduce_range,
        calibrate_method=CalibrationMethod.MinMax,
    )
    return params


def _fp16(baseline: Path, target: Path) -> dict[str, Any]:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(str(baseline))
    converted = convert_float_to_float16(model, keep_io_types=True)
    onnx.save(converted, str(target))
    return {"keep_io_types": True, "min_positive_val": 1e-7, "max_finite_val": 1e4}


_ELEMENTWISE = {"Relu", "LeakyRelu", "Sigmoid", "Tanh", "Gelu", "Elu", "Selu", "Softplus", "Clip"}


def _consumers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    found: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            found.setdefault(name, []).append(node)
    return found


def _chain(
    start: onnx.NodeProto, consumers: dict[str, list[onnx.NodeProto]], inits: dict[str, Any]
) -> tuple[str | None, onnx.NodeProto | None]:
    """From a MatMul, through a bias Add and elementwise activations, to the one next MatMul:
    (bias initializer name or None, the next MatMul) or (None, None) when the path branches."""
    bias: str | None = None
    tensor = start.output[0]
    while True:
        users = consumers.get(tensor, [])
        if len(users) != 1:
            return None, None
        node = users[0]
        if node.op_type == "MatMul" and node.input[0] == tensor and node.input[1] in inits:
            return bias, node
        if node.op_type == "Add" and bias is None:
            other = node.input[1] if node.input[0] == tensor else node.input[0]
            if other not in inits or inits[other].ndim != 1:
                return None, None
            bias = other
        elif node.op_type not in _ELEMENTWISE:
            return None, None
        tensor = node.output[0]


def _prune_model(model: onnx.ModelProto, ratio: float) -> list[dict[str, Any]]:
    """Remove the ``ratio`` share of hidden units with the smallest weight-column L2 norm from
    every MatMul -> (Add) -> activation -> MatMul pair; returns what each pair lost."""
    graph = model.graph
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    consumers = _consumers(graph)
    layers: list[dict[str, Any]] = []
    changed: dict[str, np.ndarray] = {}
    for node in graph.node:
        if node.op_type != "MatMul" or node.input[1] not in inits or node.input[1] in changed:
            continue
        weight = inits[node.input[1]]
        bias, after = _chain(node, consumers, inits)
        if after is None or weight.ndim != 2 or after.input[1] in changed:
            continue
        following = inits[after.input[1]]
        units = weight.shape[1]
        drop = int(units * ratio)
        if drop < 1 or following.ndim != 2 or following.shape[0] != units:
            continue
        keep = np.sort(np.argsort(np.linalg.norm(weight, axis=0))[drop:])
        changed[node.input[1]] = weight[:, keep]
        changed[after.input[1]] = following[keep, :]
        if bias is not None:
            changed[bias] = inits[bias][keep]
        layers.append({"weight": node.input[1], "units": units, "kept": len(keep), "removed": drop})
    for init in graph.initializer:
        if init.name in changed:
            init.CopyFrom(numpy_helper.from_array(changed[init.name], init.name))
    del graph.value_info[:]  # shapes of the hidden tensors changed; onnxruntime infers them
    return layers


def _pruned(baseline: Path, target: Path, ratio: float) -> dict[str, Any]:
    model = onnx.load(str(baseline))
    layers = _prune_model(model, ratio)
    if not layers:
        ops = sorted({n.op_type for n in model.graph.node})
        raise ConversionError(
            f"pruned: {baseline.name} has no MatMul pair whose hidden units can be removed (a "
            "MatMul with a constant weight feeding, through a bias Add and activations, one "
            f"more such MatMul); its ops are {', '.join(ops)}. Fix: leave 'pruned' out with "
            "--variant"
        )
    onnx.save(model, str(target))
    return {
        "ratio": ratio,
        "criterion": "L2 norm of each hidden unit's input weights, smallest removed",
        "structure": "MatMul -> [Add] -> activation -> MatMul",
        "layers": layers,
        "fine_tuned": False,
    }


def _make_one(
    name: str,
    baseline: Path,
    target: Path,
    calibration: Mapping[str, np.ndarray] | None,
    prune_ratio: float,
) -> tuple[str, str, dict[str, Any], str | None]:
    """(precision, tool, params, note) of one variant written to ``target``."""
    if name == "int8-dynamic":
        return "int8", "onnxruntime.quantization.quantize_dynamic", _dynamic(baseline, target), None
    if name.startswith("int8-qdq"):
        if not calibration:
            raise ConversionError(
                f"{name}: static quantization calibrates on recorded inputs, and the workload "
                "has none. Fix: give the workload a 'recorded' input (a .npy of real samples), "
                "or leave static variants out with --variant int8-dynamic --variant fp16"
            )
        per_channel = name == "int8-qdq-per-channel"
        params = _static(
            baseline, target, calibration, per_channel=per_channel, reduce_range=not per_channel
        )
        return "int8", "onnxruntime.quantization.quantize_static", params, None
    if name == "fp16":
        tool = "onnxruntime.transformers.float16.convert_float_to_float16"
        return "fp16", tool, _fp16(baseline, target), None
    params = _pruned(baseline, target, prune_ratio)
    note = f"magnitude-pruned ({prune_ratio:.0%} of hidden units), not fine-tuned"
    return "pruned", "qualify.convert (structured magnitude pruning)", params, note


def make_variants(
    baseline: Path,
    out_dir: Path,
    calibration: Mapping[str, np.ndarray] | None,
    *,
    which: Sequence[str] | None = None,
    prune_ratio: float = 0.25,
) -> list[Variant]:
    """Make the variants asked for (all by default) beside each other in ``out_dir``.

    Each is written atomically as ``<baseline stem>-<variant>.onnx`` and must load and run one
    row on the CPU before it is returned.

    Raises:
        ValueError: an unknown variant name, or a prune ratio outside (0, 0.9].
        ConversionError: a converter failed; nothing of that variant is left behind.
    """
    names = list(which) if which else list(VARIANTS)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variant(s) {unknown}; known: {', '.join(VARIANTS)}")
    if not 0.0 < prune_ratio <= 0.9:
        raise ValueError(f"prune ratio {prune_ratio} must be within (0, 0.9]")
    baseline, out_dir = baseline.resolve(), out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    feed = _feed(onnx.load(str(baseline), load_external_data=False), calibration)
    version = str(_ort().__version__)
    made: list[Variant] = []
    stem = baseline.name.removesuffix(".onnx")
    for name in names:
        target = out_dir / f"{stem}-{name}.onnx"
        with _atomic_target(target) as tmp:
            try:
                precision, tool, params, note = _make_one(
                    name, baseline, tmp, calibration, prune_ratio
                )
            except ConversionError:
                raise
            except Exception as exc:
                raise _failure(
                    name, exc, "leave this variant out with --variant, or simplify the op"
                ) from None
            _check_loads(name, tmp, feed)
            written = onnx.load(str(tmp), load_external_data=False)
            params["output_opset"] = next(
                (o.version for o in written.opset_import if o.domain in ("", "ai.onnx")), None
            )
            params["output_ir_version"] = int(written.ir_version)
        tool_version = onnx.__version__ if name == "pruned" else version
        made.append(Variant(name, precision, target, tool, tool_version, params, note))
    return made
