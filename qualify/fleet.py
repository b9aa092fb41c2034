"""The fleet on Ray: hosts join as the classes they match, one command qualifies every class on
a real host of that class, and the bundles come back to this matrix, its single writer.

Owns what a host offers the cluster (`node_offer`: one custom resource per project class it
matches, ``qualify/class/<name>``, one ``qualify/host`` so that a host measures one class at a
time, and its fingerprint as node labels), the ``ray start`` a host joins with (`join_argv`),
the view of which hosts serve which classes (`fleet_status`), and the run itself (`fleet_run`):
the project file and every file it names are shipped through Ray's object store with their
digests (checked on arrival), each class's qualification is a task that needs that class's
resource and runs ``qualify run``'s own path there (fresh worker processes, the host-wide
measurement lock, never emulated), and what comes back is written here. A class no host
serves is ``unserved`` and is never emulated; a host that dies or a run past its time limit
gives that class ``error`` cells naming the host, and the other classes go on.

Ray is an optional extra (``pip install qualify[fleet]``): it is imported here, inside the
functions that need it, and nowhere else in qualify.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from qualify.errors import ProjectError, QualifyError
from qualify.fingerprint import class_mismatches
from qualify.project import LoadedProject
from schemas.cell import Cell, Reason, RunBundle, RunRecord
from schemas.host import Fingerprint
from schemas.project import HostClass

__all__ = [
    "CLASS_RESOURCE",
    "HOST_RESOURCE",
    "LOCAL_ENV",
    "ClassRun",
    "FleetOptions",
    "FleetOutcome",
    "FleetStatus",
    "NodeOffer",
    "fleet_run",
    "fleet_status",
    "join_argv",
    "node_offer",
    "read_nodes",
    "shipment_files",
]

CLASS_RESOURCE = "qualify/class/"
"""Prefix of the custom resource a host advertises per class it matches."""

HOST_RESOURCE = "qualify/host"
"""One per host: every class's task needs it, so a host measures one class at a time."""

LOCAL_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
"""What a cluster on this machine alone runs with: Ray then uses the loopback address for every
node, so that nothing it serves listens beyond 127.0.0.1 (set before Ray is imported)."""

_LABEL = re.compile(r"[^A-Za-z0-9._-]+")
_MAX_FILE = 16 * 2**30
"""Largest file a shipment carries (an artifact, a recorded input)."""


def _label_value(text: str) -> str:
    """``text`` as a Ray label value: 63 characters of ``[A-Za-z0-9._-]``, alphanumeric ends."""
    cleaned = _LABEL.sub("-", text).strip("-._")[:63].strip("-._")
    return cleaned or "unknown"


@dataclass(frozen=True)
class NodeOffer:
    """What a host offers the cluster."""

    classes: tuple[str, ...]
    """The project's classes this host matches (the same rules as ``qualify run``)."""
    resources: dict[str, float]
    """Custom resources: ``qualify/class/<name>`` per class, ``qualify/host`` once."""
    labels: dict[str, str]
    """The fingerprint as node labels (``qualify/arch``, ``qualify/cpu``, ...)."""
    unmatched: dict[str, list[str]] = field(default_factory=dict)
    """Per class it does not match, the rules it fails."""


def node_offer(loaded: LoadedProject, fp: Fingerprint) -> NodeOffer:
    """The classes ``fp`` matches and the resources and labels that advertise them."""
    matched: list[str] = []
    unmatched: dict[str, list[str]] = {}
    for name, host_class in loaded.project.host_classes.items():
        failures = class_mismatches(fp, host_class)
        if failures:
            unmatched[name] = failures
        else:
            matched.append(name)
    resources = {CLASS_RESOURCE + name: 1.0 for name in matched}
    resources[HOST_RESOURCE] = 1.0
    labels = {
        "qualify/host": _label_value(fp.hostname),
        "qualify/arch": _label_value(fp.arch),
        "qualify/cpu": _label_value(fp.cpu_model or "unknown"),
        "qualify/runtime": _label_value(f"onnxruntime-{fp.runtime.version}"),
        "qualify/cores": str(fp.cores),
    }
    return NodeOffer(tuple(matched), resources, labels, unmatched)


