"""Coverage (class x artifact, the latest cell or why there is none), the release gate, and
the JUnit XML and markdown summary CI reads."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from qualify.coverage import coverage, junit_xml, release_gate, summary_markdown
from schemas.manifest import Manifest
from tests.manifest.factories import Fleet, fixed_key, scenario, signed_manifest
from tests.qualify.projects import write_project

T0 = datetime(2025, 6, 1, tzinfo=UTC)


def _row(project: Any, name: str, artifact: str, **extra: Any) -> dict[str, Any]:
    host_class = project.host_classes[name]
    hardware, runtime, provider = host_class.key.as_tuple()
    return {
        "host_class": name,
        "hardware": hardware,
        "runtime": runtime,
        "provider": provider,
        "artifact_name": artifact,
        "artifact_digest": "sha256:" + "0" * 64,
        "run_id": extra.pop("run_id", "r1"),
        "measured_at": extra.pop("measured_at", T0),
        "verdict": "pass",
        "reason_codes": [],
        "settings_digest": host_class.settings_digest(),
        "p99_upper_ms": 4.0,
        **extra,
    }


def test_coverage_names_every_gap_and_keeps_the_latest_cell() -> None:
    project = scenario().project
    base, cand = project.artifacts.baseline.label, project.artifacts.candidates[0].label
    rows = [
        _row(project, "x86-vnni", base),
        _row(project, "x86-vnni", cand, verdict="fail", run_id="r1"),
        _row(project, "x86-vnni", cand, run_id="r2", measured_at=T0.replace(hour=1)),
        _row(project, "gpu-a10", base, settings_digest="sha256:old"),
    ]
    items = coverage(project, rows, unserved=["arm-new"])
    found = {(i.host_class, i.artifact): (i.gap, i.row["run_id"] if i.row else None) for i in items}
    assert found[("x86-vnni", base)] == (None, "r1")
    assert found[("x86-vnni", cand)] == (None, "r2")  # the later of two cells
    assert found[("gpu-a10", base)] == ("stale", "r1")
    assert found[("gpu-a10", cand)] == ("never_run", None)
    assert found[("arm-new", base)] == ("unserved", None)
    assert len(items) == len(project.host_classes) * 2


def test_the_gate_blocks_a_class_without_evidence_and_one_that_regressed() -> None:
    fleet = scenario()
    current = Manifest.model_validate(signed_manifest(fleet, fixed_key())).signed.entries
    healthy = release_gate(fleet.decide().values(), current, scope=["x86-vnni", "gpu-a10"])
    assert not healthy.blocked
    assert healthy.decisions["x86-vnni"] == ("candidate", "rec-int8")

    assert release_gate(fleet.decide().values(), current, scope=["arm-new"]).problems == {
        "arm-new": "no decision: nothing was measured on this class's key"
    }

    later = Fleet(fleet.project, cells=list(fleet.cells), runs=dict(fleet.runs))
    later.clock = fleet.clock.replace(year=2026)
    later.qualify("x86-vnni", p99_upper_ms=90.0, p99_lower_ms=85.0, p99_ms=88.0)
    gate = release_gate(later.decide().values(), current, scope=["x86-vnni"])
    assert gate.blocked
    assert gate.problems["x86-vnni"].startswith(
        "regressed: the current manifest gives it candidate rec-int8"
    )


def test_junit_and_markdown_carry_the_reasons_and_survive_hostile_names() -> None:
    project = scenario().project
    base = project.artifacts.baseline.label
    hostile = "x86-vnni"
    rows = [
        _row(project, hostile, base, verdict="fail", reason_codes=["p99_over_budget"]),
    ]
    items = coverage(project, rows)
    gate = release_gate([], None, scope=[])
    reasons = {
        ("r1", "sha256:" + "0" * 64): ['p99_over_budget: p99 <script>&"|</script>\x07\x00 > 80 ms']
    }
    doc = junit_xml(items, gate, reasons=reasons)
    root = ElementTree.fromstring(doc.encode())
    cases = {(c.get("classname"), c.get("name")): c for c in root.iter("testcase")}
    failed = cases[(hostile, base)].find("failure")
    assert failed is not None and "p99 <script>" in (failed.text or "")
    assert cases[("arm-new", base)].find("error") is not None  # never run is an error
    assert int(root.get("failures") or 0) == sum(
        1
        for c in root.iter("testcase")
        if c.find("failure") is not None or c.find("error") is not None
    )
    md = summary_markdown(items, gate, title="t | <b>")
    assert "t \\| \\<b\\>" in md
    table = [line for line in md.splitlines() if line.startswith("| x86-vnni")]
    assert table and all(line.count("|") - line.count("\\|") == 6 for line in table)


@pytest.mark.slow
def test_run_gate_writes_the_ci_files_and_exits_by_the_release_verdict(tmp_path: Path) -> None:
    project = write_project(tmp_path, [])
    junit, summary = tmp_path / "ci" / "junit.xml", tmp_path / "summary.md"
    (tmp_path / "ci").mkdir()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "qualify",
            "run",
            "--host-class",
            "here-cpu",
            "--project",
            str(project),
            "--db",
            str(tmp_path / "m.duckdb"),
            "--gate",
            "--junit-xml",
            str(junit),
            "--summary-md",
            str(summary),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    root = ElementTree.parse(junit).getroot()
    assert {c.get("classname") for c in root.iter("testcase")} == {"here-cpu"}
    assert "**Release can proceed**" in summary.read_text()


def test_matrix_gate_blocks_a_release_with_a_class_never_measured(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from matrix.store import Store
    from qualify.cli import cli

    project = write_project(tmp_path, [])
    Store.open(tmp_path / "m.duckdb").close()
    junit = tmp_path / "j.xml"
    result = CliRunner().invoke(
        cli,
        [
            "matrix",
            "gate",
            "--project",
            str(project),
            "--db",
            str(tmp_path / "m.duckdb"),
            "--classes",
            "here-cpu",
            "--junit-xml",
            str(junit),
        ],
    )
    assert result.exit_code == 3, result.output
    assert "here-cpu: no decision" in result.output
    root = ElementTree.parse(junit).getroot()
    assert root.get("failures") == "2"  # the baseline never run, and the class's decision
