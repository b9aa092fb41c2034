"""The user's pipeline hooks at their worst: hooks that hang, fork, double-fork, flood stderr,
read stdin, start threads, exit or raise, in ``qualify run`` (the measuring child) and in
``qualify candidates`` (the calibration feed, in the same supervised child). Each case checks the
exit status, the message naming the hook's file and line, that nothing the hook started is still
running (by pid), and that what a refused command must not touch is unchanged."""

from __future__ import annotations

import os
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from matrix.store import Store
from qualify.cli import cli
from qualify.measure.runner import STDERR_KEPT, run_worker
from tests.models import build
from tests.qualify.jobs import make_job
from tests.qualify.projects import write_project

HOOKS = textwrap.dedent(
    """\
    import os
    import sys
    import threading
    import time


    def _mark(kind):
        # The pid of every process a hook starts, for the test to look for afterwards.
        with open(os.path.join(os.environ["HOOK_MARKS"], f"{kind}-{os.getpid()}"), "w"):
            pass


    def _once(name):
        if os.environ.get(name):
            return False
        os.environ[name] = "1"
        return True


    def forks(feed):
        if _once("FORKED") and os.fork() == 0:
            _mark("fork")
            time.sleep(3600)
            os._exit(0)
        return feed


    def double_forks(feed):
        if _once("FORKED") and os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                _mark("daemon")
                time.sleep(3600)
            os._exit(0)
        return feed


    def floods_stderr(feed):
        if _once("FLOODED"):
            line = "x" * 1023 + "\\n"
            for _ in range(8 * 1024):  # 8 MiB
                sys.stderr.write(line)
            sys.stderr.write("the last line of the flood\\n")
        return feed


    def reads_stdin(feed):
        sys.stdin.read()
        return feed


    def starts_a_thread(feed):
        if _once("THREADED"):
            threading.Thread(target=time.sleep, args=(3600,), daemon=False).start()
        return feed


    def exits(feed):
        os._exit(0)


    def daemon_then_exits(feed):
        # The child never gets to kill its own children: the parent's sweep must find this one.
        double_forks(feed)
        time.sleep(0.2)
        os._exit(0)


    def hangs(feed):
        time.sleep(3600)


    def raises(feed):
        raise RuntimeError("a malformed request")
    """
)


def _line_of(text: str) -> int:
    return HOOKS.splitlines().index(text) + 1


RAISES_AT = _line_of('    raise RuntimeError("a malformed request")')
HANGS_AT = _line_of("    time.sleep(3600)")


@pytest.fixture
def marks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    folder = tmp_path / "marks"
    folder.mkdir()
    monkeypatch.setenv("HOOK_MARKS", str(folder))
    yield folder
    for pid in _pids(folder):  # never leave a stray behind, whatever a test found
        if _alive(pid):
            os.kill(pid, 9)


def _pids(folder: Path) -> list[int]:
    return [int(p.name.rsplit("-", 1)[1]) for p in folder.iterdir()]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in (b"Z", b"X")


