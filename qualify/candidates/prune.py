"""Structured magnitude pruning's graph work: which hidden units of which layer pairs go.

Pairs are MatMul/Gemm -> [per-unit ops] -> MatMul/Gemm and group-1 Conv -> [the same,
BatchNormalization] -> Conv; `plan` picks the units with the smallest weight norm and `shrink`
cuts them out of the initializers. Uses onnx and numpy only; making, checking and recording the
variant is ``qualify.candidates.convert``'s.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import onnx

__all__ = ["CRITERION", "DEFAULT_DOMAINS", "STRUCTURE", "int_attribute", "nodes", "plan", "shrink"]

DEFAULT_DOMAINS = ("", "ai.onnx")
"""The domains of the standard ONNX operators."""


def nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of ``graph`` and of the subgraphs inside its nodes' attributes."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                yield from nodes(sub)


_UNARY = frozenset(
    {
        "Relu",
        "LeakyRelu",
        "Elu",
        "Selu",
        "Celu",
        "Sigmoid",
        "HardSigmoid",
        "HardSwish",
        "Tanh",
        "Softplus",
        "Softsign",
        "Gelu",
        "Mish",
        "ThresholdedRelu",
        "Clip",
        "Identity",
    }
)
"""Ops applied to each hidden unit on its own (Clip's bounds are scalars)."""
_PER_UNIT = frozenset({"Add", "Sub", "Mul", "Div"})
"""Binary ops that keep hidden units apart when the other operand is a constant. After a Conv,
an inference-mode BatchNormalization does too."""
CRITERION = (
    "L2 norm of each hidden unit's incoming weights in the baseline (a MatMul/Gemm weight "
    "column, a Conv output filter); the floor(units * ratio) smallest removed"
)
STRUCTURE = (
    "MatMul/Gemm -> [Add/Sub/Mul/Div by a constant, unary activations] -> MatMul/Gemm; "
    "Conv (group 1) -> [the same, BatchNormalization] -> Conv (group 1)"
)

_Cut = tuple[str, int]
"""An initializer and the axis along which it loses the removed units."""


@dataclass(frozen=True)
class _Pair:
    first: onnx.NodeProto
    second: onnx.NodeProto
    weight: str
    axis: int
    units: int
    cuts: list[_Cut]
    hidden: list[str]
    """The tensors between the two nodes, whose shapes change."""


class _Graph:
    """The lookups pruning needs over one graph."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        from onnx import numpy_helper

        overridable = {i.name for i in graph.input}  # an input may replace it at run time
        self.arrays = {
            i.name: numpy_helper.to_array(i) for i in graph.initializer if i.name not in overridable
        }
        self.outputs = {o.name for o in graph.output}
        self.uses = Counter(name for node in nodes(graph) for name in node.input)
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            for name in dict.fromkeys(node.input):
                self.consumers.setdefault(name, []).append(node)

    def owned(self, name: str) -> np.ndarray | None:
        """The constant ``name`` when pruning may reshape it: an initializer used once and not
        returned as a graph output."""
        if self.uses[name] != 1 or name in self.outputs:
            return None
        return self.arrays.get(name)


def int_attribute(node: onnx.NodeProto, name: str, default: int) -> int:
    for attr in node.attribute:
        if attr.name == name:
            return int(attr.i)
    return default


def _standard(node: onnx.NodeProto, *ops: str) -> bool:
    return node.op_type in ops and node.domain in DEFAULT_DOMAINS


def _units_cut(g: _Graph, name: str, units: int, offset: int) -> list[_Cut] | None:
    """How a constant operand combined with the hidden tensor loses the removed units: sliced
    (it has ``units`` entries on the hidden axis), untouched (it broadcasts over it), or None
    (it cannot be made to fit). ``offset`` is the hidden axis counted from the end."""
    array = g.arrays.get(name)
    if array is None:
        return None
    axis = array.ndim - offset
    if axis < 0 or array.shape[axis] == 1:
        return []
    if array.shape[axis] == units and g.owned(name) is not None:
        return [(name, axis)]
    return None


def _first_of(node: onnx.NodeProto, g: _Graph) -> tuple[int, int, int, list[_Cut]] | None:
    """(hidden axis of the weight, units, hidden axis from the tensor's end, bias cuts) of a
    node whose output units can be removed."""
    if len(node.input) < 2:
        return None
    weight = g.owned(node.input[1])
    if weight is None:
        return None
    if _standard(node, "MatMul") and weight.ndim == 2:
        return 1, weight.shape[1], 1, []
    if _standard(node, "Gemm") and weight.ndim == 2:
        axis = 0 if int_attribute(node, "transB", 0) else 1
        bias = _units_cut(g, node.input[2], weight.shape[axis], 1) if len(node.input) > 2 else []
        return None if bias is None else (axis, weight.shape[axis], 1, bias)
    if _standard(node, "Conv") and int_attribute(node, "group", 1) == 1 and weight.ndim >= 3:
        units, bias_name = weight.shape[0], node.input[2] if len(node.input) > 2 else ""
        bias = [] if not bias_name else _units_cut(g, bias_name, units, 1)
        return None if bias is None else (0, units, weight.ndim - 1, bias)
    return None


def _second_of(node: onnx.NodeProto, tensor: str, units: int, conv: bool, g: _Graph) -> _Cut | None:
    """The weight cut of a node that takes the hidden tensor as its data input, or None."""
    if len(node.input) < 2 or node.input[0] != tensor or node.input[1] == tensor:
        return None
    weight = g.owned(node.input[1])
    if weight is None or weight.ndim < 2:
        return None
    if conv:
        fits = _standard(node, "Conv") and int_attribute(node, "group", 1) == 1 and weight.ndim >= 3
        return (node.input[1], 1) if fits and weight.shape[1] == units else None
    if _standard(node, "MatMul") and weight.ndim == 2:
        axis = 0
    elif _standard(node, "Gemm") and not int_attribute(node, "transA", 0):
        axis = 1 if int_attribute(node, "transB", 0) else 0
    else:
        return None
    return (node.input[1], axis) if weight.shape[axis] == units else None


def _between(
    node: onnx.NodeProto, tensor: str, units: int, offset: int, g: _Graph
) -> list[_Cut] | None:
    """The cuts of an elementwise node on the way from one weight to the next, or None when it
    mixes hidden units or is not elementwise. ``offset`` 1 is a MatMul/Gemm chain (units on
    the last axis), more a Conv chain (units on axis 1)."""
    if len(node.output) != 1 or node.domain not in DEFAULT_DOMAINS:
        return None
    if node.op_type == "BatchNormalization" and offset > 1:
        return _batch_norm_cuts(node, tensor, units, g)
    if node.op_type in _UNARY:
        return [] if node.input[0] == tensor and tensor not in node.input[1:] else None
    if node.op_type in _PER_UNIT and len(node.input) == 2 and list(node.input).count(tensor) == 1:
        other = node.input[1] if node.input[0] == tensor else node.input[0]
        return _units_cut(g, other, units, offset)
    return None


def _batch_norm_cuts(node: onnx.NodeProto, tensor: str, units: int, g: _Graph) -> list[_Cut] | None:
    """An inference-mode BatchNormalization after a Conv: its four per-channel constants."""
    stats = list(node.input[1:])
    if node.input[0] != tensor or len(stats) != 4 or tensor in stats:
        return None
    arrays = [g.owned(name) for name in stats]
    if any(a is None or a.shape != (units,) for a in arrays):
        return None
    return [(name, 0) for name in stats]


def _pair_from(first: onnx.NodeProto, g: _Graph) -> _Pair | None:
    found = _first_of(first, g)
    if found is None:
        return None
    axis, units, offset, cuts = found
    cuts = [(first.input[1], axis), *cuts]
    hidden: list[str] = []
    tensor = first.output[0]
    while tensor not in g.outputs and len(users := g.consumers.get(tensor, [])) == 1:
        hidden.append(tensor)
        node = users[0]
        last = _second_of(node, tensor, units, _standard(first, "Conv"), g)
        if last is not None:
            return _Pair(first, node, first.input[1], axis, units, [*cuts, last], hidden)
        step = _between(node, tensor, units, offset, g)
        if step is None:
            return None
        cuts.extend(step)
        tensor = node.output[0]
    return None


def _label(node: onnx.NodeProto) -> str:
    return node.name or f"{node.op_type} -> {node.output[0]}"


def plan(
    model: onnx.ModelProto, ratio: float
) -> tuple[dict[str, list[tuple[int, np.ndarray]]], list[dict[str, Any]], int]:
    """Which units each pair loses: (initializer -> [(axis, kept indices)], one record per
    pruned layer, pairs found). Norms are taken from the baseline's weights, so a weight that
    loses rows to one pair and columns to the next is judged the same either way round."""
    g = _Graph(model.graph)
    cuts: dict[str, list[tuple[int, np.ndarray]]] = {}
    layers: list[dict[str, Any]] = []
    pairs = [p for p in (_pair_from(n, g) for n in model.graph.node) if p is not None]
    for pair in pairs:
        drop = int(pair.units * ratio)
        if drop < 1 or any(axis in {a for a, _ in cuts.get(n, [])} for n, axis in pair.cuts):
            continue
        weight = g.arrays[pair.weight].astype(np.float64)
        others = tuple(a for a in range(weight.ndim) if a != pair.axis)
        norms = np.sqrt(np.square(weight).sum(axis=others))
        keep = np.sort(np.argsort(norms, kind="stable")[drop:])
        for name, axis in pair.cuts:
            cuts.setdefault(name, []).append((axis, keep))
        layers.append(
            {
                "node": _label(pair.first),
                "op_type": pair.first.op_type,
                "weight": pair.weight,
                "next_node": _label(pair.second),
                "units": int(pair.units),
                "kept": len(keep),
                "removed": drop,
                "reshaped": [f"{name}[axis {axis}]" for name, axis in pair.cuts],
                "hidden_tensors": pair.hidden,
            }
        )
    return cuts, layers, len(pairs)


def shrink(model: onnx.ModelProto, cuts: Mapping[str, list[tuple[int, np.ndarray]]]) -> None:
    from onnx import numpy_helper

    for init in model.graph.initializer:
        if init.name in cuts:
            array = numpy_helper.to_array(init)
            for axis, keep in cuts[init.name]:
                array = np.take(array, keep, axis=axis)
            init.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(array), init.name))
