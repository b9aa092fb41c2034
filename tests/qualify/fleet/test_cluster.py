"""The fleet on a real Ray cluster of several nodes on this machine, bound to 127.0.0.1: each
node offers different classes, a run lands each class on a node that offers it and agrees with
this project and qualify version, a class no node offers is an ``unserved`` gap, and a run past
its limit gives error cells naming the host. The faults (a host lost with a class queued behind
it, disagreeing hosts, an address with nothing listening, a stopped or killed driver) are in
``test_fleet_faults.py``; `tests.qualify.fleet_cluster` starts and stops the clusters.

The pure parts (what a host offers, status over ``ray.nodes()`` entries, label selectors,
addresses) are tested here without a cluster.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar
from xml.etree import ElementTree

import pytest
from hypothesis import given
from hypothesis import strategies as st

from matrix.store import Store
from qualify import __version__
from qualify.fleet.cluster import (
    MACHINE_LABEL,
    PROJECT_LABEL,
    VERSION_LABEL,
    FleetAddressError,
    FleetOptions,
    fleet_status,
    join_argv,
    node_offer,
    parse_address,
    project_label,
    read_boot_id,
    shipment_files,
)
from qualify.fleet.driver import can_take
from qualify.fleet.start import fleet_run
from qualify.measure.fingerprint import take_fingerprint
from qualify.measure.runner import probe_runtime
from qualify.project.load import load_project
from tests.qualify.fleet_cluster import (
    SLOW_HOOK,
    Fleet,
    labels_for,
    task_folders,
    wait_until_gone,
)
from tests.qualify.projects import write_project

F = TypeVar("F")

_FLEET = [
    pytest.mark.slow,
    pytest.mark.fleet,
    # Ray's own imports and threads warn about things that are not qualify's.
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]


def on_cluster(test: F) -> F:
    """Marks a test that starts (or uses) a Ray cluster."""
    for mark in _FLEET:
        test = mark(test)
    return test


def fleet_project(tmp_path: Path, pause_s: float = 0.0) -> Path:
    """The small project (a baseline and one candidate) with a pre-processing hook that sleeps
    ``pause_s`` per inference: the same project file, so the same digest, whatever the pause
    (it lives in hook.py)."""
    project = write_project(tmp_path, ["identity_mlp_perturbed"])
    text = project.read_text().replace("workload:\n", "workload:\n  pipeline: {pre: 'hook:slow'}\n")
    project.write_text(text.replace("time_cap_s: 3", "time_cap_s: 60"))
    (tmp_path / "hook.py").write_text(SLOW_HOOK % {"pause_s": pause_s})
    return project


# --- without a cluster -----------------------------------------------------------------------


def test_a_host_offers_exactly_the_classes_it_matches_with_its_version_project_and_machine(
    tmp_path: Path,
) -> None:
    loaded = load_project(write_project(tmp_path, []))
    offer = node_offer(loaded, take_fingerprint(probe_runtime), boot_id=read_boot_id())
    assert offer.classes == ("here-cpu", "lost-gpu")
    assert "elsewhere" in offer.unmatched
    assert offer.resources == {
        "qualify/class/here-cpu": 1.0,
        "qualify/class/lost-gpu": 1.0,
        "qualify/host": 1.0,
    }
    assert offer.labels[VERSION_LABEL] == __version__
    assert offer.labels[PROJECT_LABEL] == project_label(loaded) == f"sha256-{loaded.sha256[:56]}"  # type: ignore[index]
    assert len(offer.labels[MACHINE_LABEL]) == 16
    argv = join_argv("10.0.0.5:6379", offer)
    assert argv[1:4] == ["start", "--address", "10.0.0.5:6379"] and argv[-1] == "--block"
    assert all(len(v) <= 63 for v in offer.labels.values())


def _node(name: str, classes: list[str], labels: dict[str, str], **extra: Any) -> dict[str, Any]:
    resources = {f"qualify/class/{c}": 1.0 for c in classes} | {"qualify/host": 1.0}
    return {
        "NodeID": f"{name:0<56}",
        "Alive": True,
        "Resources": resources,
        "Labels": {**labels, "qualify/host": name},
        **extra,
    }


def test_status_names_hosts_that_disagree_with_this_project_or_version_and_shared_machines(
    tmp_path: Path,
) -> None:
    loaded = load_project(write_project(tmp_path, []))
    good = {VERSION_LABEL: __version__, PROJECT_LABEL: project_label(loaded), MACHINE_LABEL: "m1"}
    nodes = [
        _node("good", ["here-cpu"], good),
        _node("twin", [], good),  # the same machine as good
        _node(
            "stale",
            ["here-cpu", "elsewhere"],
            {**good, PROJECT_LABEL: "sha256-0ld", MACHINE_LABEL: "m3"},
        ),
        _node("skewed", ["lost-gpu"], {**good, VERSION_LABEL: "0.0.1", MACHINE_LABEL: "m2"}),
        _node("by-hand", ["lost-gpu"], {}),
        _node("dead", ["lost-gpu"], good, Alive=False),
    ]
    status = fleet_status(loaded, nodes)
    assert [h.split(" ")[0] for h in status.hosts["here-cpu"]] == ["good"]
    assert status.unserved == ["lost-gpu", "elsewhere"]
    stale = status.mismatched["elsewhere"]
    assert len(stale) == 1 and "stale" in stale[0] and "rejoin" in stale[0]
    lost = " | ".join(status.mismatched["lost-gpu"])
    assert "qualify 0.0.1" in lost and "no qualify version" in lost and "dead" not in lost
    assert [[h.split(" ")[0] for h in group] for group in status.shared] == [["good", "twin"]]


def test_status_json_is_what_the_published_schema_accepts(tmp_path: Path) -> None:
    import json

    import jsonschema

    from qualify.cli.fleet import status_document
    from schemas.generate import SCHEMA_DIR

    loaded = load_project(write_project(tmp_path, []))
    good = {VERSION_LABEL: __version__, PROJECT_LABEL: project_label(loaded), MACHINE_LABEL: "m1"}
    nodes = [_node("good", ["here-cpu", "gone"], good), _node("skewed", ["lost-gpu"], {})]
    document = json.loads(status_document(fleet_status(loaded, nodes)).model_dump_json())
    schema = json.loads((SCHEMA_DIR / "fleet-status.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(document)
    assert document["unserved"] == ["lost-gpu", "elsewhere"] and document["unknown"] == ["gone"]
    assert [c["host_class"] for c in document["classes"]] == ["here-cpu", "lost-gpu", "elsewhere"]
    assert "skewed" in document["classes"][1]["not_used"][0]


def test_a_class_goes_only_to_a_live_node_that_advertises_it_and_satisfies_the_selector() -> None:
    labels = {VERSION_LABEL: "1", PROJECT_LABEL: "p"}
    node = _node("a", ["x"], labels)
    assert can_take(node, "x", labels)
    assert not can_take(node, "y", labels)
    assert not can_take({**node, "Alive": False}, "x", labels)
    assert not can_take(node, "x", {**labels, VERSION_LABEL: "2"})
    assert not can_take(node, "x", {"ray.io/node-id": "!" + node["NodeID"]})
    assert can_take(node, "x", {"ray.io/node-id": "!someone-else"})


def test_addresses_are_host_and_port_and_everything_else_is_refused_naming_it() -> None:
    assert parse_address("10.0.0.5:6379") == ("10.0.0.5", 6379)
    assert parse_address(" head.lab:1 ") == ("head.lab", 1)
    assert parse_address("[fd00::5]:6379") == ("fd00::5", 6379)
    for bad in ("127.0.0.1:99999", "127.0.0.1", ":6379", "ray://h:10001", "h:0", "a b:1", "h:-1"):
        with pytest.raises(FleetAddressError, match="--address"):
            parse_address(bad)


@given(st.text(max_size=80))
def test_any_address_text_parses_or_is_refused_cleanly(text: str) -> None:
    try:
        host, port = parse_address(text)
    except FleetAddressError:
        return
    assert 1 <= port <= 65535 and host


def test_the_hooks_and_the_project_file_are_shipped_with_the_artifacts(tmp_path: Path) -> None:
    loaded = load_project(fleet_project(tmp_path))
    assert sorted(shipment_files(loaded)) == [
        "hook.py",
        "models/identity_mlp.onnx",
        "models/identity_mlp_perturbed.onnx",
        "qualify.yaml",
    ]


# --- on a cluster ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Two nodes on this one machine, each a class, joined with `fleet_project`."""
    loaded = load_project(fleet_project(tmp_path_factory.mktemp("p")))
    tmpdir = tmp_path_factory.mktemp("nodes-tmp")
    env = {"TMPDIR": str(tmpdir)}
    cluster = Fleet(
        {"node-a": ["here-cpu"], "node-b": ["lost-gpu"]},
        labels_for(loaded),
        env={"node-a": env, "node-b": env},
    )
    cluster.tmpdir = tmpdir  # type: ignore[attr-defined]
    try:
        yield cluster
    finally:
        cluster.shutdown()


