"""What an ONNX file declares at its edges: the inputs it needs and the outputs it produces.

Owns reading an artifact's graph signature (names, element types, ranks, static dimensions)
without running it, so that a project whose workload does not fit its model is refused when it
is loaded, before anything is copied into the store or measured. Does not judge the workload:
`qualify.project.checks` compares the two and words the problem.

The file is parsed as a protobuf with the message classes ``onnx`` generates (``onnx_ml_pb2``),
loaded on their own: ``import onnx`` itself pulls in ``ml_dtypes`` and costs over a second,
which every command that loads a project would pay. External weight files are not read. A file
that does not parse, or parses into something with no graph (an empty file parses as an empty
``ModelProto``), is not an ONNX model.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from qualify.errors import ArtifactError
from schemas.atomic import read_bounded

__all__ = ["MAX_PROTO_BYTES", "ModelSignature", "TensorSignature", "read_signature"]

MAX_PROTO_BYTES = 2**31 - 1
"""Protobuf's own ceiling on one serialized message: larger ONNX files cannot be valid."""

Dim = int | str | None
"""One dimension: a static size, a symbolic name, or None when the graph says nothing."""


@dataclass(frozen=True)
class TensorSignature:
    """One graph input or output as the file declares it."""

    name: str
    dtype: str | None
    """NumPy name of the element type (``float32``), or None for a non-tensor or unknown type."""
    shape: tuple[Dim, ...] | None
    """Dimensions, or None when the rank is not declared."""

    def describe(self) -> str:
        """``x float32 [batch, 784]``, for listing a model's real inputs in a message."""
        dims = "?" if self.shape is None else "[" + ", ".join(_dim(d) for d in self.shape) + "]"
        return f"{self.name} {self.dtype or '?'} {dims}"


@dataclass(frozen=True)
class ModelSignature:
    """The inputs a model needs (initializers excluded) and the outputs it produces."""

    inputs: tuple[TensorSignature, ...]
    optional_inputs: tuple[TensorSignature, ...]
    """Graph inputs that an initializer gives a default (IR < 4 lists every weight here)."""
    outputs: tuple[TensorSignature, ...]

    def input(self, name: str) -> TensorSignature | None:
        """The required or optional input called ``name``."""
        for sig in (*self.inputs, *self.optional_inputs):
            if sig.name == name:
                return sig
        return None

    def output(self, name: str) -> TensorSignature | None:
        """The output called ``name``."""
        return next((sig for sig in self.outputs if sig.name == name), None)


# TensorProto.DataType -> NumPy's name for it.
_DTYPES = {
    1: "float32",
    2: "uint8",
    3: "int8",
    4: "uint16",
    5: "int16",
    6: "int32",
    7: "int64",
    8: "str",
    9: "bool",
    10: "float16",
    11: "float64",
    12: "uint32",
    13: "uint64",
    14: "complex64",
    15: "complex128",
    16: "bfloat16",
}


@cache
def _protos() -> ModuleType:
    """onnx's generated ``onnx_ml_pb2``, without running ``onnx/__init__``."""
    loaded = sys.modules.get("onnx.onnx_ml_pb2")
    if loaded is not None:
        return loaded
    package = importlib.util.find_spec("onnx")
    if package is None or not package.submodule_search_locations:
        raise ArtifactError("the onnx package is not installed; reinstall qualify")
    where = Path(next(iter(package.submodule_search_locations))) / "onnx_ml_pb2.py"
    spec = importlib.util.spec_from_file_location("qualify._onnx_ml_pb2", where)
    if spec is None or spec.loader is None:
        raise ArtifactError(f"{where}: cannot load onnx's protobuf classes; reinstall onnx")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _dim(d: Dim) -> str:
    return "?" if d is None else str(d)


def _tensor(value: Any) -> TensorSignature:
    name = str(getattr(value, "name", ""))
    type_proto = getattr(value, "type", None)
    if type_proto is None or type_proto.WhichOneof("value") != "tensor_type":
        return TensorSignature(name=name, dtype=None, shape=None)
    tensor = type_proto.tensor_type
    dtype = _DTYPES.get(int(tensor.elem_type))
    if not tensor.HasField("shape"):
        return TensorSignature(name=name, dtype=dtype, shape=None)
    dims: list[Dim] = []
    for d in tensor.shape.dim:
        which = d.WhichOneof("value")
        if which == "dim_value" and d.dim_value > 0:
            dims.append(int(d.dim_value))
        elif which == "dim_param" and d.dim_param:
            dims.append(str(d.dim_param))
        else:
            dims.append(None)
    return TensorSignature(name=name, dtype=dtype, shape=tuple(dims))


def read_signature(path: Path) -> ModelSignature:
    """The declared inputs and outputs of the ONNX file at ``path``.

    Raises:
        ArtifactError: the file cannot be read, is larger than a protobuf can be, does not parse
            as an ONNX model, or has no graph outputs.
    """
    from google.protobuf.message import DecodeError

    try:
        size = os.stat(path).st_size
        if size > MAX_PROTO_BYTES:
            raise ArtifactError(
                f"{path}: {size} bytes is more than one ONNX protobuf can hold (2 GiB); "
                "save the weights as external data"
            )
        data = read_bounded(path, MAX_PROTO_BYTES)  # a pipe or a device is refused by name
        size = len(data)
        if size > MAX_PROTO_BYTES:
            raise ArtifactError(f"{path}: grew past 2 GiB while it was read")
    except OSError as exc:
        raise ArtifactError(f"{path}: cannot read artifact: {exc.strerror or exc}") from exc
    model = _protos().ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise ArtifactError(f"{path}: not an ONNX model (it does not parse: {exc})") from exc
    if model.ir_version <= 0 or not model.HasField("graph") or not model.graph.output:
        raise ArtifactError(
            f"{path}: not an ONNX model (no IR version or no graph outputs in {size} bytes)"
        )
    graph = model.graph
    weights = {init.name for init in graph.initializer}
    weights.update(sparse.values.name for sparse in graph.sparse_initializer)
    declared = [_tensor(v) for v in graph.input]
    return ModelSignature(
        inputs=tuple(s for s in declared if s.name not in weights),
        optional_inputs=tuple(s for s in declared if s.name in weights),
        outputs=tuple(_tensor(v) for v in graph.output),
    )
