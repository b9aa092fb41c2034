"""The qualification run: one host class, every artifact, into the matrix.

Owns the order of a run: fingerprint and class check, artifact store, one input pool for all,
the artifacts measured side by side (`qualify.rounds`: each in its own subprocess, interleaved
rounds, A/A control, soak, open loop), parity against the baseline, verdicts from
``manifest.gates``, the rollback check, then the bundle and one matrix transaction. It does not
import onnxruntime (the worker does), does not hold SQL (``matrix`` does) and does not print (the
CLI does, through ``on_event``).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from manifest.gates import judge
from manifest.rollback import RollbackTarget, rollback_target
from matrix.bundle import read_run, write_bundle
from matrix.errors import BundleError, MatrixError
from matrix.ingest import ingest_bundles
from matrix.samples import SAMPLES_SCHEMA, empty_samples
from matrix.store import Store
from qualify.artifacts import ArtifactStore
from qualify.errors import ArtifactError, HostMismatchError, ProjectError
from qualify.measure.ab import ConfigEvidence, comparison_confidence
from qualify.measure.cells import Artifact, CellSite, Measured, cell_of
from qualify.measure.emulators import Emulators, NumericsPlan, plan_numerics
from qualify.measure.fingerprint import class_mismatches, take_fingerprint
from qualify.measure.hostlock import DEFAULT_WAIT_S, lock_wait_message, measuring_alone
from qualify.measure.job import WorkerJob
from qualify.measure.numerics import Outputs, RunNumerics
from qualify.measure.parity import OutputRole, compare_outputs, output_roles, unpack
from qualify.measure.runner import SUBPROCESSES, WorkerOutcome, Workers
from qualify.measure.sysroot import emulator_dirs
from qualify.measure.workload import build_pool
from qualify.project.graph import read_signature
from qualify.project.load import LoadedProject
from qualify.project.problems import no_such_class
from qualify.project.view import record_view
from qualify.release.generate import previous_manifest
from qualify.rounds import EventSink, Measurements, RunContext, latency_of, measure_interleaved
from schemas.atomic import remove_leftovers, temp_prefix
from schemas.base import Precision, Role
from schemas.cell import (
    Cell,
    LatencyConfig,
    ParityResult,
    RollbackCheck,
    RunBundle,
    RunRecord,
    dims_text,
)
from schemas.host import Fingerprint
from schemas.project import (
    ArtifactSpec,
    HostClass,
    OpenLoop,
    Project,
    Workload,
    outlasting_timeout,
)

__all__ = [
    "RunOptions",
    "RunOutcome",
    "check_host",
    "new_run_id",
    "qualify_run",
    "roles_of",
    "warning_lines",
]


@dataclass(frozen=True)
class RunOptions:
    """Where a run reads and writes, and how it treats a host outside the class."""

    db_path: Path
    emulate: bool = False
    bundle_dir: Path | None = None
    """Defaults to ``<db dir>/bundles``."""
    store_dir: Path | None = None
    """Defaults to ``<db dir>/artifacts``."""
    lock_wait_s: float = 300.0
    measure_alone: bool = True
    """Hold the host-wide measurement lock while measuring (``--shared-host`` turns it off)."""
    host_lock_wait_s: float = DEFAULT_WAIT_S
    """How long to wait for another run's measurement on this host (``--lock-wait``)."""
    soak_s: float | None = None
    """Soak this long (``--soak``), whatever ``workload.soak_s`` says; None: as the workload."""
    fleet_node: str | None = None
    """The Ray node this run measures on, for a fleet run (`qualify.fleet.cluster`): every cell says it."""
    open_loop: bool = False
    """Search the highest request rate (``--open-loop``) even where ``workload.open_loop`` is
    unset (then with its defaults)."""
    emulators: Emulators | None = None
    """Where ``--emulate`` finds QEMU and prepared runtimes; None: PATH, then beside the matrix
    and the user's cache (`qualify.measure.sysroot.emulator_dirs`)."""


@dataclass
class RunOutcome:
    """What a finished run produced."""

    bundle: RunBundle
    bundle_path: Path
    written: bool
    samples: pa.Table = field(repr=False)

    @property
    def ok(self) -> bool:
        """True when no cell ended in ``error``."""
        return all(c.verdict != "error" for c in self.bundle.cells)


