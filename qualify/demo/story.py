"""The embedded demo: a real model, a real int8 candidate, four host classes, one command.

Owns laying out a demo workdir (models and recorded inputs copied from the package, a
``qualify.yaml`` written for this host's onnxruntime) and running the main job end to end:
every class qualified (emulated where this host is not of the class), then the matrix printed.
It builds nothing at run time and downloads nothing.

A demo is one story in one folder (`prepare_workdir`): it starts only in a missing or empty
folder, and marks it as a demo's (`MARKER`) before writing anything else. Run again over it,
it refuses (two stories mixed: telemetry counted twice, versions carried on, the rollout log
interleaved) unless told ``force``, which deletes what a demo writes there (`DEMO_ENTRIES`) and
starts clean; a folder without the marker, or holding anything else, is never cleaned.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from qualify.demo.assets import asset_path
from qualify.measure.runner import probe_runtime
from qualify.project.load import LoadedProject
from schemas.atomic import write_atomic
from schemas.cell import Cell
from schemas.manifest import Manifest
from schemas.project import (
    Artifacts,
    ArtifactSpec,
    Budgets,
    HostClass,
    HostClassKey,
    InputSpec,
    MatchRules,
    Pipeline,
    Policy,
    Project,
    ProviderSpec,
    RuntimeSpec,
    Workload,
)

__all__ = [
    "DEMO_ENTRIES",
    "MARKER",
    "demo_project",
    "lay_out",
    "numerics_line",
    "prepare_workdir",
    "run_demo",
]

Echo = Callable[[str], None]


SLOWDOWN = 2.0
"""``max_slowdown`` of the demo's CPU classes. On a 64-input MLP, dynamic int8 is not faster per
inference than fp32: quantizing each activation costs more than the tiny GEMMs save (the
interleaved A/B measured p50 1.2 to 1.4 times fp32's on a 2-core Xeon). The demo accepts up to
twice the baseline's latency so that its story is about parity, placement and rollout; a real
project sets the slowdown its users can take (the default 1.0: not measurably slower)."""

ROLLOUT_TOLERANCE = round(SLOWDOWN * 1.2 - 1, 6)
"""``qualify rollout advance --tolerance`` in the demo's rollouts (1.4): a canary running int8 may
show a p99 up to ``SLOWDOWN`` times the rest of its class's (which runs fp32), with the check's
usual 20% slack on top. With the default 0.2, the rollout of a candidate that the class accepted
at 1.3 times the baseline's latency halts as "slower than the rest" wherever int8 measures that
much slower, and completes where it does not: the story would depend on the CPU and its load."""


MARKER = ".qualify-demo"
"""Written first into a demo's folder: what ``--force`` looks for before it deletes anything."""

DEMO_ENTRIES = frozenset(
    {
        MARKER,
        "qualify.yaml",
        "prep.py",
        "models",
        "data",
        "qualify.duckdb",
        "qualify.duckdb.wal",
        "artifacts",
        "bundles",
        "release.key",
        "release.pub",
        "manifest.json",
        "manifest.draft.json",
        "manifest.d",
        "hosts",
        "telemetry.jsonl",
        "rollout-telemetry",
        "report.html",
        "__pycache__",
    }
)
"""Every name a demo writes at the top of its folder (and the README's commands there add to):
``--force`` deletes these and nothing else."""

RELEASED_AGO = timedelta(hours=3)
"""How long before the demo ends its release is dated: its rollouts take the time since."""


def demo_project(ort_version: str) -> Project:
    """The demo's project: the digits MLP (fp32 baseline, int8 candidate) on four classes.

    Args:
        ort_version: this host's onnxruntime version; the classes' runtime pattern is its
            ``major.minor.*`` so the runtime identity check is real, not waived.
    """
    major_minor = ".".join(ort_version.split(".")[:2]) + ".*"
    return Project(
        model="digits-mlp",
        artifacts=Artifacts(
            baseline=ArtifactSpec(
                path="models/digits-mlp-fp32.onnx", name="fp32", precision="fp32"
            ),
            candidates=[
                ArtifactSpec(
                    path="models/digits-mlp-int8.onnx",
                    name="int8",
                    precision="int8",
                    derived_from="fp32",
                    how="onnxruntime.quantization (see qualify/demo/assets/README.md)",
                )
            ],
        ),
        workload=_demo_workload(),
        policy=Policy(unknown_class="hold", allow_emulated=True),
        host_classes=_demo_classes(major_minor),
    )


def _demo_workload() -> Workload:
    return Workload(
        # Raw 0..16 pixel counts, as a scanner hands them over; the service scales them the
        # way the model was trained (prep.py), and that step is timed with the model.
        inputs={
            "pixels": InputSpec(
                shape=[1, 64], dtype="uint8", source="recorded", file="data/digits_counts.npy"
            )
        },
        pipeline=Pipeline(pre="prep:scale"),
        batch_sizes=[1],
        concurrency=[1, 2],
        # 64 rows, not more: under --emulate each class's parity passes run on QEMU, where
        # the fp32 baseline's FMA kernels take ~0.1 s a row on an emulated Haswell.
        parity_samples=64,
        time_cap_s=10.0,
        throughput_s=0.5,
        postprocess="argmax",
    )


def _demo_classes(major_minor: str) -> dict[str, HostClass]:
    runtime = RuntimeSpec(package="onnxruntime", version=major_minor)
    cpu2 = ProviderSpec(execution_providers=["CPUExecutionProvider"], intra_op_threads=2)
    cpu1 = ProviderSpec(execution_providers=["CPUExecutionProvider"], intra_op_threads=1)
    return {
        "arm-r5": HostClass(
            key=HostClassKey(hardware="arm-r5", runtime="ort-r8", provider="cpu-int8"),
            match=MatchRules(arch="aarch64", cpu_flags=["asimddp"]),
            runtime=runtime,
            provider=cpu2,
            budgets=Budgets(p99_ms=82, peak_rss_mb=512, cold_init_ms=1500, max_slowdown=SLOWDOWN),
        ),
        "x86-v4": HostClass(
            key=HostClassKey(hardware="x86-v4", runtime="ort-r8", provider="cpu-int8"),
            match=MatchRules(arch="x86_64", cpu_flags=["avx512f", "avx512_vnni"]),
            runtime=runtime,
            provider=cpu2,
            budgets=Budgets(p99_ms=20, peak_rss_mb=512, cold_init_ms=1500, max_slowdown=SLOWDOWN),
        ),
        "x86-v3-1t": HostClass(
            key=HostClassKey(hardware="x86-v3", runtime="ort-r8", provider="cpu-1thread"),
            match=MatchRules(arch="x86_64", cpu_flags=["avx2", "fma"]),
            runtime=runtime,
            provider=cpu1,
            budgets=Budgets(p99_ms=20, peak_rss_mb=512, cold_init_ms=1500, max_slowdown=SLOWDOWN),
        ),
        "gpu-t4": HostClass(
            key=HostClassKey(hardware="gpu-t4", runtime="ort-r8-cuda", provider="cuda-fp32"),
            match=MatchRules(arch="x86_64", accelerator="CUDAExecutionProvider"),
            runtime=RuntimeSpec(package="onnxruntime-gpu", version=major_minor),
            provider=ProviderSpec(
                execution_providers=["CUDAExecutionProvider", "CPUExecutionProvider"],
                expected="CUDAExecutionProvider",
            ),
            budgets=Budgets(p99_ms=20, peak_rss_mb=2048, cold_init_ms=5000),
        ),
    }


ASSETS = {
    "models/digits-mlp-fp32.onnx": "digits-mlp-fp32.onnx",
    "models/digits-mlp-int8.onnx": "digits-mlp-int8.onnx",
    "data/digits_inputs.npy": "digits_inputs.npy",
    "data/digits_labels.npy": "digits_labels.npy",
}


PREP = '''"""The demo service's pre-processing: raw 0..16 pixel counts to the model's input."""

import numpy as np


def scale(feed):
    """The digits model was trained on counts divided by 16, as float32."""
    return {"pixels": feed["pixels"].astype(np.float32) / np.float32(16.0)}
'''
"""``prep.py`` of the demo workdir: the ``workload.pipeline.pre`` hook."""


def prepare_workdir(workdir: Path, *, force: bool = False) -> list[str]:
    """Make ``workdir`` ready for a new demo and mark it as a demo's.

    A missing or empty folder is used as it is. A folder that holds anything is refused unless
    ``force``; with it, a folder a demo marked and that holds nothing but what a demo writes is
    emptied of those entries (symbolic links are removed, never followed).

    Returns:
        The entries deleted, sorted (empty when the folder was new or empty).

    Raises:
        QualifyError: the folder is not empty and ``force`` is off; or, with ``force``, it was
            not a demo's (no `MARKER`) or holds entries a demo does not write (named).
    """
    from qualify.errors import QualifyError

    if workdir.exists() and not workdir.is_dir():
        raise QualifyError(f"--workdir {workdir}: not a folder; choose another --workdir")
    present = sorted(p.name for p in workdir.iterdir()) if workdir.exists() else []
    if present and not force:
        shown = ", ".join(present[:6]) + (", ..." if len(present) > 6 else "")
        raise QualifyError(
            f"--workdir {workdir} is not empty ({shown}): a demo over another mixes two stories "
            "(telemetry counted twice, manifest versions carried on, the rollout log "
            "interleaved). Pass --force to delete the earlier demo and start clean, or choose "
            "another --workdir"
        )
    if present and MARKER not in present:
        raise QualifyError(
            f"--workdir {workdir} holds files no demo marked as its own ({MARKER} is missing): "
            "--force deletes only a demo's folder; choose another --workdir (or delete an "
            "old demo's folder yourself)"
        )
    foreign = [name for name in present if name not in DEMO_ENTRIES]
    if foreign:
        raise QualifyError(
            f"--workdir {workdir} holds files a demo does not write ({', '.join(foreign[:6])}): "
            "--force deletes only what a demo wrote; move them, or choose another --workdir"
        )
    for name in present:
        entry = workdir / name
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    workdir.mkdir(parents=True, exist_ok=True)
    write_atomic(workdir / MARKER, "written by qualify demo: --force may delete this folder\n")
    return present


def lay_out(workdir: Path) -> Path:
    """Copy the packaged model and data into ``workdir`` and write ``qualify.yaml``.

    Returns:
        The project file path.
    """
    from qualify.project.load import write_project

    workdir.mkdir(parents=True, exist_ok=True)
    for rel, name in ASSETS.items():
        target = workdir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(asset_path(name), target)
    # The recorded inputs are the counts already divided by 16 (exactly: 16 * x is an integer).
    import numpy as np

    scaled = np.load(workdir / "data/digits_inputs.npy")
    counts = np.rint(scaled * 16).astype(np.uint8)
    np.save(workdir / "data/digits_counts.npy", counts)
    write_atomic(workdir / "prep.py", PREP)
    runtime = probe_runtime()
    project_path = workdir / "qualify.yaml"
    write_project(demo_project(str(runtime["version"])), project_path)
    return project_path


def _resolve_as_host(
    workdir: Path,
    name: str,
    host_class: HostClass,
    runtime_version: str,
    *,
    manifest: Path | None = None,
    host_id: str | None = None,
) -> tuple[int, dict[str, object], str]:
    """Run the real ``resolve-artifact`` as a host of ``name`` would (its runtime package and
    providers; ``host_id`` places it in or out of a rollout's cohort, with its own state),
    against the demo's signed manifest (or ``manifest``).

    Returns:
        The exit code, the ``--json`` answer (empty when it printed none) and the last line it
        wrote to stderr.
    """
    import json
    import subprocess
    import sys

    cmd = [
        sys.executable,
        "-m",
        "manifest.resolve",
        "--manifest",
        str(manifest or workdir / "manifest.json"),
        "--pubkey",
        str(workdir / "release.pub"),
        "--state-dir",
        str(workdir / "hosts" / (host_id or name)),
        "--host-class",
        name,
        "--runtime",
        f"{host_class.runtime.package}=={runtime_version}",
        "--providers",
        ",".join(host_class.provider.execution_providers),
        "--json",
        *(["--host-id", host_id] if host_id else []),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=60)
    answer: dict[str, object] = json.loads(proc.stdout) if proc.stdout.strip() else {}
    said = proc.stderr.strip().splitlines()
    return proc.returncode, answer, said[-1] if said else ""


def run_demo(workdir: Path, *, echo: Echo = print, force: bool = False) -> bool:
    """Lay out the demo, qualify every class, sign a manifest, resolve every class, report.

    Args:
        workdir: The demo's folder: missing or empty, or with ``force`` an earlier demo's
            (`prepare_workdir`).
        echo: Prints a line.
        force: Delete an earlier demo in ``workdir`` first.

    Returns:
        True when every cell was measured (no ``error`` verdicts).

    Raises:
        QualifyError: ``workdir`` is not one a demo may use (see `prepare_workdir`).
    """
    import sys

    from matrix.store import Store
    from qualify.project.load import load_project
    from qualify.release.current import show_now
    from qualify.run import RunOptions, qualify_run
    from qualify.table import TITLE_NOW, matrix_table, use_color

    cleaned = prepare_workdir(workdir, force=force)
    if cleaned:
        echo(f"--force: deleted the earlier demo in {workdir} ({len(cleaned)} entries)")
    project_path = lay_out(workdir)
    echo(f"demo project: {project_path}")
    loaded = load_project(project_path)
    db_path = workdir / "qualify.duckdb"
    ok = True
    runtime_version = ""
    cells: dict[str, list[Cell]] = {}
    for name in loaded.project.host_classes:
        echo(f"\n== qualify run --host-class {name} --emulate")
        outcome = qualify_run(
            loaded,
            name,
            RunOptions(db_path=db_path, emulate=True),
            on_event=lambda m: echo("  " + m),
        )
        runtime_version = outcome.bundle.run.fingerprint.runtime.version
        cells[name] = outcome.bundle.cells
        ok = ok and outcome.ok
    with Store.open(db_path) as db:
        rows = show_now(loaded, db).rows  # what qualify matrix show prints
    echo("")
    table = matrix_table(rows, color=echo is print and use_color(sys.stdout), title=TITLE_NOW)
    echo(table.rstrip("\n"))
    echo("\n== numerics: each class's int8 parity, and the CPU whose kernels computed it")
    for name, measured in cells.items():
        echo(f"  {name}: {numerics_line(measured, loaded.project.host_classes[name])}")
    _release(workdir, loaded, db_path, runtime_version, echo)

    exe = Path(sys.executable).parent / "qualify"
    command = str(exe.resolve()) if exe.exists() else "qualify"
    echo(
        f"\nNext: cd {workdir} && {command} matrix show   (the project file, matrix and manifest "
        "are found there by default; open report.html in a browser)"
    )
    return ok


def numerics_line(cells: list[Cell], host_class: HostClass) -> str:
    """How a class's candidate parity was computed, and this host's own figure beside an
    emulated one: ``max abs 0.0306 on an emulated neoverse-n1 (QEMU 7.2.22); this host:
    0.0303``."""
    cand = next((c for c in cells if c.role == "candidate"), None)
    if cand is None or cand.parity is None or cand.numerics is None:
        why = cand.reasons[0].message if cand is not None and cand.reasons else "not measured"
        return f"no parity ({why})"
    worst = max((o.max_abs for o in cand.parity.outputs if o.max_abs is not None), default=None)
    figure = "max abs ?" if worst is None else f"max abs {worst:.4g}"
    n = cand.numerics
    if n.source == "emulated":
        here = max(n.native_max_abs.values()) if n.native_max_abs else None
        beside = "" if here is None else f"; this host natively: {here:.4g}"
        return f"{figure} on an emulated {n.cpu} ({n.arch}, QEMU {n.qemu}){beside}"
    if n.source == "other_isa":
        return f"{figure} on this host, numerics of another ISA ({n.note or 'not emulated'})"
    accelerator = host_class.match.accelerator
    if accelerator:
        return f"{figure} on this host's CPU, not on the class's {accelerator}"
    if n.note:
        return f"{figure} on this host, a host of the class (not emulated: {n.note})"
    return f"{figure} on this host, whose ISA is the class's"


def _release(
    workdir: Path, loaded: LoadedProject, db_path: Path, runtime_version: str, echo: Echo
) -> None:
    """Sign a manifest from the demo matrix, resolve every class as its hosts would, report."""
    from manifest.signing import generate_keypair
    from matrix.store import Store
    from qualify.release.generate import draft_manifest, publish_manifest
    from qualify.release.publishing import PublishOptions
    from qualify.reporting import write_qualification_report

    # The release and its day of telemetry end three hours ago, and the rollouts that answer
    # its alerts run since then: the whole story is in the past, as a check run now sees it.
    finished = datetime.now(UTC)
    now = finished - RELEASED_AGO
    key_path = workdir / "release.key"
    if not key_path.exists():
        generate_keypair("release", workdir)
    with Store.open(db_path) as db:
        draft = draft_manifest(
            loaded,
            db,
            release="digits-demo",
            out=workdir / "manifest.draft.json",
            now=now,
            expires_in=timedelta(days=30),
        )
        echo(
            f"\n== qualify manifest generate --release digits-demo\n  manifest.draft.json: "
            f"version {draft.version}, a draft (unsigned; no host or reader takes it as current)"
        )
        publish = PublishOptions(
            key_path=key_path,
            out=workdir / "manifest.json",
            now=now,
            expires_in=timedelta(days=30),
            per_class_dir=workdir / "manifest.d",
            who="demo",
            why="the demo's first release, from the matrix it just measured",
        )
        result = publish_manifest(db, publish, draft_path=workdir / "manifest.draft.json")
    signed = result.manifest.signed
    echo(
        f"== qualify manifest publish manifest.draft.json --key release.key --per-class "
        f"manifest.d\n  manifest.json: version {signed.version}, signed, "
        f"expires {signed.expires}; policy allow_emulated={signed.policy.allow_emulated} "
        "(the demo accepts emulated evidence, and says so here)"
    )
    _resolve_each(workdir, loaded, result.manifest, runtime_version, echo)
    _watch(workdir, loaded, db_path, result.manifest, now, runtime_version, echo)
    with Store.open(db_path, read_only=True) as db:
        path = write_qualification_report(
            loaded,
            db,
            workdir / "report.html",
            now=finished,
            manifest_path=workdir / "manifest.json",  # what the demo's hosts get, whatever the cwd
            pubkey=workdir / "release.pub",
        )
    echo(f"\n== qualify report\n  {path}")


def _resolve_each(
    workdir: Path, loaded: LoadedProject, manifest: Manifest, runtime_version: str, echo: Echo
) -> None:
    """resolve-artifact as a host of each class would run it, and what it was served."""
    echo("\n== resolve-artifact on a host of each class")
    for name, host_class in loaded.project.host_classes.items():
        code, answer, _ = _resolve_as_host(workdir, name, host_class, runtime_version)
        entry = manifest.signed.entries[name]
        served = answer.get("served", "artifact")
        chosen = entry.rollback if served == "rollback" else entry.artifact
        what = (
            f"runs {chosen.name} ({chosen.digest[:19]})"
            if chosen
            else "hold: its hosts keep what they run"
        )
        echo(f"  {name}: exit {code}: {what}. {entry.summary}")


def _watch(
    workdir: Path,
    loaded: LoadedProject,
    db_path: Path,
    manifest: Manifest,
    now: datetime,
    runtime_version: str,
    echo: Echo,
) -> None:
    """Sample telemetry from the fleet (with two injected problems), ingest it and check it;
    then act on the two alerts with staged rollouts (one promoted, one aborted)."""
    from matrix.store import Store
    from qualify.demo.rollout import run_demo_rollouts
    from qualify.demo.telemetry import run_demo_telemetry

    with Store.open(db_path, read_only=True) as db:
        cells = db.cells()
    echo("\n== qualify telemetry ingest telemetry.jsonl && qualify telemetry check")
    check = run_demo_telemetry(workdir, manifest, cells, now=now, echo=lambda m: echo("  " + m))
    kinds = {(a.kind, a.host_class) for a in check.alerts}
    healthy = next((c for k, c in sorted(kinds) if k == "provider_changed"), None)
    faulty = next((c for k, c in sorted(kinds) if k == "p99_regression"), None)
    echo(
        "\n== rollouts: both alerted classes go back to the baseline, then the candidate is "
        "rolled out again in steps, gated on what the canary's hosts report"
    )

    def resolve(path: Path, name: str, host: str) -> tuple[int, dict[str, object], str]:
        host_class = loaded.project.host_classes[name]
        return _resolve_as_host(
            workdir, name, host_class, runtime_version, manifest=path, host_id=host
        )

    run_demo_rollouts(
        workdir,
        loaded,
        db_path,
        healthy=healthy,
        faulty=faulty,
        now=now,
        resolve=resolve,
        tolerance=ROLLOUT_TOLERANCE,
        echo=lambda m: echo("  " + m),
    )
