"""The emulated CPUs numerics can be measured on, and the runtime prepared for another architecture.

Owns the documented table from a class's match rules to a QEMU CPU model (`CPU_MODELS`,
`cpu_for`): the lowest CPU of the class's instruction set, whose kernels onnxruntime picks when
it runs on that CPU under QEMU user-mode emulation, and the models of the document that records a
runtime assembled for another architecture (``runtime.json``, `PreparedRuntime`). Pure data and
pure functions: finding QEMU, preparing and launching are ``qualify.measure.emulators`` and
``qualify.measure.sysroot``.

More: docs/internals.md, ``schemas.emulation``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

from pydantic import Field

from schemas.base import Document

__all__ = [
    "CPU_MODELS",
    "KERNEL_FLAGS",
    "NATIVE",
    "CpuModel",
    "EmulatedCpu",
    "PreparedPiece",
    "PreparedRuntime",
    "cpu_for",
    "kernel_flags",
]

EmulatedCpu = Literal["Nehalem", "SandyBridge", "Haswell", "cortex-a72", "neoverse-n1"]
"""The QEMU CPU models of `CPU_MODELS`."""

NATIVE = "native"
"""``emulation.cpu: native``: never emulate the class's numerics."""


class CpuModel(NamedTuple):
    """One emulated CPU: QEMU's name for it and what it presents to onnxruntime."""

    name: str
    arch: str
    level: str
    """The instruction-set level it stands for, as a person says it."""
    flags: frozenset[str]
    """Its kernel-relevant CPU flags (`KERNEL_FLAGS`), as ``/proc/cpuinfo`` spells them."""
    cpuinfo: str
    """The ``/proc/cpuinfo`` it is shown with (ARM: onnxruntime reads the CPU's identity and
    features there and must see this CPU's, not the host's); empty where CPUID says it."""


def _arm_cpuinfo(features: str, part: str, variant: str, revision: str) -> str:
    # One processor: onnxruntime's thread pool takes its size from the class's provider
    # settings, and cpuinfo needs only that the identity (implementer, part) is consistent.
    return (
        f"processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: {features}\nCPU implementer\t: 0x41\n"
        f"CPU architecture: 8\nCPU variant\t: {variant}\nCPU part\t: {part}\n"
        f"CPU revision\t: {revision}\n\n"
    )


_V2 = frozenset({"sse4_1", "sse4_2", "ssse3", "popcnt"})
_A72 = "fp asimd evtstrm aes pmull sha1 sha2 crc32 cpuid"
_N1 = (
    "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc "
    "dcpop asimddp ssbs"
)

KERNEL_FLAGS: Mapping[str, frozenset[str]] = {
    "x86_64": frozenset(
        {
            *_V2,
            "avx",
            "avx2",
            "fma",
            "f16c",
            "avx512f",
            "avx512bw",
            "avx512vl",
            "avx512_vnni",
            "avx_vnni",
            "avx512_bf16",
            "avx512_fp16",
            "amx_tile",
            "amx_int8",
            "amx_bf16",
        }
    ),
    "aarch64": frozenset(
        {"asimd", "asimddp", "asimdhp", "fphp", "i8mm", "bf16", "sve", "sve2", "svei8mm"}
    ),
}
"""Per architecture, the CPU flags among which onnxruntime's kernels choose: a host whose set
differs from a model's computes other numbers than that model may."""

CPU_MODELS: Mapping[str, CpuModel] = {
    "Nehalem": CpuModel("Nehalem", "x86_64", "x86-64-v2 (SSE4.2)", _V2, ""),
    "SandyBridge": CpuModel("SandyBridge", "x86_64", "x86-64-v2 with AVX", _V2 | {"avx"}, ""),
    "Haswell": CpuModel(
        "Haswell", "x86_64", "x86-64-v3 (AVX2, FMA)", _V2 | {"avx", "avx2", "fma", "f16c"}, ""
    ),
    "cortex-a72": CpuModel(
        "cortex-a72",
        "aarch64",
        "Armv8.0-A (NEON)",
        frozenset({"asimd"}),
        _arm_cpuinfo(_A72, "0xd08", "0x0", "3"),
    ),
    "neoverse-n1": CpuModel(
        "neoverse-n1",
        "aarch64",
        "Armv8.2-A with the dot product (asimddp)",
        frozenset({"asimd", "asimddp", "asimdhp", "fphp"}),
        _arm_cpuinfo(_N1, "0xd0c", "0x3", "1"),
    ),
}
"""QEMU CPU model name -> what it presents. Keys are `EmulatedCpu`'s values."""

