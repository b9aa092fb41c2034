"""The converters on the real demo model: every variant loads, computes nearly the baseline's
answers and says exactly how it was made; a converter that cannot make one says which op and
what to do, and leaves nothing behind.

int8 numerics differ between CPUs with and without AVX-512 VNNI, so no assertion here depends on
an exact int8 value: only on agreement bounds every x86-64 CPU meets."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from qualify.convert import VARIANTS, ConversionError, Variant, calibration_digest, make_variants
from qualify.demo_assets import asset_path
from tests.models import IR_VERSION, OPSET, build

BASELINE = asset_path("digits-mlp-fp32.onnx")
INPUTS = np.load(asset_path("digits_inputs.npy"))


def run(path: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"pixels": x})[0])


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Variant]:
    out = tmp_path_factory.mktemp("variants")
    return {v.name: v for v in make_variants(BASELINE, out, {"pixels": INPUTS})}


def test_every_variant_is_made_loads_and_answers_like_the_baseline(
    made: dict[str, Variant],
) -> None:
    assert list(made) == list(VARIANTS)
    reference = run(BASELINE, INPUTS)
    for name, variant in made.items():
        got = run(variant.path, INPUTS)
        agreement = float((got.argmax(1) == reference.argmax(1)).mean())
        assert agreement >= 0.95, name
        assert float(np.abs(got - reference).max()) < 0.8, name
        assert variant.path.name == f"digits-mlp-fp32-{name}.onnx"
    fp16 = run(made["fp16"].path, INPUTS)
    assert float(np.abs(fp16 - reference).max()) < 1e-2  # fp16 keeps float32 inputs and outputs


def test_every_variant_records_its_tool_version_and_every_parameter(
    made: dict[str, Variant],
) -> None:
    for v in made.values():
        json.dumps(v.params)
        assert v.tool_version
        assert v.params["output_opset"] == 17 and v.params["output_ir_version"] == 8
    assert made["int8-qdq-per-channel"].params["per_channel"] is True
    assert made["int8-qdq-reduce-range"].params["reduce_range"] is True
    assert made["int8-qdq-per-channel"].params["calibration_rows"] == 256
    assert made["fp16"].params["keep_io_types"] is True
    assert "not fine-tuned" in (made["pruned"].note or "")


def test_the_pruned_variant_really_has_fewer_hidden_units(made: dict[str, Variant]) -> None:
    pruned = made["pruned"]
    weights = {i.name: list(i.dims) for i in onnx.load(str(pruned.path)).graph.initializer}
    [layer] = pruned.params["layers"]
    assert (layer["units"], layer["kept"], layer["removed"]) == (448, 336, 112)
    assert weights["fc0.weight"] == [64, 336]
    assert weights["fc0.bias"] == [336]
    assert weights["fc1.weight"] == [336, 448]
    assert pruned.path.stat().st_size < BASELINE.stat().st_size


def test_the_calibration_digest_is_stable_and_follows_the_data() -> None:
    first = calibration_digest({"pixels": INPUTS})
    assert first == calibration_digest({"pixels": INPUTS.copy()})
    assert first.startswith("sha256:")
    changed = INPUTS.copy()
    changed[0, 0] += 1
    assert calibration_digest({"pixels": changed}) != first
    assert calibration_digest({"other": INPUTS}) != first


def test_static_quantization_without_recorded_inputs_says_how_to_fix_it(tmp_path: Path) -> None:
    with pytest.raises(ConversionError, match="recorded"):
        make_variants(BASELINE, tmp_path, None, which=["int8-qdq-per-channel"])
    assert list(tmp_path.iterdir()) == []


def test_a_model_without_a_prunable_pair_names_its_ops(tmp_path: Path) -> None:
    model = build("classifier", tmp_path / "m")
    with pytest.raises(ConversionError, match=r"no MatMul pair.*MatMul.*Softmax"):
        make_variants(model, tmp_path / "out", None, which=["pruned"])
    assert list((tmp_path / "out").iterdir()) == []


def test_a_variant_this_runtime_cannot_run_names_the_op_and_leaves_nothing(tmp_path: Path) -> None:
    # Celu takes float32 only: its fp16 variant is an invalid model onnxruntime refuses.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    graph = helper.make_graph([helper.make_node("Celu", ["x"], ["y"], name="celu0")], "g", [x], [y])
    model = helper.make_model(
        graph, ir_version=IR_VERSION, opset_imports=[helper.make_opsetid("", OPSET)]
    )
    path = tmp_path / "celu.onnx"
    onnx.save(model, str(path))
    ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])  # the baseline is fine
    with pytest.raises(ConversionError, match=r"fp16: .* on op Celu \(node 'celu0'\).*Fix:") as err:
        make_variants(path, tmp_path / "out", None, which=["fp16"])
    assert ".tmp" not in str(err.value)
    assert list((tmp_path / "out").iterdir()) == []


def test_unknown_variants_are_refused_with_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="int8-dynamic"):
        make_variants(BASELINE, tmp_path, None, which=["int4"])