@on_cluster
def test_each_class_runs_on_a_node_that_offers_it_one_at_a_time_and_lands_in_this_matrix(
    fleet: Fleet, tmp_path: Path
) -> None:
    loaded = load_project(fleet_project(tmp_path))
    lines: list[str] = []
    outcome = fleet_run(
        loaded,
        FleetOptions(db_path=tmp_path / "fleet.duckdb", address=fleet.address),
        on_event=lines.append,
    )
    states = {c.host_class: (c.state, c.reason) for c in outcome.classes}
    assert states == {
        "here-cpu": ("done", None),
        "lost-gpu": ("done", None),
        "elsewhere": ("gap", "unserved"),
    }
    assert not outcome.ok  # a class without a host is not a fleet that passed
    by_class = {c.host_class: c for c in outcome.classes}
    assert fleet.nodes["node-a"].node_id[:12] in (by_class["here-cpu"].host or "")
    assert fleet.nodes["node-b"].node_id[:12] in (by_class["lost-gpu"].host or "")
    here = by_class["here-cpu"].bundle
    assert here is not None and not here.run.emulated
    assert [c.artifact_name for c in here.cells] == ["identity_mlp", "identity_mlp_perturbed"]
    assert here.cells[0].verdict == "pass" and all(c.verdict != "error" for c in here.cells)
    assert all(c.measured_alone for c in here.cells)
    # Both nodes are this one machine: one class measured, then the other.
    order = [line.split(":")[0] for line in lines if ": measuring on" in line or ": done" in line]
    assert order in (["here-cpu"] * 2 + ["lost-gpu"] * 2, ["lost-gpu"] * 2 + ["here-cpu"] * 2)
    with Store.open(tmp_path / "fleet.duckdb", read_only=True) as store:
        runs = {r.host_class for r in store.runs()}
        assert store.fleet_gaps() == {"elsewhere": ("unserved", by_class["elsewhere"].message)}
        stored = store.samples_by_config(here.run.run_id, here.cells[0].artifact_digest)
    assert runs == {"here-cpu", "lost-gpu"}
    assert stored and all(v.size for v in stored.values())
    assert (tmp_path / "bundles" / here.run.run_id / "run.json").is_file()
    assert any("elsewhere: gap (unserved)" in line for line in lines)
    assert task_folders(fleet.tmpdir) == []  # type: ignore[attr-defined]


