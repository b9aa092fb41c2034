"""The host fingerprint and the check that a host belongs to a class.

Owns assembling ``schemas.host.Fingerprint`` from host facts (``manifest.hostmatch``, shared with
``resolve-artifact`` so both put a host in the same class) and the onnxruntime identity probed in
a subprocess (``qualify.measure.runner.probe_runtime``), and checking the class's runtime identity. It
does not import onnxruntime.
"""

from __future__ import annotations

import fnmatch
import os
import platform
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from manifest.hostmatch import (
    HostFacts,
    isa_summary,
    match_failures,
    read_host_facts,
    required_isa,
)
from qualify.measure.cpus import cpus_for, numa_nodes
from schemas.host import EpDevice, Fingerprint, RuntimeIdentity
from schemas.project import HostClass

__all__ = ["class_cpus", "class_mismatches", "facts_of", "isa_mismatch", "take_fingerprint"]


def take_fingerprint(
    probe: Callable[[], dict[str, Any]], proc: Path = Path("/proc")
) -> Fingerprint:
    """Fingerprint this host.

    Args:
        probe: returns the onnxruntime identity (``qualify.measure.runner.probe_runtime`` in real runs).
        proc: procfs root; tests pass a directory of fake files.
    """
    runtime_doc = probe()
    runtime = RuntimeIdentity(
        package=runtime_doc.get("package"),
        version=str(runtime_doc["version"]),
        build_info=runtime_doc.get("build_info"),
        available_providers=list(runtime_doc.get("available_providers", [])),
        ep_devices=[EpDevice(**d) for d in runtime_doc.get("ep_devices", [])],
    )
    facts = read_host_facts(proc, runtime.available_providers)
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return Fingerprint(
        hostname=socket.gethostname(),
        arch=facts.arch,
        cpu_model=facts.cpu_model,
        cpu_flags=sorted(facts.cpu_flags),
        isa=isa_summary(facts.arch, facts.cpu_flags),
        cores=os.cpu_count() or 1,
        affinity=affinity,
        numa_nodes={str(n): cpus for n, cpus in numa_nodes().items()},
        memory_mb=facts.memory_mb,
        os=f"{platform.system()} {platform.release()}",
        python=platform.python_version(),
        runtime=runtime,
    )


def facts_of(fp: Fingerprint) -> HostFacts:
    """The match-rule view of a fingerprint."""
    return HostFacts(
        arch=fp.arch,
        cpu_model=fp.cpu_model,
        cpu_flags=frozenset(fp.cpu_flags),
        cores=len(fp.affinity) or fp.cores,
        memory_mb=fp.memory_mb,
        providers=frozenset(fp.runtime.available_providers),
    )


def class_mismatches(fp: Fingerprint, host_class: HostClass) -> list[str]:
    """Every rule of the class this host fails: hardware match rules and runtime identity.

    Returns:
        One sentence per failed rule; empty when the host belongs to the class.
    """
    failures = match_failures(facts_of(fp), host_class.match.model_dump())
    want = host_class.runtime
    have = fp.runtime
    if want.package and have.package and want.package != have.package:
        failures.append(f"runtime.package: host has {have.package}, class needs {want.package}")
    if not fnmatch.fnmatchcase(have.version, want.version):
        failures.append(
            f"runtime.version: host has onnxruntime {have.version}, class needs {want.version}"
        )
    if want.build_info and (have.build_info is None or want.build_info not in have.build_info):
        failures.append(
            f"runtime.build_info: host build is {have.build_info!r}, class needs {want.build_info!r}"
        )
    failures += class_cpus(fp, host_class)[1]
    return failures


def class_cpus(fp: Fingerprint, host_class: HostClass) -> tuple[list[int] | None, list[str]]:
    """The CPUs the class's serving process runs on here (`qualify.measure.cpus.cpus_for`), and what of
    its ``cpu_affinity`` / ``numa_node`` this host cannot give."""
    nodes = {int(n): cpus for n, cpus in fp.numa_nodes.items()}
    provider = host_class.provider
    return cpus_for(provider.cpu_affinity, provider.numa_node, fp.affinity, nodes)


def isa_mismatch(fp: Fingerprint, host_class: HostClass) -> list[str]:
    """How the measuring host's ISA differs from what the class's hosts have: each required ISA
    feature it lacks, and a different architecture. Empty when its numerics are the class's.
    """
    rules = host_class.match.model_dump()
    found: list[str] = []
    arch = rules.get("arch")
    if arch and arch != fp.arch:
        found.append(f"arch {fp.arch}, class {arch}")
    have = set(fp.isa or isa_summary(fp.arch, fp.cpu_flags))
    found += [f"no {feature}" for feature in required_isa(rules) if feature not in have]
    return found
