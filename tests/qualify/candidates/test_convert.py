"""Making candidate variants of a baseline (qualify.candidates.convert).

The demo's real digits MLP goes through every converter; tiny models built here with
onnx.helper (IR 8, opset 17) stand for the situations a converter cannot handle. Numerics are
checked with bounds that hold on any CPU: int8 kernels round differently with and without
AVX-512 VNNI, so nothing here depends on the exact values.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qualify.candidates.convert import (
    VARIANTS,
    ConversionError,
    Variant,
    calibration_digest,
    make_variants,
)
from qualify.demo.assets import FP32_MODEL, INPUTS, asset_path

ROOT = Path(__file__).resolve().parents[3]
CPU = ["CPUExecutionProvider"]
BASELINE = asset_path(FP32_MODEL)
NAMES = ["int8-dynamic", "int8-qdq-per-channel", "int8-qdq-reduce-range", "fp16", "pruned-25"]


def _pixels() -> np.ndarray:
    return np.asarray(np.load(asset_path(INPUTS)), dtype=np.float32)


def _scores(model: Path, pixels: np.ndarray) -> np.ndarray:
    (out,) = ort.InferenceSession(str(model), providers=CPU).run(["scores"], {"pixels": pixels})
    return np.asarray(out)


def _shapes(model: Path) -> dict[str, tuple[int, ...]]:
    return {i.name: tuple(i.dims) for i in onnx.load(str(model)).graph.initializer}


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Variant]:
    out = tmp_path_factory.mktemp("variants")
    variants = make_variants(BASELINE, out, {"pixels": _pixels()})
    return {v.name: v for v in variants}


def _save(tmp_path: Path, name: str, graph: onnx.GraphProto) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    return path


def _init(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array, dtype=np.float32), name)


def _run(model: Path, x: np.ndarray) -> np.ndarray:
    (out,) = ort.InferenceSession(str(model), providers=CPU).run(None, {"x": x})
    return np.asarray(out)


# --- the demo model through every converter --------------------------------------------------


def test_every_variant_is_written_beside_the_others_in_a_stable_order(
    made: dict[str, Variant],
) -> None:
    assert list(made) == NAMES
    for name, variant in made.items():
        assert variant.path.name == f"digits-mlp-fp32-{name}.onnx"
        assert variant.path.is_file()
    assert sorted(os.listdir(made["fp16"].path.parent)) == sorted(
        f"digits-mlp-fp32-{n}.onnx" for n in NAMES
    )
    assert {v.name: v.precision for v in made.values()} == {
        "int8-dynamic": "int8",
        "int8-qdq-per-channel": "int8",
        "int8-qdq-reduce-range": "int8",
        "fp16": "fp16",
        "pruned-25": "pruned",
    }


@pytest.mark.parametrize("name", NAMES)
def test_each_variant_loads_and_agrees_with_the_baseline(
    made: dict[str, Variant], name: str
) -> None:
    pixels = _pixels()
    expected = _scores(BASELINE, pixels)
    actual = _scores(made[name].path, pixels)
    assert actual.shape == expected.shape
    assert actual.dtype == np.float32
    assert np.mean(actual.argmax(1) == expected.argmax(1)) >= 0.9
    # pruned-25 is not fine-tuned, and int8-qdq-per-channel uses full 8-bit weights, whose
    # products saturate on CPUs without VNNI (AVX2 only): for those only the ranking holds on
    # every CPU CI may run on.
    if name not in ("pruned-25", "int8-qdq-per-channel"):
        assert float(np.abs(actual - expected).max()) < 0.5


def test_int8_and_fp16_variants_hold_their_weights_in_that_precision(
    made: dict[str, Variant],
) -> None:
    baseline_size = BASELINE.stat().st_size
    for name in ("int8-dynamic", "int8-qdq-per-channel", "int8-qdq-reduce-range"):
        model = onnx.load(str(made[name].path))
        types = {i.data_type for i in model.graph.initializer}
        assert TensorProto.INT8 in types, name
        assert made[name].path.stat().st_size < baseline_size / 3, name
    fp16 = onnx.load(str(made["fp16"].path))
    assert {i.data_type for i in fp16.graph.initializer} == {TensorProto.FLOAT16}
    assert fp16.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert fp16.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert made["fp16"].path.stat().st_size < baseline_size * 0.55


def test_variants_keep_the_baselines_ir_version_and_opset_and_record_them(
    made: dict[str, Variant],
) -> None:
    base = onnx.load(str(BASELINE))
    for variant in made.values():
        model = onnx.load(str(variant.path))
        opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
        assert variant.params["output_opset"] == opset
        assert variant.params["output_ir_version"] == model.ir_version
        assert opset >= base.opset_import[0].version
        assert {o.domain for o in model.opset_import} <= {"", "ai.onnx", "com.microsoft"}
    for name in ("fp16", "pruned-25"):
        assert made[name].params["output_opset"] == 17
        assert made[name].params["output_ir_version"] == base.ir_version


def test_pruned_variant_really_has_fewer_hidden_units_and_records_the_counts(
    made: dict[str, Variant],
) -> None:
    pruned = made["pruned-25"]
    assert _shapes(BASELINE)["fc1.weight"] == (448, 448)
    assert _shapes(pruned.path) == {
        "fc0.weight": (64, 336),
        "fc0.bias": (336,),
        "fc1.weight": (336, 336),
        "fc1.bias": (336,),
        "fc2.weight": (336, 10),
        "fc2.bias": (10,),
    }
    layers = pruned.params["layers"]
    assert [(x["node"], x["units"], x["kept"], x["removed"]) for x in layers] == [
        ("fc0/MatMul", 448, 336, 112),
        ("fc1/MatMul", 448, 336, 112),
    ]
    assert pruned.params["ratio"] == 0.25
    assert "L2 norm" in pruned.params["criterion"]
    assert pruned.params["fine_tuned"] is False
    assert pruned.note == "magnitude-pruned, not fine-tuned"
    assert pruned.tool_version == onnx.__version__
    assert pruned.path.stat().st_size < BASELINE.stat().st_size * 0.7


def test_lineage_params_are_json_and_name_every_converter_argument(
    made: dict[str, Variant],
) -> None:
    from onnxruntime.quantization import quantize_dynamic, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process
    from onnxruntime.transformers.float16 import convert_float_to_float16

    def arguments(function: object, *given: str) -> set[str]:
        params = inspect.signature(function).parameters  # type: ignore[arg-type]
        return {n for n, p in params.items() if p.kind is not p.VAR_KEYWORD} - set(given)

    for variant in made.values():
        assert json.loads(json.dumps(variant.params)) == variant.params
    dynamic = made["int8-dynamic"].params
    assert arguments(quantize_dynamic, "model_input", "model_output") <= set(dynamic)
    assert (dynamic["weight_type"], dynamic["per_channel"], dynamic["reduce_range"]) == (
        "QInt8",
        True,
        True,
    )
    for name, per_channel in (("int8-qdq-per-channel", True), ("int8-qdq-reduce-range", False)):
        static = made[name].params
        given = ("model_input", "model_output", "calibration_data_reader")
        assert arguments(quantize_static, *given) <= set(static)
        assert static["quant_format"] == "QDQ"
        assert (static["activation_type"], static["weight_type"]) == ("QUInt8", "QInt8")
        assert (static["per_channel"], static["reduce_range"]) == (per_channel, not per_channel)
        assert static["calibrate_method"] == "MinMax"
        assert static["calibration_rows"] == 256
    for name in ("int8-qdq-per-channel", "int8-qdq-reduce-range"):
        pre = made[name].params["pre_process"]
        assert arguments(quant_pre_process, "input_model", "output_model_path") <= set(pre)
        assert pre["skip_optimization"] is False
    assert dynamic["pre_process"] is None  # quantize_dynamic has no integer Gemm
    fp16 = made["fp16"].params
    assert arguments(convert_float_to_float16, "model") <= set(fp16)
    assert fp16["keep_io_types"] is True


def test_tools_and_versions_name_what_made_each_variant(made: dict[str, Variant]) -> None:
    assert made["int8-dynamic"].tool == "onnxruntime.quantization.quantize_dynamic"
    assert made["int8-qdq-per-channel"].tool == "onnxruntime.quantization.quantize_static"
    assert made["fp16"].tool == "onnxruntime.transformers.float16.convert_float_to_float16"
    for name in NAMES[:4]:
        assert made[name].tool_version == ort.__version__
    assert made["fp16"].note is not None and "float32" in made["fp16"].note
    assert made["int8-dynamic"].note is None


def test_making_the_variants_again_writes_the_same_bytes(
    made: dict[str, Variant], tmp_path: Path
) -> None:
    again = make_variants(BASELINE, tmp_path, {"pixels": _pixels()})
    for variant in again:
        assert variant.path.read_bytes() == made[variant.name].path.read_bytes(), variant.name
        assert variant.params == made[variant.name].params


# --- choosing variants -----------------------------------------------------------------------


def test_which_selects_variants_and_keeps_the_stable_order(tmp_path: Path) -> None:
    made = make_variants(BASELINE, tmp_path, None, which=["pruned", "int8-dynamic"])
    assert [v.name for v in made] == ["int8-dynamic", "pruned-25"]
    assert [v.name for v in make_variants(BASELINE, tmp_path, None, which="fp16")] == ["fp16"]


def test_unknown_variant_name_raises_listing_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'int4'") as caught:
        make_variants(BASELINE, tmp_path / "out", None, which=["fp16", "int4"])
    assert all(name in str(caught.value) for name in VARIANTS)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("ratio", [0.0, 1.0, -0.5, 1.5])
def test_prune_ratio_outside_zero_to_one_is_refused(tmp_path: Path, ratio: float) -> None:
    with pytest.raises(ValueError, match="prune ratio"):
        make_variants(BASELINE, tmp_path, None, which=["pruned"], prune_ratio=ratio)


def test_prune_ratio_names_the_variant_and_sets_the_share(tmp_path: Path) -> None:
    [variant] = make_variants(BASELINE, tmp_path, None, which=["pruned"], prune_ratio=0.5)
    assert variant.name == "pruned-50"
    assert variant.path.name == "digits-mlp-fp32-pruned-50.onnx"
    assert [x["kept"] for x in variant.params["layers"]] == [224, 224]
    assert _shapes(variant.path)["fc1.weight"] == (224, 224)


# --- calibration -----------------------------------------------------------------------------


def test_static_variants_without_calibration_raise_before_anything_is_written(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    with pytest.raises(ConversionError, match="record inputs in the workload") as caught:
        make_variants(BASELINE, out, None)
    assert "int8-qdq-per-channel" in str(caught.value)
    assert "int8-qdq-reduce-range" in str(caught.value)
    assert not out.exists()


def test_calibration_without_a_model_input_or_of_the_wrong_dtype_is_refused(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConversionError, match=r"'pixels'.*missing.*'image'"):
        make_variants(BASELINE, tmp_path, {"image": _pixels()}, which=["int8-qdq-per-channel"])
    with pytest.raises(ConversionError, match=r"'pixels'.*float64.*float32"):
        make_variants(BASELINE, tmp_path, {"pixels": _pixels().astype(np.float64)}, which=["fp16"])
    assert os.listdir(tmp_path) == []


def test_calibration_samples_of_a_whole_input_are_fed_as_they_are(tmp_path: Path) -> None:
    # An input without a batch axis: each recorded sample is the whole input.
    rng = np.random.default_rng(3)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "whole",
        [x],
        [y],
        [_init("w", rng.normal(size=(8, 4)))],
    )
    model = _save(tmp_path, "whole", graph)
    samples = rng.normal(size=(20, 8)).astype(np.float32)
    [variant] = make_variants(
        model, tmp_path / "out", {"x": samples}, which=["int8-qdq-reduce-range"]
    )
    assert variant.params["calibration_rows"] == 20
    assert _run(variant.path, samples[0]).shape == (4,)


def test_calibration_digest_is_stable_and_changes_with_the_data() -> None:
    pixels = _pixels()
    digest = calibration_digest({"pixels": pixels, "mask": np.ones(3, np.int64)})
    assert digest.startswith("sha256:") and len(digest) == 7 + 64
    assert digest == calibration_digest({"mask": np.ones(3, np.int64), "pixels": pixels.copy()})
    changed = pixels.copy()
    changed[17, 5] += 1e-3
    others = [
        {"pixels": changed, "mask": np.ones(3, np.int64)},
        {"pixels": pixels, "mask": np.ones(3, np.int32)},
        {"pixels": pixels.reshape(225, 128), "mask": np.ones(3, np.int64)},
        {"pixel": pixels, "mask": np.ones(3, np.int64)},
        {"pixels": pixels},
    ]
    assert len({digest, *(calibration_digest(o) for o in others)}) == 1 + len(others)
    with pytest.raises(ValueError, match="Python objects"):
        calibration_digest({"x": np.array([object()])})


# --- structured pruning on tiny models -------------------------------------------------------


def _dense_chain(tmp_path: Path, dead: list[int], *, gemm: bool) -> Path:
    """x[N,6] -> dense(16 units) -> +bias -> Relu -> dense(3): ``dead`` units have zero weights
    and zero bias, so they contribute nothing."""
    rng = np.random.default_rng(7)
    w1, b1 = rng.normal(size=(6, 16)), rng.normal(size=16)
    w1[:, dead] = 0.0
    b1[dead] = 0.0
    w2 = rng.normal(size=(16, 3))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])
    if gemm:  # weights stored transposed, bias as Gemm's C
        nodes = [
            helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="g1", transB=1),
            helper.make_node("Relu", ["h"], ["r"], name="relu"),
            helper.make_node("Gemm", ["r", "w2"], ["y"], name="g2", transB=1),
        ]
        inits = [_init("w1", w1.T), _init("b1", b1), _init("w2", w2.T)]
    else:
        nodes = [
            helper.make_node("MatMul", ["x", "w1"], ["m"], name="mm1"),
            helper.make_node("Add", ["m", "b1"], ["h"], name="add"),
            helper.make_node("Relu", ["h"], ["r"], name="relu"),
            helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2"),
        ]
        inits = [_init("w1", w1), _init("b1", b1), _init("w2", w2)]
    graph = helper.make_graph(nodes, "g", [x], [y], inits)
    return _save(tmp_path, "gemm" if gemm else "matmul", graph)


def _conv_chain(tmp_path: Path, dead: list[int]) -> Path:
    """x[N,2,6,6] -> Conv(8 filters, bias) -> BatchNormalization -> Relu -> Conv(3 filters);
    ``dead`` channels are zero after the BatchNormalization too."""
    rng = np.random.default_rng(11)
    w1, b1 = rng.normal(size=(8, 2, 3, 3)), rng.normal(size=8)
    scale, shift, mean = rng.normal(size=8), rng.normal(size=8), rng.normal(size=8)
    w1[dead] = 0.0
    b1[dead] = shift[dead] = mean[dead] = 0.0
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 6, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, 2, 2])
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c"], name="conv1"),
        helper.make_node("BatchNormalization", ["c", "s", "t", "mu", "var"], ["n"], name="bn"),
        helper.make_node("Relu", ["n"], ["r"], name="relu"),
        helper.make_node("Conv", ["r", "w2"], ["y"], name="conv2"),
    ]
    inits = [
        _init("w1", w1),
        _init("b1", b1),
        _init("s", scale),
        _init("t", shift),
        _init("mu", mean),
        _init("var", rng.uniform(0.5, 2.0, size=8)),
        _init("w2", rng.normal(size=(3, 8, 3, 3))),
    ]
    return _save(tmp_path, "conv", helper.make_graph(nodes, "g", [x], [y], inits))


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("matmul", {"w1": (6, 12), "b1": (12,), "w2": (12, 3)}),
        ("gemm", {"w1": (12, 6), "b1": (12,), "w2": (3, 12)}),
        (
            "conv",
            {
                "w1": (6, 2, 3, 3),
                "b1": (6,),
                **{k: (6,) for k in ("s", "t", "mu", "var")},
                "w2": (3, 6, 3, 3),
            },
        ),
    ],
)
def test_pruning_removes_the_weakest_units_and_keeps_what_the_others_compute(
    tmp_path: Path, kind: str, expected: dict[str, tuple[int, ...]]
) -> None:
    rng = np.random.default_rng(0)
    if kind == "conv":
        model = _conv_chain(tmp_path, [1, 6])
        x = rng.normal(size=(2, 2, 6, 6)).astype(np.float32)
    else:
        model = _dense_chain(tmp_path, [0, 5, 9, 15], gemm=kind == "gemm")
        x = rng.normal(size=(5, 6)).astype(np.float32)
    [variant] = make_variants(model, tmp_path / "out", None, which=["pruned"])
    assert _shapes(variant.path) == expected
    [layer] = variant.params["layers"]
    assert (layer["removed"], layer["kept"]) == (expected["b1"][0] // 3, expected["b1"][0])
    np.testing.assert_allclose(_run(variant.path, x), _run(model, x), rtol=1e-5, atol=1e-5)


def test_model_without_a_prunable_pair_raises_naming_the_fix(tmp_path: Path) -> None:
    # One MatMul straight into Softmax: no second weight to take the removed units from.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
            helper.make_node("Softmax", ["m"], ["y"], name="softmax"),
        ],
        "single",
        [x],
        [y],
        [_init("w", np.ones((4, 3)))],
    )
    model = _save(tmp_path, "single", graph)
    out = tmp_path / "out"
    with pytest.raises(ConversionError) as caught:
        make_variants(model, out, None, which=["pruned"])
    message = str(caught.value)
    assert message.startswith("pruned-25 of single.onnx:")
    assert "has no MatMul/Gemm/Conv pair whose hidden channels can be removed" in message
    assert "MatMul, Softmax" in message
    assert "--variant" in message
    assert os.listdir(out) == []


def test_hidden_units_that_another_node_also_reads_are_not_pruned(tmp_path: Path) -> None:
    # The Relu output is a graph output too: removing units would change what it returns.
    rng = np.random.default_rng(5)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    outputs = [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2]),
        helper.make_tensor_value_info("r", TensorProto.FLOAT, ["N", 8]),
    ]
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["m"], name="mm1"),
            helper.make_node("Relu", ["m"], ["r"], name="relu"),
            helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2"),
        ],
        "exposed",
        [x],
        outputs,
        [_init("w1", rng.normal(size=(4, 8))), _init("w2", rng.normal(size=(8, 2)))],
    )
    model = _save(tmp_path, "exposed", graph)
    with pytest.raises(ConversionError, match="no MatMul/Gemm/Conv pair"):
        make_variants(model, tmp_path / "out", None, which=["pruned"])


# --- failures: named, and nothing left behind -------------------------------------------------


def test_op_the_quantizer_cannot_handle_names_variant_op_node_and_fix(tmp_path: Path) -> None:
    # A Conv whose weight arrives at run time but whose bias is constant: quantize_dynamic
    # needs the weight as an initializer to reshape the bias.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    w = helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 3, 3, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv_runtime_weight")],
        "runtime_weight",
        [x, w],
        [y],
        [_init("b", np.zeros(4))],
    )
    model = _save(tmp_path, "runtime-weight", graph)
    out = tmp_path / "out"
    with pytest.raises(ConversionError) as caught:
        make_variants(model, out, None, which=["int8-dynamic"])
    message = str(caught.value)
    assert message.startswith("int8-dynamic of runtime-weight.onnx:")
    assert "quantize_dynamic failed at Conv node 'conv_runtime_weight'" in message
    assert "Expected w to be an initializer" in message
    assert "Fix: leave int8-dynamic out with --variant" in message
    assert "\n" not in message
    assert os.listdir(out) == []


def test_variant_that_does_not_run_names_the_op_and_node_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    # Prunable, but with a Softplus on float64 that this CPU provider has no kernel for.
    rng = np.random.default_rng(9)
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
        helper.make_tensor_value_info("d", TensorProto.DOUBLE, ["N", 2]),
    ]
    outputs = [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2]),
        helper.make_tensor_value_info("z", TensorProto.DOUBLE, ["N", 2]),
    ]
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["m"], name="mm1"),
            helper.make_node("Relu", ["m"], ["r"], name="relu"),
            helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2"),
            helper.make_node("Softplus", ["d"], ["z"], name="softplus_f64"),
        ],
        "no_kernel",
        inputs,
        outputs,
        [_init("w1", rng.normal(size=(4, 8))), _init("w2", rng.normal(size=(8, 2)))],
    )
    model = _save(tmp_path, "no-kernel", graph)
    out = tmp_path / "out"
    with pytest.raises(ConversionError) as caught:
        make_variants(model, out, None, which=["pruned"])
    message = str(caught.value)
    assert "pruned-25 of no-kernel.onnx: the written model does not run" in message
    assert "at Softplus node 'softplus_f64'" in message
    assert "the baseline itself does not run" in message
    assert os.listdir(out) == []


def test_fp16_of_an_op_without_a_float16_form_names_it_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    # Celu takes float32 only: the converter's fp16 model is one onnxruntime refuses.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    graph = helper.make_graph([helper.make_node("Celu", ["x"], ["y"], name="celu0")], "g", [x], [y])
    model = _save(tmp_path, "celu", graph)
    _run(model, np.zeros((1, 4), np.float32))  # the baseline itself runs
    out = tmp_path / "out"
    with pytest.raises(ConversionError) as caught:
        make_variants(model, out, None, which=["fp16"])
    message = str(caught.value)
    assert message.startswith("fp16 of celu.onnx: the written model does not run")
    assert "at Celu node 'celu0'" in message
    assert "Celu takes no float16" in message and "--variant" in message
    assert ".tmp" not in message and str(tmp_path) not in message
    assert os.listdir(out) == []


def test_static_quantization_leaves_no_temporary_files_anywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = tmp_path / "system-tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    out = tmp_path / "out"
    made = make_variants(BASELINE, out, {"pixels": _pixels()[:32]}, which=["int8-qdq-per-channel"])
    assert made[0].params["calibration_rows"] == 32
    assert os.listdir(scratch) == []
    assert os.listdir(out) == ["digits-mlp-fp32-int8-qdq-per-channel.onnx"]


def test_a_killed_runs_scratch_folder_is_removed_by_the_next_run(tmp_path: Path) -> None:
    left = tmp_path / ".digits-mlp-fp32-fp16.onnx.p999999999.abc123.tmp"
    left.mkdir()
    (left / "digits-mlp-fp32-fp16.onnx").write_bytes(b"half")
    make_variants(BASELINE, tmp_path, None, which=["fp16"])
    assert os.listdir(tmp_path) == ["digits-mlp-fp32-fp16.onnx"]


def test_unreadable_baseline_names_the_file(tmp_path: Path) -> None:
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"\x00not a model")
    with pytest.raises(ConversionError, match=r"broken\.onnx: cannot read the baseline model"):
        make_variants(broken, tmp_path / "out", None, which=["fp16"])


def test_importing_convert_loads_neither_onnx_nor_onnxruntime() -> None:
    code = (
        "import sys, qualify.candidates.convert\n"
        "print(','.join(m for m in ('onnx', 'onnxruntime') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert out.stdout.strip() == ""


def _int64_only(tmp_path: Path) -> Path:
    """Token ids in, ids shifted by a constant out: no float tensor anywhere."""
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 8])
    out = helper.make_tensor_value_info("shifted", TensorProto.INT64, ["N", 8])
    graph = helper.make_graph(
        [helper.make_node("Add", ["ids", "offset"], ["shifted"], name="shift")],
        "ids",
        [ids],
        [out],
        [numpy_helper.from_array(np.arange(8, dtype=np.int64), "offset")],
    )
    return _save(tmp_path, "ids", graph)


@pytest.mark.parametrize("variant", ["int8-dynamic", "fp16"])
def test_a_graph_of_integers_only_has_nothing_to_quantize_and_no_variant_is_written(
    tmp_path: Path, variant: str
) -> None:
    model = _int64_only(tmp_path)
    out = tmp_path / "out"
    with pytest.raises(ConversionError) as caught:
        make_variants(model, out, None, which=[variant])
    message = str(caught.value)
    assert message.startswith(f"{variant} of ids.onnx: nothing to quantize")
    assert "int64" in message and "--variant" in message
    assert os.listdir(out) == []


def test_qualify_candidates_on_a_graph_of_integers_adds_no_candidate(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from qualify.cli import cli

    (tmp_path / "models").mkdir()
    model = _int64_only(tmp_path / "models")
    project = tmp_path / "qualify.yaml"
    assert CliRunner().invoke(cli, ["init", str(model), "--out", str(project)]).exit_code == 0
    before = project.read_bytes()
    result = CliRunner().invoke(
        cli,
        [
            "candidates",
            "--project",
            str(project),
            "--db",
            str(tmp_path / "m.duckdb"),
            "--variant",
            "int8-dynamic",
            "--variant",
            "fp16",
        ],
    )
    assert result.exit_code == 1, result.output
    for variant in ("int8-dynamic", "fp16"):
        assert f"{variant} of ids.onnx: nothing to quantize" in result.output
    assert project.read_bytes() == before
    assert not (tmp_path / "models" / "candidates").exists() or not list(
        (tmp_path / "models" / "candidates").glob("*.onnx")
    )
