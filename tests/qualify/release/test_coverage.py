"""Coverage (class x artifact, the latest cell or why there is none), the release gate, and
the JUnit XML and markdown summary CI reads."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from manifest.verdict import CurrentVerdict, Judge, standings
from qualify.release.coverage import (
    CoverageItem,
    coverage,
    coverage_line,
    junit_xml,
    release_gate,
    summary_markdown,
)
from schemas.cell import Cell, Reason
from schemas.manifest import Manifest
from tests.manifest.factories import Fleet, digest_of, fixed_key, scenario, signed_manifest
from tests.qualify.projects import write_project


def files(fleet: Fleet, **changed: str) -> dict[str, str]:
    """The artifacts' digests now: the factories' fake digest of each label, or ``changed``."""
    project = fleet.project
    labels = [project.artifacts.baseline.label, *(c.label for c in project.artifacts.candidates)]
    return {label: changed.get(label.replace("-", "_"), digest_of(label)) for label in labels}


def covered(fleet: Fleet, digests: dict[str, str], **kwargs: Any) -> list[CoverageItem]:
    by_key: dict[tuple[str, str, str], list[Cell]] = {}
    for cell in fleet.cells:
        by_key.setdefault(cell.key.as_tuple(), []).append(cell)
    return coverage(standings(Judge(fleet.project, digests), by_key), **kwargs)


def test_coverage_names_every_gap_and_keeps_the_latest_cell() -> None:
    fleet = scenario()
    project = fleet.project
    base, cand = project.artifacts.baseline.label, project.artifacts.candidates[0].label
    later = fleet.qualify("x86-vnni", p99_upper_ms=90.0, p99_lower_ms=85.0, p99_ms=88.0)
    fleet.qualify("gpu-a10", settings_digest="sha256:" + "1" * 64)
    items = covered(fleet, files(fleet), unserved=["arm-new"])
    found = {(i.host_class, i.artifact): (i.gap, i.verdict) for i in items}
    assert found[("x86-vnni", cand)] == (None, "fail")  # the later of two cells, judged now
    assert next(i for i in items if i.artifact == cand).standing.cell.run_id == later  # type: ignore[union-attr]
    # gpu-a10's settings are the project's, not the later run's: the earlier cell is current.
    assert found[("gpu-a10", base)] == (None, "pass")
    assert found[("arm-old", base)] == (None, "error")
    assert found[("arm-new", base)] == ("unserved", None)
    assert len(items) == len(project.host_classes) * 2


def test_a_setting_changed_since_the_run_makes_its_cells_stale() -> None:
    fleet = scenario()
    fleet.qualify("gpu-a10", settings_digest="sha256:" + "1" * 64)
    fleet.cells[:] = [c for c in fleet.cells if c.settings_digest == "sha256:" + "1" * 64]
    found = {(i.host_class, i.artifact): i for i in covered(fleet, files(fleet))}
    item = found[("gpu-a10", "rec-fp32")]
    assert (item.gap, item.verdict) == ("stale", "stale")
    assert "settings" in item.note and "different" in item.note


def test_a_model_re_exported_in_place_is_never_run_with_its_earlier_bytes_named() -> None:
    fleet = scenario()
    now = files(fleet, rec_int8="sha256:" + "2" * 64)
    found = {(i.host_class, i.artifact): i for i in covered(fleet, now)}
    item = found[("x86-vnni", "rec-int8")]
    assert (item.gap, item.verdict) == ("never_run", None)
    assert item.note.startswith("never run on this class's key as its file is now (sha256:222")
    assert "measured its earlier bytes" in item.note
    assert found[("x86-vnni", "rec-fp32")].gap is None


def test_after_a_budget_is_tightened_the_cell_fails_and_no_line_calls_it_a_pass() -> None:
    fleet = scenario()
    fleet.cells[:] = [c for c in fleet.cells if c.host_class == "x86-vnni"]
    loose = covered(fleet, files(fleet))
    assert {i.verdict for i in loose if i.host_class == "x86-vnni"} == {"pass"}
    tightened = Fleet(
        fleet.project.model_copy(
            update={
                "host_classes": {
                    "x86-vnni": fleet.project.host_classes["x86-vnni"].model_copy(
                        update={
                            "budgets": fleet.project.host_classes["x86-vnni"].budgets.model_copy(
                                update={"p99_ms": 0.5}
                            )
                        }
                    )
                }
            }
        ),
        cells=fleet.cells,
        runs=fleet.runs,
    )
    items = covered(tightened, files(tightened), budgets={"x86-vnni": 0.5})
    assert [(i.verdict, i.gap) for i in items] == [("fail", None), ("fail", None)]
    line = coverage_line(items)
    assert "2 fail" in line and "pass" not in line
    assert line.startswith("coverage: every class x artifact has a current cell")
    gaps = covered(tightened, files(tightened, rec_int8="sha256:" + "3" * 64))
    assert coverage_line(gaps) == (
        "coverage: 1 of 2 class x artifact have a current cell (1 fail, under the project now); "
        "1 gap(s)"
    )


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
    fleet = scenario()
    project = fleet.project
    base = project.artifacts.baseline.label
    hostile = "x86-vnni"
    items = covered(fleet, files(fleet))
    for i, item in enumerate(items):
        if (item.host_class, item.artifact) == (hostile, base) and item.standing is not None:
            current = CurrentVerdict(
                "fail",
                (Reason(code="p99_over_budget", message='p99 <script>&"|</script>\x07\x00'),),
            )
            items[i] = replace(item, standing=item.standing._replace(current=current))
    gate = release_gate([], None, scope=[])
    doc = junit_xml(items, gate)
    root = ElementTree.fromstring(doc.encode())
    cases = {(c.get("classname"), c.get("name")): c for c in root.iter("testcase")}
    failed = cases[(hostile, base)].find("failure")
    assert failed is not None and "p99 <script>" in (failed.text or "")
    assert cases[("arm-new", base)].find("error") is not None  # never run is an error
    assert cases[("arm-old", base)].find("error") is not None  # so is an error cell
    assert cases[(hostile, "rec-int8")].find("failure") is None
    # errors (nothing measured) and failures (measured, not good enough) are counted apart
    assert int(root.get("failures") or 0) == sum(
        1 for c in root.iter("testcase") if c.find("failure") is not None
    )
    assert int(root.get("errors") or 0) == sum(
        1 for c in root.iter("testcase") if c.find("error") is not None
    )
    assert int(root.get("errors") or 0) > 0 and int(root.get("failures") or 0) > 0
    for suite in root.iter("testsuite"):
        marks = [e.tag for c in suite.iter("testcase") for e in c]
        assert int(suite.get("errors") or 0) == marks.count("error")
        assert int(suite.get("failures") or 0) == marks.count("failure")
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
    # the baseline never run is an error, the class's decision a failure
    assert (root.get("errors"), root.get("failures")) == ("1", "1")
