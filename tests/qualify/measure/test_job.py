"""The worker's job: one typed contract, every field from the project's models, nothing guessed."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qualify.measure.job import JobError, WorkerJob
from qualify.measure.runner import run_worker
from tests.models import build
from tests.qualify.jobs import make_job


@pytest.fixture
def job(tmp_path: Path) -> WorkerJob:
    return make_job(tmp_path, build("identity_mlp", tmp_path), mode="full")


def test_a_job_survives_its_json_unchanged(job: WorkerJob) -> None:
    assert WorkerJob.from_json(job.to_json()) == job


def test_the_job_carries_the_project_files_defaults(job: WorkerJob) -> None:
    from schemas.project import ProviderSpec, Workload

    workload = Workload.model_fields
    assert job.warmup == workload["warmup"].default
    assert job.min_samples == workload["min_samples"].default
    assert job.profile_runs == workload["profile_runs"].default
    assert job.time_cap_s is None
    level = ProviderSpec.model_fields["graph_optimization_level"].default
    assert job.provider.graph_optimization_level == level


@pytest.mark.parametrize("field", ["warmup", "profile_runs", "mode", "provider"])
def test_a_job_missing_a_field_is_refused_and_the_field_named(job: WorkerJob, field: str) -> None:
    doc = dataclasses.asdict(job)
    del doc[field]
    with pytest.raises(JobError, match=f"missing \\['{field}'\\]"):
        WorkerJob.from_json(json.dumps(doc))


def test_a_job_with_an_unknown_field_is_refused(job: WorkerJob) -> None:
    doc = dataclasses.asdict(job)
    doc["provider"]["intra_threads"] = 4
    with pytest.raises(JobError, match=r"job\.provider .*unknown \['intra_threads'\]"):
        WorkerJob.from_json(json.dumps(doc))


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])  # read only
@given(
    raw=st.binary(max_size=200), field=st.sampled_from(["configs", "provider", "mode"]), value=_JSON
)
def test_a_damaged_job_raises_job_error_and_nothing_else(
    job: WorkerJob, raw: bytes, field: str, value: object
) -> None:
    with contextlib.suppress(JobError):
        WorkerJob.from_json(raw)
    doc = dataclasses.asdict(job)
    doc[field] = value
    with contextlib.suppress(JobError):
        WorkerJob.from_json(json.dumps(doc))


def test_a_bad_mode_is_refused(job: WorkerJob) -> None:
    doc = dataclasses.asdict(job)
    doc["mode"] = "benchmark"
    with pytest.raises(JobError, match=r"job\.mode"):
        WorkerJob.from_json(json.dumps(doc))


def test_a_worker_handed_an_incomplete_job_measures_nothing_and_says_why(
    tmp_path: Path, job: WorkerJob
) -> None:
    # A worker of another version (or a hand-written job) must not fill the gap with a guess.
    doc = dataclasses.asdict(job)
    del doc["confidence"]
    path = tmp_path / "bad-job.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "qualify.measure.worker", str(path)],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert done.returncode == 2
    assert "missing ['confidence']" in done.stderr
    assert not Path(job.samples_path).exists()


def test_a_check_job_runs_in_a_real_worker(job: WorkerJob, tmp_path: Path) -> None:
    outcome = run_worker(dataclasses.replace(job, mode="check"), tmp_path / "w", timeout_s=120)
    assert outcome.error_code is None, outcome.error_message
    assert outcome.result.placement is not None
    assert outcome.result.placement.fallback_nodes == 0
