"""qualify tune: the search space, the race, the proof by a full qualification run, the edit of
the project file, and the trials kept apart from the decision matrix."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from matrix.store import Store
from qualify.errors import ProjectError
from qualify.measure.job import WorkerJob
from qualify.project.load import load_project
from qualify.run import RunOptions
from qualify.tune import TuneOptions, search_space, tune_class
from schemas.project import ProviderSpec
from tests.qualify.projects import write_project
from tests.qualify.scripted import Script, ScriptedWorkers


def test_the_search_starts_from_the_current_settings_and_changes_one_thing_at_a_time() -> None:
    provider = ProviderSpec(intra_op_threads=2)
    space = search_space(provider, cores=2, precision="int8", cpus=[0, 1], max_trials=32)
    assert space[0] == {}
    assert {"intra_op_threads": 1} in space
    assert {"session_config": {"session.intra_op.allow_spinning": "0"}} in space
    assert {"graph_optimization_level": "extended"} in space
    assert {"execution_mode": "parallel", "inter_op_threads": 2} in space
    assert {"session_config": {"session.x64quantprecision": "1"}} in space  # int8 only
    assert {"cpu_affinity": [0], "intra_op_threads": 1} in space
    assert len(space) == len({str(s) for s in space})  # no configuration twice
    assert {"session_config": {"session.x64quantprecision": "1"}} not in search_space(
        provider, cores=2, precision="fp32", cpus=[0, 1], max_trials=32
    )
    assert len(search_space(provider, cores=2, precision="int8", cpus=[0, 1], max_trials=3)) == 3


def test_a_cuda_class_also_races_the_providers_own_options() -> None:
    provider = ProviderSpec(execution_providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    space = search_space(provider, cores=4, precision="fp16", cpus=[0, 1, 2, 3], max_trials=32)
    options = [s["provider_options"] for s in space if "provider_options" in s]
    assert {"CUDAExecutionProvider": {"cudnn_conv_algo_search": "HEURISTIC"}} in options


@dataclass
class BySettings(ScriptedWorkers):
    """Scripted workers whose speed (and outputs) depend on the session settings."""

    fast_threads: int = 1
    wrong_outputs: bool = False

    def _script(self, job: WorkerJob) -> Script:
        base = self.scripts.get(job.expected_digest, Script())
        if job.provider.intra_op_threads == self.fast_threads:
            outputs = base.outputs
            if self.wrong_outputs:
                outputs = {k: v + 1.0 for k, v in base.outputs.items()}
            return Script(latency_s=base.latency_s * 0.6, outputs=outputs)
        if job.provider.session_config.get("session.intra_op.allow_spinning") == "0":
            return Script(latency_s=base.latency_s * 1.5, outputs=base.outputs)
        return base


def _project(tmp_path: Path) -> Path:
    path = write_project(tmp_path, ["identity_mlp_perturbed"])
    text = path.read_text().replace("intra_op_threads: 1", "intra_op_threads: 2")
    path.write_text("# the team's notes stay\n" + text)
    return path


def test_the_fastest_configuration_is_qualified_and_written_into_the_project(
    tmp_path: Path,
) -> None:
    path = _project(tmp_path)
    workers = BySettings(scripts={})
    outcome = tune_class(
        load_project(path),
        "here-cpu",
        RunOptions(db_path=tmp_path / "m.duckdb", measure_alone=False),
        TuneOptions(budget_s=6, max_trials=5),
        workers=workers.seam(),
    )
    record = outcome.record
    assert [t.trial for t in record.trials] == list(range(5))
    assert record.trials[0].status == "reference" and record.trials[0].vs_current is None
    winner = record.trials[record.winner]
    assert winner.change == {"intra_op_threads": 1}
    assert winner.status == "winner"
    assert winner.vs_current is not None and winner.vs_current.p99_upper is not None
    assert winner.vs_current.p50_upper <= 1.0 and winner.vs_current.p99_upper <= 1.0
    spin = next(t for t in record.trials if "session_config" in t.change)
    assert spin.status == "dropped" and spin.dropped_at_stage == 1
    assert outcome.qualification is not None
    assert record.qualification_verdict == "pass" and record.applied
    # The run that proved it measured every artifact under the winner's settings.
    assert {c.settings_digest for c in outcome.qualification.bundle.cells} == {
        winner.cell.settings_digest
    }
    text = path.read_text()
    assert text.startswith("# the team's notes stay\n")
    tuned = load_project(path).project.host_classes["here-cpu"]
    assert tuned.provider.intra_op_threads == 1
    assert tuned.settings_digest() == winner.cell.settings_digest
    with Store.open(tmp_path / "m.duckdb", read_only=True) as db:
        [stored] = db.tunes("here-cpu")
        assert stored == record
        trial_runs = {t.cell.run_id for t in record.trials}
        assert trial_runs.isdisjoint({c.run_id for c in db.cells()})
        assert {c.run_id for c in db.cells()} == {outcome.qualification.bundle.run.run_id}
    for trial in record.trials:
        assert trial.cell.latency and trial.cell.latency[0].samples > 0


def test_a_faster_configuration_that_changes_the_numbers_never_wins(tmp_path: Path) -> None:
    path = _project(tmp_path)
    before = path.read_text()
    workers = BySettings(scripts={}, wrong_outputs=True)
    outcome = tune_class(
        load_project(path),
        "here-cpu",
        RunOptions(db_path=tmp_path / "m.duckdb", measure_alone=False),
        TuneOptions(budget_s=6, max_trials=3, artifact="identity_mlp_perturbed"),
        workers=workers.seam(),
    )
    record = outcome.record
    fast = record.trials[1]
    assert fast.change == {"intra_op_threads": 1}
    assert fast.status == "numerics_changed"
    assert fast.cell.parity is not None and not fast.cell.parity.passed
    assert fast.vs_current is not None and fast.vs_current.p99_ratio is not None
    assert fast.vs_current.p99_ratio < 1.0  # the fastest, and still not the winner
    assert record.winner == 0 and not record.applied
    assert path.read_text() == before


def test_when_nothing_is_confidently_faster_the_current_settings_stay(tmp_path: Path) -> None:
    path = _project(tmp_path)
    before = path.read_text()
    workers = BySettings(scripts={}, fast_threads=99)  # every change is as fast or slower
    outcome = tune_class(
        load_project(path),
        "here-cpu",
        RunOptions(db_path=tmp_path / "m.duckdb", measure_alone=False),
        TuneOptions(budget_s=4, max_trials=3),
        workers=workers.seam(),
    )
    assert outcome.record.winner == 0
    assert outcome.qualification is None and not outcome.record.applied
    assert path.read_text() == before


def test_an_unknown_artifact_is_named(tmp_path: Path) -> None:
    path = _project(tmp_path)
    with pytest.raises(ProjectError, match="no artifact named 'nope'"):
        tune_class(
            load_project(path),
            "here-cpu",
            RunOptions(db_path=tmp_path / "m.duckdb"),
            TuneOptions(artifact="nope"),
            workers=BySettings(scripts={}).seam(),
        )


@pytest.mark.slow
def test_a_real_tune_on_this_host_is_never_slower_than_the_current_settings(
    tmp_path: Path,
) -> None:
    path = _project(tmp_path)
    outcome = tune_class(
        load_project(path),
        "here-cpu",
        RunOptions(db_path=tmp_path / "m.duckdb"),
        TuneOptions(budget_s=8, max_trials=4),
    )
    record = outcome.record
    winner = record.trials[record.winner]
    if record.winner:
        assert winner.vs_current is not None
        assert winner.vs_current.p50_upper is not None and winner.vs_current.p50_upper <= 1.0
        assert winner.vs_current.p99_upper is not None and winner.vs_current.p99_upper <= 1.0
        assert record.qualification_run_id is not None
    for trial in record.trials:
        assert trial.cell.verdict != "error", trial.cell.error
        assert np.isfinite(trial.cell.latency[0].p99_ms)


def test_a_tune_in_which_no_trial_finishes_says_so_and_chooses_nothing(tmp_path: Path) -> None:
    from tests.qualify.scripted import Script, ScriptedWorkers, digest_of

    path = _project(tmp_path)
    before = path.read_text()
    candidate = digest_of(tmp_path / "models" / "identity_mlp_perturbed.onnx")
    workers = ScriptedWorkers(scripts={candidate: Script(dies="ready")})
    outcome = tune_class(
        load_project(path),
        "here-cpu",
        RunOptions(db_path=tmp_path / "m.duckdb", measure_alone=False),
        TuneOptions(budget_s=5, max_trials=2),
        workers=workers.seam(),
    )
    record = outcome.record
    assert not outcome.measured
    assert record.winner == 0 and not record.applied and outcome.qualification is None
    assert record.outcome.startswith("no trial finished to compare with the current settings")
    assert "trial 0 (current): crashed" in record.outcome
    assert all(t.cell.verdict == "error" for t in record.trials)
    assert path.read_text() == before
    with Store.open(tmp_path / "m.duckdb", read_only=True) as db:
        assert db.tunes("here-cpu") == [record]
