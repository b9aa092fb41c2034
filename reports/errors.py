"""The report package's errors; the CLI turns them into a message and exit code 2.

::

    ReportError
    └── ReportWriteError   the page could not be written (folder missing, not writable)
"""

from __future__ import annotations

__all__ = ["ReportError", "ReportWriteError"]


class ReportError(Exception):
    """Base of every error this package raises on purpose."""


class ReportWriteError(ReportError):
    """The report could not be written; the message names the path and the fix."""
