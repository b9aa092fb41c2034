"""Energy counters of the measuring host: Linux powercap (Intel RAPL and AMD's RAPL driver).

Owns finding the readable energy domains (``/sys/class/powercap/<zone>/energy_uj``: the package,
and DRAM where the platform exposes it), reading them around a timed loop, and turning two
readings into joules with wrap-around handled (``max_energy_range_uj``). Imported inside the
measuring subprocess, so standard library only. Does not attribute energy to a process: a
package counter counts the whole socket, so the figure is honest only on a host measuring
alone (the host-wide measurement lock, `qualify.hostlock`), and says which counters it read.

NVIDIA GPUs (NVML) are not read yet: a GPU's energy stays ``null`` with that reason.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["POWERCAP", "Domain", "EnergyReading", "discover", "energy_between", "read"]

POWERCAP = Path("/sys/class/powercap")
"""Where Linux exposes powercap zones."""

_MAX_TEXT = 64
"""The longest counter or name file read (a number or a short name)."""


@dataclass(frozen=True)
class Domain:
    """One readable energy counter."""

    zone: str
    """The zone's folder name, e.g. ``intel-rapl:0`` or ``intel-rapl:0:0``."""
    name: str
    """Its own name, e.g. ``package-0`` or ``dram``."""
    path: Path
    """Its ``energy_uj`` file."""
    range_uj: int
    """``max_energy_range_uj``: the counter wraps to 0 past it."""

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


def discover(root: Path = POWERCAP) -> tuple[list[Domain], str | None]:
    """The energy domains this process can read, and why there are none when so.

    Package zones (``<vendor>-rapl:N``) and their DRAM subzones (``name`` ``dram``) are kept;
    core and uncore subzones are left out, because the package already counts them (summing
    them would count their energy twice).
    """
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
            found.append(Domain(zone.name, name, zone / "energy_uj", limit))
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
        return {d.label: _read_int(d.path) for d in domains}
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
        if spent < 0:
            spent += d.range_uj
        joules[d.label] = spent / 1e6
    return EnergyReading(joules, None)