@on_cluster
def test_a_class_measuring_past_its_limit_gives_error_cells_naming_the_host(
    fleet: Fleet, tmp_path: Path
) -> None:
    loaded = load_project(fleet_project(tmp_path, pause_s=0.05))
    lines: list[str] = []
    outcome = fleet_run(
        loaded,
        FleetOptions(db_path=tmp_path / "m.duckdb", address=fleet.address, timeout_s=3),
        classes=["here-cpu"],
        on_event=lines.append,
    )
    (run,) = outcome.classes
    assert run.state == "error" and run.reason == "fleet_timeout" and run.bundle is not None
    assert {r.code for c in run.bundle.cells for r in c.reasons} == {"fleet_timeout"}
    assert fleet.nodes["node-a"].node_id[:12] in run.bundle.cells[0].reasons[0].message
    # the limit counts from the moment it measured, not from when it was sent
    assert any("here-cpu: measuring on" in line for line in lines)
    assert run.bundle.run.started_at <= run.bundle.run.finished_at
    with Store.open(tmp_path / "m.duckdb", read_only=True) as store:
        assert {c.verdict for c in store.latest_cells()} == {"error"}


@on_cluster
def test_the_deadline_ends_a_run_with_every_class_accounted_and_nothing_measuring(
    fleet: Fleet, tmp_path: Path
) -> None:
    loaded = load_project(fleet_project(tmp_path, pause_s=0.05))
    started = time.monotonic()
    outcome = fleet_run(
        loaded,
        FleetOptions(db_path=tmp_path / "m.duckdb", address=fleet.address, deadline_s=8),
        classes=["here-cpu", "lost-gpu"],
    )
    assert time.monotonic() - started < 8 + 20
    ends = {c.host_class: (c.state, c.reason) for c in outcome.classes}
    assert set(ends) == {"here-cpu", "lost-gpu"}
    assert set(ends.values()) <= {("error", "fleet_timeout"), ("gap", "fleet_timeout")}, ends
    assert all("deadline" in c.message for c in outcome.classes)
    with Store.open(tmp_path / "m.duckdb", read_only=True) as store:
        cells = {c.host_class for c in store.latest_cells()}
        gaps = set(store.fleet_gaps())
    assert cells | gaps == {"here-cpu", "lost-gpu"} and not cells & gaps
    assert wait_until_gone(str(fleet.tmpdir), 20) == []  # type: ignore[attr-defined]


