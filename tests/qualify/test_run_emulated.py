"""``qualify run --emulate`` through the whole run with scripted processes: parity judged on the
outputs computed on the class's emulated CPU, the host's own beside them, and every way a parity
pass under QEMU can fail said where it happened."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from matrix.store import Store
from qualify.project.load import load_project
from qualify.run import RunOptions, RunOutcome, qualify_run
from tests.qualify.emulated import FakeQemu, fake_runtime
from tests.qualify.projects import write_project
from tests.qualify.scripted import Script, ScriptedWorkers, digest_of

BASELINE = "identity_mlp"
CANDIDATE = "classifier"
NATIVE = {"y": np.linspace(0.0, 1.0, 64, dtype=np.float32).reshape(4, 16)}
SATURATED = {"y": NATIVE["y"] + np.float32(0.25)}  # what a saturating int8 kernel computes


def _run(
    tmp_path: Path, baseline: Script, candidate: Script, *, prepared: bool = True
) -> tuple[RunOutcome, ScriptedWorkers]:
    project = write_project(tmp_path, [CANDIDATE])
    models = tmp_path / "models"
    workers = ScriptedWorkers(
        {
            digest_of(models / f"{BASELINE}.onnx"): baseline,
            digest_of(models / f"{CANDIDATE}.onnx"): candidate,
        }
    )
    if prepared:
        fake_runtime(tmp_path / "emulators")
    options = RunOptions(
        db_path=tmp_path / "m.duckdb",
        emulate=True,
        measure_alone=False,
        emulators=FakeQemu().emulators(tmp_path / "emulators"),
    )
    # ``elsewhere`` is an ARM class with the dot product: this x86 host is not of it.
    outcome = qualify_run(load_project(project), "elsewhere", options, workers=workers.seam())
    return outcome, workers


def test_parity_is_judged_on_the_emulated_cpus_outputs_with_this_hosts_beside_them(
    tmp_path: Path,
) -> None:
    outcome, workers = _run(tmp_path, Script(), Script(emulated_outputs=SATURATED))
    base, cand = outcome.bundle.cells
    assert cand.parity is not None and not cand.parity.passed  # 0.25 off on the N1's kernels
    assert cand.parity.outputs[0].max_abs is not None
    assert abs(cand.parity.outputs[0].max_abs - 0.25) < 1e-6
    assert cand.verdict == "fail" and [r.code for r in cand.reasons] == ["parity_failed"]
    for cell in (base, cand):
        assert cell.numerics is not None
        assert (cell.numerics.source, cell.numerics.cpu, cell.numerics.qemu) == (
            "emulated",
            "neoverse-n1",
            "7.2.22",
        )
        assert cell.isa_mismatch == [] and cell.emulated  # ARM's numerics; x86's latency
    assert cand.numerics is not None and cand.numerics.native_max_abs == {"y": 0.0}
    assert base.numerics is not None and base.numerics.native_max_abs is None
    # One parity pass per artifact, each a "parity" job under the plan's launch.
    assert [job.mode for job, _ in workers.emulated_jobs] == ["parity", "parity"]
    assert all(launch.argv[2] == "neoverse-n1" for _, launch in workers.emulated_jobs)
    with Store.open(tmp_path / "m.duckdb", read_only=True) as db:
        rows = {r["artifact_name"]: r for r in db.matrix_rows()}
        stored = {c.artifact_name: c.numerics for c in db.latest_cells()}
    assert {r["numerics"] for r in rows.values()} == {"emulated"}
    assert {r["numerics_cpu"] for r in rows.values()} == {"neoverse-n1"}
    assert stored[CANDIDATE] == cand.numerics


def test_a_candidate_whose_pass_fails_under_qemu_has_no_parity_and_says_why(
    tmp_path: Path,
) -> None:
    outcome, _ = _run(tmp_path, Script(), Script(emulated_error="crashed"))
    cand = outcome.bundle.cells[1]
    assert cand.parity is None and cand.verdict == "insufficient"
    (reason,) = cand.reasons
    assert reason.code == "emulation_failed"
    assert "its parity pass on emulated neoverse-n1 failed (crashed" in reason.message
    assert cand.numerics is not None and cand.numerics.source == "emulated"
    assert cand.numerics.note is not None and "parity pass failed: crashed" in cand.numerics.note


def test_a_baseline_whose_pass_fails_under_qemu_leaves_every_candidate_unjudged(
    tmp_path: Path,
) -> None:
    outcome, _ = _run(tmp_path, Script(emulated_error="timeout"), Script())
    base, cand = outcome.bundle.cells
    assert base.verdict == "pass"  # it ran natively; only its outputs on the N1 are missing
    assert base.numerics is not None and "its pass failed: timeout" in (base.numerics.note or "")
    assert cand.parity is None and [r.code for r in cand.reasons] == ["emulation_failed"]
    assert "the baseline's parity pass" in cand.reasons[0].message


def test_an_artifact_that_failed_natively_gets_no_pass_under_qemu(tmp_path: Path) -> None:
    outcome, workers = _run(tmp_path, Script(), Script(dies="ready"))
    assert [c.verdict for c in outcome.bundle.cells] == ["pass", "error"]
    assert len(workers.emulated_jobs) == 1  # the baseline's only


def test_without_a_prepared_runtime_the_run_keeps_this_hosts_numerics_and_says_so(
    tmp_path: Path,
) -> None:
    outcome, workers = _run(tmp_path, Script(), Script(), prepared=False)
    cand = outcome.bundle.cells[1]
    assert workers.emulated_jobs == []
    assert cand.numerics is not None and cand.numerics.source == "other_isa"
    assert cand.isa_mismatch and cand.parity is not None and cand.parity.passed
    assert "qualify emulators prepare --class elsewhere" in (cand.numerics.note or "")
