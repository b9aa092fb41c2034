"""``qualify tune``: a bounded, raced search over one class's session settings.

Owns the search space, the race (each configuration in its own process, interleaved rounds,
successive halving), the choice (fastest at p99 with a paired ratio confidently <= 1, else the
current settings) and the proof (a full qualification run before the winner is written). Each
trial is stored as a cell of its own (table ``tunes``), never one a decision rests on.
"""

from __future__ import annotations

import math
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from matrix.store import Store
from qualify.artifacts import ArtifactStore
from qualify.errors import ProjectError
from qualify.measure.ab import ConfigEvidence, interleave, slowdowns
from qualify.measure.cells import Artifact, CellSite, Measured, cell_of
from qualify.measure.fingerprint import class_cpus
from qualify.measure.job import job_for
from qualify.measure.parity import Rows, compare_outputs, unpack
from qualify.measure.runner import SUBPROCESSES, RoundWorker, WorkerOutcome, Workers
from qualify.measure.workload import build_pool
from qualify.project.edit import set_class_provider
from qualify.project.load import LoadedProject
from qualify.rounds import latency_results
from qualify.run import RunOptions, RunOutcome, check_host, new_run_id, qualify_run, roles_of
from schemas.atomic import temp_prefix
from schemas.base import Role
from schemas.cell import Cell, LatencyConfig, ParityResult, Slowdown, dims_text
from schemas.host import Fingerprint
from schemas.project import ArtifactSpec, HostClass, ProviderSpec
from schemas.tune import Trial, TrialStatus, TuneRecord

__all__ = ["TuneOptions", "TuneOutcome", "search_space", "tune_class"]

EventSink = Callable[[str], None]

_SPINNING = "session.intra_op.allow_spinning"
_INT_PRECISION = "session.x64quantprecision"
_PROVIDER_KNOBS: dict[str, list[dict[str, str]]] = {
    "CUDAExecutionProvider": [
        {"cudnn_conv_algo_search": "HEURISTIC"},
        {"arena_extend_strategy": "kSameAsRequested"},
    ],
    "TensorrtExecutionProvider": [
        {"trt_fp16_enable": "1"},
        {"trt_builder_optimization_level": "5"},
    ],
    "OpenVINOExecutionProvider": [{"num_streams": "2"}],
    "DnnlExecutionProvider": [{"use_arena": "0"}],
}
"""Options each provider exposes that change speed, tried one at a time."""


@dataclass(frozen=True)
class TuneOptions:
    """How much to search and what to do with the winner."""

    budget_s: float = 120.0
    """Wall time for the race (the qualification run of the winner comes on top)."""
    max_trials: int = 8
    """Configurations raced, the class's current settings included."""
    artifact: str | None = None
    """The artifact to tune with (its label); default: the first candidate, else the baseline."""
    write: bool = True
    """Write the winner into the project file once its qualification run passes."""


@dataclass
class TuneOutcome:
    """A finished tune: the stored record and the winner's qualification run, if one ran."""

    record: TuneRecord
    qualification: RunOutcome | None
    measured: bool = True
    """False when no trial could be compared with the current settings (the reference, or every
    challenger, ended before a round finished): the record says why, and nothing was chosen."""


def _config_change(provider: ProviderSpec, key: str, value: str) -> dict[str, Any] | None:
    if str(provider.session_config.get(key, "")) == value:
        return None
    return {"session_config": {**provider.session_config, key: value}}


