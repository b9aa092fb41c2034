"""What ``matrix show`` reads of a project file for a matrix with nothing measured, and where it
finds it without validating again. (Once the matrix holds cells, ``matrix show`` judges them under
the whole project file, ``qualify.release.current``: a view does not carry budgets, tolerances or the
artifacts' bytes.)

Owns `ProjectView`: the classes (name, key, settings digest, p99 budget) and artifact labels of
a validated project file, as plain data that needs neither pydantic nor YAML, and its record in
the matrix. A command that writes the matrix after validating the project file records the view
under `view_key`: the digest of the exact bytes it validated and of the project schema the code
validates against (``schemas/project.schema.json``), so that neither an edited file nor another
version of qualify ever finds a view it did not make. ``matrix show`` hashes the file, and only
when the matrix has no view for those bytes validates the file in full. A view read from the
matrix is checked field by field (`ProjectView.from_json`); anything unexpected is a miss, never
an error or a wrong answer.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from schemas.atomic import read_bounded

if TYPE_CHECKING:
    from matrix.store import Store
    from schemas.project import Project

__all__ = [
    "MAX_PROJECT_BYTES",
    "VIEW_FORMAT",
    "ClassView",
    "ProjectView",
    "record_view",
    "recorded_view",
    "view_key",
]

MAX_PROJECT_BYTES = 1024 * 1024
"""Largest project file read (a real one is a few kilobytes)."""

_SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "project.schema.json"
"""The published project schema, generated from the models and checked for drift by a test: its
digest changes whenever what validates a project file does."""

VIEW_FORMAT = "qualify-project-view/1"
"""Bumped whenever what a view holds, or how a field of it is computed, changes: a view of
another format is never used (the project file is validated again instead)."""

MAX_VIEW_CLASSES = 1_000_000
"""More classes than any project file can hold (its size is bounded): a view that claims more
is not one this code wrote."""


@dataclass(frozen=True)
class ClassView:
    """One host class as coverage and ``matrix show`` see it."""

    name: str
    key: tuple[str, str, str]
    settings_digest: str
    p99_budget_ms: float


@dataclass(frozen=True)
class ProjectView:
    """The classes (in the file's order) and artifacts (baseline first) of a validated project."""

    classes: tuple[ClassView, ...]
    artifacts: tuple[tuple[str, str], ...]
    """(role, label) per artifact: ``baseline`` first, then each ``candidate``."""

    @classmethod
    def of(cls, project: Project) -> ProjectView:
        """The view of a validated project file."""
        return cls(
            classes=tuple(
                ClassView(name, c.key.as_tuple(), c.settings_digest(), c.budgets.p99_ms)
                for name, c in project.host_classes.items()
            ),
            artifacts=(
                ("baseline", project.artifacts.baseline.label),
                *(("candidate", c.label) for c in project.artifacts.candidates),
            ),
        )

    def budgets(self) -> dict[str, float]:
        """p99 budget per class name."""
        return {c.name: c.p99_budget_ms for c in self.classes}

    def to_json(self) -> str:
        """The view as the matrix records it (`from_json` reads it back)."""
        return json.dumps(
            {
                "format": VIEW_FORMAT,
                "classes": [
                    [c.name, list(c.key), c.settings_digest, c.p99_budget_ms] for c in self.classes
                ],
                "artifacts": [list(a) for a in self.artifacts],
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> ProjectView | None:
        """A view `to_json` wrote; None for anything else (another format, a damaged or edited
        record), so that the caller validates the project file instead of trusting it."""
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError):
            return None
        if not isinstance(doc, dict) or doc.get("format") != VIEW_FORMAT:
            return None
        raw_classes, raw_artifacts = doc.get("classes"), doc.get("artifacts")
        if not isinstance(raw_classes, list) or not isinstance(raw_artifacts, list):
            return None
        if len(raw_classes) > MAX_VIEW_CLASSES or not raw_artifacts:
            return None
        classes = [_class_view(item) for item in raw_classes]
        artifacts = [_artifact_view(item) for item in raw_artifacts]
        if any(c is None for c in classes) or any(a is None for a in artifacts):
            return None
        if artifacts[0] is None or artifacts[0][0] != "baseline":
            return None
        return cls(
            classes=tuple(c for c in classes if c is not None),
            artifacts=tuple(a for a in artifacts if a is not None),
        )


def _is_text(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value) <= 4096


def _class_view(item: object) -> ClassView | None:
    if not isinstance(item, list) or len(item) != 4:
        return None
    name, key, digest, budget = item
    if not (_is_text(name) and _is_text(digest) and isinstance(key, list) and len(key) == 3):
        return None
    if not all(_is_text(k) for k in key):
        return None
    if isinstance(budget, bool) or not isinstance(budget, int | float):
        return None
    if not (math.isfinite(budget) and budget > 0):
        return None
    return ClassView(name, (key[0], key[1], key[2]), digest, float(budget))


def _artifact_view(item: object) -> tuple[str, str] | None:
    if not isinstance(item, list) or len(item) != 2:
        return None
    role, label = item
    if role not in ("baseline", "candidate") or not _is_text(label):
        return None
    return (role, label)


def _schema_tag() -> str:
    try:
        return hashlib.sha256(_SCHEMA.read_bytes()).hexdigest()[:16]
    except OSError:  # an install without the schema file: views can still be told apart
        return "no-schema"


def view_key(project_sha256: str) -> str:
    """The key of the view of a project file whose bytes have this sha256 (hex)."""
    return f"{VIEW_FORMAT} schema:{_schema_tag()} sha256:{project_sha256}"


def record_view(db: Store, project: Project, project_sha256: str | None) -> bool:
    """Record the view of a project file a writer just validated (no-op without its digest).

    Returns:
        Whether it was recorded. A view only spares ``matrix show`` a validation, so a matrix
        that refuses it (read-only, damaged) fails nothing: show validates the file instead.
    """
    if project_sha256 is None:
        return False
    from matrix.errors import MatrixError

    try:
        db.record_project_view(view_key(project_sha256), ProjectView.of(project).to_json())
    except MatrixError:
        return False
    return True


def recorded_view(db: Store, path: Path) -> ProjectView | None:
    """The view a writer recorded for the project file at ``path`` as its bytes are now, or
    None: no such record, or a file that cannot be read or is too large (the loader, which the
    caller runs instead, says what is wrong with it)."""
    try:
        data = read_bounded(path, MAX_PROJECT_BYTES)
    except OSError:
        return None
    if len(data) > MAX_PROJECT_BYTES:
        return None
    text = db.project_view(view_key(hashlib.sha256(data).hexdigest()))
    return ProjectView.from_json(text) if text is not None else None
