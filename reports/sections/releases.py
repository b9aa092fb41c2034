"""The manifest history section: every version published from the matrix, oldest first, with
when it was published, by whom and why (``qualify manifest history`` says the same in text)."""

from __future__ import annotations

from collections.abc import Sequence

from reports.formatting import utc_minute
from reports.inputs import Classes, Inputs
from reports.view import ReleaseRow
from schemas.output import ManifestVersion

__all__ = ["NOT_RECORDED", "build", "release_rows"]

NOT_RECORDED = "not recorded"
"""What a version published before the matrix recorded who and why says in their place: never
a name or a reason made up for it."""


def _row(version: ManifestVersion, shown: int | None) -> ReleaseRow:
    why = version.publish_reason
    return ReleaseRow(
        version=version.version,
        release=version.release,
        when=utc_minute(version.published_at) if version.published_at else "",
        by=version.published_by if version.published_by is not None else NOT_RECORDED,
        why=NOT_RECORDED if why is None else why or "none given",
        by_recorded=version.published_by is not None,
        why_recorded=why is not None,
        shown=version.version == shown,
    )


def release_rows(versions: Sequence[ManifestVersion], shown: int | None) -> tuple[ReleaseRow, ...]:
    """The published versions, oldest first (drafts and discarded publications never reached
    a host); ``shown``: the version the page reports on."""
    return tuple(_row(v, shown) for v in versions if v.state == "published")


def build(inputs: Inputs, classes: Classes) -> tuple[ReleaseRow, ...] | None:
    """Shown when some version was published from the matrix."""
    shown = inputs.current.version if inputs.current is not None else None
    return release_rows(inputs.releases, shown) or None
