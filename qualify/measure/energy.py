"""Energy counters of the measuring host: Linux powercap (Intel RAPL and AMD's RAPL driver)
and, for a class served on an NVIDIA GPU, that GPU's NVML counter.

Owns finding the readable energy domains (``/sys/class/powercap/<zone>/energy_uj``: the package,
and DRAM where the platform exposes it; ``nvmlDeviceGetTotalEnergyConsumption`` for the GPU the
session runs on), reading them around a timed loop, and turning two readings into joules with
wrap-around handled (``max_energy_range_uj``; NVML's 64-bit millijoule count does not wrap, and
one that goes backwards, a driver reload, gives no figure). Imported inside the measuring
subprocess, so standard library only (NVML through ctypes). Does not attribute energy to a
process: a package or GPU counter counts the whole device, so the figure is honest only on a
host measuring alone (the host-wide measurement lock, `qualify.measure.hostlock`), and says which
counters it read.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

__all__ = [
    "GPU_PROVIDERS",
    "NVML_LIBRARY",
    "POWERCAP",
    "Domain",
    "EnergyReading",
    "discover",
    "energy_between",
    "gpu_domains",
    "read",
]

GPU_PROVIDERS = ("CUDAExecutionProvider", "TensorrtExecutionProvider")
"""Execution providers that run on an NVIDIA GPU: a class expecting one has its GPU's energy
counted beside the host's (its ``device_id`` provider option says which GPU, default 0)."""

NVML_LIBRARY = "libnvidia-ml.so.1"
"""The NVML library the NVIDIA driver installs."""

_NVML_NOT_SUPPORTED = 3
"""``NVML_ERROR_NOT_SUPPORTED``: a GPU older than Volta has no energy counter."""

POWERCAP = Path("/sys/class/powercap")
"""Where Linux exposes powercap zones."""

_MAX_TEXT = 64
"""The longest counter or name file read (a number or a short name)."""


@dataclass(frozen=True)
class Domain:
    """One readable energy counter."""

    zone: str
    """The zone's folder name, e.g. ``intel-rapl:0`` or ``intel-rapl:0:0``; ``nvml:0`` for a
    GPU."""
    name: str
    """Its own name, e.g. ``package-0``, ``dram`` or the GPU's model name."""
    range_uj: int
    """``max_energy_range_uj``: the counter wraps to 0 past it; 0 for one that never wraps."""
    read_uj: Callable[[], int] = field(compare=False, repr=False)
    """The counter now, µJ; OSError or ValueError when it cannot be read."""

    @property
    def label(self) -> str:
        return f"{self.zone} ({self.name})"


@dataclass(frozen=True)
class EnergyReading:
    """What the counters said over one stretch: joules per domain, or why there are none."""

    joules: dict[str, float] | None
    """Domain label -> joules; None when nothing could be read."""
    missing: str | None
    """Why there is no figure (None when there is one)."""


