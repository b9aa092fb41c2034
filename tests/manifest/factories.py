"""An in-memory fleet for the manifest tests: real schema objects with scripted numbers.

``Fleet`` plays python-tuf's repository simulator here: it holds a project file, the cells and
run records a matrix would hand to ``manifest.policy.decide``, and scripts runs on classes with
exactly the measurements a test wants (``fleet.qualify("arm", fallback_nodes=3)``). No matrix, no
onnxruntime, no disk.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from manifest import policy
from manifest.build import build_manifest
from manifest.signing import load_private_key, sign_document
from schemas.base import Verdict
from schemas.cell import (
    Cell,
    LatencyResult,
    Numerics,
    OutputParity,
    ParityResult,
    Placement,
    RollbackCheck,
    RunRecord,
    Soak,
    SoakWindow,
)
from schemas.host import Fingerprint, RuntimeIdentity
from schemas.manifest import ArtifactRef, ClassDecision, Manifest
from schemas.project import HostClass, OutputTolerance, Project

__all__ = [
    "BASELINE",
    "CLOCK",
    "FINGERPRINT",
    "GOLDEN",
    "Fleet",
    "artifact_refs",
    "class_spec",
    "digest_of",
    "fixed_key",
    "make_project",
    "scenario",
    "signed_manifest",
    "tight_soak",
]

GOLDEN = Path(__file__).resolve().parent / "golden"
"""Golden files and the fixed test key (``test.key``/``test.pub``, for tests only)."""

CLOCK = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
"""The fixed clock of the manifest tests."""

BASELINE = "rec-fp32"


def digest_of(name: str) -> str:
    """A stable fake artifact digest for a label."""
    return "sha256:" + hashlib.sha256(name.encode()).hexdigest()


def class_spec(
    index: int,
    *,
    p99_ms: float = 80.0,
    peak_rss_mb: float | None = 512.0,
    cold_init_ms: float | None = 1500.0,
    expected: str = "CPUExecutionProvider",
    fallback_allowance: int = 0,
    version: str = "1.32.*",
    package: str = "onnxruntime",
    match: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The project-file mapping of one host class with a unique key."""
    return {
        "key": {"hardware": f"hw{index}", "runtime": "ort-r8", "provider": f"p{index}"},
        "match": dict(match or {"arch": f"arch{index}"}),
        "runtime": {"package": package, "version": version},
        "provider": {
            "execution_providers": [expected],
            "expected": expected,
            "fallback_allowance": fallback_allowance,
        },
        "budgets": {"p99_ms": p99_ms, "peak_rss_mb": peak_rss_mb, "cold_init_ms": cold_init_ms},
    }


def make_project(
    classes: Mapping[str, Mapping[str, Any]],
    *,
    candidates: tuple[str, ...] = ("rec-int8",),
    unknown_class: str = "hold",
    allow_emulated: bool | str = False,
) -> Project:
    """A project file with a baseline, the given candidates (int8) and classes."""
    return Project.model_validate(
        {
            "model": "ocr-rec",
            "artifacts": {
                "baseline": {"path": "models/rec-fp32.onnx", "name": BASELINE},
                "candidates": [
                    {"path": f"models/{c}.onnx", "name": c, "precision": "int8"} for c in candidates
                ],
            },
            "workload": {"inputs": {"x": {"shape": [1, 16], "source": "generated"}}},
            "policy": {"unknown_class": unknown_class, "allow_emulated": allow_emulated},
            "host_classes": dict(classes),
        }
    )


def artifact_refs(project: Project) -> dict[str, ArtifactRef]:
    """Where hosts fetch each artifact of the project (fake but stable URIs and lengths)."""
    labels = [project.artifacts.baseline.label, *(c.label for c in project.artifacts.candidates)]
    return {
        digest_of(label): ArtifactRef(
            name=label, uri=f"https://models.example/{label}.onnx", length=1000 + len(label)
        )
        for label in labels
    }


FINGERPRINT = Fingerprint(
    hostname="sim-01",
    arch="x86_64",
    cpu_model="Sim CPU",
    cpu_flags=["avx2"],
    cores=2,
    affinity=[0, 1],
    memory_mb=8192,
    os="Linux",
    python="3.11.7",
    runtime=RuntimeIdentity(
        package="onnxruntime",
        version="1.32.0",
        build_info=None,
        available_providers=["CPUExecutionProvider"],
    ),
)
"""The host every cell of these factories was measured on."""