def _singles(
    provider: ProviderSpec, cores: int, precision: str, cpus: list[int]
) -> list[dict[str, Any]]:
    """One change at a time from the class's current settings."""
    out: list[dict[str, Any]] = []
    for threads in sorted({1, 2, cores}):
        if threads <= cores and threads != provider.intra_op_threads:
            out.append({"intra_op_threads": threads})
    spin = _config_change(provider, _SPINNING, "0")
    if spin is not None:
        out.append(spin)
    for level in ("extended", "basic"):
        if provider.graph_optimization_level != level:
            out.append({"graph_optimization_level": level})
    if provider.execution_mode != "parallel" and cores > 1:
        out.append({"execution_mode": "parallel", "inter_op_threads": 2})
    if precision == "int8":
        quant = _config_change(provider, _INT_PRECISION, "1")
        if quant is not None:
            out.append(quant)
    if provider.cpu_affinity is None and len(cpus) > 1:
        out.append({"cpu_affinity": cpus[:1], "intra_op_threads": 1})
    for name in provider.execution_providers:
        for knob in _PROVIDER_KNOBS.get(name, []):
            current = provider.provider_options.get(name, {})
            out.append(
                {"provider_options": {**provider.provider_options, name: {**current, **knob}}}
            )
    return out


def search_space(
    provider: ProviderSpec, *, cores: int, precision: str, cpus: list[int], max_trials: int
) -> list[dict[str, Any]]:
    """Changes to the class's provider section to race, the current settings (``{}``) first.

    One change at a time first (threads, spinning, graph level, execution mode, integer
    precision for int8 artifacts, affinity, provider options), then the promising pairs (fewer
    threads without spinning), cut at ``max_trials``; every change is a valid provider section.
    """
    singles = _singles(provider, cores, precision, cpus)
    pairs: list[dict[str, Any]] = []
    spin = _config_change(provider, _SPINNING, "0")
    if spin is not None and cores > 1 and provider.intra_op_threads != 1:
        pairs.append({"intra_op_threads": 1, **spin})
    found: list[dict[str, Any]] = [{}]
    for change in [*singles, *pairs]:
        ProviderSpec.model_validate({**provider.model_dump(exclude_unset=True), **change})
        if change not in found:
            found.append(change)
    return found[: max(1, max_trials)]


def _label(change: dict[str, Any], provider: ProviderSpec) -> str:
    if not change:
        return "current"
    parts = []
    for key, value in change.items():
        if key == "session_config":
            parts += [
                f"{k.removeprefix('session.')}={v}"
                for k, v in value.items()
                if provider.session_config.get(k) != v
            ]
        elif key == "provider_options":
            for name, opts in value.items():
                before = provider.provider_options.get(name, {})
                parts += [f"{k}={v}" for k, v in opts.items() if before.get(k) != v]
        elif key == "cpu_affinity":
            parts.append("cpus=" + ",".join(str(c) for c in value))
        else:
            parts.append(f"{key.removesuffix('_threads')}={value}")
    return " ".join(parts)


def _pick_artifact(loaded: LoadedProject, name: str | None) -> tuple[ArtifactSpec, str]:
    artifacts = loaded.project.artifacts
    specs = [artifacts.baseline, *artifacts.candidates]
    if name is None:
        spec = artifacts.candidates[0] if artifacts.candidates else artifacts.baseline
    else:
        matches = [s for s in specs if s.label == name]
        if not matches:
            known = ", ".join(s.label for s in specs)
            raise ProjectError(f"{loaded.path}: no artifact named {name!r}; pick one of: {known}")
        spec = matches[0]
    return spec, "baseline" if spec is artifacts.baseline else "candidate"


@dataclass
class _Arm:
    index: int
    change: dict[str, Any]
    host_class: HostClass
    label: str
    worker: RoundWorker | None = None
    outcome: WorkerOutcome | None = None
    evidence: dict[LatencyConfig, ConfigEvidence] | None = None
    ratio: Slowdown | None = None
    stage: int = 0
    dropped_at: int | None = None
    parity: ParityResult | None = None


def _arms(host_class: HostClass, changes: list[dict[str, Any]]) -> list[_Arm]:
    base = host_class.provider.model_dump(exclude_unset=True)
    arms = []
    for index, change in enumerate(changes):
        provider = ProviderSpec.model_validate({**base, **change})
        arms.append(
            _Arm(
                index=index,
                change=change,
                host_class=host_class.model_copy(update={"provider": provider}),
                label=_label(change, host_class.provider),
            )
        )
    return arms


