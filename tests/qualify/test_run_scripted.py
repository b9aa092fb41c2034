"""The whole run (`qualify_run`) driven through its worker seam by scripted processes: the
verdicts, cells, bundle and rollback check that each way a worker behaves must give."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from matrix.store import Store
from qualify.project.load import load_project
from qualify.run import RunOptions, RunOutcome, qualify_run
from tests.qualify.projects import write_project
from tests.qualify.scripted import CPU, Script, ScriptedWorkers, digest_of

BASELINE = "identity_mlp"
CANDIDATE = "classifier"


def _run(tmp_path: Path, baseline: Script, candidate: Script) -> tuple[RunOutcome, ScriptedWorkers]:
    project = write_project(tmp_path, [CANDIDATE])
    models = tmp_path / "models"
    workers = ScriptedWorkers(
        {
            digest_of(models / f"{BASELINE}.onnx"): baseline,
            digest_of(models / f"{CANDIDATE}.onnx"): candidate,
        }
    )
    outcome = qualify_run(
        load_project(project),
        "here-cpu",
        RunOptions(db_path=tmp_path / "m.duckdb", measure_alone=False),
        workers=workers.seam(),
    )
    return outcome, workers


def _cells(outcome: RunOutcome) -> dict[str, tuple[str, list[str]]]:
    return {c.artifact_name: (c.verdict, [r.code for r in c.reasons]) for c in outcome.bundle.cells}


def test_a_scripted_run_lands_in_the_matrix_with_the_verdicts_its_workers_earned(
    tmp_path: Path,
) -> None:
    fallback = Script(placement={CPU: 7, "CUDAExecutionProvider": 3})
    outcome, workers = _run(tmp_path, Script(), fallback)
    assert _cells(outcome) == {
        BASELINE: ("pass", []),
        CANDIDATE: ("fail", ["provider_fallback"]),
    }
    assert outcome.written and outcome.bundle_path.exists()
    with Store.open(tmp_path / "m.duckdb", read_only=True) as db:
        stored = {c.artifact_name: c.verdict for c in db.latest_cells()}
    assert stored == {BASELINE: "pass", CANDIDATE: "fail"}
    # Each artifact had its own process, and the baseline a second one (its A/A control).
    # With no manifest yet the class rolls back to the baseline, which this run measured: that
    # cell is the proof, no extra process needed.
    assert len(workers.started) == 3 and all(w.rounds >= 2 for w in workers.started)
    assert workers.started[2].job.expected_digest == outcome.bundle.cells[0].artifact_digest
    rollback = outcome.bundle.run.rollback
    assert rollback is not None and rollback.loaded
    assert rollback.artifact_digest == outcome.bundle.cells[0].artifact_digest
    assert workers.checked == []


def test_a_candidate_twice_as_slow_fails_max_slowdown_and_its_twin_passes(tmp_path: Path) -> None:
    slow, _ = _run(tmp_path / "slow", Script(latency_s=0.001), Script(latency_s=0.002))
    verdict, codes = _cells(slow)[CANDIDATE]
    assert (verdict, codes) == ("fail", ["slower_than_baseline"])
    twin, _ = _run(tmp_path / "twin", Script(latency_s=0.001), Script(latency_s=0.001))
    assert _cells(twin)[CANDIDATE] == ("pass", [])


def test_a_candidate_that_dies_in_its_first_round_is_an_error_and_the_baseline_still_lands(
    tmp_path: Path,
) -> None:
    outcome, _ = _run(tmp_path, Script(), Script(dies="round"))
    assert _cells(outcome) == {BASELINE: ("pass", []), CANDIDATE: ("error", ["crashed"])}
    died = next(c for c in outcome.bundle.cells if c.artifact_name == CANDIDATE)
    assert died.latency == [] and died.peak_rss_mb is None and died.placement is None


def test_a_baseline_that_never_gets_ready_leaves_the_candidate_without_parity(
    tmp_path: Path,
) -> None:
    outcome, _ = _run(tmp_path, Script(dies="ready"), Script())
    cells = _cells(outcome)
    assert cells[BASELINE] == ("error", ["crashed"])
    assert cells[CANDIDATE] == ("insufficient", ["baseline_failed"])


def test_candidate_outputs_off_the_baseline_fail_parity_with_the_measured_error(
    tmp_path: Path,
) -> None:
    off = {"y": np.linspace(0.0, 1.0, 64, dtype=np.float32).reshape(4, 16) + 0.5}
    outcome, _ = _run(tmp_path, Script(), Script(outputs=off))
    assert _cells(outcome)[CANDIDATE] == ("fail", ["parity_failed"])
    reason = next(c for c in outcome.bundle.cells if c.artifact_name == CANDIDATE).reasons[0]
    assert "max_abs 0.5" in reason.message


def test_a_baseline_that_cannot_run_refutes_the_rollback_to_it(tmp_path: Path) -> None:
    outcome, workers = _run(tmp_path, Script(dies="round"), Script())
    rollback = outcome.bundle.run.rollback
    assert rollback is not None and not rollback.loaded
    assert "ended at round" in (rollback.error or "")
    assert workers.checked == []


def test_progress_is_said_after_every_round_with_samples_bounds_and_time_left(
    tmp_path: Path,
) -> None:
    project = write_project(tmp_path, [CANDIDATE])
    models = tmp_path / "models"
    workers = ScriptedWorkers(
        {digest_of(models / f"{n}.onnx"): Script() for n in (BASELINE, CANDIDATE)}
    )
    said: list[str] = []
    qualify_run(
        load_project(project),
        "here-cpu",
        RunOptions(db_path=tmp_path / "m.duckdb", measure_alone=False),
        workers=workers.seam(),
        on_progress=said.append,
    )
    rounds = sum(w.rounds for w in workers.started) // len(workers.started)
    assert len(said) >= rounds  # one line per interleaved round, per config
    first, last = said[0], said[-1]
    assert first.startswith("batch 1, concurrency 1: round 1 (at least ")
    assert f"{BASELINE} " in first and f"{CANDIDATE} " in first
    assert "budget 50 ms" in first and "s left" in first
    assert "p99 <= " in last and "at most 0 s left" in last


def test_a_slowdown_within_the_spread_of_two_baseline_processes_is_not_called_slower(
    tmp_path: Path,
) -> None:
    # The baseline's second process (its A/A control) is 6% slower than its first, as two
    # processes of one artifact can be: a candidate 4% slower than the first is within that.
    base = Script(per_process=(1.0, 1.06))
    outcome, _ = _run(tmp_path, base, Script(latency_s=0.002 * 1.04))
    assert _cells(outcome)[CANDIDATE] == ("pass", [])
    baseline, candidate = outcome.bundle.cells
    ratio = candidate.latency[0].vs_baseline
    assert ratio is not None and ratio.p50_spread is not None
    assert ratio.p50_spread > 1.04  # what the control showed, beyond the rounds' own noise
    assert ratio.p50_lower is not None and ratio.p50_lower <= 1.0
    assert ratio.p50_detectable is not None and ratio.p50_detectable > 1.04
    control = baseline.latency[0].control
    assert control is not None and control.p50_ratio is not None and control.p50_ratio > 1.05
    assert len(baseline.latency[0].control_rounds) == len(baseline.latency[0].rounds)


def test_the_run_says_how_big_a_slowdown_it_could_have_seen(tmp_path: Path) -> None:
    project = write_project(tmp_path, [CANDIDATE])
    models = tmp_path / "models"
    workers = ScriptedWorkers(
        {digest_of(models / f"{n}.onnx"): Script() for n in (BASELINE, CANDIDATE)}
    )
    said: list[str] = []
    qualify_run(
        load_project(project),
        "here-cpu",
        RunOptions(db_path=tmp_path / "m.duckdb", measure_alone=False),
        workers=workers.seam(),
        on_event=said.append,
    )
    (line,) = [s for s in said if s.startswith(f"{CANDIDATE}: p50 x")]
    assert ", A/A spread x1.0" in line and ", 40 paired rounds)" in line
    assert ": could have seen a p50 slowdown from x1.0" in line


def test_a_slowdown_beyond_the_spread_is_called_slower_and_says_the_spread(
    tmp_path: Path,
) -> None:
    outcome, _ = _run(tmp_path, Script(per_process=(1.0, 1.06)), Script(latency_s=0.002 * 1.3))
    verdict, codes = _cells(outcome)[CANDIDATE]
    assert (verdict, codes) == ("fail", ["slower_than_baseline"])
    said = outcome.bundle.cells[1].reasons[0].message
    assert "net of the A/A control's spread x1.0" in said


def test_without_the_control_the_same_candidate_is_called_slower(tmp_path: Path) -> None:
    project = write_project(tmp_path, [CANDIDATE])
    project.write_text(
        project.read_text().replace("  warmup: 10\n", "  warmup: 10\n  aa_control: false\n")
    )
    models = tmp_path / "models"
    workers = ScriptedWorkers(
        {
            digest_of(models / f"{BASELINE}.onnx"): Script(per_process=(1.0, 1.06)),
            digest_of(models / f"{CANDIDATE}.onnx"): Script(latency_s=0.002 * 1.04),
        }
    )
    outcome = qualify_run(
        load_project(project),
        "here-cpu",
        RunOptions(db_path=tmp_path / "m.duckdb", measure_alone=False),
        workers=workers.seam(),
    )
    assert len(workers.started) == 2  # no control
    assert _cells(outcome)[CANDIDATE] == ("fail", ["slower_than_baseline"])
    ratio = outcome.bundle.cells[1].latency[0].vs_baseline
    assert ratio is not None and ratio.p50_spread is None


def test_a_candidate_falling_back_on_some_nodes_names_them_in_the_cell_and_matrix_show_json(
    tmp_path: Path,
) -> None:
    import json

    from click.testing import CliRunner

    from qualify.cli import cli

    off = (("attn/Softmax", "Softmax"), ("head/TopK", "TopK"), ("post/NonMaxSuppression", "NMS"))
    fallback = Script(placement={CPU: 3, "CUDAExecutionProvider": 197}, off_provider=off)
    outcome, _ = _run(tmp_path, Script(), fallback)
    cell = next(c for c in outcome.bundle.cells if c.artifact_name == CANDIDATE)
    assert cell.placement is not None and cell.placement.fallback_nodes == 197
    named = [(n.name, n.op_type) for n in cell.placement.off_provider_nodes or []]
    assert named == list(off)  # the script names 3 of the 197: the cell keeps what was named
    expected = [
        {"name": name, "op_type": op, "domain": "", "provider": "CUDAExecutionProvider"}
        for name, op in off
    ]
    db = str(tmp_path / "m.duckdb")
    # As measured (no project file), and under the project file now.
    for project in (tmp_path / "none.yaml", tmp_path / "qualify.yaml"):
        args = ["matrix", "show", "--db", db, "--project", str(project), "--format", "json"]
        shown = CliRunner().invoke(cli, args)
        assert shown.exit_code == 0, shown.output
        rows = {r["artifact_name"]: r for r in json.loads(shown.output)}
        assert rows[CANDIDATE]["off_provider_nodes"] == expected
        assert rows[BASELINE]["off_provider_nodes"] == []