def new_run_id(host_class: str, now: datetime) -> str:
    """A unique, sortable run id: ``<UTC time>-<class>-<random>``."""
    return f"{now.strftime('%Y%m%dT%H%M%SZ')}-{host_class}-{secrets.token_hex(3)}"


def _stages_line(cell: Cell) -> str | None:
    """``end to end p50 3.2 ms = pre 93%, inference 7%, post 0% (inference alone p50 0.16 ms)``
    for a cell measured with a pipeline; None without one."""
    gate = cell.gate_latency
    if gate is None or gate.stage_share is None or gate.inference_p50_ms is None:
        return None
    shares = ", ".join(f"{stage} {share:.0%}" for stage, share in gate.stage_share.items())
    return (
        f"end to end p50 {gate.p50_ms:.3g} ms = {shares} "
        f"(inference alone p50 {gate.inference_p50_ms:.3g} ms)"
    )


def _cell_lines(cell: Cell, outcome: WorkerOutcome) -> list[str]:
    """What the run's output says of a cell beyond its verdict: the processes its measuring
    process left running, its stages, its slowdown and the slowdown it could have seen, what
    the runtime warned."""
    strays = outcome.stray_processes
    found = [
        f"killed {strays} process(es) its measuring process left running (a pipeline hook's)"
        if strays
        else None,
        _stages_line(cell),
        _slowdown_line(cell),
    ]
    return [line for line in found if line] + warning_lines(cell)


def _slowdown_line(cell: Cell) -> str | None:
    """``p50 x1.02 the baseline's (at least x0.97, A/A spread x1.00): could have seen a p50
    slowdown from x1.05`` at the gate config; None for the baseline or without a ratio."""
    gate = cell.gate_latency
    ratio = gate.vs_baseline if gate is not None else None
    if ratio is None or ratio.p50_ratio is None or ratio.p50_lower is None:
        return None
    spread = f", A/A spread x{ratio.p50_spread:.3f}" if ratio.p50_spread is not None else ""
    seen = (
        f": could have seen a p50 slowdown from x{ratio.p50_detectable:.3f}"
        if ratio.p50_detectable is not None
        else ""
    )
    return (
        f"p50 x{ratio.p50_ratio:.3f} the baseline's (at least x{ratio.p50_lower:.3f}{spread}, "
        f"{ratio.rounds} paired rounds){seen}"
    )


WARNINGS_SHOWN = 5
"""Distinct warnings a run's output shows per artifact (the cell keeps up to 20)."""


def warning_lines(cell: Cell) -> list[str]:
    """``warned 412x: [W:onnxruntime:, ...] ...``: what the runtime said while the artifact was
    measured, most frequent first, at most `WARNINGS_SHOWN` lines and one that counts the rest."""
    found = sorted(cell.placement.warnings, key=lambda w: -w.count) if cell.placement else []
    lines = [f"warned {w.count}x: {w.message}" for w in found[:WARNINGS_SHOWN]]
    if len(found) > WARNINGS_SHOWN:
        lines.append(
            f"and {len(found) - WARNINGS_SHOWN} other warning(s): qualify matrix show, the report"
        )
    return lines


@dataclass(frozen=True)
class _Run(RunContext):
    """What every step of one run works with: the measuring steps' context, and the run's
    identity, options and clock."""

    class_name: str
    options: RunOptions
    mismatches: list[str]
    """How this host differs from the class (non-empty: an emulated run)."""
    run_id: str
    started: datetime
    load_before: list[float]
    on_wait: EventSink
    now: Callable[[], datetime]


def roles_of(baseline: Path, workload: Workload) -> dict[str, OutputRole]:
    """Each output's batch axis and kind, from the baseline's graph (its declared dims) and the
    workload; from the workload alone when the graph cannot be read."""
    try:
        sig = read_signature(baseline)
    except ArtifactError:
        return output_roles({}, {}, workload)
    return output_roles(
        {o.name: o.shape for o in sig.outputs},
        {i.name: i.shape for i in (*sig.inputs, *sig.optional_inputs)},
        workload,
    )


def _load_outputs(path: Path) -> Outputs | None:
    """The outputs a measuring child saved there, as samples per output; None if it saved
    none."""
    if not path.exists():
        return None
    with np.load(path) as saved:
        return unpack(dict(saved))


