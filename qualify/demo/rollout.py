"""The demo's rollouts: the two classes whose telemetry raised alerts are pinned back to the
baseline, then rolled out again in steps, one promoted to 100% on healthy canary telemetry and one
aborted on a provider change in its canary (seeded traffic, each host placed in or out of the
cohort as a host places itself), every action the real one (``qualify.rollout``). Does not own
the rollout rules nor the rest of the demo (``qualify.demo.story``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from manifest.host_events import FORMAT, encode_event, format_time
from manifest.lookup import cohort_point
from matrix.store import Store
from qualify.artifacts import digest_file
from qualify.demo.telemetry import SHIFTED_PROVIDER
from qualify.project.load import LoadedProject
from qualify.release.generate import previous_manifest
from qualify.release.publishing import PublishOptions
from qualify.rollout import (
    abort_rollout,
    advance_rollout,
    clear_class,
    pin_class,
    start_rollout,
)
from qualify.telemetry.watch import ingest_files
from schemas.atomic import write_atomic
from schemas.cell import Cell
from schemas.manifest import Manifest
from schemas.rules import fallback_count
from schemas.telemetry import CheckSettings

__all__ = ["ROLLOUT_HOSTS", "ROLLOUT_STEPS", "run_demo_rollouts"]

Echo = Callable[[str], None]

ROLLOUT_HOSTS = 60
"""Hosts per class in the rollout windows: enough that a 25% cohort has several."""

ROLLOUT_STEPS = (25, 100)
_EVENTS_PER_WINDOW = 12000
"""Events per step window: a 25% cohort of 60 hosts sends about 3,000, well above the check's min_samples."""
_WINDOW = timedelta(minutes=30)


def _cell_of(cells: Sequence[Cell], host_class: str, digest: str) -> Cell | None:
    mine = [c for c in cells if c.host_class == host_class and c.artifact_digest == digest]
    return max(mine, key=lambda c: c.measured_at) if mine else None


def _window_events(
    manifest: Manifest,
    cells: Sequence[Cell],
    host_class: str,
    *,
    start: datetime,
    rng: np.random.Generator,
    fault: bool,
) -> list[dict[str, Any]]:
    """A window of traffic from every host of ``host_class`` as ``manifest`` places it."""
    entry = manifest.signed.entries[host_class]
    rollout = entry.rollout
    assert rollout is not None and entry.artifact is not None  # the demo rolls out from these
    hosts = [f"{host_class}-{i:03d}" for i in range(ROLLOUT_HOSTS)]
    sides: dict[str, tuple[str, Cell]] = {}
    for host in hosts:
        member = cohort_point(rollout.id, host) < rollout.percent
        digest = rollout.artifact.digest if member else entry.artifact.digest
        cell = _cell_of(cells, host_class, digest)
        if cell is None or cell.placement is None or cell.gate_latency is None:
            raise RuntimeError(f"{host_class}: no qualified cell for {digest[:19]}")
        sides[host] = ("canary" if member else "rest", cell)
    events = []
    times = np.sort(rng.uniform(0, _WINDOW.total_seconds() - 1, _EVENTS_PER_WINDOW))
    picks = rng.integers(0, len(hosts), _EVENTS_PER_WINDOW)
    for at, pick in zip(times.tolist(), picks.tolist(), strict=True):
        host = hosts[pick]
        side, cell = sides[host]
        assert cell.placement is not None and cell.gate_latency is not None
        nodes = {p: n for p, n in cell.placement.nodes_per_provider.items() if n > 0}
        if fault and side == "canary":
            nodes = {
                SHIFTED_PROVIDER: max(sum(nodes.values()) - 1, 1),
                cell.placement.expected_provider: 1,
            }
        gate = cell.gate_latency
        events.append(
            {
                "format": FORMAT,
                "time": format_time(start.timestamp() + at),
                "source": "session",
                "host_id": host,
                "host_class": host_class,
                "model_digest": cell.artifact_digest,
                "runtime_revision": cell.runtime_version or "unknown",
                "runtime_package": entry.runtime.package,
                "providers": sorted(nodes),
                "placement": "actual",
                "nodes_per_provider": dict(sorted(nodes.items())),
                "fallback_nodes": fallback_count(nodes, cell.placement.expected_provider),
                "latency_ms": round(gate.p50_ms * float(np.exp(0.1 * rng.standard_normal())), 4),
                "manifest_version": manifest.signed.version,
                "decision": entry.decision,
                "model": manifest.signed.model,
                "rollout": rollout.id,
                "cohort": side,
            }
        )
    return events


