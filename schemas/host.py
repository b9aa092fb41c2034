"""The host fingerprint: what a qualification run was measured on.

Owns the model only; ``qualify.measure.fingerprint`` reads the host and fills it in.
"""

from __future__ import annotations

from pydantic import Field

from schemas.base import Document

__all__ = ["EpDevice", "Fingerprint", "RuntimeIdentity"]


class EpDevice(Document):
    """One (execution provider, device) pair from ``onnxruntime.get_ep_devices()``."""

    ep_name: str = Field(description="Execution provider name.")
    ep_vendor: str = Field(default="", description="Provider vendor.")
    device_type: str = Field(default="", description="CPU, GPU or NPU.")
    device_vendor: str = Field(default="", description="Device vendor.")


class RuntimeIdentity(Document):
    """The onnxruntime the host actually has, as probed in a subprocess."""

    package: str | None = Field(
        description="Installed distribution (onnxruntime, onnxruntime-gpu, ...)."
    )
    version: str = Field(description="onnxruntime.__version__.")
    build_info: str | None = Field(description="onnxruntime.get_build_info(), null if not offered.")
    available_providers: list[str] = Field(description="onnxruntime.get_available_providers().")
    ep_devices: list[EpDevice] = Field(
        default_factory=list, description="onnxruntime.get_ep_devices(); empty if not offered."
    )


class Fingerprint(Document):
    """Identity of the host a run was measured on."""

    hostname: str = Field(description="Host name.")
    arch: str = Field(description="Machine architecture (platform.machine()).")
    cpu_model: str | None = Field(description="CPU model name from /proc/cpuinfo; null if unknown.")
    cpu_flags: list[str] = Field(description="CPU flags (x86 'flags' or ARM 'Features'), sorted.")
    isa: list[str] = Field(
        default_factory=list,
        description="The ISA features among the flags that change int8/fp16 numerics, normalised "
        "(manifest.hostmatch.isa_summary); empty in fingerprints older than this field.",
    )
    cores: int = Field(description="Logical CPUs (os.cpu_count()).")
    affinity: list[int] = Field(description="CPUs this process may run on.")
    numa_nodes: dict[str, list[int]] = Field(
        default_factory=dict,
        description="NUMA node -> its CPUs, from /sys/devices/system/node; empty where the host "
        "does not say (and in fingerprints older than this field).",
    )
    memory_mb: int | None = Field(description="Total memory from /proc/meminfo; null if unknown.")
    os: str = Field(description="Operating system and kernel release.")
    python: str = Field(description="Python version.")
    runtime: RuntimeIdentity = Field(description="The onnxruntime on this host.")
