"""What a class's task does on the host Ray placed it on, and the tracker it reports to.

Owns the task body (`qualify_here`: check this host may measure the class for this driver, else
refuse; run ``qualify run``'s path in a work folder of its own; hand back the bundle) and the
`Tracker` actor (where each task landed, when it began measuring, which class holds a machine).
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qualify.errors import QualifyError

__all__ = ["REPLY_FORMAT", "Tracker", "qualify_here", "work_folder"]

REPLY_FORMAT = 1
"""The shape of what a task hands back (`qualify_here`): the driver refuses any other."""

_SLOT_POLL_S = 0.5


class Tracker:
    """Lives on the driver's node. Each task says where it landed (``placed``) and when it
    starts measuring (``measuring``); tasks on nodes that share a machine take turns through
    ``claim`` (the driver ``release``-s a class's machine when the class ends, however)."""

    def __init__(self) -> None:
        self.placements: dict[str, dict[str, Any]] = {}
        self.measurements: dict[str, float] = {}
        self.machines: dict[str, str] = {}

    def placed(self, tag: str, where: dict[str, Any]) -> None:
        self.placements[tag] = where

    def measuring(self, tag: str, at: float) -> None:
        self.measurements.setdefault(tag, at)

    def claim(self, machine: str, tag: str) -> str | None:
        """Take ``machine`` for ``tag``; the tag holding it when it is taken (None: granted)."""
        holder = self.machines.get(machine)
        if holder is None or holder == tag:
            self.machines[machine] = tag
            return None
        return holder

    def release(self, tag: str) -> None:
        for machine, holder in list(self.machines.items()):
            if holder == tag:
                del self.machines[machine]

    def seen(self) -> dict[str, Any]:
        return {"placed": dict(self.placements), "measuring": dict(self.measurements)}


def work_folder() -> Path:
    """A fresh work folder for one task, under ``$TMPDIR/qualify-fleet-<uid>/``, after removing
    the folders there whose task's process is gone (killed with its host, its time limit or
    its driver)."""
    from schemas.atomic import remove_leftovers, temp_prefix

    base = Path(tempfile.gettempdir()) / f"qualify-fleet-{os.getuid()}"
    base.mkdir(mode=0o700, exist_ok=True)
    remove_leftovers(base)
    return Path(tempfile.mkdtemp(prefix=temp_prefix("task"), suffix=".tmp", dir=base))


def _unpack(files: Mapping[str, tuple[str, Any]], root: Path, get: Any) -> None:
    """Write the shipped files under ``root``, each checked against its digest."""
    for rel, (digest, ref) in files.items():
        data = memoryview(get(ref)).cast("B")
        got = "sha256:" + hashlib.sha256(data).hexdigest()
        if got != digest:
            raise QualifyError(f"{rel}: arrived as {got[:19]}, was shipped as {digest[:19]}")
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("wb") as fh:
            fh.write(data)
        del data


def _refusal(
    shipment: Mapping[str, Any], class_name: str, fp: Any, root: Path, get: Any
) -> list[str]:
    """Why this host may not measure the class for this driver (empty: it may)."""
    from qualify import __version__
    from qualify.measure.fingerprint import class_mismatches
    from qualify.project.load import load_project

    if shipment["version"] != __version__:
        return [f"runs qualify {__version__}, the driver runs {shipment['version']}"]
    _unpack(shipment["files"], root, get)
    loaded = load_project(root / shipment["project"], check_models=False)
    return class_mismatches(fp, loaded.project.host_classes[class_name])


def _wait_for_machine(tracker: Any, machine: str, tag: str, get: Any) -> None:
    """Take the machine from the tracker, waiting while another class of this run measures on
    a node that shares it."""
    while get(tracker.claim.remote(machine, tag)) is not None:
        time.sleep(_SLOT_POLL_S)


def qualify_here(
    shipment: dict[str, Any], class_name: str, tag: str, tracker: Any
) -> dict[str, Any]:
    """The body of a class's task (see the module docstring). Returns ``{"format", "node",
    "hostname", "refused"}`` when this host may not measure the class for this driver, else
    ``{"format", "node", "hostname", "bundle", "samples"}`` (the bundle's JSON, its samples as
    Parquet bytes or None)."""
    import ray

    from qualify.fleet.cluster import machine_id, read_boot_id
    from qualify.measure.fingerprint import take_fingerprint
    from qualify.measure.runner import probe_runtime

    node = ray.get_runtime_context().get_node_id()
    fp = take_fingerprint(probe_runtime)
    machine = machine_id(fp.hostname, read_boot_id())
    where = {"node": node, "hostname": fp.hostname, "machine": machine, "at": time.time()}
    ray.get(tracker.placed.remote(tag, {**where, "fingerprint": fp.model_dump_json()}))
    reply: dict[str, Any] = {"format": REPLY_FORMAT, "node": node, "hostname": fp.hostname}
    root = work_folder()
    try:
        refused = _refusal(shipment, class_name, fp, root, ray.get)
        if refused:
            return {**reply, "refused": refused}
        _wait_for_machine(tracker, machine, tag, ray.get)
        return {**reply, **_measure(root, shipment["project"], class_name, node, fp, tag, tracker)}
    finally:
        import shutil

        shutil.rmtree(root, ignore_errors=True)


def _measure(
    root: Path, project: str, class_name: str, node: str, fp: Any, tag: str, tracker: Any
) -> dict[str, Any]:
    import pyarrow.parquet as pq
    import ray

    from qualify.project.load import load_project
    from qualify.run import RunOptions, qualify_run

    loaded = load_project(root / project)
    options = RunOptions(db_path=root / "host.duckdb", fleet_node=f"{node} ({fp.hostname})")

    def on_worker_start(_label: str, _pid: int) -> None:
        ray.get(tracker.measuring.remote(tag, time.time()))

    outcome = qualify_run(loaded, class_name, options, on_worker_start=on_worker_start)
    samples = None
    if outcome.samples.num_rows:
        sink = io.BytesIO()
        pq.write_table(outcome.samples, sink)
        samples = sink.getvalue()
    return {"bundle": outcome.bundle.model_dump_json(), "samples": samples}
