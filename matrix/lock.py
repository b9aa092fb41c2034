"""Waiting for another process's lock on a matrix file.

DuckDB lets one process write a database file at a time and refuses the others at once; this
module retries a connect (or an attach) with backoff while the file is locked, and says so
through ``on_wait``. Does not own opening or migrating the matrix (``matrix.store``) nor what
to print (callers pass ``on_wait``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import duckdb

from matrix.errors import MatrixError, MatrixLockedError

__all__ = ["LockWait", "wait_for_lock"]

_LOCK_MARK = "Could not set lock on file"
_ANNOUNCE_EVERY_S = 10.0
"""A wait for the file lock is said when it starts, when the holder changes, and this often."""
_PID_RE = re.compile(r"PID (\d+)")
_FIRST_DELAY_S = 0.05
_MAX_DELAY_S = 1.0
_T = TypeVar("_T")


@dataclass(frozen=True)
class LockWait:
    """Handed to ``on_wait`` when ``Store.open`` finds the file locked by another process.

    Attributes:
        path: The database file.
        pid: The process holding the lock, as DuckDB reported it (None if it did not say).
        waited_s: Seconds waited so far.
        detail: DuckDB's message.
    """

    path: Path
    pid: int | None
    waited_s: float
    detail: str


def wait_for_lock(
    attempt: Callable[[], _T],
    target: str,
    *,
    wait_s: float,
    on_wait: Callable[[LockWait], None] | None,
    sleep: Callable[[float], None],
    monotonic: Callable[[], float],
) -> _T:
    """``attempt()`` (a connect or an attach of ``target``), retried with exponential backoff
    while another process holds the file lock, for up to ``wait_s`` seconds.

    Raises:
        MatrixLockedError: The lock was still held after ``wait_s``.
        MatrixError: Any other failure to open the file.
    """
    started = monotonic()
    delay = _FIRST_DELAY_S
    announced: tuple[int | None] | None = None
    last_said = 0.0
    while True:
        try:
            return attempt()
        except duckdb.Error as error:
            detail = str(error)
            if _LOCK_MARK not in detail:
                raise MatrixError(f"cannot open matrix {target}: {detail}") from error
            found = _PID_RE.search(detail)
            pid = int(found.group(1)) if found else None
            waited = monotonic() - started
            if waited >= wait_s:
                holder = f"PID {pid}" if pid is not None else "another process"
                raise MatrixLockedError(
                    f"matrix {target} is locked by {holder}; gave up after waiting "
                    f"{waited:.1f} s. Let that process (another `qualify run` or ingest) "
                    "finish, or stop it, then retry",
                    path=Path(target),
                    pid=pid,
                    waited_s=waited,
                ) from error
            if on_wait is not None and (
                announced != (pid,) or waited - last_said >= _ANNOUNCE_EVERY_S
            ):
                announced, last_said = (pid,), waited
                on_wait(LockWait(path=Path(target), pid=pid, waited_s=waited, detail=detail))
            sleep(min(delay, max(wait_s - waited, 0.0)))
            delay = min(delay * 2, _MAX_DELAY_S)