def _comparer(
    project: Project, roles: dict[str, OutputRole], digest: str, precision: Precision
) -> Callable[[Outputs, Outputs], ParityResult]:
    """How a candidate's outputs are compared with the baseline's (on whichever CPU both were
    computed): the precision's tolerance, each output's role, the tasks parity.post asks for."""

    def compare(reference: Outputs, mine: Outputs) -> ParityResult:
        names = [*reference, *mine]
        return compare_outputs(
            reference,
            mine,
            project.tolerance(precision),
            reference_digest=digest,
            roles=roles,
            tasks={n: t for n in names if (t := project.parity.task(n)) is not None},
        )

    return compare


def _repeated_text(text: str, n: int) -> pa.Array:
    """A string column of ``text`` ``n`` times, built from its buffers (``pa.array`` of Python
    values makes pyarrow import pandas, ~0.25 s a run never needs)."""
    raw = text.encode("utf-8")
    offsets = np.arange(n + 1, dtype=np.int32) * len(raw)
    return pa.Array.from_buffers(
        pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(raw * n)]
    )


def _column(values: np.ndarray, kind: pa.DataType) -> pa.Array:
    """A numeric column over ``values``' own buffer (contiguous, of ``kind``'s width)."""
    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(kind, int(values.size), [None, pa.py_buffer(values)])


def _sample_tables(digest: str, evidence: dict[LatencyConfig, ConfigEvidence]) -> list[pa.Table]:
    """One artifact's raw latency samples, one table per config, as the matrix stores them."""
    tables = []
    for config, ev in evidence.items():
        ns = ev.samples_ns
        tables.append(
            pa.Table.from_arrays(
                [
                    _repeated_text(digest, ns.size),
                    _column(np.full(ns.size, config.batch_size, np.int32), pa.int32()),
                    _column(np.full(ns.size, config.concurrency, np.int32), pa.int32()),
                    _repeated_text(config.dims, ns.size),
                    _column(np.arange(ns.size, dtype=np.int32), pa.int32()),
                    _column(ns.astype(np.int64), pa.int64()),
                ],
                schema=SAMPLES_SCHEMA,
            )
        )
    return tables


def _store_artifacts(
    loaded: LoadedProject, store: ArtifactStore
) -> list[tuple[ArtifactSpec, str, Path]]:
    """Every artifact of the project in the store, baseline first: (spec, digest, stored path).

    Raises:
        ProjectError: two artifacts are the same bytes (a run measures each digest once).
    """
    artifacts = loaded.project.artifacts
    stored: list[tuple[ArtifactSpec, str, Path]] = []
    for spec in [artifacts.baseline, *artifacts.candidates]:
        digest, path = store.add(loaded.resolve(spec.path))
        twin = next((s for s, d, _ in stored if d == digest), None)
        if twin is not None:
            raise ProjectError(
                f"{loaded.path}: artifacts {twin.label!r} ({twin.path}) and {spec.label!r} "
                f"({spec.path}) are the same bytes ({digest[:19]}); a run measures each "
                "artifact once. Fix: remove one of them from the project file."
            )
        stored.append((spec, digest, path))
    return stored


def check_host(
    loaded: LoadedProject, class_name: str, emulate: bool, probe: Callable[[], dict[str, Any]]
) -> tuple[HostClass, Fingerprint, list[str]]:
    classes = loaded.project.host_classes
    if class_name not in classes:
        raise ProjectError(no_such_class(loaded.path, class_name, classes))
    host_class = classes[class_name]
    fp = take_fingerprint(probe)
    mismatches = class_mismatches(fp, host_class)
    if mismatches and not emulate:
        rules = "\n  ".join(mismatches)
        raise HostMismatchError(
            f"this host does not match host class {class_name!r} ({loaded.path}):\n  {rules}\n"
            "Fix: run on a host of that class, or pass --emulate to measure here anyway "
            "(cells are then marked emulated and manifests ignore them unless the policy allows)."
        )
    return host_class, fp, mismatches