def _ranked(arms: list[_Arm]) -> list[_Arm]:
    """The challengers best first: p99 ratio, then p50 ratio (unmeasured last)."""

    def key(arm: _Arm) -> tuple[float, float]:
        r = arm.ratio
        p99 = r.p99_ratio if r is not None and r.p99_ratio is not None else math.inf
        p50 = r.p50_ratio if r is not None and r.p50_ratio is not None else math.inf
        return (p99, p50)

    return sorted(arms, key=key)


def _clearly_slower(arm: _Arm) -> bool:
    r = arm.ratio
    if r is None or r.p99_ratio is None:
        return True  # it measured nothing comparable (its process died, or no paired round)
    return any(b is not None and b > 1.0 for b in (r.p50_lower, r.p99_lower))


def _confidently_not_slower(arm: _Arm) -> bool:
    r = arm.ratio
    return (
        r is not None
        and r.p50_upper is not None
        and r.p99_upper is not None
        and r.p50_upper <= 1.0
        and r.p99_upper <= 1.0
    )


@dataclass
class _Race:
    loaded: LoadedProject
    class_name: str
    role: str
    host_class: HostClass
    fp: Fingerprint
    spec: ArtifactSpec
    digest: str
    stored: Path
    inputs_path: Path
    work_root: Path
    workers: Workers
    on_event: EventSink
    on_progress: EventSink | None


def _start(race: _Race, arm: _Arm) -> None:
    work = race.work_root / f"t{arm.index:02d}"
    work.mkdir()
    wl = race.loaded.project.workload.model_copy(update={"profile_runs": 0})
    job = job_for(
        artifact_path=race.stored,
        digest=race.digest,
        host_class=arm.host_class,
        workload=wl,
        root=race.loaded.root,
        cpus=class_cpus(race.fp, arm.host_class)[0],
        inputs_path=race.inputs_path,
        work=work,
        mode="serve",
    )
    worker = race.workers.serve(
        job, work, timeout_s=arm.host_class.budgets.timeout_s, on_start=None
    )
    arm.worker = worker
    if not worker.ready():
        arm.outcome = worker.finish([])
        arm.dropped_at = 0


def _stage(
    race: _Race, arms: list[_Arm], config: LatencyConfig, seconds: float, stage: int
) -> None:
    """One stage of the race: interleaved rounds among ``arms`` (the reference first)."""
    wl = race.loaded.project.workload
    cap = max(0.2, seconds / max(1, len(arms)))
    stage_wl = wl.model_copy(update={"time_cap_s": cap, "max_samples": max(wl.min_samples, 20000)})
    measured = interleave(
        [a.worker if a.outcome is None else None for a in arms],
        [config],
        stage_wl,
        race.host_class.budgets.p99_ms,
        cores=len(race.fp.affinity) or race.fp.cores,
        on_event=lambda line: race.on_event(f"stage {stage}: {line}"),
        on_progress=race.on_progress,
        labels=[a.label for a in arms],
    )
    confidence = 1 - (1 - wl.confidence) / 2  # two metrics per comparison
    reference = measured.evidence[0]
    for arm, evidence in zip(arms, measured.evidence, strict=True):
        if not evidence:
            continue
        arm.evidence, arm.stage = evidence, stage
        if arm.index != 0:
            arm.ratio = slowdowns(evidence, reference, confidence).get(config)


def _halve(arms: list[_Arm], stage: int) -> list[_Arm]:
    """The survivors of a stage: the reference, and the faster half of the challengers that
    are not clearly slower."""
    challengers = [a for a in arms[1:] if a.dropped_at is None]
    for arm in challengers:
        if _clearly_slower(arm):
            arm.dropped_at = stage
    standing = _ranked([a for a in challengers if a.dropped_at is None])
    keep = max(1, math.ceil(len(standing) / 2)) if standing else 0
    for arm in standing[keep:]:
        arm.dropped_at = stage
    return [arms[0], *standing[:keep]]


