"""Telemetry from deployed hosts, the alerts a check raises on it, and re-qualification items.

Owns the models only: ``TelemetryEvent`` (one JSON line a host appends; published as
``telemetry-event.schema.json``), ``Alert``, ``ClassState`` and ``TelemetryCheck`` (what
``qualify telemetry check`` prints) and ``StaleItem`` (what ``qualify matrix stale`` prints).
Hosts write events with ``manifest.host_events`` (standard library only, so it does not import
this module: the schema file and a test keep the two in step); ``matrix.telemetry.ingest``
stores them; ``qualify.telemetry.check`` judges them and ``qualify.telemetry.staleness`` lists
what to re-run.

An event line looks like::

    {"format": "qualify-telemetry/1", "time": "2025-06-01T12:00:00.123Z", "source": "session",
     "host_id": "web-0042", "host_class": "x86-v4", "model_digest": "sha256:...",
     "runtime_revision": "1.32.0", "runtime_package": "onnxruntime",
     "providers": ["CPUExecutionProvider"], "placement": "actual",
     "nodes_per_provider": {"CPUExecutionProvider": 12}, "fallback_nodes": 0,
     "latency_ms": 3.412, "manifest_version": 7, "decision": "candidate", "model": "ocr-rec"}
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, ConfigDict, Field, field_validator

from schemas.base import Digest, Document
from schemas.settings import MAX_SETTINGS_CHARS, decode_settings
from schemas.telemetry_format import MAX_PROVIDERS, MAX_TEXT_CHARS, TELEMETRY_FORMAT

__all__ = [
    "ALERT_KINDS",
    "MAX_PROVIDERS",
    "MAX_TEXT_CHARS",
    "STALE_REASONS",
    "TELEMETRY_FORMAT",
    "Alert",
    "AlertKind",
    "CheckSettings",
    "ClassState",
    "ClassStateName",
    "LaggingHosts",
    "Placement",
    "Severity",
    "SkippedEvents",
    "StaleItem",
    "StaleReason",
    "TelemetryCheck",
    "TelemetryEvent",
]

Placement = Literal["actual", "registered", "requested"]
"""What an event's ``providers`` means (see ``TelemetryEvent.placement``)."""

AlertKind = Literal[
    "unexpected_digest",
    "provider_changed",
    "fallback_appeared",
    "p99_regression",
    "no_data",
    "unqualified_runtime",
    "unknown_class",
    "settings_differ",
    "lagging",
]

ALERT_KINDS: dict[str, str] = {
    "unexpected_digest": "hosts of the class run a model digest the manifest does not assign to it",
    "provider_changed": "the providers that ran the model differ from the ones the class was "
    "qualified on (with or without a digest change)",
    "fallback_appeared": "nodes ran off the expected provider where the qualified cell had none "
    "(or fewer than seen now, beyond the class's allowance)",
    "p99_regression": "the observed p99's lower confidence bound is above the qualified p99 "
    "upper bound plus the tolerance",
    "no_data": "the class sent no telemetry in the window: no data is never a pass",
    "unqualified_runtime": "hosts of the class run an onnxruntime revision no cell of the class "
    "was qualified on",
    "unknown_class": "hosts report a class the manifest does not know",
    "settings_differ": "hosts run the class's artifact with session settings (threads, "
    "execution mode, graph level, session config, provider options) other than those it was "
    "qualified with",
    "lagging": "hosts still run what an older manifest version gave them, past the propagation "
    "deadline after a newer version changed their assignment",
}
"""Alert kinds, each with what it means."""

Severity = Literal["critical", "warning"]

ClassStateName = Literal["ok", "alert", "no_data", "insufficient_data"]

STALE_REASONS: dict[str, str] = {
    "settings_changed": "the class's runtime, provider or graph settings in the project file "
    "differ from those the cell was measured under",
    "artifact_changed": "the artifact's file now has other bytes than the cell measured (a model "
    "re-exported in place): its bytes now were never run on the class",
    "workload_changed": "the project's workload feeds or times something else (inputs, batch "
    "sizes, concurrency, dims, parity samples, confidence, pipeline) than the cell was measured "
    "under",
    "baseline_changed": "a candidate's parity was measured against another baseline than the "
    "project's now",
    "budget_changed": "a budget changed that the cell's stored evidence cannot be judged against "
    "(the open-loop rate search, after budgets.p99_ms changed)",
    "runtime_unqualified": "telemetry shows hosts of the class on an onnxruntime revision no cell "
    "of the class was measured on",
}
"""Why a cell or class must be re-qualified."""

