"""Numerics of hosts you do not have: a class's parity on an emulated CPU of its own ISA.

onnxruntime picks its kernels for the CPU it runs on; under QEMU user-mode emulation that CPU is
the one QEMU presents, so the parity outputs computed there are those of that CPU's kernels,
exactly, on any host. Latency, memory and init under emulation are QEMU's, never the class's:
this module computes parity outputs only.

Owns deciding, per run, how a class's numerics are obtained (`plan_numerics`: natively, on the
emulated CPU `schemas.emulation.cpu_for` or the class's ``emulation.cpu`` names, or on this host
as another ISA's, with the reason), finding QEMU and its version, the launch of the parity child
under QEMU (a `qualify.measure.runner.Launch`), and running the parity passes (`emulated_passes`).
Does not assemble runtimes for another architecture (`qualify.measure.sysroot`) and does not compare
outputs (`qualify.measure.parity`).
"""

from __future__ import annotations

import fnmatch
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from qualify.measure.fingerprint import isa_mismatch
from qualify.measure.job import WorkerJob
from qualify.measure.runner import Launch, WorkerOutcome, run_worker
from qualify.measure.sysroot import (
    FOREIGN,
    SysrootError,
    find_runtime,
    prepare_runtime,
    runtimes_in,
    verify_runtime,
)
from schemas.atomic import write_atomic
from schemas.cell import Numerics, NumericsSource
from schemas.emulation import (
    CPU_MODELS,
    NATIVE,
    CpuModel,
    PreparedRuntime,
    cpu_for,
    kernel_flags,
)
from schemas.host import Fingerprint
from schemas.project import HostClass

if TYPE_CHECKING:
    from schemas.output import ClassEmulation, EmulatorsShow

__all__ = [
    "Emulators",
    "NumericsPlan",
    "class_cpu",
    "emulated_passes",
    "emulator_status",
    "plan_numerics",
    "prepare_for_class",
    "prepared_runtimes",
    "qemu_version",
    "status_lines",
]

_QEMU_VERSION = re.compile(r"version (\d+\.\d+(?:\.\d+)?)")