def _traffic(
    workdir: Path,
    db_path: Path,
    cells: Sequence[Cell],
    host_class: str,
    *,
    start: datetime,
    rng: np.random.Generator,
    fault: bool,
    echo: Echo,
) -> None:
    with Store.open(db_path, read_only=True) as db:
        manifest = previous_manifest(db)
    assert manifest is not None
    events = _window_events(manifest, cells, host_class, start=start, rng=rng, fault=fault)
    path = workdir / "rollout-telemetry" / f"{host_class}-{start:%H%M%S}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, b"".join(encode_event(e) for e in events))
    canary = sum(1 for e in events if e["cohort"] == "canary")
    report = ingest_files(db_path, [path], now=start + _WINDOW)
    echo(
        f"  telemetry: {report.events} events, {canary} from the canary"
        + (f" (injected: nodes moved to {SHIFTED_PROVIDER} in the canary)" if fault else "")
    )


Resolve = Callable[[Path, str, str], tuple[int, dict[str, Any], str]]
"""Runs the real resolve-artifact: (manifest file, class, host id) -> (exit, answer, stderr)."""


def _digest(answer: tuple[int, dict[str, Any], str]) -> str | None:
    artifact = answer[1].get("artifact")
    return artifact.get("digest") if isinstance(artifact, dict) else None


def _served(answer: tuple[int, dict[str, Any], str], names: dict[str, str]) -> str:
    code, said, _ = answer
    digest = _digest(answer)
    shown = f"{names.get(digest, '?')} ({digest[:19]})" if digest else "nothing"
    return (
        f"exit {code}, manifest v{said.get('manifest_version')}, runs {shown}, served as "
        f"{said.get('served')}"
    )


@dataclass
class _Story:
    """What the rollout story's steps share: the matrix, the publish options (each action at
    its own time), the artifacts' names by digest, the canary traffic's generator, and where
    each line goes."""

    workdir: Path
    loaded: LoadedProject
    db_path: Path
    publish: PublishOptions
    names: dict[str, str]
    cells: Sequence[Cell]
    rng: np.random.Generator
    say: Echo

    def at(self, now: datetime, why: str = "") -> PublishOptions:
        return replace(self.publish, now=now, why=why)


def run_demo_rollouts(
    workdir: Path,
    loaded: LoadedProject,
    db_path: Path,
    *,
    healthy: str | None,
    faulty: str | None,
    now: datetime,
    resolve: Resolve,
    tolerance: float,
    echo: Echo = print,
    seed: int = 11,
) -> bool:
    """Pin ``healthy`` and ``faulty`` back to the baseline, then roll the candidate out to
    each again: ``healthy`` reaches 100% on clean canary telemetry, ``faulty`` aborts on a
    provider change in its canary and its hosts go back to the baseline at a higher version.

    ``tolerance`` is each step's ``--tolerance``: the slack of the cohort's p99 over the
    qualified bound and over the rest of the class's p99, which runs the baseline.

    Returns:
        True when both stories ran as told (False, with the reason echoed, when the matrix has
        no candidate on one of the classes, e.g. a host whose int8 numerics failed parity).
    """

    def say(text: str) -> None:  # each line through the caller's echo (its indent)
        for line in text.split("\n"):
            echo(line)

    story = _begin(workdir, loaded, db_path, (healthy, faulty), now, seed, say)
    if story is None or healthy is None or faulty is None:
        say("  (skipped: the rollout demo needs two classes running a qualified candidate)")
        return False
    t = _pin_clear_and_start(story, (healthy, faulty), now + timedelta(minutes=1))
    canary_host, v_start, first = _canary_host(story, faulty, resolve)
    say(
        f"\n== resolve-artifact --host-class {faulty} --host-id {canary_host} (in the canary)\n"
        f"  {_served(first, story.names)}"
    )
    settings = CheckSettings(p99_tolerance=tolerance)
    ok = True
    for name, fault in ((healthy, False), (faulty, True)):
        t, aborted = _roll(story, name, fault, t, settings)
        ok = ok and aborted == fault
    return _after_the_abort(story, faulty, canary_host, v_start, resolve) and ok


def _begin(
    workdir: Path,
    loaded: LoadedProject,
    db_path: Path,
    classes: tuple[str | None, str | None],
    now: datetime,
    seed: int,
    say: Echo,
) -> _Story | None:
    """The story's shared parts, or None when ``classes`` are not two classes running a
    qualified candidate in the current manifest."""
    specs = [loaded.project.artifacts.baseline, *loaded.project.artifacts.candidates]
    names = {digest_file(loaded.resolve(spec.path)): spec.label for spec in specs}
    with Store.open(db_path, read_only=True) as db:
        current = previous_manifest(db)
        cells = db.latest_cells()
    if current is None or any(
        c is None or current.signed.entries[c].decision != "candidate" for c in classes
    ):
        return None
    publish = PublishOptions(
        key_path=workdir / "release.key",
        out=workdir / "manifest.json",
        now=now,
        expires_in=timedelta(days=30),
        per_class_dir=workdir / "manifest.d",
        who="demo",
    )
    rng = np.random.default_rng(seed)
    return _Story(workdir, loaded, db_path, publish, names, cells, rng, say)