_ALIASES = {"avx512vnni": "avx512_vnni", "avxvnni": "avx_vnni", "sse4.2": "sse4_2"}
_NO_MODEL_X86 = ("avx512", "avx_vnni", "amx")
_NO_MODEL_ARM = ("i8mm", "sve", "bf16")


def kernel_flags(arch: str, flags: Any) -> frozenset[str]:
    """The kernel-relevant flags among ``flags`` (any spelling `_ALIASES` knows)."""
    known = KERNEL_FLAGS.get(arch, frozenset())
    found = set()
    for flag in flags:
        name = str(flag).strip().lower()
        name = _ALIASES.get(name, name)
        if name in known:
            found.add(name)
    return frozenset(found)


def _wanted(rules: Mapping[str, Any]) -> set[str]:
    """Every CPU flag and ISA feature the rules require, lower case, one spelling."""
    names = [*(rules.get("cpu_flags") or []), *(rules.get("isa") or [])]
    wanted = set()
    for name in names:
        flag = str(name).strip().lower()
        wanted.add(_ALIASES.get(flag, flag))
    if "fp16" in wanted:
        wanted.add("fphp")
    if "amx" in wanted:
        wanted.add("amx_int8")
    return wanted


def cpu_for(rules: Mapping[str, Any]) -> tuple[str | None, str]:
    """The emulated CPU of a class's match rules: the lowest model in `CPU_MODELS` with every
    instruction-set feature they require, or None and why there is none.

    Args:
        rules: the class's ``match`` mapping (arch, cpu_flags, isa, accelerator, ...).

    Returns:
        ``(model name, how it was chosen)`` or ``(None, why not)``.
    """
    arch = str(rules.get("arch") or "")
    if rules.get("accelerator"):
        return None, (f"the class computes on {rules['accelerator']}; QEMU emulates CPUs only")
    if arch not in KERNEL_FLAGS:
        named = f"architecture {arch!r}" if arch else "no architecture (match.arch)"
        return None, f"the class names {named}; emulated CPUs exist for x86_64 and aarch64"
    wanted = _wanted(rules)
    beyond = sorted(
        w for w in wanted if w.startswith(_NO_MODEL_X86 if arch == "x86_64" else _NO_MODEL_ARM)
    )
    if beyond:
        why = (
            "QEMU's TCG does not implement them"
            if arch == "x86_64"
            else "onnxruntime computed wrong int8 numbers on QEMU's only CPU with them ('max')"
        )
        return None, f"no emulated CPU has {', '.join(beyond)}: {why}"
    relevant = wanted & KERNEL_FLAGS[arch]
    for model in CPU_MODELS.values():  # lowest first within each architecture
        if model.arch == arch and relevant <= model.flags:
            if arch == "x86_64" and not relevant:
                break
            return model.name, f"the lowest emulated CPU with {_listed(relevant, arch)}"
    return None, (
        "the class requires no instruction-set feature, so hosts of any x86-64 level belong "
        "to it; set emulation.cpu to the level to measure"
    )


def _listed(flags: frozenset[str] | set[str], arch: str) -> str:
    return ", ".join(sorted(flags)) if flags else f"the {arch} baseline"


class PreparedPiece(Document):
    """One downloaded file a prepared runtime was assembled from."""

    file: str = Field(description="Its file name, as the registry served it.")
    source: Literal["debian", "pypi"] = Field(description="The registry it came from.")
    name: str = Field(description="Package name.")
    version: str = Field(description="Package version.")
    sha256: str = Field(
        pattern=r"^[0-9a-f]{64}$", description="hex sha256 of the file as downloaded."
    )


class PreparedRuntime(Document):
    """``runtime.json`` of a runtime assembled for another architecture (``qualify emulators
    prepare``): a Debian sysroot with its Python, and onnxruntime and numpy from PyPI."""

    format: Literal["qualify-emulator-runtime/1"] = Field(description="Format version.")
    arch: str = Field(description="The architecture it runs on, e.g. aarch64.")
    python: str = Field(description="The Python version of its interpreter, e.g. 3.11.")
    onnxruntime: str = Field(description="The onnxruntime version in it, e.g. 1.32.0.")
    numpy: str = Field(description="The numpy version in it.")
    debian_suite: str = Field(description="The Debian suite its packages came from.")
    pieces: list[PreparedPiece] = Field(description="Every downloaded file, with its digest.")
    tree_sha256: str = Field(
        pattern=r"^[0-9a-f]{64}$",
        description="hex sha256 over every file of the assembled tree (relative path, kind and "
        "content, in path order): checked before each use, so a runtime changed or cut short "
        "since it was prepared is refused.",
    )
    prepared_at: str = Field(description="When it was assembled (UTC, ISO 8601).")
    qualify_version: str = Field(description="The qualify that assembled it.")