def join_argv(
    address: str, offer: NodeOffer, *, ray: str | None = None, node_ip: str | None = None
) -> list[str]:
    """The ``ray start`` that joins this host to the cluster at ``address`` with ``offer``;
    ``--block``, so that the node lives exactly as long as the command (stop it and the node
    leaves)."""
    executable = ray or str(Path(sys.executable).with_name("ray"))
    argv = [
        executable,
        "start",
        "--address",
        address,
        "--resources",
        json.dumps(offer.resources, sort_keys=True),
        "--labels",
        ",".join(f"{k}={v}" for k, v in sorted(offer.labels.items())),
        "--block",
    ]
    if node_ip is not None:
        argv += ["--node-ip-address", node_ip]
    return argv


@dataclass(frozen=True)
class FleetStatus:
    """Which live hosts can serve which of the project's classes."""

    hosts: dict[str, list[str]]
    """Per class of the project (in file order), the hosts that advertise it."""
    unknown: list[str]
    """Classes hosts advertise that the project does not have."""

    @property
    def unserved(self) -> list[str]:
        """Classes no live host can serve."""
        return [name for name, hosts in self.hosts.items() if not hosts]


def _host_name(node: Mapping[str, Any]) -> str:
    labels = node.get("Labels") or {}
    name = labels.get("qualify/host") or node.get("NodeManagerHostname") or "?"
    return f"{name} ({str(node.get('NodeID', '?'))[:12]})"


def fleet_status(loaded: LoadedProject, nodes: Iterable[Mapping[str, Any]]) -> FleetStatus:
    """Per class, the live nodes (``ray.nodes()`` entries) that advertise its resource."""
    hosts: dict[str, list[str]] = {name: [] for name in loaded.project.host_classes}
    unknown: set[str] = set()
    for node in nodes:
        if not node.get("Alive", False):
            continue
        for resource in node.get("Resources") or {}:
            if not str(resource).startswith(CLASS_RESOURCE):
                continue
            name = str(resource)[len(CLASS_RESOURCE) :]
            if name in hosts:
                hosts[name].append(_host_name(node))
            else:
                unknown.add(name)
    return FleetStatus(hosts=hosts, unknown=sorted(unknown))


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise QualifyError(
            "the fleet commands need Ray: pip install 'qualify[fleet]' (or pip install ray)"
        ) from exc
    return ray


def _connect(address: str | None, resources: dict[str, float] | None = None) -> Any:
    """Ray, connected to the cluster at ``address``, else to a new one on this machine alone
    (bound to 127.0.0.1) whose one node has ``resources``."""
    if address is None:
        os.environ.update(LOCAL_ENV)
    ray = _ray()
    if ray.is_initialized():
        return ray
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    if address is None:
        kwargs.update(resources=resources or {}, _node_ip_address="127.0.0.1")
    else:
        kwargs["address"] = address
    try:
        ray.init(**kwargs)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = address or "a new cluster on this machine"
        raise QualifyError(f"cannot reach Ray at {where}: {exc}") from exc
    return ray


def read_nodes(address: str) -> list[dict[str, Any]]:
    """The nodes of the cluster at ``address`` (``ray.nodes()``)."""
    ray = _connect(address)
    try:
        return list(ray.nodes())
    finally:
        ray.shutdown()


# --- shipping the project ------------------------------------------------------------------


def _relative(loaded: LoadedProject, written: str, what: str) -> str:
    path = PurePosixPath(Path(written).as_posix())
    if path.is_absolute() or ".." in path.parts:
        raise ProjectError(
            f"{loaded.path}: {what}: {written!r} is outside the project's folder, which fleet run "
            "ships to each host. Fix: keep it under the project's folder and write it relative."
        )
    return str(path)


def shipment_files(loaded: LoadedProject) -> dict[str, Path]:
    """Every file a host needs to run the project, by its path relative to the project's folder:
    the project file, the artifacts, recorded inputs and pipeline hooks written beside it.

    Raises:
        ProjectError: a path points outside the project's folder (the host could not place it).
    """
    project = loaded.project
    files = {loaded.path.name: loaded.path}
    specs = [project.artifacts.baseline, *project.artifacts.candidates]
    for index, spec in enumerate(specs):
        what = "artifacts.baseline.path" if index == 0 else f"artifacts.candidates.{index - 1}"
        files[_relative(loaded, spec.path, what)] = loaded.resolve(spec.path)
    for name, feed in project.workload.inputs.items():
        if feed.file is not None:
            rel = _relative(loaded, feed.file, f"workload.inputs.{name}.file")
            files[rel] = loaded.resolve(feed.file)
    pipeline = project.workload.pipeline
    for hook in (pipeline.pre, pipeline.post) if pipeline is not None else ():
        if hook is None:
            continue
        module = hook.partition(":")[0].replace(".", "/")
        for candidate in (f"{module}.py", f"{module}/__init__.py"):
            if (loaded.root / candidate).is_file():
                files[candidate] = loaded.root / candidate
    return files


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return "sha256:" + h.hexdigest()