StaleReason = Literal[
    "settings_changed",
    "artifact_changed",
    "workload_changed",
    "baseline_changed",
    "budget_changed",
    "runtime_unqualified",
]
"""A key of `STALE_REASONS`."""

_Count = Annotated[int, Field(ge=0, le=2**63 - 1)]
"""A count that fits the matrix's BIGINT column: a larger one is a bad line, not a crash."""


_Text = Annotated[str, Field(min_length=1, max_length=MAX_TEXT_CHARS)]


class TelemetryEvent(Document):
    """One sampled observation from a deployed host: what it runs, where and how fast.

    Fields that a producer cannot know are ``null`` (or left out): a ``resolve-artifact`` event
    knows the decision but not the placement or latency; a session without
    ``session.record_ep_graph_assignment_info`` knows the registered providers, not placement.
    Validation is strict (no "3" for 3), as the published JSON Schema says.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    format: Literal["qualify-telemetry/1"] = Field(
        description="Event format version; always 'qualify-telemetry/1'."
    )
    time: AwareDatetime = Field(
        description="When it was observed: ISO 8601 with a UTC offset, e.g. "
        "'2025-06-01T12:00:00.123Z'."
    )
    source: Literal["resolve", "session"] = Field(
        description="Who wrote it: 'resolve' (resolve-artifact --emit-telemetry, at service "
        "start) or 'session' (manifest.host_events.record_session, from the serving process)."
    )
    host_id: _Text = Field(description="The host's name or id (hostname by default).")
    host_class: _Text = Field(description="The host class the host resolved as.")
    model_digest: Digest | None = Field(
        default=None,
        description="sha256 of the model the host runs ('sha256:<hex>'); null when it runs "
        "nothing from this manifest (a class on hold).",
    )
    runtime_revision: _Text = Field(description="onnxruntime version the host runs, e.g. '1.32.0'.")
    runtime_package: _Text | None = Field(
        default=None,
        description="onnxruntime distribution, e.g. 'onnxruntime-gpu'; null if unknown.",
    )
    providers: list[_Text] = Field(
        max_length=MAX_PROVIDERS,
        description="Execution providers: those that received nodes (placement 'actual'), those "
        "registered in the session (placement 'registered'), or those the manifest asks for and "
        "the host has (placement 'requested').",
    )
    placement: Placement = Field(
        description="What 'providers' means: 'actual' (from "
        "get_provider_graph_assignment_info), 'registered' (session.get_providers(): placement "
        "unknown) or 'requested' (resolve-artifact: nothing ran yet)."
    )
    nodes_per_provider: dict[_Text, _Count] | None = Field(
        default=None,
        max_length=MAX_PROVIDERS,
        description="Nodes assigned per provider; null unless placement is 'actual'.",
    )
    fallback_nodes: _Count | None = Field(
        default=None,
        description="Nodes not on the class's expected provider; null unless placement is "
        "'actual'.",
    )
    latency_ms: float | None = Field(
        default=None, ge=0, description="Latency of the sampled inference, ms; null if not timed."
    )
    manifest_version: int | None = Field(
        default=None,
        ge=1,
        le=2**63 - 1,
        description="Version of the manifest the host resolved; null if unknown.",
    )
    decision: Literal["candidate", "baseline", "hold"] | None = Field(
        default=None, description="The manifest's decision for the class, when the host knows it."
    )
    model: _Text | None = Field(
        default=None,
        description="The model line the event is about (the manifest's 'model', e.g. 'ocr-rec'): "
        "a host serving several models writes all of them into one file, and a check judges "
        "only its own line's. Null (old writers): attributed by digest, see docs/telemetry.md.",
    )
    rollout: _Text | None = Field(
        default=None,
        description="The id of the staged rollout the class was in when the host resolved it "
        "(resolve-artifact's cohort.rollout); null without one.",
    )
    cohort: Literal["canary", "rest"] | None = Field(
        default=None,
        description="Which side of that rollout the host is on: 'canary' (it runs the rollout's "
        "artifact) or 'rest'; null without a rollout.",
    )
    settings: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_SETTINGS_CHARS,
        description="The session settings the host's session runs with, read back from the "
        "session (manifest.host_events.session_settings): sorted 'key=value' pairs joined by "
        "';', percent-encoded, e.g. 'execution_mode=sequential;graph_optimization_level=all;"
        "inter_op_threads=0;intra_op_threads=2'; null if unknown.",
    )

    @field_validator("settings")
    @classmethod
    def _settings(cls, value: str | None) -> str | None:
        if value is not None:
            decode_settings(value)
        return value

    @field_validator("latency_ms")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError("latency_ms must be a finite number of milliseconds")
        return value


class CheckSettings(Document):
    """The knobs of ``qualify telemetry check``: the one place their defaults and reasons live."""

    model_config = ConfigDict(allow_inf_nan=False)

    since: str = Field(
        default="24h",
        description="How far back from now events are judged: a number and a unit (s, m, h, d, "
        "w). A day covers a daily traffic cycle.",
    )
    p99_tolerance: float = Field(
        default=0.2,
        ge=0,
        description="Relative slack over the qualified p99 upper bound before a regression is "
        "alerted: production load and inputs differ from a qualification run's.",
    )
    min_samples: int = Field(
        default=662,
        ge=459,
        description="Fewest latency samples a class's p99 is judged on (662: MLPerf LoadGen's "
        "minimum for p99 at 99% confidence with one sample over the bound).",
    )
    confidence: float = Field(
        default=0.99,
        gt=0.5,
        lt=1.0,
        description="One-sided confidence of the observed p99 bounds.",
    )
    propagation_deadline: str = Field(
        default="6h",
        description="How long after a manifest version changed what a host should run the host "
        "may still run what an older version gave it before that is a 'lagging' warning (a "
        "number and a unit: s, m, h, d, w). Hosts pick a manifest up at service start or on "
        "their next poll, minutes to hours late; six hours covers a rollout step and a "
        "working day's restarts, and a host still behind after that is stuck, not slow.",
    )


class Alert(Document):
    """One problem a telemetry check found for one host class."""

    host_class: str = Field(description="The class the alert is about.")
    kind: AlertKind = Field(description="What is wrong; see ALERT_KINDS.")
    severity: Severity = Field(
        description="critical: the promise is broken now; warning: it may be."
    )
    message: str = Field(description="One sentence with the evidence.")
    evidence: dict[str, Any] = Field(
        description="Machine-readable evidence: counts, hosts (a few, sorted), digests, "
        "providers, bounds."
    )
    suggested_action: str = Field(description="What a person should do next.")


class LaggingHosts(Document):
    """Hosts of one class whose latest event reports an older manifest version than the one that
    now gives them something else to run."""

    version: int = Field(description="The manifest version their latest events were judged under.")
    hosts: int = Field(ge=0, description="How many hosts (each counted once, by its latest event).")
    example_hosts: list[str] = Field(description="Up to five of them, sorted.")
    newer_version: int = Field(
        description="The first version after theirs that changed what they should run."
    )
    since: datetime = Field(
        description="When newer_version was published (its 'created'): they lag since then."
    )
    past_deadline: bool = Field(
        description="Whether since is longer ago than the check's propagation deadline (then a "
        "'lagging' warning, else only reported)."
    )


class SkippedEvents(Document):
    """Events of the window a check did not judge because they are not this model line's."""

    model: str | None = Field(
        description="The model line the events name; null: they name none and run a digest "
        "this line never had (not attributable)."
    )
    events: int = Field(ge=0, description="Events skipped.")
    hosts: int = Field(ge=0, description="Distinct hosts that sent them.")
    example_digests: list[str] = Field(description="Up to five digests they ran, sorted.")


