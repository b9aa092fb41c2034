"""Fixtures of the report tests: the scripted fleet and its rendered page (built once)."""

from __future__ import annotations

import pytest

from reports import ReportView, build_report, render_report
from tests.reports.factories import CLOCK, VERSION, scripted_fleet, scripted_history


@pytest.fixture(scope="session")
def golden_view() -> ReportView:
    """The golden report's view: five classes, a manifest, a previous manifest, a staged
    rollout with a pinned class, two published manifest versions (one from before the matrix
    recorded who published it), a tune and a made candidate's lineage."""
    fleet, current, previous = scripted_fleet()
    history = scripted_history(fleet)
    return build_report(
        fleet.project,
        fleet.cells,
        fleet.runs,
        fleet.samples,
        now=CLOCK,
        tool_version=VERSION,
        snapshot=fleet.snapshot,
        manifest=current,
        signature_status="verified: keyid 3b1f0c",
        manifest_source="./manifest.json (what hosts get)",
        previous=previous,
        rollouts=history.rollouts,
        releases=history.releases,
        steering=history.steering,
        tunes=history.tunes,
        lineage=history.lineage,
    )


@pytest.fixture(scope="session")
def golden_html(golden_view: ReportView) -> str:
    """The golden report, rendered."""
    return render_report(golden_view)