def _check_durations(loaded: LoadedProject, class_name: str, options: RunOptions) -> None:
    """Refuse a soak (``--soak``) or an open-loop search (``--open-loop``) that alone outlasts
    the class's ``budgets.timeout_s`` (the project file's own are refused when it loads).

    Raises:
        ProjectError: naming the option, the field and the fix.
    """
    host_class = loaded.project.host_classes.get(class_name)
    wl = loaded.project.workload
    asked = OpenLoop() if options.open_loop and wl.open_loop is None else None
    if host_class is None or (options.soak_s is None and asked is None):
        return
    why = outlasting_timeout(wl, host_class, soak_s=options.soak_s, open_loop=asked)
    if why is not None:
        given = "--soak" if options.soak_s is not None else "--open-loop"
        raise ProjectError(
            f"{loaded.path}: host class {class_name!r} with {given}: "
            + why.replace("workload.soak_s", "--soak").replace("workload.open_loop", "--open-loop")
        )


def qualify_run(
    loaded: LoadedProject,
    class_name: str,
    options: RunOptions,
    *,
    on_event: EventSink = lambda _msg: None,
    on_worker_start: Callable[[str, int], None] | None = None,
    on_wait: EventSink | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
    workers: Workers = SUBPROCESSES,
    on_progress: EventSink | None = None,
) -> RunOutcome:
    """Qualify every artifact of the project on one host class.

    Args:
        loaded: the project file.
        class_name: the host class to qualify.
        options: database, bundle and store locations, emulation.
        on_event: receives one short line per step (the CLI shows them).
        on_worker_start: called with (artifact label, child pid); tests inject faults with it.
        on_wait: receives the lines that say whose lock the run waits for (default: on_event;
            the CLI shows them even with --json, where on_event is silent).
        now: the clock.
        workers: where the measuring processes come from (`qualify.measure.runner.SUBPROCESSES`);
            tests hand scripted stand-ins.
        on_progress: receives a line after every interleaved round (the CLI shows it in place
            on a terminal and not at all when piped).

    The rollback check proves what the class's hosts fall back to: the artifact the latest
    manifest in the matrix gave the class (`manifest.policy.rollback_target`), else the
    baseline.

    Returns:
        The run, already written to the bundle directory and the matrix.

    Raises:
        ProjectError: unknown class, or unusable inputs.
        HostMismatchError: the host is not of the class and emulation was not asked for.
        ArtifactError: an artifact file is missing.
    """
    run, stored, store, pool = _begin(
        loaded,
        class_name,
        options,
        workers,
        (on_event, on_wait or on_event, on_worker_start, on_progress, now),
    )
    try:
        cells, samples, host_busy, rollback = _measure_all(run, stored, store, pool)
    finally:
        shutil.rmtree(run.work_root, ignore_errors=True)
    return _record(run, cells, samples, host_busy, rollback)


def _begin(
    loaded: LoadedProject,
    class_name: str,
    options: RunOptions,
    workers: Workers,
    sinks: tuple[
        EventSink,
        EventSink,
        Callable[[str, int], None] | None,
        EventSink | None,
        Callable[[], datetime],
    ],
) -> tuple[_Run, list[tuple[ArtifactSpec, str, Path]], ArtifactStore, dict[str, np.ndarray]]:
    """Everything before measuring: the host checked against the class, the artifacts in the
    store, what killed runs left cleaned up, the run's private folder made."""
    on_event, on_wait, on_worker_start, on_progress, now = sinks
    _check_durations(loaded, class_name, options)
    host_class, fp, mismatches = check_host(loaded, class_name, options.emulate, workers.probe)
    db_dir = options.db_path.resolve().parent
    store = ArtifactStore(options.store_dir or db_dir / "artifacts")
    started = now()
    run_id = new_run_id(class_name, started)
    load_before = list(os.getloadavg())
    on_event(f"fingerprint: {fp.arch}, {fp.cpu_model}, onnxruntime {fp.runtime.version}")
    if mismatches:
        on_event("emulated: " + "; ".join(mismatches))
    stored = _store_artifacts(loaded, store)
    pool = build_pool(loaded.project.workload, loaded.resolve)
    _clean_after_kills(
        options.db_path,
        db_dir,
        _bundles_dir(options),
        options.lock_wait_s,
        on_event,
        on_wait,
        loaded.project.model,
    )
    # Beside the matrix, not in a shared temp dir that a cleaner (or another run) may empty
    # under a run; tagged with this process, so that the next run removes it after a kill.
    work_root = Path(
        tempfile.mkdtemp(prefix=temp_prefix(f"work-{run_id}"), suffix=".tmp", dir=db_dir)
    )
    run = _Run(
        loaded=loaded, host_class=host_class, fp=fp, work_root=work_root, workers=workers,
        on_event=on_event, on_worker_start=on_worker_start, on_progress=on_progress,
        class_name=class_name, options=options, mismatches=mismatches, run_id=run_id,
        started=started, load_before=load_before, on_wait=on_wait, now=now,
    )  # fmt: skip
    return run, stored, store, pool


