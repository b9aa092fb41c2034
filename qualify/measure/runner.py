"""Parent side of the runner: one artifact in one fresh, watched subprocess.

Owns spawning ``python -m qualify.measure.worker``, its timeout, its peak RSS (``os.wait4``), the
artifact's digest checked around the child's load (`qualify.measure.digest`) and turning every way a
child ends (result, error, crash, hang, out of memory, a damaged result, modified bytes) into one
`WorkerOutcome`. It does not import onnxruntime and does not judge results.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from qualify.errors import QualifyError
from qualify.measure import contain
from qualify.measure.bytecode import cache_child_bytecode
from qualify.measure.digest import AFTER_LOADING, BEFORE_LOADING, mismatch
from qualify.measure.job import (
    RESULT_MOST_BYTES,
    FeedJob,
    ResultError,
    WorkerJob,
    WorkerResult,
)
from qualify.measure.procfs import hwm_kb
from qualify.measure.runtime_log import read_log
from schemas.cell import PeakRssSource

__all__ = [
    "SUBPROCESSES",
    "Launch",
    "RoundWorker",
    "ServedWorker",
    "WorkerOutcome",
    "Workers",
    "child_peak_rss_mb",
    "hwm_kb",
    "probe_runtime",
    "run_worker",
    "start_probe",
]

STDERR_TAIL = 2000
STDERR_KEPT = 64 * 1024
"""The most of a child's stderr the parent reads: its end (a hook may write gigabytes)."""
RESULT_GRACE_S = 10.0
"""How long a child that has written its result may take to exit before it is killed (a hook's
thread or process must not turn a finished measurement into a timeout)."""


@dataclass
class WorkerOutcome:
    """How one child process ended and what it reported."""

    result: WorkerResult
    """The child's result, typed; all defaults (``ok`` false) when it wrote none, or one that
    could not be read (then ``error_code`` says so)."""
    error_code: str | None
    """A REASON_CODES key when the artifact could not be measured, else None."""
    error_message: str | None
    peak_rss_mb: float | None
    """Peak RSS of the child; None when it cannot be told apart from the parent's (see
    ``child_peak_rss_mb``)."""
    exit_status: int | None
    signal_name: str | None
    wall_s: float
    peak_rss_source: PeakRssSource | None = None
    """How ``peak_rss_mb`` was measured: ``wait4``, ``vmhwm`` or ``vmhwm-before-kill``."""
    stderr: str = ""
    """The end of the child's stderr (`STDERR_KEPT` bytes at most)."""
    provider_log: list[tuple[str, int]] = field(default_factory=list)
    """onnxruntime's own warnings and errors from the child's whole stderr, each distinct
    message once with its count (`qualify.measure.runtime_log.read_log`)."""
    containment: str | None = None
    """How the child's descendants were contained (`qualify.measure.contain`): what the cell records."""
    stray_processes: int = 0
    """Processes the child left running that the parent killed once it had ended."""


@dataclass(frozen=True)
class Launch:
    """How a child starts when not as ``python -m qualify.measure.worker`` on this interpreter: the
    parity pass under an emulated CPU (`qualify.measure.emulators`)."""

    argv: tuple[str, ...]
    """The command before the job file's path (it ends ``-m qualify.measure.worker``)."""
    env: dict[str, str | None]
    """Changes to the child's environment: a value sets the variable, None removes it."""


