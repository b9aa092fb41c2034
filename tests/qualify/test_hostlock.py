"""Locks a run waits on: the host-wide measurement lock between real processes, and the matrix
file's lock, each said with who holds it and for how long."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from matrix.store import Store
from qualify.errors import QualifyError
from qualify.hostlock import lock_wait_message, measuring_alone

ROOT = Path(__file__).resolve().parents[2]


def _holder(lock: Path, hold_s: float) -> subprocess.Popen[str]:
    code = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from qualify.hostlock import measuring_alone
        with measuring_alone(wait_s=5, on_wait=print, path=Path({str(lock)!r})):
            print("held", flush=True)
            time.sleep({hold_s})
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "--host-class", "x86-v4"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_measurement_waits_for_the_first_and_says_for_whom(tmp_path: Path) -> None:
    lock = tmp_path / "measure.lock"
    first = _holder(lock, 1.5)
    said: list[str] = []
    started = time.monotonic()
    with measuring_alone(wait_s=30, on_wait=said.append, path=lock):
        waited = time.monotonic() - started
    first.communicate(timeout=30)
    assert waited >= 1.0  # it measured only once the first was done
    assert said and f"PID {first.pid}" in said[0] and "--host-class x86-v4" in said[0]


def test_waiting_past_the_limit_names_the_holder_and_the_way_out(tmp_path: Path) -> None:
    lock = tmp_path / "measure.lock"
    first = _holder(lock, 30)
    try:
        with (
            pytest.raises(QualifyError, match=rf"PID {first.pid}.*--shared-host"),
            measuring_alone(wait_s=0.5, on_wait=lambda _m: None, path=lock),
        ):
            pass
    finally:
        first.kill()
        first.communicate()


def test_a_killed_holder_releases_the_lock_at_once(tmp_path: Path) -> None:
    lock = tmp_path / "measure.lock"
    first = _holder(lock, 60)
    os.kill(first.pid, signal.SIGKILL)
    first.communicate()
    started = time.monotonic()
    with measuring_alone(wait_s=5, on_wait=lambda _m: None, path=lock):
        assert time.monotonic() - started < 1.0


def test_a_held_matrix_lock_is_said_with_the_holders_pid_and_command(tmp_path: Path) -> None:
    db = tmp_path / "m.duckdb"
    Store.open(db).close()
    code = (
        "import sys, time\n"
        "from matrix.store import Store\n"
        f"s = Store.open({str(db)!r})\n"
        "print('open', flush=True)\n"
        "time.sleep(2)\n"
        "s.close()\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
    said: list[str] = []
    with Store.open(db, wait_s=30, on_wait=lock_wait_message(said.append)):
        pass
    holder.communicate(timeout=30)
    assert said, "the wait was not said"
    assert "waiting for the matrix lock" in said[0] and "s so far" in said[0]
    if f"PID {holder.pid}" in said[0]:  # DuckDB names the holder where the OS tells it
        assert "python" in said[0]
