"""Compatibility alias of ``manifest.host_events``, kept for hosts that already import it.

Deployed serving processes were told to call ``manifest.telemetry.record_session``; this module
keeps that import path working by re-exporting the public names of ``manifest.host_events``
(the same objects, not copies). It owns nothing: new code imports ``manifest.host_events``.
Standard library only, like the module it aliases.
"""

from __future__ import annotations

from manifest.host_events import (
    FORMAT,
    PLACEMENT_OPTION,
    append_event,
    cohort_fields,
    encode_event,
    event_from_resolution,
    format_time,
    host_id,
    placement_of,
    record_session,
    session_settings,
)

__all__ = [
    "FORMAT",
    "PLACEMENT_OPTION",
    "append_event",
    "cohort_fields",
    "encode_event",
    "event_from_resolution",
    "format_time",
    "host_id",
    "placement_of",
    "record_session",
    "session_settings",
]
