"""Benchmark: int8 numerics per CPU, measured on emulated CPUs (docs/platforms.md's figures).

qualify computes a class's parity on an emulated CPU of its ISA (``qualify run --emulate``):
onnxruntime under QEMU user mode picks that CPU's kernels. This runs qualify's own parity pass
(the worker in ``parity`` mode, under each CPU of ``schemas.emulation.CPU_MODELS`` and natively)
on the demo's fp32 MLP and four dynamic int8 variants of it, on the demo's first 64 recorded rows one
row at a time (as a run does), and prints the largest |int8 - fp32| of each, with the seconds
each CPU's passes took (two at a time). Needs ``qemu-user-static``, and for the ARM columns a runtime from
``qualify emulators prepare --arch aarch64`` (a column without its pieces says so).

Usage::

    .venv/bin/python bench/emulated_numerics.py
"""

from __future__ import annotations

import hashlib
import platform
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from qualify.demo.assets import asset_path  # noqa: E402
from qualify.measure.emulators import Emulators, plan_numerics  # noqa: E402
from qualify.measure.fingerprint import take_fingerprint  # noqa: E402
from qualify.measure.job import job_for  # noqa: E402
from qualify.measure.parity import compare_outputs  # noqa: E402
from qualify.measure.runner import Launch, probe_runtime, run_worker  # noqa: E402
from qualify.measure.sysroot import user_emulator_dir  # noqa: E402
from schemas.emulation import CPU_MODELS  # noqa: E402
from schemas.project import (  # noqa: E402
    DEFAULT_TOLERANCES,
    Budgets,
    Emulation,
    HostClass,
    HostClassKey,
    InputSpec,
    MatchRules,
    ProviderSpec,
    Workload,
)

ROWS = 64


def _variants(folder: Path) -> dict[str, Path]:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    fp32 = asset_path("digits-mlp-fp32.onnx")
    made = {
        "the demo's int8: s8 weights in 7 bits, per channel": asset_path("digits-mlp-int8.onnx")
    }
    for label, kind, per_channel in (
        ("s8 weights in 8 bits, per channel", QuantType.QInt8, True),
        ("s8 weights in 8 bits, per tensor", QuantType.QInt8, False),
        ("u8 weights in 8 bits, per tensor", QuantType.QUInt8, False),
    ):
        out = folder / f"{kind.name}-{per_channel}.onnx"
        quantize_dynamic(fp32, out, weight_type=kind, per_channel=per_channel, reduce_range=False)
        made[label] = out
    return {"fp32": fp32, **made}


def _outputs(
    model: Path, klass: HostClass, launch: Launch | None, work: Path
) -> dict[str, np.ndarray]:
    work.mkdir(parents=True)
    job = job_for(
        artifact_path=model,
        digest="sha256:" + hashlib.sha256(model.read_bytes()).hexdigest(),
        host_class=klass,
        workload=Workload(
            inputs={"pixels": InputSpec(shape=[1, 64], source="recorded", file="x.npy")},
            parity_samples=ROWS,
        ),
        root=work,
        inputs_path=work.parent / "inputs.npz",
        work=work,
        mode="parity",
    )
    outcome = run_worker(job, work, timeout_s=900, launch=launch)
    if outcome.error_code:
        raise RuntimeError(f"{outcome.error_code}: {outcome.error_message}")
    with np.load(work / "outputs.npz") as data:
        return dict(data)


def main() -> int:
    fp = take_fingerprint(probe_runtime)
    emulators = Emulators(runtime_dirs=(user_emulator_dir(),), force=True)
    columns: dict[str, HostClass | None] = {f"this host ({fp.cpu_model})": None}
    for name, model in CPU_MODELS.items():
        columns[name] = HostClass(
            key=HostClassKey(hardware=name, runtime="ort", provider="cpu"),
            match=MatchRules(arch=model.arch),
            provider=ProviderSpec(intra_op_threads=1),
            budgets=Budgets(p99_ms=1000),
            emulation=Emulation(cpu=name),  # type: ignore[arg-type]
        )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        rows = np.load(asset_path("digits_inputs.npy"))[:ROWS]
        np.savez(root / "inputs.npz", pixels=rows)
        models = _variants(root)
        table: dict[str, dict[str, str]] = {label: {} for label in models if label != "fp32"}
        spent: dict[str, str] = {}
        native = HostClass(
            key=HostClassKey(hardware="here", runtime="ort", provider="cpu"),
            provider=ProviderSpec(intra_op_threads=1),
            budgets=Budgets(p99_ms=1000),
        )
        for column, klass in columns.items():
            launch = None
            if klass is not None:
                plan = plan_numerics(fp, klass, column, True, emulators, root)
                if plan.launch is None:
                    for label in table:
                        table[label][column] = "—"
                    spent[column] = f"not run: {plan.note}"
                    continue
                launch = plan.launch
            started = time.monotonic()
            print(f"{column} ...", file=sys.stderr)
            folder = root / str(len(spent))
            with ThreadPoolExecutor(max_workers=2) as pool:  # two at a time, as a run does
                futures = [
                    pool.submit(_outputs, path, klass or native, launch, folder / str(k))
                    for k, path in enumerate(models.values())
                ]
                out = {label: f.result() for label, f in zip(models, futures, strict=True)}
            spent[column] = f"{time.monotonic() - started:.0f} s"
            for label in table:
                parity = compare_outputs(
                    out["fp32"],
                    out[label],
                    DEFAULT_TOLERANCES["int8"],
                    reference_digest="sha256:" + "0" * 64,
                )
                table[label][column] = f"{parity.outputs[0].max_abs:.6f}"
    print("## Int8 numerics per CPU (bench/emulated_numerics.py)\n")
    print(
        f"Largest |int8 - fp32| of the demo's MLP over its first {ROWS} recorded rows, one row "
        f"at a time, onnxruntime {fp.runtime.version} on {platform.machine()}; emulated CPUs "
        "under QEMU user mode (`qualify run --emulate`'s parity pass).\n"
    )
    print("| candidate | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for label, values in table.items():
        print(f"| {label} | " + " | ".join(values[c] for c in columns) + " |")
    print(
        f"| seconds for the {len(models)} passes | " + " | ".join(spent[c] for c in columns) + " |"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
