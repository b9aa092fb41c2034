"""Staged rollouts: a class's new artifact published to a cohort of its hosts, step by step, and
a sanctioned rollback when it goes wrong.

Owns the rollout actions (`start`, `abort`) and the rule that each one is a new signed manifest
version built from the current (newest published) one with only that class's entry changed, so
that anti-rollback holds on every host: an abort is a *higher* version pointing the class back at
its rollback package, never an older document. Each action is recorded in the matrix
(``rollouts``) with who ran it and why. The cohort itself is `manifest.resolve.cohort_point`:
hosts place themselves, the manifest only says the rollout id and percentage.

Not built yet: ``advance`` gated on the canary cohort's telemetry, ``hold`` and ``pin``.
"""

from __future__ import annotations

import getpass
import itertools
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from manifest import envelope
from manifest.build import write_manifest
from manifest.load import load_manifest
from manifest.policy import decide
from manifest.signing import load_private_key, sign_encoded
from matrix.store import Store
from qualify.artifacts import ArtifactStore
from qualify.errors import QualifyError
from qualify.project import LoadedProject
from qualify.release import artifact_refs, previous_manifest
from schemas.manifest import Manifest

__all__ = ["RolloutAction", "abort_rollout", "parse_steps", "start_rollout"]

_STEPS = re.compile(r"\s*\d{1,3}\s*(,\s*\d{1,3}\s*)*")


def parse_steps(text: str) -> list[int]:
    """``5,25,100`` as whole percentages, increasing, ending at 100.

    Raises:
        QualifyError: anything else, saying what is wanted.
    """
    if not _STEPS.fullmatch(text):
        raise QualifyError(f"--steps {text[:40]!r}: give whole percentages, e.g. 5,25,100")
    steps = [int(x) for x in text.split(",")]
    if any(b <= a for a, b in itertools.pairwise(steps)) or steps[0] < 1:
        raise QualifyError(f"--steps {text!r}: each step must be larger than the one before")
    if steps[-1] != 100:
        raise QualifyError(f"--steps {text!r}: the last step must be 100 (every host)")
    return steps


@dataclass(frozen=True)
class RolloutAction:
    """What an action published."""

    host_class: str
    version: int
    path: Path
    summary: str


def _current(db: Store) -> tuple[Manifest, dict[str, Any]]:
    latest = db.latest_manifest()
    previous = previous_manifest(db)
    if latest is None or previous is None:
        raise QualifyError(
            "no manifest has been published from this matrix: run qualify manifest generate first"
        )
    return previous, json.loads(latest[1])["signed"]


def _publish(
    db: Store,
    signed: dict[str, Any],
    *,
    key_path: Path,
    out: Path,
    now: datetime,
    expires_in: timedelta,
) -> int:
    """``signed`` as the next version, signed, recorded, written, then published."""
    key = load_private_key(key_path)
    version = max(int(signed["version"]) + 1, db.highest_manifest_version() + 1)
    signed["version"] = version
    signed["created"] = envelope.format_time(now)
    signed["expires"] = envelope.format_time(now + expires_in)
    _document, canonical = sign_encoded(signed, key)
    load_manifest(canonical, source=str(out))  # what is published must load
    db.save_manifest(version, str(signed["release"]), now, now + expires_in, canonical.decode())
    out.parent.mkdir(parents=True, exist_ok=True)
    write_manifest(canonical, out)
    db.mark_published(version)
    return version


def _entry(signed: dict[str, Any], host_class: str) -> dict[str, Any]:
    entry = signed["entries"].get(host_class)
    if entry is None:
        known = ", ".join(sorted(signed["entries"]))
        raise QualifyError(f"the current manifest has no class {host_class!r} ({known})")
    return dict(entry)


