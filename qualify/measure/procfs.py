"""Reading a process's memory peak and the host's CPU time split from procfs, with the standard
library alone.

Owns ``hwm_kb`` and ``cpu_times``. Kept apart from ``qualify.measure.runner`` because the worker calls it at the moment it
reports its own peak: importing the runner there would pull in pydantic and ~150 modules and
inflate the very number being read (the demo fp32 peak read 77 MB instead of 59 MB).
"""

from __future__ import annotations

__all__ = ["cpu_times", "hwm_kb", "reset_hwm"]


def hwm_kb(pid: int | str = "self") -> int | None:
    """``VmHWM`` (peak resident set of the current memory image) of a process, in KiB.

    Returns:
        The peak in KiB, or None where procfs is missing or unreadable.
    """
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def reset_hwm() -> bool:
    """Reset this process's ``VmHWM`` to its current RSS (``echo 5 > /proc/self/clear_refs``,
    Linux 4.0+), so that a later read sees only peaks from now on.

    Returns:
        True if the kernel took it.
    """
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
    except OSError:
        return False
    return True


def cpu_times() -> tuple[int, int] | None:
    """``(total, steal)`` CPU time of the whole host in clock ticks since boot, from the first
    line of ``/proc/stat``; the steal share of an interval is the ratio of the differences.

    Returns:
        The two counters, or None where ``/proc/stat`` is missing or has no steal column
        (kernels before 2.6.11).
    """
    try:
        with open("/proc/stat", encoding="ascii", errors="replace") as fh:
            fields = fh.readline().split()
    except OSError:
        return None
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    try:
        # user nice system idle iowait irq softirq steal [guest guest_nice]: guest time is
        # already counted in user and nice, so it is left out of the total.
        ticks = [int(x) for x in fields[1:9]]
    except ValueError:
        return None
    return sum(ticks), ticks[7]
