"""The user's pre- and post-processing around every timed inference (``workload.pipeline``)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from qualify.errors import ProjectError
from qualify.project.load import load_project
from qualify.run import RunOptions, RunOutcome, qualify_run
from tests.qualify.projects import write_project

HOOKS = textwrap.dedent(
    """\
    import time

    import numpy as np

    CALLS = {"n": 0}


    def light(feed):
        return {name: np.asarray(value, dtype=np.float32) for name, value in feed.items()}


    def heavy(feed):
        until = time.perf_counter() + 0.003  # 3 ms of work the service does before the model
        while time.perf_counter() < until:
            pass
        return light(feed)


    def label(outputs):
        return np.argmax(outputs[0], axis=-1)


    def breaks_later(feed):
        CALLS["n"] += 1
        if CALLS["n"] > 40:
            raise ValueError("a malformed request")
        return feed
    """
)


def _project(tmp_path: Path, pipeline: str, candidates: list[str] | None = None) -> Path:
    path = write_project(tmp_path, candidates or [])
    (tmp_path / "prep.py").write_text(HOOKS)
    text = path.read_text()
    text = text.replace("workload:\n", f"workload:\n  pipeline: {pipeline}\n", 1)
    text = text.replace("concurrency: [1, 2]", "concurrency: [1]")
    path.write_text(text)
    return path


def _run(project: Path) -> RunOutcome:
    return qualify_run(
        load_project(project), "here-cpu", RunOptions(db_path=project.parent / "m.duckdb")
    )


@pytest.mark.slow
def test_work_in_a_hook_moves_end_to_end_latency_and_not_inference_only(tmp_path: Path) -> None:
    light = _run(_project(tmp_path / "light", "{pre: 'prep:light'}")).bundle.cells[0]
    heavy = _run(_project(tmp_path / "heavy", "{pre: 'prep:heavy'}")).bundle.cells[0]
    lg, hg = light.gate_latency, heavy.gate_latency
    assert lg is not None and hg is not None
    assert lg.inference_p50_ms is not None and hg.inference_p50_ms is not None
    # 3 ms of pre-processing lands in the end-to-end figures, all of it in the 'pre' stage ...
    assert hg.p50_ms - lg.p50_ms > 2.5
    assert hg.stage_share is not None and hg.stage_share["pre"] > 0.8
    assert sum(hg.stage_share.values()) == pytest.approx(1.0)
    # ... and none of it in the model call, which stays that of a tiny MLP either way.
    assert hg.inference_p50_ms < 1.0 and lg.inference_p50_ms < 1.0
    assert hg.inference_p50_ms < hg.p50_ms / 3


@pytest.mark.slow
def test_a_post_hook_answer_is_compared_by_parity_and_timed_as_post(tmp_path: Path) -> None:
    outcome = _run(
        _project(tmp_path, "{pre: 'prep:light', post: 'prep:label'}", ["identity_mlp_perturbed"])
    )
    baseline, candidate = outcome.bundle.cells
    gate = baseline.gate_latency
    assert gate is not None and gate.stage_share is not None and gate.stage_share["post"] > 0
    assert candidate.parity is not None
    assert "post" in [o.name for o in candidate.parity.outputs]


def test_a_hook_that_raises_mid_run_is_an_error_cell_naming_the_hook_and_the_line(
    tmp_path: Path,
) -> None:
    project = _project(tmp_path, "{pre: 'prep:breaks_later'}")
    text = project.read_text().replace("parity_samples: 32", "parity_samples: 8")
    project.write_text(text)
    cell = _run(project).bundle.cells[0]
    assert cell.verdict == "error"
    assert [r.code for r in cell.reasons] == ["hook_failed"]
    line = HOOKS.splitlines().index('        raise ValueError("a malformed request")') + 1
    assert f"workload.pipeline.pre prep:breaks_later raised at prep.py:{line}" in (cell.error or "")
    assert "ValueError: a malformed request" in (cell.error or "")


@pytest.mark.parametrize(
    ("pipeline", "said"),
    [
        ("{pre: 'nowhere:scale'}", "no module 'nowhere' beside the project file or installed"),
        ("{pre: 'prep:heavvy'}", "did you mean prep:heavy?"),
        ("{post: 'prep.label'}", "is not 'module:function'"),
        ("{pre: 'os:system'}", "'os' is a module of Python's standard library"),
        ("{pre: 'json.decoder:scanstring'}", "'json' is a module of Python's standard library"),
    ],
)
def test_a_hook_that_cannot_be_found_is_a_load_error_with_its_line(
    tmp_path: Path, pipeline: str, said: str
) -> None:
    project = _project(tmp_path, pipeline)
    with pytest.raises(ProjectError) as caught:
        load_project(project)
    message = str(caught.value)
    assert said in message
    assert "qualify.yaml:" in message and "pipeline" in message
    # Never the advice to put a file named like a standard module beside the project, which
    # would shadow the standard library's own for everything imported after it.
    assert "create os" not in message and "create json" not in message