def _bundles_dir(options: RunOptions) -> Path:
    return options.bundle_dir or options.db_path.resolve().parent / "bundles"


def _measure_all(
    run: _Run,
    stored: list[tuple[ArtifactSpec, str, Path]],
    store: ArtifactStore,
    pool: dict[str, np.ndarray],
) -> tuple[list[Cell], pa.Table, bool, RollbackCheck | None]:
    """Measure and judge every artifact, holding the host's measurement lock, then check the
    class's rollback artifact: ``(cells, raw samples, host busy, rollback check)``."""
    options, db_dir = run.options, run.options.db_path.resolve().parent
    with contextlib.ExitStack() as held:
        plan = plan_numerics(
            run.fp,
            run.host_class,
            run.class_name,
            options.emulate,
            options.emulators or Emulators(runtime_dirs=emulator_dirs(db_dir)),
            run.work_root,
        )
        if plan.source != "native" or plan.note:
            run.on_event(plan.line)
        if options.measure_alone:  # the workers' whole lives: init, rounds, profile, rollback
            held.enter_context(
                measuring_alone(wait_s=options.host_lock_wait_s, on_wait=run.on_wait)
            )
        np.savez(run.inputs_path, allow_pickle=False, **pool)
        site = CellSite(
            run_id=run.run_id,
            host_class=run.class_name,
            key=run.host_class.key,
            settings_digest=run.host_class.settings_digest(),
            fingerprint=run.fp,
            emulated=bool(run.mismatches),
            isa_mismatch=tuple(plan.isa_mismatch),
            measured_alone=options.measure_alone,
            fleet_node=options.fleet_node,
            workload_digest=run.workload.evidence_digest(),
        )
        cells, samples, host_busy = _measure_cells(run, site, stored, plan)
        target = _rollback_target(options.db_path, run.class_name, run.host_class, stored[0])
        return cells, samples, host_busy, _rollback_check(run, target, cells, store)


def _measure_cells(
    run: _Run,
    site: CellSite,
    stored: list[tuple[ArtifactSpec, str, Path]],
    plan: NumericsPlan,
) -> tuple[list[Cell], pa.Table, bool]:
    """Measure every artifact and judge its cell: ``(cells, raw samples, host busy)``."""
    wl = run.workload
    configs = [
        LatencyConfig(b, c, dims_text(dims))
        for dims in wl.dim_points
        for b in wl.batch_sizes
        for c in wl.concurrency
    ]
    measured = measure_interleaved(
        run,
        stored,
        configs,
        soak_seconds=run.options.soak_s,
        open_loop_spec=wl.open_loop or (OpenLoop() if run.options.open_loop else None),
    )
    numerics = RunNumerics(plan, load=_load_outputs)
    numerics.run_passes(
        _parity_jobs(run, stored, measured.outcomes),
        timeout_s=run.host_class.budgets.timeout_s,
        parallel=run.cores,
        run=run.workers.emulated,
        on_event=run.on_event,
    )
    judging = _Judging(
        site,
        measured,
        numerics,
        roles_of(stored[0][2], wl),
        comparison_confidence(wl.confidence, len(configs)),
    )
    cells: list[Cell] = []
    tables: list[pa.Table] = []
    for index, (_, digest, _) in enumerate(stored):
        cells.append(_artifact_cell(run, judging, stored, index, run.now()))
        tables.extend(_sample_tables(digest, measured.evidence[index]))
    samples = pa.concat_tables(tables) if tables else empty_samples()
    return cells, samples, measured.host_busy


