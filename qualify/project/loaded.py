"""A validated project file with the folder its relative paths are resolved against.

Owns `LoadedProject` alone, so that what loads a project (``qualify.project.load``) and what
checks a loaded one (``qualify.project.checks``) both import it without importing each other.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from schemas.project import Project

__all__ = ["LoadedProject"]


@dataclass(frozen=True)
class LoadedProject:
    """A validated project file and the folder its relative paths are resolved against."""

    path: Path
    """The project file, absolute."""
    root: Path
    """The folder of the project file, absolute."""
    project: Project
    """The validated project."""
    sha256: str | None = None
    """Hex sha256 of the exact bytes validated (None for a project built in code): the key a
    writer records the project's view under (`qualify.project.view`)."""

    def resolve(self, relpath: str | os.PathLike[str]) -> Path:
        """Resolve a path written in the project file.

        Args:
            relpath: A path as written in the file; relative paths are relative to the folder of
                the project file (never the current directory), absolute paths are kept.

        Returns:
            An absolute path (symbolic links are not resolved).
        """
        candidate = Path(relpath)
        return candidate if candidate.is_absolute() else self.root / candidate
