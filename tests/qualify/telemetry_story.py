"""Stories of several releases for the telemetry tests: manifest versions edited class by class,
published at chosen times, and hosts' events over them.

``Story`` holds a simulated fleet (``tests.manifest.factories``), a list of published versions,
each a copy of the first manifest with some entries re-pointed (artifact, rollback, rollout or
hold), and the events hosts wrote. ``Story.check`` writes the events to a JSON-lines file,
ingests it into a real DuckDB matrix, stores and publishes every version there, and runs the
check the CLI runs (``qualify.telemetry.watch.run_check``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from manifest import envelope
from matrix.samples import empty_samples
from matrix.store import Store
from matrix.telemetry.ingest import ingest_telemetry
from qualify.telemetry.watch import run_check
from schemas.cell import RunBundle
from schemas.manifest import Manifest, ManifestArtifact, Rollback, Rollout
from schemas.telemetry import CheckSettings, TelemetryCheck
from tests.manifest.factories import (
    Fleet,
    class_spec,
    digest_of,
    fixed_key,
    make_project,
    signed_manifest,
)

NOW = datetime(2025, 6, 2, 12, 0, tzinfo=UTC)
MODEL = "ocr-rec"
FP32 = digest_of("rec-fp32")
INT8 = digest_of("rec-int8")
INT4 = digest_of("rec-int4")
ROGUE = digest_of("rec-rogue")
NAMES = {FP32: "rec-fp32", INT8: "rec-int8", INT4: "rec-int4", ROGUE: "rec-rogue"}


def fleet() -> Fleet:
    """Two CPU classes, each qualified with both candidates (int8 and int4)."""
    simulated = Fleet(
        make_project(
            {"x86": class_spec(1, match={"arch": "x86_64"}), "arm": class_spec(2)},
            candidates=("rec-int8", "rec-int4"),
        )
    )
    simulated.qualify("x86")
    simulated.qualify("arm")
    return simulated


def _artifact(digest: str) -> ManifestArtifact:
    return ManifestArtifact(
        name=NAMES[digest], digest=digest, length=1000, uri=f"https://m.example/{NAMES[digest]}"
    )


@dataclass(frozen=True)
class Pointer:
    """What one class's entry gives in a version: an artifact (None: hold), a rollback, and a
    staged rollout (id, percent, artifact) or none."""

    artifact: str | None
    rollback: str | None = FP32
    rollout: tuple[str, int, str] | None = None


def edited(
    base: Manifest, version: int, created: datetime, pointers: dict[str, Pointer]
) -> Manifest:
    """``base`` as version ``version``, created then, with the given entries re-pointed."""
    entries = dict(base.signed.entries)
    for name, pointer in pointers.items():
        entry = entries[name]
        rollback = (
            Rollback(
                **_artifact(pointer.rollback).model_dump(),
                proven_to_load=True,
                runtime=None,
                provider=None,
            )
            if pointer.rollback is not None
            else None
        )
        rollout = None
        if pointer.rollout is not None:
            rid, percent, digest = pointer.rollout
            rollout = Rollout(
                id=rid,
                artifact=_artifact(digest),
                percent=percent,
                step=1,
                steps=[percent, 100] if percent < 100 else [100],
            )
        entries[name] = entry.model_copy(
            update={
                "decision": "hold"
                if pointer.artifact is None
                else ("baseline" if pointer.artifact == FP32 else "candidate"),
                "artifact": None if pointer.artifact is None else _artifact(pointer.artifact),
                "rollback": rollback,
                "rollout": rollout,
                "evidence": None,
            }
        )
    signed = base.signed.model_copy(
        update={
            "version": version,
            "created": envelope.format_time(created),
            "entries": entries,
        }
    )
    return base.model_copy(update={"signed": signed})


def event(
    host: str,
    host_class: str,
    at: datetime,
    *,
    version: int | None,
    digest: str | None,
    model: str | None = MODEL,
    latency_ms: float | None = None,
    cohort: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """A resolve-style event (requested placement): which digest the host runs, under which
    version, for which model line."""
    found: dict[str, Any] = {
        "format": "qualify-telemetry/1",
        "time": at.astimezone(UTC).isoformat().replace("+00:00", "Z"),
        "source": "resolve",
        "host_id": host,
        "host_class": host_class,
        "model_digest": digest,
        "runtime_revision": "1.32.0",
        "providers": ["CPUExecutionProvider"] if digest else [],
        "placement": "requested",
        "manifest_version": version,
        "latency_ms": latency_ms,
    }
    if model is not None:
        found["model"] = model
    if cohort is not None:
        found["rollout"], found["cohort"] = cohort
    return found


@dataclass
class Story:
    """A fleet, its published versions and its hosts' events."""

    simulated: Fleet = field(default_factory=fleet)
    versions: list[Manifest] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)

    def base(self) -> Manifest:
        doc = signed_manifest(
            self.simulated, fixed_key(), version=1, created=NOW - timedelta(days=2)
        )
        return Manifest.model_validate_json(json.dumps(doc))

    def publish(self, created: datetime, **pointers: Pointer) -> int:
        """A new version, published at ``created``, with the given classes re-pointed."""
        base = self.versions[-1] if self.versions else self.base()
        version = len(self.versions) + 1
        self.versions.append(edited(base, version, created, pointers))
        return version

    def check(self, tmp_path: Path, settings: CheckSettings | None = None) -> TelemetryCheck:
        """Ingest the events and every version into a matrix, then ``run_check`` at NOW."""
        return run_check(self.matrix(tmp_path), now=NOW, settings=settings)

    def matrix(self, tmp_path: Path) -> Path:
        """A matrix with the fleet's runs, every version published and the events ingested."""
        tmp_path.mkdir(parents=True, exist_ok=True)
        db = tmp_path / "qualify.duckdb"
        path = tmp_path / "telemetry.jsonl"
        path.write_text("".join(json.dumps(e) + "\n" for e in self.events))
        with Store.open(db) as store:
            for run_id, run in self.simulated.runs.items():
                cells = [c for c in self.simulated.cells if c.run_id == run_id]
                store.write_run(RunBundle(run=run, cells=cells), empty_samples())
            for manifest in self.versions:
                created = envelope.parse_time(manifest.signed.created)
                store.save_manifest(
                    manifest.signed.version,
                    manifest.signed.release,
                    created,
                    created + timedelta(days=30),
                    envelope.encode_canonical(manifest.model_dump(mode="json")).decode(),
                )
                store.mark_published(manifest.signed.version)
            ingest_telemetry(store, [path], now=NOW)
        return db
