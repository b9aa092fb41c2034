"""Tiny ONNX models for the tests, built by code at test time (no binaries committed).

Owns the registry ``MODELS``: name -> builder. A builder writes one model into a directory and
returns its path, in the style of Polygraphy's test model registry. Each model stands for one
situation the runner must handle: a good float model, a candidate that breaks parity, a
classifier, a model onnxruntime refuses (unknown op, future opset, corrupt bytes), one that never
finishes and one that asks for far more memory than a child is allowed. Does not run them: the
tests that use a model decide what to expect (``tests/test_models_registry.py`` checks that each
behaves as described here under real onnxruntime).

Every valid model has input ``x`` float32 [N, 16] with a dynamic batch dimension ``N``, opset 17
(``future_opset`` excepted, by design) and IR version 8, so onnxruntime 1.20+ loads it. Weights
come from seeded numpy generators: the same name always builds the same bytes.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "CLASSES",
    "FEATURES",
    "HOG_BYTES",
    "INPUT",
    "IR_VERSION",
    "MODELS",
    "OPSET",
    "STATE",
    "STEPS",
    "ModelBuilder",
    "build",
    "build_all",
    "passthrough",
    "recurrent",
    "time_first",
    "warns_each_run",
]

OPSET = 17
IR_VERSION = 8
INPUT = "x"
"""The input name of every model."""
FEATURES = 16
"""Columns of ``x``: every model takes float32 [N, 16]."""
HOG_BYTES = 8 * 1024**3
"""What one inference of ``memory_hog`` asks for in a single allocation: 8 GiB."""
HANG_TRIPS = 2**62
"""Trip count of ``hang``'s Loop: at ~1 µs an iteration, about 146,000 years."""

ModelBuilder = Callable[[Path], Path]
"""Writes one model into the given directory and returns the file's path."""

Array = npt.NDArray[np.float32]


def _write(model: onnx.ModelProto | bytes, directory: Path, name: str) -> Path:
    """Serialize ``model`` to ``directory/name.onnx`` atomically (temp file, fsync, rename)."""
    data = model if isinstance(model, bytes) else model.SerializeToString()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.onnx"
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _model(
    nodes: list[onnx.NodeProto],
    initializers: list[TensorProto],
    outputs: list[onnx.ValueInfoProto],
    name: str,
    opset: int = OPSET,
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, ["N", FEATURES])],
        outputs,
        initializers,
    )
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", opset)],
        ir_version=IR_VERSION,
        producer_name="qualify/tests/models.py",
    )


def _f32(array: npt.NDArray[np.float64]) -> Array:
    return np.asarray(array, dtype=np.float32)


def _mlp_weights(seed: int = 0) -> tuple[Array, Array, Array]:
    rng = np.random.default_rng(seed)
    w1 = _f32(rng.normal(0.0, 0.5, size=(FEATURES, 32)))
    b1 = _f32(rng.normal(0.0, 0.1, size=(32,)))
    w2 = _f32(rng.normal(0.0, 0.5, size=(32, 4)))
    return w1, b1, w2


def _mlp(w1: Array, b1: Array, w2: Array, name: str) -> onnx.ModelProto:
    nodes = [
        helper.make_node("MatMul", [INPUT, "w1"], ["h_mm"], name="fc1/MatMul"),
        helper.make_node("Add", ["h_mm", "b1"], ["h_add"], name="fc1/Add"),
        helper.make_node("Relu", ["h_add"], ["h"], name="relu"),
        helper.make_node("MatMul", ["h", "w2"], ["y"], name="fc2/MatMul"),
    ]
    inits = [
        numpy_helper.from_array(w1, "w1"),
        numpy_helper.from_array(b1, "b1"),
        numpy_helper.from_array(w2, "w2"),
    ]
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])]
    model = _model(nodes, inits, out, name)
    onnx.checker.check_model(model, full_check=True)
    return model


def identity_mlp(directory: Path) -> Path:
    """A valid float MLP: ``x`` [N, 16] -> MatMul, Add, Relu, MatMul -> ``y`` [N, 4]."""
    return _write(_mlp(*_mlp_weights(), name="identity_mlp"), directory, "identity_mlp")


