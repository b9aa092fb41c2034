"""Every test model in ``tests/models.py`` behaves as its docstring says under real onnxruntime.

The runner's error classification leans on these models, so the exact onnxruntime exception
types and messages they produce are pinned here. ``hang`` and ``memory_hog`` run only in child
processes: the first is killed after two seconds, the second runs under RLIMIT_AS.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests import models

VALID = ["identity_mlp", "identity_mlp_perturbed", "classifier", "hang", "memory_hog"]
RUNNABLE = {"identity_mlp": (4,), "identity_mlp_perturbed": (4,), "classifier": (5,)}
CPU = ["CPUExecutionProvider"]


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=CPU)


def _uniform(rows: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((rows, models.FEATURES), dtype=np.float32)


def test_registry_lists_every_situation_the_runner_must_handle() -> None:
    assert set(models.MODELS) == {
        "identity_mlp",
        "identity_mlp_perturbed",
        "classifier",
        "unknown_op",
        "future_opset",
        "corrupt",
        "hang",
        "memory_hog",
    }


@pytest.mark.parametrize("name", sorted(models.MODELS))
def test_builder_writes_name_dot_onnx_with_the_same_bytes_every_time(
    name: str, tmp_path: Path
) -> None:
    first = models.build(name, tmp_path / "a")
    second = models.build(name, tmp_path / "b")
    assert first == tmp_path / "a" / f"{name}.onnx"
    assert first.read_bytes() == second.read_bytes()
    assert [p.name for p in (tmp_path / "a").iterdir()] == [f"{name}.onnx"]


def test_unknown_model_name_is_a_key_error_listing_the_names(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="identity_mlp"):
        models.build("no_such_model", tmp_path)


@pytest.mark.parametrize("name", VALID)
def test_valid_models_pin_opset_17_and_ir_8_with_dynamic_batch(name: str, tmp_path: Path) -> None:
    model = onnx.load(str(models.build(name, tmp_path)))
    assert model.ir_version == models.IR_VERSION
    assert [(o.domain, o.version) for o in model.opset_import] == [("", models.OPSET)]
    (inp,) = model.graph.input
    dims = [d.dim_param or d.dim_value for d in inp.type.tensor_type.shape.dim]
    assert (inp.name, dims) == (models.INPUT, ["N", models.FEATURES])


@pytest.mark.parametrize("name", sorted(RUNNABLE))
@pytest.mark.parametrize("batch", [1, 7])
def test_valid_models_run_at_any_batch_size(name: str, batch: int, tmp_path: Path) -> None:
    (out,) = _session(models.build(name, tmp_path)).run(None, {"x": _uniform(batch)})
    assert out.shape == (batch, *RUNNABLE[name])
    assert out.dtype == np.float32
    assert np.isfinite(out).all()


def test_perturbed_mlp_breaks_int8_parity_with_the_original(tmp_path: Path) -> None:
    x = _uniform(256, seed=3)
    (base,) = _session(models.build("identity_mlp", tmp_path)).run(None, {"x": x})
    (bad,) = _session(models.build("identity_mlp_perturbed", tmp_path)).run(None, {"x": x})
    (again,) = _session(models.build("identity_mlp", tmp_path / "again")).run(None, {"x": x})
    assert float(np.abs(base - bad).max()) > 0.1
    assert np.array_equal(base, again)


def test_classifier_scores_are_probabilities_spread_over_classes(tmp_path: Path) -> None:
    (scores,) = _session(models.build("classifier", tmp_path)).run(None, {"x": _uniform(256)})
    np.testing.assert_allclose(scores.sum(axis=1), 1.0, rtol=1e-5)
    # Top-1 agreement is only a meaningful check if more than one class wins.
    assert set(scores.argmax(axis=1).tolist()) == set(range(5))


@pytest.mark.parametrize(
    ("name", "error", "message"),
    [
        ("unknown_op", "InvalidGraph", "No Op registered for NoSuchOp with domain_version of 17"),
        ("future_opset", "Fail", "Opset 99 is under development"),
        ("corrupt", "InvalidProtobuf", "Protobuf parsing failed"),
    ],
)
def test_onnxruntime_refuses_to_load_broken_models(
    name: str, error: str, message: str, tmp_path: Path
) -> None:
    path = models.build(name, tmp_path)
    with pytest.raises(Exception, match=message) as info:
        _session(path)
    assert type(info.value).__name__ == error
    assert f"Load model from {path} failed" in str(info.value)


def _child(code: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )


def test_memory_hog_loads_fast_and_fails_to_allocate_under_an_address_space_limit(
    tmp_path: Path,
) -> None:
    path = models.build("memory_hog", tmp_path)
    limit = 2 * 1024**3
    proc = _child(
        f"""
        import json, resource, time
        resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
        assert resource.getrlimit(resource.RLIMIT_AS)[0] == {limit}
        import numpy as np, onnxruntime as ort
        t0 = time.perf_counter()
        sess = ort.InferenceSession({str(path)!r}, providers=["CPUExecutionProvider"])
        load_s = time.perf_counter() - t0
        try:
            sess.run(None, {{"x": np.ones((1, 16), np.float32)}})
            error = None
        except Exception as exc:
            error = [type(exc).__name__, str(exc)]
        print(json.dumps({{"load_s": load_s, "error": error}}))
        """
    )
    assert proc.stdout is not None
    out = proc.stdout.read()
    proc.stdout.close()
    # os.wait4, not proc.wait: it also returns the child's rusage (its peak RSS).
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0, out
    result = json.loads(out.splitlines()[-1])
    assert result["load_s"] < 5.0
    assert result["error"] is not None, "an 8 GiB allocation succeeded under a 2 GiB limit"
    kind, message = result["error"]
    assert kind == "Fail"
    assert "Failed to allocate memory for requested buffer of size 8589934592" in message
    assert usage.ru_maxrss * 1024 < 1024**3  # ru_maxrss is KiB on Linux: nothing was touched


def test_hang_loads_fast_and_is_still_running_two_seconds_later(tmp_path: Path) -> None:
    path = models.build("hang", tmp_path)
    proc = _child(
        f"""
        import time
        import numpy as np, onnxruntime as ort
        t0 = time.perf_counter()
        sess = ort.InferenceSession({str(path)!r}, providers=["CPUExecutionProvider"])
        print(time.perf_counter() - t0, flush=True)
        sess.run(None, {{"x": np.ones((1, 16), np.float32)}})
        print("finished", flush=True)
        """
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30.0)
        assert ready, "the hang model did not load within 30 s"
        line = proc.stdout.readline()
        assert line, "the child died before loading the model"
        assert float(line) < 5.0
        started = time.monotonic()
        time.sleep(2.0)
        assert proc.poll() is None, f"inference ended after {time.monotonic() - started:.1f} s"
    finally:
        proc.kill()
        proc.communicate()
