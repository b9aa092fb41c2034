"""The fleet under failure, on real Ray clusters on 127.0.0.1: each fault ends the run within
its bound, accounts for every class in the matrix, the JUnit and the summary, makes the gate
refuse where nothing was measured, and leaves no process or folder behind.

Faults: a host killed while it measures one class with another queued behind it; hosts that
disagree with the driver (joined with another project file, or running another qualify: a
``sitecustomize`` shim); an address with nothing listening (and malformed or loopback ones);
the driver stopped (SIGTERM) and killed (SIGKILL) mid-run.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from xml.etree import ElementTree

from click.testing import CliRunner

from matrix.store import Store
from qualify.cli import cli
from qualify.fleet.cluster import LOCAL_ENV, PROJECT_LABEL, VERSION_LABEL, FleetOptions
from qualify.fleet.start import fleet_run
from qualify.project.load import load_project
from tests.qualify.fleet.test_cluster import fleet_project, on_cluster
from tests.qualify.fleet_cluster import (
    SLOW_HOOK,
    VERSION_SHIM,
    Fleet,
    labels_for,
    processes_mentioning,
    task_folders,
    wait_until_gone,
)
from tests.qualify.projects import ROOT, run_qualify


def _gate(
    tmp_path: Path, project: Path, db: Path, classes: str
) -> tuple[int, str, ElementTree.Element, str]:
    """``qualify matrix gate`` over ``classes``: exit code, output, JUnit root, summary."""
    junit, summary = tmp_path / "gate.xml", tmp_path / "gate.md"
    result = CliRunner().invoke(
        cli,
        [
            "matrix",
            "gate",
            "--project",
            str(project),
            "--db",
            str(db),
            "--classes",
            classes,
            "--junit-xml",
            str(junit),
            "--summary-md",
            str(summary),
        ],
    )
    return result.exit_code, result.output, ElementTree.parse(junit).getroot(), summary.read_text()


def _marks(root: ElementTree.Element, host_class: str) -> dict[str, list[str]]:
    """Per test case of ``host_class``: the tags of its failure/error elements."""
    return {
        str(case.get("name")): [e.tag for e in case if e.tag in ("failure", "error")]
        for case in root.iter("testcase")
        if case.get("classname") == host_class
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@on_cluster
def test_a_host_killed_mid_run_ends_its_class_and_the_one_queued_behind_it_within_the_bound(
    tmp_path: Path,
) -> None:
    project = fleet_project(tmp_path, pause_s=0.002)
    loaded = load_project(project)
    nodes_tmp = tmp_path / "nodes-tmp"
    nodes_tmp.mkdir()
    env = {"TMPDIR": str(nodes_tmp)}
    cluster = Fleet({"doomed": ["here-cpu", "lost-gpu"]}, labels_for(loaded), env={"doomed": env})
    db = tmp_path / "m.duckdb"
    killed: list[str] = []

    def on_event(line: str) -> None:
        if ": measuring on" in line and not killed:
            killed.append(line.split(":")[0])
            cluster.kill("doomed")

    try:
        started = time.monotonic()
        outcome = fleet_run(
            loaded,
            FleetOptions(db_path=db, address=cluster.address, host_wait_s=3),
            classes=["here-cpu", "lost-gpu"],
            on_event=on_event,
        )
        took = time.monotonic() - started
        by_class = {c.host_class: c for c in outcome.classes}
        (first,) = killed
        (queued,) = {"here-cpu", "lost-gpu"} - {first}
        lost = by_class[first]
        assert (lost.state, lost.reason) == ("error", "node_lost"), lost.message
        assert lost.bundle is not None and cluster.nodes["doomed"].node_id[:12] in lost.message
        assert {r.code for c in lost.bundle.cells for r in c.reasons} == {"node_lost"}
        behind = by_class[queued]
        assert (behind.state, behind.reason) == ("gap", "node_lost"), behind.message
        assert "doomed" in behind.message and "left the cluster" in behind.message
        # the bound: the kill, Ray noticing the dead worker, --host-wait 3 s, slack for load
        assert took < 90, took
        assert wait_until_gone(str(nodes_tmp), 15) == []  # no measuring child outlived it
        assert len(task_folders(nodes_tmp)) == 1  # the killed task's, for the next run

        with Store.open(db, read_only=True) as store:
            assert set(store.fleet_gaps()) == {queued}
            assert {c.host_class for c in store.latest_cells()} == {first}
        code, out, junit, summary = _gate(tmp_path, project, db, "here-cpu,lost-gpu")
        assert code == 3, out
        for name in ("here-cpu", "lost-gpu"):
            assert f"{name}: no measured decision" in out
            marks = _marks(junit, name)
            assert marks.pop("release decision") == ["failure"]
            assert set(map(tuple, marks.values())) == {("error",)}, (name, marks)
            assert f"`{name}`" in summary
        assert "**Release blocked** (2 class(es))" in summary

        # A host of the class comes back: the next run measures it and removes the dead
        # task's folder; the gate has a measured decision for it again.
        cluster.add("back", ["here-cpu"], labels_for(loaded), {"back": env})
        (tmp_path / "hook.py").write_text(SLOW_HOOK % {"pause_s": 0})
        again = fleet_run(
            loaded, FleetOptions(db_path=db, address=cluster.address), classes=["here-cpu"]
        )
        assert again.classes[0].state == "done", again.classes[0].message
        assert task_folders(nodes_tmp) == []
        code, out, _, _ = _gate(tmp_path, project, db, "here-cpu")
        assert "no measured decision" not in out
    finally:
        cluster.shutdown()
    assert processes_mentioning(str(nodes_tmp), environ=True) == []


@on_cluster
def test_hosts_that_disagree_with_the_driver_are_never_measured_on_and_each_class_says_why(
    tmp_path: Path,
) -> None:
    project = fleet_project(tmp_path)
    loaded = load_project(project)
    labels = labels_for(loaded)
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(VERSION_SHIM)
    nodes_tmp = tmp_path / "nodes-tmp"
    nodes_tmp.mkdir()
    env = {"TMPDIR": str(nodes_tmp)}
    cluster = Fleet(
        {
            "good": ["here-cpu"],
            # joined by an older qualify with an older project file, in which 'elsewhere'
            # matched this machine
            "stale": ["here-cpu", "elsewhere"],
            # advertises this project and version, but runs another qualify (upgraded since)
            "upgraded": ["lost-gpu", "elsewhere"],
        },
        labels,
        # an older qualify, and a project file since edited
        extra_labels={"stale": {PROJECT_LABEL: "sha256-" + "0" * 56, VERSION_LABEL: "0.0.1"}},
        env={
            "good": env,
            "stale": env,
            "upgraded": {**env, "PYTHONPATH": f"{shim}{os.pathsep}{ROOT}"},
        },
    )
    db = tmp_path / "m.duckdb"
    lines: list[str] = []

    def on_event(line: str) -> None:
        lines.append(line)
        if line.startswith("lost-gpu: refused by"):  # a host of the class that agrees joins
            cluster.add("late", ["lost-gpu"], labels, {"late": env})

    try:
        status = CliRunner().invoke(
            cli, ["fleet", "status", "--address", cluster.address, "--project", str(project)]
        )
        started = time.monotonic()
        outcome = fleet_run(
            loaded, FleetOptions(db_path=db, address=cluster.address), on_event=on_event
        )
        took = time.monotonic() - started
    finally:
        cluster.shutdown()
    assert status.exit_code == 0, status.output
    assert "not used: stale" in status.output and "rejoin" in status.output
    assert "one machine, measured one at a time: " in status.output

    by_class = {c.host_class: c for c in outcome.classes}
    good, late = (cluster.nodes[n].node_id[:12] for n in ("good", "late"))
    assert by_class["here-cpu"].state == "done" and good in (by_class["here-cpu"].host or "")
    # refused at run time by the upgraded host, retried once, measured on one that agrees
    lost = by_class["lost-gpu"]
    assert lost.state == "done" and late in (lost.host or ""), lost.message
    assert any(line.startswith("lost-gpu: scheduled again, on another host") for line in lines)
    elsewhere = by_class["elsewhere"]
    assert (elsewhere.state, elsewhere.reason) == ("gap", "host_mismatch"), elsewhere.message
    assert "runs qualify 9.9.9" in elsewhere.message  # refused at run time, then no other
    assert "stale" in elsewhere.message and "rejoin" in elsewhere.message
    assert "advertises qualify 0.0.1" in elsewhere.message
    assert "emulate" not in " ".join(lines + [c.message for c in outcome.classes])
    upgraded = cluster.nodes["upgraded"].node_id[:12]
    refusals = [line for line in lines if "refused by" in line]
    assert len(refusals) == 2 and all(upgraded in line for line in refusals), refusals
    assert took < 150, took
    with Store.open(db, read_only=True) as store:
        assert set(store.fleet_gaps()) == {"elsewhere"}
        nodes = {c.fleet_node.split(" ")[0][:12] for c in store.latest_cells() if c.fleet_node}
    assert nodes == {good, late}  # never the stale or the upgraded host
    code, out, junit, summary = _gate(tmp_path, project, db, "elsewhere")
    assert code == 3 and "elsewhere: no measured decision" in out
    assert set(map(tuple, _marks(junit, "elsewhere").values())) == {("error",), ("failure",)}
    assert "host\\_mismatch" in summary
    assert task_folders(nodes_tmp) == []
    assert processes_mentioning(str(nodes_tmp), environ=True) == []


def test_an_address_with_nothing_listening_exits_2_naming_it_within_the_connect_timeout(
    tmp_path: Path,
) -> None:
    project = fleet_project(tmp_path)
    address = f"127.0.0.1:{_free_port()}"
    junit, summary = tmp_path / "j.xml", tmp_path / "s.md"
    started = time.monotonic()
    result = run_qualify(
        "fleet", "run", "--address", address, "--connect-timeout", "2s", "--project",
        str(project), "--db", str(tmp_path / "m.duckdb"), "--junit-xml", str(junit),
        "--summary-md", str(summary), cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert time.monotonic() - started < 30
    assert result.returncode == 2, result.stderr
    assert address in result.stderr and "connection refused" in result.stderr
    assert "Connecting" not in result.stderr + result.stdout
    root = ElementTree.parse(junit).getroot()
    for name in ("here-cpu", "lost-gpu", "elsewhere"):
        marks = _marks(root, name)
        assert marks.pop("release decision") == ["failure"]
        assert set(map(tuple, marks.values())) == {("error",)}
    assert "driver\\_failed" in summary.read_text()
    assert not (tmp_path / "m.duckdb").exists()  # nothing was measured, nothing recorded
    gate = CliRunner().invoke(
        cli, ["matrix", "gate", "--project", str(project), "--db", str(tmp_path / "m.duckdb")]
    )
    assert gate.exit_code == 2 and "no matrix database" in gate.output  # never a pass

    # Something listens, but not Ray: Ray's connect would retry for minutes, printing nothing.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        other = f"127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        result = run_qualify(
            "fleet", "status", "--address", other, "--connect-timeout", "1s", "--project",
            str(project), cwd=tmp_path, timeout=60,
        )  # fmt: skip
        assert time.monotonic() - started < 20
    assert result.returncode == 2 and other in result.stderr and "no answer" in result.stderr

    for args, said in [
        (["status", "--address", "127.0.0.1:99999"], "is not a port"),
        (["status", "--address", "ray://127.0.0.1:10001"], "HOST:PORT"),
        (["join", "--address", "127.0.0.1:6379"], "rewrites a loopback head address"),
    ]:
        result = run_qualify("fleet", *args, "--project", str(project), cwd=tmp_path, timeout=60)
        assert result.returncode == 2 and said in result.stderr, (args, result.stderr)


def _start_driver(project: Path, address: str, tmp_path: Path) -> subprocess.Popen[str]:
    """``qualify fleet run`` against the loopback head at ``address``, as a user starts it: without
    the variable that keeps Ray on loopback (the command sets it itself, or Ray would rewrite
    127.0.0.1 to this machine's interface address and wait there forever)."""
    env = {k: v for k, v in os.environ.items() if k not in LOCAL_ENV}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.Popen(
        [
            sys.executable, "-m", "qualify", "fleet", "run", "--address", address,
            "--project", str(project), "--db", str(tmp_path / "m.duckdb"),
            "--classes", "here-cpu,lost-gpu", "--junit-xml", str(tmp_path / "j.xml"),
            "--summary-md", str(tmp_path / "s.md"),
        ],
        cwd=tmp_path, env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip


def _wait_for(proc: subprocess.Popen[str], text: str, within_s: float) -> list[str]:
    """stderr lines of ``proc`` up to the first containing ``text``."""
    assert proc.stderr is not None
    seen: list[str] = []
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        if text in line:
            return seen
    raise AssertionError(f"no {text!r} within {within_s} s: {''.join(seen)[-2000:]}")


@on_cluster
def test_a_driver_stopped_or_killed_mid_run_leaves_every_class_accounted_and_nothing_running(
    tmp_path: Path,
) -> None:
    project = fleet_project(tmp_path, pause_s=0.01)
    loaded = load_project(project)
    nodes_tmp = tmp_path / "nodes-tmp"
    nodes_tmp.mkdir()
    env = {"TMPDIR": str(nodes_tmp)}
    cluster = Fleet({"host": ["here-cpu", "lost-gpu"]}, labels_for(loaded), env={"host": env})
    try:
        # SIGTERM (a CI job cancelled): the driver ends every class, writes its files, exits.
        driver = _start_driver(project, cluster.address, tmp_path)
        _wait_for(driver, ": measuring on", 120)
        driver.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        _, err = driver.communicate(timeout=60)
        assert time.monotonic() - stopped < 20, err
        assert driver.returncode == 1, err
        root = ElementTree.parse(tmp_path / "j.xml").getroot()
        for name in ("here-cpu", "lost-gpu"):
            marks = _marks(root, name)
            assert marks.pop("release decision") == ["failure"], name
            assert set(map(tuple, marks.values())) == {("error",)}, name
        assert "driver\\_stopped" in (tmp_path / "s.md").read_text()
        with Store.open(tmp_path / "m.duckdb", read_only=True) as store:
            assert {r for r, _ in store.fleet_gaps().values()} == {"driver_stopped"}
        assert wait_until_gone(str(nodes_tmp), 20) == []

        # SIGKILL: nothing can be written, but Ray ends the driver's tasks and what they started.
        driver = _start_driver(project, cluster.address, tmp_path)
        _wait_for(driver, ": measuring on", 120)
        driver.kill()
        driver.communicate(timeout=30)
        assert wait_until_gone(str(nodes_tmp), 30) == []
        assert task_folders(nodes_tmp)  # the killed tasks' folders, until the next run
        code, out, _, _ = _gate(tmp_path, project, tmp_path / "m.duckdb", "here-cpu,lost-gpu")
        assert code == 3 and "no measured decision" in out

        # The next run cleans up after the killed ones.
        (tmp_path / "hook.py").write_text(SLOW_HOOK % {"pause_s": 0})
        again = fleet_run(
            loaded,
            FleetOptions(db_path=tmp_path / "m.duckdb", address=cluster.address),
            classes=["lost-gpu"],
        )
        assert again.classes[0].state == "done", again.classes[0].message
        assert task_folders(nodes_tmp) == []
    finally:
        cluster.shutdown()
    assert processes_mentioning(str(nodes_tmp), environ=True) == []
