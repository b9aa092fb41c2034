"""The fleet on Ray: what a host offers the cluster and how one command reaches it.

Owns a host's offer (`node_offer`: a resource per class it matches, its labels), the ``ray start``
it joins with (`join_argv`), who serves which class (`fleet_status`), the bounded connect and the
shipment. `qualify.fleet.start` connects and hands over to `qualify.fleet.driver`. Ray is imported
lazily.

Errors::

    QualifyError
    └── FleetError            a fleet command could not do its work (exit 2)
        └── FleetAddressError an address is malformed or nothing answers there (exit 2)
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import secrets
import socket
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from qualify import __version__
from qualify.errors import ProjectError, QualifyError
from qualify.measure.fingerprint import class_mismatches
from qualify.project.load import LoadedProject
from schemas.cell import RunBundle
from schemas.host import Fingerprint

__all__ = [
    "CLASS_RESOURCE",
    "HOST_RESOURCE",
    "LOCAL_ENV",
    "MACHINE_LABEL",
    "NODE_ID_LABEL",
    "PROJECT_LABEL",
    "VERSION_LABEL",
    "ClassRun",
    "FleetAddressError",
    "FleetError",
    "FleetOptions",
    "FleetOutcome",
    "FleetStatus",
    "NodeOffer",
    "check_shipment",
    "connect",
    "disagreement",
    "expected_labels",
    "fleet_status",
    "is_loopback",
    "join_argv",
    "local_auth",
    "machine_id",
    "node_offer",
    "parse_address",
    "probe_address",
    "project_label",
    "read_boot_id",
    "read_nodes",
    "shipment_files",
]

CLASS_RESOURCE = "qualify/class/"
"""Prefix of the custom resource a host advertises per class it matches."""

HOST_RESOURCE = "qualify/host"
"""One per host: every class's task needs it, so a host measures one class at a time."""

VERSION_LABEL = "qualify/version"
"""The qualify version a host runs; a class is scheduled only where it equals the driver's."""

PROJECT_LABEL = "qualify/project"
"""The digest of the project file a host matched its classes against (`project_label`); a
class is scheduled only where it equals the driver's project file's."""

MACHINE_LABEL = "qualify/machine"
"""The machine a node runs on (`machine_id`: host name and boot id): nodes that share one are
measured one at a time."""

NODE_ID_LABEL = "ray.io/node-id"
"""The label Ray gives every node: its id (a retry excludes the node that refused)."""

LOCAL_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
"""What a driver of a cluster on loopback runs with: Ray then keeps 127.0.0.1 as the node
address instead of rewriting it to the machine's interface address, where nothing of a
loopback cluster listens (set before Ray is imported)."""

DEFAULT_CONNECT_TIMEOUT_S = 10.0
"""How long a fleet command waits for the head's port to answer before giving up."""

_LABEL = re.compile(r"[^A-Za-z0-9._-]+")
_HOSTNAME = re.compile(
    r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)
_MAX_FILE = 16 * 2**30
"""Largest file a shipment carries (an artifact, a recorded input)."""


class FleetError(QualifyError):
    """A fleet command could not do its work."""


class FleetAddressError(FleetError):
    """An address is malformed, or nothing answers there within the connect timeout."""


def _label_value(text: str) -> str:
    """``text`` as a Ray label value: 63 characters of ``[A-Za-z0-9._-]``, alphanumeric ends."""
    cleaned = _LABEL.sub("-", text).strip("-._")[:63].strip("-._")
    return cleaned or "unknown"


def project_label(loaded: LoadedProject) -> str:
    """The project file's digest as a label value: ``sha256-`` and the first 56 hex digits."""
    hexdigest = loaded.sha256 or hashlib.sha256(loaded.path.read_bytes()).hexdigest()
    return f"sha256-{hexdigest[:56]}"


def machine_id(hostname: str, boot_id: str | None) -> str:
    """Which machine a node runs on: nodes with the same host name and boot id share its CPUs
    (several Ray nodes on one machine), whatever their host locks say."""
    text = f"{hostname}\0{boot_id or ''}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def read_boot_id(proc: Path = Path("/proc")) -> str | None:
    """This boot's id (``/proc/sys/kernel/random/boot_id``); None where there is none."""
    try:
        return (proc / "sys/kernel/random/boot_id").read_text(encoding="ascii")[:64].strip()
    except (OSError, UnicodeDecodeError):
        return None


