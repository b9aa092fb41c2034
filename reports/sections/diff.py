"""The diff section: what changed for each class from the previous manifest to this one."""

from __future__ import annotations

from collections.abc import Mapping

from manifest.diff import diff_manifests
from reports.formatting import short_digest
from reports.inputs import Classes, Inputs
from reports.sections.classes import reason_views
from reports.view import DiffRow, DiffView
from schemas.manifest import DECISION_REASON_CODES, ChangeSide, Manifest, ManifestSigned

__all__ = ["build"]


def _side_text(side: ChangeSide | None) -> str:
    if side is None:
        return "absent"
    if side.decision == "hold":
        return "hold"
    return f"{side.decision} {side.artifact_name} ({short_digest(side.artifact_digest)})"


def _diff(
    previous: ManifestSigned, current: ManifestSigned, anchors: Mapping[str, str]
) -> DiffView:
    changes = diff_manifests(
        Manifest(signed=previous, signatures=[]), Manifest(signed=current, signatures=[])
    )
    rows = tuple(
        DiffRow(
            host_class=ch.host_class,
            anchor=anchors.get(ch.host_class),
            change=ch.change,
            before=_side_text(ch.before),
            after=_side_text(ch.after),
            fields=", ".join(ch.fields),
            summary=ch.summary,
            reasons=reason_views(ch.reasons, DECISION_REASON_CODES),
        )
        for ch in changes
    )
    return DiffView(
        previous_text=f"{previous.release} version {previous.version} ({previous.created})",
        current_text=f"{current.release} version {current.version} ({current.created})",
        rows=rows,
    )


def build(inputs: Inputs, classes: Classes) -> DiffView | None:
    """Shown when both the manifest and the one published before it are given."""
    if inputs.previous is None or inputs.current is None:
        return None
    return _diff(inputs.previous, inputs.current, {v.name: v.anchor for v in classes.views})
