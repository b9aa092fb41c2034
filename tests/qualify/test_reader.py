"""The Python API as an analyst meets it: docs/python.md's example run literally on a real
matrix, frames with exactly the documented columns, and reading that never gets in a writer's
way, never changes an older matrix and refuses a newer one."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pandas as pd
import pytest
from click.testing import CliRunner

import qualify
from manifest.host_events import encode_event
from matrix.errors import MatrixError, MatrixLockedError, SchemaVersionError
from matrix.migrations import LATEST_VERSION, MIGRATIONS
from matrix.store import Store
from qualify import reader
from qualify.cli import cli
from qualify.project.load import load_project
from qualify.run import RunOptions, qualify_run
from tests.matrix.factories import older_matrix
from tests.matrix.test_concurrency import HOLD_LOCK, child, wait_for
from tests.qualify.projects import write_project

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "python.md"
FRAMES = {
    "cells": reader.CELL_COLUMNS,
    "latency": reader.LATENCY_COLUMNS,
    "samples": reader.SAMPLE_COLUMNS,
    "runs": reader.RUN_COLUMNS,
    "telemetry": reader.TELEMETRY_COLUMNS,
    "manifests": reader.MANIFEST_COLUMNS,
    "lineage": reader.LINEAGE_COLUMNS,
}


def _invoke(*args: str) -> None:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real small run, a published manifest, a variant's lineage and a host's telemetry: every
    frame of the API has rows."""
    tmp = tmp_path_factory.mktemp("reader")
    path = write_project(tmp, ["identity_mlp_perturbed"])
    db = tmp / "qualify.duckdb"
    outcome = qualify_run(load_project(path), "here-cpu", RunOptions(db_path=db))
    assert outcome.bundle.cells
    common = ["--project", str(path), "--db", str(db)]
    _invoke("candidates", "--variant", "fp16", "--no-write", *common)
    _invoke("keygen", "rel", "--dir", str(tmp))
    _invoke(
        "manifest", "generate", "--publish", "--key", str(tmp / "rel.key"), "--release", "r1",
        "--out", str(tmp / "manifest.json"), *common,
    )  # fmt: skip
    baseline = next(c for c in outcome.bundle.cells if c.role == "baseline")
    event = {
        "format": "qualify-telemetry/1",
        "time": "2026-01-02T03:04:05Z",
        "source": "session",
        "host_id": "host-1",
        "host_class": "here-cpu",
        "model_digest": baseline.artifact_digest,
        "runtime_revision": "1.32.0",
        "providers": ["CPUExecutionProvider"],
        "placement": "actual",
        "nodes_per_provider": {"CPUExecutionProvider": 3},
        "fallback_nodes": 0,
        "latency_ms": 0.25,
        "manifest_version": 1,
    }
    (tmp / "events.jsonl").write_bytes(encode_event(event))
    _invoke("telemetry", "ingest", str(tmp / "events.jsonl"), "--db", str(db))
    return tmp


def _example() -> str:
    (code,) = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    return code


def _documented_columns() -> dict[str, list[str]]:
    """Each ``### `name()``` section's table of columns, in order."""
    found: dict[str, list[str]] = {}
    section = None
    for line in DOC.read_text(encoding="utf-8").splitlines():
        heading = re.match(r"### `(\w+)\(\)`", line)
        if heading:
            section = heading.group(1)
            found[section] = []
        row = re.match(r"\| `(\w+)` \|", line)
        if row and section is not None:
            found[section].append(row.group(1))
    return found