def _child_env(tag: str | None = None, launch: Launch | None = None) -> dict[str, str]:
    cache_child_bytecode()
    env = dict(os.environ)
    if tag is not None:
        env[contain.TAG_ENV] = tag
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = (
        root + os.pathsep + env.get("PYTHONPATH", "") if env.get("PYTHONPATH") else root
    )
    env.setdefault("PYTHONHASHSEED", "0")
    for name, value in (launch.env if launch is not None else {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


_early_probe: subprocess.Popen[str] | None = None
"""The probe `start_probe` began, until `probe_runtime` collects it."""


def _spawn_probe() -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "qualify.measure.worker", "--probe"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_child_env(),
    )


def start_probe() -> None:
    """Begin probing onnxruntime in the background, so that the answer is ready by the time
    `probe_runtime` asks: ``qualify run`` starts it before loading the rest of itself and the
    project, and the probe's own interpreter start overlaps that. Calling it twice starts one
    probe; one never collected is stopped and reaped at exit."""
    global _early_probe
    if _early_probe is None:
        _early_probe = _spawn_probe()
        atexit.register(_stop_early_probe)


def _stop_early_probe() -> None:
    global _early_probe
    proc, _early_probe = _early_probe, None
    if proc is not None:
        with contextlib.suppress(OSError):
            proc.kill()
        proc.communicate()


def probe_runtime(timeout_s: float = 120.0) -> dict[str, Any]:
    """The host's onnxruntime identity, probed in a subprocess (the parent never imports ORT):
    the one `start_probe` began, if any, else a new one.

    Raises:
        QualifyError: onnxruntime is missing or broken on this host, or the probe hung.
    """
    global _early_probe
    proc, _early_probe = _early_probe, None
    if proc is None:
        proc = _spawn_probe()
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise QualifyError(
            f"probing onnxruntime on this host took over {timeout_s:g} s (python -m "
            "qualify.measure.worker --probe); the runtime hangs on import. Fix: check the installation "
            "(python -c 'import onnxruntime')."
        ) from None
    if proc.returncode != 0:
        tail = stderr.strip()[-STDERR_TAIL:]
        raise QualifyError(
            f"could not probe onnxruntime on this host (exit {proc.returncode}): {tail}. "
            "Fix: install onnxruntime into this environment (pip install onnxruntime)."
        )
    doc: dict[str, Any] = json.loads(stdout)
    return doc


def child_peak_rss_mb(
    ru_maxrss_kb: int, parent_hwm_kb: int | None, child_hwm_kb: int | None
) -> tuple[float | None, PeakRssSource | None]:
    """The child's peak RSS, honest about what Linux can tell.

    The child's own ``VmHWM`` comes first (its post-exec image, read by the child at exit or by
    the parent just before a timeout kill): the worker resets it after the warm-init session it
    creates only to time a second load, so it is the peak of *serving* the model, what a host
    would see. Else ``ru_maxrss`` from ``os.wait4``, which catches every peak but has Linux fold
    the pre-exec image in (a child forked from a 200 MB parent reports at least ~200 MB): only
    when it exceeds the parent's own peak (read after reaping; then it can only be the child's).
    Else None (not measurable).

    Returns:
        ``(peak MB or None, source)``.
    """
    if child_hwm_kb is not None:
        return child_hwm_kb / 1024.0, "vmhwm"
    if parent_hwm_kb is not None and ru_maxrss_kb > parent_hwm_kb:
        return ru_maxrss_kb / 1024.0, "wait4"
    if parent_hwm_kb is None:
        return ru_maxrss_kb / 1024.0, "wait4"
    return None, None


_tags: dict[int, str] = {}
"""The containment tag of each child spawned and not yet swept, by pid."""


def _spawn(
    job: WorkerJob | FeedJob,
    workdir: Path,
    pass_fds: tuple[int, ...] = (),
    launch: Launch | None = None,
) -> tuple[subprocess.Popen[bytes], Any, float]:
    workdir.mkdir(parents=True, exist_ok=True)
    job = dataclasses.replace(job, result_path=str(workdir / "result.json"), parent_pid=os.getpid())
    job_path = workdir / "job.json"
    job_path.write_text(job.to_json(), encoding="utf-8")
    out_path, err_path = workdir / "stdout.txt", workdir / "stderr.txt"
    feed = ["--feed"] if isinstance(job, FeedJob) else []
    tag = contain.new_tag()
    started = time.monotonic()
    with out_path.open("wb") as out, err_path.open("wb") as err:
        head = (
            launch.argv if launch is not None else (sys.executable, "-m", "qualify.measure.worker")
        )
        proc = subprocess.Popen(
            [*head, *feed, str(job_path)],
            stdin=subprocess.DEVNULL,  # the child's channel is its own pipe, never stdin
            stdout=out,
            stderr=err,
            env=_child_env(tag, launch),
            start_new_session=True,  # its own process group and session: see qualify.measure.contain
            pass_fds=pass_fds,
        )
    _tags[proc.pid] = tag
    return proc, job, started


def _contain(pid: int) -> int:
    """Kill whatever the ended child ``pid`` left running; how many processes that was."""
    tag = _tags.pop(pid, None)
    return contain.sweep(pid, tag) if tag is not None else 0


_strays: dict[int, int] = {}
"""Processes each reaped child left behind (killed by `_contain`), until `_outcome` reads it."""


def _reap(
    proc: subprocess.Popen[bytes],
    deadline: float,
    *,
    wait: bool = True,
    result_path: str | None = None,
) -> tuple[int, Any, bool, int | None] | None:
    """Wait for the child until ``deadline`` (monotonic), then kill its group; a child that has
    written ``result_path`` gets `RESULT_GRACE_S` more at most. Whatever it leaves running is
    killed once it has ended (`qualify.measure.contain.sweep`). Returns ``(status, rusage, timed_out,
    hwm read before the kill)``, or None if ``wait`` is False and it is still running."""
    graced = False
    while True:
        pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            _strays[proc.pid] = _contain(proc.pid)
            return status, rusage, False, None
        if not graced and result_path is not None and os.path.exists(result_path):
            graced = True
            deadline = min(deadline, time.monotonic() + RESULT_GRACE_S)
        if time.monotonic() > deadline:
            killed_hwm = hwm_kb(proc.pid)
            if not graced:
                _ask_for_stacks(proc.pid, result_path)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            pid, status, rusage = os.wait4(proc.pid, 0)
            _strays[proc.pid] = _contain(proc.pid)
            return status, rusage, not graced, killed_hwm
        if not wait:
            return None
        time.sleep(0.02)


STACKS_WAIT_S = 0.5
"""How long a child past its timeout gets to write its threads' stacks before it is killed."""


def _ask_for_stacks(pid: int, result_path: str | None) -> None:
    """Have the child write every thread's stack to its stderr (``faulthandler`` on SIGUSR1),
    so that a timeout can say where the user's code was (`_stuck_at`)."""
    if result_path is None:
        return
    err = Path(result_path).with_name("stderr.txt")
    try:
        size = err.stat().st_size
        os.kill(pid, signal.SIGUSR1)
    except OSError:
        return
    deadline, last = time.monotonic() + STACKS_WAIT_S, size
    while time.monotonic() < deadline:
        time.sleep(0.05)
        try:
            now = err.stat().st_size
        except OSError:
            return
        if size < now == last:  # written, and no longer growing
            return
        last = now


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<fn>\S+)', re.M)