def expected_labels(loaded: LoadedProject) -> dict[str, str]:
    """The labels a host must advertise for this driver to send it a class: its qualify
    version and its project file's digest equal to the driver's."""
    return {VERSION_LABEL: _label_value(__version__), PROJECT_LABEL: project_label(loaded)}


@dataclass(frozen=True)
class NodeOffer:
    """What a host offers the cluster."""

    classes: tuple[str, ...]
    """The project's classes this host matches (the same rules as ``qualify run``)."""
    resources: dict[str, float]
    """Custom resources: ``qualify/class/<name>`` per class, ``qualify/host`` once."""
    labels: dict[str, str]
    """The fingerprint, version, project digest and machine as node labels."""
    unmatched: dict[str, list[str]] = field(default_factory=dict)
    """Per class it does not match, the rules it fails."""


def node_offer(loaded: LoadedProject, fp: Fingerprint, *, boot_id: str | None = None) -> NodeOffer:
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
        MACHINE_LABEL: machine_id(fp.hostname, boot_id),
        **expected_labels(loaded),
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
        _json(offer.resources),
        "--labels",
        ",".join(f"{k}={v}" for k, v in sorted(offer.labels.items())),
        "--block",
    ]
    if node_ip is not None:
        argv += ["--node-ip-address", node_ip]
    return argv


def _json(value: Mapping[str, float]) -> str:
    import json

    return json.dumps(dict(value), sort_keys=True)


# --- addresses ---------------------------------------------------------------------------


def parse_address(text: str, *, what: str = "--address") -> tuple[str, int]:
    """``HOST:PORT`` (``[V6]:PORT`` for an IPv6 address) as (host, port).

    Raises:
        FleetAddressError: anything else, naming the option and the fix.
    """
    raw = text.strip()
    example = "e.g. 10.0.0.5:6379, head.lab:6379 or [fd00::5]:6379"
    if "://" in raw:
        raise FleetAddressError(
            f"{what} {raw[:80]!r}: give the head's GCS address as HOST:PORT ({example}); "
            "Ray Client (ray://) and URLs are not supported"
        )
    host, sep, port = raw.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        valid_host = _is_ip(host, version=6)
    else:
        valid_host = _is_ip(host) or (bool(_HOSTNAME.fullmatch(host)) and len(host) <= 253)
    if not sep or not valid_host:
        raise FleetAddressError(f"{what} {raw[:80]!r}: expected HOST:PORT ({example})")
    if not port.isascii() or not port.isdigit() or not 1 <= int(port[:6]) <= 65535:
        raise FleetAddressError(
            f"{what} {raw[:80]!r}: port {port[:12]!r} is not a port (1 to 65535); {example}"
        )
    return host, int(port)


def _is_ip(host: str, version: int | None = None) -> bool:
    try:
        parsed = ipaddress.ip_address(host)
    except ValueError:
        return False
    return version is None or parsed.version == version


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def probe_address(address: str, timeout_s: float) -> None:
    """Check within ``timeout_s`` that Ray's GCS answers at ``address``: a TCP connection, then
    the HTTP/2 preface its gRPC server answers with a SETTINGS frame (skipped when Ray uses TLS,
    ``RAY_USE_TLS``). Ray's own connect retries for minutes, printing "Connecting...", against
    an address where nothing, or something else, listens.

    Raises:
        FleetAddressError: malformed, unresolvable, refused, silent, or not Ray's, with what was
            tried and the fix.
    """
    import time

    host, port = parse_address(address)
    deadline = time.monotonic() + timeout_s
    tried = f"tried a TCP connection to {host} port {port}"
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as conn:
            if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
                return
            tried += " and the HTTP/2 preface of gRPC"
            conn.settimeout(max(0.1, deadline - time.monotonic()))
            conn.sendall(_H2_PREFACE)
            frame = conn.recv(9)
            if len(frame) >= 4 and frame[3] == 0x4:  # a SETTINGS frame: a gRPC server
                return
            why = "something answers there, but not as Ray's GCS (gRPC) does"
    except TimeoutError:
        why = f"no answer within {timeout_s:g} s (a firewall, a host that is down, or not Ray)"
    except socket.gaierror as exc:
        why = f"the name {host!r} does not resolve ({exc.strerror})"
    except ConnectionRefusedError:
        why = "connection refused: nothing listens on that port"
    except OSError as exc:
        why = exc.strerror or str(exc)
    raise FleetAddressError(
        f"cannot reach the Ray head at {address}: {tried}: {why}. Fix: pass the GCS address "
        f"the head printed (ray start --head --port {port} --node-ip-address {host}; not the "
        "dashboard's or Ray Client's port), or give it longer with --connect-timeout"
    )


