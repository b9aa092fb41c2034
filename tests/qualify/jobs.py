"""Worker jobs for tests: built by `qualify.job.job_for` from the project's own models, so a
test's job carries every field with the project file's defaults, exactly as a run's would."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from qualify.job import JobMode, WorkerJob, job_for
from schemas.project import (
    Budgets,
    HostClass,
    HostClassKey,
    InputSpec,
    MatchRules,
    ProviderSpec,
    RuntimeSpec,
    Workload,
)


def make_job(tmp_path: Path, model: Path, *, mode: JobMode = "check", **changes: Any) -> WorkerJob:
    """A job for ``model`` (one float input ``x`` of 16 features, four recorded rows) on a CPU
    class with default settings; ``changes`` replace fields of the job."""
    np.savez(tmp_path / "in.npz", x=np.ones((4, 16), np.float32))
    host_class = HostClass(
        key=HostClassKey(hardware="test", runtime="ort", provider="cpu"),
        match=MatchRules(),
        runtime=RuntimeSpec(package="onnxruntime", version="*"),
        provider=ProviderSpec(execution_providers=["CPUExecutionProvider"]),
        budgets=Budgets(p99_ms=10_000.0),
    )
    job = job_for(
        artifact_path=model,
        digest="sha256:" + hashlib.sha256(model.read_bytes()).hexdigest(),
        host_class=host_class,
        workload=Workload(inputs={"x": InputSpec(shape=[1, 16], source="recorded", file="in.npy")}),
        root=tmp_path,
        inputs_path=tmp_path / "in.npz",
        work=tmp_path,
        mode=mode,
    )
    return dataclasses.replace(job, **changes)
