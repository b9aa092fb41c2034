"""The errors of the ``qualify`` package, turned into CLI messages in one place (``qualify.cli``).

Tree::

    QualifyError            a user-facing failure; exit code 2 unless said otherwise
    ├── ProjectError        the project file is missing, unreadable or invalid
    ├── HostMismatchError   the host does not match the class and --emulate was not given
    ├── ArtifactError       an artifact file is missing or its bytes do not match its digest
    └── ConversionError     qualify candidates could not make a variant (qualify.candidates.convert)

Messages name the file, the field and the fix. Nothing here prints or exits.
"""

from __future__ import annotations

__all__ = ["ArtifactError", "HostMismatchError", "ProjectError", "QualifyError"]


class QualifyError(Exception):
    """A failure the user can fix; carries the process exit code."""

    exit_code = 2


class ProjectError(QualifyError):
    """The project file is missing, unreadable or invalid."""


class HostMismatchError(QualifyError):
    """The host does not match the class's rules."""


class ArtifactError(QualifyError):
    """An artifact is missing or does not match its digest."""
