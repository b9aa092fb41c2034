"""One way from a worker's outcome to a cell, for run, tune and fleet."""

from __future__ import annotations

from datetime import UTC, datetime

from qualify.measure.cells import Artifact, CellSite, Measured, cell_of
from qualify.measure.job import PlacementReport, WorkerResult
from qualify.measure.runner import WorkerOutcome
from schemas.cell import Reason
from schemas.project import HostClassKey
from tests.manifest.factories import FINGERPRINT

# A runtime version other than the one installed here, so a cell that took it from the host
# rather than from the fingerprint would show.
FP = FINGERPRINT.model_copy(
    update={"runtime": FINGERPRINT.runtime.model_copy(update={"version": "1.31.0"})}
)
SITE = CellSite(
    run_id="r1",
    host_class="x86-avx2",
    key=HostClassKey(hardware="x86-avx2", runtime="ort", provider="cpu"),
    settings_digest="sha256:" + "0" * 64,
    fingerprint=FP,
    measured_alone=True,
    fleet_node="node-1 (lab-01)",
)
ARTIFACT = Artifact(digest="sha256:" + "a" * 64, name="int8", role="candidate", precision="int8")
AT = datetime(2026, 1, 2, tzinfo=UTC)


def _outcome(result: WorkerResult, code: str | None = None) -> WorkerOutcome:
    return WorkerOutcome(
        result=result,
        error_code=code,
        error_message=f"it ended: {code}" if code else None,
        peak_rss_mb=None if code else 90.5,
        exit_status=0,
        signal_name=None,
        wall_s=1.0,
        peak_rss_source=None if code else "vmhwm",
        provider_log=[("[W:onnxruntime] fell back", 3)],
        containment="process-group+subreaper+tag",
        stray_processes=1,
    )


def test_a_measured_outcome_becomes_an_unjudged_cell_with_the_childs_figures() -> None:
    placement = PlacementReport(
        nodes_per_provider={"CPUExecutionProvider": 4},
        total_nodes=4,
        expected_provider="CPUExecutionProvider",
        fallback_nodes=0,
        session_providers=("CPUExecutionProvider",),
        source="graph_assignment",
    )
    result = WorkerResult(
        ok=True,
        runtime_version="1.32.0",
        cold_init_ms=12.0,
        warm_init_ms=6.0,
        import_hwm_kb=2048,
        import_ms=150.0,
        placement=placement,
        warnings=("said once",),
        cpus=(1,),
    )
    cell = cell_of(SITE, ARTIFACT, _outcome(result), AT)
    assert cell.verdict == "insufficient" and cell.reasons == [] and cell.error is None
    assert (cell.runtime_version, cell.cold_init_ms, cell.warm_init_ms) == ("1.32.0", 12.0, 6.0)
    assert (cell.import_rss_mb, cell.import_ms, cell.cpus) == (2.0, 150.0, [1])
    assert (cell.peak_rss_mb, cell.peak_rss_source) == (90.5, "vmhwm")
    assert cell.placement is not None and cell.placement.total_nodes == 4
    assert [(w.message, w.count) for w in cell.placement.warnings] == [
        ("said once", 1),
        ("[W:onnxruntime] fell back", 3),
    ]
    assert (cell.measured_alone, cell.fleet_node, cell.stray_processes) == (
        True,
        "node-1 (lab-01)",
        1,
    )


def test_a_timed_out_outcome_is_an_error_cell_with_its_reason_first() -> None:
    found = Reason(code="parity_failed", message="outputs differ")
    cell = cell_of(
        SITE, ARTIFACT, _outcome(WorkerResult(), "timeout"), AT, Measured(reasons=[found])
    )
    assert cell.verdict == "error"
    assert [r.code for r in cell.reasons] == ["timeout", "parity_failed"]
    assert cell.error == "it ended: timeout"
    # The child said nothing: the host's runtime stands in, nothing is made up.
    assert cell.runtime_version == "1.31.0"
    assert cell.placement is None and cell.cold_init_ms is None and cell.peak_rss_mb is None


def test_an_end_with_no_outcome_is_an_error_cell_that_measured_nothing() -> None:
    lost = Reason(code="node_lost", message="the host left mid-run")
    cell = cell_of(SITE, ARTIFACT, lost, AT)
    assert cell.verdict == "error" and cell.reasons == [lost]
    assert cell.error == "the host left mid-run"
    assert cell.placement is None and cell.latency == [] and cell.peak_rss_source is None
    assert cell.containment is None and cell.stray_processes is None
    assert cell.fleet_node == "node-1 (lab-01)"