def identity_mlp_perturbed(directory: Path) -> Path:
    """``identity_mlp``'s graph with every weight moved by N(0, 0.5) noise.

    Stands for a broken candidate: on uniform [0, 1) inputs its outputs differ from
    ``identity_mlp``'s by far more than 0.1 (the int8 tolerance is 0.05).
    """
    w1, b1, w2 = _mlp_weights()
    rng = np.random.default_rng(1)
    w1 = _f32(w1 + rng.normal(0.0, 0.5, size=w1.shape))
    b1 = _f32(b1 + rng.normal(0.0, 0.5, size=b1.shape))
    w2 = _f32(w2 + rng.normal(0.0, 0.5, size=w2.shape))
    return _write(
        _mlp(w1, b1, w2, name="identity_mlp_perturbed"), directory, "identity_mlp_perturbed"
    )


def classifier(directory: Path) -> Path:
    """A valid classifier: ``x`` [N, 16] -> MatMul, Add, Softmax -> ``scores`` [N, 5]."""
    rng = np.random.default_rng(2)
    w = _f32(rng.normal(0.0, 1.0, size=(FEATURES, 5)))
    # Centre the logits for inputs uniform in [0, 1), so every class wins some rows and top-1
    # agreement means something.
    b = _f32(-0.5 * w.sum(axis=0) + rng.normal(0.0, 0.1, size=(5,)))
    nodes = [
        helper.make_node("MatMul", [INPUT, "w"], ["logits_mm"], name="fc/MatMul"),
        helper.make_node("Add", ["logits_mm", "b"], ["logits"], name="fc/Add"),
        helper.make_node("Softmax", ["logits"], ["scores"], name="softmax", axis=-1),
    ]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    out = [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", 5])]
    model = _model(nodes, inits, out, "classifier")
    onnx.checker.check_model(model, full_check=True)
    return _write(model, directory, "classifier")


def unknown_op(directory: Path) -> Path:
    """A graph with a node of op type ``NoSuchOp`` in the default domain: refused at load."""
    nodes = [helper.make_node("NoSuchOp", [INPUT], ["y"], name="no_such_op")]
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", FEATURES])]
    # Not checked: onnx.checker refuses it too, which is the point.
    return _write(_model(nodes, [], out, "unknown_op"), directory, "unknown_op")


def future_opset(directory: Path) -> Path:
    """A valid Relu graph stamped with ai.onnx opset 99: refused at load."""
    nodes = [helper.make_node("Relu", [INPUT], ["y"], name="relu")]
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", FEATURES])]
    return _write(_model(nodes, [], out, "future_opset", opset=99), directory, "future_opset")


def corrupt(directory: Path) -> Path:
    """``identity_mlp``'s bytes cut off in the middle of a weight tensor (a partial download)."""
    data = _mlp(*_mlp_weights(), name="identity_mlp").SerializeToString()
    return _write(data[: len(data) // 2], directory, "corrupt")


def hang(directory: Path) -> Path:
    """Loads at once; inference runs a Loop of 2**62 tiny Adds, so it never finishes.

    ``x`` [N, 16] -> Loop(x += 1, trip count 2**62) -> ``y`` [N, 16].
    """
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep_going"),
            helper.make_node("Add", ["acc_in", "one"], ["acc_out"], name="step"),
        ],
        "hang_body",
        [
            helper.make_tensor_value_info("iter", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, ["N", FEATURES]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, ["N", FEATURES]),
        ],
        [numpy_helper.from_array(np.ones((1,), dtype=np.float32), "one")],
    )
    nodes = [
        helper.make_node("Loop", ["trips", "cond", INPUT], ["y"], name="forever", body=body),
    ]
    inits = [
        numpy_helper.from_array(np.array(HANG_TRIPS, dtype=np.int64), "trips"),
        numpy_helper.from_array(np.array(True), "cond"),
    ]
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", FEATURES])]
    model = _model(nodes, inits, out, "hang")
    onnx.checker.check_model(model, full_check=True)
    return _write(model, directory, "hang")


def memory_hog(directory: Path) -> Path:
    """Loads at once; inference expands one float to 2**31 of them (8 GiB) in one allocation.

    ``x`` [N, 16] -> ReduceSum to a scalar -> Expand to [2**31] -> ReduceMax -> ``y`` [].
    The Expand depends on the input, so constant folding cannot run it at load time, and its
    size does not depend on N. Run it only under an address-space limit (RLIMIT_AS), where the
    allocation fails before any page is touched.
    """
    count = HOG_BYTES // 4
    nodes = [
        helper.make_node("ReduceSum", [INPUT], ["total"], name="sum", keepdims=0),
        helper.make_node("Expand", ["total", "hog_shape"], ["hog"], name="hog"),
        helper.make_node("ReduceMax", ["hog"], ["y"], name="max", keepdims=0),
    ]
    inits = [numpy_helper.from_array(np.array([count], dtype=np.int64), "hog_shape")]
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])]
    model = _model(nodes, inits, out, "memory_hog")
    onnx.checker.check_model(model, full_check=True)
    return _write(model, directory, "memory_hog")


