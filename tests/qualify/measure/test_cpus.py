"""Placement on cores: a class's cpu_affinity / numa_node, resolved, applied and recorded."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qualify.errors import HostMismatchError
from qualify.measure.cpus import cpus_for, numa_nodes, parse_cpulist
from qualify.measure.runner import run_worker
from qualify.project.load import load_project
from qualify.run import RunOptions, qualify_run
from tests.models import build
from tests.qualify.jobs import make_job
from tests.qualify.projects import write_project


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0-3,8,10-11\n", [0, 1, 2, 3, 8, 10, 11]), ("5", [5]), ("", []), ("1,1,0", [0, 1])],
)
def test_linux_cpu_lists_are_read_as_sysfs_writes_them(text: str, cpus: list[int]) -> None:
    assert parse_cpulist(text) == cpus


@given(st.text(max_size=40))
def test_any_text_is_a_cpu_list_or_a_value_error(text: str) -> None:
    try:
        found = parse_cpulist(text)
    except ValueError:
        return
    assert found == sorted(set(found)) and all(0 <= c <= 8191 for c in found)


def test_numa_nodes_come_from_sysfs_and_garbage_is_skipped(tmp_path: Path) -> None:
    for name, text in (("node0", "0-3"), ("node1", "4-7"), ("node2", "nonsense"), ("nodeX", "8")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "cpulist").write_text(text + "\n")
    assert numa_nodes(tmp_path) == {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}
    assert numa_nodes(tmp_path / "absent") == {}


def test_a_class_placement_is_the_cpus_it_names_on_its_node() -> None:
    nodes = {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}
    available = list(range(8))
    assert cpus_for(None, None, available, nodes) == (None, [])
    assert cpus_for([1, 2, 5], None, available, nodes) == ([1, 2, 5], [])
    assert cpus_for(None, 1, available, nodes) == ([4, 5, 6, 7], [])
    assert cpus_for([1, 5], 1, available, nodes) == ([5], [])
    usable, problems = cpus_for([9, 10], None, available, nodes)
    assert usable == []
    assert "CPUs 9-10 are not available" in problems[0]
    _, problems = cpus_for(None, 3, available, nodes)
    assert "no NUMA node 3 (0, 1)" in problems[0]
    _, problems = cpus_for([1], 1, available, nodes)
    assert "leave no CPU" in problems[0]


def test_the_worker_runs_pinned_to_the_cpus_it_was_given(tmp_path: Path) -> None:
    job = make_job(tmp_path, build("identity_mlp", tmp_path))
    first = min(os.sched_getaffinity(0))
    pinned = dataclasses.replace(job, provider=dataclasses.replace(job.provider, cpus=(first,)))
    outcome = run_worker(pinned, tmp_path / "w", timeout_s=120)
    assert outcome.error_code is None, outcome.error_message
    assert outcome.result.cpus == (first,)


def test_a_class_on_cpus_this_host_lacks_is_refused_before_measuring(tmp_path: Path) -> None:
    project = write_project(tmp_path, [])
    text = project.read_text().replace(
        "intra_op_threads: 1}", "intra_op_threads: 1, cpu_affinity: [4000, 4001]}"
    )
    project.write_text(text)
    with pytest.raises(HostMismatchError, match="CPUs 4000-4001 are not available"):
        qualify_run(load_project(project), "here-cpu", RunOptions(db_path=tmp_path / "m.duckdb"))
    assert not (tmp_path / "m.duckdb").exists()


def test_placement_on_cores_counts_in_the_settings_digest_only_once_set(tmp_path: Path) -> None:
    project = load_project(write_project(tmp_path, []), check_models=False).project
    cls = project.host_classes["here-cpu"]
    pinned = cls.model_copy(
        update={"provider": cls.provider.model_copy(update={"cpu_affinity": [0]})}
    )
    noded = cls.model_copy(update={"provider": cls.provider.model_copy(update={"numa_node": 0})})
    digests = {cls.settings_digest(), pinned.settings_digest(), noded.settings_digest()}
    assert len(digests) == 3