def _stuck_at(stderr: str, hook_root: str) -> str | None:
    """Where the user's code was when the child was killed: the innermost frame in a file of
    the project's folder in the last stack dump on its stderr; None when there is none."""
    dump = stderr.rfind("most recent call first")
    if dump < 0:
        return None
    root = os.path.join(os.path.abspath(hook_root), "")
    for found in _FRAME.finditer(stderr, dump):
        if os.path.abspath(found["file"]).startswith(root):
            return f"{os.path.basename(found['file'])}:{found['line']} (in {found['fn']})"
    return None


def _stderr_tail(path: Path) -> str:
    """The last `STDERR_KEPT` bytes of the child's stderr file, as text."""
    try:
        with path.open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            fh.seek(max(0, size - STDERR_KEPT))
            data = fh.read(STDERR_KEPT)
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace")


def _read_result(path: Path) -> tuple[WorkerResult | None, str | None]:
    """The child's result, read once: ``(result, None)``, ``(None, None)`` when it wrote none,
    ``(None, why)`` when what it wrote cannot be read (damaged, or not the child's)."""
    try:
        with path.open("rb") as fh:
            data = fh.read(RESULT_MOST_BYTES + 1)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"{path.name} cannot be read: {exc.strerror or exc}"
    try:
        return WorkerResult.from_json(data), None
    except ResultError as exc:
        return None, f"{path.name}: {exc}"


def _ended_how(
    result: WorkerResult | None,
    damaged: str | None,
    ended: tuple[bool, str | None, int | None],
    stderr: str,
    job: WorkerJob | FeedJob,
    timeout_s: float,
) -> tuple[str | None, str | None]:
    """``(reason code, message)`` for a child that did not measure, ``(None, None)`` for one
    that did; ``ended`` is (timed out, its signal's name, its exit status)."""
    timed_out, sig_name, exit_status = ended
    tail = stderr.strip()[-STDERR_TAIL:]
    if timed_out:
        message = f"no result after {timeout_s:g} s; the subprocess was killed"
        where = _stuck_at(stderr, job.hook_root)
        if where is not None:
            message += f" while the pipeline hook was at {where}"
        return "timeout", message
    if result is not None and result.error is not None:
        return result.error.code, result.error.message
    if result is not None and result.ok:
        return None, None
    how = f"killed by {sig_name}" if sig_name else f"exited with status {exit_status}"
    if damaged is not None:
        return "crashed", f"the subprocess {how} with a damaged result ({damaged})"
    lowered = stderr.lower()
    if any(m in lowered for m in ("bad_alloc", "memoryerror", "failed to allocate")):
        said = sig_name or f"exit {exit_status}"
        return "out_of_memory", f"the subprocess ran out of memory ({said}): {tail[-300:]}"
    return "crashed", f"the subprocess {how} without a result" + (
        f": {tail[-300:]}" if tail else ""
    )