MODELS: dict[str, ModelBuilder] = {
    "identity_mlp": identity_mlp,
    "identity_mlp_perturbed": identity_mlp_perturbed,
    "classifier": classifier,
    "unknown_op": unknown_op,
    "future_opset": future_opset,
    "corrupt": corrupt,
    "hang": hang,
    "memory_hog": memory_hog,
}
"""Every test model by name."""


def padded_mlp(directory: Path, extra: int, name: str = "padded_mlp") -> Path:
    """``identity_mlp`` with ``extra`` MatMuls by the identity before it: the same numbers
    (multiplying by I is exact in float32) for measurably more work, the candidate an A/B must
    call slower. ``extra=0`` is the baseline's graph in other bytes (a different name)."""
    w1, b1, w2 = _mlp_weights()
    model = _mlp(w1, b1, w2, name=name)
    graph = model.graph
    eye = numpy_helper.from_array(np.eye(FEATURES, dtype=np.float32), "eye")
    previous = INPUT
    chain = []
    for k in range(extra):
        out = f"pad{k}"
        chain.append(helper.make_node("MatMul", [previous, "eye"], [out], name=f"pad/{k}"))
        previous = out
    if extra:
        first = graph.node[0]
        first.input[0] = previous
        nodes = [*chain, *graph.node]
        del graph.node[:]
        graph.node.extend(nodes)
        graph.initializer.append(eye)
    onnx.checker.check_model(model, full_check=True)
    return _write(model, directory, name)


def _checked(graph: onnx.GraphProto) -> onnx.ModelProto:
    """``graph`` as a model with this file's modest IR and opset, checked in full."""
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
        producer_name="qualify/tests/models.py",
    )
    onnx.checker.check_model(model, full_check=True)
    return model


STATE = 8
"""Hidden units of ``recurrent``'s state."""


def recurrent(directory: Path, name: str = "recurrent", noise: float = 0.0) -> Path:
    """A one-layer recurrent cell with the shapes real ones have: ``x`` [N, 16], a state ``h``
    [1, N, 8] that batches on axis 1 (as an LSTM's [layers, batch, hidden]) and a scalar
    ``gain`` (rank 0); ``h_out = tanh(x W + h U)`` [1, N, 8] is the next state and
    ``y = gain * (h_out V)`` [N, 4]. ``noise`` moves every weight (a candidate that drifts)."""
    rng = np.random.default_rng(11)
    w = _f32(rng.normal(0.0, 0.5, size=(FEATURES, STATE)))
    u = _f32(rng.normal(0.0, 0.9, size=(STATE, STATE)))
    v = _f32(rng.normal(0.0, 0.5, size=(STATE, 4)))
    if noise:
        moved = np.random.default_rng(12)
        w, u, v = (_f32(a + moved.normal(0.0, noise, size=a.shape)) for a in (w, u, v))
    nodes = [
        helper.make_node("Squeeze", ["h", "axis0"], ["h2"], name="state/Squeeze"),
        helper.make_node("MatMul", [INPUT, "w"], ["xw"], name="in/MatMul"),
        helper.make_node("MatMul", ["h2", "u"], ["hu"], name="rec/MatMul"),
        helper.make_node("Add", ["xw", "hu"], ["pre"], name="rec/Add"),
        helper.make_node("Tanh", ["pre"], ["hn"], name="rec/Tanh"),
        helper.make_node("Unsqueeze", ["hn", "axis0"], ["h_out"], name="state/Unsqueeze"),
        helper.make_node("MatMul", ["hn", "v"], ["yv"], name="out/MatMul"),
        helper.make_node("Mul", ["yv", "gain"], ["y"], name="out/Mul"),
    ]
    inits = [
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(u, "u"),
        numpy_helper.from_array(v, "v"),
        numpy_helper.from_array(np.array([0], dtype=np.int64), "axis0"),
    ]
    graph = helper.make_graph(
        nodes,
        name,
        [
            helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, ["N", FEATURES]),
            helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, "N", STATE]),
            helper.make_tensor_value_info("gain", TensorProto.FLOAT, []),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [1, "N", STATE]),
        ],
        inits,
    )
    model = _checked(graph)
    return _write(model, directory, name)