@dataclass(frozen=True)
class _Judging:
    """What turning the run's outcomes into cells needs beside the run itself."""

    site: CellSite
    measured: Measurements
    numerics: RunNumerics
    roles: dict[str, OutputRole]
    """Each output's batch axis and kind, for parity."""
    compared_at: float
    """The confidence each of the run's comparisons is made at."""


def _artifact_cell(
    run: _Run,
    judging: _Judging,
    stored: list[tuple[ArtifactSpec, str, Path]],
    index: int,
    measured_at: datetime,
) -> Cell:
    """Artifact ``index``'s judged cell, with what the run's output says of it."""
    spec, digest, _ = stored[index]
    role: Role = "baseline" if index == 0 else "candidate"
    measured = judging.measured
    outcome = measured.outcomes[index]
    outputs_path = run.work_root / f"a{index}" / "outputs.npz"
    parity, reasons, record = None, [], judging.numerics.plan.numerics()
    if role == "baseline":
        record = judging.numerics.baseline(outcome, outputs_path)
    elif outcome.error_code is None:
        project = run.loaded.project
        compare = _comparer(project, judging.roles, stored[0][1], spec.precision)
        found = judging.numerics.candidate(index, outputs_path, compare, spec.label)
        parity, record, reasons = found.parity, found.numerics, list(found.reasons)
        if found.said:
            run.on_event(found.said)
    latency = latency_of(measured, index, run.workload.confidence, judging.compared_at)
    evidence = Measured(
        latency=latency,
        parity=parity,
        reasons=reasons,
        numerics=record,
        soak=measured.soaks[index],
        open_loop=measured.open_loops[index],
    )
    artifact = Artifact(digest=digest, name=spec.label, role=role, precision=spec.precision)
    cell = cell_of(judging.site, artifact, outcome, measured_at, evidence)
    verdict, why = judge(cell, run.host_class)
    cell = cell.model_copy(update={"verdict": verdict, "reasons": why})
    run.on_event(f"{spec.label}: {verdict}" + "".join(f"; {r.code}" for r in why))
    for line in _cell_lines(cell, outcome):
        run.on_event(f"{spec.label}: {line}")
    return cell


def _record(
    run: _Run,
    cells: list[Cell],
    samples: pa.Table,
    host_busy: bool,
    rollback: RollbackCheck | None,
) -> RunOutcome:
    """The run's record; its bundle written, then the matrix (one transaction)."""
    record = RunRecord(
        run_id=run.run_id,
        host_class=run.class_name,
        key=run.host_class.key,
        model=run.loaded.project.model,
        started_at=run.started,
        finished_at=run.now(),
        emulated=bool(run.mismatches),
        mismatches=run.mismatches,
        settings_digest=run.host_class.settings_digest(),
        fingerprint=run.fp,
        load_avg_before=run.load_before,
        load_avg_after=list(os.getloadavg()),
        rollback=rollback,
        host_busy=host_busy,
    )
    if host_busy:
        run.on_event(
            "host busy: the load average exceeded the usable cores while measuring; the "
            "interleaved rounds share the load, but the absolute figures are pessimistic"
        )
    bundle = RunBundle(run=record, cells=cells)
    bundle_path = write_bundle(bundle, samples, _bundles_dir(run.options))
    run.on_event(f"bundle: {bundle_path}")
    options = run.options
    with Store.open(
        options.db_path, wait_s=options.lock_wait_s, on_wait=lock_wait_message(run.on_wait)
    ) as db:
        written = db.write_run(bundle, samples)
        record_view(db, run.loaded.project, run.loaded.sha256)
    run.on_event(f"matrix: {options.db_path}")
    return RunOutcome(bundle=bundle, bundle_path=bundle_path, written=written, samples=samples)


