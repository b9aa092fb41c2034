"""Rebuild the demo's real model, its int8 candidate and its recorded inputs.

Owns everything under ``qualify/demo/assets/`` except ``__init__.py``: trains a small MLP on
scikit-learn's bundled digits (8x8 images, 1,797 samples, shipped inside the sklearn wheel, so
nothing is downloaded), writes it as an ONNX graph by hand with ``onnx.helper``, quantizes it to
int8 with onnxruntime's dynamic quantization, saves the held-out test images and labels, checks
everything with real onnxruntime and writes the README with accuracies and sha256 digests.
Does not belong to the ``qualify`` package and is never imported by it: it is a build tool, run by
a person (``python scripts/build_demo_assets.py [--out DIR]``).

Determinism: training runs single-threaded (threadpoolctl) with a fixed ``random_state``, and
neither ``onnx.save`` nor ``quantize_dynamic`` writes timestamps or random names, so two builds on
the same machine and library versions are byte-identical. Another BLAS, CPU or sklearn version
may round the trained weights differently and so change the digests; accuracies stay within a
hair. The latency printed at the end is measured on this machine and is not written anywhere.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier
from threadpoolctl import threadpool_limits

__all__ = [
    "FP32_NAME",
    "HIDDEN",
    "INPUTS_NAME",
    "INT8_NAME",
    "IR_VERSION",
    "LABELS_NAME",
    "OPSET",
    "SEED",
    "Parity",
    "batch1_latency_us",
    "build",
    "cold_start_ms",
    "load_data",
    "main",
    "mlp_to_onnx",
    "parity",
    "predict",
    "quantize",
    "train",
]

SEED = 0
"""random_state of the train/test split and of the MLP's initial weights and batches."""
HIDDEN = (448, 448)
"""Hidden layer sizes: 64 -> 448 -> 448 -> 10, ~234k weights, ~0.94 MB in fp32; big enough that a
batch-1 run takes tens of microseconds, small enough to commit."""
OPSET = 17
IR_VERSION = 8
"""Explicit, modest versions so onnxruntime 1.20+ loads both files (make_model would stamp the
newest IR the installed onnx knows)."""
TEST_SIZE = 0.25

FP32_NAME = "digits-mlp-fp32.onnx"
INT8_NAME = "digits-mlp-int8.onnx"
INPUTS_NAME = "digits_inputs.npy"
LABELS_NAME = "digits_labels.npy"
README_NAME = "README.md"

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "qualify" / "demo" / "assets"
SKLEARN_PARITY_MAX = 1e-5
"""onnxruntime's fp32 probabilities must equal sklearn's predict_proba within this."""
INT8_TOP1_MIN = 0.98
INT8_MAX_ABS_MAX = 0.05

FloatArray = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Parity:
    """fp32 vs int8 on the recorded inputs."""

    top1_agreement: float
    max_abs: float
    mean_abs: float


