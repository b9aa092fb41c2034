"""Placement by node: which nodes (name, op type) ran off the expected provider, from a real
onnxruntime session's graph assignment, bounded to the first `OFF_PROVIDER_KEPT`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from qualify.measure.job import WorkerJob
from qualify.measure.runner import run_worker
from schemas.rules import OFF_PROVIDER_KEPT
from tests.models import build, padded_mlp
from tests.qualify.jobs import make_job

# Shipped in every CPU wheel, and it implements only Azure's own operators: with it expected
# (first in the list), every standard node of the graph lands on the CPU provider: a real
# fallback, chosen by onnxruntime, on a machine without a GPU.
AZURE = "AzureExecutionProvider"
CPU = "CPUExecutionProvider"


def _expecting_azure(tmp_path: Path, model: Path) -> WorkerJob:
    job = make_job(tmp_path, model, mode="check")
    provider = dataclasses.replace(job.provider, execution_providers=(AZURE, CPU), expected=AZURE)
    return dataclasses.replace(job, provider=provider)


def test_nodes_that_ran_off_the_expected_provider_are_named_with_their_op_types(
    tmp_path: Path,
) -> None:
    job = _expecting_azure(tmp_path, build("identity_mlp", tmp_path))
    outcome = run_worker(job, tmp_path / "w", timeout_s=120)
    assert outcome.error_code is None, outcome.error_message
    placement = outcome.result.placement
    assert placement is not None and placement.source == "graph_assignment"
    assert placement.fallback_nodes == placement.total_nodes > 0
    off = placement.off_provider_nodes
    assert len(off) == placement.fallback_nodes
    assert {n.provider for n in off} == {CPU}
    # The graph's own nodes, as onnxruntime names them after its optimisations (the first
    # MatMul and Add fuse into one Gemm): the names and op types come from the session.
    assert {"relu", "fc2/MatMul"} <= {n.name for n in off}
    assert {"Relu", "MatMul"} <= {n.op_type for n in off}


def test_a_large_fallback_names_the_first_nodes_and_counts_them_all(tmp_path: Path) -> None:
    model = padded_mlp(tmp_path, extra=OFF_PROVIDER_KEPT + 10)
    outcome = run_worker(_expecting_azure(tmp_path, model), tmp_path / "w", timeout_s=120)
    assert outcome.error_code is None, outcome.error_message
    placement = outcome.result.placement
    assert placement is not None
    assert placement.fallback_nodes > OFF_PROVIDER_KEPT
    assert len(placement.off_provider_nodes) == OFF_PROVIDER_KEPT
    assert len({n.name for n in placement.off_provider_nodes}) == OFF_PROVIDER_KEPT


def test_nothing_is_named_when_every_node_ran_where_expected(tmp_path: Path) -> None:
    job = make_job(tmp_path, build("identity_mlp", tmp_path), mode="check")
    outcome = run_worker(job, tmp_path / "w", timeout_s=120)
    assert outcome.error_code is None, outcome.error_message
    assert outcome.result.placement is not None
    assert outcome.result.placement.fallback_nodes == 0
    assert outcome.result.placement.off_provider_nodes == ()


def test_placement_falls_back_to_the_profiler_on_an_onnxruntime_without_the_api(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from qualify.measure import session, worker

    model = build("classifier", tmp_path)
    job = make_job(tmp_path, model)
    measured: dict[str, object] = {"warnings": []}
    worker._measure(job, measured)
    by_api = measured["placement"]
    assert isinstance(by_api, dict) and by_api["source"] == "graph_assignment"

    # An older build: the session has no get_provider_graph_assignment_info.
    monkeypatch.setattr(session, "_placement", lambda _session, _expected: None)
    old: dict[str, object] = {"warnings": []}
    worker._measure(job, old)
    by_profiler = old["placement"]
    assert isinstance(by_profiler, dict) and by_profiler["source"] == "profiler"
    # The profiler counts kernels that ran, after fusions (fewer than the assigned nodes on a
    # QDQ graph); on this two-node classifier the two counts coincide, all on the CPU.
    assert by_profiler["nodes_per_provider"] == by_api["nodes_per_provider"]
    assert by_profiler["fallback_nodes"] == 0
    assert not list(tmp_path.glob("place*.json")), "the profile file is removed"
