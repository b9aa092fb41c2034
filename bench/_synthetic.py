"""Scripted qualification evidence for the benchmarks: a run and its two cells, no models run.

Shared by ``bench/resolve.py`` (fleets of up to 100,000 classes) and ``bench/telemetry.py``
(eight classes). Every number here is a fixed input to the code under measurement, never a
reported measurement. Not a benchmark itself (``run_all`` skips ``_`` modules).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from schemas.cell import (
    Cell,
    LatencyResult,
    OutputParity,
    ParityResult,
    Placement,
    RollbackCheck,
    RunRecord,
)
from schemas.host import Fingerprint, RuntimeIdentity
from schemas.project import HostClass, OutputTolerance, Project

__all__ = ["BASE", "CAND", "isa_flags", "project_of", "scripted_run"]

BASE = "sha256:" + "b" * 64
CAND = "sha256:" + "c" * 64

_FINGERPRINT = Fingerprint(
    hostname="bench",
    arch="x86_64",
    cpu_model=None,
    cpu_flags=[],
    cores=2,
    affinity=[0, 1],
    memory_mb=None,
    os="Linux",
    python="3.11",
    runtime=RuntimeIdentity(
        package="onnxruntime", version="1.32.0", build_info=None, available_providers=[]
    ),
)
_TOLERANCE = OutputTolerance(max_abs=0.05, cosine_min=0.99)


def isa_flags() -> str:
    """Which of ``avx512_vnni`` and ``avx2`` this CPU has (``grep -o 'avx512_vnni\\|avx2'
    /proc/cpuinfo | sort -u``), for the machine line of a benchmark."""
    try:
        words = set(Path("/proc/cpuinfo").read_text(encoding="utf-8").split())
    except OSError:
        return "ISA unknown"
    return (
        ", ".join(f for f in ("avx2", "avx512_vnni") if f in words)
        or "neither avx2 nor avx512_vnni"
    )


def project_of(classes: dict[str, Any]) -> Project:
    """A project with the rec-fp32 baseline, one rec-int8 candidate and ``classes``."""
    return Project.model_validate(
        {
            "model": "ocr-rec",
            "artifacts": {
                "baseline": {"path": "rec-fp32.onnx", "name": "rec-fp32"},
                "candidates": [{"path": "rec-int8.onnx", "name": "rec-int8", "precision": "int8"}],
            },
            "workload": {"inputs": {"x": {"shape": [1, 16], "source": "generated"}}},
            "host_classes": classes,
        }
    )


def scripted_run(
    name: str,
    cls: HostClass,
    *,
    run_id: str,
    when: datetime,
    upper_ms: float = 41.0,
    fallback: int = 0,
) -> tuple[RunRecord, list[Cell]]:
    """One passing run of the baseline and the int8 candidate on ``cls``.

    Args:
        upper_ms: the p99 upper bound both cells carry (over the class budget makes it fail).
        fallback: nodes (of 20) placed off the CPU provider.
    """
    settings = cls.settings_digest()
    run = RunRecord(
        run_id=run_id,
        host_class=name,
        key=cls.key,
        model="ocr-rec",
        started_at=when,
        finished_at=when,
        emulated=False,
        settings_digest=settings,
        fingerprint=_FINGERPRINT,
        load_avg_before=[0.0, 0.0, 0.0],
        load_avg_after=[0.0, 0.0, 0.0],
        rollback=RollbackCheck(artifact_digest=BASE, loaded=True),
    )
    cells = []
    for digest, role in ((BASE, "baseline"), (CAND, "candidate")):
        cells.append(
            Cell(
                run_id=run_id,
                host_class=name,
                key=cls.key,
                artifact_digest=digest,
                artifact_name="rec-fp32" if role == "baseline" else "rec-int8",
                role=role,  # type: ignore[arg-type]
                precision="fp32" if role == "baseline" else "int8",
                verdict="pass",
                emulated=False,
                measured_at=when,
                settings_digest=settings,
                runtime_version="1.32.0",
                cold_init_ms=300.0,
                warm_init_ms=20.0,
                peak_rss_mb=200.0,
                placement=Placement(
                    nodes_per_provider={"CPUExecutionProvider": 20 - fallback}
                    | ({"AzureExecutionProvider": fallback} if fallback else {}),
                    total_nodes=20,
                    expected_provider="CPUExecutionProvider",
                    fallback_nodes=fallback,
                    session_providers=["CPUExecutionProvider"],
                ),
                latency=[
                    LatencyResult(
                        batch_size=1,
                        concurrency=1,
                        samples=700,
                        p50_ms=20.0,
                        p90_ms=30.0,
                        p99_ms=upper_ms - 2,
                        max_ms=upper_ms + 5,
                        mean_ms=21.0,
                        p99_lower_ms=upper_ms - 4,
                        p99_upper_ms=upper_ms,
                        confidence=0.99,
                        decision="pass",
                        stopped="decided",
                        duration_s=1.0,
                        throughput_ips=50.0,
                    )
                ],
                parity=None
                if role == "baseline"
                else ParityResult(
                    reference_digest=BASE,
                    samples=256,
                    passed=True,
                    outputs=[
                        OutputParity(
                            name="y",
                            max_abs=0.01,
                            mean_abs=0.001,
                            max_rel=0.01,
                            cosine_min=0.9995,
                            top1_agreement=1.0,
                            tolerance=_TOLERANCE,
                            passed=True,
                            min_passing=_TOLERANCE,
                        )
                    ],
                ),
            )
        )
    return run, cells