def _write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temp file in the same directory, fsync and rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; package data must be world-readable
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _npy_bytes(array: npt.NDArray[Any]) -> bytes:
    """The .npy encoding of ``array`` (no pickle)."""
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def _sha256(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def load_data(seed: int = SEED) -> tuple[FloatArray, FloatArray, IntArray, IntArray]:
    """The digits split into train and held-out test, pixels scaled from 0..16 to [0, 1].

    Args:
        seed: random_state of the stratified split.

    Returns:
        (x_train, x_test, y_train, y_test), float32 [N, 64] and int64 [N].
    """
    digits = load_digits()
    x = (np.asarray(digits.data, dtype=np.float64) / 16.0).astype(np.float32)
    y = np.asarray(digits.target, dtype=np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=TEST_SIZE, random_state=seed, stratify=y
    )
    return x_train, x_test, y_train, y_test


def train(x_train: FloatArray, y_train: IntArray, seed: int = SEED) -> MLPClassifier:
    """Train the ReLU MLP single-threaded, so BLAS thread count cannot change the weights.

    Args:
        x_train: float32 [N, 64] pixels in [0, 1].
        y_train: int64 [N] labels 0..9.
        seed: random_state of the initial weights and the mini-batch order.

    Returns:
        The fitted classifier (float32 weights, since the inputs are float32).
    """
    clf = MLPClassifier(
        hidden_layer_sizes=HIDDEN, activation="relu", max_iter=300, random_state=seed
    )
    with threadpool_limits(limits=1):
        clf.fit(x_train, y_train)
    return clf


def mlp_to_onnx(clf: MLPClassifier) -> onnx.ModelProto:
    """Write a fitted ReLU/softmax MLPClassifier as an ONNX graph, node by node.

    ``pixels`` float32 [batch, 64] -> (MatMul, Add, Relu) x 2 -> MatMul, Add -> Softmax ->
    ``scores`` float32 [batch, 10]. MatMul+Add rather than Gemm because onnxruntime's dynamic
    quantization turns MatMul (not Gemm) into MatMulInteger.

    Args:
        clf: a fitted classifier with ``activation='relu'`` and a softmax output.

    Returns:
        The checked model, opset 17, IR version 8.

    Raises:
        ValueError: the classifier is not a ReLU MLP with a softmax output.
    """
    if clf.activation != "relu" or clf.out_activation_ != "softmax":
        raise ValueError(
            f"expected activation='relu' and a softmax output, found activation="
            f"{clf.activation!r}, out_activation_={clf.out_activation_!r}"
        )
    weights: list[npt.NDArray[Any]] = list(clf.coefs_)
    biases: list[npt.NDArray[Any]] = list(clf.intercepts_)
    n_in = int(weights[0].shape[0])
    n_out = int(weights[-1].shape[1])
    nodes: list[onnx.NodeProto] = []
    initializers: list[TensorProto] = []
    current = "pixels"
    last = len(weights) - 1
    for i, (w, b) in enumerate(zip(weights, biases, strict=True)):
        w_name, b_name = f"fc{i}.weight", f"fc{i}.bias"
        initializers.append(numpy_helper.from_array(np.asarray(w, dtype=np.float32), w_name))
        initializers.append(numpy_helper.from_array(np.asarray(b, dtype=np.float32), b_name))
        nodes.append(
            helper.make_node("MatMul", [current, w_name], [f"fc{i}.mm"], name=f"fc{i}/MatMul")
        )
        nodes.append(
            helper.make_node("Add", [f"fc{i}.mm", b_name], [f"fc{i}.out"], name=f"fc{i}/Add")
        )
        current = f"fc{i}.out"
        if i < last:
            nodes.append(helper.make_node("Relu", [current], [f"relu{i}"], name=f"relu{i}"))
            current = f"relu{i}"
    nodes.append(helper.make_node("Softmax", [current], ["scores"], name="softmax", axis=-1))
    graph = helper.make_graph(
        nodes,
        "digits_mlp",
        [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["batch", n_in])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", n_out])],
        initializers,
        doc_string="sklearn digits MLP: pixels are the 8x8 image flattened, values/16 in [0,1]; "
        "scores are softmax probabilities of digits 0..9.",
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
        producer_name="qualify/scripts/build_demo_assets.py",
        producer_version="1",
        doc_string="Demo model of qualify, trained on sklearn's bundled digits.",
    )
    onnx.checker.check_model(model, full_check=True)
    return model


class _DropPreprocessNag(logging.Filter):
    """quantize_dynamic logs a warning suggesting quant_pre_process; we skip it on purpose
    (its graph optimisation would fuse MatMul+Add into Gemm, which dynamic quantization leaves
    in float)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing before quantization" not in record.getMessage()


def quantize(fp32_path: Path, int8_path: Path) -> None:
    """Dynamic int8 quantization: QInt8 per-channel 7-bit weights (reduce_range), activations
    quantized at run time.

    Args:
        fp32_path: the float model.
        int8_path: where the int8 model is written (atomically).

    Raises:
        RuntimeError: the output does not keep opset 17 / IR 8 or holds no integer MatMul.
    """
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "int8.onnx"
        root = logging.getLogger()
        nag = _DropPreprocessNag()
        root.addFilter(nag)
        try:
            quantize_dynamic(
                fp32_path,
                out,
                op_types_to_quantize=["MatMul"],
                per_channel=True,
                # 7-bit weights: x86 AVX2 hosts without VNNI multiply u8 activations by s8
                # weights in pairs summed into int16 (vpmaddubsw), which saturates on full
                # 8-bit weights (0.22 off fp32 there, 0.015 with VNNI); with |w| <= 64 the pair
                # sum stays below 2**15, so every x86 and ARM host computes the same integers.
                reduce_range=True,
                weight_type=QuantType.QInt8,
            )
        finally:
            root.removeFilter(nag)
        model = onnx.load(str(out))
    # quantize_dynamic keeps the input's IR and opset today; pin them anyway in case a later
    # onnxruntime bumps them past what onnxruntime 1.20 loads.
    model.ir_version = IR_VERSION
    opsets = {o.domain: o.version for o in model.opset_import}
    if opsets.get("", OPSET) != OPSET or set(opsets) - {"", "com.microsoft"}:
        raise RuntimeError(f"quantized model has opsets {opsets}, expected ai.onnx {OPSET}")
    if not any(n.op_type == "MatMulInteger" for n in model.graph.node):
        raise RuntimeError("quantized model holds no MatMulInteger node: nothing was quantized")
    onnx.checker.check_model(model, full_check=True)
    _write_atomic(int8_path, model.SerializeToString())


def _session(path: Path) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def predict(path: Path, x: FloatArray) -> FloatArray:
    """Probabilities from onnxruntime (CPU) for a batch of pixels."""
    out = _session(path).run(["scores"], {"pixels": x})[0]
    return np.asarray(out, dtype=np.float32)


def parity(fp32: FloatArray, int8: FloatArray) -> Parity:
    """Top-1 agreement and absolute differences of two probability batches."""
    diff = np.abs(fp32.astype(np.float64) - int8.astype(np.float64))
    agree = float(np.mean(fp32.argmax(axis=1) == int8.argmax(axis=1)))
    return Parity(top1_agreement=agree, max_abs=float(diff.max()), mean_abs=float(diff.mean()))


def batch1_latency_us(path: Path, x: FloatArray, warmup: int = 200, runs: int = 3000) -> float:
    """Median wall time of one batch-1 ``run`` under onnxruntime, in microseconds.

    One session, one intra-op thread, sequential execution; ``perf_counter_ns`` around each
    ``run``; rows cycled through ``x``; ``warmup`` runs discarded.
    """
    sess = _session(path)
    rows = [x[i : i + 1] for i in range(len(x))]
    for i in range(warmup):
        sess.run(["scores"], {"pixels": rows[i % len(rows)]})
    samples: list[int] = []
    for i in range(runs):
        feed = {"pixels": rows[i % len(rows)]}
        t0 = time.perf_counter_ns()
        sess.run(["scores"], feed)
        samples.append(time.perf_counter_ns() - t0)
    return statistics.median(samples) / 1000.0


_COLD_START = """
import sys, time
t0 = time.perf_counter()
import onnxruntime as ort
t1 = time.perf_counter()
for p in sys.argv[1:]:
    s = time.perf_counter()
    ort.InferenceSession(p, providers=["CPUExecutionProvider"])
    print(p, round((time.perf_counter() - s) * 1000, 2))
print("import", round((t1 - t0) * 1000, 2))
"""


def cold_start_ms(paths: Sequence[Path]) -> dict[str, float]:
    """In a fresh interpreter: ``import onnxruntime`` and each session creation, in ms."""
    proc = subprocess.run(
        [sys.executable, "-c", _COLD_START, *map(str, paths)],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, float] = {}
    for line in proc.stdout.splitlines():
        name, value = line.rsplit(" ", 1)
        result[Path(name).name if name != "import" else "import onnxruntime"] = float(value)
    return result


def _readme(
    seed: int,
    accuracy_sklearn: float,
    accuracy_fp32: float,
    accuracy_int8: float,
    par: Parity,
    n_train: int,
    n_test: int,
    digests: dict[str, str],
    sizes: dict[str, int],
) -> str:
    rows = "\n".join(
        f"| `{name}` | {sizes[name]:,} | `{digests[name]}` |" for name in sorted(digests)
    )
    return f"""# Demo assets

A real model trained on real data, small enough to commit, used by `qualify demo`. Every file
here except `__init__.py` is generated by `scripts/build_demo_assets.py`; do not edit by hand.

Rebuild (offline, a few seconds):

```
python scripts/build_demo_assets.py            # writes qualify/demo/assets/
python scripts/build_demo_assets.py --out DIR  # writes elsewhere
```

## Files

- `{FP32_NAME}`: the baseline. An MLP 64 -> {HIDDEN[0]} -> {HIDDEN[1]} -> 10 (ReLU) trained
  with scikit-learn's `MLPClassifier` (Adam, `random_state={seed}`) on the {n_train} training
  images of sklearn's bundled `load_digits()` (8x8 grey digits, pixel values 0..16). Written
  node by node with `onnx.helper`: `MatMul`/`Add`/`Relu` x 2, `MatMul`/`Add`, `Softmax`.
  Opset {OPSET}, IR version {IR_VERSION}.
  Input `pixels` float32 `[batch, 64]` (the image flattened row by row, divided by 16);
  output `scores` float32 `[batch, 10]`, softmax probabilities of the digits 0..9.
- `{INT8_NAME}`: the candidate. `onnxruntime.quantization.quantize_dynamic` of the baseline,
  QInt8 per-channel weights with `reduce_range` (7 bits, |w| <= 64), activations quantized at
  run time (`DynamicQuantizeLinear` + `MatMulInteger`); softmax and biases stay float. Opset
  {OPSET}, IR version {IR_VERSION}. The 7-bit weights keep onnxruntime's AVX2 u8s8 kernel
  (pairs of u8 x s8 products summed into int16) from saturating on hosts without VNNI, so the
  candidate computes the same numbers on every x86-64 host: checked on an AVX-512/VNNI Xeon
  and under `qemu-x86_64 -cpu Haswell` (AVX2 only), both max abs 0.0192. ARM's dot-product
  kernels do not sum in int16 pairs and compute slightly other numbers: on the first 64 test
  images, one at a time, 0.0303 on x86 (VNNI, Haswell, SandyBridge, Nehalem) and 0.0306 on an
  emulated Neoverse-N1 or Cortex-A72 (`bench/emulated_numerics.py`).
  Full 8-bit weights were 0.0147 off fp32 with VNNI and 0.22 off without.
- `{INPUTS_NAME}`: the {n_test} held-out test images (stratified split, {int(TEST_SIZE * 100)}%,
  `random_state={seed}`), float32 `[{n_test}, 64]`, already divided by 16: feed them as they are.
- `{LABELS_NAME}`: their true digits, int64 `[{n_test}]`.

## Numbers (measured by the build on the test images)

| | value |
|---|---|
| test accuracy, sklearn | {accuracy_sklearn:.4f} |
| test accuracy, fp32 ONNX under onnxruntime | {accuracy_fp32:.4f} |
| test accuracy, int8 ONNX under onnxruntime | {accuracy_int8:.4f} |
| top-1 agreement int8 vs fp32 | {par.top1_agreement:.4f} |
| max abs difference of probabilities, int8 vs fp32 | {par.max_abs:.4f} |
| mean abs difference of probabilities, int8 vs fp32 | {par.mean_abs:.6f} |

The build also checks that onnxruntime's fp32 probabilities equal sklearn's `predict_proba`
within {SKLEARN_PARITY_MAX:g}. Latency is printed by the build, not recorded here: it belongs to
the machine that measured it.

## Digests

| file | bytes | sha256 |
|---|---|---|
{rows}

Two builds on one machine with the same library versions are byte-identical (training runs
single-threaded with fixed seeds; nothing writes timestamps). Another CPU, BLAS or scikit-learn
version may round the weights differently and so change these digests.
"""


def build(out: Path, seed: int = SEED, measure: bool = True) -> dict[str, str]:
    """Train, export, quantize, check and write every asset into ``out``.

    Args:
        out: the directory to write (created if missing).
        seed: random_state of the split and of training.
        measure: also time batch-1 latency and cold start (printed, not written).

    Returns:
        sha256 digests by file name.

    Raises:
        RuntimeError: a check failed (sklearn/onnxruntime mismatch, int8 parity too poor).
    """
    x_train, x_test, y_train, y_test = load_data(seed)
    clf = train(x_train, y_train, seed)
    acc_sklearn = float(clf.score(x_test, y_test))
    proba_sklearn = np.asarray(clf.predict_proba(x_test), dtype=np.float32)

    names = [FP32_NAME, INT8_NAME, INPUTS_NAME, LABELS_NAME]
    out.mkdir(parents=True, exist_ok=True)
    # Stage everything next to ``out`` and check it there, so a failed check leaves the
    # committed assets untouched; then move each checked file into place with os.replace.
    with tempfile.TemporaryDirectory(dir=out, prefix=".staging-") as tmp:
        stage = Path(tmp)
        _write_atomic(stage / FP32_NAME, mlp_to_onnx(clf).SerializeToString())
        quantize(stage / FP32_NAME, stage / INT8_NAME)
        x_bytes = _npy_bytes(np.ascontiguousarray(x_test, dtype=np.float32))
        _write_atomic(stage / INPUTS_NAME, x_bytes)
        _write_atomic(stage / LABELS_NAME, _npy_bytes(np.ascontiguousarray(y_test, dtype=np.int64)))

        p32 = predict(stage / FP32_NAME, x_test)
        p8 = predict(stage / INT8_NAME, x_test)
        sk_diff = float(np.abs(p32 - proba_sklearn).max())
        if sk_diff > SKLEARN_PARITY_MAX:
            raise RuntimeError(
                f"onnxruntime fp32 differs from sklearn predict_proba by {sk_diff:.3g} "
                f"(> {SKLEARN_PARITY_MAX:g}): the hand-written graph does not match the MLP"
            )
        par = parity(p32, p8)
        if par.top1_agreement < INT8_TOP1_MIN or par.max_abs >= INT8_MAX_ABS_MAX:
            raise RuntimeError(
                f"int8 parity too poor for the demo: {par}; expected top-1 agreement >= "
                f"{INT8_TOP1_MIN} and max abs < {INT8_MAX_ABS_MAX}"
            )
        acc32 = float(np.mean(p32.argmax(axis=1) == y_test))
        acc8 = float(np.mean(p8.argmax(axis=1) == y_test))

        digests = {n: _sha256(stage / n) for n in names}
        sizes = {n: (stage / n).stat().st_size for n in names}
        readme = _readme(
            seed, acc_sklearn, acc32, acc8, par, len(x_train), len(x_test), digests, sizes
        )
        _write_atomic(stage / README_NAME, readme.encode())
        for n in [*names, README_NAME]:
            os.replace(stage / n, out / n)
    fp32_path, int8_path = out / FP32_NAME, out / INT8_NAME

    print(f"wrote {out}")
    for n in names:
        print(f"  {n:24s} {sizes[n]:>9,} bytes  {digests[n]}")
    print(f"train/test: {len(x_train)}/{len(x_test)} images")
    print(f"test accuracy: sklearn {acc_sklearn:.4f}, fp32 onnx {acc32:.4f}, int8 onnx {acc8:.4f}")
    print(f"fp32 onnx vs sklearn predict_proba: max abs {sk_diff:.3g}")
    print(
        f"int8 vs fp32: top-1 agreement {par.top1_agreement:.4f}, "
        f"max abs {par.max_abs:.4f}, mean abs {par.mean_abs:.6f}"
    )
    if measure:
        print(
            "batch-1 latency, onnxruntime CPU, 1 intra-op thread, median of 3000 runs after 200 warm-up:"
        )
        for path in (fp32_path, int8_path):
            print(f"  {path.name:24s} {batch1_latency_us(path, x_test):8.1f} us")
        print("cold start in a fresh interpreter (ms):")
        for what, ms in cold_start_ms([fp32_path, int8_path]).items():
            print(f"  {what:24s} {ms:8.1f}")
    return digests


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``build_demo_assets.py [--out DIR] [--seed N] [--no-measure]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    parser.add_argument("--seed", type=int, default=SEED, help="split and training seed")
    parser.add_argument(
        "--no-measure", action="store_true", help="skip the latency and cold-start timing"
    )
    args = parser.parse_args(argv)
    build(args.out, seed=args.seed, measure=not args.no_measure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
