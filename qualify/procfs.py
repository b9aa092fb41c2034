"""Reading a process's memory peak from procfs, with the standard library alone.

Owns ``hwm_kb``. Kept apart from ``qualify.runner`` because the worker calls it at the moment it
reports its own peak: importing the runner there would pull in pydantic and ~150 modules and
inflate the very number being read (the demo fp32 peak read 77 MB instead of 59 MB).
"""

from __future__ import annotations

__all__ = ["hwm_kb"]


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