def _unpack(files: Mapping[str, tuple[str, bytes]], root: Path) -> None:
    """Write the shipped files under ``root``, each checked against its digest."""
    for rel, (digest, data) in files.items():
        got = "sha256:" + hashlib.sha256(data).hexdigest()
        if got != digest:
            raise QualifyError(f"{rel}: arrived as {got[:19]}, was shipped as {digest[:19]}")
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


# --- the run ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class FleetOptions:
    """Where the fleet run writes and how long a class may take."""

    db_path: Path
    address: str | None = None
    """The cluster (``HOST:PORT``); None: a cluster on this machine alone."""
    timeout_s: float = 3600.0
    """Most seconds one class's run may take on its host, queueing excluded."""
    bundle_dir: Path | None = None
    """Defaults to ``<db dir>/bundles``."""


ClassState = Literal["done", "error", "unserved"]


@dataclass
class ClassRun:
    """How one class fared."""

    host_class: str
    state: ClassState
    message: str
    host: str | None = None
    bundle: RunBundle | None = None


@dataclass
class FleetOutcome:
    """Every requested class, in the project's order."""

    classes: list[ClassRun]

    @property
    def ok(self) -> bool:
        """Every class came back measured, none with an error cell."""
        return all(
            c.state == "done"
            and c.bundle is not None
            and all(cell.verdict != "error" for cell in c.bundle.cells)
            for c in self.classes
        )


def _qualify_here(shipment: dict[str, Any], class_name: str, tracker: Any) -> dict[str, Any]:
    """The body of a class's task, on the host Ray placed it on: fingerprint, say so to the
    driver's tracker, unpack the project, run ``qualify run`` for the class, hand back the
    bundle (JSON) and its samples (Parquet bytes)."""
    import pyarrow.parquet as pq

    from qualify.fingerprint import take_fingerprint
    from qualify.project import load_project
    from qualify.run import RunOptions, qualify_run
    from qualify.runner import probe_runtime

    ray = _ray()
    node = ray.get_runtime_context().get_node_id()
    fp = take_fingerprint(probe_runtime)
    ray.get(tracker.start.remote(class_name, node, fp.hostname, fp.model_dump_json()))
    files = {rel: (digest, ray.get(ref)) for rel, (digest, ref) in shipment["files"].items()}
    with tempfile.TemporaryDirectory(prefix="qualify-fleet-") as tmp:
        root = Path(tmp)
        _unpack(files, root)
        loaded = load_project(root / shipment["project"])
        options = RunOptions(db_path=root / "host.duckdb", fleet_node=f"{node} ({fp.hostname})")
        outcome = qualify_run(loaded, class_name, options)
        samples = None
        if outcome.samples.num_rows:
            sink = io.BytesIO()
            pq.write_table(outcome.samples, sink)
            samples = sink.getvalue()
        return {
            "bundle": outcome.bundle.model_dump_json(),
            "samples": samples,
            "node": node,
            "hostname": fp.hostname,
        }


class _Tracker:
    """Lives on the driver's node: each class's task says where it runs before measuring, so
    that a host that dies can be named and its class given error cells."""

    def __init__(self) -> None:
        self.started: dict[str, tuple[str, str, str]] = {}

    def start(self, class_name: str, node: str, hostname: str, fingerprint: str) -> None:
        self.started[class_name] = (node, hostname, fingerprint)

    def seen(self) -> dict[str, tuple[str, str, str]]:
        return dict(self.started)


def _served(nodes: Iterable[Mapping[str, Any]], name: str) -> bool:
    return any(
        node.get("Alive") and CLASS_RESOURCE + name in (node.get("Resources") or {})
        for node in nodes
    )


