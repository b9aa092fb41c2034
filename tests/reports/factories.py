"""Scripted fleets for the report tests and the report benchmark: real schema objects, synthetic
but honest numbers.

Every latency cell is computed from its own seeded synthetic samples with ``qualify.measure.stats`` (the
same percentiles and order-statistic bounds the runner uses), so a chart drawn from the samples
and the table's numbers agree. No matrix, no onnxruntime, no disk, no clock.

``scripted_fleet()`` is the golden report's fleet: classes that pass, fail, fall back, are
emulated and stale, have no evidence, and one named ``<script>alert(1)</script>``.
``synthetic_fleet(n)`` is the benchmark's: n classes, two artifacts, ~1,000 samples per cell.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import numpy.typing as npt

from qualify.measure.stats import p99_bounds, percentiles
from schemas.base import Role, Verdict
from schemas.cell import (
    Cell,
    LatencyConfig,
    LatencyResult,
    OutputParity,
    ParityResult,
    Placement,
    Reason,
    RollbackCheck,
    RunRecord,
    Slowdown,
)
from schemas.host import Fingerprint, RuntimeIdentity
from schemas.lineage import Lineage
from schemas.manifest import (
    Evidence,
    ManifestArtifact,
    ManifestEntry,
    ManifestSigned,
    Rollback,
)
from schemas.output import ManifestVersion
from schemas.project import (
    Artifacts,
    ArtifactSpec,
    Budgets,
    HostClass,
    HostClassKey,
    InputSpec,
    MatchRules,
    OutputTolerance,
    Policy,
    Project,
    ProviderSpec,
    RuntimeSpec,
    Workload,
)
from schemas.tune import Trial, TuneRecord

__all__ = [
    "BASELINE",
    "CANDIDATE",
    "CLOCK",
    "HOSTILE",
    "VERSION",
    "Fleet",
    "digest_of",
    "scripted_fleet",
    "synthetic_fleet",
]

CLOCK = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
"""The fixed clock of the report tests."""
VERSION = "0.0.0-test"
"""The fixed tool version of the golden report."""
BASELINE = "rec-fp32"
CANDIDATE = "rec-int8"
HOSTILE = "<script>alert(1)</script>"
"""A class name that must render as text."""

Samples = dict[LatencyConfig, npt.NDArray[np.int64]]


def digest_of(name: str) -> str:
    """A stable fake artifact digest for a label."""
    return "sha256:" + hashlib.sha256(name.encode()).hexdigest()


_FINGERPRINT = Fingerprint(
    hostname="sim-01",
    arch="x86_64",
    cpu_model="Sim CPU @ 2.0GHz",
    cpu_flags=["avx2", "avx512_vnni", "avx512f", "fma", "sse4_2"],
    cores=2,
    affinity=[0, 1],
    memory_mb=8192,
    os="Linux 6.1.0",
    python="3.11.7",
    runtime=RuntimeIdentity(
        package="onnxruntime",
        version="1.32.0",
        build_info="ORT Build Info: git-branch=rel-1.32.0",
        available_providers=["CPUExecutionProvider"],
    ),
)


def _host_class(index: int, p99_ms: float, expected: str = "CPUExecutionProvider") -> HostClass:
    return HostClass(
        key=HostClassKey(hardware=f"hw{index}", runtime="ort-r8", provider=f"p{index}"),
        match=MatchRules(arch="x86_64", cpu_flags=["avx2", "avx512_vnni"]),
        runtime=RuntimeSpec(package="onnxruntime", version="1.32.*"),
        provider=ProviderSpec(
            execution_providers=[expected, "CPUExecutionProvider"]
            if expected != "CPUExecutionProvider"
            else [expected],
            expected=expected,
            intra_op_threads=2,
        ),
        budgets=Budgets(p99_ms=p99_ms, peak_rss_mb=512, cold_init_ms=1500),
    )


def _project(classes: Mapping[str, HostClass]) -> Project:
    """The project, validated; then given the classes as named, unvalidated: a project file
    refuses a name like `HOSTILE`, but the report also renders names read back from bundles
    and manifests, so its escaping is tested on one anyway."""
    placeholders = {f"c{i}": cls for i, cls in enumerate(classes.values())}
    return _validated(placeholders).model_copy(update={"host_classes": dict(classes)})


def _validated(classes: Mapping[str, HostClass]) -> Project:
    return Project(
        model="ocr-rec",
        artifacts=Artifacts(
            baseline=ArtifactSpec(path="models/rec-fp32.onnx", name=BASELINE),
            candidates=[
                ArtifactSpec(
                    path="models/rec-int8.onnx",
                    name=CANDIDATE,
                    precision="int8",
                    derived_from="baseline",
                    how="quantize_dynamic per-channel",
                )
            ],
        ),
        workload=Workload(
            inputs={"x": InputSpec(shape=[1, 16], source="generated")}, concurrency=[1, 2]
        ),
        policy=Policy(unknown_class="hold"),
        host_classes=dict(classes),
    )


def _latency(
    rng: np.random.Generator, p99_ms: float, budget_ms: float, n: int, concurrency: int
) -> tuple[LatencyResult, npt.NDArray[np.int64]]:
    sigma = 0.25
    median = p99_ms / float(np.exp(2.326 * sigma))
    ms = rng.lognormal(mean=float(np.log(median)), sigma=sigma, size=n)
    ns = np.round(ms * 1e6).astype(np.int64)
    exact = ns.astype(np.float64) / 1e6
    stats = percentiles(exact)
    lower, upper = p99_bounds(exact, confidence=0.99)
    if upper is not None and upper <= budget_ms:
        decision = "pass"
    elif lower is not None and lower > budget_ms:
        decision = "fail"
    else:
        decision = "insufficient"
    result = LatencyResult(
        batch_size=1,
        concurrency=concurrency,
        samples=n,
        p50_ms=stats.p50,
        p90_ms=stats.p90,
        p99_ms=stats.p99,
        max_ms=stats.max,
        mean_ms=round(stats.mean, 6),
        p99_lower_ms=lower,
        p99_upper_ms=upper,
        confidence=0.99,
        decision=decision,  # type: ignore[arg-type]
        stopped="decided" if decision != "insufficient" else "time_cap",
        duration_s=round(n * p99_ms / 1000.0, 3),
        throughput_ips=round(1000.0 / stats.mean * concurrency, 1),
    )
    return result, ns


def _parity(passed: bool) -> ParityResult:
    tol = OutputTolerance(max_abs=0.05, cosine_min=0.99, top1_agreement_min=0.98)
    max_abs = 0.012 if passed else 0.31
    cosine = 0.9991 if passed else 0.93
    top1 = 0.996 if passed else 0.91
    failures = (
        []
        if passed
        else [
            f"max_abs {max_abs} > 0.05",
            f"cosine_min {cosine} < 0.99",
            f"top1_agreement_min {top1} < 0.98",
        ]
    )
    return ParityResult(
        reference_digest=digest_of(BASELINE),
        samples=256,
        passed=passed,
        outputs=[
            OutputParity(
                name="logits",
                max_abs=max_abs,
                mean_abs=max_abs / 7,
                max_rel=max_abs * 3,
                cosine_min=cosine,
                top1_agreement=top1,
                tolerance=tol,
                passed=passed,
                failures=failures,
                min_passing=OutputTolerance(
                    max_abs=max_abs,
                    mean_abs=max_abs / 7,
                    max_rel=max_abs * 3,
                    cosine_min=cosine,
                    top1_agreement_min=top1,
                ),
            )
        ],
    )


@dataclass
class Fleet:
    """A project plus everything a matrix and a manifest would hand the report."""

    project: Project
    cells: list[Cell] = field(default_factory=list)
    runs: dict[str, RunRecord] = field(default_factory=dict)
    samples: dict[tuple[str, str], Samples] = field(default_factory=dict)
    entries: dict[str, ManifestEntry] = field(default_factory=dict)
    seed: int = 0
    _counter: int = 0

    def qualify(
        self,
        name: str,
        *,
        candidate_p99_ms: float | None,
        baseline_p99_ms: float = 10.0,
        samples: int = 1000,
        parity_passed: bool = True,
        fallback_nodes: int = 0,
        emulated: bool = False,
        stale: bool = False,
        rollback_loaded: bool | None = True,
        candidate_error: str | None = None,
    ) -> str:
        """Script one run of class ``name``: a baseline cell and a candidate cell.

        ``candidate_p99_ms=None`` with ``candidate_error`` records a candidate that could not
        run. Returns the run id.
        """
        self._counter += 1
        run_id = f"run-{self._counter:04d}"
        cls = self.project.host_classes[name]
        rng = np.random.default_rng(self.seed * 100_003 + self._counter)
        settings = "sha256:" + "0" * 64 if stale else cls.settings_digest()
        when = CLOCK - timedelta(hours=2) + timedelta(minutes=self._counter)
        budget = cls.budgets.p99_ms
        self.runs[run_id] = RunRecord(
            run_id=run_id,
            host_class=name,
            key=cls.key,
            model=self.project.model,
            started_at=when - timedelta(seconds=40),
            finished_at=when,
            emulated=emulated,
            mismatches=["cpu flag avx512_vnni missing"] if emulated else [],
            settings_digest=settings,
            fingerprint=_FINGERPRINT,
            load_avg_before=[0.12, 0.1, 0.05],
            load_avg_after=[0.9, 0.3, 0.1],
            rollback=None
            if rollback_loaded is None
            else RollbackCheck(
                artifact_digest=digest_of(BASELINE),
                loaded=rollback_loaded,
                error=None if rollback_loaded else "load_failed: unsupported opset 21",
            ),
        )
        expected = cls.provider.expected
        common: dict[str, Any] = {
            "run_id": run_id,
            "host_class": name,
            "key": cls.key,
            "emulated": emulated,
            "measured_at": when,
            "settings_digest": settings,
            "runtime_version": "1.32.0",
        }
        plan: tuple[tuple[Role, str, float | None], ...] = (
            ("baseline", BASELINE, baseline_p99_ms),
            ("candidate", CANDIDATE, candidate_p99_ms),
        )
        for role, label, p99 in plan:
            digest = digest_of(label)
            if p99 is None:
                self.cells.append(
                    Cell(
                        **common,
                        artifact_digest=digest,
                        artifact_name=label,
                        role=role,
                        precision="fp32" if role == "baseline" else "int8",
                        verdict="error",
                        reasons=[Reason(code="crashed", message=candidate_error or "crashed")],
                        cold_init_ms=None,
                        warm_init_ms=None,
                        peak_rss_mb=None,
                        placement=None,
                        latency=[],
                        parity=None,
                        error=candidate_error,
                    )
                )
                continue
            results = []
            by_config: Samples = {}
            for concurrency in (1, 2):
                scale = 1.0 if concurrency == 1 else 1.15
                result, ns = _latency(rng, p99 * scale, budget, samples, concurrency)
                results.append(result)
                by_config[LatencyConfig(1, concurrency)] = ns
            self.samples[(run_id, digest)] = by_config
            fb = fallback_nodes if role == "candidate" else 0
            placement = Placement(
                nodes_per_provider={expected: 24 - fb, "CPUExecutionProvider": fb}
                if fb
                else {expected: 24},
                total_nodes=24,
                expected_provider=expected,
                fallback_nodes=fb,
                session_providers=list(cls.provider.execution_providers),
                warnings=[f"{fb} nodes placed on CPUExecutionProvider"] if fb else [],
            )
            reasons: list[Reason] = []
            verdict: Verdict = "pass"
            gate = max(results, key=lambda r: r.p99_upper_ms or float("inf"))
            if gate.decision == "fail":
                verdict = "fail"
                reasons.append(
                    Reason(
                        code="p99_over_budget",
                        message=f"p99 lower bound {gate.p99_lower_ms:.2f} ms > budget {budget} ms",
                    )
                )
            elif gate.decision == "insufficient":
                verdict = "insufficient"
                reasons.append(
                    Reason(
                        code="p99_insufficient", message=f"{gate.samples} samples did not decide"
                    )
                )
            if fb:
                verdict = "fail"
                reasons.append(
                    Reason(code="provider_fallback", message=f"{fb} of 24 nodes ran off {expected}")
                )
            if role == "candidate" and not parity_passed:
                verdict = "fail"
                reasons.append(Reason(code="parity_failed", message="logits max_abs 0.31 > 0.05"))
            if emulated:
                reasons.append(Reason(code="emulated", message="host lacks avx512_vnni"))
            self.cells.append(
                Cell(
                    **common,
                    artifact_digest=digest,
                    artifact_name=label,
                    role=role,
                    precision="fp32" if role == "baseline" else "int8",
                    verdict=verdict,
                    reasons=reasons,
                    cold_init_ms=310.0 if role == "baseline" else 240.5,
                    warm_init_ms=21.0 if role == "baseline" else 15.25,
                    peak_rss_mb=182.0 if role == "baseline" else 141.0,
                    placement=placement,
                    latency=results,
                    parity=None if role == "baseline" else _parity(parity_passed),
                )
            )
        return run_id

    def decide(
        self, name: str, decision: str, summary: str, reasons: list[Reason], run_id: str | None
    ) -> None:
        """Script the manifest entry of class ``name`` (the report displays, never decides)."""
        cls = self.project.host_classes[name]
        label = {"candidate": CANDIDATE, "baseline": BASELINE}.get(decision)
        artifact = (
            None
            if label is None
            else ManifestArtifact(
                name=label,
                digest=digest_of(label),
                length=1000 + len(label),
                uri=f"https://models.example/{label}.onnx",
            )
        )
        evidence = None
        if run_id is not None:
            cell = next(c for c in self.cells if c.run_id == run_id and c.role == "candidate")
            gate = cell.gate_latency
            evidence = Evidence(
                run_id=run_id,
                artifact_digest=cell.artifact_digest,
                artifact_name=cell.artifact_name,
                role=cell.role,
                verdict=cell.verdict,
                measured_at=cell.measured_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                emulated=cell.emulated,
                p99_us=None if gate is None else round(gate.p99_ms * 1000),
                p99_upper_us=None
                if gate is None or gate.p99_upper_ms is None
                else round(gate.p99_upper_ms * 1000),
                p99_budget_us=round(cls.budgets.p99_ms * 1000),
                batch_size=None if gate is None else gate.batch_size,
                concurrency=None if gate is None else gate.concurrency,
                samples=None if gate is None else gate.samples,
                fallback_nodes=None if cell.placement is None else cell.placement.fallback_nodes,
                peak_rss_kb=None if cell.peak_rss_mb is None else round(cell.peak_rss_mb * 1024),
                cold_init_us=None if cell.cold_init_ms is None else round(cell.cold_init_ms * 1000),
                parity=None,
            )
        self.entries[name] = ManifestEntry(
            host_class=name,
            key=cls.key,
            match=cls.match,
            decision=decision,  # type: ignore[arg-type]
            artifact=artifact,
            runtime=cls.runtime,
            provider=cls.provider,
            rollback=Rollback(
                name=BASELINE,
                digest=digest_of(BASELINE),
                length=1000 + len(BASELINE),
                uri=f"https://models.example/{BASELINE}.onnx",
                proven_to_load=run_id is not None,
                runtime=cls.runtime,
                provider=cls.provider,
            ),
            evidence=evidence,
            reasons=reasons,
            summary=summary,
            run_ids=[] if run_id is None else [run_id],
        )

    def manifest(
        self, *, version: int = 2, release: str = "2025.06", snapshot: str | None = None
    ) -> ManifestSigned:
        """The signed part of a manifest holding the scripted entries."""
        return ManifestSigned(
            type="qualify-manifest",
            format="qualify-manifest/1",
            release=release,
            version=version,
            created=CLOCK.strftime("%Y-%m-%dT%H:%M:%SZ"),
            expires=(CLOCK + timedelta(days=30)).strftime("%Y-%m-%dT%H:%M:%SZ"),
            model=self.project.model,
            snapshot=snapshot or self.snapshot,
            policy=self.project.policy,
            entries=dict(self.entries),
        )

    @property
    def snapshot(self) -> str:
        """The snapshot id a matrix holding these runs would have (as ``Store.snapshot_id``)."""
        ids = "\n".join(sorted(self.runs))
        return "sha256:" + hashlib.sha256(ids.encode("utf-8")).hexdigest()


def scripted_fleet(seed: int = 7) -> tuple[Fleet, ManifestSigned, ManifestSigned]:
    """The golden report's fleet, with its current and previous manifests.

    Classes: ``arm-r5`` gets the candidate; ``x86-v4`` keeps the baseline (candidate p99 over
    budget); ``gpu-t4`` is held (candidate falls back to the CPU); the hostile-named class is
    emulated, stale and its candidate crashed; ``new-class`` has no measurement.
    """
    classes = {
        "arm-r5": _host_class(1, 82.0),
        "x86-v4": _host_class(2, 20.0),
        "gpu-t4": _host_class(3, 20.0, expected="CUDAExecutionProvider"),
        HOSTILE: _host_class(4, 30.0),
        "new-class": _host_class(5, 25.0),
    }
    fleet = Fleet(project=_project(classes), seed=seed)
    arm = fleet.qualify("arm-r5", candidate_p99_ms=40.0, baseline_p99_ms=60.0)
    x86 = fleet.qualify("x86-v4", candidate_p99_ms=26.0, baseline_p99_ms=14.0)
    gpu = fleet.qualify("gpu-t4", candidate_p99_ms=9.0, baseline_p99_ms=12.0, fallback_nodes=5)
    fleet.qualify(
        HOSTILE,
        candidate_p99_ms=None,
        baseline_p99_ms=18.0,
        emulated=True,
        stale=True,
        rollback_loaded=None,
        candidate_error="crashed: signal 11 <in libonnxruntime>",
    )
    previous = {
        "arm-r5": ("baseline", "first manifest: arm-r5 keeps the baseline."),
        "x86-v4": ("candidate", "x86-v4 got the candidate rec-int8."),
        "gpu-t4": ("baseline", "gpu-t4 keeps the baseline."),
    }
    for name, (decision, summary) in previous.items():
        fleet.decide(
            name, decision, summary, [Reason(code="baseline_chosen", message=summary)], None
        )
    before = fleet.manifest(version=1, release="2025.05", snapshot="sha256:" + "1" * 64)
    fleet.entries.clear()
    fleet.decide(
        "arm-r5",
        "candidate",
        "arm-r5 gets the candidate rec-int8: it passed every gate on its key.",
        [Reason(code="candidate_passed", message="p99 upper bound within 82 ms; parity passed")],
        arm,
    )
    fleet.decide(
        "x86-v4",
        "baseline",
        "x86-v4 keeps the baseline rec-fp32: the candidate's p99 is over budget.",
        [Reason(code="p99_over_budget", message="rec-int8 p99 upper bound above 20 ms")],
        x86,
    )
    fleet.decide(
        "gpu-t4",
        "hold",
        "gpu-t4 is held: the candidate ran 5 nodes on the CPU instead of CUDA.",
        [
            Reason(code="provider_fallback", message="5 of 24 nodes ran off CUDAExecutionProvider"),
            Reason(code="hold", message="hosts keep what they run"),
        ],
        gpu,
    )
    fleet.decide(
        HOSTILE,
        "hold",
        f"{HOSTILE} is held: its only cells are emulated and stale.",
        [Reason(code="emulated", message=f"run on a host that is not {HOSTILE}")],
        None,
    )
    fleet.decide(
        "new-class",
        "hold",
        "new-class is held: no measurement at all.",
        [Reason(code="no_evidence", message="no cell on key hw5/ort-r8/p5")],
        None,
    )
    return fleet, fleet.manifest(version=2), before


def synthetic_fleet(classes: int, *, samples: int = 1000, seed: int = 0) -> Fleet:
    """A benchmark fleet: ``classes`` classes, two artifacts each, ``samples`` per config.

    Every fifth class's candidate is over budget, every seventh falls back to the CPU; each
    class gets a scripted manifest entry, so the page is as large as a real one.
    """
    cuda = "CUDAExecutionProvider"
    specs = {
        f"class-{i:04d}": _host_class(
            i, 20.0 + i % 30, **({"expected": cuda} if i % 7 == 0 else {})
        )
        for i in range(classes)
    }
    fleet = Fleet(project=_project(specs), seed=seed)
    for i, name in enumerate(specs):
        budget = 20.0 + i % 30
        over = i % 5 == 0
        run_id = fleet.qualify(
            name,
            candidate_p99_ms=budget * (1.3 if over else 0.6),
            baseline_p99_ms=budget * 0.8,
            samples=samples,
            fallback_nodes=3 if i % 7 == 0 else 0,
        )
        decision = "baseline" if over or i % 7 == 0 else "candidate"
        fleet.decide(
            name,
            decision,
            f"{name} gets the {decision}.",
            [
                Reason(
                    code="candidate_passed" if decision == "candidate" else "baseline_chosen",
                    message="scripted",
                )
            ],
            run_id,
        )
    return fleet


@dataclass
class History:
    """What a fleet's matrix logged besides cells: rollouts, steering, tunes, lineage and
    the manifest versions it published."""

    rollouts: list[dict[str, Any]]
    releases: list[ManifestVersion]
    steering: dict[str, dict[str, Any]]
    tunes: list[TuneRecord]
    lineage: dict[str, Lineage]


def _rollout(step: int, action: str, percent: int, why: str, **extra: Any) -> dict[str, Any]:
    return {
        "rollout_id": "arm-r5-20250601T1000",
        "host_class": "arm-r5",
        "action": action,
        "version": 2 + step,
        "step": step,
        "percent": percent,
        "artifact": CANDIDATE,
        "actor": "release-bot@ci.example.com",
        "why": why,
        "acted_at": CLOCK - timedelta(hours=4 - step),
        **extra,
    }


def scripted_history(fleet: Fleet) -> History:
    """The golden report's history: a staged rollout of arm-r5 with long evidence (halted once,
    then complete), x86-v4 pinned, a three-trial tune of arm-r5, and the candidate's lineage
    with many parameters and a long note: the long texts that once overflowed the page."""
    evidence = (
        "cohort: 1400 events from 12 hosts, p99 38.2 ms (budget 82 ms), no fallback_appeared, "
        "no provider_changed, no unexpected_digest; rest: 9800 events from 88 hosts"
    )
    rollouts = [
        _rollout(0, "start", 10, "first cohort: the canary hosts of rack a1"),
        _rollout(1, "halt", 10, "alert fallback_appeared: 3 nodes ran off CPUExecutionProvider"),
        _rollout(2, "advance", 50, evidence),
        _rollout(3, "complete", 100, evidence),
    ]
    pin = _rollout(1, "pin", 0, "the GPU driver on x86-v4 hosts is being replaced this week")
    pin.update(host_class="x86-v4", rollout_id="x86-v4-pin", artifact=BASELINE)
    return History(
        rollouts=rollouts,
        releases=_releases(),
        steering={"x86-v4": pin},
        tunes=[_tune(fleet)],
        lineage={
            CANDIDATE: Lineage(
                artifact_digest=digest_of(CANDIDATE),
                name=CANDIDATE,
                precision="int8",
                parent_digest=digest_of(BASELINE),
                parent_name=BASELINE,
                tool="onnxruntime.quantization.quantize_static",
                tool_version="1.20.1",
                params={
                    "activation_type": "QUInt8",
                    "calibrate_method": "MinMax",
                    "extra_options": {"ActivationSymmetric": False, "WeightSymmetric": True},
                    "nodes_to_exclude": ["/encoder/layer.0/attention/Softmax"],
                    "per_channel": True,
                    "quant_format": "QDQ",
                    "reduce_range": False,
                    "weight_type": "QInt8",
                },
                calibration_digest=digest_of("calibration"),
                note="static int8, calibrated on 256 recorded inputs; not fine-tuned after "
                "quantization, so its parity is checked against the baseline on every class",
                created_at=CLOCK - timedelta(days=2),
            )
        },
    )


def _releases() -> list[ManifestVersion]:
    """v1 published before the matrix recorded who and why; v2, the page's, by a person who
    said why (at length); a draft and a discarded publication, which the page leaves out."""

    def version(n: int, state: str, days: int, by: str | None, why: str | None) -> Any:
        at = CLOCK - timedelta(days=days)
        published = at if state == "published" else None
        return ManifestVersion(
            version=n,
            release=f"2025.0{4 + n}",
            state=state,  # type: ignore[arg-type]
            created=at,
            published_at=published,
            published_by=by,
            publish_reason=why,
        )

    return [
        version(1, "published", 30, None, None),
        version(
            2,
            "published",
            1,
            "maria.lopez",
            "June release: arm-r5 moves to the int8 candidate after two weeks of canary "
            "traffic on rack a1 (CHG-1042); gpu-t4 stays held until its driver is replaced",
        ),
        version(3, "discarded", 0, None, None),
        version(4, "draft", 0, None, None),
    ]


def _tune(fleet: Fleet) -> TuneRecord:
    cls = fleet.project.host_classes["arm-r5"]
    cell = next(c for c in fleet.cells if c.key == cls.key and c.role == "candidate")
    ratio = Slowdown(
        rounds=12,
        confidence=0.95,
        p50_ratio=0.81,
        p50_lower=0.78,
        p50_upper=0.84,
        p99_ratio=0.74,
        p99_lower=0.66,
        p99_upper=0.83,
    )
    labels = ["current settings", "intra_op=2 intra_op.allow_spinning=0", "intra_op=4"]
    trials = [
        Trial(
            trial=i,
            label=label,
            change={} if i == 0 else {"intra_op_num_threads": 2 * i},
            provider=cls.provider,
            status=("reference", "winner", "dropped")[i],
            stage=2 if i < 2 else 1,
            dropped_at_stage=1 if i == 2 else None,
            vs_current=None if i == 0 else ratio,
            cell=cell,
        )
        for i, label in enumerate(labels)
    ]
    return TuneRecord(
        tune_id="tune-arm-r5-1",
        host_class="arm-r5",
        key=cls.key,
        artifact_name=CANDIDATE,
        artifact_digest=cell.artifact_digest,
        config=cell.latency[0].config.short,
        started_at=CLOCK - timedelta(hours=6),
        finished_at=CLOCK - timedelta(hours=5),
        budget_s=600.0,
        emulated=False,
        winner=1,
        winner_label=labels[1],
        qualification_run_id=cell.run_id,
        qualification_verdict="pass",
        applied=True,
        outcome="applied: written into the project file after a qualification run passed",
        trials=trials,
    )
