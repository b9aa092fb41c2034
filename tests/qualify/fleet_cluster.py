"""A real multi-node Ray cluster on 127.0.0.1 for the fleet tests, and what they check after it.

`Fleet` starts a head with no class and one node per entry, each advertising the resources and
labels ``qualify fleet join`` would give it (`node_offer` for the project the test runs), or
labels a test overrides (another project's digest, another version). Nodes are added the way
Ray's own tests add them: ``qualify fleet join`` (``ray start --block``) cannot join a head on
127.0.0.1 (Ray's CLI rewrites a loopback head address to the machine's interface address), and
``qualify fleet join`` says so.

The tests stop exactly the processes they started (`Fleet.shutdown`, which kills the processes
of the nodes it added, then checks each is gone), never ``ray stop`` or a name match.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qualify.fleet.cluster import CLASS_RESOURCE, HOST_RESOURCE, LOCAL_ENV, node_offer, read_boot_id
from qualify.measure.fingerprint import take_fingerprint
from qualify.measure.runner import probe_runtime
from qualify.project.load import LoadedProject

SLOW_HOOK = """
import time


def slow(feed):
    time.sleep(%(pause_s)s)
    return feed
"""

VERSION_SHIM = """
import qualify

qualify.__version__ = "9.9.9"
"""
"""A ``sitecustomize`` that makes the qualify a node's workers import say it is another
version: a host that was upgraded (or not) after it joined."""


def labels_for(loaded: LoadedProject) -> dict[str, str]:
    """The labels ``qualify fleet join`` gives this machine for ``loaded``."""
    fp = take_fingerprint(probe_runtime)
    return node_offer(loaded, fp, boot_id=read_boot_id()).labels


class Fleet:
    """A head with no class, and one node per entry of ``offers`` (name -> classes), with
    ``labels`` (plus ``qualify/host``: the name), ``extra_labels[name]`` over them, and
    ``env[name]`` in the node's environment (its raylet's and workers')."""

    def __init__(
        self,
        offers: Mapping[str, list[str]],
        labels: Mapping[str, str],
        *,
        extra_labels: Mapping[str, Mapping[str, str]] | None = None,
        env: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        os.environ.update(LOCAL_ENV)  # before Ray is imported: every node on 127.0.0.1
        from ray.cluster_utils import Cluster

        self.cluster = Cluster(
            initialize_head=True,
            connect=False,
            head_node_args={"num_cpus": 1, "include_dashboard": False},
        )
        self.nodes: dict[str, Any] = {}
        self.started: list[int] = self.pids()
        for name, classes in offers.items():
            self.add(name, classes, {**labels, **(extra_labels or {}).get(name, {})}, env)
        self.cluster.wait_for_nodes()

    def add(
        self,
        name: str,
        classes: list[str],
        labels: Mapping[str, str],
        env: Mapping[str, Mapping[str, str]] | None = None,
    ) -> Any:
        resources = {CLASS_RESOURCE + c: 1.0 for c in classes} | {HOST_RESOURCE: 1.0}
        node = self.cluster.add_node(
            num_cpus=2,
            resources=resources,
            labels={**labels, "qualify/host": name},
            env_vars=dict((env or {}).get(name, {})),
        )
        self.nodes[name] = node
        self.started = sorted({*self.started, *self.pids()})
        return node

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

    def kill(self, name: str) -> None:
        """The node's processes killed at once (a host that dies)."""
        self.cluster.remove_node(self.nodes[name], allow_graceful=False)

    def shutdown(self) -> None:
        started = sorted({*self.started, *self.pids()})
        self.cluster.shutdown()
        alive = [pid for pid in started if alive_pid(pid)]
        assert not alive, f"Ray processes still running after shutdown: {alive}"


def alive_pid(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except (ProcessLookupError, FileNotFoundError):
        return False
    return state != "Z"


def processes_mentioning(marker: str, *, environ: bool = False) -> list[tuple[int, str]]:
    """Live processes whose command line (or, with ``environ``, environment) mentions
    ``marker`` (a test's own folder): what a fleet task, or a measuring child of one, would
    leave running."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (
                (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            )
            env = (entry / "environ").read_bytes().decode("utf-8", "replace") if environ else ""
        except OSError:
            continue
        if (marker in cmdline or marker in env) and alive_pid(int(entry.name)):
            found.append((int(entry.name), cmdline[:200]))
    return found


def wait_until_gone(
    marker: str, within_s: float, *, environ: bool = False
) -> list[tuple[int, str]]:
    """The processes mentioning ``marker`` still alive after up to ``within_s`` seconds."""
    end = time.monotonic() + within_s
    left = processes_mentioning(marker, environ=environ)
    while left and time.monotonic() < end:
        time.sleep(0.25)
        left = processes_mentioning(marker, environ=environ)
    return left


def task_folders(tmpdir: Path) -> list[Path]:
    """The fleet tasks' work folders under a nodes' ``TMPDIR``."""
    return sorted(p for base in tmpdir.glob("qualify-fleet-*") for p in base.iterdir())
