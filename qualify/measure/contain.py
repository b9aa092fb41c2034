"""Containment of the user's code: nothing a measuring child starts outlives it.

Owns the three layers that end what a pipeline hook starts (the child's own process group and
session swept by the parent, the child as a subreaper that kills its children, an environment
tag the parent sweeps for) and what each cell records of them (``containment``). Does not run
hooks (``qualify.measure.worker``) or start the child (``qualify.measure.runner``). Why three
layers and not a cgroup: docs/internals.md, ``qualify.measure.contain``. Standard library only:
the measuring child imports it before it reads its own peak memory.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

__all__ = [
    "PROCESS_GROUP",
    "SUBREAPER",
    "TAG_ENV",
    "kill_children",
    "make_subreaper",
    "new_tag",
    "subreaper_available",
    "sweep",
]

TAG_ENV = "QUALIFY_CONTAINMENT_TAG"
"""The environment variable whose value tags one child and everything it starts."""

PROCESS_GROUP = "process-group+tag"
"""Containment by the child's own process group and its environment tag (no subreaper)."""

SUBREAPER = "process-group+subreaper+tag"
"""Containment by process group, a subreaper child and parent, and the environment tag."""

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37
_ENVIRON_BYTES = 1 << 20
"""The most of a process's environment block read when looking for the tag."""
_SWEEP_S = 5.0
"""How long `sweep` and `kill_children` keep killing what reappears (a process that forks
as fast as it is killed) before giving up."""

_subreaper: bool | None = None


def make_subreaper() -> bool:
    """Make this process a child subreaper (Linux 3.4+), once; True when it is one."""
    global _subreaper
    if _subreaper is None:
        _subreaper = False
        if sys.platform.startswith("linux"):
            import ctypes

            try:
                libc = ctypes.CDLL(None, use_errno=True)
                _subreaper = bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
            except (OSError, AttributeError):
                _subreaper = False
    return _subreaper


def subreaper_available() -> bool:
    """Whether this platform lets a process become a child subreaper (asked without becoming
    one): what a child that ended before it could say is taken to have done."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        flag = ctypes.c_int(0)
        return bool(libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def new_tag() -> str:
    """A tag no other child of any process has: this process's id, a clock and random bits."""
    return f"{os.getpid()}-{time.monotonic_ns()}-{os.urandom(6).hex()}"


def _stat(pid: int) -> tuple[str, int, int, int, int] | None:
    """(state, parent, process group, session, start time in clock ticks after boot) of
    ``pid`` from /proc; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read(4096)
    except OSError:
        return None
    # The command name, in parentheses, may hold anything: the fields start after the last ')'.
    fields = raw[raw.rfind(b")") + 2 :].split()
    try:
        state = fields[0].decode("ascii", "replace")
        return state, int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19])
    except (IndexError, ValueError):
        return None


def _ticks_now() -> float:
    """Clock ticks since boot, as /proc/<pid>/stat counts a process's start."""
    return time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK")


def _tagged(pid: int, tag: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            block = fh.read(_ENVIRON_BYTES)
    except OSError:
        return False
    wanted = f"{TAG_ENV}={tag}".encode()
    return block.startswith(wanted + b"\0") or (b"\0" + wanted + b"\0") in block


def _pids() -> list[int]:
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    return [int(n) for n in names if n.isdigit()]


def _kill(pid: int, belongs: object) -> bool:
    """SIGKILL ``pid`` if ``belongs(pid)`` still holds once it is pinned (a pidfd, where there
    is one, so that a recycled id is never signalled); True when a signal was sent."""
    check = belongs if callable(belongs) else None
    pidfd = -1
    opener = getattr(os, "pidfd_open", None)
    if opener is not None:
        try:
            pidfd = opener(pid)
        except OSError:
            return False
    try:
        if check is not None and not check(pid):
            return False
        if pidfd >= 0:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
        return True
    except OSError:
        return False
    finally:
        if pidfd >= 0:
            os.close(pidfd)


def _reap(pid: int) -> None:
    """Collect ``pid`` if it is this process's child (it is a zombie until then)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, 0)


def kill_children(*, keep: frozenset[int] = frozenset()) -> int:
    """Kill every child of this process but ``keep``, and every child they leave behind (a
    subreaper inherits its orphaned descendants), until none is left or `_SWEEP_S` passed.

    Returns:
        How many processes were killed.
    """
    me = os.getpid()
    killed = 0
    deadline = time.monotonic() + _SWEEP_S
    while time.monotonic() < deadline:
        found = [
            pid
            for pid in _pids()
            if pid not in keep and (st := _stat(pid)) is not None and st[1] == me
        ]
        if not found:
            break
        for pid in found:
            killed += _kill(pid, lambda p: (s := _stat(p)) is not None and s[1] == me)
        for pid in found:
            _reap(pid)
    return killed


def sweep(group: int, tag: str) -> int:
    """Kill what a child that has ended left behind: its process group (and session), and every
    process that carries its environment tag; orphans re-parented to this process are reaped.

    Args:
        group: The child's process id, which was its process group and session id.
        tag: The child's `TAG_ENV` value.

    Returns:
        How many processes were killed.
    """
    me = os.getpid()
    # The child is reaped, so its id may be reused: a process of its group or session counts
    # only if it started before now (one that gets the id later is someone else's). Killed
    # one by one through pidfds rather than with killpg, for the same reason.
    cutoff = _ticks_now() + 1

    def belongs(pid: int) -> bool:
        st = _stat(pid)
        if st is None or st[0] in ("Z", "X") or pid == me:
            return False
        return ((st[2] == group or st[3] == group) and st[4] <= cutoff) or _tagged(pid, tag)

    killed = 0
    signalled: set[int] = set()
    deadline = time.monotonic() + _SWEEP_S
    while time.monotonic() < deadline:
        found = [pid for pid in _pids() if belongs(pid)]
        if not found:
            break
        for pid in found:
            if _kill(pid, belongs) and pid not in signalled:
                signalled.add(pid)
                killed += 1
        for pid in found:
            st = _stat(pid)
            if st is not None and st[1] == me:
                _reap(pid)
        time.sleep(0.005)  # a killed process that is not ours ends when the kernel gets to it
    return killed
