"""The demo's rollout story (``qualify.demo.rollout``) on a matrix where it always runs: two
classes qualified on the candidate by scripted workers (the real demo skips the story when a
loaded machine fails its candidate), real signed versions, real telemetry ingest and the real
``resolve-artifact`` in a subprocess. One class is promoted to every host, the other aborted on
its canary's provider change and its canary host refuses the older version replayed to it."""

from __future__ import annotations

import json
import platform
from datetime import UTC, datetime
from pathlib import Path

import onnxruntime
import pytest
from click.testing import CliRunner

from matrix.store import Store
from qualify.cli import cli
from qualify.demo.rollout import run_demo_rollouts
from qualify.demo.story import ROLLOUT_TOLERANCE, _resolve_as_host
from qualify.project.load import load_project
from qualify.run import RunOptions, qualify_run
from tests.qualify.lab import CANDIDATE
from tests.qualify.projects import write_project
from tests.qualify.scripted import Script, ScriptedWorkers, digest_of

pytestmark = pytest.mark.slow

SECOND = f"""  here-two:
    key: {{hardware: here2, runtime: ort-any, provider: cpu}}
    match: {{arch: {platform.machine()}}}
    provider: {{execution_providers: [CPUExecutionProvider], intra_op_threads: 1}}
    budgets: {{p99_ms: 50, timeout_s: 60, memory_limit_mb: 3072, peak_rss_mb: 1024}}
"""


def _two_classes_on_the_candidate(root: Path) -> Path:
    """here-cpu and here-two, both qualified on the candidate, published as v1 with per-class
    documents, signed with the demo's key file names."""
    project = write_project(root, [CANDIDATE])
    project.write_text(project.read_text().replace("  lost-gpu:\n", SECOND + "  lost-gpu:\n"))
    models = root / "models"
    for name in ("here-cpu", "here-two"):
        workers = ScriptedWorkers(
            {
                digest_of(models / "identity_mlp.onnx"): Script(),
                digest_of(models / f"{CANDIDATE}.onnx"): Script(),
            }
        )
        qualify_run(
            load_project(project),
            name,
            RunOptions(db_path=root / "qualify.duckdb", measure_alone=False),
            workers=workers.seam(),
        )
    for args in (
        ["keygen", "release", "--dir", str(root)],
        ["manifest", "generate", "--publish", "--release", "r1", "--project", str(project),
         "--db", str(root / "qualify.duckdb"), "--key", str(root / "release.key"),
         "--out", str(root / "manifest.json"), "--per-class", str(root / "manifest.d")],
    ):  # fmt: skip
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
    return project


def test_one_class_is_promoted_and_the_other_aborted_at_a_higher_version(tmp_path: Path) -> None:
    loaded = load_project(_two_classes_on_the_candidate(tmp_path))

    def resolve(path: Path, name: str, host: str) -> tuple[int, dict[str, object], str]:
        host_class = loaded.project.host_classes[name]
        version = onnxruntime.__version__
        return _resolve_as_host(tmp_path, name, host_class, version, manifest=path, host_id=host)

    lines: list[str] = []
    ok = run_demo_rollouts(
        tmp_path,
        loaded,
        tmp_path / "qualify.duckdb",
        healthy="here-cpu",
        faulty="here-two",
        now=datetime.now(UTC),
        resolve=resolve,
        tolerance=ROLLOUT_TOLERANCE,
        echo=lines.append,
    )
    story = "\n".join(lines)
    assert ok, story
    assert "here-cpu: completed: every host runs classifier (v7)" in story
    assert "halted: provider_changed" in story
    assert "every host goes back to identity_mlp (v8)" in story
    assert "using the last-known-good manifest, version 8" in story  # the replay refused
    signed = json.loads((tmp_path / "manifest.json").read_bytes())["signed"]
    promoted, aborted = signed["entries"]["here-cpu"], signed["entries"]["here-two"]
    assert (promoted["artifact"]["name"], promoted["rollback"]["name"]) == (
        CANDIDATE,
        "identity_mlp",
    )
    assert [r["code"] for r in promoted["reasons"]][:2] == ["rollout_completed", "candidate_passed"]
    assert (aborted["decision"], aborted["artifact"]["name"]) == ("baseline", "identity_mlp")
    assert [r["code"] for r in aborted["reasons"]] == ["rolled_back"]
    assert "rollout" not in promoted and "rollout" not in aborted
    assert (tmp_path / "manifest.d" / "current").read_text() == "v8\n"
    with Store.open(tmp_path / "qualify.duckdb", read_only=True) as db:
        log = db.rollout_log()
    actions = [(r["host_class"], r["action"], r["version"]) for r in log]
    assert actions == [
        ("here-cpu", "pin", 2),
        ("here-cpu", "clear", 2),
        ("here-two", "pin", 3),
        ("here-two", "clear", 3),
        ("here-cpu", "start", 4),
        ("here-two", "start", 5),
        ("here-cpu", "advance", 6),
        ("here-cpu", "complete", 7),
        ("here-two", "halt", 7),
        ("here-two", "abort", 8),
    ]
    assert {r["actor"] for r in log} == {"demo"}