def _peak(
    rusage: Any, result: WorkerResult | None, killed_hwm: int | None
) -> tuple[float | None, PeakRssSource | None]:
    """The child's peak RSS and how it was measured (`child_peak_rss_mb`)."""
    # The parent's peak only grows, so read after reaping it bounds the image the child was
    # forked from: a wait4 value above it can only be the child's own.
    reported = result.vm_hwm_kb if result is not None else None
    peak_rss_mb, source = child_peak_rss_mb(
        rusage.ru_maxrss,  # Linux reports KiB
        hwm_kb(),
        reported if reported is not None else killed_hwm,
    )
    if source == "vmhwm" and reported is None:
        source = "vmhwm-before-kill"
    return peak_rss_mb, source


def _outcome(
    proc: subprocess.Popen[bytes],
    job: WorkerJob | FeedJob,
    workdir: Path,
    ended: tuple[int, Any, bool, int | None],
    wall: float,
    timeout_s: float,
) -> WorkerOutcome:
    status, rusage, timed_out, killed_hwm = ended
    # We reaped the child ourselves; tell Popen so it does not warn or wait again.
    proc.returncode = os.waitstatus_to_exitcode(status)
    stderr = _stderr_tail(workdir / "stderr.txt")
    result, damaged = _read_result(Path(job.result_path or workdir / "result.json"))
    if result is not None:  # written atomically by the child: complete, whatever it did after
        timed_out = False
    peak_rss_mb, peak_source = _peak(rusage, result, killed_hwm)
    sig_name = None
    exit_status = None
    if os.WIFSIGNALED(status):
        sig_name = signal.Signals(os.WTERMSIG(status)).name
    else:
        exit_status = os.WEXITSTATUS(status)
    code, message = _ended_how(
        result, damaged, (timed_out, sig_name, exit_status), stderr, job, timeout_s
    )
    return WorkerOutcome(
        result=result or WorkerResult(),
        error_code=code,
        error_message=message,
        peak_rss_mb=peak_rss_mb,
        peak_rss_source=peak_source,
        exit_status=exit_status,
        signal_name=sig_name,
        wall_s=wall,
        stderr=stderr,
        provider_log=read_log(workdir / "stderr.txt"),
        containment=_containment(result),
        stray_processes=_strays.pop(proc.pid, 0),
    )


def _containment(result: WorkerResult | None) -> str:
    """Which layers of `qualify.measure.contain` applied: the child says whether it became a
    subreaper; one that ended before it could say did as this platform allows."""
    said = result.subreaper if result is not None else None
    subreaper = contain.subreaper_available() if said is None else said
    return contain.SUBREAPER if subreaper else contain.PROCESS_GROUP


def run_worker(
    job: WorkerJob | FeedJob,
    workdir: Path,
    *,
    timeout_s: float,
    on_start: Callable[[int], None] | None = None,
    launch: Launch | None = None,
) -> WorkerOutcome:
    """Run one job in a fresh ``python -m qualify.measure.worker`` and wait for it.

    Args:
        job: the job (``qualify.measure.job``); ``result_path`` and ``parent_pid`` are set here.
        workdir: a private directory for the job, result and child output files.
        timeout_s: wall-clock limit; the child's whole process group is killed past it.
        on_start: called with the child's pid once started (tests use it to inject faults).
        launch: start it this way instead (under QEMU); None: this interpreter.

    Returns:
        The outcome; never raises for anything the child did.
    """
    if isinstance(job, WorkerJob) and (refused := mismatch(job, BEFORE_LOADING)) is not None:
        return _not_started(*refused)
    proc, job, started = _spawn(job, workdir, launch=launch)
    if on_start is not None:
        on_start(proc.pid)
    ended = _reap(proc, started + timeout_s, result_path=job.result_path)
    assert ended is not None
    outcome = _outcome(proc, job, workdir, ended, time.monotonic() - started, timeout_s)
    if isinstance(job, WorkerJob):
        return _held_to_digest(outcome, mismatch(job, AFTER_LOADING))
    return outcome