def _pin_clear_and_start(story: _Story, classes: tuple[str, str], t: datetime) -> datetime:
    """Each class pinned to the baseline and cleared (once the cause is fixed), then each
    rolled out again; the time after."""
    baseline = story.loaded.project.artifacts.baseline.label
    say = story.say
    with Store.open(story.db_path) as db:
        for name, why in zip(
            classes, ("provider changed after a driver update", "p99 regressed"), strict=True
        ):
            done = pin_class(story.loaded, db, name, story.at(t, why), artifact=baseline)
            say(
                f"\n== qualify rollout pin {name} --artifact {baseline} --why {why!r}\n"
                f"  {done.summary}"
            )
            say(
                f"== qualify rollout clear {name} --why fixed (once the cause is fixed)\n  "
                + clear_class(db, name, now=t, why="fixed", who="demo")
            )
    t += timedelta(minutes=1)
    with Store.open(story.db_path) as db:
        for name in classes:
            done = start_rollout(
                story.loaded, db, name, story.at(t, "re-qualified"), steps=ROLLOUT_STEPS
            )
            say(f"\n== qualify rollout start {name} --steps 25,100\n  {done.summary}")
    return t


def _canary_host(
    story: _Story, faulty: str, resolve: Resolve
) -> tuple[str, bytes, tuple[int, dict[str, Any], str]]:
    """A host of ``faulty``'s cohort, the manifest's bytes now (to replay later), and what
    resolve-artifact serves that host now."""
    with Store.open(story.db_path, read_only=True) as db:
        rolling = previous_manifest(db)
    assert rolling is not None  # the demo published it just now
    staged = rolling.signed.entries[faulty].rollout
    assert staged is not None
    canary_host = next(
        host
        for host in (f"{faulty}-{i:03d}" for i in range(ROLLOUT_HOSTS))
        if cohort_point(staged.id, host) < staged.percent
    )
    first = resolve(story.publish.out, faulty, canary_host)
    return canary_host, story.publish.out.read_bytes(), first


def _roll(
    story: _Story, name: str, fault: bool, t: datetime, settings: CheckSettings
) -> tuple[datetime, bool]:
    """``name``'s rollout step by step on its canary's traffic (``fault``: nodes moved off the
    qualified provider in the canary), aborted when a step halts; the time after, and whether
    it was aborted."""
    say = story.say
    say(f"\n== rollout of {name}")
    for _ in ROLLOUT_STEPS:
        window = t + timedelta(seconds=1)
        _traffic(
            story.workdir,
            story.db_path,
            story.cells,
            name,
            start=window,
            rng=story.rng,
            fault=fault,
            echo=say,
        )
        t = window + _WINDOW
        with Store.open(story.db_path) as db:
            step, verdict = advance_rollout(
                db, name, story.at(t), settings=settings, loaded=story.loaded
            )
        say(
            f"  qualify rollout advance {name} --tolerance {settings.p99_tolerance:g}: "
            f"evidence: {verdict.evidence()}"
        )
        if step is None:
            for problem in verdict.problems:
                say(f"  halted: {problem[:300]}")
            with Store.open(story.db_path) as db:
                options = story.at(t, "provider change in the canary")
                aborted = abort_rollout(story.loaded, db, name, options)
            say(f"  qualify rollout abort {name}: {aborted.summary}")
            return t, True
        say(f"  {step.summary}")
    return t, False


def _after_the_abort(
    story: _Story, faulty: str, canary_host: str, v_start: bytes, resolve: Resolve
) -> bool:
    """What resolve-artifact serves the aborted class's canary host now, and when the version
    it had before is replayed to it; then the rollout log. Whether the host went back to the
    baseline and refused the older version."""
    say, names = story.say, story.names
    after = resolve(story.publish.out, faulty, canary_host)
    say(
        f"\n== resolve-artifact --host-class {faulty} --host-id {canary_host} after the abort\n"
        f"  {_served(after, names)}"
    )
    replay = story.workdir / "hosts" / "replayed-manifest.json"
    write_atomic(replay, v_start)
    again = resolve(replay, faulty, canary_host)
    say(f"== the older version replayed to that host\n  {_served(again, names)}; {again[2][:200]}")
    baseline = story.loaded.project.artifacts.baseline.label
    ok = names.get(_digest(after) or "") == baseline
    ok = ok and again[1].get("manifest_version") == after[1].get("manifest_version")
    with Store.open(story.db_path, read_only=True) as db:
        log = db.rollout_log()
    say("\n== qualify rollout log")
    for r in log:
        say(
            f"  {r['host_class']} {r['action']} v{r['version']} {r['percent']}% {r['artifact']}"
            f" by {r['actor']}: {(r['why'] or '-')[:120]}"
        )
    return ok
