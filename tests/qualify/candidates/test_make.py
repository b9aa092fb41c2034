"""qualify candidates on the demo project: variants made from the baseline, stored by digest
with complete lineage, added to the project file with its comments kept, and qualified by a
real run like any other candidate."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from matrix.store import Store
from qualify.candidates.make import make_candidates
from qualify.cli import cli
from qualify.demo.story import lay_out
from qualify.project.load import load_project
from qualify.run import RunOptions, qualify_run
from tests.qualify.projects import run_qualify

MADE = ["int8-qdq-per-channel", "int8-qdq-reduce-range", "fp16", "pruned-25"]


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    path = lay_out(tmp_path / "demo")
    path.write_text("# our release notes\n" + path.read_text())
    return path


def test_variants_are_stored_with_complete_lineage_and_added_as_candidates(demo: Path) -> None:
    loaded = load_project(demo)
    outcome = make_candidates(loaded, db_path=demo.parent / "m.duckdb")
    # The demo's own int8 candidate is quantize_dynamic of the baseline: the same bytes.
    assert outcome.same == {"int8-dynamic": "int8"}
    assert [m.name for m in outcome.made] == MADE
    assert outcome.failed == {}
    baseline = demo.parent / "models" / "digits-mlp-fp32.onnx"
    with Store.open(demo.parent / "m.duckdb", read_only=True) as db:
        lineage = db.lineage()
    assert set(lineage) == {m.artifact_digest for m in outcome.made}
    for item in lineage.values():
        assert item.parent_name == "fp32"
        assert item.parent_digest.startswith("sha256:")
        assert item.tool and item.tool_version and item.params
    static = [i for i in lineage.values() if i.name.startswith("int8-qdq")]
    assert len({i.calibration_digest for i in static}) == 1
    assert static[0].calibration_digest is not None
    assert all(i.calibration_digest is None for i in lineage.values() if i not in static)
    # Calibrated on the model's feed: the recorded counts through the workload's pre hook.
    assert static[0].params["calibration_rows"] == 256
    project = load_project(demo).project
    assert demo.read_text().startswith("# our release notes\n")
    added = {c.label: c for c in project.artifacts.candidates}
    assert set(added) == {"int8", *MADE}
    assert added["pruned-25"].precision == "pruned" and "not fine-tuned" in (
        added["pruned-25"].how or ""
    )
    assert all(added[n].derived_from == "fp32" for n in MADE)
    assert baseline.exists()
    # Each how: is one line of the file; the details are in the lineage.
    text = demo.read_text()
    for name in MADE:
        how = added[name].how
        assert how and f"how: {how}\n" in text and len(how) <= 88, how
    assert "256 recorded rows" in (added["int8-qdq-per-channel"].how or "")


def test_a_second_call_replaces_the_candidates_it_made(demo: Path) -> None:
    db = demo.parent / "m.duckdb"
    make_candidates(load_project(demo), db_path=db, which=["fp16"])
    make_candidates(load_project(demo), db_path=db, which=["fp16"])
    labels = [c.label for c in load_project(demo).project.artifacts.candidates]
    assert labels == ["int8", "fp16"]


def test_the_command_refuses_an_unknown_variant_and_names_the_known_ones(demo: Path) -> None:
    result = CliRunner().invoke(cli, ["candidates", "--project", str(demo), "--variant", "int4"])
    assert result.exit_code == 2
    assert "int8-qdq-per-channel" in result.output


def test_a_project_without_recorded_inputs_makes_no_static_variant(tmp_path: Path) -> None:
    from tests.qualify.projects import write_project

    path = write_project(tmp_path, [])
    outcome = make_candidates(
        load_project(path), db_path=tmp_path / "m.duckdb", which=["int8-qdq-per-channel", "fp16"]
    )
    assert [m.name for m in outcome.made] == ["fp16"]
    assert outcome.failed == {} and outcome.exit_code == 0
    assert set(outcome.skipped) == {"int8-qdq-per-channel"}
    assert "source: recorded" in outcome.skipped["int8-qdq-per-channel"]


@pytest.mark.slow
def test_a_run_qualifies_the_made_candidates(demo: Path) -> None:
    db = demo.parent / "m.duckdb"
    make_candidates(
        load_project(demo), db_path=db, which=["int8-qdq-per-channel", "fp16", "pruned"]
    )
    loaded = load_project(demo)
    outcome = qualify_run(loaded, "x86-v3-1t", RunOptions(db_path=db, emulate=True))
    verdicts = {c.artifact_name: c for c in outcome.bundle.cells}
    assert set(verdicts) == {"fp32", "int8", "int8-qdq-per-channel", "fp16", "pruned-25"}
    for name in ("int8-qdq-per-channel", "fp16", "pruned-25"):
        cell = verdicts[name]
        assert cell.verdict in ("pass", "fail"), (name, cell.error)
        assert cell.parity is not None and cell.latency
    # fp16 with float32 inputs and outputs stays within fp16's tolerances on every CPU.
    assert verdicts["fp16"].parity.passed  # type: ignore[union-attr]
    # The pruned model is not fine-tuned: parity says how far it moved, never hidden.
    pruned = verdicts["pruned-25"].parity
    assert pruned is not None and np.isfinite(pruned.outputs[0].max_abs or 0.0)


def _fresh_init(tmp_path: Path) -> Path:
    """A project as ``qualify init`` writes it for a real model: generated inputs only."""
    from qualify.demo.assets import FP32_MODEL, asset_path

    model = tmp_path / "model.onnx"
    model.write_bytes(asset_path(FP32_MODEL).read_bytes())
    done = run_qualify("init", "model.onnx", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return tmp_path / "qualify.yaml"


def test_candidates_right_after_init_makes_what_generated_inputs_allow(tmp_path: Path) -> None:
    project = _fresh_init(tmp_path)
    done = run_qualify("candidates", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    made = ["int8-dynamic", "fp16", "pruned-25"]
    assert [line.split(":")[0] for line in done.stdout.splitlines()[:-1]] == made
    assert done.stdout.splitlines()[-1].startswith("added 3 candidate(s)")
    # Static int8 is skipped in one line that says how to record inputs; nothing is said twice.
    (skipped,) = done.stderr.splitlines()
    assert skipped.startswith("qualify: int8-qdq-per-channel and int8-qdq-reduce-range: skipped")
    assert "numpy.save" in skipped and "workload.inputs.pixels: {source: recorded" in skipped
    assert not set(done.stdout.splitlines()) & set(done.stderr.splitlines())
    candidates = load_project(project).project.artifacts.candidates
    assert [c.label for c in candidates] == made
    text = project.read_text()
    for candidate in candidates:
        assert candidate.how and f"how: {candidate.how}\n" in text
    assert "(quantize_dynamic, onnxruntime " in (candidates[0].how or "")
    with Store.open(tmp_path / "qualify.duckdb", read_only=True) as db:
        lineage = {item.name: item for item in db.lineage().values()}
    assert lineage["int8-dynamic"].params["reduce_range"] is True  # the details: in the matrix


def test_asking_only_for_static_int8_without_recorded_inputs_makes_nothing_and_says_why(
    tmp_path: Path,
) -> None:
    project = _fresh_init(tmp_path)
    before = project.read_text()
    done = run_qualify("candidates", "--variant", "int8-qdq-per-channel", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("qualify: int8-qdq-per-channel: skipped: static int8 calibrates")
    assert project.read_text() == before
