"""A small real project for end-to-end tests: tiny models from the registry, three classes.

``here-cpu`` matches this machine, ``lost-gpu`` asks for CUDA (absent here, so onnxruntime falls
back to the CPU) and ``elsewhere`` needs an ARM host.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.models import build

CLASSES = """
host_classes:
  here-cpu:
    key: {hardware: here, runtime: ort-any, provider: cpu}
    match: {arch: %(arch)s}
    provider: {execution_providers: [CPUExecutionProvider], intra_op_threads: 1}
    budgets: {p99_ms: 50, timeout_s: %(timeout)s, memory_limit_mb: 3072, peak_rss_mb: 1024}
  lost-gpu:
    key: {hardware: here, runtime: ort-any, provider: cuda}
    provider:
      execution_providers: [CUDAExecutionProvider, CPUExecutionProvider]
      expected: CUDAExecutionProvider
    budgets: {p99_ms: 50, timeout_s: %(timeout)s}
  elsewhere:
    key: {hardware: arm, runtime: ort-any, provider: cpu}
    match: {arch: aarch64, cpu_flags: [asimddp]}
    budgets: {p99_ms: 50}
"""


def write_project(tmp: Path, candidates: list[str], timeout: float = 60) -> Path:
    models = tmp / "models"
    build("identity_mlp", models)
    for name in candidates:
        build(name, models)
    cands = (
        "\n".join(f"    - {{path: models/{name}.onnx, precision: int8}}" for name in candidates)
        or "    []"
    )
    text = (
        textwrap.dedent(
            """\
        model: tiny
        artifacts:
          baseline: {path: models/identity_mlp.onnx}
          candidates:
        %s
        workload:
          inputs: {x: {shape: [1, 16], source: generated, seed: 7}}
          concurrency: [1, 2]
          parity_samples: 32
          time_cap_s: 3
          throughput_s: 0.2
          warmup: 10
        """
        )
        % cands
    )
    text += CLASSES % {"arch": platform.machine(), "timeout": timeout}
    path = tmp / "qualify.yaml"
    path.write_text(text)
    return path


ROOT = Path(__file__).resolve().parents[2]


LOOSE_SLOWDOWN = 10.0
"""``max_slowdown`` for tests that are not about the interleaved A/B: a twin of the baseline
(same graph, other bytes) measured p50 x2.68 the baseline's, lower bound x2.61, at concurrency 2
beside two CPU hogs (as under ``make test``'s workers), which fails the 1.5 these tests had."""


def loosen_slowdown(project: Path) -> None:
    """Give the project's first class `LOOSE_SLOWDOWN`: the slowdown gate is not what the test
    is about, and a noisy machine can make a twin lose the A/B."""
    text = project.read_text()
    loosened = text.replace(
        "budgets: {p99_ms: 50, ", f"budgets: {{p99_ms: 50, max_slowdown: {LOOSE_SLOWDOWN}, ", 1
    )
    assert loosened != text, "the project has no 'budgets: {p99_ms: 50, ' to loosen"
    project.write_text(loosened)


def run_qualify(
    *args: str, cwd: Path, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m qualify ARGS`` in a real subprocess, as a user's shell would run it (in
    ``env``, default this process's environment)."""
    env = dict(os.environ if env is None else env, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "qualify", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=timeout,
        check=False,
    )
