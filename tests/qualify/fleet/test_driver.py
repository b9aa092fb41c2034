"""The fleet driver's accounting without a cluster: what it makes of a reply it cannot read, and
what the gate makes of a class whose latest evidence measured nothing (a fleet gap, or only
``node_lost``/``fleet_timeout`` cells). The real clusters are in ``test_fleet*.py``."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from matrix.samples import empty_samples
from matrix.store import Store
from qualify.artifacts import digest_file
from qualify.fleet.cluster import FleetOptions
from qualify.fleet.driver import Driver, _Class, error_bundle
from qualify.measure.fingerprint import take_fingerprint
from qualify.measure.runner import probe_runtime
from qualify.project.load import LoadedProject, load_project
from qualify.release.coverage import junit_xml
from qualify.release.generate import release_check
from tests.qualify.projects import write_project


def _placed() -> dict[str, Any]:
    fp = take_fingerprint(probe_runtime)
    return {
        "node": "ab" * 28,
        "hostname": "lab-7",
        "fingerprint": fp.model_dump_json(),
        "at": time.time(),
    }


def _driver(tmp_path: Path) -> tuple[Driver, LoadedProject, list[str]]:
    loaded = load_project(write_project(tmp_path, []))
    lines: list[str] = []
    driver = Driver(
        None, loaded, {}, FleetOptions(db_path=tmp_path / "m.duckdb"), lines.append, lambda: False
    )
    driver.digests = [digest_file(loaded.resolve(loaded.project.artifacts.baseline.path))]
    return driver, loaded, lines


def test_a_bundle_the_driver_cannot_read_becomes_that_classs_error_not_the_runs_crash(
    tmp_path: Path,
) -> None:
    driver, loaded, lines = _driver(tmp_path)
    placed = _placed()
    # What a host running a newer qualify sends: one field this version does not know.
    newer = json.loads(
        error_bundle(
            loaded, "here-cpu", placed, "run_failed", "x", driver.digests
        ).model_dump_json()
    )
    newer["cells"][0]["energy_per_token_mj"] = 1.5
    readable = error_bundle(loaded, "lost-gpu", placed, "run_failed", "x", driver.digests)
    for name, reply in [
        ("here-cpu", {"bundle": json.dumps(newer)}),
        ("lost-gpu", {"bundle": readable.model_dump_json(), "samples": b"PAR1 not parquet"}),
        ("elsewhere", {"bundle": readable.model_dump_json()}),  # another class's run
    ]:
        c = _Class(name, placed=placed)
        driver.open[name] = c
        driver._arrived(c, {"format": 1, "hostname": "lab-7", "node": placed["node"], **reply})
    for name in ("here-cpu", "lost-gpu", "elsewhere"):
        run = driver.results[name]
        assert (run.state, run.reason) == ("error", "bundle_unreadable"), name
        assert "lab-7" in run.message and run.bundle is not None
    assert "energy_per_token_mj" in driver.results["here-cpu"].message
    assert any(line.startswith("here-cpu: error (bundle_unreadable)") for line in lines)
    with Store.open(tmp_path / "m.duckdb", read_only=True) as db:
        cells = db.latest_cells()
        assert {c.host_class for c in cells} == {"here-cpu", "lost-gpu", "elsewhere"}
        assert {r.code for c in cells for r in c.reasons} == {"bundle_unreadable"}
        check = release_check(loaded, db, scope=["here-cpu", "lost-gpu", "elsewhere"])
    assert all(why.startswith("no measured decision") for why in check.gate.problems.values())
    assert set(check.gate.problems) == {"here-cpu", "lost-gpu", "elsewhere"}


def test_the_gate_finds_no_measured_decision_where_the_latest_evidence_measured_nothing(
    tmp_path: Path,
) -> None:
    driver, loaded, _ = _driver(tmp_path)
    placed = _placed()
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    db_path = tmp_path / "m.duckdb"

    def store(code: str, at: datetime) -> None:
        bundle = error_bundle(loaded, "here-cpu", placed, code, code, driver.digests, now=at)
        with Store.open(db_path) as db:
            db.write_run(bundle, empty_samples())

    def check(gaps: dict[str, str] | None = None) -> tuple[str | None, ElementTree.Element]:
        with Store.open(db_path, read_only=True) as db:
            found = release_check(loaded, db, scope=["here-cpu"], gaps=gaps)
        root = ElementTree.fromstring(junit_xml(found.items, found.gate))
        return found.gate.problems.get("here-cpu"), root

    store("run_failed", t0)  # measured: the artifact failed on the class (a real decision)
    problem, _ = check()
    assert problem is None or not problem.startswith("no measured decision"), problem
    store("node_lost", t0 + timedelta(hours=1))  # then its host was lost: nothing measured
    problem, _ = check()
    assert problem is not None and problem.startswith("no measured decision"), problem
    assert "node_lost" in problem
    store("run_failed", t0 + timedelta(hours=2))  # measured again
    problem, _ = check()
    assert problem is None or not problem.startswith("no measured decision"), problem
    # A fleet gap newer than every cell counts over them, in the gate and as JUnit errors.
    problem, root = check({"here-cpu": "host_mismatch: refused by lab-7"})
    assert problem is not None and "host_mismatch: refused by lab-7" in problem
    (case,) = [c for c in root.iter("testcase") if c.get("name") != "release decision"]
    (mark,) = list(case)
    assert mark.tag == "error" and "refused by lab-7" in (mark.get("message") or "")
    assert root.get("errors") == "1" and root.get("failures") == "1"
