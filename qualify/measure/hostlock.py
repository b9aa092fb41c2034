"""Locks a run waits on, and saying so: the host-wide measurement lock (one qualification
measures on a host at a time) and the matrix file's lock (`lock_wait_message`).

Owns where the host lock lives, taking it safely (no link followed, never truncated, the
holder's record written in place) and the message of a run that waits. Does not decide whether
a run measures alone (``qualify run --shared-host``). Why a host-wide lock and where it lives:
docs/internals.md, ``qualify.measure.hostlock``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from qualify.errors import QualifyError
from qualify.text import one_line

if TYPE_CHECKING:
    from matrix.lock import LockWait

__all__ = [
    "DEFAULT_WAIT_S",
    "LOCK_NAME",
    "host_lock_path",
    "lock_wait_message",
    "measuring_alone",
]

LOCK_NAME = "qualify-measure.lock"
DEFAULT_WAIT_S = 600.0
"""How long a run waits for the host's measurement lock by default (``--lock-wait``)."""
_ANNOUNCE_EVERY_S = 10.0
_POLL_S = 0.2
_RECORD_BYTES = 512
"""The holder's record: one line, padded with spaces, so that a record written over a longer
one leaves nothing of it behind without truncating the file."""
_MAGIC = b"qualify host lock: "
_LEGACY = b"PID "
"""How the record of a qualify before ``_MAGIC`` began (left by a holder that was killed)."""
_HOW = (
    "set QUALIFY_HOST_LOCK to a file of its own in a directory only you (or root) can write, "
    "or pass --shared-host to measure without it"
)


def host_lock_path() -> Path:
    """Where this host's measurement lock lives (see the module docstring)."""
    env = os.environ.get("QUALIFY_HOST_LOCK")
    if env:
        return Path(env)
    if hasattr(os, "geteuid") and os.geteuid() == 0 and os.path.isdir("/run"):
        return Path("/run/qualify/measure.lock")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and _private_dir(runtime):
        return Path(runtime) / LOCK_NAME
    return Path.home() / ".cache" / "qualify" / "measure.lock"


def _private_dir(folder: str) -> bool:
    """Whether ``folder`` is a directory of this user's that nobody else may write."""
    try:
        st = os.stat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _refused(target: Path, why: str) -> QualifyError:
    return QualifyError(f"{target}: cannot use it as the host's measurement lock: {why}; {_HOW}")


def _open_lock(target: Path) -> tuple[int, bool]:
    """A descriptor of the lock file, and whether the holder's record may be written into it.

    Raises:
        QualifyError: a link, not a regular file, a file with other names or of other content,
            or one that cannot be opened; the message names the path.
    """
    flags = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        try:
            fd = os.open(target, os.O_RDWR | os.O_CREAT | flags, 0o644)
            writable = True
        except PermissionError:  # another user's lock: taking it needs no write access
            fd = os.open(target, os.O_RDONLY | flags)
            writable = False
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refused(target, "it is a symbolic link, which qualify does not follow") from None
        raise _refused(target, exc.strerror or str(exc)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refused(target, "not a regular file (a device, a pipe or a socket)")
        if st.st_dev in _pseudo_devices():
            raise _refused(target, "a file of the kernel's (/proc, /sys), not a file of its own")
        if st.st_nlink > 1:
            raise _refused(target, f"the file has {st.st_nlink} names (hard links)")
        head = os.pread(fd, len(_MAGIC), 0)
        ours = head == _MAGIC or head.startswith(_LEGACY)
        if st.st_size and (not ours or st.st_size > _RECORD_BYTES):
            raise _refused(target, "the file holds data that is not a qualify lock's")
    except BaseException:
        os.close(fd)
        raise
    return fd, writable and st.st_uid == os.geteuid()


def _pseudo_devices() -> set[int]:
    """The devices of the kernel's own file systems, where no file is a lock of ours."""
    found = set()
    for folder in ("/proc", "/sys", "/dev"):
        with contextlib.suppress(OSError):
            found.add(os.stat(folder).st_dev)
    return found


def _holder(fd: int) -> str:
    try:
        raw = os.pread(fd, _RECORD_BYTES, 0)
    except OSError:
        raw = b""
    if raw.startswith(_MAGIC):
        raw = raw[len(_MAGIC) :]
    text = raw.decode("utf-8", "replace").strip() if raw.startswith(_LEGACY) else ""
    return one_line(text) or "another process (it did not say which)"


def _record(fd: int, text: str) -> None:
    """Write the holder's record over the old one, in place (the file is never truncated)."""
    line = _MAGIC + one_line(text).encode("utf-8", "replace")[: _RECORD_BYTES - len(_MAGIC) - 1]
    with contextlib.suppress(OSError):
        os.pwrite(fd, line.ljust(_RECORD_BYTES - 1) + b"\n", 0)


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
        QualifyError: still held after ``wait_s``, or the lock file cannot be used (named).
    """
    target = path or host_lock_path()
    fd, writable = _open_lock(target)
    try:
        _acquire(fd, target, wait_s, on_wait, sleep)
        if writable:
            me = " ".join(sys.argv) or "python"
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            _record(fd, f"PID {os.getpid()} ({one_line(me)[:300]}) since {stamp}")
        try:
            yield
        finally:
            if writable:
                _record(fd, "")
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _acquire(
    fd: int,
    target: Path,
    wait_s: float,
    on_wait: Callable[[str], None],
    sleep: Callable[[float], None],
) -> None:
    started = time.monotonic()
    announced = -_ANNOUNCE_EVERY_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            waited = time.monotonic() - started
            if waited >= wait_s:
                raise QualifyError(
                    f"the host is measuring for {_holder(fd)} (lock {target}); gave up after "
                    f"{waited:.0f} s (let it finish, wait longer with --lock-wait, or pass "
                    "--shared-host to measure alongside it, knowing both tails suffer)"
                ) from None
            if waited - announced >= _ANNOUNCE_EVERY_S:
                announced = waited
                on_wait(
                    f"waiting for the host's measurement lock ({target}), held by "
                    f"{_holder(fd)}: {waited:.0f} s so far, giving up after {wait_s:.0f} s"
                )
            sleep(_POLL_S)
        except OSError as exc:
            raise _refused(target, exc.strerror or str(exc)) from None


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