# The artifact's digest is checked here, in the parent, not in the child: ``hashlib`` would add
# OpenSSL's ~3.5 MB to the child's measured peak. The file is hashed just before the child starts
# and again once it has loaded it (after it ended, for `run_worker`; once ready and again after it
# ended, for `ServedWorker`). onnxruntime reads the file by its path between the two, so bytes
# that match at both ends are the ones it loaded, as when the child hashed around its own load
# (a change put back within the window escapes either way); the check after the end also covers
# the later loads (warm init, the profiled pass) that the child's own check did not.
def _not_started(code: str, message: str) -> WorkerOutcome:
    """The outcome of a child not started: its artifact failed the check before loading."""
    return WorkerOutcome(
        result=WorkerResult(),
        error_code=code,
        error_message=message,
        peak_rss_mb=None,
        exit_status=None,
        signal_name=None,
        wall_s=0.0,
    )


def _held_to_digest(outcome: WorkerOutcome, refused: tuple[str, str] | None) -> WorkerOutcome:
    """``outcome``, failed with ``refused`` when the bytes did not hold after the load:
    whatever the child measured or said, it was not of the bytes the digest names."""
    if refused is None:
        return outcome
    return dataclasses.replace(outcome, error_code=refused[0], error_message=refused[1])


class ServedWorker:
    """One artifact's fresh process kept alive across the rounds of an interleaved A/B.

    The child (``qualify.measure.worker`` in ``serve`` mode) prepares (cold and warm init,
    placement, parity outputs), says ready, then answers one command per line: ``round`` (timed
    samples back on a private pipe) and ``finish`` (throughput and profile, then it exits and is
    reaped like any worker, so its peak RSS comes from ``wait4``). ``timeout_s`` bounds the time
    spent waiting on this child in total, so other artifacts' rounds do not count against it.
    Any way the child ends early (error, crash, hang, out of memory) is kept for `finish`,
    which then returns the same `WorkerOutcome` `run_worker` would. The artifact's bytes are
    checked before the child starts (none starts if they do not match), once it is ready and
    after it ended (`_held_to_digest`).
    """

    def __init__(
        self,
        job: WorkerJob,
        workdir: Path,
        *,
        timeout_s: float,
        on_start: Callable[[int], None] | None = None,
    ) -> None:
        self._refused = mismatch(job, BEFORE_LOADING)
        """Why the artifact's bytes did not hold, once found: the outcome's code and message."""
        self.alive = self._spawned = self._refused is None
        if self._spawned:
            self._start(job, workdir, timeout_s, on_start)

    def _start(
        self,
        job: WorkerJob,
        workdir: Path,
        timeout_s: float,
        on_start: Callable[[int], None] | None,
    ) -> None:
        self._read_fd, write_fd = os.pipe()
        commands_r, commands_w = os.pipe()
        try:
            self._proc, self._job, started = _spawn(
                dataclasses.replace(job, mode="serve", reply_fd=write_fd, command_fd=commands_r),
                workdir,
                pass_fds=(write_fd, commands_r),
            )
        finally:
            os.close(write_fd)
            os.close(commands_r)
        self._commands = os.fdopen(commands_w, "w", encoding="utf-8", buffering=1)
        self._workdir = workdir
        self._timeout_s = timeout_s
        self._spent = 0.0
        self._started = started
        self._buffer = b""
        self._ended: tuple[int, Any, bool, int | None] | None = None
        if on_start is not None:
            on_start(self._proc.pid)

    @property
    def pid(self) -> int:
        """The child's process id; -1 for one never started (its bytes did not match)."""
        return self._proc.pid if self._spawned else -1

    def _read_line(self) -> dict[str, Any] | None:
        """The child's next reply, or None once it has ended (or used up its time)."""
        import select

        began = time.monotonic()
        try:
            while b"\n" not in self._buffer:
                left = self._timeout_s - self._spent - (time.monotonic() - began)
                if left <= 0:
                    self._stop(kill=True)
                    return None
                ready, _, _ = select.select([self._read_fd], [], [], min(left, 0.5))
                if not ready:
                    if self._reap_if_done():
                        return None
                    continue
                chunk = os.read(self._read_fd, 1 << 16)
                if not chunk:  # the child closed its end: it is ending
                    self._stop(kill=False)
                    return None
                self._buffer += chunk
        finally:
            self._spent += time.monotonic() - began
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            doc: dict[str, Any] = json.loads(line)
        except ValueError:
            self._stop(kill=True)
            return None
        return doc

    def _reap_if_done(self) -> bool:
        ended = _reap(self._proc, float("inf"), wait=False, result_path=self._job.result_path)
        if ended is None:
            return False
        self._ended = ended
        self.alive = False
        return True

    def _stop(self, *, kill: bool) -> None:
        """Reap the child: at once if ``kill`` (it used up its time), else within its time."""
        if self._ended is not None:
            return
        left = 0.0 if kill else max(0.0, self._timeout_s - self._spent)
        began = time.monotonic()
        self._ended = _reap(self._proc, time.monotonic() + left, result_path=self._job.result_path)
        self._spent += time.monotonic() - began
        self.alive = False

    def _send(self, cmd: dict[str, Any]) -> bool:
        try:
            self._commands.write(json.dumps(cmd) + "\n")
            self._commands.flush()
        except (BrokenPipeError, ValueError):
            self._stop(kill=False)
            return False
        return True

    def ready(self) -> bool:
        """Wait for the child to finish preparing; False if it ended instead, or if the bytes
        it loaded are not the ones the digest names (then it is stopped)."""
        if not self.alive:
            return False
        reply = self._read_line()
        if not (reply and reply.get("ready")):
            return False
        self._refused = mismatch(self._job, AFTER_LOADING)
        if self._refused is not None:
            self._stop(kill=True)
            return False
        return True

    def round(self, cmd: dict[str, Any]) -> dict[str, Any] | None:
        """One timed round; None if the child ended instead of answering."""
        if not self.alive or not self._send(dict(cmd, cmd="round")):
            return None
        reply = self._read_line()
        if reply is None or "samples_ns" not in reply:
            self._stop(kill=reply is not None)
            return None
        return reply

    def finish(self, configs: list[dict[str, Any]]) -> WorkerOutcome:
        """Ask for throughput and the profile, let the child exit, and reap it."""
        if not self._spawned:
            assert self._refused is not None
            return _not_started(*self._refused)
        if self.alive and self._send({"cmd": "finish", "configs": configs}):
            self._stop(kill=False)
        self.close()
        assert self._ended is not None
        wall = time.monotonic() - self._started
        outcome = _outcome(self._proc, self._job, self._workdir, self._ended, wall, self._timeout_s)
        # Checked again once it ended: the profiled pass loaded the file once more.
        return _held_to_digest(outcome, self._refused or mismatch(self._job, AFTER_LOADING))

    def close(self) -> None:
        """Kill the child if it still runs and release the pipes (safe to call twice)."""
        if not self._spawned:
            return
        if self._ended is None:
            self._stop(kill=True)
        with contextlib.suppress(OSError):
            self._commands.close()
        with contextlib.suppress(OSError):
            os.close(self._read_fd)
        self._read_fd = -1


