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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from matrix.store import Store
from qualify.errors import QualifyError
from qualify.measure.hostlock import lock_wait_message, measuring_alone

ROOT = Path(__file__).resolve().parents[3]


def _holder(lock: Path, hold_s: float) -> subprocess.Popen[str]:
    code = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from qualify.measure.hostlock import measuring_alone
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


def _victim(tmp_path: Path) -> tuple[Path, bytes]:
    victim = tmp_path / "victim.conf"
    content = b"root:x:0:0:a file of someone else's that a lock must never touch\n" * 4
    victim.write_bytes(content)
    return victim, content


def _hostile_lock(kind: str, tmp_path: Path, victim: Path) -> Path:
    lock = tmp_path / "hostile.lock"
    if kind == "symlink to a victim":
        lock.symlink_to(victim)
    elif kind == "dangling symlink":
        lock.symlink_to(tmp_path / "created-through-the-link")
    elif kind == "hard link to a victim":
        os.link(victim, lock)
    elif kind == "a file of other content":
        return victim
    elif kind == "fifo":
        os.mkfifo(lock)
    elif kind == "directory":
        lock.mkdir()
    elif kind in ("/dev/null", "/proc/self/status", "/dev/zero"):
        return Path(kind)
    return lock


HOSTILE_LOCKS = {
    "symlink to a victim": "symbolic link",
    "dangling symlink": "symbolic link",
    "hard link to a victim": "hard links",
    "a file of other content": "not a qualify lock",
    "fifo": "not a regular file",
    "directory": "directory",
    "/dev/null": "not a regular file",
    "/dev/zero": "not a regular file",
    "/proc/self/status": "/proc/self/status",
}


@pytest.mark.parametrize("kind", sorted(HOSTILE_LOCKS))
def test_a_lock_path_that_is_not_a_lock_file_of_its_own_is_refused_by_name_and_left_alone(
    tmp_path: Path, kind: str
) -> None:
    victim, content = _victim(tmp_path)
    lock = _hostile_lock(kind, tmp_path, victim)
    before = sorted(p.name for p in tmp_path.iterdir())
    with (
        pytest.raises(QualifyError) as caught,
        measuring_alone(wait_s=1, on_wait=lambda _m: None, path=lock),
    ):
        pytest.fail("measured under a lock that is not one")
    message = str(caught.value)
    assert message.startswith(f"{lock}: cannot use it as the host's measurement lock")
    assert HOSTILE_LOCKS[kind] in message.lower() or HOSTILE_LOCKS[kind] in message
    assert "QUALIFY_HOST_LOCK" in message
    assert victim.read_bytes() == content  # never truncated, never written
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing created through it


def test_the_lock_file_is_never_truncated_and_its_record_is_replaced_in_place(
    tmp_path: Path,
) -> None:
    lock = tmp_path / "measure.lock"
    seen: list[bytes] = []
    with measuring_alone(wait_s=1, on_wait=lambda _m: None, path=lock):
        seen.append(lock.read_bytes())
    released = lock.read_bytes()
    assert (
        seen[0].startswith(b"qualify host lock: PID ") and f"PID {os.getpid()} ".encode() in seen[0]
    )
    assert len(seen[0]) == len(released) == 512  # one fixed-size record, written over
    assert b"PID" not in released
    with measuring_alone(wait_s=1, on_wait=lambda _m: None, path=lock):
        assert len(lock.read_bytes()) == 512


def test_the_default_lock_is_in_a_directory_no_other_user_can_write(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from qualify.measure.hostlock import host_lock_path

    monkeypatch.delenv("QUALIFY_HOST_LOCK")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    path = host_lock_path()
    assert not str(path).startswith(("/run/lock", "/var/lock", "/tmp"))
    folder = path.parent
    while not folder.exists():
        folder = folder.parent
    assert not folder.stat().st_mode & 0o002, folder  # not world-writable


def test_a_run_waiting_for_the_lock_says_who_holds_it_even_in_a_pipe_and_gives_up_in_time(
    tmp_path: Path,
) -> None:
    from tests.qualify.projects import write_project

    lock = tmp_path / "measure.lock"
    project = write_project(tmp_path / "p", [])
    holder = _holder(lock, 60)
    try:
        started = time.monotonic()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "qualify",
                "run",
                "--host-class",
                "here-cpu",
                "--project",
                str(project),
                "--db",
                str(tmp_path / "m.duckdb"),
                "--lock-wait",
                "2s",
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=dict(os.environ, QUALIFY_HOST_LOCK=str(lock), PYTHONPATH=str(ROOT)),
            timeout=120,
        )
        took = time.monotonic() - started
    finally:
        holder.kill()
        holder.communicate()
    assert done.returncode == 2, done.stderr
    assert took < 60
    assert f"waiting for the host's measurement lock ({lock}), held by PID {holder.pid}" in (
        done.stderr
    )
    assert f"error: the host is measuring for PID {holder.pid}" in done.stderr
    assert "--lock-wait" in done.stderr
    assert not (tmp_path / "m.duckdb").exists()


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    content=st.one_of(st.binary(max_size=1024), st.binary(max_size=64).map(lambda b: b"PID " + b))
)
def test_whatever_a_lock_file_holds_it_is_used_as_a_lock_or_refused_and_left_as_it_was(
    tmp_path: Path, content: bytes
) -> None:
    lock = tmp_path / "fuzzed.lock"
    lock.write_bytes(content)
    try:
        with measuring_alone(wait_s=1, on_wait=lambda _m: None, path=lock):
            held = lock.read_bytes()
    except QualifyError as refused:
        assert str(refused).startswith(f"{lock}: cannot use it")
        assert lock.read_bytes() == content  # never written, never truncated
        return
    # Accepted only where it held nothing or a lock's record, which is then written over in
    # place: one fixed-size record, whatever was there before.
    assert content == b"" or content.startswith((b"qualify host lock: ", b"PID "))
    assert held.startswith(b"qualify host lock: PID ") and len(held) == 512
    assert len(lock.read_bytes()) == max(512, len(content))