def _still_running(folder: Path) -> list[int]:
    """The marked pids alive a moment after the command returned (a zombie is not running)."""
    deadline = time.monotonic() + 2.0
    while True:
        alive = [pid for pid in _pids(folder) if _alive(pid)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def _project(tmp: Path, hook: str, *, timeout: float = 30, recorded: bool = False) -> Path:
    path = write_project(tmp, [], timeout=timeout)
    (tmp / "prep.py").write_text(HOOKS)
    text = path.read_text()
    text = text.replace("workload:\n", f"workload:\n  pipeline: {{pre: 'prep:{hook}'}}\n", 1)
    text = text.replace("concurrency: [1, 2]", "concurrency: [1]")
    text = text.replace(
        "budgets: {p99_ms: 50}\n", f"budgets: {{p99_ms: 50, timeout_s: {timeout}}}\n"
    )
    if recorded:
        np.save(tmp / "x.npy", np.random.default_rng(3).random((32, 16), dtype=np.float32))
        text = text.replace("source: generated, seed: 7", "source: recorded, file: x.npy")
    path.write_text(text)
    return path


def _qualify(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def _run(project: Path) -> tuple[int, str, list[dict[str, object]]]:
    db = project.parent / "m.duckdb"
    code, output = _qualify(
        "run", "--host-class", "here-cpu", "--project", str(project), "--db", str(db), "--json"
    )
    with Store.open(db, read_only=True) as store:
        cells = [c.model_dump() for c in store.cells()]
    return code, output, cells


# hook -> (exit status, what the baseline's cell says, the marks its processes leave)
RUN_CASES: dict[str, tuple[int, str | None, str | None]] = {
    "forks": (0, None, "fork"),
    "double_forks": (0, None, "daemon"),
    "floods_stderr": (0, None, None),
    "reads_stdin": (0, None, None),
    "starts_a_thread": (0, None, None),
    "exits": (1, "the subprocess exited with status 0 without a result", None),
    "daemon_then_exits": (1, "the subprocess exited with status 0 without a result", "daemon"),
    "raises": (
        1,
        f"raised at prep.py:{RAISES_AT}",
        None,
    ),
    "hangs": (1, f"hook was at prep.py:{HANGS_AT} (in hangs)", None),
}


@pytest.mark.parametrize("hook", sorted(RUN_CASES))
def test_a_hostile_hook_in_a_run_is_contained_and_said_with_its_line(
    tmp_path: Path, marks: Path, hook: str
) -> None:
    status, said, mark = RUN_CASES[hook]
    # The hook that hangs is killed at 4 s. The others must end without waiting for their
    # timeout, which is far past the run's own length (3 to 10 s beside a CPU hog, 8 MiB of
    # stderr the longest) so that a run slowed by its neighbours never reaches it.
    timeout = 4 if hook == "hangs" else 120
    started = time.monotonic()
    code, output, cells = _run(_project(tmp_path, hook, timeout=timeout))
    took = time.monotonic() - started
    assert code == status, output
    [cell] = cells
    if said is None:
        assert cell["verdict"] != "error", cell["error"]
        # A result written is a result: a lingering thread or an empty stdin never made it
        # wait for the timeout.
        assert took < timeout, took
    else:
        assert cell["verdict"] == "error"
        assert said in str(cell["error"]), cell["error"]
        assert "workload.pipeline.pre" in str(cell["error"]) or "exits" in hook or hook == "hangs"
    assert cell["containment"] == "process-group+subreaper+tag"
    if mark is not None:
        assert [p.name.split("-")[0] for p in marks.iterdir()] == [mark]
    assert _still_running(marks) == []
    assert "Traceback" not in output


# hook -> (exit status, what the message says)
CALIBRATION_CASES: dict[str, tuple[int, str | None]] = {
    "forks": (0, None),
    "double_forks": (0, None),
    "floods_stderr": (0, None),
    "reads_stdin": (0, None),
    "starts_a_thread": (0, None),
    "exits": (2, "the subprocess exited with status 0 without a result"),
    "raises": (
        2,
        f"raised at prep.py:{RAISES_AT}: RuntimeError: a malformed request",
    ),
    "hangs": (2, f"hook was at prep.py:{HANGS_AT} (in hangs)"),
}


@pytest.mark.parametrize("hook", sorted(CALIBRATION_CASES))
def test_a_hostile_hook_feeding_calibration_is_contained_and_never_reads_as_success(
    tmp_path: Path, marks: Path, hook: str
) -> None:
    status, said = CALIBRATION_CASES[hook]
    project = _project(tmp_path, hook, timeout=4 if hook == "hangs" else 60, recorded=True)
    before = project.read_bytes()
    code, output = _qualify(
        "candidates",
        "--project",
        str(project),
        "--db",
        str(tmp_path / "m.duckdb"),
        "--variant",
        "int8-qdq-per-channel",
    )
    assert code == status, output
    assert "Traceback" not in output
    if said is None:
        assert "int8-qdq-per-channel" in project.read_text()
    else:
        assert output.startswith("error: ") and output.count("\n") == 1, output
        assert f"{project}: workload.pipeline.pre prep:{hook}" in output
        assert said in output, output
        assert project.read_bytes() == before  # nothing added
        assert not (tmp_path / "m.duckdb").exists()
        assert not (tmp_path / "models" / "candidates").exists()
    assert _still_running(marks) == []


def test_a_flood_on_stderr_is_kept_as_its_bounded_end(tmp_path: Path, marks: Path) -> None:
    (tmp_path / "prep.py").write_text(HOOKS)
    job = make_job(
        tmp_path,
        build("identity_mlp", tmp_path),
        mode="check",
        pre_hook="prep:floods_stderr",
        hook_root=str(tmp_path),
    )
    outcome = run_worker(job, tmp_path / "w", timeout_s=60)
    assert outcome.error_code is None, outcome.error_message
    assert (tmp_path / "w" / "stderr.txt").stat().st_size > 8 * 2**20
    assert len(outcome.stderr.encode()) <= STDERR_KEPT
    assert outcome.stderr.rstrip().endswith("the last line of the flood")


def test_a_tune_whose_every_trial_hangs_in_a_hook_says_no_trial_finished(
    tmp_path: Path, marks: Path
) -> None:
    project = _project(tmp_path, "hangs", timeout=3)
    before = project.read_bytes()
    code, output = _qualify(
        "tune",
        "--host-class",
        "here-cpu",
        "--project",
        str(project),
        "--db",
        str(tmp_path / "m.duckdb"),
        "--budget",
        "5s",
        "--max-trials",
        "2",
    )
    assert code == 1, output
    assert "internal error" not in output and "IndexError" not in output
    assert "no winner: no trial finished to compare with the current settings" in output
    assert f"hook was at prep.py:{HANGS_AT} (in hangs)" in output
    assert project.read_bytes() == before
    assert _still_running(marks) == []


@settings(max_examples=200, deadline=None)
@given(
    noise=st.text(max_size=300),
    frames=st.lists(
        st.tuples(
            st.sampled_from(["/p/prep.py", "/usr/lib/x.py", "/p/sub/deep.py", "/pp/other.py"]),
            st.integers(min_value=0, max_value=10**9),
        ),
        max_size=5,
    ),
)
def test_where_a_hook_was_stuck_is_read_from_any_stderr_without_failing(
    noise: str, frames: list[tuple[str, int]]
) -> None:
    import re

    from qualify.measure.runner import _stuck_at

    dump = "".join(f'  File "{f}", line {n} in fn\n' for f, n in frames)
    where = _stuck_at(noise + "\nThread 0x1 (most recent call first):\n" + dump, "/p")
    ours = [(f, n) for f, n in frames if f.startswith("/p/")]
    if ours:  # the innermost frame of the project's own code (a dump lists it first)
        f, n = ours[0]
        assert where == f"{f.rsplit('/', 1)[1]}:{n} (in fn)"
    elif where is not None:  # only from the noise, and then in the same form
        assert re.fullmatch(r".+:\d+ \(in \S+\)", where)