@on_cluster
def test_a_run_without_an_address_starts_ray_here_alone_and_writes_nothing_under_home(
    tmp_path: Path,
) -> None:
    import shutil
    import tempfile

    from tests.qualify.projects import run_qualify

    home = tmp_path / "home"
    home.mkdir()
    # Short: Ray puts its sockets under $TMPDIR, and a socket's path has at most 107 bytes.
    short_tmp = Path(tempfile.mkdtemp(prefix="qf-", dir="/tmp"))
    project = fleet_project(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))}
    try:
        result = run_qualify(
            "fleet", "run", "--project", str(project), "--db", str(tmp_path / "m.duckdb"),
            "--classes", "here-cpu,elsewhere", cwd=tmp_path,
            env={**env, "HOME": str(home), "TMPDIR": str(short_tmp)},
        )  # fmt: skip
        assert task_folders(short_tmp) == []
    finally:
        shutil.rmtree(short_tmp, ignore_errors=True)
    assert result.returncode == 1, result.stderr  # 'elsewhere' has no host here
    assert "here-cpu: done on" in result.stdout
    assert "elsewhere: gap (unserved)" in result.stdout
    assert "Raylet" not in result.stdout  # Ray's own reports go to stderr
    assert not (home / ".ray").exists()  # no ~/.ray/auth_token left by Ray


@on_cluster
def test_the_demo_on_a_three_node_cluster_matches_a_per_host_run(tmp_path: Path) -> None:
    from matrix.ingest import ingest_bundles
    from qualify.demo.story import lay_out
    from qualify.release.coverage import junit_xml
    from qualify.release.generate import release_check
    from qualify.run import RunOptions, qualify_run

    loaded = load_project(lay_out(tmp_path / "demo"))
    matched = list(node_offer(loaded, take_fingerprint(probe_runtime)).classes)
    assert matched, "the demo has x86 and ARM classes; this host matches none of them"
    # One node per class this host really is (a fleet host offers only what it matches), and
    # one that matches none: three nodes with the head whatever this CPU.
    offers = {f"host-{k}": [name] for k, name in enumerate(matched)} | {"bare": []}
    nodes_tmp = tmp_path / "nodes-tmp"
    nodes_tmp.mkdir()
    cluster = Fleet(
        offers, labels_for(loaded), env={name: {"TMPDIR": str(nodes_tmp)} for name in offers}
    )
    db = tmp_path / "fleet.duckdb"
    try:
        outcome = fleet_run(loaded, FleetOptions(db_path=db, address=cluster.address))
        ids = {name: cluster.nodes[f"host-{k}"].node_id for k, name in enumerate(matched)}
    finally:
        cluster.shutdown()
    by_class = {c.host_class: c for c in outcome.classes}
    for name in loaded.project.host_classes:
        assert by_class[name].state == ("done" if name in matched else "gap"), name
        assert by_class[name].reason == (None if name in matched else "unserved"), name
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
