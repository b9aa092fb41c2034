"""The fleet on a real Ray cluster of several nodes on this machine, bound to 127.0.0.1: each
node offers different classes, a run lands each class on a node that offers it, a class no node
offers is unserved, and a node lost mid-run or a run past its limit gives error cells naming it.

The tests stop exactly the processes they started (``Cluster.shutdown``, which kills the
processes of the nodes it added), never ``ray stop`` or a name match. ``qualify fleet join``
itself (``ray start --block``) cannot join a cluster bound to 127.0.0.1: Ray's CLI rewrites a
loopback head address to the host's own address, or refuses more than one node when told to
stay on loopback; its nodes are added here the way Ray's own tests add them, with the resources
and labels `node_offer` gives.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from matrix.store import Store
from qualify.fingerprint import take_fingerprint
from qualify.fleet import (
    CLASS_RESOURCE,
    HOST_RESOURCE,
    LOCAL_ENV,
    FleetOptions,
    fleet_run,
    fleet_status,
    join_argv,
    node_offer,
    shipment_files,
)
from qualify.project import load_project
from qualify.runner import probe_runtime
from tests.qualify.projects import write_project

pytestmark = [
    pytest.mark.slow,
    pytest.mark.fleet,
    # Ray's own imports and threads warn about things that are not qualify's.
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

_SLOW_HOOK = """
import time


def slow(feed):
    time.sleep(%(pause_s)s)
    return feed
