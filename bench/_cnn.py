"""A small image CNN for the latency benchmarks: fp32 and a static int8 (QDQ) quantization.

Owns building two ONNX files from code, deterministically, with nothing downloaded: a
three-stage convolutional classifier on 3x64x64 images (Conv 3x3 + ReLU with 32, 64 and 128
channels, the last two with stride 2, global average pooling, a 10-way Gemm), He-initialised
from a fixed seed, and its int8 twin made by onnxruntime's ``quantize_static`` (QDQ format,
per-channel int8 weights, uint8 activations calibrated on 16 seeded images).

Why it exists: the demo's digits MLP runs in about 20 us, where a fixed few microseconds of a
measuring tool's own per-query work is a large share of what is measured. This model does the
work of a small served vision model (about 0.8 ms fp32 and 0.45 ms int8 per image on one AMD
EPYC core), which is the regime qualify's latency numbers are for. The weights are random: the
benchmark times inference, it does not judge accuracy. IR version 8 and opset 17 are stamped
explicitly so older onnxruntime builds load the files too.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["CHANNELS", "IMAGE", "INPUT_NAME", "IR_VERSION", "OPSET", "SEED", "build"]

INPUT_NAME = "image"
IMAGE = (3, 64, 64)
"""Channels, height, width of one image."""
CHANNELS = (32, 64, 128)
"""Output channels of the three convolutions."""
CLASSES = 10
SEED = 0
IR_VERSION = 8
OPSET = 17
CALIBRATION_IMAGES = 16


def _graph(rng: np.random.Generator) -> onnx.ModelProto:
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    prev, c_in = INPUT_NAME, IMAGE[0]
    for i, c_out in enumerate(CHANNELS):
        fan_in = c_in * 9
        w = (rng.standard_normal((c_out, c_in, 3, 3)) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        inits += [
            numpy_helper.from_array(w, f"conv{i}.weight"),
            numpy_helper.from_array(np.zeros(c_out, np.float32), f"conv{i}.bias"),
        ]
        stride = 1 if i == 0 else 2
        nodes += [
            helper.make_node(
                "Conv",
                [prev, f"conv{i}.weight", f"conv{i}.bias"],
                [f"conv{i}"],
                kernel_shape=[3, 3],
                pads=[1, 1, 1, 1],
                strides=[stride, stride],
            ),
            helper.make_node("Relu", [f"conv{i}"], [f"relu{i}"]),
        ]
        prev, c_in = f"relu{i}", c_out
    w_fc = (rng.standard_normal((c_in, CLASSES)) * np.sqrt(1.0 / c_in)).astype(np.float32)
    inits += [
        numpy_helper.from_array(w_fc, "fc.weight"),
        numpy_helper.from_array(np.zeros(CLASSES, np.float32), "fc.bias"),
    ]
    nodes += [
        helper.make_node("GlobalAveragePool", [prev], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["flat"]),
        helper.make_node("Gemm", ["flat", "fc.weight", "fc.bias"], ["scores"]),
    ]
    graph = helper.make_graph(
        nodes,
        "bench-cnn",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", *IMAGE])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", CLASSES])],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="qualify-bench"
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def build(directory: Path) -> tuple[Path, Path]:
    """Write ``bench-cnn-fp32.onnx`` and ``bench-cnn-int8.onnx`` into ``directory``.

    Returns:
        The fp32 and int8 paths. Building twice gives byte-identical files.
    """
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    fp32 = directory / "bench-cnn-fp32.onnx"
    int8 = directory / "bench-cnn-int8.onnx"
    onnx.save(_graph(rng), fp32)

    images = [rng.random((1, *IMAGE), dtype=np.float32) for _ in range(CALIBRATION_IMAGES)]

    class Images(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self._it = iter(images)

        def get_next(self) -> dict[str, np.ndarray] | None:
            image = next(self._it, None)
            return None if image is None else {INPUT_NAME: image}

    # quantize_static warns that a pre-processing pass could help; this graph is already plain.
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        quantize_static(
            fp32,
            int8,
            Images(),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
        )
    finally:
        root.setLevel(level)
    quantized = onnx.load(int8)
    quantized.ir_version = IR_VERSION
    onnx.save(quantized, int8)
    return fp32, int8
