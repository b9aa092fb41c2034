"""The telemetry event format's name and size limits, without pydantic.

Owns the constants both readers of an event apply: the model (``schemas.telemetry``) and the
fast ingest path (``matrix.telemetry.checks``), which checks a clean file without importing pydantic.
"""

from __future__ import annotations

__all__ = ["MAX_PROVIDERS", "MAX_TEXT_CHARS", "TELEMETRY_FORMAT"]

TELEMETRY_FORMAT = "qualify-telemetry/1"
"""The ``format`` every event carries."""

MAX_TEXT_CHARS = 256
"""The longest host id, class name, runtime revision, package or provider name an event may
carry: a hostname is at most 64, a DNS name 253; anything longer is a bad line, not a row that
every later query and report has to carry."""

MAX_PROVIDERS = 32
"""The most providers (and node-count entries) one event may list; onnxruntime has ~20."""