def _race(race: _Race, arms: list[_Arm], config: LatencyConfig, budget_s: float) -> None:
    stages = max(1, math.ceil(math.log2(max(2, len(arms)))))
    # Stage k gets a share of the budget that grows as the field shrinks: each configuration's
    # time per stage roughly doubles, where its ratio's bounds must get tight.
    weights = [2**k for k in range(stages)]
    alive = [a for a in arms if a.outcome is None]
    for stage, weight in enumerate(weights, start=1):
        if len(alive) < 2 or alive[0] is not arms[0]:
            # Nothing to compare: the current settings, or every challenger, ended already.
            race.on_event(f"stage {stage}/{stages}: no configuration left to compare; race over")
            return
        seconds = budget_s * weight / sum(weights)
        race.on_event(
            f"stage {stage}/{stages}: {len(alive)} configuration(s), {seconds:.0f} s: "
            + ", ".join(a.label for a in alive)
        )
        _stage(race, alive, config, seconds, stage)
        if len(alive) <= 2 and stage > 1:
            break
        alive = _halve(alive, stage) if stage < stages else alive


def _trial_cell(race: _Race, arm: _Arm, run_id: str, now: datetime) -> Cell:
    outcome = arm.outcome
    assert outcome is not None
    confidence = race.loaded.project.workload.confidence
    ratios = {} if arm.ratio is None else dict.fromkeys(arm.evidence or {}, arm.ratio)
    latency = latency_results(arm.evidence or {}, outcome, confidence, ratios)
    site = CellSite(
        run_id=run_id,
        host_class=race.class_name,
        key=arm.host_class.key,
        settings_digest=arm.host_class.settings_digest(),
        fingerprint=race.fp,
        workload_digest=race.loaded.project.workload.evidence_digest(),
    )
    role: Role = "baseline" if race.role == "baseline" else "candidate"
    artifact = Artifact(race.digest, race.spec.label, role, race.spec.precision)
    return cell_of(site, artifact, outcome, now, Measured(latency=latency, parity=arm.parity))


def _trial(race: _Race, arm: _Arm, run_id: str, now: datetime, winner: int) -> Trial:
    status: TrialStatus
    if arm.index == 0:
        status = "reference"
    elif arm.index == winner:
        status = "winner"
    elif arm.dropped_at is not None:
        status = "dropped"
    elif arm.parity is not None and not arm.parity.passed:
        status = "numerics_changed"
    else:
        status = "finalist"
    return Trial(
        trial=arm.index,
        label=arm.label,
        change=arm.change,
        provider=arm.host_class.provider,
        status=status,
        stage=arm.stage,
        dropped_at_stage=arm.dropped_at,
        vs_current=arm.ratio,
        cell=_trial_cell(race, arm, f"{run_id}.t{arm.index:02d}", now),
    )


def _winner(arms: list[_Arm]) -> _Arm:
    finalists = [
        a
        for a in arms[1:]
        if a.dropped_at is None
        and _confidently_not_slower(a)
        and a.parity is not None
        and a.parity.passed
    ]
    ranked = _ranked(finalists)
    return ranked[0] if ranked else arms[0]


def _outputs(race: _Race, arm: _Arm) -> dict[str, Rows] | None:
    path = race.work_root / f"t{arm.index:02d}" / "outputs.npz"
    if arm.outcome is None or arm.outcome.error_code or not path.exists():
        return None
    with np.load(path) as found:
        return unpack(dict(found))


