"""Real input shapes: scalars, a batch axis other than 0, and recurrent state fed back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from qualify.cli import cli
from qualify.errors import ProjectError
from qualify.measure.feeds import batch  # the feed builder the timed loops use
from qualify.measure.workload import build_pool
from qualify.project.load import load_project
from qualify.run import RunOptions, qualify_run
from schemas.project import InputSpec, Workload
from tests.models import CLASSES, STATE, STEPS, recurrent, time_first
from tests.qualify.jobs import make_job


def test_a_scalar_is_declared_with_no_batch_axis_and_a_batch_axis_must_exist() -> None:
    assert (
        InputSpec(shape=[], source="fixed", value=16000, batch_axis=None).sample_shape_at({}) == []
    )
    with pytest.raises(ValidationError, match="batch_axis: null"):
        InputSpec(shape=[], source="generated")
    with pytest.raises(ValidationError, match="'batch_axis' 3 is not an axis of shape"):
        InputSpec(shape=[1, 2, 8], source="generated", batch_axis=3)
    state = InputSpec(shape=[2, 1, 128], source="generated", batch_axis=1)
    assert state.batched and state.sample_shape_at({}) == [2, 128]
    # A fixed value is fed whole, unless it is a recurrent state's first value.
    assert not InputSpec(shape=[1, 8], source="fixed", value=0).batched
    assert InputSpec(shape=[1, 1, 8], source="fixed", value=0, batch_axis=1, state_from="h").batched


def test_a_recorded_state_is_read_along_its_batch_axis(tmp_path: Path) -> None:
    states = np.arange(2 * 5 * 3, dtype=np.float32).reshape(2, 5, 3)  # [layers, N, hidden]
    np.save(tmp_path / "h.npy", states)
    spec = InputSpec(shape=[2, 1, 3], source="recorded", file="h.npy", batch_axis=1)
    pool = build_pool(Workload(inputs={"h": spec}), lambda f: tmp_path / f)
    assert pool["h"].shape == (5, 2, 3)  # samples first, as the pool keeps them
    np.testing.assert_array_equal(pool["h"][4], states[:, 4, :])
    # One sample recorded without its batch axis is one sample.
    np.save(tmp_path / "one.npy", states[:, 0, :])
    one = InputSpec(shape=[2, 1, 3], source="recorded", file="one.npy", batch_axis=1)
    assert build_pool(Workload(inputs={"h": one}), lambda f: tmp_path / f)["h"].shape == (1, 2, 3)


def test_a_recorded_file_of_the_wrong_shape_names_the_file_the_field_and_what_it_needs(
    tmp_path: Path,
) -> None:
    np.save(tmp_path / "h.npy", np.zeros((5, 2, 4), np.float32))
    spec = InputSpec(shape=[2, 1, 3], source="recorded", file="h.npy", batch_axis=1)
    with pytest.raises(ProjectError) as caught:
        build_pool(Workload(inputs={"h": spec}), lambda f: tmp_path / f)
    said = str(caught.value)
    assert "h.npy: workload.inputs.h.file: holds an array of shape [5, 2, 4]" in said
    assert "(batch_axis 1) needs [2, 'N', 3]" in said and "Fix:" in said


def _recurrent_workload(rows: int = 8) -> Workload:
    return Workload(
        inputs={
            "x": InputSpec(shape=[1, 16], source="generated", seed=1),
            "h": InputSpec(
                shape=[1, 1, STATE], source="fixed", value=0.0, batch_axis=1, state_from="h_out"
            ),
            "gain": InputSpec(shape=[], source="generated", batch_axis=None, low=1, high=2),
        },
        parity_samples=rows,
        time_cap_s=0.5,
        warmup=2,
        profile_runs=0,
        throughput_s=0.05,
    )


def test_feeds_batch_each_input_on_its_own_axis_and_feed_a_scalar_whole(tmp_path: Path) -> None:
    wl = _recurrent_workload()
    job = make_job(tmp_path, recurrent(tmp_path), workload=wl)
    pool = dict(np.load(job.inputs_path))
    feed = batch(pool, job, 6, 4)
    assert feed["x"].shape == (4, 16)
    np.testing.assert_array_equal(feed["x"][2], pool["x"][8 % len(pool["x"])])
    assert feed["h"].shape == (1, 4, STATE) and feed["h"].flags.c_contiguous  # the fixed state
    assert feed["gain"].shape == () and feed["gain"] == pool["gain"][6]


def test_a_recurrent_models_parity_outputs_follow_its_state_from_step_to_step(
    tmp_path: Path,
) -> None:
    import onnxruntime as ort

    from qualify.measure.runner import run_worker

    model = recurrent(tmp_path)
    job = make_job(tmp_path, model, mode="full", workload=_recurrent_workload(), configs=((1, 1),))
    outcome = run_worker(job, tmp_path / "w", timeout_s=120)
    assert outcome.error_code is None, outcome.error_message
    answered = dict(np.load(job.outputs_path))
    # The sequence computed here: each step's h is the previous step's h_out, from zeros.
    pool = dict(np.load(job.inputs_path))
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    carried, stepped, fresh = None, [], []
    for r in range(job.parity_rows):
        feed = batch(pool, job, r, 1)
        fresh.append(session.run(None, feed)[0])
        if carried is not None:
            feed["h"] = carried
        y, carried = session.run(None, feed)
        stepped.append(y)
    np.testing.assert_allclose(answered["y"], np.stack(stepped), rtol=1e-5, atol=1e-6)
    assert not np.allclose(answered["y"], np.stack(fresh))  # the state made a difference
    # Each step's whole output, stacked on a new first axis (h_out batches on its axis 1).
    assert answered["h_out"].shape == (job.parity_rows, 1, 1, STATE)


def test_state_from_must_name_an_output_the_model_has(tmp_path: Path) -> None:
    project = _recurrent_project(tmp_path)
    project.write_text(project.read_text().replace('state_from: "h_out"', 'state_from: "h_ou"'))
    with pytest.raises(ProjectError) as caught:
        load_project(project)
    said = str(caught.value)
    assert "workload.inputs.h.state_from" in said
    assert "no output named 'h_ou' to feed back as 'h'" in said and "rename it to 'h_out'" in said


def _recurrent_project(tmp_path: Path, *candidates: Path) -> Path:
    model = recurrent(tmp_path / "models")
    args = ["init", str(model), "--out", str(tmp_path / "qualify.yaml")]
    for candidate in candidates:
        args += ["--candidate", str(candidate)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    project = tmp_path / "qualify.yaml"
    text = project.read_text().replace("batch_sizes: [1]", "batch_sizes: [1, 4]")
    project.write_text(text)
    return project


def test_init_writes_the_state_axis_the_scalar_and_the_state_to_feed_back(tmp_path: Path) -> None:
    text = _recurrent_project(tmp_path).read_text()
    assert '"h": {shape: [1, 1, 8], dtype: float32' in text
    assert 'batch_axis: 1, state_from: "h_out"}' in text
    assert '"gain": {shape: [], dtype: float32' in text and "batch_axis: null}" in text
    assert "a scalar: fed whole to every inference" in text


def test_a_recurrent_model_is_compared_over_a_sequence_of_steps(tmp_path: Path) -> None:

    drifting = recurrent(tmp_path / "cands", name="recurrent-drift", noise=0.05)
    project = _recurrent_project(tmp_path, drifting)
    loaded = load_project(project)
    outcome = qualify_run(loaded, "this-host", RunOptions(db_path=tmp_path / "m.duckdb"))
    base, cand = outcome.bundle.cells
    assert base.verdict != "error" and cand.verdict != "error", (base.error, cand.error)
    assert {r.batch_size for r in base.latency} == {1, 4}
    assert cand.parity is not None
    assert {o.name for o in cand.parity.outputs} >= {"y", "h_out"}
    outputs = {o.name: o for o in cand.parity.outputs}
    # The state fed back gets no top-1 agreement, and the cell says why; y is class scores.
    state = outputs["h_out"]
    assert state.top1_agreement is None and state.tolerance.top1_agreement_min is None
    assert "recurrent state, fed back as input 'h'" in state.skipped["top1_agreement"]
    assert state.over is not None and "batch axis 1 from the model's graph" in state.over
    assert outputs["y"].top1_agreement is not None and "top1_agreement" not in outputs["y"].skipped

    assert base.parity is None
    # Each input's batch axis held at both batch sizes, so both configs were timed.
    assert all(r.samples > 0 for c in (base, cand) for r in c.latency)


def test_a_model_without_the_state_output_is_a_load_error_naming_it(tmp_path: Path) -> None:
    # The project check refuses this at load; a job that still reaches the child says why.
    from qualify.measure.runner import run_worker
    from tests.models import build

    model = build("identity_mlp", tmp_path)
    wl = Workload(inputs={"x": InputSpec(shape=[1, 16], source="generated", state_from="h_out")})
    job = make_job(tmp_path, model, mode="full", workload=wl, configs=((1, 1),))
    outcome = run_worker(job, tmp_path / "w", timeout_s=120)
    assert outcome.error_code == "load_failed"
    assert "state_from names outputs this model lacks (x <- h_out)" in (outcome.error_message or "")


def test_a_time_first_output_is_compared_per_sample_as_the_runtime_computes_it(
    tmp_path: Path,
) -> None:
    """A recogniser's [T, N, C] output: cosine per sample (not per time step, which is what
    concatenating the samples along axis 0 measured), the batch axis found in the graph."""
    import onnxruntime as ort

    models = tmp_path / "models"
    base = time_first(models)
    moved = time_first(models, "time_first_moved", step0_noise=1.5)
    args = ["init", str(base), "--candidate", str(moved), "--out", str(tmp_path / "q.yaml")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    loaded = load_project(tmp_path / "q.yaml")
    outcome = qualify_run(loaded, "this-host", RunOptions(db_path=tmp_path / "m.duckdb"))
    cand = outcome.bundle.cells[1]
    assert cand.parity is not None, cand.error
    (out,) = cand.parity.outputs
    # The same inputs through onnxruntime directly: one sample at a time, as the run feeds.
    pool = build_pool(loaded.project.workload, loaded.resolve)["x"][: cand.parity.samples]
    a, b = (
        np.stack(
            [
                ort.InferenceSession(str(m), providers=["CPUExecutionProvider"]).run(
                    None, {"x": row[None]}
                )[0]
                for row in pool
            ]
        ).astype(np.float64)
        for m in (base, moved)
    )
    fa, fb = a.reshape(len(a), -1), b.reshape(len(b), -1)
    per_sample = np.sum(fa * fb, 1) / np.linalg.norm(fa, axis=1) / np.linalg.norm(fb, axis=1)
    sa, sb = a.reshape(-1, CLASSES), b.reshape(-1, CLASSES)
    per_step = np.sum(sa * sb, 1) / np.linalg.norm(sa, axis=1) / np.linalg.norm(sb, axis=1)
    assert out.cosine_min == pytest.approx(per_sample.min(), abs=1e-6)
    assert per_step.min() < per_sample.min() - 0.05  # the per-step figure would mislead
    assert out.over is not None and "batch axis 1 from the model's graph: 'N'" in out.over
    assert f"top-1 over {STEPS * len(a)} positions, {STEPS} per sample" in out.over
    agree = np.argmax(a, axis=-1) == np.argmax(b, axis=-1)
    assert out.top1_agreement == pytest.approx(float(np.mean(agree)))
