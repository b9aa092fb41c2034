"""The demo's rollouts: the two classes whose telemetry raised alerts are pinned back to the
baseline, then rolled out again in steps, one promoted to 100% on healthy canary telemetry and
one aborted when its canary shows a provider change.

Owns the story and the canary traffic it needs (seeded, deterministic): each step's window gets
events from the class's hosts, each saying which side of the rollout it resolved into (its id
placed in or out of the cohort by ``manifest.resolve.cohort_point``, as a host would), running
what the manifest gives that side with the qualified placement and latencies. The injected fault
is the same as the telemetry demo's: nodes moved to ``OpenVINOExecutionProvider`` without a
digest change, in the canary only. Every action is the real one (``qualify.rollout``), each a
new signed version, and the aborted class's canary host resolves with the real
``resolve-artifact`` before and after, then is replayed the older version and refuses it.

Does not own the rollout rules (``qualify.rollout``) or the rest of the demo (``qualify.demo.story``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from manifest.host_events import FORMAT, encode_event, format_time
from manifest.resolve import cohort_point
from matrix.store import Store
from qualify.artifacts import digest_file
from qualify.demo.telemetry import SHIFTED_PROVIDER
from qualify.project.load import LoadedProject
from qualify.release.generate import previous_manifest
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

    key = workdir / "release.key"
    out = workdir / "manifest.json"
    publish: dict[str, Any] = {
        "key_path": key,
        "out": out,
        "expires_in": timedelta(days=30),
        "per_class_dir": workdir / "manifest.d",
    }
    baseline = loaded.project.artifacts.baseline.label
    specs = [loaded.project.artifacts.baseline, *loaded.project.artifacts.candidates]
    names = {digest_file(loaded.resolve(spec.path)): spec.label for spec in specs}
    with Store.open(db_path, read_only=True) as db:
        current = previous_manifest(db)
        cells = db.latest_cells()
    classes = [c for c in (healthy, faulty) if c is not None]
    if (
        current is None
        or len(classes) < 2
        or any(current.signed.entries[c].decision != "candidate" for c in classes)
    ):
        say("  (skipped: the rollout demo needs two classes running a qualified candidate)")
        return False
    assert healthy is not None and faulty is not None
    settings = CheckSettings(p99_tolerance=tolerance)
    rng = np.random.default_rng(seed)
    t = now + timedelta(minutes=1)
    with Store.open(db_path) as db:
        for name, why in (
            (healthy, "provider changed after a driver update"),
            (faulty, "p99 regressed"),
        ):
            done = pin_class(
                loaded, db, name, artifact=baseline, why=why, now=t, who=lambda: "demo", **publish
            )
            say(
                f"\n== qualify rollout pin {name} --artifact {baseline} --why {why!r}\n  {done.summary}"
            )
            say(
                f"== qualify rollout clear {name} --why fixed (once the cause is fixed)\n  "
                + clear_class(db, name, now=t, why="fixed", who=lambda: "demo")
            )
    t += timedelta(minutes=1)
    with Store.open(db_path) as db:
        for name in (healthy, faulty):
            done = start_rollout(
                loaded,
                db,
                name,
                steps=ROLLOUT_STEPS,
                why="re-qualified",
                now=t,
                who=lambda: "demo",
                **publish,
            )
            say(f"\n== qualify rollout start {name} --steps 25,100\n  {done.summary}")
    with Store.open(db_path, read_only=True) as db:
        rolling = previous_manifest(db)
    assert rolling is not None
    staged = rolling.signed.entries[faulty].rollout
    assert staged is not None
    canary_host = next(
        host
        for host in (f"{faulty}-{i:03d}" for i in range(ROLLOUT_HOSTS))
        if cohort_point(staged.id, host) < staged.percent
    )
    first = resolve(out, faulty, canary_host)
    say(
        f"\n== resolve-artifact --host-class {faulty} --host-id {canary_host} (in the canary)\n  {_served(first, names)}"
    )
    v_start = out.read_bytes()
    ok = True
    for name, fault in ((healthy, False), (faulty, True)):
        say(f"\n== rollout of {name}")
        for _ in ROLLOUT_STEPS:
            window = t + timedelta(seconds=1)
            _traffic(workdir, db_path, cells, name, start=window, rng=rng, fault=fault, echo=say)
            t = window + _WINDOW
            with Store.open(db_path) as db:
                step, verdict = advance_rollout(
                    db,
                    name,
                    now=t,
                    who=lambda: "demo",
                    settings=settings,
                    loaded=loaded,
                    **publish,
                )
            say(
                f"  qualify rollout advance {name} --tolerance {tolerance:g}: evidence: "
                f"{verdict.evidence()}"
            )
            if step is None:
                for problem in verdict.problems:
                    say(f"  halted: {problem[:300]}")
                with Store.open(db_path) as db:
                    aborted = abort_rollout(
                        loaded,
                        db,
                        name,
                        why="provider change in the canary",
                        now=t,
                        who=lambda: "demo",
                        **publish,
                    )
                say(f"  qualify rollout abort {name}: {aborted.summary}")
                ok = ok and fault
                break
            say(f"  {step.summary}")
        else:
            ok = ok and not fault
    after = resolve(out, faulty, canary_host)
    say(
        f"\n== resolve-artifact --host-class {faulty} --host-id {canary_host} after the abort\n  {_served(after, names)}"
    )
    replay = workdir / "hosts" / "replayed-manifest.json"
    write_atomic(replay, v_start)
    again = resolve(replay, faulty, canary_host)
    say(f"== the older version replayed to that host\n  {_served(again, names)}; {again[2][:200]}")
    ok = ok and names.get(_digest(after) or "") == baseline
    ok = ok and again[1].get("manifest_version") == after[1].get("manifest_version")
    with Store.open(db_path, read_only=True) as db:
        log = db.rollout_log()
    say("\n== qualify rollout log")
    for r in log:
        say(
            f"  {r['host_class']} {r['action']} v{r['version']} {r['percent']}% {r['artifact']}"
            f" by {r['actor']}: {(r['why'] or '-')[:120]}"
        )
    return ok