def _names(columns: reader.Columns) -> list[str]:
    return [name for name, _ in columns]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_the_documented_example_returns_frames_with_the_documented_columns(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(project)
    namespace: dict[str, object] = {}
    exec(compile(_example(), str(DOC), "exec"), namespace)
    documented = _documented_columns()
    assert set(documented) == set(FRAMES)
    for name, columns in FRAMES.items():
        frame = namespace[name]
        assert isinstance(frame, pd.DataFrame), name
        assert list(frame.columns) == documented[name] == _names(columns), name
        assert len(frame) > 0, f"{name} has no rows: the fixture should give every frame some"
    printed = capsys.readouterr().out
    assert "here-cpu" in printed and "'lost-gpu': 'hold'" in printed
    assert namespace["latest"].signed.version == 1  # type: ignore[attr-defined]


@pytest.mark.slow
def test_cells_carry_the_evidence_the_run_stored(project: Path) -> None:
    m = qualify.open(project / "qualify.duckdb")
    assert m.model == "tiny" and "model 'tiny'" in repr(m)
    cells = m.cells().set_index("artifact_name")
    latest = m.cells(latest=True)
    assert (
        set(latest["artifact_name"])
        == set(cells.index)
        == {"identity_mlp", "identity_mlp_perturbed"}
    )
    candidate = m.cell(str(cells.loc["identity_mlp_perturbed", "run_id"]), "identity_mlp_perturbed")
    gate = candidate.gate_latency
    assert gate is not None and candidate.parity is not None and candidate.placement is not None
    row = cells.loc["identity_mlp_perturbed"]
    assert row["verdict"] == "fail" and "parity_failed" in row["reason_codes"]
    assert row["p99_upper_ms"] == gate.p99_upper_ms and row["samples"] == gate.samples
    assert row["parity_max_abs"] == candidate.parity.outputs[0].max_abs
    assert bool(row["parity_passed"]) is False
    assert row["nodes_per_provider"] == candidate.placement.nodes_per_provider
    assert row["model"] == "tiny" and row["hardware"] == "here"
    # The baseline has no parity: null, never a number.
    assert pd.isna(cells.loc["identity_mlp", "parity_passed"])
    assert pd.isna(cells.loc["identity_mlp", "parity_max_abs"])
    kinds = dict(reader.CELL_COLUMNS)
    for name, kind in kinds.items():
        dtype = str(cells.reset_index()[name].dtype)
        expected = {"float": "float64", "int": "Int64", "bool": "boolean"}.get(kind)
        if expected is not None:
            assert dtype == expected, (name, dtype)
    assert str(cells["measured_at"].dtype).endswith("UTC]")
    latency = m.latency()
    assert latency.groupby("artifact_name")["gate"].sum().to_dict() == {
        "identity_mlp": 1,
        "identity_mlp_perturbed": 1,
    }
    samples = m.samples(artifact="identity_mlp")
    assert len(samples) == latency[latency.artifact_name == "identity_mlp"]["samples"].sum()
    assert (
        (samples["latency_ms"] * 1e6)
        .round()
        .astype("int64")
        .equals(samples["latency_ns"].astype("int64"))
    )


@pytest.mark.slow
def test_manifests_telemetry_and_lineage_read_back(project: Path) -> None:
    m = qualify.open(project / "qualify.duckdb")
    manifests = m.manifests()
    assert set(manifests["host_class"]) == {"here-cpu", "lost-gpu", "elsewhere"}
    assert set(manifests["state"]) == {"published"}
    here = manifests.set_index("host_class").loc["here-cpu"]
    assert here["decision"] == m.manifest(1).signed.entries["here-cpu"].decision
    telemetry = m.telemetry()
    assert telemetry.loc[0, "nodes_per_provider"] == {"CPUExecutionProvider": 3}
    assert telemetry.loc[0, "providers"] == ["CPUExecutionProvider"]
    assert telemetry.loc[0, "time"] == pd.Timestamp("2026-01-02T03:04:05Z")
    assert m.telemetry(since=datetime(2026, 1, 3, tzinfo=UTC)).empty
    lineage = m.lineage()
    assert list(lineage["artifact_name"]) == ["fp16"]
    assert lineage.loc[0, "parent_name"] == "identity_mlp"
    assert isinstance(lineage.loc[0, "params"], dict) and lineage.loc[0, "params"]


def test_a_fresh_matrix_gives_empty_frames_with_every_column_typed(tmp_path: Path) -> None:
    path = tmp_path / "qualify.duckdb"
    Store.open(path).close()
    with qualify.open(path) as m:
        assert not m.copied and m.schema_version == LATEST_VERSION and m.model is None
        for name, columns in FRAMES.items():
            frame = getattr(m, name)()
            assert frame.empty and list(frame.columns) == _names(columns), name
        assert str(m.cells()["p99_ms"].dtype) == "float64"
        assert str(m.telemetry()["fallback_nodes"].dtype) == "Int64"
        with pytest.raises(KeyError, match="no published manifest"):
            m.manifest()
        with pytest.raises(KeyError, match="no run 'r1'"):
            m.run("r1")
        with pytest.raises(KeyError, match="no cell of artifact 'a'"):
            m.cell("r1", "a")
    with pytest.raises(MatrixError, match="read after close"):
        m.cells()


def test_a_missing_file_is_named_and_not_created(tmp_path: Path) -> None:
    with pytest.raises(MatrixError, match="no matrix at"):
        qualify.open(tmp_path / "nothing.duckdb")
    assert not (tmp_path / "nothing.duckdb").exists()


def test_an_open_matrix_never_holds_the_file_from_a_writer(tmp_path: Path) -> None:
    path = tmp_path / "qualify.duckdb"
    Store.open(path).close()
    m = qualify.open(path)
    m.cells()
    # Another process takes the write lock at once while the reader is still open.
    code = "import sys; from matrix.store import Store; Store.open(sys.argv[1], wait_s=0).close()"
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)], cwd=ROOT, capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert m.cells().empty