def _latency(p99_ms: float, upper_ms: float | None, lower_ms: float | None) -> LatencyResult:
    return LatencyResult(
        batch_size=1,
        concurrency=1,
        samples=700,
        p50_ms=p99_ms * 0.6,
        p90_ms=p99_ms * 0.8,
        p99_ms=p99_ms,
        max_ms=p99_ms * 1.2,
        mean_ms=p99_ms * 0.6,
        p99_lower_ms=lower_ms,
        p99_upper_ms=upper_ms,
        confidence=0.99,
        decision="insufficient",  # the runner's word; the policy re-judges the bounds
        stopped="decided",
        duration_s=1.0,
        throughput_ips=100.0,
    )


def tight_soak(
    p99s_ms: list[float], *, tolerance: float, floor: float, drifted: bool | None
) -> Soak:
    """A soak at batch 1, concurrency 1 of one 12 s window per p99 in ``p99s_ms``, each with
    tight bounds (2% either side, 5,000 samples): a change between windows is resolved."""
    windows = [
        SoakWindow(
            start_s=12.0 * i,
            samples=5000,
            p50_ms=ms * 0.9,
            p99_ms=ms,
            p99_lower_ms=ms * 0.98,
            p99_upper_ms=ms * 1.02,
        )
        for i, ms in enumerate(p99s_ms)
    ]
    return Soak(
        batch_size=1,
        concurrency=1,
        seconds=12 * len(windows),
        tolerance=tolerance,
        floor=floor,
        windows=windows,
        drifted=drifted,
    )


@dataclass
class Fleet:
    """A project plus the cells and runs a matrix would hold for it."""

    project: Project
    cells: list[Cell] = field(default_factory=list)
    runs: dict[str, RunRecord] = field(default_factory=dict)
    clock: datetime = CLOCK
    _counter: int = 0

    def qualify(
        self,
        class_name: str,
        *,
        candidate: str | None = "rec-int8",
        p99_ms: float = 40.0,
        p99_upper_ms: float | None = 42.0,
        p99_lower_ms: float | None = 38.0,
        parity_passed: bool = True,
        parity_reference: str | None = None,
        cosine_min: float = 0.999,
        fallback_nodes: int = 0,
        expected_nodes: int = 10,
        peak_rss_mb: float | None = 200.0,
        cold_init_ms: float | None = 300.0,
        verdict: Verdict = "pass",
        baseline_verdict: Verdict = "pass",
        emulated: bool = False,
        rollback_loaded: bool | None = True,
        rollback_digest: str | None = None,
        settings_digest: str | None = None,
        key_of: str | None = None,
        numerics: Numerics | None = None,
    ) -> str:
        """Script one run on a class: a baseline cell and optionally one candidate cell.

        Every keyword is one measurement or fact, defaulting to a run that passes every gate.
        ``key_of`` measures on another class's key (a cell the class must ignore);
        ``rollback_loaded=None`` records no rollback check.

        Returns:
            The run id.
        """
        self._counter += 1
        run_id = f"run-{self._counter:04d}"
        cls = self.project.host_classes[class_name]
        keyed = self.project.host_classes[key_of] if key_of else cls
        settings = settings_digest or cls.settings_digest()
        when = self.clock + timedelta(minutes=self._counter)
        baseline_digest = digest_of(BASELINE)
        self.runs[run_id] = RunRecord(
            run_id=run_id,
            host_class=class_name,
            key=keyed.key,
            model=self.project.model,
            started_at=when - timedelta(seconds=30),
            finished_at=when,
            emulated=emulated,
            settings_digest=settings,
            fingerprint=FINGERPRINT,
            load_avg_before=[0.1, 0.1, 0.1],
            load_avg_after=[0.2, 0.1, 0.1],
            rollback=None
            if rollback_loaded is None
            else RollbackCheck(
                artifact_digest=rollback_digest or baseline_digest,
                loaded=rollback_loaded,
                error=None if rollback_loaded else "load_failed: invalid protobuf",
            ),
        )
        common: dict[str, Any] = {
            "run_id": run_id,
            "host_class": class_name,
            "key": keyed.key,
            "emulated": emulated,
            "measured_at": when,
            "settings_digest": settings,
            "runtime_version": "1.32.0",
            "warm_init_ms": 20.0,
            "numerics": numerics,
        }
        base_ok = baseline_verdict != "error"
        self.cells.append(
            Cell(
                **common,
                artifact_digest=baseline_digest,
                artifact_name=BASELINE,
                role="baseline",
                precision="fp32",
                verdict=baseline_verdict,
                cold_init_ms=250.0 if base_ok else None,
                peak_rss_mb=180.0 if base_ok else None,
                placement=self._placement(cls, 0, expected_nodes) if base_ok else None,
                latency=[_latency(60.0, 63.0, 57.0)] if base_ok else [],
                parity=None,
                error=None if base_ok else "load_failed: unsupported opset",
            )
        )
        if candidate is not None:
            self.cells.append(
                Cell(
                    **common,
                    artifact_digest=digest_of(candidate),
                    artifact_name=candidate,
                    role="candidate",
                    precision="int8",
                    verdict=verdict,
                    cold_init_ms=cold_init_ms,
                    peak_rss_mb=peak_rss_mb,
                    placement=self._placement(cls, fallback_nodes, expected_nodes),
                    latency=[_latency(p99_ms, p99_upper_ms, p99_lower_ms)],
                    parity=self._parity(parity_passed, parity_reference, cosine_min),
                    # A cell the runner calls an error is one whose process ended without a
                    # result: it says why (`Cell.error`), whatever its other fields hold.
                    error="crashed: scripted" if verdict == "error" else None,
                )
            )
        return run_id

    @staticmethod
    def _placement(cls: HostClass, fallback: int, expected_nodes: int) -> Placement:
        nodes = {cls.provider.expected: expected_nodes}
        if fallback:
            nodes = {
                **({cls.provider.expected: expected_nodes} if expected_nodes else {}),
                "CPUExecutionProvider"
                if cls.provider.expected != "CPUExecutionProvider"
                else "AzureExecutionProvider": fallback,
            }
        elif not expected_nodes:
            nodes = {}
        return Placement(
            nodes_per_provider=nodes,
            total_nodes=sum(nodes.values()),
            expected_provider=cls.provider.expected,
            fallback_nodes=fallback,
            session_providers=list(cls.provider.execution_providers),
        )

    @staticmethod
    def _parity(passed: bool, reference: str | None, cosine_min: float) -> ParityResult:
        tol = OutputTolerance(max_abs=0.05, cosine_min=0.99)
        return ParityResult(
            reference_digest=reference or digest_of(BASELINE),
            samples=256,
            passed=passed,
            outputs=[
                OutputParity(
                    name="y",
                    max_abs=0.01 if passed else 0.5,
                    mean_abs=0.001,
                    max_rel=0.02,
                    cosine_min=cosine_min if passed else 0.9,
                    top1_agreement=1.0 if passed else 0.8,
                    tolerance=tol,
                    passed=passed,
                    failures=[] if passed else ["max_abs 0.5 > 0.05"],
                    min_passing=OutputTolerance(max_abs=0.01, cosine_min=cosine_min),
                )
            ],
        )

    def decide(self, *, previous: Manifest | None = None) -> dict[str, ClassDecision]:
        """The policy's decisions, by class name."""
        digests = {label: digest_of(label) for label in self._labels()}
        found = policy.decide(
            self.project, self.cells, self.runs, previous=previous, digests=digests
        )
        return {d.host_class: d for d in found}

    def _labels(self) -> list[str]:
        arts = self.project.artifacts
        return [arts.baseline.label, *(c.label for c in arts.candidates)]