def qemu_version(qemu: str) -> str | None:
    """``7.2.22`` from ``qemu-aarch64-static --version``; None when it does not say."""
    try:
        proc = subprocess.run(
            [qemu, "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = _QEMU_VERSION.search(proc.stdout)
    return found.group(1) if found else None


def _find_qemu(arch: str) -> str | None:
    for name in (f"qemu-{arch}-static", f"qemu-{arch}"):
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass(frozen=True)
class Emulators:
    """Where a run finds QEMU and prepared runtimes: the seam tests replace."""

    find_qemu: Callable[[str], str | None] = _find_qemu
    """QEMU user-mode emulator for an architecture (``qemu-<arch>-static`` on PATH)."""
    version: Callable[[str], str | None] = qemu_version
    runtime_dirs: tuple[Path, ...] = ()
    """Where prepared runtimes for other architectures are looked for (`qualify.measure.sysroot`)."""
    host_arch: str = field(default_factory=platform.machine)
    force: bool = False
    """Emulate even where this host presents exactly the emulated CPU's kernel flags (where a
    run otherwise computes the class's numbers natively, as faithfully and far faster)."""


@dataclass(frozen=True)
class NumericsPlan:
    """How one run computes the class's numerics."""

    source: NumericsSource
    arch: str
    cpu: str | None = None
    qemu: str | None = None
    runtime_version: str | None = None
    note: str | None = None
    launch: Launch | None = None
    """How to start the parity child under QEMU; None when the numerics are computed natively."""
    isa_mismatch: list[str] = field(default_factory=list)
    """How the measuring host's ISA differs from the class's, when the numerics are native."""

    def numerics(
        self, *, note: str | None = None, native_max_abs: dict[str, float] | None = None
    ) -> Numerics:
        """The cell's record of it (``note`` adds what failed in this cell's pass)."""
        said = "; ".join(n for n in (self.note, note) if n) or None
        return Numerics(
            source=self.source,
            arch=self.arch,
            cpu=self.cpu,
            qemu=self.qemu,
            runtime_version=self.runtime_version,
            note=said,
            native_max_abs=native_max_abs,
        )

    @property
    def line(self) -> str:
        """One line for the run's output."""
        if self.source == "emulated":
            return (
                f"numerics: emulated {self.cpu} ({self.arch}, QEMU {self.qemu}, onnxruntime "
                f"{self.runtime_version}); latency, memory and init are this host's"
            )
        head = "numerics from another ISA: " + "; ".join(self.isa_mismatch)
        text = head if self.source == "other_isa" else "numerics: this host's, a host of the class"
        return text + (f" (not emulated: {self.note})" if self.note else "")


def _native(fp: Fingerprint, host_class: HostClass, note: str | None) -> NumericsPlan:
    """Numerics computed on this host; ``note``: why not on the class's emulated CPU although
    --emulate asked (kept also where this host is of the class: it may present more of the ISA
    than the class's least capable hosts)."""
    other = isa_mismatch(fp, host_class)
    return NumericsPlan(
        source="other_isa" if other else "native",
        arch=fp.arch,
        note=note,
        isa_mismatch=other,
    )


def plan_numerics(
    fp: Fingerprint,
    host_class: HostClass,
    class_name: str,
    emulate: bool,
    emulators: Emulators,
    work: Path,
) -> NumericsPlan:
    """How this run computes the class's parity outputs.

    Without ``emulate``, natively (as another ISA's where the host's is not the class's). With
    it, on the class's emulated CPU when this host's kernel-relevant CPU flags differ from that
    CPU's; natively with a note saying why when there is no such CPU, QEMU is missing, or no
    runtime is prepared for another architecture.

    Args:
        work: a folder for the run's own files (a same-architecture ARM CPU's cpuinfo).

    Raises:
        SysrootError: a prepared runtime exists but is broken or was changed.
    """
    if not emulate:
        return _native(fp, host_class, None)
    chosen, why = class_cpu(host_class)
    if chosen is None:
        return _native(fp, host_class, why)
    model = CPU_MODELS[chosen]
    same = fp.arch == model.arch and kernel_flags(fp.arch, fp.cpu_flags) == model.flags
    if same and not emulators.force:
        return _native(fp, host_class, None)  # this host presents exactly that CPU's kernels
    qemu = emulators.find_qemu(model.arch)
    if qemu is None:
        return _native(
            fp,
            host_class,
            f"no QEMU for {model.arch} (qemu-{model.arch}-static) on PATH to emulate "
            f"{model.name}; Fix: apt-get install qemu-user-static",
        )
    version = emulators.version(qemu) or "unknown"
    if model.arch == emulators.host_arch:
        launch = _same_arch(qemu, model, work)
        runtime = fp.runtime.version
    else:
        found = _foreign(fp, host_class, class_name, model, qemu, emulators)
        if isinstance(found, str):
            return _native(fp, host_class, found)
        launch, runtime = found
    return NumericsPlan(
        source="emulated",
        arch=model.arch,
        cpu=model.name,
        qemu=version,
        runtime_version=runtime,
        launch=launch,
    )


def _same_arch(qemu: str, model: CpuModel, work: Path) -> Launch:
    """This interpreter under QEMU with ``model``; an ARM CPU also gets its own cpuinfo (the
    host's names features QEMU's CPU lacks, and onnxruntime would run them: SIGILL)."""
    argv = [qemu, "-cpu", model.name]
    if model.cpuinfo:
        prefix = work / f"cpu-{model.name}"
        (prefix / "proc").mkdir(parents=True, exist_ok=True)
        write_atomic(prefix / "proc" / "cpuinfo", model.cpuinfo)
        argv += ["-L", str(prefix)]
    return Launch(argv=(*argv, sys.executable, "-m", "qualify.measure.worker"), env={})


def _foreign(
    fp: Fingerprint,
    host_class: HostClass,
    class_name: str,
    model: CpuModel,
    qemu: str,
    emulators: Emulators,
) -> tuple[Launch, str] | str:
    """The launch on a runtime prepared for another architecture, or why there is none."""
    fix = f"qualify emulators prepare --class {class_name}"
    if model.arch not in FOREIGN:
        return f"no runtime can be prepared for {model.arch} on this {emulators.host_arch} host"
    found = find_runtime(emulators.runtime_dirs, model.arch, host_class.runtime, fp.runtime.version)
    if found is None:
        looked = ", ".join(str(d) for d in emulators.runtime_dirs) or "nowhere"
        return (
            f"no {model.arch} runtime with {host_class.runtime.package} "
            f"{host_class.runtime.version} is prepared (looked in {looked}); Fix: {fix}"
        )
    path, doc = found
    verify_runtime(path, doc, f"{fix} (it replaces the runtime)")
    root = str(Path(__file__).resolve().parents[2])
    launch = Launch(
        argv=(
            qemu,
            "-cpu",
            model.name,
            "-L",
            str(path / "cpu" / model.name),
            str(path / "root" / "usr" / "bin" / f"python{doc.python}"),
            "-m",
            "qualify.measure.worker",
        ),
        env={
            # The guest's /usr is the prefix's (QEMU looks absolute paths up there first).
            "PYTHONHOME": "/usr",
            "PYTHONPATH": os.pathsep.join((root, str(path / "site"))),
            "PYTHONNOUSERSITE": "1",
            "LD_LIBRARY_PATH": None,
            "LD_PRELOAD": None,
            "PYTHONSTARTUP": None,
        },
    )
    return launch, doc.onnxruntime


def emulated_passes(
    launch: Launch,
    jobs: Sequence[tuple[WorkerJob, Path] | None],
    *,
    timeout_s: float,
    parallel: int,
    run: Callable[..., WorkerOutcome] = run_worker,
) -> list[WorkerOutcome | None]:
    """Run each artifact's parity pass under QEMU, ``parallel`` at a time (nothing is timed:
    emulated figures are not the class's, so they may share the cores).

    Args:
        jobs: per artifact, its ``parity`` job and folder; None for one not to run.
        run: how a child is run (`qualify.measure.runner.run_worker`; a scripted one in tests).

    Returns:
        Per artifact, how its pass ended; None where no job was given.
    """

    def one(item: tuple[WorkerJob, Path] | None) -> WorkerOutcome | None:
        if item is None:
            return None
        job, work = item
        return run(job, work, timeout_s=timeout_s, launch=launch)

    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        return list(pool.map(one, jobs))


def class_cpu(host_class: HostClass) -> tuple[str | None, str]:
    """The class's emulated CPU: its ``emulation.cpu``, else the table's (`cpu_for`), or None
    and why there is none."""
    chosen = host_class.emulation.cpu if host_class.emulation is not None else None
    if chosen == NATIVE:
        return None, "emulation.cpu is native"
    if chosen is not None:
        return chosen, "emulation.cpu in the project file"
    return cpu_for(host_class.match.model_dump())


def _pinned(host_class: HostClass, host_version: str, given: str | None) -> str:
    """The onnxruntime version to prepare: ``given``, else this host's when the class's pattern
    takes it, else the pattern itself when it names one version."""
    pattern = host_class.runtime.version
    if given is not None:
        if not fnmatch.fnmatchcase(given, pattern):
            raise SysrootError(
                f"--onnxruntime {given} is not the class's runtime.version {pattern!r}"
            )
        return given
    if fnmatch.fnmatchcase(host_version, pattern):
        return host_version
    if re.fullmatch(r"\d+(\.\d+)+", pattern):
        return pattern
    raise SysrootError(
        f"the class's runtime.version is {pattern!r} and this host has onnxruntime "
        f"{host_version}; Fix: pass --onnxruntime with the exact version to prepare"
    )


def prepare_for_class(
    host_class: HostClass,
    into: Path,
    *,
    host_version: str,
    numpy_version: str,
    onnxruntime: str | None = None,
    host_arch: str | None = None,
    prepare: Callable[..., Path] = prepare_runtime,
    on_event: Callable[[str], None] = lambda _m: None,
    force: bool = False,
) -> Path | None:
    """Prepare what ``--emulate`` needs for a class: the runtime for its emulated CPU's
    architecture, pinned to the class's onnxruntime. None when nothing is needed (no emulated
    CPU, or one of this host's own architecture: QEMU runs this interpreter).

    Raises:
        SysrootError: the class's runtime cannot be prepared, or the download failed.
    """
    cpu, why = class_cpu(host_class)
    if cpu is None:
        on_event(f"nothing to prepare: {why}")
        return None
    arch = CPU_MODELS[cpu].arch
    if arch == (host_arch or platform.machine()):
        on_event(
            f"nothing to prepare: {cpu} is an {arch} CPU, and QEMU runs this host's own Python "
            "under it (it needs only qemu-user-static)"
        )
        return None
    if host_class.runtime.package != "onnxruntime":
        raise SysrootError(
            f"the class's runtime is {host_class.runtime.package}; a runtime for {arch} can be "
            "prepared for the onnxruntime package (CPU) only"
        )
    version = _pinned(host_class, host_version, onnxruntime)
    return prepare(arch, version, numpy_version, into, on_event=on_event, force=force)


def emulator_status(classes: Mapping[str, HostClass], emulators: Emulators) -> EmulatorsShow:
    """What ``qualify emulators show`` says (``--json`` prints it): QEMU per architecture, each
    prepared runtime, and per class its emulated CPU and whether ``--emulate`` has what it needs
    here (a prepared runtime is verified against its recorded digest).

    Raises:
        SysrootError: a prepared runtime cannot be read or fails its verification.
    """
    from schemas.output import EmulatorsShow, QemuFound, RuntimeFound

    qemu = []
    for arch in sorted({m.arch for m in CPU_MODELS.values()}):
        found = emulators.find_qemu(arch)
        qemu.append(
            QemuFound(arch=arch, path=found, version=emulators.version(found) if found else None)
        )
    runtimes = [
        RuntimeFound(folder=str(folder), name=path.name, runtime=doc)
        for folder in emulators.runtime_dirs
        for path, doc in prepared_runtimes(folder)
    ]
    shown = [_class_emulation(name, c, emulators) for name, c in classes.items()]
    return EmulatorsShow(qemu=qemu, runtimes=runtimes, classes=shown)


def _class_emulation(name: str, host_class: HostClass, emulators: Emulators) -> ClassEmulation:
    """One class's emulated CPU and whether ``--emulate`` has what it needs here."""
    from schemas.output import ClassEmulation

    cpu, why = class_cpu(host_class)
    if cpu is None:
        return ClassEmulation(
            host_class=name, cpu=None, level=None, why=why, runtime=None, ready=False, fix=None
        )
    model = CPU_MODELS[cpu]
    runtime, fix = None, None
    if model.arch != emulators.host_arch:  # else: this host's Python under QEMU
        fix = f"qualify emulators prepare --class {name}"
        found = find_runtime(emulators.runtime_dirs, model.arch, host_class.runtime, prefer=None)
        if found is not None:
            verify_runtime(found[0], found[1], fix)
            runtime, fix = str(found[0]), None
    return ClassEmulation(
        host_class=name,
        cpu=cpu,
        level=model.level,
        why=why,
        runtime=runtime,
        ready=fix is None,
        fix=fix,
    )


def status_lines(classes: Mapping[str, HostClass], emulators: Emulators) -> list[str]:
    """What ``qualify emulators show`` prints: `emulator_status` in words."""
    status = emulator_status(classes, emulators)
    lines = []
    for q in status.qemu:
        where = f"{q.path} (QEMU {q.version or 'unknown'})" if q.path else "not found"
        lines.append(f"qemu {q.arch}: {where}")
    folder = None
    for found in status.runtimes:
        if found.folder != folder:
            folder = found.folder
            lines.append(f"runtimes in {folder}:")
        doc = found.runtime
        lines.append(
            f"  {found.name}: Python {doc.python} (Debian {doc.debian_suite}), onnxruntime "
            f"{doc.onnxruntime}, numpy {doc.numpy}, prepared {doc.prepared_at}"
        )
    for c in status.classes:
        if c.cpu is None:
            lines.append(f"{c.host_class}: no emulated CPU ({c.why})")
            continue
        head = f"{c.host_class}: {c.cpu}, {c.level} ({c.why})"
        if c.runtime is not None:
            lines.append(f"{head}: runtime {c.runtime} (verified)")
        elif c.ready:
            lines.append(f"{head}: this host's Python under QEMU")
        else:
            lines.append(f"{head}: no {CPU_MODELS[c.cpu].arch} runtime prepared; Fix: {c.fix}")
    return lines


def prepared_runtimes(folder: Path) -> list[tuple[Path, PreparedRuntime]]:
    """Every prepared runtime in an emulators folder (unreadable ones raise `SysrootError`)."""
    return [found for arch in sorted(FOREIGN) for found in runtimes_in(folder, arch)]