class ClassState(Document):
    """How one host class looks in the telemetry window."""

    host_class: str = Field(description="Host class name.")
    state: ClassStateName = Field(
        description="alert (at least one alert), no_data (no event in the window), "
        "insufficient_data (no alert, but too few latency samples to judge the p99), ok."
    )
    decision: Literal["candidate", "baseline", "hold"] | None = Field(
        description="The manifest's decision for the class; null for a class not in it."
    )
    events: int = Field(description="Events in the window.")
    hosts: int = Field(description="Distinct hosts that sent them.")
    latency_samples: int = Field(description="Events with a latency.")
    observed_p99_ms: float | None = Field(
        description="Observed p99 (an observed sample); null without latency samples."
    )
    observed_p99_lower_ms: float | None = Field(
        description="Its distribution-free lower confidence bound; null with too few samples."
    )
    observed_p99_upper_ms: float | None = Field(
        description="Its distribution-free upper confidence bound; null with too few samples."
    )
    qualified_p99_upper_ms: float | None = Field(
        description="The qualified p99 upper bound of the assigned artifact; null if unknown."
    )
    p99_threshold_ms: float | None = Field(
        description="qualified_p99_upper_ms times (1 + tolerance): what the lower bound must "
        "exceed to alert."
    )
    p99: Literal["ok", "regressed", "insufficient_data", "not_judged"] = Field(
        description="The p99 judgement: insufficient_data below min_samples or when the bounds "
        "straddle the threshold; not_judged without a qualified bound."
    )
    alerts: list[AlertKind] = Field(description="Kinds of the class's alerts, sorted.")
    notes: list[str] = Field(description="Sentences on what was and was not judged.")
    lagging: list[LaggingHosts] = Field(
        default_factory=list,
        description="Hosts still on an older version that gave them something else to run, "
        "per version, oldest first; empty when every host runs under its current assignment.",
    )


