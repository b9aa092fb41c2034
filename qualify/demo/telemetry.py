"""The demo's telemetry: a day of healthy traffic from every class, with two injected problems.

Owns generating a deterministic (seeded) ``qualify-telemetry/1`` file from a manifest and the
cells behind it, and the demo step that writes it, ingests it into the demo matrix and runs the
check. Healthy traffic matches what the manifest says for each class (its digest, the qualified
cell's actual placement and runtime revision, latencies below the qualified p99). Two classes
get a problem:

* **provider change**: from a "driver update" six hours ago, that class's hosts run some nodes on
  ``OpenVINOExecutionProvider`` with the same model digest (``provider_changed`` and
  ``fallback_appeared``);
* **p99 regression**: from twelve hours ago, that class's latencies are about three times its
  qualified p99 upper bound (``p99_regression``).

Does not own the check (``qualify.telemetry.check``) or the rest of the demo (``qualify.demo.story``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from manifest.host_events import FORMAT, encode_event, format_time
from qualify.telemetry.render import render_check
from qualify.telemetry.watch import ingest_files, run_check
from schemas.atomic import write_atomic
from schemas.cell import Cell, latest
from schemas.manifest import Manifest, ManifestEntry
from schemas.rules import fallback_count
from schemas.telemetry import CheckSettings, TelemetryCheck

__all__ = [
    "DEMO_HOSTS_PER_CLASS",
    "DEMO_SAMPLES_PER_CLASS",
    "SHIFTED_PROVIDER",
    "DemoTelemetry",
    "run_demo_telemetry",
    "write_demo_telemetry",
]

DEMO_HOSTS_PER_CLASS = 8
DEMO_SAMPLES_PER_CLASS = 4000
"""Latency events per class: enough for the p99 bounds to decide at 99% confidence."""

SHIFTED_PROVIDER = "OpenVINOExecutionProvider"
"""Where the injected provider change moves nodes (the rollout demo injects the same fault)."""
_PREFERRED_PROVIDER_CLASS = "x86-v4"
_PREFERRED_P99_CLASS = "x86-v3-1t"


@dataclass(frozen=True)
class DemoTelemetry:
    """What ``write_demo_telemetry`` wrote.

    Attributes:
        path: The JSON-lines file.
        events: Lines written.
        provider_class: The class whose provider silently changed (None if no class fits).
        p99_class: The class whose p99 regressed (None if no class fits).
    """

    path: Path
    events: int
    provider_class: str | None
    p99_class: str | None


def _cell(entry: ManifestEntry, cells: Sequence[Cell]) -> Cell | None:
    if entry.artifact is None:
        return None
    mine = [
        c
        for c in cells
        if c.key.as_tuple() == entry.key.as_tuple() and c.artifact_digest == entry.artifact.digest
    ]
    if entry.evidence is not None:
        for cell in mine:
            if cell.run_id == entry.evidence.run_id:
                return cell
    return latest(mine)


def _eligible(manifest: Manifest, cells: Sequence[Cell]) -> list[str]:
    """Classes with an artifact, a qualified placement and a qualified p99 bound."""
    found = []
    for name in sorted(manifest.signed.entries):
        entry = manifest.signed.entries[name]
        cell = _cell(entry, cells)
        gate = cell.gate_latency if cell is not None else None
        if cell is None or cell.placement is None or gate is None or gate.p99_upper_ms is None:
            continue
        found.append(name)
    return found


def _pick(eligible: list[str], preferred: str, taken: str | None) -> str | None:
    if preferred in eligible and preferred != taken:
        return preferred
    return next((n for n in eligible if n != taken), None)


def write_demo_telemetry(
    manifest: Manifest,
    cells: Sequence[Cell],
    path: Path,
    *,
    seed: int,
    now: datetime,
) -> DemoTelemetry:
    """Write a day of telemetry for every class of ``manifest`` (file replaced atomically).

    Every class gets ``DEMO_HOSTS_PER_CLASS`` hosts, an hourly resolve event per host and
    ``DEMO_SAMPLES_PER_CLASS`` session events spread over the 23 hours before ``now``. A class on
    hold sends only its resolve events (nothing served). See the module docstring for the two
    injected problems; the classes are ``x86-v4`` and ``x86-v3-1t`` when the manifest has them
    and they fit, else the first classes (by name) with a qualified placement and p99.

    Args:
        manifest: The demo's manifest.
        cells: The matrix cells behind it (placement, runtime revision, latency shape).
        path: The file to write.
        seed: Seeds every random draw: the same inputs write the same bytes.
        now: The end of the day of traffic (UTC, aware).

    Returns:
        What was written and which classes carry the problems.
    """
    rng = np.random.default_rng(seed)
    eligible = _eligible(manifest, cells)
    provider_class = _pick(eligible, _PREFERRED_PROVIDER_CLASS, None)
    p99_class = _pick(eligible, _PREFERRED_P99_CLASS, provider_class)
    day = _Day(
        start=now - timedelta(hours=23),
        now=now,
        driver_update=now - timedelta(hours=6),
        regression=now - timedelta(hours=12),
    )
    events: list[tuple[float, dict[str, Any]]] = []
    for name in sorted(manifest.signed.entries):
        entry = manifest.signed.entries[name]
        cell = _cell(entry, cells)
        revision = (cell.runtime_version if cell else None) or next(
            (c.runtime_version for c in cells if c.key == entry.key and c.runtime_version),
            "unknown",
        )
        hosts = [f"{name}-{i:03d}" for i in range(DEMO_HOSTS_PER_CLASS)]
        base: dict[str, Any] = {
            "format": FORMAT,
            "host_class": name,
            "model_digest": entry.artifact.digest if entry.artifact else None,
            "runtime_revision": revision,
            "runtime_package": entry.runtime.package,
            "manifest_version": manifest.signed.version,
            "decision": entry.decision,
            "model": manifest.signed.model,
        }
        events.extend(_resolve_events(entry, base, hosts, day))
        if cell is not None:
            moved = name == provider_class
            slow = name == p99_class
            events.extend(_session_events(cell, base, hosts, day, rng, (moved, slow)))
    events.sort(key=lambda item: (item[0], item[1]["host_id"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, b"".join(encode_event(event) for _, event in events))
    return DemoTelemetry(
        path=path, events=len(events), provider_class=provider_class, p99_class=p99_class
    )


@dataclass(frozen=True)
class _Day:
    """The day of traffic: its start and end, and when each injected problem begins."""

    start: datetime
    now: datetime
    driver_update: datetime
    regression: datetime


def _resolve_events(
    entry: ManifestEntry, base: dict[str, Any], hosts: list[str], day: _Day
) -> Iterator[tuple[float, dict[str, Any]]]:
    # Hosts resolve at service start and then on an hourly timer, so that even a class on
    # hold, which serves nothing new, says it is alive all day.
    served = list(entry.provider.execution_providers) if base["model_digest"] else []
    for hour, (i, host) in itertools.product(range(23), enumerate(hosts)):
        at = day.start.timestamp() + 3600.0 * hour + 60.0 * (i + 1)
        yield (
            at,
            {
                **base,
                "time": format_time(at),
                "source": "resolve",
                "host_id": host,
                "providers": served,
                "placement": "requested",
                "nodes_per_provider": None,
                "fallback_nodes": None,
                "latency_ms": None,
            },
        )


def _session_events(
    cell: Cell,
    base: dict[str, Any],
    hosts: list[str],
    day: _Day,
    rng: np.random.Generator,
    injected: tuple[bool, bool],
) -> list[tuple[float, dict[str, Any]]]:
    """The class's sampled inferences over the day; ``injected`` is (its provider moves after
    the driver update, its p99 regresses after the regression). A cell without a
    qualified placement and p99 gets none (it serves nothing the demo can shape)."""
    gate = cell.gate_latency
    placement = cell.placement
    if placement is None or gate is None:
        return []
    moved_class, slow_class = injected
    nodes = {p: n for p, n in placement.nodes_per_provider.items() if n > 0}
    total = sum(nodes.values())
    shifted = {SHIFTED_PROVIDER: max(total - 1, 1), placement.expected_provider: 1}
    sigma = max(np.log(max(gate.p99_ms, gate.p50_ms * 1.01) / gate.p50_ms) / 2.326, 0.01)
    n = DEMO_SAMPLES_PER_CLASS
    times = np.sort(rng.uniform(day.start.timestamp() + 600, day.now.timestamp() - 60, n))
    latency = 0.8 * gate.p50_ms * np.exp(sigma * rng.standard_normal(n))
    if slow_class and gate.p99_upper_ms is not None:
        bad = times >= day.regression.timestamp()
        latency[bad] = 3.0 * gate.p99_upper_ms * np.exp(0.05 * rng.standard_normal(bad.sum()))
    who = rng.integers(0, len(hosts), n)
    update = day.driver_update.timestamp()
    events = []
    for at, ms, h in zip(times.tolist(), latency.tolist(), who.tolist(), strict=True):
        counts = shifted if moved_class and at >= update else nodes
        events.append(
            (
                at,
                {
                    **base,
                    "time": format_time(at),
                    "source": "session",
                    "host_id": hosts[h],
                    "providers": sorted(counts),
                    "placement": "actual",
                    "nodes_per_provider": dict(sorted(counts.items())),
                    "fallback_nodes": fallback_count(counts, placement.expected_provider),
                    "latency_ms": round(ms, 4),
                },
            )
        )
    return events


def run_demo_telemetry(
    workdir: Path,
    manifest: Manifest,
    cells: Sequence[Cell],
    *,
    now: datetime,
    seed: int = 7,
    echo: Callable[[str], None] = print,
) -> TelemetryCheck:
    """The demo's watch step: write ``telemetry.jsonl``, ingest it, check it, print the result.

    Args:
        workdir: The demo directory (holds ``qualify.duckdb`` with the manifest stored).
        manifest: The manifest just generated.
        cells: The matrix's cells.
        now: Reference time (UTC, aware): the traffic ends here and the check runs here.
        seed: Seed of the traffic.
        echo: Prints a line.

    Returns:
        The check (its alerts are the two injected problems).
    """
    written = write_demo_telemetry(manifest, cells, workdir / "telemetry.jsonl", seed=seed, now=now)
    echo(
        f"\n== telemetry: {written.events} events from every class; injected: "
        f"{written.provider_class}'s provider changed after a driver update, "
        f"{written.p99_class}'s p99 regressed"
    )
    report = ingest_files(workdir / "qualify.duckdb", [written.path], now=now)
    echo(f"== qualify telemetry ingest telemetry.jsonl\n  {report.events} events ingested")
    check = run_check(workdir / "qualify.duckdb", now=now, settings=CheckSettings())
    echo("== qualify telemetry check\n" + render_check(check))
    return check
