"""The lineage section: how every candidate ``qualify candidates`` made was derived."""

from __future__ import annotations

import json
from collections.abc import Mapping

from reports.formatting import short_digest
from reports.inputs import Classes, Inputs
from reports.view import LineageRow
from schemas.lineage import Lineage

__all__ = ["build", "lineage_rows"]


def lineage_rows(lineage: Mapping[str, Lineage]) -> tuple[LineageRow, ...]:
    """Every made candidate, by name."""
    rows = []
    for item in sorted(lineage.values(), key=lambda i: (i.name, i.artifact_digest)):
        rows.append(
            LineageRow(
                name=item.name,
                digest=item.artifact_digest,
                precision=item.precision,
                parent=f"{item.parent_name} ({short_digest(item.parent_digest)})",
                tool=f"{item.tool} {item.tool_version}",
                params=", ".join(
                    f"{k}={v if isinstance(v, str | int | float | bool) else json.dumps(v)}"
                    for k, v in sorted(item.params.items())
                ),
                calibration=item.calibration_digest or "none",
                note=item.note or "",
            )
        )
    return tuple(rows)


def build(inputs: Inputs, classes: Classes) -> tuple[LineageRow, ...] | None:
    """Shown when qualify made some candidate."""
    return lineage_rows(inputs.lineage) or None
