"""The manifest history section: every version published from the matrix, oldest first, with
when it was published, by whom and why (``qualify manifest history`` says the same in text)."""

from __future__ import annotations

from collections.abc import Sequence

from reports.formatting import publish_reason, published_by, utc_minute
from reports.inputs import Classes, Inputs
from reports.view import ReleaseRow
from schemas.output import ManifestVersion

__all__ = ["build", "release_rows"]


def _row(version: ManifestVersion, shown: int | None) -> ReleaseRow:
    return ReleaseRow(
        version=version.version,
        release=version.release,
        when=utc_minute(version.published_at) if version.published_at else "",
        by=published_by(version),
        why=publish_reason(version),
        by_recorded=version.published_by is not None,
        why_recorded=version.publish_reason is not None,
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
