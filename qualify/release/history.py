"""The release history as people read it: every manifest version the matrix records, and who
published it and why (``qualify manifest history``). Owns reading it from a matrix of any schema
this qualify knows (an older one through a migrated copy in memory, its file untouched) and its
text; the SQL is ``matrix.releases``', the JSON shape ``schemas.output.ManifestHistory``'s."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from matrix.errors import SchemaVersionError
from matrix.store import Store
from qualify.text import one_line
from reports.formatting import publish_reason, published_by
from schemas.output import ManifestVersion

__all__ = ["newest", "read_history", "render_history"]


def read_history(path: Path) -> list[ManifestVersion]:
    """Every manifest version of the matrix at ``path``, oldest first (`Store.manifest_history`).
    Reads only: a matrix an older qualify wrote is read through a migrated copy in memory, so
    that its file stays readable by the qualify that wrote it.

    Raises:
        MatrixError: no matrix there, or not one; SchemaVersionError: a newer qualify wrote it.
    """
    try:
        with Store.open(path, read_only=True) as db:
            return db.manifest_history()
    except SchemaVersionError as error:
        if not error.older:
            raise
    with Store.open_copy(path) as copy:
        return copy.manifest_history()


def _when(value: datetime) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%SZ")


def _line(version: ManifestVersion, published_since: int | None) -> str:
    head = f"v{version.version}  {one_line(version.release)}"
    if version.state == "draft" and published_since is not None:
        return (
            f"{head}  created {_when(version.created)}: a draft, never published: v"
            f"{published_since} was published since (publish refuses it; generate a new one)"
        )
    if version.state != "published" or version.published_at is None:
        what = {
            "draft": "a draft, not published",
            "publishing": "interrupted while published: the next publishing command "
            "completes or discards it",
            "discarded": "discarded: its publication failed or was interrupted before hosts "
            "could read it",
        }.get(version.state, version.state)
        return f"{head}  created {_when(version.created)}: {what}"
    return (
        f"{head}  published {_when(version.published_at)} by {one_line(published_by(version))}: "
        f"{one_line(publish_reason(version))}"
    )


def newest(
    versions: Sequence[ManifestVersion], last: int | None
) -> tuple[list[ManifestVersion], int]:
    """The newest ``last`` of ``versions`` (oldest first; all when ``last`` is None), and how
    many earlier ones that leaves out (``manifest history --last``)."""
    kept = list(versions) if last is None else list(versions[-last:]) if last > 0 else []
    return kept, len(versions) - len(kept)


def render_history(versions: Sequence[ManifestVersion], *, earlier: int = 0) -> str:
    """One line per version, oldest first, after a line saying how many ``earlier`` versions
    were left out; control characters in names spelled out (a name or a reason cannot forge a
    line)."""
    if not versions and not earlier:
        return "no manifest version recorded: qualify manifest generate drafts the first"
    lines: list[str] = []
    published_since: int | None = None  # the newest published version after each one
    for version in reversed(versions):
        lines.append(_line(version, published_since))
        if version.state == "published" and published_since is None:
            published_since = version.version
    lines.reverse()
    if earlier:
        plural = "s" if earlier != 1 else ""
        lines.insert(0, f"({earlier} earlier version{plural} not shown: drop --last to see all)")
    return "\n".join(lines)