class TelemetryCheck(Document):
    """The result of ``qualify telemetry check``: alerts and a state per class."""

    checked_at: datetime = Field(description="The reference time (UTC).")
    window_start: datetime = Field(description="Events from here up to checked_at were judged.")
    manifest_version: int = Field(
        description="The current manifest: hosts on older versions are judged against the version "
        "they report (or the one published at their time) and reported as lagging."
    )
    model: str | None = Field(
        default=None, description="The model line judged (the manifest's 'model')."
    )
    versions: list[int] = Field(
        default_factory=list,
        description="The manifest versions the window's events were judged against, ascending.",
    )
    propagation_deadline: str = Field(
        default="6h", description="How long hosts may lag behind a new assignment unwarned."
    )
    skipped: list[SkippedEvents] = Field(
        default_factory=list,
        description="Events of other model lines (or of none this line can claim): not judged.",
    )
    p99_tolerance: float = Field(description="Relative slack over the qualified p99 bound.")
    min_samples: int = Field(description="Fewest latency samples a p99 is judged on.")
    confidence: float = Field(description="Confidence of the observed p99 bounds.")
    events: int = Field(description="Events in the window, all classes.")
    alerts: list[Alert] = Field(description="Every alert, by class then kind.")
    classes: list[ClassState] = Field(description="One state per class, by name.")

    @property
    def ok(self) -> bool:
        """True when there is no alert."""
        return not self.alerts


class StaleItem(Document):
    """A cell or class that must be re-qualified, and why."""

    host_class: str = Field(description="Host class name.")
    reason: StaleReason = Field(
        description="Why: "
        + "; ".join(f"{code}: {meaning}" for code, meaning in STALE_REASONS.items())
        + "."
    )
    run_id: str | None = Field(description="The stale cell's run; null for a class-level item.")
    artifact_digest: Digest | None = Field(
        description="The stale cell's artifact; null for a class-level item."
    )
    artifact_name: str | None = Field(description="Its label; null for a class-level item.")
    measured_at: datetime | None = Field(description="When the stale cell was measured.")
    runtime_revisions: list[str] = Field(
        description="For runtime_unqualified: the revisions seen in telemetry and never "
        "qualified, sorted."
    )
    message: str = Field(description="One sentence: what changed and what to run.")