def _check_numerics(race: _Race, arms: list[_Arm]) -> None:
    """Each configuration's outputs against the current settings' on the same inputs, with the
    artifact's own precision tolerance: settings that change the numbers (a graph level, integer
    precision, a provider option) beyond it never win."""
    reference = _outputs(race, arms[0])
    tolerance = race.loaded.project.tolerance(race.spec.precision)
    roles = roles_of(race.stored, race.loaded.project.workload)
    for arm in arms[1:]:
        mine = _outputs(race, arm)
        if reference is None or mine is None:
            continue
        arm.parity = compare_outputs(
            reference, mine, tolerance, reference_digest=race.digest, roles=roles
        )
        if not arm.parity.passed:
            race.on_event(
                f"trial {arm.index}: {arm.label}: outputs differ from the current settings'"
            )


def _measure(race: _Race, arms: list[_Arm], config: LatencyConfig, budget_s: float) -> None:
    try:
        for arm in arms:
            race.on_event(f"trial {arm.index}: {arm.label}: preparing")
            _start(race, arm)
        _race(race, arms, config, budget_s)
        for arm in arms:
            if arm.outcome is None and arm.worker is not None:
                arm.outcome = arm.worker.finish([])
        _check_numerics(race, arms)
    finally:
        for arm in arms:
            if arm.worker is not None:
                arm.worker.close()


def _qualify_winner(
    loaded: LoadedProject,
    class_name: str,
    winner: _Arm,
    spec: ArtifactSpec,
    options: RunOptions,
    workers: Workers,
    on_event: EventSink,
) -> tuple[RunOutcome, Cell | None]:
    """A full qualification run of the class under the winner's settings (every artifact,
    every gate, parity against the baseline included)."""
    classes = {**loaded.project.host_classes, class_name: winner.host_class}
    project = loaded.project.model_copy(update={"host_classes": classes})
    trial_project = LoadedProject(path=loaded.path, root=loaded.root, project=project)
    on_event(f"qualifying {class_name} under '{winner.label}'")
    outcome = qualify_run(trial_project, class_name, options, on_event=on_event, workers=workers)
    mine = [c for c in outcome.bundle.cells if c.artifact_name == spec.label]
    return outcome, (mine[0] if mine else None)


