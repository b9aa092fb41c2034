"""Placement on cores: which CPUs a class's serving process may run on, and this host's NUMA nodes.

Owns reading Linux CPU lists (``0-3,8``) from sysfs, the NUMA nodes of the host
(``/sys/devices/system/node/node<N>/cpulist``), resolving a class's ``provider.cpu_affinity``
and ``provider.numa_node`` to a CPU set, and pinning the measuring process to it before the
session exists, so onnxruntime's threads inherit it. Standard library only: the measuring
subprocess imports it. Does not decide whether a host belongs to a class (``qualify.measure.fingerprint``
says which CPUs are missing).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["NODES", "cpus_for", "numa_nodes", "parse_cpulist", "pin"]

NODES = Path("/sys/devices/system/node")
"""Where Linux lists NUMA nodes."""

_MAX_LIST = 64 * 1024
_MAX_CPU = 8191


def parse_cpulist(text: str) -> list[int]:
    """``0-3,8,10-11`` as sorted CPU numbers.

    Raises:
        ValueError: not a CPU list, or a CPU above 8191.
    """
    found: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise ValueError(f"not a CPU list: {text[:40]!r}")
        first, last = int(low), int(high or low)
        if last < first or last > _MAX_CPU:
            raise ValueError(f"not a CPU list: {text[:40]!r}")
        found.update(range(first, last + 1))
    return sorted(found)


def numa_nodes(root: Path = NODES) -> dict[int, list[int]]:
    """NUMA node -> its CPUs; empty where the host does not say (not Linux, no sysfs)."""
    nodes: dict[int, list[int]] = {}
    if not root.is_dir():
        return nodes
    for folder in root.glob("node[0-9]*"):
        number = folder.name.removeprefix("node")
        if not number.isdigit():
            continue
        try:
            fd = os.open(folder / "cpulist", os.O_RDONLY | os.O_NONBLOCK)
            try:
                text = os.read(fd, _MAX_LIST).decode("ascii", errors="replace")
            finally:
                os.close(fd)
            nodes[int(number)] = parse_cpulist(text)
        except (OSError, ValueError):
            continue
    return dict(sorted(nodes.items()))


def cpus_for(
    cpu_affinity: list[int] | None,
    numa_node: int | None,
    available: list[int],
    nodes: dict[int, list[int]],
) -> tuple[list[int] | None, list[str]]:
    """The CPUs a class's process runs on here, and what of the class's placement this host
    cannot give (one sentence each). ``(None, [])`` when the class places nothing."""
    if cpu_affinity is None and numa_node is None:
        return None, []
    wanted = set(cpu_affinity) if cpu_affinity is not None else set(available)
    problems: list[str] = []
    if numa_node is not None:
        if numa_node not in nodes:
            known = ", ".join(str(n) for n in nodes) or "none listed"
            problems.append(f"provider.numa_node: this host has no NUMA node {numa_node} ({known})")
        else:
            wanted &= set(nodes[numa_node])
    missing = sorted(set(cpu_affinity or ()) - set(available))
    if missing:
        problems.append(
            f"provider.cpu_affinity: CPUs {_short(missing)} are not available to this process "
            f"(it may run on {_short(available)})"
        )
    usable = sorted(wanted & set(available))
    if not usable and not problems:
        problems.append("provider.cpu_affinity and numa_node leave no CPU to run on")
    return usable, problems


def _short(cpus: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2,5``."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and runs[-1][1] == cpu - 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs) or "none"


def pin(cpus: list[int]) -> list[int]:
    """Pin this process (and the threads it will start) to ``cpus``; returns the CPUs it now
    runs on.

    Raises:
        OSError: the OS refused (a CPU went offline, or the list is empty).
    """
    os.sched_setaffinity(0, cpus)
    return sorted(os.sched_getaffinity(0))