def _error_bundle(
    loaded: LoadedProject,
    class_name: str,
    where: tuple[str, str, str],
    code: str,
    message: str,
    digests: Sequence[str],
    now: datetime,
) -> RunBundle:
    """Error cells, one per artifact, for a class whose host was lost mid-run."""
    from qualify.run import new_run_id

    host_class: HostClass = loaded.project.host_classes[class_name]
    fp = Fingerprint.model_validate_json(where[2])
    run_id = new_run_id(class_name, now)
    project = loaded.project
    specs = [project.artifacts.baseline, *project.artifacts.candidates]
    settings = host_class.settings_digest()
    cells = [
        Cell(
            run_id=run_id,
            host_class=class_name,
            key=host_class.key,
            artifact_digest=digest,
            artifact_name=spec.label,
            role="baseline" if index == 0 else "candidate",
            precision=spec.precision,
            verdict="error",
            reasons=[Reason(code=code, message=message)],
            emulated=False,
            isa=fp.isa,
            measured_at=now,
            settings_digest=settings,
            runtime_version=fp.runtime.version,
            cold_init_ms=None,
            warm_init_ms=None,
            peak_rss_mb=None,
            peak_rss_source=None,
            placement=None,
            parity=None,
            error=message,
            fleet_node=f"{where[0]} ({where[1]})",
        )
        for index, (spec, digest) in enumerate(zip(specs, digests, strict=True))
    ]
    load = list(os.getloadavg())
    run = RunRecord(
        run_id=run_id,
        host_class=class_name,
        key=host_class.key,
        model=project.model,
        started_at=now,
        finished_at=now,
        emulated=False,
        settings_digest=settings,
        fingerprint=fp,
        load_avg_before=load,
        load_avg_after=load,
        rollback=None,
    )
    return RunBundle(run=run, cells=cells)


def _store(bundle: RunBundle, samples: Any, options: FleetOptions) -> None:
    from matrix.bundle import write_bundle
    from matrix.samples import empty_samples
    from matrix.store import Store
    from qualify.hostlock import lock_wait_message

    table = samples if samples is not None else empty_samples()
    write_bundle(bundle, table, options.bundle_dir or options.db_path.resolve().parent / "bundles")
    with Store.open(options.db_path, on_wait=lock_wait_message()) as db:
        db.write_run(bundle, table)


def _read_samples(data: bytes | None) -> Any:
    if data is None:
        return None
    import pyarrow.parquet as pq

    return pq.read_table(io.BytesIO(data))


def fleet_run(
    loaded: LoadedProject,
    options: FleetOptions,
    *,
    classes: Sequence[str] | None = None,
    on_event: Callable[[str], None] = lambda _msg: None,
    local_fingerprint: Callable[[], Fingerprint] | None = None,
    poll_s: float = 0.5,
) -> FleetOutcome:
    """Qualify each requested class (default: all) on a host of that class, in parallel across
    hosts, and write what comes back to the matrix at ``options.db_path``.

    Without ``options.address`` a cluster on this machine alone is started whose one node
    offers the classes this host matches (``local_fingerprint`` fingerprints it).

    Raises:
        ProjectError: an unknown class, or a file outside the project's folder.
        QualifyError: Ray is missing or the cluster cannot be reached.
    """
    known = loaded.project.host_classes
    wanted = list(classes) if classes else list(known)
    for name in wanted:
        if name not in known:
            raise ProjectError(
                f"{loaded.path}: host_classes: no class named {name!r}. "
                f"Fix: pick from {', '.join(known)}."
            )
    if options.db_path.exists():  # a matrix of another model line is refused before any host runs
        from matrix.store import Store

        Store.open(options.db_path, model=loaded.project.model).close()
    files = shipment_files(loaded)
    for rel, path in files.items():
        if not path.is_file():
            raise ProjectError(f"{loaded.path}: {rel}: not found ({path})")
        if path.stat().st_size > _MAX_FILE:
            raise ProjectError(f"{path}: larger than {_MAX_FILE // 2**30} GiB, not shipped")
    resources = None
    if options.address is None:
        from qualify.fingerprint import take_fingerprint
        from qualify.runner import probe_runtime

        fp = local_fingerprint() if local_fingerprint else take_fingerprint(probe_runtime)
        resources = node_offer(loaded, fp).resources
    ray = _connect(options.address, resources)
    try:
        return _run_on(ray, loaded, wanted, files, options, on_event, poll_s)
    finally:
        ray.shutdown()