"""


class _Fleet:
    """A cluster: a head with no class, and one node per entry of ``offers``."""

    def __init__(self, offers: dict[str, list[str]], labels: dict[str, str] | None = None) -> None:
        os.environ.update(LOCAL_ENV)  # before Ray is imported: every node on 127.0.0.1
        from ray.cluster_utils import Cluster

        self.cluster = Cluster(
            initialize_head=True,
            connect=False,
            head_node_args={"num_cpus": 1, "include_dashboard": False},
        )
        self.nodes: dict[str, Any] = {}
        for name, classes in offers.items():
            resources = {CLASS_RESOURCE + c: 1.0 for c in classes} | {HOST_RESOURCE: 1.0}
            self.nodes[name] = self.cluster.add_node(
                num_cpus=2, resources=resources, labels={**(labels or {}), "qualify/host": name}
            )
        self.cluster.wait_for_nodes()

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def pids(self) -> list[int]:
        return [
            p.process.pid
            for node in self.cluster.list_all_nodes()
            for procs in node.all_processes.values()
            for p in procs
        ]

    def shutdown(self) -> None:
        started = self.pids()
        self.cluster.shutdown()
        alive = [pid for pid in started if _alive(pid)]
        assert not alive, f"Ray processes still running after shutdown: {alive}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Fleet]:
    labels = node_offer(
        load_project(write_project(tmp_path_factory.mktemp("p"), [])),
        take_fingerprint(probe_runtime),
    ).labels
    cluster = _Fleet({"node-a": ["here-cpu"], "node-b": ["lost-gpu"]}, labels)
    try:
        yield cluster
    finally:
        cluster.shutdown()


def _nodes(address: str) -> list[dict[str, Any]]:
    from qualify.fleet import read_nodes

    return read_nodes(address)


def test_a_host_offers_exactly_the_classes_it_matches(tmp_path: Path) -> None:
    loaded = load_project(write_project(tmp_path, []))
    offer = node_offer(loaded, take_fingerprint(probe_runtime))
    assert offer.classes == ("here-cpu", "lost-gpu")
    assert "elsewhere" in offer.unmatched
    assert offer.resources == {
        "qualify/class/here-cpu": 1.0,
        "qualify/class/lost-gpu": 1.0,
        "qualify/host": 1.0,
    }
    argv = join_argv("127.0.0.1:6379", offer)
    assert argv[1:4] == ["start", "--address", "127.0.0.1:6379"] and argv[-1] == "--block"
    assert all(len(v) <= 63 for v in offer.labels.values())


def test_status_lists_each_classs_hosts_and_the_classes_no_host_serves(
    fleet: _Fleet, tmp_path: Path
) -> None:
    loaded = load_project(write_project(tmp_path, []))
    status = fleet_status(loaded, _nodes(fleet.address))
    assert [h.split(" ")[0] for h in status.hosts["here-cpu"]] == ["node-a"]
    assert [h.split(" ")[0] for h in status.hosts["lost-gpu"]] == ["node-b"]
    assert status.unserved == ["elsewhere"]


def test_each_class_runs_on_a_node_that_offers_it_and_lands_in_this_matrix(
    fleet: _Fleet, tmp_path: Path
) -> None:
    loaded = load_project(write_project(tmp_path, ["identity_mlp_perturbed"]))
    lines: list[str] = []
    outcome = fleet_run(
        loaded,
        FleetOptions(db_path=tmp_path / "fleet.duckdb", address=fleet.address),
        on_event=lines.append,
    )
    states = {c.host_class: c.state for c in outcome.classes}
    assert states == {"here-cpu": "done", "lost-gpu": "done", "elsewhere": "unserved"}
    assert not outcome.ok  # a class without a host is not a fleet that passed
    by_class = {c.host_class: c for c in outcome.classes}
    assert fleet.nodes["node-a"].node_id[:12] in (by_class["here-cpu"].host or "")
    assert fleet.nodes["node-b"].node_id[:12] in (by_class["lost-gpu"].host or "")
    here = by_class["here-cpu"].bundle
    assert here is not None and not here.run.emulated
    assert [c.artifact_name for c in here.cells] == ["identity_mlp", "identity_mlp_perturbed"]
    assert here.cells[0].verdict == "pass" and all(c.verdict != "error" for c in here.cells)
    with Store.open(tmp_path / "fleet.duckdb", read_only=True) as store:
        runs = {r.host_class for r in store.runs()}
        assert store.unserved() == {"elsewhere"}
        stored = store.samples_by_config(here.run.run_id, here.cells[0].artifact_digest)
    assert runs == {"here-cpu", "lost-gpu"}
    assert stored and all(v.size for v in stored.values())
    assert (tmp_path / "bundles" / here.run.run_id / "run.json").is_file()
    assert any("here-cpu: running on" in line for line in lines)
    assert any("elsewhere: unserved" in line for line in lines)


def _slow_project(tmp_path: Path, pause_s: float = 0.05) -> Path:
    """The small project with a pre-processing hook that sleeps ``pause_s`` per inference."""
    project = write_project(tmp_path, [])
    text = project.read_text().replace("workload:\n", "workload:\n  pipeline: {pre: 'hook:slow'}\n")
    project.write_text(text.replace("time_cap_s: 3", "time_cap_s: 60"))
    (tmp_path / "hook.py").write_text(_SLOW_HOOK % {"pause_s": pause_s})
    return project


def test_the_hooks_and_the_project_file_are_shipped_with_the_artifacts(tmp_path: Path) -> None:
    loaded = load_project(_slow_project(tmp_path))
    assert sorted(shipment_files(loaded)) == ["hook.py", "models/identity_mlp.onnx", "qualify.yaml"]


def test_a_run_past_its_limit_gives_error_cells_naming_the_host(
    fleet: _Fleet, tmp_path: Path
) -> None:
    loaded = load_project(_slow_project(tmp_path))
    outcome = fleet_run(
        loaded,
        FleetOptions(db_path=tmp_path / "m.duckdb", address=fleet.address, timeout_s=3),
        classes=["here-cpu"],
    )
    (run,) = outcome.classes
    assert run.state == "error" and run.bundle is not None
    (cell,) = run.bundle.cells
    assert cell.verdict == "error" and [r.code for r in cell.reasons] == ["fleet_timeout"]
    assert fleet.nodes["node-a"].node_id[:12] in cell.reasons[0].message
    with Store.open(tmp_path / "m.duckdb", read_only=True) as store:
        assert [c.verdict for c in store.latest_cells()] == ["error"]


def test_a_node_lost_mid_run_gives_its_class_error_cells_and_the_others_go_on(
    tmp_path: Path,
) -> None:
    cluster = _Fleet({"doomed": ["here-cpu"], "steady": ["lost-gpu"]})
    try:
        # The node must still be running its class when it is removed: at 2 ms per inference
        # a run's ~1,000 samples per config take seconds after it says where it runs (the
        # driver looks twice a second), where the bare model's take a fraction of one.
        loaded = load_project(_slow_project(tmp_path, pause_s=0.002))

        def on_event(line: str) -> None:
            if line.startswith("here-cpu: running on"):
                cluster.cluster.remove_node(cluster.nodes["doomed"], allow_graceful=False)

        outcome = fleet_run(
            loaded,
            FleetOptions(db_path=tmp_path / "m.duckdb", address=cluster.address),
            classes=["here-cpu", "lost-gpu"],
            on_event=on_event,
        )
    finally:
        cluster.shutdown()
    by_class = {c.host_class: c for c in outcome.classes}
    lost = by_class["here-cpu"]
    assert lost.state == "error" and lost.bundle is not None, lost.message
    assert {r.code for c in lost.bundle.cells for r in c.reasons} == {"node_lost"}
    assert cluster.nodes["doomed"].node_id[:12] in lost.message
    assert by_class["lost-gpu"].state == "done"


def test_the_demo_on_a_three_node_cluster_matches_a_per_host_run(tmp_path: Path) -> None:
    from matrix.ingest import ingest_bundles
    from qualify.coverage import junit_xml
    from qualify.demo import lay_out
    from qualify.release import release_check
    from qualify.run import RunOptions, qualify_run

    loaded = load_project(lay_out(tmp_path / "demo"))
    matched = list(node_offer(loaded, take_fingerprint(probe_runtime)).classes)
    assert matched, "the demo has x86 and ARM classes; this host matches none of them"
    # One node per class this host really is (a fleet host offers only what it matches), and
    # one that matches none: three nodes with the head whatever this CPU.
    offers = {f"host-{k}": [name] for k, name in enumerate(matched)} | {"bare": []}
    cluster = _Fleet(offers)
    db = tmp_path / "fleet.duckdb"
    try:
        outcome = fleet_run(loaded, FleetOptions(db_path=db, address=cluster.address))
        ids = {name: cluster.nodes[f"host-{k}"].node_id for k, name in enumerate(matched)}
    finally:
        cluster.shutdown()
    by_class = {c.host_class: c for c in outcome.classes}
    for name in loaded.project.host_classes:
        assert by_class[name].state == ("done" if name in matched else "unserved"), name
    for name in matched:
        bundle = by_class[name].bundle
        assert bundle is not None and not bundle.run.emulated
        assert all(c.fleet_node and c.fleet_node.startswith(ids[name]) for c in bundle.cells)

    first = matched[0]
    alone = qualify_run(loaded, first, RunOptions(db_path=tmp_path / "alone" / "m.duckdb"))
    fleet_cells = by_class[first].bundle.cells  # type: ignore[union-attr]
    assert [(c.artifact_name, c.verdict) for c in fleet_cells] == [
        (c.artifact_name, c.verdict) for c in alone.bundle.cells
    ]

    with Store.open(db) as store:
        again = ingest_bundles(store, sorted((tmp_path / "bundles").iterdir()))
        assert again.bundles and not again.ingested  # every run is there once already
        unserved = [n for n in loaded.project.host_classes if n not in matched]
        check = release_check(
            loaded, store, scope=list(loaded.project.host_classes), unserved=unserved
        )
    root = ElementTree.fromstring(junit_xml(check.items, check.gate))
    for item in check.items:
        (case,) = [
            c
            for c in root.iter("testcase")
            if c.get("classname") == item.host_class and c.get("name") == item.artifact
        ]
        failing = item.verdict != "pass" or item.gap is not None
        marks = [e for e in case if e.tag in ("failure", "error")]
        assert len(marks) == (1 if failing else 0), (item.host_class, item.artifact)
