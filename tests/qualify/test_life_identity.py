"""A life of several releases, told through the commands a team runs: identity (one model line
per matrix, artifacts as their bytes) and current verdicts (today's project re-applied to the
stored evidence). After every step, ``matrix show``, ``matrix stale``, the release gate and
``manifest generate`` must give one answer.

Runs go through the scripted-worker seam (`tests/qualify/scripted.py`) on the real tiny models,
a real DuckDB file, real Ed25519 keys and the real CLI, so the story takes seconds.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner, Result

from matrix.store import Store
from qualify.cli import cli
from qualify.project.load import load_project
from qualify.run import RunOptions, qualify_run
from tests.qualify.projects import write_project
from tests.qualify.scripted import Script, ScriptedWorkers, digest_of

BASELINE = "identity_mlp"
CANDIDATE = "identity_mlp_perturbed"
CLASS = "here-cpu"
Y = np.linspace(0.0, 1.0, 64, dtype=np.float32).reshape(4, 16)
"""The scripted parity outputs of the baseline (`Script`'s default)."""


@dataclass
class Life:
    """One team's folder: a project, its matrix, its key, and the scripted hosts."""

    root: Path
    project: Path
    db: Path
    key: Path
    scripts: dict[str, Script]

    def model(self, name: str) -> Path:
        return self.root / "models" / f"{name}.onnx"

    def run(self, **scripts: Script) -> str:
        """``qualify run --host-class here-cpu``, each artifact behaving as its script says."""
        for name, script in scripts.items():
            self.scripts[digest_of(self.model(name))] = script
        outcome = qualify_run(
            load_project(self.project),
            CLASS,
            RunOptions(db_path=self.db, measure_alone=False),
            workers=ScriptedWorkers(dict(self.scripts)).seam(),
        )
        assert outcome.written
        return outcome.bundle.run.run_id

    def cli(self, *args: str) -> Result:
        return CliRunner().invoke(cli, list(args), catch_exceptions=False)

    def show(self) -> str:
        result = self.cli("matrix", "show", "--project", str(self.project), "--db", str(self.db))
        assert result.exit_code == 0, result.output
        return result.output

    def shown(self) -> dict[str, str]:
        """``matrix show --format json``: artifact -> its verdict on here-cpu now."""
        result = self.cli(
            "matrix", "show", "--project", str(self.project), "--db", str(self.db),
            "--format", "json",
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        return {r["artifact_name"]: r["verdict"] for r in json.loads(result.output)}

    def stale(self) -> list[tuple[str, str]]:
        result = self.cli(
            "matrix", "stale", "--project", str(self.project), "--db", str(self.db), "--json"
        )
        assert result.exit_code == 0, result.output
        return [(i["artifact_name"], i["reason"]) for i in json.loads(result.output)["stale"]]

    def gate(self) -> tuple[int, str]:
        result = self.cli(
            "matrix", "gate", "--project", str(self.project), "--db", str(self.db),
            "--classes", CLASS,
        )  # fmt: skip
        return result.exit_code, result.output

    def generate(self, release: str, *, publish: bool = False) -> tuple[str, str | None]:
        """``manifest generate`` (a draft, or published): here-cpu's decision and artifact."""
        out = self.root / f"{release}.json"
        args = ["manifest", "generate", "--release", release, "--out", str(out)]
        args += ["--publish", "--key", str(self.key)] if publish else []
        result = self.cli(*args, "--project", str(self.project), "--db", str(self.db))
        assert result.exit_code == 0, result.output
        entry = json.loads(out.read_text())["signed"]["entries"][CLASS]
        return entry["decision"], (entry["artifact"] or {}).get("name")

    def edit(self, old: str, new: str) -> None:
        text = self.project.read_text()
        assert old in text
        self.project.write_text(text.replace(old, new, 1))


@pytest.fixture
def life(tmp_path: Path) -> Life:
    project = write_project(tmp_path, [CANDIDATE])
    keys = CliRunner().invoke(cli, ["keygen", "release", "--dir", str(tmp_path)])
    assert keys.exit_code == 0, keys.output
    return Life(tmp_path, project, tmp_path / "qualify.duckdb", tmp_path / "release.key", {})


def test_a_model_re_exported_in_place_gets_one_answer_from_every_command(life: Life) -> None:
    # Release 1: both artifacts qualify; the class gets the candidate.
    first = life.run(**{BASELINE: Script(), CANDIDATE: Script()})
    assert life.shown() == {BASELINE: "pass", CANDIDATE: "pass"}
    assert life.stale() == []
    assert life.gate()[0] == 0
    assert life.generate("r1", publish=True) == ("candidate", CANDIDATE)

    # The candidate is re-exported in place: same path, other bytes.
    model = onnx.load(life.model(CANDIDATE))
    model.doc_string = "re-exported with another exporter"
    onnx.save(model, life.model(CANDIDATE))
    shown = life.show()
    assert re.search(
        rf"gap: {CLASS} x {CANDIDATE}: never run on this class's key as its file is now "
        rf"\(sha256:\w+\); run {first} measured its earlier bytes",
        shown,
    ), shown
    assert "every class x artifact has a current cell" not in shown
    assert life.shown() == {BASELINE: "pass"}
    assert life.stale() == [(CANDIDATE, "artifact_changed")]
    code, said = life.gate()
    assert code == 3 and "regressed" in said and f"candidate {CANDIDATE}" in said
    assert life.generate("r2-draft") == ("baseline", BASELINE)  # what the gate said

    # Release 2 measures the new bytes: every command agrees again.
    life.run(**{CANDIDATE: Script()})
    assert life.shown() == {BASELINE: "pass", CANDIDATE: "pass"}
    assert life.stale() == []
    assert life.gate()[0] == 0
    assert life.generate("r2", publish=True) == ("candidate", CANDIDATE)


def test_a_tightened_budget_and_a_loosened_tolerance_are_what_every_command_judges(
    life: Life,
) -> None:
    life.run(**{BASELINE: Script(), CANDIDATE: Script()})
    assert life.generate("r1", publish=True) == ("candidate", CANDIDATE)

    # The budget is tightened far below what was measured (p99 about 2 ms).
    life.edit("p99_ms: 50", "p99_ms: 0.5")
    shown = life.show()
    assert life.shown() == {BASELINE: "fail", CANDIDATE: "fail"}
    assert "/0.500 ms" in shown and "pass p99" not in shown
    assert (
        "coverage: 2 of 6 class x artifact have a current cell (2 fail, under the project now)"
        in shown
    )
    assert life.stale() == []  # the evidence answers: a fail, not a re-run
    code, said = life.gate()
    assert code == 3 and "supports only hold" in said
    assert life.generate("r2-draft") == ("hold", None)
    started = life.cli(
        "rollout", "start", CLASS, "--key", str(life.key), "--out",
        str(life.root / "rollout.json"), "--project", str(life.project), "--db", str(life.db),
    )  # fmt: skip
    assert started.exit_code == 2 and "no candidate qualified" in started.output
    life.edit("p99_ms: 0.5", "p99_ms: 50")

    # Release 2's candidate computes 10% larger outputs: max_abs 0.1 fails int8's 0.05.
    life.run(**{CANDIDATE: Script(outputs={"y": Y * 1.1})})
    assert life.shown() == {BASELINE: "pass", CANDIDATE: "fail"}
    assert life.gate()[0] == 3
    assert life.generate("r2-draft-2") == ("baseline", BASELINE)

    # The team loosens int8's max_abs alone: cosine and top-1 keep int8's defaults.
    life.edit("workload:", "parity: {int8: {max_abs: 0.5}}\nworkload:")
    assert life.shown() == {BASELINE: "pass", CANDIDATE: "pass"}
    assert life.stale() == []
    assert life.gate()[0] == 0
    assert life.generate("r2", publish=True) == ("candidate", CANDIDATE)
    report = life.cli(
        "report", "--out", str(life.root / "report.html"),
        "--project", str(life.project), "--db", str(life.db),
    )  # fmt: skip
    assert report.exit_code == 0, report.output
    page = (life.root / "report.html").read_text()
    assert "0.5 (run: 0.05)" in page  # the limit applied now, and the run's own
    assert "0.99</td>" in page  # int8's cosine floor still applied

    # A per-output null turns one check off for that output alone.
    life.edit("{int8: {max_abs: 0.5}}", "{int8: {outputs: {y: {max_abs: null}}}}")
    assert life.shown() == {BASELINE: "pass", CANDIDATE: "pass"}
    life.edit("{int8: {outputs: {y: {max_abs: null}}}}", "{int8: {outputs: {z: {max_abs: null}}}}")
    assert life.shown() == {BASELINE: "pass", CANDIDATE: "fail"}


def test_a_second_model_is_refused_by_name_and_its_bundle_writes_nothing(
    life: Life, tmp_path: Path
) -> None:
    life.run(**{BASELINE: Script(), CANDIDATE: Script()})
    with Store.open(life.db, read_only=True) as db:
        assert db.model_line() == "tiny"
        before = [r.run_id for r in db.runs()]

    # A second model on the same hosts, with its own project and matrix.
    other_root = tmp_path / "digits"
    other = Life(
        other_root,
        write_project(other_root, [CANDIDATE]),
        other_root / "qualify.duckdb",
        life.key,
        {},
    )
    other.edit("model: tiny", "model: digits")
    other.run(**{BASELINE: Script(latency_s=0.004), CANDIDATE: Script()})
    bundles = sorted((other_root / "bundles").iterdir())

    ingested = life.cli("matrix", "ingest", *map(str, bundles), "--db", str(life.db))
    assert ingested.exit_code == 2
    said = " ".join(ingested.output.split())
    assert "'digits'" in said and "'tiny'" in said and str(life.db) in said
    assert "nothing was ingested" in said and "--db" in said
    with Store.open(life.db, read_only=True) as db:
        assert [r.run_id for r in db.runs()] == before
    assert life.shown() == {BASELINE: "pass", CANDIDATE: "pass"}

    # Every read, decision and write of the other line against this matrix is refused.
    for args in (
        ["matrix", "show"],
        ["matrix", "stale"],
        ["matrix", "gate"],
        ["manifest", "generate", "--release", "x", "--out", str(tmp_path / "x.json")],
        ["report", "--out", str(tmp_path / "x.html")],
    ):
        result = life.cli(*args, "--project", str(other.project), "--db", str(life.db))
        assert result.exit_code == 2, (args, result.output)
        text = " ".join(result.output.split())
        assert "holds model line 'tiny'" in text and "'digits'" in text, (args, text)
        assert f"--db {life.root / 'qualify-digits.duckdb'}" in text, (args, text)
    with pytest.raises(Exception, match="holds model line 'tiny'"):
        qualify_run(
            load_project(other.project),
            CLASS,
            RunOptions(db_path=life.db, measure_alone=False),
            workers=ScriptedWorkers({}).seam(),
        )
    with Store.open(life.db, read_only=True) as db:
        assert [r.run_id for r in db.runs()] == before
