"""Worker jobs for tests: built by `qualify.measure.job.job_for` from the project's own models, so a
test's job carries every field with the project file's defaults, exactly as a run's would."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from qualify.measure.job import JobMode, WorkerJob, job_for
from qualify.measure.workload import build_pool
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


def make_job(
    tmp_path: Path,
    model: Path,
    *,
    mode: JobMode = "check",
    workload: Workload | None = None,
    **changes: Any,
) -> WorkerJob:
    """A job for ``model`` on a CPU class with default settings: fed one float input ``x`` of 16
    features (four rows of ones), or ``workload``'s inputs as a run builds them; ``changes``
    replace fields of the job."""
    if workload is None:
        workload = Workload(
            inputs={"x": InputSpec(shape=[1, 16], source="recorded", file="in.npy")}
        )
        np.savez(tmp_path / "in.npz", x=np.ones((4, 16), np.float32))
    else:
        np.savez(tmp_path / "in.npz", **build_pool(workload, lambda f: tmp_path / f))
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
        workload=workload,
        root=tmp_path,
        inputs_path=tmp_path / "in.npz",
        work=tmp_path,
        mode=mode,
    )
    return dataclasses.replace(job, **changes)