def _read_int(path: Path) -> int:
    """A counter file's non-negative integer; ValueError for anything else (sysfs is trusted no
    more than any other input: a garbled or overlong value is no reading)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        raw = os.read(fd, _MAX_TEXT + 1)
    finally:
        os.close(fd)
    text = raw.strip()
    if len(raw) > _MAX_TEXT or not text.isdigit():
        raise ValueError(f"{path}: not a counter value: {raw[:20]!r}")
    return int(text)


def _read_name(path: Path) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            raw = os.read(fd, _MAX_TEXT)
        finally:
            os.close(fd)
    except OSError:
        return "?"
    name = raw.decode("ascii", errors="replace").strip()
    return "".join(c if c.isalnum() or c in "-_." else "?" for c in name) or "?"


def discover(
    root: Path = POWERCAP,
    *,
    gpu: int | None = None,
    nvml: Callable[[str], Any] = ctypes.CDLL,
    environ: Mapping[str, str] = os.environ,
) -> tuple[list[Domain], str | None]:
    """The energy domains this process can read, and why there are none when so.

    Package zones (``<vendor>-rapl:N``) and their DRAM subzones (``name`` ``dram``) are kept;
    core and uncore subzones are left out, because the package already counts them (summing
    them would count their energy twice). With ``gpu`` (the CUDA device the session runs on),
    that GPU's counter is added (`gpu_domains`); a GPU class whose GPU cannot be read has no
    figure at all, since the host's counters alone would leave out most of the energy.
    """
    host, missing = _powercap(root)
    if gpu is None:
        return host, missing
    card, why = gpu_domains(gpu, nvml=nvml, environ=environ)
    if not card:
        return [], why
    return host + card, None


def gpu_domains(
    device: int,
    *,
    nvml: Callable[[str], Any] = ctypes.CDLL,
    environ: Mapping[str, str] = os.environ,
) -> tuple[list[Domain], str | None]:
    """The NVML energy counter of CUDA device ``device``, and why there is none when so.

    ``device`` counts the GPUs CUDA sees: with ``CUDA_VISIBLE_DEVICES`` it is a position in
    that list (an index or a ``GPU-...`` UUID), which NVML, counting every GPU, is asked for.
    """
    try:
        lib = nvml(NVML_LIBRARY)
    except OSError:
        return [], f"no NVML on this host ({NVML_LIBRARY} cannot be loaded): no GPU energy"
    rc = lib.nvmlInit_v2()
    if rc != 0:
        return [], f"NVML did not start (nvmlInit_v2 returned {rc}): no GPU energy"
    handle = ctypes.c_void_p()
    visible = [v.strip() for v in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if "CUDA_VISIBLE_DEVICES" in environ and device >= len(visible):
        return [], f"CUDA device {device} is not in CUDA_VISIBLE_DEVICES ({len(visible)} listed)"
    which = visible[device] if visible else str(device)
    if which.isdigit():
        rc = lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(int(which)), ctypes.byref(handle))
    else:
        rc = lib.nvmlDeviceGetHandleByUUID(which.encode()[:96], ctypes.byref(handle))
    if rc != 0:
        return [], f"NVML has no GPU {which[:64]!r} (returned {rc}): no GPU energy"
    name = ctypes.create_string_buffer(96)
    named = lib.nvmlDeviceGetName(handle, name, ctypes.c_uint(96)) == 0
    label = name.value.decode("ascii", errors="replace") if named else "?"
    label = "".join(c if c.isalnum() or c in " -_." else "?" for c in label)[:64] or "?"
    read_uj = partial(_nvml_uj, lib, handle)
    try:
        read_uj()
    except OSError as exc:
        if exc.errno == _NVML_NOT_SUPPORTED:
            return [], f"GPU {which[:64]} ({label}) has no energy counter (NVML: not supported)"
        return [], f"GPU {which[:64]} ({label}): its energy counter cannot be read ({exc})"
    return [Domain(f"nvml:{which[:64]}", label, 0, read_uj)], None


def _nvml_uj(lib: Any, handle: ctypes.c_void_p) -> int:
    """A GPU's energy since the driver loaded, µJ (NVML counts millijoules)."""
    mj = ctypes.c_ulonglong()
    rc = lib.nvmlDeviceGetTotalEnergyConsumption(handle, ctypes.byref(mj))
    if rc != 0:
        raise OSError(rc, f"nvmlDeviceGetTotalEnergyConsumption returned {rc}")
    return int(mj.value) * 1000


def _powercap(root: Path) -> tuple[list[Domain], str | None]:
    """The readable RAPL package and DRAM counters under ``root``."""
    if not root.is_dir():
        return [], f"no powercap counters on this host ({root} does not exist)"
    found: list[Domain] = []
    denied: list[str] = []
    for zone in sorted(root.iterdir()):
        if "-rapl:" not in zone.name or zone.name.count(":") > 2:
            continue
        name = _read_name(zone / "name")
        subzone = zone.name.count(":") == 2
        if subzone and name != "dram":
            continue
        try:
            _read_int(zone / "energy_uj")
            limit = _read_int(zone / "max_energy_range_uj")
        except PermissionError:
            denied.append(zone.name)
            continue
        except (OSError, ValueError):
            continue
        if limit > 0:
            found.append(Domain(zone.name, name, limit, partial(_read_int, zone / "energy_uj")))
    if found:
        return found, None
    if denied:
        return [], (
            f"the powercap counters ({', '.join(denied)}) are readable by root only (Linux "
            "restricts energy_uj since CVE-2020-8694); run as root or grant read access"
        )
    return [], f"no readable RAPL package counter under {root}"


def read(domains: list[Domain]) -> dict[str, int] | None:
    """Every domain's counter now (µJ); None if one of them cannot be read."""
    try:
        return {d.label: d.read_uj() for d in domains}
    except (OSError, ValueError):
        return None


def energy_between(
    domains: list[Domain], before: dict[str, int] | None, after: dict[str, int] | None
) -> EnergyReading:
    """Joules per domain between two readings, a counter that wrapped once counted across the
    wrap (a stretch long enough to wrap twice is not one a round takes)."""
    if not domains:
        return EnergyReading(None, "no energy counters were found")
    if before is None or after is None:
        return EnergyReading(None, "an energy counter could not be read during the round")
    joules: dict[str, float] = {}
    for d in domains:
        spent = after[d.label] - before[d.label]
        if spent < 0 and not d.range_uj:
            return EnergyReading(None, f"the {d.label} counter went backwards during the round")
        if spent < 0:
            spent += d.range_uj
        joules[d.label] = spent / 1e6
    return EnergyReading(joules, None)
