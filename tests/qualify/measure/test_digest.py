"""The artifact's bytes are held to its digest by the parent around the child's load, with real
children on a real small model; the child itself never loads hashlib (OpenSSL's ~3.5 MB would
land in its measured peak)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx

from qualify.measure.runner import ServedWorker, run_worker
from schemas.atomic import file_sha256 as file_digest
from tests.models import build
from tests.qualify.jobs import make_job

ROOT = Path(__file__).resolve().parents[3]


def _flip_a_bit(path: Path) -> None:
    """One flipped bit in the middle of the first weight's bytes: onnxruntime still loads the
    model without a word."""
    data = bytearray(path.read_bytes())
    raw = onnx.load(str(path)).graph.initializer[0].raw_data
    at = data.find(raw)
    assert at > 0 and len(raw) > 8
    data[at + len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_file_modified_after_its_digest_was_taken_is_refused_before_any_child_starts(
    tmp_path: Path,
) -> None:
    model = build("identity_mlp", tmp_path)
    job = make_job(tmp_path, model)
    _flip_a_bit(model)
    started: list[int] = []
    outcome = run_worker(job, tmp_path / "w", timeout_s=60, on_start=started.append)
    assert started == []
    assert outcome.error_code == "digest_mismatch"
    assert outcome.error_message == (
        f"{model} has {file_digest(str(model))} before the measuring process started, "
        f"expected {job.expected_digest}; the file was modified"
    )
    assert outcome.peak_rss_mb is None


def test_a_file_modified_while_the_child_loads_it_is_a_digest_mismatch(tmp_path: Path) -> None:
    model = build("identity_mlp", tmp_path)
    job = make_job(tmp_path, model)
    # The child is started and has not yet imported onnxruntime: it loads the modified bytes.
    outcome = run_worker(job, tmp_path / "w", timeout_s=60, on_start=lambda _: _flip_a_bit(model))
    assert outcome.result.ok, outcome.error_message  # the child loaded them without a word
    assert outcome.error_code == "digest_mismatch"
    assert outcome.error_message == (
        f"{model} has {file_digest(str(model))} after the measuring process loaded it, "
        f"expected {job.expected_digest}; the file was modified"
    )


def test_a_file_that_holds_its_bytes_is_measured(tmp_path: Path) -> None:
    model = build("identity_mlp", tmp_path)
    outcome = run_worker(make_job(tmp_path, model), tmp_path / "w", timeout_s=60)
    assert (outcome.error_code, outcome.error_message) == (None, None)
    assert outcome.result.ok


def test_a_served_child_whose_file_changes_while_it_prepares_is_stopped(tmp_path: Path) -> None:
    model = build("identity_mlp", tmp_path)
    job = make_job(tmp_path, model, mode="serve")
    worker = ServedWorker(job, tmp_path / "w", timeout_s=60, on_start=lambda _: _flip_a_bit(model))
    try:
        assert not worker.ready()
        assert not worker.alive
        outcome = worker.finish([])
    finally:
        worker.close()
    assert outcome.error_code == "digest_mismatch"
    assert "after the measuring process loaded it" in (outcome.error_message or "")
    assert f"expected {job.expected_digest}" in (outcome.error_message or "")


def test_a_served_child_is_not_started_on_bytes_that_do_not_match(tmp_path: Path) -> None:
    model = build("identity_mlp", tmp_path)
    job = make_job(tmp_path, model, mode="serve", expected_digest="sha256:" + "0" * 64)
    started: list[int] = []
    worker = ServedWorker(job, tmp_path / "w", timeout_s=60, on_start=started.append)
    assert (worker.ready(), worker.alive, worker.pid, started) == (False, False, -1, [])
    assert worker.round({"key": "b1c1"}) is None
    outcome = worker.finish([])
    worker.close()
    assert outcome.error_code == "digest_mismatch"
    assert "before the measuring process started, expected sha256:000" in (
        outcome.error_message or ""
    )


def test_a_file_that_cannot_be_read_is_a_load_failure_naming_it(tmp_path: Path) -> None:
    model = build("identity_mlp", tmp_path)
    job = make_job(tmp_path, model)
    model.unlink()
    outcome = run_worker(job, tmp_path / "w", timeout_s=60)
    assert outcome.error_code == "load_failed"
    assert f"cannot read {model} before the measuring process started" in (
        outcome.error_message or ""
    )


def test_the_measuring_child_never_loads_hashlib(tmp_path: Path) -> None:
    model = build("identity_mlp", tmp_path)
    job = make_job(tmp_path, model, mode="full", result_path=str(tmp_path / "result.json"))
    (tmp_path / "job.json").write_text(job.to_json(), encoding="utf-8")
    listing = tmp_path / "hashing.json"
    code = f"""
import atexit, json, runpy, sys
def hashing():
    found = [m for m in ("hashlib", "_hashlib") if m in sys.modules]  # _hashlib: OpenSSL's
    open({str(listing)!r}, "w").write(json.dumps(sorted(found)))
atexit.register(hashing)
sys.argv = ["qualify.measure.worker", {str(tmp_path / "job.json")!r}]
runpy.run_module("qualify.measure.worker", run_name="__main__")
"""
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True)
    assert json.loads((tmp_path / "result.json").read_text())["ok"] is True
    assert json.loads(listing.read_text()) == []
