"""The errors of the ``matrix`` package; ``qualify.cli`` turns them into messages in one place.

Tree::

    MatrixError                 a user-facing matrix failure; exit code 2
    ├── MatrixLockedError       another process held the database lock for longer than wait_s
    ├── SchemaVersionError      the database was written by a newer qualify (or is not migrated)
    ├── BundleError             a run bundle or its samples are missing, unreadable or inconsistent
    ├── ManifestVersionError    a manifest version is not above the latest stored one
    ├── ModelLineError          a record of another model line than the matrix holds
    └── TelemetryFileError      a telemetry file cannot be read at all

Messages name the file, the field and the fix. Nothing here prints or exits. Owns no I/O.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "BundleError",
    "ManifestVersionError",
    "MatrixError",
    "MatrixLockedError",
    "ModelLineError",
    "SchemaVersionError",
    "TelemetryFileError",
]


class MatrixError(Exception):
    """A matrix failure the user can fix; carries the process exit code."""

    exit_code = 2


class MatrixLockedError(MatrixError):
    """Another process kept the DuckDB file locked for longer than the wait allowed.

    Attributes:
        path: The database file.
        pid: The process holding the lock, when DuckDB named it.
        waited_s: Seconds spent waiting before giving up.
    """

    def __init__(self, message: str, *, path: Path, pid: int | None, waited_s: float) -> None:
        super().__init__(message)
        self.path = path
        self.pid = pid
        self.waited_s = waited_s


class SchemaVersionError(MatrixError):
    """The database schema is newer than this code knows, or too old to read without migrating.

    Attributes:
        found: The schema version the database records (None where it was not read).
        known: The latest version this code knows (None where not said).
    """

    def __init__(self, message: str, *, found: int | None = None, known: int | None = None) -> None:
        super().__init__(message)
        self.found = found
        self.known = known

    @property
    def older(self) -> bool:
        """Whether the database is older than this code (migrating a copy reads it)."""
        return self.found is not None and self.known is not None and self.found < self.known


class BundleError(MatrixError):
    """A run bundle (its files or the objects handed to ``Store.write_run``) is not acceptable.

    Attributes:
        path: The bundle file or directory at fault, when the bundle came from disk.
    """

    def __init__(self, message: str, *, path: Path | None = None) -> None:
        super().__init__(message)
        self.path = path


class ManifestVersionError(MatrixError):
    """A manifest version that is not greater than the latest stored one."""


class TelemetryFileError(MatrixError):
    """A telemetry file cannot be read at all (missing, a directory, unreadable).

    Attributes:
        path: The file.
    """

    def __init__(self, message: str, *, path: Path) -> None:
        super().__init__(message)
        self.path = path


class ModelLineError(MatrixError):
    """A record of another model line than the matrix holds (a project, a bundle, a split), or a
    matrix whose earlier records mix lines and must be split first.

    Attributes:
        path: The matrix file.
        held: The line(s) the matrix holds.
        wanted: The line the caller works on; None for a mixed matrix opened without one.
    """

    def __init__(
        self, message: str, *, path: Path, held: tuple[str, ...], wanted: str | None
    ) -> None:
        super().__init__(message)
        self.path = path
        self.held = held
        self.wanted = wanted
