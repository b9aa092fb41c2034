"""Machine output, one convention: every read command answers ``--json`` with a document its
published schema (``schemas/<name>.schema.json``) accepts, CSV cells are plain values, and a
reader that closes the pipe ends the command quietly.

The story is a real one in small: a scripted run (``tests.qualify.scripted``) of the small
project into a real DuckDB matrix, a signed release of the baseline, a candidate qualified after
it and rolled out to half the class, each step through the command line."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import jsonschema
import pytest
from click.testing import CliRunner

from matrix.store import Store
from qualify.cli import cli
from qualify.cli.errors import EXIT_CLOSED_PIPE
from qualify.console import run_summary
from qualify.project.load import load_project
from qualify.run import RunOptions, qualify_run
from schemas.generate import SCHEMA_DIR
from tests.models import padded_mlp
from tests.qualify.projects import ROOT, write_project
from tests.qualify.scripted import Script, ScriptedWorkers, digest_of


class Story(NamedTuple):
    tmp: Path
    common: list[str]
    """--project and --db."""
    run: dict[str, Any]
    """``run --json``'s document of the second run (`qualify.console.run_summary`)."""


def _scripted_run(project: Path, db: Path) -> dict[str, Any]:
    models = project.parent / "models"
    scripts = {digest_of(path): Script() for path in models.glob("*.onnx")}
    outcome = qualify_run(
        load_project(project),
        "here-cpu",
        RunOptions(db_path=db, measure_alone=False),
        workers=ScriptedWorkers(scripts).seam(),
    )
    return run_summary(outcome.bundle)


def _cli(*args: str, codes: tuple[int, ...] = (0,)) -> str:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code in codes, result.output
    return result.stdout


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> Story:
    tmp = tmp_path_factory.mktemp("json")
    project, db = write_project(tmp, []), tmp / "qualify.duckdb"
    common = ["--project", str(project), "--db", str(db)]
    _scripted_run(project, db)
    _cli("keygen", "k", "--dir", str(tmp))
    key = ["--key", str(tmp / "k.key")]
    _cli("manifest", "generate", "--publish", "--release", "r1", *key, "--out", str(tmp / "v1.json"), *common)  # fmt: skip
    padded_mlp(tmp / "models", 0, name="respun")
    project.write_text(
        project.read_text().replace(
            "  candidates:\n    []",
            "  candidates:\n    - {path: models/respun.onnx, precision: fp32}",
        )
    )
    run = _scripted_run(project, db)
    assert [c["verdict"] for c in run["cells"]] == ["pass", "pass"], run
    with Store.open(db) as store:  # the fleet's last try at 'elsewhere' lost its host
        elsewhere = load_project(project).project.host_classes["elsewhere"].key
        store.note_fleet_gaps([("elsewhere", elsewhere, "node_lost", "its host left mid-run")])
    out = ["--out", str(tmp / "manifest.json")]
    _cli("rollout", "start", "here-cpu", "--steps", "50,100", "--why", "canary\nsecond line", *key, *out, *common)  # fmt: skip
    return Story(tmp, common, run)


def _valid(document: object, schema: str) -> None:
    """``document`` is accepted by ``schemas/SCHEMA.schema.json`` (and the test can fail: the
    schemas forbid fields they do not name)."""
    published = json.loads((SCHEMA_DIR / f"{schema}.schema.json").read_text())
    jsonschema.Draft202012Validator(published).validate(document)


def _json(*args: str, codes: tuple[int, ...] = (0,)) -> Any:
    return json.loads(_cli(*args, "--json", codes=codes))


def test_every_read_command_answers_json_its_published_schema_accepts(story: Story) -> None:
    tmp, common = story.tmp, story.common
    db = common[2:]
    manifest, v1 = str(tmp / "manifest.json"), str(tmp / "v1.json")
    documents = {
        "run-summary": story.run,
        "matrix-show": _json("matrix", "show", *common),
        "matrix-stale": _json("matrix", "stale", *common),
        "matrix-gate": _json("matrix", "gate", *common, "--manifest", manifest, codes=(0, 3)),
        "matrix-export": _json("matrix", "export", "--parquet", str(tmp / "pq"), *db),
        "manifest": _json("manifest", "show", manifest),
        "manifest-verify": _json("manifest", "verify", manifest, "--pubkey", str(tmp / "k.pub")),
        "manifest-diff": _json("manifest", "diff", v1, manifest),
        "manifest-history": _json("manifest", "history", *db),
        "rollout-status": _json("rollout", "status", *db),
        "rollout-log": _json("rollout", "log", *db),
        "telemetry-check": _json("telemetry", "check", *db, codes=(0, 1)),
        "emulators-show": _json("emulators", "show", *common),
    }
    for schema, document in documents.items():
        _valid(document, schema)
    # What the documents say is the story's.
    shown = documents["matrix-show"]
    assert shown["basis"] == "project" and len(shown["rows"]) == 2
    assert {c["host_class"] for c in shown["coverage"]} == {"here-cpu", "lost-gpu", "elsewhere"}
    assert shown["fleet_gaps"] == [
        {"host_class": "elsewhere", "reason": "node_lost", "detail": "its host left mid-run"}
    ]
    (action,) = documents["rollout-log"]["actions"]
    assert action["action"] == "start" and action["why"] == "canary\nsecond line"  # whole
    (rollout,) = documents["rollout-status"]["rollouts"]
    assert rollout["percent"] == 50 and rollout["artifact"] == "respun"
    assert documents["manifest-diff"]["old"] == v1  # a rollout changes no class's decision
    assert documents["manifest-verify"]["version"] == 2
    first, step = documents["manifest-history"]["versions"]
    assert (first["version"], first["state"], first["publish_reason"]) == (1, "published", "")
    assert first["published_by"]  # the OS user name, by default
    assert step["publish_reason"] == "canary\nsecond line" and "[OS user " in step["published_by"]
    assert len(documents["matrix-export"]["files"]) >= 2