def test_a_read_waits_for_a_writer_and_names_it_when_it_does_not_finish(tmp_path: Path) -> None:
    path = tmp_path / "qualify.duckdb"
    Store.open(path).close()
    m = qualify.open(path, wait_s=0.3)
    with child(HOLD_LOCK, str(path), "60") as holder:
        wait_for(holder, "locked")
        with pytest.raises(MatrixLockedError, match=f"locked by PID {holder.pid}"):
            m.cells()
        with pytest.raises(MatrixLockedError):
            qualify.open(path, wait_s=0.3)
    with child(HOLD_LOCK, str(path), "1") as holder:
        wait_for(holder, "locked")
        assert qualify.open(path, wait_s=30).cells().empty  # it waited for the writer


def _older_copy(source: Path, target: Path) -> None:
    """``source``'s rows in a matrix of the schema one migration before the latest, as the
    previous qualify would have left it."""
    conn = older_matrix(target, MIGRATIONS[:-1])
    try:
        conn.execute(f"ATTACH '{source}' AS src (READ_ONLY)")
        tables = conn.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
            "AND table_name != 'schema_migrations'"
        ).fetchall()
        for (table,) in tables:
            columns = [
                row[0]
                for row in conn.execute(
                    "SELECT column_name FROM duckdb_columns() WHERE database_name = "
                    "current_database() AND table_name = ?",
                    [table],
                ).fetchall()
            ]
            listed = ", ".join(columns)
            conn.execute(f"INSERT INTO {table} ({listed}) SELECT {listed} FROM src.{table}")
        conn.execute("DETACH src")
    finally:
        conn.close()


@pytest.mark.slow
def test_an_older_matrix_is_read_through_a_copy_and_its_file_is_left_as_it_was(
    project: Path, tmp_path: Path
) -> None:
    older = tmp_path / "older.duckdb"
    _older_copy(project / "qualify.duckdb", older)
    before = _sha256(older)
    with qualify.open(older) as m:
        assert m.copied and m.schema_version == LATEST_VERSION - 1 and m.model == "tiny"
        assert "in-memory copy" in repr(m)
        cells = m.cells()
        samples = m.samples()
        assert _sha256(older) == before
        # The copy does not hold the file: another process takes its write lock at once.
        code = "import duckdb, sys; duckdb.connect(sys.argv[1]).close()"
        done = subprocess.run(
            [sys.executable, "-c", code, str(older)], capture_output=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        assert len(m.cells()) == len(cells)  # the snapshot, still readable
    current = qualify.open(project / "qualify.duckdb")
    pd.testing.assert_frame_equal(cells, current.cells())
    pd.testing.assert_frame_equal(samples, current.samples())
    conn = duckdb.connect(str(older), read_only=True)
    try:
        assert conn.execute("SELECT max(version) FROM schema_migrations").fetchall() == [
            (LATEST_VERSION - 1,)
        ]
    finally:
        conn.close()


def test_a_newer_matrix_is_refused_naming_both_versions(tmp_path: Path) -> None:
    path = tmp_path / "qualify.duckdb"
    Store.open(path).close()
    conn = duckdb.connect(str(path))
    conn.execute(
        "INSERT INTO schema_migrations VALUES (?, 'from the future', now())", [LATEST_VERSION + 1]
    )
    conn.close()
    before = _sha256(path)
    with pytest.raises(SchemaVersionError, match="upgrade qualify") as caught:
        qualify.open(path)
    assert (caught.value.found, caught.value.known) == (LATEST_VERSION + 1, LATEST_VERSION)
    assert _sha256(path) == before


def test_importing_qualify_and_opening_a_matrix_loads_pandas_only_for_a_frame(
    tmp_path: Path,
) -> None:
    path = tmp_path / "qualify.duckdb"
    Store.open(path).close()
    code = (
        "import sys, json, qualify\n"
        "seen = ['pandas' in sys.modules]\n"
        f"m = qualify.open({str(path)!r})\n"
        "seen.append('pandas' in sys.modules)\n"
        "m.cells()\n"
        "seen.append('pandas' in sys.modules)\n"
        "print(json.dumps(seen))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [False, False, True]