STEPS, CLASSES = 6, 5
"""``time_first``'s output [STEPS, N, CLASSES]."""


def time_first(directory: Path, name: str = "time_first", step0_noise: float = 0.0) -> Path:
    """A recogniser's time-first output: ``x`` [N, 16] -> ``y`` [STEPS, N, CLASSES] (``x W``
    reshaped to [N, STEPS, CLASSES], then transposed), as a CTC model returns [T, N, C]. The
    graph names the output's batch axis ``N``, the input's. ``step0_noise`` moves only the
    weights of the first step: that step's scores change a lot, each sample's a little."""
    rng = np.random.default_rng(21)
    w = rng.normal(0.0, 0.5, size=(FEATURES, STEPS, CLASSES))
    if step0_noise:
        w[:, 0, :] += np.random.default_rng(22).normal(0.0, step0_noise, size=(FEATURES, CLASSES))
    nodes = [
        helper.make_node("MatMul", [INPUT, "w"], ["xw"], name="fc/MatMul"),
        helper.make_node("Reshape", ["xw", "steps_classes"], ["nsc"], name="split/Reshape"),
        helper.make_node("Transpose", ["nsc"], ["y"], perm=[1, 0, 2], name="time_first"),
    ]
    inits = [
        numpy_helper.from_array(_f32(w.reshape(FEATURES, STEPS * CLASSES)), "w"),
        numpy_helper.from_array(np.array([-1, STEPS, CLASSES], dtype=np.int64), "steps_classes"),
    ]
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [STEPS, "N", CLASSES])]
    model = _model(nodes, inits, out, name)
    onnx.checker.check_model(model, full_check=True)
    return _write(model, directory, name)


def warns_each_run(directory: Path, name: str = "warns_each_run") -> Path:
    """``identity_mlp`` whose graph declares ``y`` [N, 3] while it returns [N, 4] (a runtime
    Reshape hides it from shape inference): onnxruntime logs a ``VerifyOutputSizes`` warning,
    in colour and with a timestamp, on every inference."""
    model = _mlp(*_mlp_weights(), name=name)
    graph = model.graph
    graph.node[-1].output[0] = "y_raw"
    graph.node.append(helper.make_node("Shape", ["y_raw"], ["y_shape"], name="shape"))
    graph.node.append(helper.make_node("Reshape", ["y_raw", "y_shape"], ["y"], name="reshape"))
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3]))
    onnx.checker.check_model(model, full_check=True)
    return _write(model, directory, name)


def passthrough(
    path: Path,
    shape: list[int | str],
    *,
    elem_type: int = TensorProto.FLOAT,
    input_name: str = INPUT,
) -> Path:
    """A valid one-node model (Identity) whose input and output ``y`` have ``shape`` and
    ``elem_type``, written to ``path``: for checks of what a graph declares, not of numbers."""
    graph = helper.make_graph(
        [helper.make_node("Identity", [input_name], ["y"], name="identity")],
        "passthrough",
        [helper.make_tensor_value_info(input_name, elem_type, shape)],
        [helper.make_tensor_value_info("y", elem_type, shape)],
    )
    model = _checked(graph)
    return _write(model, path.parent, path.name.removesuffix(".onnx"))


def build(name: str, directory: Path) -> Path:
    """Build one registered model into ``directory``.

    Args:
        name: a key of ``MODELS``.
        directory: where to write ``<name>.onnx`` (created if missing).

    Returns:
        The model's path.

    Raises:
        KeyError: ``name`` is not registered (the message lists the names).
    """
    if name not in MODELS:
        raise KeyError(f"no test model {name!r}; expected one of {', '.join(MODELS)}")
    return MODELS[name](directory)


def build_all(directory: Path) -> dict[str, Path]:
    """Build every registered model into ``directory``; returns their paths by name."""
    return {name: builder(directory) for name, builder in MODELS.items()}