def _clean_after_kills(
    db_path: Path,
    db_dir: Path,
    bundles_dir: Path,
    wait_s: float,
    on_event: EventSink,
    on_wait: EventSink,
    model: str,
) -> None:
    """Refuse a matrix of another model line before anything is measured; then what runs that
    were killed left: their work folders and half-written bundles (removed), and whole bundles
    of this line they wrote but never recorded in the matrix (ingested now, or named). Bundles
    of other lines (another project's, sharing the folder) are left alone."""
    for where in (db_dir, bundles_dir):
        for path in remove_leftovers(where):
            on_event(f"removed {path.name}, left by a process that ended mid-way")
    if not db_path.exists():
        return
    try:
        names = sorted(
            p.name for p in bundles_dir.iterdir() if p.is_dir() and not p.name.startswith(".")
        )
    except OSError:
        names = []
    with Store.open(db_path, wait_s=wait_s, on_wait=lock_wait_message(on_wait), model=model) as db:
        for name in names:
            if db.has_run(name) or _line_of(bundles_dir / name) not in (model, None):
                continue
            try:
                report = ingest_bundles(db, [bundles_dir / name])
            except (BundleError, MatrixError) as exc:
                on_event(f"bundle {name} is not in the matrix and cannot be read ({exc})")
                continue
            if report.ingested:
                on_event(
                    f"recovered bundle {name}: a run wrote it but ended before recording it "
                    "in the matrix; it is recorded now"
                )


def _line_of(bundle: Path) -> str | None:
    """The model line a bundle's run is of; None when its run.json cannot be read (the ingest
    that follows says why)."""
    try:
        return read_run(bundle).run.model
    except MatrixError:
        return None


def _parity_jobs(
    run: _Run, stored: list[tuple[ArtifactSpec, str, Path]], outcomes: list[WorkerOutcome]
) -> list[tuple[WorkerJob, Path] | None]:
    """Each artifact's ``parity`` job for the emulated CPU, in ``a<i>/emulated``; None for one
    that failed natively (the same model and inputs ran there within the class's limits first:
    QEMU does not enforce the address-space limit)."""
    jobs: list[tuple[WorkerJob, Path] | None] = []
    for index, ((_, digest, path), outcome) in enumerate(zip(stored, outcomes, strict=True)):
        if outcome.error_code is not None:
            jobs.append(None)
            continue
        work = run.work_root / f"a{index}" / "emulated"
        work.mkdir(parents=True, exist_ok=True)
        jobs.append((run.job(path, digest, work, "parity"), work))
    return jobs


def _rollback_target(
    db_path: Path, class_name: str, host_class: HostClass, baseline: tuple[ArtifactSpec, str, Path]
) -> RollbackTarget:
    """What the class falls back to, from the latest manifest recorded in the matrix."""
    spec, digest, _ = baseline
    previous = None
    if db_path.exists():
        with Store.open(db_path, read_only=True) as db:
            previous = previous_manifest(db)
    return rollback_target(class_name, host_class, previous, (digest, spec.label))


def _rollback_check(
    run: _Run, target: RollbackTarget, cells: list[Cell], store: ArtifactStore
) -> RollbackCheck | None:
    """Prove the class's rollback artifact loads and runs one inference under this runtime;
    None when its bytes are not on this machine (nothing proven, nothing refuted)."""
    digest = target.digest
    label = f"rollback {target.name} ({(digest or '')[:19]})"
    if digest is None:
        run.on_event("rollback: the latest manifest names no rollback artifact; not checked")
        return None
    for cell in cells:
        if cell.artifact_digest == digest:
            # Measured in this very run: its outcome is the proof (or the refutation).
            said = "loads" if cell.error is None else "FAILED"
            run.on_event(f"{label}: measured in this run, {said}")
            if cell.error is None:
                return RollbackCheck(artifact_digest=digest, loaded=True)
            return RollbackCheck(artifact_digest=digest, loaded=False, error=cell.error)
    if not store.path_of(digest).exists():
        run.on_event(
            f"{label}: not in the artifact store {store.root}, so not checked; add it to the "
            "project's candidates (or copy it into the store) to prove it loads"
        )
        return None
    try:
        path = store.verify(digest)
    except Exception as exc:
        run.on_event(f"{label}: FAILED: {exc}")
        return RollbackCheck(artifact_digest=digest, loaded=False, error=str(exc))
    work = run.work_root / "rollback"
    work.mkdir()
    job = run.job(path, digest, work, "check")
    outcome = run.workers.run(job, work, timeout_s=run.host_class.budgets.timeout_s)
    if outcome.error_code:
        run.on_event(f"{label}: FAILED: {outcome.error_code}")
        return RollbackCheck(
            artifact_digest=digest,
            loaded=False,
            error=f"{outcome.error_code}: {outcome.error_message}",
        )
    run.on_event(f"{label}: loads")
    return RollbackCheck(artifact_digest=digest, loaded=True)