def tune_class(
    loaded: LoadedProject,
    class_name: str,
    options: RunOptions,
    tune: TuneOptions,
    *,
    on_event: EventSink = lambda _msg: None,
    on_progress: EventSink | None = None,
    workers: Workers = SUBPROCESSES,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> TuneOutcome:
    """Race session settings for one class, prove the winner, store every trial.

    Returns:
        The stored record and the winner's qualification run, if one beat the current settings.

    Raises:
        ProjectError: unknown class or artifact, or an edit of the project file that failed.
        HostMismatchError: the host is not of the class and emulation was not asked for.
    """
    host_class, fp, mismatches = check_host(loaded, class_name, options.emulate, workers.probe)
    spec, role = _pick_artifact(loaded, tune.artifact)
    digest, stored = _stored(loaded, spec, options)
    started = now()
    run_id = new_run_id(class_name, started)
    db_dir = options.db_path.resolve().parent  # beside the matrix, as a run's
    work_root = Path(tempfile.mkdtemp(prefix=temp_prefix(f"tune-{run_id}"), dir=db_dir))
    try:
        race = _Race(
            loaded, class_name, role, host_class, fp, spec, digest, stored,
            work_root / "inputs.npz", work_root, workers, on_event, on_progress,
        )  # fmt: skip
        arms, config = _race_settings(race, tune)
    finally:
        shutil.rmtree(work_root, ignore_errors=True)
    winner, measured = _winner(arms), now()
    trials = [_trial(race, arm, run_id, measured, winner.index) for arm in arms]
    qualification, verdict, applied, why = _prove_winner(race, arms, winner, options, tune)
    record = TuneRecord(
        tune_id=run_id,
        host_class=class_name,
        key=host_class.key,
        artifact_name=spec.label,
        artifact_digest=digest,
        config=config.label,
        started_at=started,
        finished_at=now(),
        budget_s=tune.budget_s,
        emulated=bool(mismatches),
        winner=winner.index,
        winner_label=winner.label,
        qualification_run_id=qualification.bundle.run.run_id if qualification else None,
        qualification_verdict=verdict,
        applied=applied,
        outcome=why,
        trials=trials,
    )
    with Store.open(options.db_path, wait_s=options.lock_wait_s, model=loaded.project.model) as db:
        db.write_tune(record)
    return TuneOutcome(record=record, qualification=qualification, measured=_compared(arms))


def _race_settings(race: _Race, tune: TuneOptions) -> tuple[list[_Arm], LatencyConfig]:
    """Race the search space's configurations at the workload's first config."""
    wl = race.loaded.project.workload
    config = LatencyConfig(wl.batch_sizes[0], wl.concurrency[0], dims_text(wl.dim_points[0]))
    cpus = sorted(race.fp.affinity) or list(range(race.fp.cores))
    changes = search_space(
        race.host_class.provider,
        cores=len(cpus),
        precision=race.spec.precision,
        cpus=cpus,
        max_trials=tune.max_trials,
    )
    arms = _arms(race.host_class, changes)
    race.on_event(
        f"tuning {race.class_name} with {race.spec.label} at {config.label}: {len(arms)} "
        f"configurations, {tune.budget_s:.0f} s"
    )
    np.savez(race.inputs_path, allow_pickle=False, **build_pool(wl, race.loaded.resolve))
    _measure(race, arms, config, tune.budget_s)
    return arms, config


def _stored(loaded: LoadedProject, spec: ArtifactSpec, options: RunOptions) -> tuple[str, Path]:
    """The artifact in the run's store: ``(digest, stored path)``; a matrix of another model
    line is refused first, before anything is raced."""
    if options.db_path.exists():
        Store.open(options.db_path, wait_s=options.lock_wait_s, model=loaded.project.model).close()
    db_dir = options.db_path.resolve().parent
    store = ArtifactStore(options.store_dir or db_dir / "artifacts")
    return store.add(loaded.resolve(spec.path))


def _prove_winner(
    race: _Race, arms: list[_Arm], winner: _Arm, options: RunOptions, tune: TuneOptions
) -> tuple[RunOutcome | None, str | None, bool, str]:
    """The winner's qualification run, and whether its settings were written to the project
    file: ``(run, its verdict, written, why)``; no run when the current settings won."""
    if not _compared(arms):
        race.on_event(_none_finished(arms))
    if winner.index == 0:
        why = "no configuration was confidently faster" if _compared(arms) else _none_finished(arms)
        return None, None, False, why
    loaded, class_name = race.loaded, race.class_name
    qualification, cell = _qualify_winner(
        loaded, class_name, winner, race.spec, options, race.workers, race.on_event
    )
    verdict = cell.verdict if cell is not None else None
    if verdict == "pass" and tune.write:
        set_class_provider(loaded.path, class_name, winner.change)
        return qualification, verdict, True, f"written to {loaded.path}"
    if verdict == "pass":
        return qualification, verdict, False, "passed; not written (--no-write)"
    codes = ", ".join(r.code for r in (cell.reasons if cell else []))
    why = f"its qualification run gave {verdict or 'no cell'}" + (f" ({codes})" if codes else "")
    return qualification, verdict, False, why


def _compared(arms: list[_Arm]) -> bool:
    """Whether the current settings and at least one challenger have timed rounds."""
    return bool(arms[0].evidence) and any(a.evidence for a in arms[1:])


def _none_finished(arms: list[_Arm]) -> str:
    """Why no trial could be compared, trial by trial (each one's error, or that it ran)."""
    said = []
    for arm in arms[:8]:
        outcome = arm.outcome
        how = (
            f"{outcome.error_code}: {(outcome.error_message or '')[:160]}"
            if outcome is not None and outcome.error_code
            else "measured"
            if arm.evidence
            else "not measured"
        )
        said.append(f"trial {arm.index} ({arm.label}): {how}")
    return "no trial finished to compare with the current settings; nothing was chosen (" + (
        "; ".join(said) + ")"
    )