def _run_on(
    ray: Any,
    loaded: LoadedProject,
    wanted: list[str],
    files: dict[str, Path],
    options: FleetOptions,
    on_event: Callable[[str], None],
    poll_s: float,
) -> FleetOutcome:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    tracker = (
        ray.remote(num_cpus=0)(_Tracker)
        .options(scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False))
        .remote()
    )
    shipped = {rel: (_digest(path), ray.put(path.read_bytes())) for rel, path in files.items()}
    project = loaded.project
    specs = [project.artifacts.baseline, *project.artifacts.candidates]
    digests = [shipped[_relative(loaded, s.path, "artifact")][0] for s in specs]
    shipment = {"project": loaded.path.name, "files": shipped}
    task = ray.remote(num_cpus=0, max_retries=0)(_qualify_here)
    nodes = list(ray.nodes())
    results: dict[str, ClassRun] = {}
    pending: dict[Any, str] = {}
    for name in wanted:
        if not _served(nodes, name):
            results[name] = ClassRun(name, "unserved", "no host in the cluster serves this class")
            on_event(f"{name}: unserved (no host advertises {CLASS_RESOURCE}{name})")
            continue
        ref = task.options(resources={CLASS_RESOURCE + name: 1.0, HOST_RESOURCE: 1.0}).remote(
            shipment, name, tracker
        )
        pending[ref] = name
        on_event(f"{name}: scheduled")
    started: dict[str, float] = {}
    announced: set[str] = set()
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=poll_s)
        seen = ray.get(tracker.seen.remote())
        now = time.monotonic()
        for name, (_node, hostname, _fp) in seen.items():
            if name not in announced:
                announced.add(name)
                started[name] = now
                on_event(f"{name}: running on {hostname} ({_node[:12]})")
        for ref in ready:
            name = pending.pop(ref)
            results[name] = _collect(ray, ref, name, seen.get(name), loaded, digests, options)
            on_event(f"{name}: {results[name].message}")
        for ref, name in list(pending.items()):
            if name in started and now - started[name] > options.timeout_s:
                ray.cancel(ref, force=True)
                pending.pop(ref)
                where = seen[name]
                message = (
                    f"the run on {where[1]} (node {where[0][:12]}) exceeded fleet run's "
                    f"{options.timeout_s:g} s limit and was stopped"
                )
                results[name] = _lost(loaded, name, where, "fleet_timeout", message, digests)
                _store_error(results[name], options)
                on_event(f"{name}: error: {message}")
    missing = [name for name in wanted if results[name].state == "unserved"]
    if missing:
        from matrix.store import Store

        with Store.open(options.db_path, model=loaded.project.model) as db:
            keys = loaded.project.host_classes
            db.note_unserved(((n, keys[n].key) for n in missing), "no host advertised the class")
    return FleetOutcome([results[name] for name in wanted])


def _lost(
    loaded: LoadedProject,
    name: str,
    where: tuple[str, str, str] | None,
    code: str,
    message: str,
    digests: Sequence[str],
) -> ClassRun:
    if where is None:  # it never started: there is no host to give cells to
        return ClassRun(name, "error", message)
    bundle = _error_bundle(loaded, name, where, code, message, digests, datetime.now(UTC))
    return ClassRun(name, "error", message, host=where[1], bundle=bundle)


def _store_error(run: ClassRun, options: FleetOptions) -> None:
    if run.bundle is not None:
        _store(run.bundle, None, options)


def _collect(
    ray: Any,
    ref: Any,
    name: str,
    where: tuple[str, str, str] | None,
    loaded: LoadedProject,
    digests: Sequence[str],
    options: FleetOptions,
) -> ClassRun:
    """A finished task's bundle written to the matrix, or its failure as error cells."""
    from ray import exceptions as rex

    try:
        reply = ray.get(ref)
    except rex.RayTaskError as exc:  # qualify itself failed there: a project or host error
        cause = exc.cause if getattr(exc, "cause", None) is not None else exc
        host = f" on {where[1]}" if where else ""
        return ClassRun(name, "error", f"failed{host}: {type(cause).__name__}: {cause}")
    except (rex.RayError, OSError) as exc:
        host = f"{where[1]} (node {where[0][:12]})" if where else "its host"
        message = f"{host} was lost before the run came back ({type(exc).__name__})"
        run = _lost(loaded, name, where, "node_lost", message, digests)
        _store_error(run, options)
        return run
    bundle = RunBundle.model_validate_json(reply["bundle"])
    _store(bundle, _read_samples(reply["samples"]), options)
    verdicts = ", ".join(f"{c.artifact_name} {c.verdict}" for c in bundle.cells)
    host = f"{reply['hostname']} ({str(reply['node'])[:12]})"
    return ClassRun(name, "done", f"done on {host}: {verdicts}", host=host, bundle=bundle)