class RoundWorker(Protocol):
    """What the interleaved A/B needs of one artifact's live process (`ServedWorker`)."""

    alive: bool

    @property
    def pid(self) -> int:
        """The process id (a scripted stand-in may give its own)."""
        ...

    def ready(self) -> bool:
        """Wait until prepared; False if it ended instead."""
        ...

    def round(self, cmd: dict[str, Any]) -> dict[str, Any] | None:
        """One timed round; None if it ended instead of answering."""
        ...

    def finish(self, configs: list[dict[str, Any]]) -> WorkerOutcome:
        """Throughput and profile, then the outcome of the whole process."""
        ...

    def close(self) -> None:
        """Stop it if it still runs (safe to call twice)."""
        ...


@dataclass(frozen=True)
class Workers:
    """Where a run gets its measuring processes: the seam between `qualify.run` and the
    subprocesses. Real runs use `SUBPROCESSES`; a test hands `qualify.run.qualify_run` scripted
    stand-ins to drive every way a worker can end, in milliseconds and without onnxruntime."""

    serve: Callable[..., RoundWorker]
    """``serve(job, workdir, *, timeout_s, on_start)``: a live process per artifact."""
    run: Callable[..., WorkerOutcome]
    """``run(job, workdir, *, timeout_s)``: one job to its end (the rollback check)."""
    probe: Callable[[], dict[str, Any]]
    """The host's onnxruntime identity (`probe_runtime`)."""
    emulated: Callable[..., WorkerOutcome] = run_worker
    """``emulated(job, workdir, *, timeout_s, launch)``: a parity pass under QEMU
    (`qualify.measure.emulators`); tests hand a scripted one to drive its outcomes without QEMU."""


SUBPROCESSES = Workers(serve=ServedWorker, run=run_worker, probe=probe_runtime)
"""Fresh ``python -m qualify.measure.worker`` processes: what every real run measures with."""
