"""Locks a run waits on, and saying so: the host-wide measurement lock (one qualification
measures on a host at a time) and the matrix file's lock (`lock_wait_message`).

Two ``qualify run`` on one host measure at the same time and corrupt each other's tails (the
interleaved A/B shares load between the artifacts of one run, not between runs). So the
measurement phase of a run (its workers' whole lives) holds an exclusive ``flock`` on one file
per host; another run waits, and says whom it waits for, unless its user opts out
(``qualify run --shared-host``). The cell records whether it measured alone.

The lock file is ``$QUALIFY_HOST_LOCK``, else ``/run/lock/qualify-measure.lock`` (a tmpfs that
no temp cleaner touches), else ``/var/lock/...``, else ``~/.cache/qualify/measure.lock``. The
holder writes its pid, command line and start time into it, for the waiters' messages; the
kernel releases the lock when the holder dies, however it dies.
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from qualify.errors import QualifyError
from qualify.text import one_line

if TYPE_CHECKING:
    from matrix.store import LockWait

__all__ = ["LOCK_NAME", "host_lock_path", "lock_wait_message", "measuring_alone"]

LOCK_NAME = "qualify-measure.lock"
_ANNOUNCE_EVERY_S = 10.0
_POLL_S = 0.2


def host_lock_path() -> Path:
    """Where this host's measurement lock lives (see the module docstring)."""
    env = os.environ.get("QUALIFY_HOST_LOCK")
    if env:
        return Path(env)
    for folder in ("/run/lock", "/var/lock"):
        if os.path.isdir(folder) and os.access(folder, os.W_OK | os.X_OK):
            return Path(folder) / LOCK_NAME
    return Path.home() / ".cache" / "qualify" / "measure.lock"


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 1024, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return one_line(text) or "another process (it did not say which)"


@contextmanager
def measuring_alone(
    *,
    wait_s: float,
    on_wait: Callable[[str], None],
    path: Path | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[None]:
    """Hold the host's measurement lock for the duration of the block.

    Args:
        wait_s: How long to wait for another holder before giving up.
        on_wait: Told who holds the lock and for how long it has been waited for, when the
            wait starts and every 10 s after.
        path: The lock file (default `host_lock_path`).
        sleep: Sleeps between tries (a parameter so tests need not wait).

    Raises:
        QualifyError: still held after ``wait_s``, or the lock file cannot be opened.
    """
    target = path or host_lock_path()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        raise QualifyError(
            f"{target}: cannot open the host's measurement lock ({exc.strerror}); set "
            "QUALIFY_HOST_LOCK to a writable file, or pass --shared-host to measure without it"
        ) from exc
    try:
        started = time.monotonic()
        announced = -_ANNOUNCE_EVERY_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = time.monotonic() - started
                if waited >= wait_s:
                    raise QualifyError(
                        f"the host is measuring for {_holder(fd)}; gave up after {waited:.0f} s "
                        "(let it finish, or pass --shared-host to measure alongside it, "
                        "knowing both tails suffer)"
                    ) from None
                if waited - announced >= _ANNOUNCE_EVERY_S:
                    announced = waited
                    on_wait(
                        f"waiting for the host's measurement lock ({target}), held by "
                        f"{_holder(fd)}: {waited:.0f} s so far"
                    )
                sleep(_POLL_S)
        me = " ".join(sys.argv) or "python"
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"PID {os.getpid()} ({one_line(me)[:300]}) since {stamp}\n".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _command_of(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            raw = fh.read(2048)
    except OSError:
        return None
    text = raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()
    return one_line(text)[:200] or None


def _stderr(message: str) -> None:
    print(f"qualify: {message}", file=sys.stderr, flush=True)


def lock_wait_message(say: Callable[[str], None] = _stderr) -> Callable[[LockWait], None]:
    """An ``on_wait`` for ``Store.open`` that says whose lock it waits for and since when:
    ``waiting for the matrix lock on PATH, held by PID 123 (qualify run ...): 10 s so far``."""

    def on_wait(wait: LockWait) -> None:
        if wait.pid is None:
            holder = "another process"
        else:
            command = _command_of(wait.pid)
            holder = f"PID {wait.pid}" + (f" ({command})" if command else "")
        say(
            f"waiting for the matrix lock on {wait.path}, held by {holder}: "
            f"{wait.waited_s:.0f} s so far"
        )

    return on_wait
