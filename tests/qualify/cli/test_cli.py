"""The command line as a user meets it: exit codes, messages, JSON, and a killed run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import jsonschema
import pytest
from click.testing import CliRunner

from matrix.store import Store
from qualify.cli import cli
from qualify.project.view import recorded_view
from tests.qualify.projects import run_qualify, write_project

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    tmp = tmp_path_factory.mktemp("cli")
    write_project(tmp, ["identity_mlp_perturbed"])
    proc = run_qualify("run", "--host-class", "here-cpu", "--json", cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    (tmp / "run.stderr").write_text(proc.stderr)  # what the run said beside its JSON
    return tmp, json.loads(proc.stdout)


def test_run_json_summary_has_every_promised_field(ran: tuple[Path, dict[str, object]]) -> None:
    _, summary = ran
    assert summary["host_class"] == "here-cpu" and summary["emulated"] is False
    cells = summary["cells"]
    assert isinstance(cells, list) and len(cells) == 2
    for cell in cells:
        for field in (
            "artifact_digest",
            "role",
            "verdict",
            "reasons",
            "p50_ms",
            "p99_ms",
            "p99_upper_ms",
            "samples",
            "nodes_per_provider",
            "fallback_nodes",
            "peak_rss_mb",
            "cold_init_ms",
        ):
            assert field in cell, field
    assert [c["verdict"] for c in cells] == ["pass", "fail"]
    assert cells[1]["reasons"][0]["code"] == "parity_failed"
    published = json.loads((ROOT / "schemas" / "run-summary.schema.json").read_text())
    jsonschema.Draft202012Validator(published).validate(summary)


def test_run_json_still_says_each_step_on_stderr_one_unwrapped_line_each(
    ran: tuple[Path, dict[str, object]],
) -> None:
    tmp, _ = ran
    lines = (tmp / "run.stderr").read_text().splitlines()
    # Each step a line of its own ("[12:00:01] ..."); besides them only what qualify says of a
    # wait ("qualify: ..."): a line wrapped by the renderer would start with neither.
    steps = [line for line in lines if line.startswith("[")]
    assert all(line.startswith(("[", "qualify: ")) for line in lines), lines
    assert len(steps) >= 3 and any(len(line) > 80 for line in steps), steps


def test_matrix_show_formats(ran: tuple[Path, dict[str, object]]) -> None:
    tmp, summary = ran
    as_json = run_qualify("matrix", "show", "--format", "json", cwd=tmp)
    rows = json.loads(as_json.stdout)
    assert {r["run_id"] for r in rows} == {summary["run_id"]}
    assert all(r["p99_budget_ms"] == 50 for r in rows)
    as_csv = run_qualify("matrix", "show", "--format", "csv", cwd=tmp).stdout.splitlines()
    assert as_csv[0].startswith("hardware,runtime,provider,host_class,artifact_digest")
    assert len(as_csv) == 3
    table = run_qualify("matrix", "show", cwd=tmp)
    assert table.returncode == 0 and "here-cpu" in table.stdout
    assert "pass p99≤" in table.stdout and "/50.0 ms" in table.stdout
    assert "gap: elsewhere x identity_mlp: never run on this class's key" in table.stdout
    # The run recorded what matrix show reads of the project file, for these bytes.
    with Store.open(tmp / "qualify.duckdb", read_only=True) as db:
        assert recorded_view(db, tmp / "qualify.yaml") is not None


def test_bundles_ingest_into_another_matrix_once(
    ran: tuple[Path, dict[str, object]], tmp_path: Path
) -> None:
    tmp, summary = ran
    bundle = tmp / "bundles" / str(summary["run_id"])
    first = run_qualify(
        "matrix", "ingest", str(bundle), "--db", str(tmp_path / "fleet.duckdb"), cwd=tmp
    )
    again = run_qualify(
        "matrix", "ingest", str(bundle), "--db", str(tmp_path / "fleet.duckdb"), cwd=tmp
    )
    assert "ingested" in first.stdout and "already present" in again.stdout
    con = duckdb.connect(str(tmp_path / "fleet.duckdb"), read_only=True)
    assert con.sql("select count(*) from cells").fetchall() == [(2,)]
    con.close()


def test_matrix_export_writes_parquet(ran: tuple[Path, dict[str, object]], tmp_path: Path) -> None:
    tmp, _ = ran
    out = run_qualify("matrix", "export", "--parquet", str(tmp_path / "pq"), cwd=tmp)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "pq" / "matrix.parquet").exists()
    assert (tmp_path / "pq" / "samples.parquet").exists()


def test_bad_project_file_exits_2_naming_file_line_and_field(tmp_path: Path) -> None:
    project = write_project(tmp_path, [])
    project.write_text(project.read_text().replace("p99_ms: 50", "p99_ms: -5", 1))
    result = CliRunner().invoke(cli, ["run", "--host-class", "here-cpu", "--project", str(project)])
    assert result.exit_code == 2
    assert "qualify.yaml:" in result.output
    assert "host_classes.here-cpu.budgets.p99_ms" in result.output
    assert "Traceback" not in result.output


def test_missing_project_file_says_how_to_get_one(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli, ["run", "--host-class", "x", "--project", str(tmp_path / "q.yaml")]
    )
    assert result.exit_code == 2
    assert "qualify demo" in result.output


def test_host_mismatch_exits_2_with_the_failed_rule(tmp_path: Path) -> None:
    write_project(tmp_path, [])
    proc = run_qualify("run", "--host-class", "elsewhere", cwd=tmp_path)
    assert proc.returncode == 2
    assert "class needs aarch64" in proc.stderr and "--emulate" in proc.stderr


def test_matrix_show_without_database_is_a_clear_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["matrix", "show", "--db", str(tmp_path / "none.duckdb")])
    assert result.exit_code == 2
    assert "no matrix database" in result.output


def test_debug_flag_shows_the_traceback(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli, ["--debug", "run", "--host-class", "x", "--project", str(tmp_path / "q.yaml")]
    )
    assert result.exit_code != 0
    assert result.exception is not None and type(result.exception).__name__ == "ProjectError"


def _workers_under(path: Path) -> list[str]:
    ps = subprocess.run(
        ["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True, check=True
    )
    return [
        line
        for line in ps.stdout.splitlines()
        if "qualify.measure.worker" in line and str(path) in line
    ]


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.5, 1.5, 2.5, "while the hang model runs"])
def test_run_killed_at_any_moment_leaves_no_partial_run(tmp_path: Path, delay: float | str) -> None:
    write_project(tmp_path, ["identity_mlp_perturbed", "hang"], timeout=4)
    (tmp_path / "tmp").mkdir()
    # Work directories (and so the workers' command lines) live under tmp_path.
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path / "tmp"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "qualify", "run", "--host-class", "here-cpu", "--json"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    if isinstance(delay, float):
        time.sleep(delay)
    else:  # the third artifact is the model that never finishes
        deadline = time.monotonic() + 120
        while not any("/a2/job.json" in w for w in _workers_under(tmp_path)):
            assert time.monotonic() < deadline, "the hang model never started"
            time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    db = tmp_path / "qualify.duckdb"
    if db.exists():
        con = duckdb.connect(str(db))
        runs = con.sql("select count(*) from runs").fetchall()[0][0]
        cells = con.sql("select count(*) from cells").fetchall()[0][0]
        con.close()
        assert cells == 3 * runs  # all of a run or nothing
    # The killed run's children die with it (no orphaned 'hang' model spinning).
    deadline = time.monotonic() + 5
    while _workers_under(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _workers_under(tmp_path) == []