def fixed_key() -> Ed25519PrivateKey:
    """The fixed test signing key committed beside the golden files."""
    return load_private_key(GOLDEN / "test.key")


def scenario() -> Fleet:
    """Four classes, one per kind of decision: candidate, baseline (CPU fallback), held because
    the baseline cannot run there, held because nothing was measured."""
    x86 = {"arch": "x86_64", "cpu_flags": ["avx512_vnni"]}
    gpu = {"arch": "x86_64", "accelerator": "CUDAExecutionProvider"}
    fleet = Fleet(
        make_project(
            {
                "x86-vnni": class_spec(1, match=x86),
                "gpu-a10": class_spec(
                    2, expected="CUDAExecutionProvider", package="onnxruntime-gpu", match=gpu
                ),
                "arm-old": class_spec(3, match={"arch": "aarch64"}),
                "arm-new": class_spec(4, match={"arch": "aarch64", "cpu_flags": ["sve2"]}),
            }
        )
    )
    fleet.qualify("x86-vnni")
    fleet.qualify("gpu-a10", fallback_nodes=7, expected_nodes=3)
    fleet.qualify("arm-old", baseline_verdict="error", parity_passed=False, verdict="fail")
    return fleet


def signed_manifest(
    fleet: Fleet,
    key: Ed25519PrivateKey,
    *,
    version: int = 1,
    created: datetime = CLOCK,
    expires: datetime | None = None,
    release: str = "2025.06",
    previous: Manifest | None = None,
) -> dict[str, Any]:
    """Decide, build and sign a manifest of the fleet."""
    signed = build_manifest(
        fleet.project,
        list(fleet.decide(previous=previous).values()),
        release=release,
        version=version,
        created=created,
        expires=expires or created + timedelta(days=30),
        snapshot=f"snapshot-{version:04d}",
        artifacts=artifact_refs(fleet.project),
        previous=previous,
    )
    return sign_document(signed, key)
