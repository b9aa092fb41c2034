"""The committed demo assets are what their README says: real, small, loadable, in parity.

Checks the files in ``qualify/demo/assets/`` against their README (digests), against the contract
``qualify demo`` relies on (names, shapes, opset 17 / IR 8, a genuinely int8 candidate that passes
int8 parity) and, in a slow test, against a fresh rebuild by ``scripts/build_demo_assets.py``.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from qualify.demo.assets import (
    ASSETS_DIR,
    FP32_MODEL,
    INPUTS,
    INT8_MODEL,
    LABELS,
    NAMES,
    asset_path,
)

ROOT = Path(__file__).resolve().parents[3]
CPU = ["CPUExecutionProvider"]


def _scores(model: Path, x: np.ndarray) -> np.ndarray:
    (out,) = ort.InferenceSession(str(model), providers=CPU).run(["scores"], {"pixels": x})
    return np.asarray(out)


def _readme_digests(readme: Path) -> dict[str, str]:
    rows = re.findall(
        r"^\| `([^`]+)` \| [\d,]+ \| `(sha256:[0-9a-f]{64})` \|$", readme.read_text(), re.M
    )
    return dict(rows)


def test_every_asset_is_present_and_all_together_stay_under_five_megabytes() -> None:
    paths = [asset_path(n) for n in NAMES]
    assert all(p.parent == ASSETS_DIR for p in paths)
    assert sum(p.stat().st_size for p in paths) < 5 * 1024**2


def test_asset_path_refuses_a_name_that_is_not_an_asset() -> None:
    with pytest.raises(KeyError, match=FP32_MODEL):
        asset_path("model.onnx")


def test_readme_digests_match_the_committed_bytes() -> None:
    digests = _readme_digests(ASSETS_DIR / "README.md")
    assert set(digests) == set(NAMES)
    for name, digest in digests.items():
        assert digest == "sha256:" + hashlib.sha256(asset_path(name).read_bytes()).hexdigest()


@pytest.mark.parametrize("name", [FP32_MODEL, INT8_MODEL])
def test_models_pin_opset_17_and_ir_8_with_pixels_in_and_scores_out(name: str) -> None:
    model = onnx.load(str(asset_path(name)))
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == 8
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    shapes = {
        v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in [*model.graph.input, *model.graph.output]
    }
    assert shapes == {"pixels": ["batch", 64], "scores": ["batch", 10]}


def test_candidate_is_genuinely_int8() -> None:
    ops = {n.op_type for n in onnx.load(str(asset_path(INT8_MODEL))).graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops
    assert "MatMul" not in ops


def test_candidate_weights_leave_headroom_so_avx2_hosts_without_vnni_compute_the_same() -> None:
    # onnxruntime's AVX2 u8s8 kernel sums pairs of u8 x s8 products in int16 (vpmaddubsw):
    # 2 * 255 * 64 = 32,640 fits, 2 * 255 * 128 does not. With every weight in [-64, 64] no
    # host saturates, so parity cannot depend on which x86-64 runs the suite.
    model = onnx.load(str(asset_path(INT8_MODEL)))
    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    weights = [consts[n.input[1]] for n in model.graph.node if n.op_type == "MatMulInteger"]
    assert weights and all(w.dtype == np.int8 for w in weights)
    assert max(int(np.abs(w.astype(np.int32)).max()) for w in weights) <= 64


def test_recorded_inputs_are_scaled_test_images_with_their_labels() -> None:
    x, y = np.load(asset_path(INPUTS)), np.load(asset_path(LABELS))
    assert x.dtype == np.float32 and x.shape == (450, 64)
    assert y.dtype == np.int64 and y.shape == (450,)
    assert float(x.min()) == 0.0 and float(x.max()) == 1.0
    assert set(y.tolist()) == set(range(10))


def test_baseline_is_accurate_and_candidate_passes_int8_parity() -> None:
    x, y = np.load(asset_path(INPUTS)), np.load(asset_path(LABELS))
    fp32, int8 = _scores(asset_path(FP32_MODEL), x), _scores(asset_path(INT8_MODEL), x)
    assert float(np.mean(fp32.argmax(axis=1) == y)) >= 0.95
    assert float(np.mean(fp32.argmax(axis=1) == int8.argmax(axis=1))) >= 0.98
    assert float(np.abs(fp32 - int8).max()) < 0.05
    assert not np.array_equal(fp32, int8)


@pytest.mark.slow
def test_rebuild_reproduces_the_committed_assets(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "build_demo_assets.py"),
            "--out",
            str(tmp_path),
            "--no-measure",
        ],
        check=True,
        capture_output=True,
    )
    # The split is pure numpy: its files must be byte-identical everywhere.
    for name in (INPUTS, LABELS):
        assert (tmp_path / name).read_bytes() == asset_path(name).read_bytes()
    # Trained weights may round differently on another BLAS or CPU, and a weight on the edge of
    # an int8 step may then land in the next one: compare what the models compute.
    x = np.load(asset_path(INPUTS))
    for name, atol in ((FP32_MODEL, 1e-4), (INT8_MODEL, 0.05)):
        rebuilt, committed = _scores(tmp_path / name, x), _scores(asset_path(name), x)
        np.testing.assert_allclose(rebuilt, committed, atol=atol)
