"""Host facts and class match rules, on the standard library alone.

Owns reading the facts a match rule needs (arch, CPU model and flags, cores, memory) from
``/proc`` and checking them against a class's rules. Both ``qualify run`` (through
``qualify.measure.fingerprint``) and the host-side ``resolve-artifact`` use it, so a host is put in the
same class by both. Rules arrive as plain dicts (the ``match`` mapping of a project file or a
manifest entry), never pydantic models: this module must stay importable without pydantic.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

__all__ = [
    "ISA_FEATURES",
    "HostFacts",
    "flag_spellings",
    "isa_summary",
    "match_failures",
    "read_host_facts",
    "required_isa",
]


class HostFacts(NamedTuple):
    """What the match rules look at. Immutable.

    A NamedTuple rather than a dataclass: ``resolve-artifact`` imports this module when it
    detects a host's class, and ``dataclasses`` pulls in ``inspect``, which costs more than the
    rest of the lookup.
    """

    arch: str
    cpu_model: str | None
    cpu_flags: frozenset[str]
    cores: int
    memory_mb: int | None
    providers: frozenset[str] = frozenset()


def _machine() -> str:
    """``platform.machine()`` without importing ``platform`` where ``os.uname`` exists."""
    if hasattr(os, "uname"):
        return os.uname().machine
    import platform

    return platform.machine()


def _parse_cpuinfo(text: str) -> tuple[str | None, set[str]]:
    model: str | None = None
    flags: set[str] = set()
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if not sep:
            continue
        name = name.strip().lower()
        if (
            model is None
            and name in ("model name", "cpu model", "hardware", "processor")
            and (value.strip() and not value.strip().isdigit())
        ):
            model = value.strip()
        elif name in ("flags", "features") and not flags:
            flags = set(value.split())
    return model, flags


def _parse_meminfo(text: str) -> int | None:
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1]) // 1024
    return None


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read(1 << 22)  # /proc files are small; a fake one stays bounded
    except OSError:
        return ""


def read_host_facts(
    proc: str | os.PathLike[str] = "/proc", providers: Iterable[str] = ()
) -> HostFacts:
    """Read this host's facts.

    Args:
        proc: where procfs lives (a test passes a directory with fake ``cpuinfo``/``meminfo``),
            a path or a string.
        providers: execution providers known to be available (the caller probes onnxruntime;
            this module never imports it).

    Returns:
        The facts. Unknown values are ``None`` or empty, never guessed.
    """
    model, flags = _parse_cpuinfo(_read(os.path.join(proc, "cpuinfo")))
    return HostFacts(
        arch=_machine(),
        cpu_model=model,
        cpu_flags=frozenset(flags),
        cores=len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count() or 1,
        memory_mb=_parse_meminfo(_read(os.path.join(proc, "meminfo"))),
        providers=frozenset(providers),
    )


def _canonical(flag: str) -> str:
    """One spelling per CPU flag: lower case, no underscores (avx512_vnni -> avx512vnni)."""
    return flag.strip().lower().replace("_", "")


# CPU flags that change int8/fp16 numerics or kernels, by normalised ISA feature name.
_ISA_FLAGS: dict[str, dict[str, str]] = {
    "x86_64": {
        "avx2": "avx2",
        "avx512f": "avx512f",
        "avx512vnni": "avx512_vnni",
        "avxvnni": "avx_vnni",
        "amxtile": "amx",
        "amxint8": "amx",
        "f16c": "f16c",
    },
    "aarch64": {
        "asimddp": "asimddp",
        "i8mm": "i8mm",
        "sve": "sve",
        "fphp": "fp16",
        "asimdhp": "fp16",
    },
}
ISA_FEATURES: tuple[str, ...] = tuple(
    sorted({name for table in _ISA_FLAGS.values() for name in table.values()})
)
"""Every normalised ISA feature name a match rule may require."""


def isa_summary(arch: str, flags: Iterable[str]) -> list[str]:
    """The ISA features among a host's CPU flags that change int8/fp16 numerics, normalised
    (avx2, avx512f, avx512_vnni, avx_vnni, amx, f16c on x86; asimddp, i8mm, sve, fp16 on ARM),
    sorted. Empty for an architecture it does not know."""
    table = _ISA_FLAGS.get(arch, {})
    return sorted({table[k] for f in flags if (k := _canonical(f)) in table})


def required_isa(rules: Mapping[str, Any]) -> list[str]:
    """The ISA features a class's match rules require: its ``isa`` list and every required CPU
    flag that is an ISA feature, normalised, sorted."""
    arch = rules.get("arch")
    flags = list(rules.get("cpu_flags") or [])
    tables = [_ISA_FLAGS[arch]] if arch in _ISA_FLAGS else list(_ISA_FLAGS.values())
    found = set(rules.get("isa") or [])
    for flag in flags:
        key = _canonical(flag)
        found.update(t[key] for t in tables if key in t)
    return sorted(found)


def flag_spellings(flag: str) -> set[str]:
    """Both spellings of a CPU flag: ``avx512_vnni`` and ``avx512vnni`` name the same feature."""
    return {flag.strip().lower(), _canonical(flag)}


_SEARCHABLE: dict[frozenset[str], frozenset[str]] = {}


def _searchable(flags: frozenset[str]) -> frozenset[str]:
    # The host's flags in both spellings, built once per host rather than once per rule checked
    # (detection checks every class of the manifest); a few hosts' worth kept, as lru_cache(4).
    found = _SEARCHABLE.get(flags)
    if found is None:
        if len(_SEARCHABLE) >= 4:
            _SEARCHABLE.clear()
        found = _SEARCHABLE[flags] = flags | {_canonical(f) for f in flags}
    return found


def _has_flag(flags: frozenset[str], wanted: str) -> bool:
    return bool(flag_spellings(wanted) & _searchable(flags))


def match_failures(facts: HostFacts, rules: Mapping[str, Any]) -> list[str]:
    """Check a host against a class's match rules.

    Args:
        facts: the host.
        rules: the class's ``match`` mapping (keys: arch, cpu_flags, isa, cpu_model, min_cores,
            min_memory_mb, accelerator); missing or null keys are not checked.

    Returns:
        One sentence per failed rule; empty when the host matches.
    """
    failures: list[str] = []
    arch = rules.get("arch")
    if arch and facts.arch != arch:
        failures.append(f"arch: host is {facts.arch}, class needs {arch}")
    missing = [f for f in rules.get("cpu_flags") or [] if not _has_flag(facts.cpu_flags, f)]
    if missing:
        failures.append(f"cpu_flags: host lacks {', '.join(missing)}")
    wanted_isa = rules.get("isa") or []
    if wanted_isa:
        have = set(isa_summary(facts.arch, facts.cpu_flags))
        lacking = [f for f in wanted_isa if f not in have]
        if lacking:
            failures.append(f"isa: host lacks {', '.join(lacking)}")
    model = rules.get("cpu_model")
    if model and (facts.cpu_model is None or model.lower() not in facts.cpu_model.lower()):
        failures.append(f"cpu_model: host CPU is {facts.cpu_model!r}, class needs {model!r}")
    min_cores = rules.get("min_cores")
    if min_cores and facts.cores < min_cores:
        failures.append(f"min_cores: host has {facts.cores} usable cores, class needs {min_cores}")
    min_mem = rules.get("min_memory_mb")
    if min_mem and (facts.memory_mb is None or facts.memory_mb < min_mem):
        failures.append(f"min_memory_mb: host has {facts.memory_mb} MB, class needs {min_mem}")
    accel = rules.get("accelerator")
    if accel and accel not in facts.providers:
        available = ", ".join(sorted(facts.providers)) or "none"
        failures.append(f"accelerator: {accel} is not available (available: {available})")
    return failures