def start_rollout(
    loaded: LoadedProject,
    db: Store,
    host_class: str,
    *,
    steps: Sequence[int],
    key_path: Path,
    out: Path,
    now: datetime,
    expires_in: timedelta,
    artifact: str | None = None,
    why: str = "",
    artifact_base_uri: str | None = None,
    who: Callable[[], str] = getpass.getuser,
) -> RolloutAction:
    """Publish a version whose entry for ``host_class`` rolls ``artifact`` (default: the
    candidate the matrix now supports for it) out to ``steps[0]`` percent of its hosts.

    Raises:
        QualifyError: no published manifest, an unknown class, a rollout already in progress,
            or an artifact that has not qualified on the class.
    """
    previous, signed = _current(db)
    entry = _entry(signed, host_class)
    if entry.get("rollout") is not None:
        raise QualifyError(
            f"{host_class} already has rollout {entry['rollout']['id']!r} in progress (step "
            f"{entry['rollout']['step']}); abort it first"
        )
    runs = {r.run_id: r for r in db.runs()}
    store = ArtifactStore(Path(db.path).resolve().parent / "artifacts")
    digests, refs = artifact_refs(loaded, store, artifact_base_uri)
    decisions = {
        d.host_class: d
        for d in decide(loaded.project, db.latest_cells(), runs, previous=previous, digests=digests)
    }
    decision = decisions.get(host_class)
    if decision is None or decision.decision != "candidate" or decision.artifact_digest is None:
        raise QualifyError(
            f"{host_class}: no candidate qualified on this class in the matrix, so there is "
            "nothing to roll out (qualify run it, then try again)"
        )
    if artifact is not None and decision.artifact_name != artifact:
        raise QualifyError(
            f"{host_class}: {artifact} has not qualified on this class; the matrix supports "
            f"{decision.artifact_name}"
        )
    current = (entry.get("artifact") or {}).get("digest")
    if current == decision.artifact_digest:
        raise QualifyError(f"{host_class} already runs {decision.artifact_name} at 100%")
    ref = refs[decision.artifact_digest]
    rollout_id = f"{host_class}-{now.strftime('%Y%m%dT%H%M%SZ')}"
    entry["rollout"] = {
        "id": rollout_id,
        "artifact": {
            "name": ref.name,
            "digest": decision.artifact_digest,
            "length": ref.length,
            "uri": ref.uri,
        },
        "percent": int(steps[0]),
        "step": 1,
        "steps": [int(s) for s in steps],
    }
    signed["entries"] = {**signed["entries"], host_class: entry}
    version = _publish(db, signed, key_path=key_path, out=out, now=now, expires_in=expires_in)
    db.record_rollout(
        rollout_id, host_class, "start", version, 1, int(steps[0]), ref.name, who(), why, now
    )
    return RolloutAction(
        host_class,
        version,
        out,
        f"{host_class}: rollout {rollout_id} of {ref.name} started at {steps[0]}% (v{version})",
    )


def abort_rollout(
    loaded: LoadedProject,
    db: Store,
    host_class: str,
    *,
    key_path: Path,
    out: Path,
    now: datetime,
    expires_in: timedelta,
    why: str,
    who: Callable[[], str] = getpass.getuser,
) -> RolloutAction:
    """Publish a sanctioned rollback: a newer version whose entry for ``host_class`` has no
    rollout and runs the class's rollback package, so that every host, canary or not, goes
    back to it and no host has to accept an older document.

    Raises:
        QualifyError: no published manifest, an unknown class, or nothing to abort.
    """
    _, signed = _current(db)
    entry = _entry(signed, host_class)
    rollout = entry.pop("rollout", None)
    if rollout is None:
        raise QualifyError(f"{host_class} has no rollout in progress to abort")
    rollback = entry.get("rollback")
    if rollback is not None:
        entry["artifact"] = {k: rollback[k] for k in ("name", "digest", "length", "uri")}
        baseline = loaded.project.artifacts.baseline.label
        entry["decision"] = "baseline" if rollback["name"] == baseline else "candidate"
        entry["evidence"] = None  # the evidence was the rolled-out-from artifact's
        target = rollback["name"]
    else:
        target = (entry.get("artifact") or {}).get("name", "its current artifact")
    entry["summary"] = (
        f"{host_class} was rolled back to {target}: rollout {rollout['id']} aborted ({why})"
    )[:500]
    signed["entries"] = {**signed["entries"], host_class: entry}
    version = _publish(db, signed, key_path=key_path, out=out, now=now, expires_in=expires_in)
    db.record_rollout(
        rollout["id"],
        host_class,
        "abort",
        version,
        int(rollout["step"]),
        0,
        str(rollout["artifact"]["name"]),
        who(),
        why,
        now,
    )
    return RolloutAction(
        host_class,
        version,
        out,
        f"{host_class}: rollout {rollout['id']} aborted; every host goes back to {target} "
        f"(v{version})",
    )
