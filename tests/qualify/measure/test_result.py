"""The child's result: one typed document, read once, refused with the field named when damaged."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qualify.measure.job import (
    RESULT_MOST_BYTES,
    OffNode,
    PlacementReport,
    ResultError,
    WorkerError,
    WorkerResult,
)
from qualify.measure.runner import Launch, run_worker
from schemas.rules import OFF_PROVIDER_KEPT
from tests.models import build
from tests.qualify.jobs import make_job

FULL = WorkerResult(
    ok=False,
    error=WorkerError(code="run_failed", message="it raised", traceback="File x, line 1"),
    pid=4242,
    subreaper=True,
    cpus=(0, 1),
    runtime_import_ms=80.5,
    import_ms=120.25,
    import_hwm_kb=51200,
    runtime_version="1.32.0",
    warnings=("a warning",),
    session_create_ms=3.5,
    cold_init_ms=4.5,
    warm_init_ms=2.0,
    placement=PlacementReport(
        nodes_per_provider={"CPUExecutionProvider": 3, "CUDAExecutionProvider": 5},
        total_nodes=8,
        expected_provider="CUDAExecutionProvider",
        fallback_nodes=3,
        session_providers=("CUDAExecutionProvider", "CPUExecutionProvider"),
        source="graph_assignment",
        off_provider_nodes=(
            OffNode(name="relu", op_type="Relu", domain="", provider="CPUExecutionProvider"),
        ),
    ),
    hwm_before_warm_kb=60000,
    hwm_before_profile_kb=61000,
    hwm_before_open_loop_kb=62000,
    kernel_ms_per_provider={"CPUExecutionProvider": 0.25},
    configs=({"batch_size": 1, "concurrency": 1, "stopped": "decided", "p99_upper_ms": None},),
    throughput_ips={"b1_c1": 950.0},
    rows=16,
    vm_hwm_kb=63000,
    imported_at_peak=("numpy", "onnxruntime"),
)


def test_a_result_with_every_field_survives_its_json_unchanged() -> None:
    assert WorkerResult.from_json(json.dumps(dataclasses.asdict(FULL))) == FULL


def test_a_result_that_says_little_takes_the_defaults() -> None:
    found = WorkerResult.from_json(b'{"pid": 7, "subreaper": false, "ok": true}')
    assert found == WorkerResult(ok=True, pid=7, subreaper=False)
    assert found.placement is None and found.throughput_ips == {}


@pytest.mark.parametrize(
    ("doc", "named"),
    [
        ({"cold_init_ms": "fast"}, r"result\.cold_init_ms is 'fast', not a number"),
        ({"ok": 1}, r"result\.ok is 1, not true or false"),
        ({"cpus": [0, "1"]}, r"result\.cpus\[1\] is '1', not an integer"),
        ({"error": {"code": "x"}}, r"result\.error\.message is None, not a string"),
        ({"placement": {"total_nodes": 3}}, r"result\.placement lacks"),
        ({"throughput_ips": {"b1_c1": True}}, r"result\.throughput_ips\.b1_c1 is True"),
        ({"peak": 3}, r"fields this qualify does not know: \['peak'\]"),
        ([1, 2], r"result is list, not an object"),
    ],
)
def test_a_damaged_result_is_refused_naming_the_field(doc: object, named: str) -> None:
    with pytest.raises(ResultError, match=named):
        WorkerResult.from_json(json.dumps(doc))


def test_a_result_naming_more_off_provider_nodes_than_a_cell_keeps_is_refused() -> None:
    doc = dataclasses.asdict(FULL)
    node = doc["placement"]["off_provider_nodes"][0]
    doc["placement"]["off_provider_nodes"] = [node] * (OFF_PROVIDER_KEPT + 1)
    with pytest.raises(ResultError, match=r"result\.placement\.off_provider_nodes names 21"):
        WorkerResult.from_json(json.dumps(doc))


def test_a_result_over_the_bound_is_refused_before_it_is_parsed() -> None:
    with pytest.raises(ResultError, match="over"):
        WorkerResult.from_json(b" " * (RESULT_MOST_BYTES + 1))


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)


@given(
    raw=st.binary(max_size=200),
    field=st.sampled_from([f.name for f in dataclasses.fields(WorkerResult)]),
    value=_JSON,
)
def test_a_damaged_result_raises_result_error_and_nothing_else(
    raw: bytes, field: str, value: object
) -> None:
    with contextlib.suppress(ResultError):
        WorkerResult.from_json(raw)
    doc = dataclasses.asdict(FULL)
    doc[field] = value
    with contextlib.suppress(ResultError):
        WorkerResult.from_json(json.dumps(doc))


_DAMAGING_CHILD = """
import json, sys
job = json.load(open(sys.argv[-1]))
with open(job["result_path"], "w") as fh:
    fh.write('{"ok": true, "cold_init_ms": "quick"}')
"""


def test_a_child_that_writes_a_damaged_result_ends_as_crashed_and_says_which_field(
    tmp_path: Path,
) -> None:
    # A real subprocess through the real runner: only what it writes is damaged.
    script = tmp_path / "damaging_child.py"
    script.write_text(_DAMAGING_CHILD, encoding="utf-8")
    job = make_job(tmp_path, build("identity_mlp", tmp_path))
    outcome = run_worker(
        job, tmp_path / "w", timeout_s=60, launch=Launch((sys.executable, str(script)), {})
    )
    assert outcome.error_code == "crashed"
    assert outcome.error_message is not None
    assert "damaged result" in outcome.error_message
    assert "result.cold_init_ms" in outcome.error_message
    assert outcome.result == WorkerResult()


def test_the_measuring_child_writes_a_result_the_parent_reads_whole(tmp_path: Path) -> None:
    # Every key the real child writes is one WorkerResult knows (a new key the parser lacks
    # would end every real run as a damaged result).
    outcome = run_worker(
        make_job(tmp_path, build("identity_mlp", tmp_path), mode="full"),
        tmp_path / "w",
        timeout_s=120,
    )
    assert outcome.error_code is None, outcome.error_message
    result = outcome.result
    assert result.ok and result.runtime_version and result.cold_init_ms is not None
    assert result.placement is not None and result.placement.total_nodes > 0
    assert result.configs and result.configs[0]["batch_size"] == 1
    assert result.vm_hwm_kb is not None and "onnxruntime" in result.imported_at_peak
