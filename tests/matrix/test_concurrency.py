"""Two processes, one matrix file: waiting for the lock, giving up, and surviving SIGKILL.

Every test here runs a real child Python process (``sys.executable -c``) against a real DuckDB
file; the child speaks one line on stdout when it has reached the interesting point.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
import pytest

from matrix.errors import MatrixLockedError
from matrix.lock import LockWait
from matrix.store import Store
from tests.matrix.factories import make_bundle, make_samples

REPO = Path(__file__).resolve().parents[2]

HOLD_LOCK = """
import sys, time
from matrix.store import Store
store = Store.open(sys.argv[1])
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
store.close()
"""

# Writes one small committed run, then a run with a large samples table. With "pause", the
# write stops inside its transaction (after every insert, before COMMIT) and says so; without,
# it just writes and the parent kills it at a random moment.
BIG_WRITE = """
import sys, time
import numpy as np, pyarrow as pa
from matrix.samples import SAMPLES_SCHEMA
from matrix.store import Store
from tests.matrix.factories import make_bundle, make_samples

path, rows, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]

class Pausing(Store):
    def _before_commit(self, run_id):
        if mode == "pause" and run_id == "run-big":
            print("inside", flush=True)
            time.sleep(600)

small = make_bundle("run-small")
big = make_bundle("run-big")
digest = big.cells[1].artifact_digest
samples = pa.table(
    {
        "artifact_digest": pa.DictionaryArray.from_arrays(
            pa.array(np.zeros(rows, np.int32)), pa.array([digest])
        ),
        "batch_size": np.ones(rows, np.int32),
        "concurrency": np.ones(rows, np.int32),
        "seq": np.arange(rows, dtype=np.int32),
        "latency_ns": np.arange(rows, dtype=np.int64),
    }
)
with Pausing.open(path) as store:
    store.write_run(small, make_samples(small))
    print("writing", flush=True)
    store.write_run(big, samples)
print("done", flush=True)
"""


@contextmanager
def child(code: str, *args: str) -> Iterator[subprocess.Popen[str]]:
    """A child process running ``code``; killed and reaped on the way out."""
    process = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)


def wait_for(process: subprocess.Popen[str], word: str) -> None:
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    if line != word:
        _, err = process.communicate(timeout=30)
        pytest.fail(f"child said {line!r} instead of {word!r}; stderr:\n{err}")


def counts(path: Path, run_id: str) -> dict[str, int]:
    conn = duckdb.connect(str(path), read_only=True)
    try:
        return {
            table: conn.execute(
                f"SELECT count(*) FROM {table} WHERE run_id = ?", [run_id]
            ).fetchall()[0][0]
            for table in ("runs", "cells", "latency", "samples")
        }
    finally:
        conn.close()


def test_open_waits_for_another_process_to_release_the_lock(db_path: Path) -> None:
    Store.open(db_path).close()
    waits: list[LockWait] = []
    with child(HOLD_LOCK, str(db_path), "1.5") as holder:
        wait_for(holder, "locked")
        started = time.monotonic()

        with Store.open(db_path, wait_s=30, on_wait=waits.append) as store:
            waited = time.monotonic() - started
            bundle = make_bundle("run-1")
            assert store.write_run(bundle, make_samples(bundle))

        assert holder.wait(timeout=30) == 0
    assert waited > 0.5
    assert len(waits) == 1
    assert waits[0].pid == holder.pid
    assert waits[0].path == db_path


def test_open_gives_up_with_the_holder_pid_after_wait_s(db_path: Path) -> None:
    Store.open(db_path).close()
    with child(HOLD_LOCK, str(db_path), "60") as holder:
        wait_for(holder, "locked")
        started = time.monotonic()

        with pytest.raises(MatrixLockedError) as caught:
            Store.open(db_path, wait_s=0.4)

        elapsed = time.monotonic() - started
    assert 0.4 <= elapsed < 5
    assert caught.value.pid == holder.pid
    assert f"locked by PID {holder.pid}" in str(caught.value)
    assert str(db_path) in str(caught.value)


def test_a_copy_waits_for_the_writer_then_gives_up_naming_it(db_path: Path) -> None:
    Store.open(db_path).close()
    with child(HOLD_LOCK, str(db_path), "60") as holder:
        wait_for(holder, "locked")
        waits: list[LockWait] = []
        with pytest.raises(MatrixLockedError, match=f"locked by PID {holder.pid}"):
            Store.open_copy(db_path, wait_s=0.4, on_wait=waits.append)
    assert waits and waits[0].pid == holder.pid
    with child(HOLD_LOCK, str(db_path), "1") as holder:
        wait_for(holder, "locked")
        with Store.open_copy(db_path, wait_s=30) as copy:
            assert copy.runs() == []


def test_a_writer_killed_inside_its_transaction_leaves_no_partial_run(db_path: Path) -> None:
    with child(BIG_WRITE, str(db_path), "1000000", "pause") as writer:
        wait_for(writer, "writing")
        wait_for(writer, "inside")
        writer.send_signal(signal.SIGKILL)
        assert writer.wait(timeout=30) == -signal.SIGKILL

    assert counts(db_path, "run-big") == {"runs": 0, "cells": 0, "latency": 0, "samples": 0}
    assert counts(db_path, "run-small")["runs"] == 1
    with Store.open(db_path) as store:
        assert [run.run_id for run in store.runs()] == ["run-small"]
        bundle = make_bundle("run-big")
        assert store.write_run(bundle, make_samples(bundle)) is True


@pytest.mark.parametrize("seed", [1, 2])
def test_a_writer_killed_at_a_random_moment_leaves_all_or_nothing(db_path: Path, seed: int) -> None:
    rows = 3_000_000
    delay = random.Random(seed).uniform(0.0, 1.0)
    with child(BIG_WRITE, str(db_path), str(rows), "run") as writer:
        wait_for(writer, "writing")
        time.sleep(delay)
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)

    big = counts(db_path, "run-big")
    assert big in (
        {"runs": 0, "cells": 0, "latency": 0, "samples": 0},
        {"runs": 1, "cells": 2, "latency": 4, "samples": rows},
    ), f"partial run after a kill {delay:.3f} s into the write: {big}"
    assert counts(db_path, "run-small")["runs"] == 1