_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
"""The HTTP/2 client preface and an empty SETTINGS frame: a gRPC server answers with SETTINGS."""


@contextmanager
def local_auth() -> Iterator[None]:
    """A cluster this run starts on this machine alone gets a token of its own through the
    environment (``RAY_AUTH_TOKEN``): Ray turns token authentication on for a new local cluster
    and would otherwise write a token to ``~/.ray/auth_token`` and leave it there. A token or
    mode the user set is kept."""
    if "RAY_AUTH_MODE" in os.environ or "RAY_AUTH_TOKEN" in os.environ:
        yield
        return
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    try:
        yield
    finally:
        os.environ.pop("RAY_AUTH_TOKEN", None)
        os.environ.pop("RAY_AUTH_MODE", None)  # Ray set it for this run's cluster


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise FleetError(
            "the fleet commands need Ray: pip install 'qualify[fleet]' (or pip install ray)"
        ) from exc
    return ray


def connect(
    address: str | None,
    *,
    timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    resources: dict[str, float] | None = None,
    labels: dict[str, str] | None = None,
) -> Any:
    """Ray, connected to the cluster at ``address`` (checked with `probe_address` first), else
    to a new one on this machine alone (bound to 127.0.0.1) whose one node has ``resources``
    and ``labels``.

    Raises:
        FleetAddressError: the address is malformed or does not answer.
        FleetError: Ray is missing, or refused the connection.
    """
    if address is not None:
        host, _ = parse_address(address)
        if is_loopback(host):
            _keep_loopback(address)
        probe_address(address, timeout_s)
    else:
        _keep_loopback(None)
    ray = _ray()
    if ray.is_initialized():
        return ray
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    if address is None:
        # "local": a new cluster, never one that RAY_ADDRESS or Ray's note of the latest
        # cluster started on this machine points at.
        kwargs.update(address="local", resources=resources or {}, labels=labels or {})
        kwargs["_node_ip_address"] = "127.0.0.1"  # ray.init's documented parameter
    else:
        kwargs["address"] = address
    try:
        ray.init(**kwargs)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = address or "a new cluster on this machine"
        raise FleetError(f"cannot connect to Ray at {where}: {exc}") from exc
    return ray


def _keep_loopback(address: str | None) -> None:
    """Make Ray keep a loopback address on loopback; refuse where Ray was imported already
    without it (its address rule is read once, at import)."""
    if os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") != "0" and "ray" in sys.modules:
        raise FleetError(
            f"{address or 'a cluster on this machine'}: Ray was imported before qualify could "
            "keep a loopback address on loopback; set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 "
            "before importing ray"
        )
    os.environ.update(LOCAL_ENV)


def read_nodes(
    address: str, *, timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
) -> list[dict[str, Any]]:
    """The nodes of the cluster at ``address`` (``ray.nodes()``).

    Raises:
        FleetAddressError, FleetError: as `connect`.
    """
    ray = connect(address, timeout_s=timeout_s)
    try:
        return list(ray.nodes())
    finally:
        ray.shutdown()


# --- status ------------------------------------------------------------------------------


@dataclass(frozen=True)
class FleetStatus:
    """Which live hosts can serve which of the project's classes."""

    hosts: dict[str, list[str]]
    """Per class of the project (in file order), the hosts that advertise it and agree with
    this project and qualify version (a fleet run can send the class there)."""
    unknown: list[str]
    """Classes hosts advertise that the project does not have."""
    mismatched: dict[str, list[str]] = field(default_factory=dict)
    """Per class, the hosts that advertise it but disagree: ``host: why``."""
    shared: list[list[str]] = field(default_factory=list)
    """Groups of live nodes that run on one machine (measured one at a time)."""

    @property
    def unserved(self) -> list[str]:
        """Classes no live, agreeing host can serve."""
        return [name for name, hosts in self.hosts.items() if not hosts]


def _host_name(node: Mapping[str, Any]) -> str:
    labels = node.get("Labels") or {}
    name = labels.get("qualify/host") or node.get("NodeManagerHostname") or "?"
    return f"{name} ({str(node.get('NodeID', '?'))[:12]})"


