"""Numerics of CPUs this machine is not, measured for real: onnxruntime under QEMU user mode
with the class's CPU model picks that CPU's kernels, so the numbers do not depend on the host
and are asserted exactly (``make test`` gives the same on an AVX2-only and an AVX-512 machine).

The pair: the demo's fp32 MLP and a dynamic int8 of it with full-range signed 8-bit weights,
whose pairs of u8 x s8 products saturate the int16 sums of onnxruntime's AVX2 kernel
(``quantize_dynamic(..., QInt8, reduce_range=False)``); SSE4.2 kernels do not saturate, nor do
AVX-512 VNNI's or ARM's dot products. The figures are those of onnxruntime 1.32.0 (another
version may quantize or compute otherwise: the test then says so and holds the relations).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from qualify.demo.assets import asset_path
from qualify.measure.emulators import Emulators
from qualify.project.load import load_project
from qualify.run import RunOptions, qualify_run
from schemas.cell import Cell
from tests.conftest import PREPARED_EMULATORS, need_emulator

pytestmark = pytest.mark.slow

MEASURED_WITH = "1.32.0"
FULL_RANGE_MAX_ABS = {"Haswell": 0.0038993507623672485, "Nehalem": 0.010796219110488892}
"""Largest |int8 - fp32| over the 64 rows, onnxruntime 1.32.0, per emulated CPU."""
DEMO_ON_N1_MAX_ABS = 0.030591189861297607
"""The demo's own int8 (7-bit weights) against its fp32 on an emulated Neoverse-N1, 64 rows."""


def _project(tmp_path: Path, candidate: Path, classes: str) -> Path:
    models = tmp_path / "models"
    models.mkdir(exist_ok=True)
    shutil.copyfile(asset_path("digits-mlp-fp32.onnx"), models / "fp32.onnx")
    shutil.copyfile(candidate, models / "int8.onnx")
    (tmp_path / "data").mkdir(exist_ok=True)
    np.save(tmp_path / "data" / "x.npy", np.load(asset_path("digits_inputs.npy"))[:64])
    path = tmp_path / "qualify.yaml"
    path.write_text(
        "model: digits\n"
        "artifacts:\n"
        "  baseline: {path: models/fp32.onnx, precision: fp32}\n"
        "  candidates: [{path: models/int8.onnx, precision: int8}]\n"
        "workload:\n"
        "  inputs: {pixels: {shape: [1, 64], source: recorded, file: data/x.npy}}\n"
        "  concurrency: [1]\n"
        "  parity_samples: 64\n"
        "  time_cap_s: 1\n"
        "  throughput_s: 0.1\n"
        "  warmup: 5\n"
        "host_classes:\n" + classes
    )
    return path


_CLASS = """  {name}:
    key: {{hardware: {name}, runtime: ort, provider: cpu}}
    match: {match}
    provider: {{execution_providers: [CPUExecutionProvider], intra_op_threads: 1}}
    budgets: {{p99_ms: 1000, max_slowdown: 100}}
"""


def _full_range_int8(tmp_path: Path) -> Path:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out = tmp_path / "full-range-int8.onnx"
    quantize_dynamic(
        asset_path("digits-mlp-fp32.onnx"), out, weight_type=QuantType.QInt8, reduce_range=False
    )
    return out


def _candidate(cells: list[Cell]) -> tuple[Cell, float]:
    base, cand = cells
    assert base.verdict != "error" and cand.verdict != "error", (base.error, cand.error)
    assert cand.parity is not None, cand.reasons
    (out,) = cand.parity.outputs
    assert out.max_abs is not None
    return cand, out.max_abs


def _need_qemu(arch: str) -> None:
    if shutil.which(f"qemu-{arch}-static") is None:
        need_emulator(f"qemu-{arch}-static is not installed (apt-get install qemu-user-static)")


def test_full_range_int8_saturates_on_haswell_and_not_on_nehalem_whatever_the_host(
    tmp_path: Path,
) -> None:
    _need_qemu("x86_64")
    classes = _CLASS.format(name="v3", match="{arch: x86_64, cpu_flags: [avx2, fma]}")
    classes += _CLASS.format(name="v2", match="{arch: x86_64, cpu_flags: [sse4_2]}")
    loaded = load_project(_project(tmp_path, _full_range_int8(tmp_path), classes))
    found: dict[str, float] = {}
    for name, cpu in (("v3", "Haswell"), ("v2", "Nehalem")):
        outcome = qualify_run(
            loaded,
            name,
            RunOptions(
                db_path=tmp_path / "m.duckdb",
                emulate=True,
                measure_alone=False,
                # Under QEMU even on a host that presents exactly Haswell's kernel flags (a run
                # computes the class's numbers natively there): the figures are QEMU's CPU's.
                emulators=Emulators(force=True),
            ),
        )
        cand, found[cpu] = _candidate(outcome.bundle.cells)
        assert cand.numerics is not None
        assert (cand.numerics.source, cand.numerics.cpu) == ("emulated", cpu)
    here = cand.numerics.native_max_abs
    print(f"full-range int8 max abs: {found}, this host {here}")
    assert found["Haswell"] != found["Nehalem"]  # the ISA, not the host, decides the numbers
    if cand.numerics.runtime_version == MEASURED_WITH:
        assert found == FULL_RANGE_MAX_ABS


def test_the_demo_model_on_an_emulated_neoverse_n1_has_arm_numerics(tmp_path: Path) -> None:
    _need_qemu("aarch64")
    emulators = Emulators(runtime_dirs=(PREPARED_EMULATORS,))
    classes = _CLASS.format(name="arm", match="{arch: aarch64, cpu_flags: [asimddp]}")
    loaded = load_project(_project(tmp_path, asset_path("digits-mlp-int8.onnx"), classes))
    outcome = qualify_run(
        loaded,
        "arm",
        RunOptions(
            db_path=tmp_path / "m.duckdb", emulate=True, measure_alone=False, emulators=emulators
        ),
    )
    cand, max_abs = _candidate(outcome.bundle.cells)
    numerics = cand.numerics
    assert numerics is not None
    if numerics.source != "emulated":
        need_emulator(f"no aarch64 runtime in {PREPARED_EMULATORS}: {numerics.note}")
    assert (numerics.cpu, numerics.arch) == ("neoverse-n1", "aarch64")
    assert cand.isa_mismatch == [] and cand.emulated
    assert numerics.native_max_abs is not None  # this host's own figure, beside
    print(f"demo int8 on neoverse-n1: {max_abs!r}, here {numerics.native_max_abs}")
    if numerics.runtime_version == MEASURED_WITH:
        assert max_abs == DEMO_ON_N1_MAX_ABS