def test_ingest_commands_answer_json_too(story: Story, tmp_path: Path) -> None:
    bundle = story.tmp / "bundles" / story.run["run_id"]
    other = ["--db", str(tmp_path / "other.duckdb")]
    ingested = _json("matrix", "ingest", str(bundle), *other)
    _valid(ingested, "matrix-ingest")
    assert [b["status"] for b in ingested["bundles"]] == ["ingested"]
    events = tmp_path / "events.jsonl"
    events.write_text("not an event\n")
    said = _json("telemetry", "ingest", str(events), *other)
    _valid(said, "telemetry-ingest")
    (file,) = said["files"]
    assert (file["events"], file["bad_lines"], file["bad"][0]["line"]) == (0, 1, 1)


def test_matrix_show_json_without_a_project_file_is_the_cells_as_measured(story: Story) -> None:
    shown = _json("matrix", "show", "--db", story.common[3], "--project", "none.yaml")
    _valid(shown, "matrix-show")
    assert shown["basis"] == "measured" and shown["coverage"] is None
    # The older form stays: the rows alone.
    rows = json.loads(_cli("matrix", "show", *story.common, "--format", "json"))
    assert isinstance(rows, list) and {r["artifact_name"] for r in rows} == {
        "identity_mlp",
        "respun",
    }


def test_a_schema_refuses_a_document_with_a_field_it_does_not_name(story: Story) -> None:
    document = _json("rollout", "log", *story.common[2:])
    document["actions"][0]["extra"] = 1
    with pytest.raises(jsonschema.ValidationError, match="extra"):
        _valid(document, "rollout-log")


def test_matrix_csv_cells_are_plain_values_never_python_reprs(story: Story) -> None:
    text = _cli("matrix", "show", *story.common, "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == 2
    for row in rows:
        assert json.loads(row["reason_codes"]) == [] and json.loads(row["isa_mismatch"]) == []
        assert row["emulated"] == "false" and "T" in row["measured_at"]
        assert not any(v.startswith(("['", "{'")) or v in ("True", "False") for v in row.values())


def _closed_pipe(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``qualify ARGS`` writing into a pipe whose reader has gone (closed before it writes)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [sys.executable, "-m", "qualify", *args],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            timeout=120,
            check=False,
        )
    finally:
        os.close(write)


@pytest.mark.parametrize("args", [["rollout", "log"], ["manifest", "show", "--json"]])
def test_a_closed_pipe_ends_the_command_quietly(story: Story, args: list[str]) -> None:
    done = _closed_pipe(args, story.tmp)
    assert (done.returncode, done.stderr) == (EXIT_CLOSED_PIPE, "")


READ_COMMANDS = (
    "matrix show",
    "matrix stale",
    "matrix gate",
    "matrix export",
    "matrix ingest",
    "run",
    "tune",
    "manifest show",
    "manifest verify",
    "manifest diff",
    "rollout status",
    "rollout log",
    "telemetry check",
    "telemetry ingest",
    "emulators show",
    "fleet status",
)
"""Every command that reads or reports: the ones that answer ``--json``."""


def test_every_read_command_has_the_same_json_flag_naming_a_published_schema() -> None:
    import re

    import click

    for path in READ_COMMANDS:
        command: click.Command = cli
        for name in path.split():
            assert isinstance(command, click.Group)
            command = command.commands[name]
        (option,) = [p for p in command.params if "--json" in getattr(p, "opts", ())]
        assert isinstance(option, click.Option) and option.is_flag, path
        found = re.search(r"schemas/([\w-]+)\.schema\.json", option.help or "")
        assert found and (SCHEMA_DIR / f"{found.group(1)}.schema.json").is_file(), path