def disagreement(labels: Mapping[str, Any], expected: Mapping[str, str]) -> str | None:
    """Why a node with ``labels`` may not take this driver's classes; None when it may."""
    why = []
    version = labels.get(VERSION_LABEL)
    if version != expected[VERSION_LABEL]:
        said = f"qualify {version}" if version else "no qualify version (joined by hand?)"
        why.append(f"advertises {said}, the driver runs qualify {expected[VERSION_LABEL]}")
    project = labels.get(PROJECT_LABEL)
    if project != expected[PROJECT_LABEL]:
        said = f"project {str(project)[:19]}" if project else "no project digest"
        why.append(
            f"joined with {said}, the driver's project file is {expected[PROJECT_LABEL][:19]} "
            "(rejoin it with this project file: qualify fleet join)"
        )
    return "; ".join(why) or None


def fleet_status(loaded: LoadedProject, nodes: Iterable[Mapping[str, Any]]) -> FleetStatus:
    """Per class, the live nodes (``ray.nodes()`` entries) that advertise its resource and agree
    with this project and qualify version, those that disagree and why, and the nodes that
    share a machine."""
    expected = expected_labels(loaded)
    hosts: dict[str, list[str]] = {name: [] for name in loaded.project.host_classes}
    mismatched: dict[str, list[str]] = {}
    unknown: set[str] = set()
    machines: dict[str, list[str]] = {}
    for node in nodes:
        if not node.get("Alive", False):
            continue
        labels = node.get("Labels") or {}
        machine = labels.get(MACHINE_LABEL)
        if machine:
            machines.setdefault(str(machine), []).append(_host_name(node))
        why = disagreement(labels, expected)
        for resource in node.get("Resources") or {}:
            if not str(resource).startswith(CLASS_RESOURCE):
                continue
            name = str(resource)[len(CLASS_RESOURCE) :]
            if name not in hosts:
                unknown.add(name)
            elif why is None:
                hosts[name].append(_host_name(node))
            else:
                mismatched.setdefault(name, []).append(f"{_host_name(node)}: {why}")
    shared = [group for group in machines.values() if len(group) > 1]
    return FleetStatus(hosts=hosts, unknown=sorted(unknown), mismatched=mismatched, shared=shared)


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


def check_shipment(loaded: LoadedProject, files: Mapping[str, Path]) -> None:
    for rel, path in files.items():
        if not path.is_file():
            raise ProjectError(f"{loaded.path}: {rel}: not found ({path})")
        if path.stat().st_size > _MAX_FILE:
            raise ProjectError(f"{path}: larger than {_MAX_FILE // 2**30} GiB, not shipped")


# --- the run -------------------------------------------------------------------------------


@dataclass(frozen=True)
class FleetOptions:
    """Where the fleet run writes and how long each part of it may take."""

    db_path: Path
    address: str | None = None
    """The cluster (``HOST:PORT``); None: a cluster on this machine alone."""
    timeout_s: float = 3600.0
    """Most seconds one class's measurement may take on its host, counted from the moment it
    starts measuring (waits for a host, the host lock or a shared machine excluded)."""
    deadline_s: float | None = 12 * 3600.0
    """Most seconds the whole run may take; what is not back by then ends as fleet_timeout."""
    host_wait_s: float = 30.0
    """Most seconds a class may wait while no live host can take it (none advertises it, none
    agrees with this project and version, or its only host left) before it ends as a gap."""
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    """Most seconds to wait for the head's port to answer."""
    bundle_dir: Path | None = None
    """Defaults to ``<db dir>/bundles``."""
    poll_s: float = 0.5
    """How often the driver looks at the cluster and its tasks."""


ClassState = Literal["done", "error", "gap"]


@dataclass
class ClassRun:
    """How one class fared: measured (``done``), error cells (``error``: its host was lost,
    it ran out of time, its result could not be read), or no cells at all (``gap``)."""

    host_class: str
    state: ClassState
    message: str
    host: str | None = None
    bundle: RunBundle | None = None
    reason: str | None = None
    """The reason code: of the error cells, or of the gap (``unserved``, ``node_lost``,
    ``host_mismatch``, ``fleet_timeout``, ``host_failed``, ``driver_stopped``,
    ``driver_failed``); None when done."""


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

    @property
    def gaps(self) -> dict[str, str]:
        """Per class that ended without cells: its reason code and sentence."""
        return {c.host_class: f"{c.reason}: {c.message}" for c in self.classes if c.state == "gap"}
