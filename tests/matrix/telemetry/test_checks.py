"""The per-line checks of a telemetry ingest hold the event model's limits (their behaviour on
real files is tested through the ingest, in ``test_ingest``)."""

from __future__ import annotations

import matrix.telemetry.checks as checks


def test_the_limits_mirror_the_event_model() -> None:
    import schemas.telemetry as st_model

    assert checks.TELEMETRY_FORMAT == st_model.TELEMETRY_FORMAT
    assert checks.MAX_TEXT_CHARS == st_model.MAX_TEXT_CHARS
    assert checks.MAX_PROVIDERS == st_model.MAX_PROVIDERS
