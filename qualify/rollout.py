"""Staged rollouts: a class's new artifact published to a cohort of its hosts, step by step, and
a sanctioned rollback when it goes wrong.

Owns the rollout actions (`start`, `abort`) and the rule that each one is a new signed manifest
version built from the current (newest published) one with only that class's entry changed, so
that anti-rollback holds on every host: an abort is a *higher* version pointing the class back at
its rollback package, never an older document. Each action is recorded in the matrix
(``rollouts``) with who ran it and why. The cohort itself is `manifest.resolve.cohort_point`:
hosts place themselves, the manifest only says the rollout id and percentage.

An advance (`advance_rollout`) is gated on what the cohort's hosts reported since the step
began, judged by ``telemetry check``'s own rules on the manifest as the cohort sees it
(`canary_view`: the rollout's artifact assigned): any alert, too few latencies to bound the
cohort's p99, or no event at all halts it (``no_data`` never passes), and so does a cohort whose
p99 is above the rest of the class's over the same window.

A person can also steer a class by hand: ``hold`` publishes it as held (its hosts keep what
they run), ``pin`` publishes it on one artifact, and both stay in force through later
``manifest generate`` runs (which keep the class's published entry) until ``clear``.
"""

from __future__ import annotations

import getpass
import itertools
import json
import os
import pwd
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from manifest import envelope
from manifest.load import load_manifest
from manifest.policy import decide
from manifest.signing import load_private_key, sign_encoded
from matrix.publications import steering
from matrix.store import Store
from matrix.telemetry import Cohort, rollout_reported
from qualify.artifacts import ArtifactStore
from qualify.errors import QualifyError
from qualify.project.load import LoadedProject
from qualify.release.generate import artifact_refs, previous_document, previous_manifest
from qualify.release.publishing import Publication, log_row, publish
from schemas.manifest import Manifest, Rollback
from schemas.telemetry import CheckSettings, ClassState, TelemetryCheck

__all__ = [
    "RolloutAction",
    "StepVerdict",
    "abort_rollout",
    "actor",
    "advance_rollout",
    "canary_view",
    "clear_class",
    "hold_class",
    "judge_step",
    "parse_steps",
    "pin_class",
    "start_rollout",
]

_STEPS = re.compile(r"\s*\d{1,3}\s*(,\s*\d{1,3}\s*)*")


def actor() -> str:
    """Who ran a rollout command, as the log records it: the name the environment claims
    (``$LOGNAME``/``$USER``, as ``getpass.getuser`` reads them: anyone can set them, so it is a
    claim, not an identity) and, beside it, the account the process runs as (its effective uid
    in the password database), which the environment cannot change: ``alice [OS user deploy]``.
    """
    try:
        claimed = getpass.getuser()
    except (KeyError, OSError):
        claimed = "unknown"
    uid = os.geteuid()
    try:
        account = pwd.getpwuid(uid).pw_name
    except KeyError:
        account = f"uid {uid}"
    return f"{claimed[:80]} [OS user {account}]"


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
    document = previous_document(db)
    previous = previous_manifest(db)
    assert previous is not None  # previous_document raised otherwise
    return previous, json.loads(document)["signed"]


def _not_steered(db: Store, host_class: str) -> None:
    row = db.class_holds().get(host_class)
    if row is not None:
        raise QualifyError(
            f"{host_class} is {'held' if row['action'] == 'hold' else 'pinned'} by "
            f"{row['actor']} ({row['why']}); qualify rollout clear {host_class} first"
        )


def _publish(
    db: Store,
    signed: dict[str, Any],
    *,
    key_path: Path,
    out: Path,
    now: datetime,
    expires_in: timedelta,
    per_class_dir: Path | None = None,
    log: dict[str, Any],
) -> int:
    """``signed`` as the next version, signed and published as one transaction with its
    rollout-log row (``log``: `publishing.log_row`'s arguments but the version), so that the
    version is current exactly when the log records it (``qualify.release.publishing``)."""
    key = load_private_key(key_path)
    version = max(int(signed["version"]) + 1, db.highest_manifest_version() + 1)
    signed["version"] = version
    signed["created"] = envelope.format_time(now)
    signed["expires"] = envelope.format_time(now + expires_in)
    document, canonical = sign_encoded(signed, key)
    load_manifest(canonical, source=str(out))  # what is published must load
    row = log_row(version=version, **log)
    publish(
        db,
        Publication(
            version=version,
            release=str(signed["release"]),
            document=document,
            canonical=canonical,
            key=key,
            out=out,
            created=now,
            expires=now + expires_in,
            what=f"rollout {row['action']} {row['host_class']}",
            per_class_dir=per_class_dir,
            log=(row,),
        ),
    )
    return version


def _log(
    rollout_id: str,
    host_class: str,
    action: str,
    step: int,
    percent: int,
    artifact: str,
    actor: str,
    why: str,
    at: datetime,
) -> dict[str, Any]:
    """A rollout-log row but its version (which `_publish` knows)."""
    return {
        "rollout_id": rollout_id,
        "host_class": host_class,
        "action": action,
        "step": step,
        "percent": percent,
        "artifact": artifact,
        "actor": actor,
        "why": why,
        "at": at,
    }


def _rollback_after(
    replaced: dict[str, Any] | None,
    new: dict[str, Any] | None,
    rollback: dict[str, Any] | None,
) -> dict[str, Any] | None:
    """An entry's rollback once a person moved it from ``replaced`` to ``new`` (None: held):
    the most recent artifact the class was assigned other than ``new`` (never the entry's own):
    the one it replaces (its hosts ran it, so it loads there), else the rollback it had, else
    none."""
    mine = None if new is None else new["digest"]
    if replaced is not None and replaced["digest"] != mine:
        return {
            **{k: replaced[k] for k in ("name", "digest", "length", "uri")},
            "proven_to_load": True,
            "runtime": None,
            "provider": None,
        }
    if rollback is not None and rollback["digest"] != mine:
        return rollback
    return None


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
    per_class_dir: Path | None = None,
    artifact: str | None = None,
    why: str = "",
    artifact_base_uri: str | None = None,
    who: Callable[[], str] = actor,
) -> RolloutAction:
    """Publish a version whose entry for ``host_class`` rolls ``artifact`` (default: the
    candidate the matrix now supports for it) out to ``steps[0]`` percent of its hosts.

    Raises:
        QualifyError: no published manifest, an unknown class, a rollout already in progress,
            or an artifact that has not qualified on the class.
    """
    previous, signed = _current(db)
    entry = _entry(signed, host_class)
    _not_steered(db, host_class)
    if entry.get("rollout") is not None:
        raise QualifyError(
            f"{host_class} already has rollout {entry['rollout']['id']!r} in progress (step "
            f"{entry['rollout']['step']}); abort it first"
        )
    # What manifest generate and the release gate decide on: the same cells, runs and digests.
    runs = {r.run_id: r for r in db.decision_runs()}
    store = ArtifactStore(Path(db.path).resolve().parent / "artifacts")
    digests, refs = artifact_refs(loaded, store, artifact_base_uri)
    decisions = {
        d.host_class: d
        for d in decide(
            loaded.project,
            db.decision_cells_by_key(),
            runs,
            previous=previous,
            digests=digests,
        )
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
    rollout_id = _new_rollout_id(db, host_class, now)
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
    # The entry's own reasons were those of the release before (why the class did not get the
    # candidate then): now that it qualified and rolls out, they say so.
    rest = (entry.get("artifact") or {}).get("name") or "what they run (held)"
    going = f"rollout {rollout_id} of {ref.name} in progress"
    entry["summary"] = (
        f"{host_class} runs {rest} while rollout {rollout_id} of {ref.name} reaches its hosts "
        "step by step"
    )[:500]
    entry["reasons"] = [
        {
            "code": "rollout_in_progress",
            "message": f"{going}: the hosts of its cohort run {ref.name}, the rest {rest}"[:500],
        },
        *(r.model_dump(mode="json") for r in decision.reasons),
    ]
    signed["entries"] = {**signed["entries"], host_class: entry}
    log = _log(rollout_id, host_class, "start", 1, int(steps[0]), ref.name, who(), why, now)
    version = _publish(
        db,
        signed,
        log=log,
        key_path=key_path,
        out=out,
        now=now,
        expires_in=expires_in,
        per_class_dir=per_class_dir,
    )
    return RolloutAction(
        host_class,
        version,
        out,
        f"{host_class}: rollout {rollout_id} of {ref.name} started at {steps[0]}% (v{version})",
    )


def _new_rollout_id(db: Store, host_class: str, now: datetime) -> str:
    """``<class>-<time>``, with ``-2``, ``-3``... after a start within the same second."""
    base = f"{host_class}-{now.strftime('%Y%m%dT%H%M%SZ')}"
    used = {str(r["rollout_id"]) for r in db.rollout_log(host_class)}
    found, n = base, 1
    while found in used:
        n += 1
        found = f"{base}-{n}"
    return found


def abort_rollout(
    loaded: LoadedProject,
    db: Store,
    host_class: str,
    *,
    key_path: Path,
    out: Path,
    now: datetime,
    expires_in: timedelta,
    per_class_dir: Path | None = None,
    why: str,
    who: Callable[[], str] = actor,
) -> RolloutAction:
    """Publish a sanctioned rollback: a newer version whose entry for ``host_class`` has no
    rollout, so that every host, canary or not, runs what the rest of the class runs (the
    cohort's rollback, as `canary_view` judges it), or, for a class that ran nothing (held),
    its rollback package; no host has to accept an older document. Releases keep the class
    so until ``qualify rollout clear`` or a new ``rollout start``.

    Raises:
        QualifyError: no published manifest, an unknown class, or nothing to abort.
    """
    _, signed = _current(db)
    entry = _entry(signed, host_class)
    rollout = entry.pop("rollout", None)
    if rollout is None:
        raise QualifyError(f"{host_class} has no rollout in progress to abort")
    current, rollback = entry.get("artifact"), entry.get("rollback")
    if current is not None:
        target = str(current["name"])  # the rest of the class runs it: its rollback stays
    elif rollback is not None:
        entry["artifact"] = {k: rollback[k] for k in ("name", "digest", "length", "uri")}
        baseline = loaded.project.artifacts.baseline.label
        entry["decision"] = "baseline" if rollback["name"] == baseline else "candidate"
        entry["evidence"] = None  # a held entry's evidence was not this artifact's
        entry["rollback"] = _rollback_after(None, entry["artifact"], rollback)
        target = str(rollback["name"])
    else:
        target = "nothing new (held)"
    entry["summary"] = (
        f"{host_class} was rolled back to {target}: rollout {rollout['id']} aborted ({why})"
    )[:500]
    entry["reasons"] = [
        {"code": "rolled_back", "message": f"rollout {rollout['id']} aborted: {why}"[:500]}
    ]
    signed["entries"] = {**signed["entries"], host_class: entry}
    step, name = int(rollout["step"]), str(rollout["artifact"]["name"])
    version = _publish(
        db,
        signed,
        log=_log(rollout["id"], host_class, "abort", step, 0, name, who(), why, now),
        key_path=key_path,
        out=out,
        now=now,
        expires_in=expires_in,
        per_class_dir=per_class_dir,
    )
    return RolloutAction(
        host_class,
        version,
        out,
        f"{host_class}: rollout {rollout['id']} aborted; every host goes back to {target} "
        f"(v{version})",
    )


def canary_view(manifest: Manifest, host_class: str) -> Manifest:
    """The manifest as the rollout's cohort sees it, holding only ``host_class``: its entry
    assigns the rollout's artifact, with the current one as the rollback (so that the rest of
    the class, running it, is a warning and not an alert)."""
    entry = manifest.signed.entries[host_class]
    if entry.rollout is None:
        raise QualifyError(f"{host_class} has no rollout in progress")
    current = entry.artifact
    rollback = (
        Rollback(
            name=current.name,
            digest=current.digest,
            length=current.length,
            uri=current.uri,
            proven_to_load=True,
            runtime=None,
            provider=None,
        )
        if current is not None
        else entry.rollback
    )
    canary = entry.model_copy(
        update={
            "decision": "candidate",
            "artifact": entry.rollout.artifact,
            "rollback": rollback,
            "evidence": None,
            "rollout": None,
        }
    )
    signed = manifest.signed.model_copy(update={"entries": {host_class: canary}})
    return manifest.model_copy(update={"signed": signed})


@dataclass(frozen=True)
class StepVerdict:
    """Whether a rollout step may advance, and the evidence."""

    problems: list[str]
    cohort: ClassState | None
    rest: ClassState | None

    @property
    def ok(self) -> bool:
        return not self.problems

    def evidence(self) -> str:
        """One line for the rollout log."""
        parts = []
        for what, state in (("cohort", self.cohort), ("rest", self.rest)):
            if state is not None:
                p99 = state.observed_p99_ms
                parts.append(
                    f"{what}: {state.events} events from {state.hosts} hosts, "
                    + (f"p99 {p99:.3g} ms ({state.p99})" if p99 is not None else "no latency")
                )
        return "; ".join(parts)


def _state(check: TelemetryCheck, host_class: str) -> ClassState | None:
    return next((s for s in check.classes if s.host_class == host_class), None)


def judge_step(
    host_class: str,
    cohort_check: TelemetryCheck,
    class_check: TelemetryCheck,
    tolerance: float,
    *,
    sides_reported: bool = False,
) -> StepVerdict:
    """The gate of one step: ``cohort_check`` is ``telemetry check`` over `canary_view`,
    ``class_check`` over the manifest itself (the rest of the class), both over the step's
    window. With ``sides_reported`` the cohort's events are the hosts that said they are in
    it, so one still running the current artifact is a problem, not the rest of the class."""
    problems: list[str] = []
    cohort = _state(cohort_check, host_class)
    rest = _state(class_check, host_class)
    if cohort is None or cohort.events == 0:
        problems.append("no_data: no event from the class since the step began")
    for alert in cohort_check.alerts:
        if alert.host_class != host_class or alert.kind == "no_data":
            continue
        if alert.kind == "unexpected_digest" and alert.severity == "warning":
            if not sides_reported:
                continue  # the rest of the class, on the current artifact
            problems.append(
                f"canary_not_switched: hosts in the cohort still run the current artifact "
                f"({alert.message})"
            )
            continue
        problems.append(f"{alert.kind}: {alert.message}")
    if cohort is not None and cohort.events and cohort.p99 != "ok":
        problems.append(
            f"p99 {cohort.p99}: the cohort's latencies do not show its p99 within the qualified "
            f"bound (need at least the check's min_samples of them since the step began)"
        )
    if (
        cohort is not None
        and rest is not None
        and cohort.observed_p99_lower_ms is not None
        and rest.observed_p99_upper_ms is not None
        and cohort.observed_p99_lower_ms > rest.observed_p99_upper_ms * (1 + tolerance)
    ):
        problems.append(
            f"slower than the rest: the cohort's p99 is at least "
            f"{cohort.observed_p99_lower_ms:.3g} ms, the rest's at most "
            f"{rest.observed_p99_upper_ms:.3g} ms (tolerance {tolerance:.0%})"
        )
    return StepVerdict(problems=problems, cohort=cohort, rest=rest)


def _step_started(db: Store, rollout_id: str) -> datetime:
    acted = [r for r in db.rollout_log() if r["rollout_id"] == rollout_id and r["action"] != "halt"]
    if not acted:
        raise QualifyError(f"rollout {rollout_id} is not recorded in this matrix")
    return acted[-1]["acted_at"]  # type: ignore[no-any-return]


def advance_rollout(
    db: Store,
    host_class: str,
    *,
    key_path: Path,
    out: Path,
    now: datetime,
    expires_in: timedelta,
    per_class_dir: Path | None = None,
    why: str = "",
    settings: CheckSettings | None = None,
    who: Callable[[], str] = actor,
    loaded: LoadedProject | None = None,
) -> tuple[RolloutAction | None, StepVerdict]:
    """Advance ``host_class``'s rollout one step if the cohort's telemetry since the step began
    allows it (`judge_step`); at the last step (100%) the rollout's artifact becomes the entry's
    and the one it replaced its rollback (`_completed`: with ``loaded``, the entry's evidence
    and reasons are the matrix's for that artifact under today's project, never the ones of
    what it replaced). A halt publishes nothing and is recorded.

    Returns:
        What was published (None when halted) and the verdict with its evidence.
    """
    from qualify.telemetry.check import check_telemetry
    from qualify.telemetry.watch import gather_aggregates, load_releases

    settings = settings or CheckSettings()
    manifest, signed = _current(db)
    entry = _entry(signed, host_class)
    rollout = entry.get("rollout")
    if rollout is None:
        raise QualifyError(f"{host_class} has no rollout in progress to advance")
    start = _step_started(db, rollout["id"])
    cells = db.latest_cells()
    view = canary_view(manifest, host_class)
    # Hosts that say which side of the rollout they are on are judged by it (a canary host
    # still on the old artifact is then an unexpected digest); hosts too old to say are told
    # apart by the artifact they report.
    sides: tuple[Cohort, Cohort] | tuple[None, None] = (
        ((rollout["id"], "canary"), (rollout["id"], "rest"))
        if rollout_reported(db, rollout["id"], start=start, end=now)
        else (None, None)
    )
    # The cohort is judged against the manifest as it sees it; the rest of the class as
    # `telemetry check` judges it, each host against the version it reports.
    cohort = check_telemetry(
        view,
        cells,
        gather_aggregates(
            db, view, start=start, end=now, settings=settings, cohort=sides[0], cells=cells
        ),
        now=now,
        settings=settings,
    )
    whole = check_telemetry(
        manifest,
        cells,
        gather_aggregates(
            db,
            manifest,
            start=start,
            end=now,
            settings=settings,
            cohort=sides[1],
            releases=load_releases(db, manifest, start=start, end=now),
            cells=cells,
        ),
        now=now,
        settings=settings,
    )
    verdict = judge_step(
        host_class, cohort, whole, settings.p99_tolerance, sides_reported=sides[0] is not None
    )
    step, steps = int(rollout["step"]), [int(s) for s in rollout["steps"]]
    name = str(rollout["artifact"]["name"])
    if not verdict.ok:
        db.record_rollout(
            rollout["id"],
            host_class,
            "halt",
            manifest.signed.version,
            step,
            int(rollout["percent"]),
            name,
            who(),
            "; ".join(verdict.problems)[:1000],
            now,
        )
        return None, verdict
    if step >= len(steps) or steps[step - 1] >= 100:
        entry = _completed(entry, host_class, loaded, db, manifest)
        action, percent, said = "complete", 100, f"completed: every host runs {name}"
    else:
        percent = steps[step]
        entry["rollout"] = {**rollout, "step": step + 1, "percent": percent}
        action, said = "advance", f"advanced to {percent}% (step {step + 1} of {len(steps)})"
    signed["entries"] = {**signed["entries"], host_class: entry}
    note = verdict.evidence() + (f"; {why}" if why else "")
    at = min(step + 1, len(steps))
    version = _publish(
        db,
        signed,
        log=_log(rollout["id"], host_class, action, at, percent, name, who(), note, now),
        key_path=key_path,
        out=out,
        now=now,
        expires_in=expires_in,
        per_class_dir=per_class_dir,
    )
    return RolloutAction(host_class, version, out, f"{host_class}: {said} (v{version})"), verdict


def _completed(
    entry: dict[str, Any],
    host_class: str,
    loaded: LoadedProject | None,
    db: Store,
    manifest: Manifest,
) -> dict[str, Any]:
    """The entry once its rollout reached every host: the rollout's artifact is the entry's,
    the one it replaced its rollback (proven: its hosts ran it), and the reasons say so. The
    evidence is the cell the matrix decides the class on for that artifact under ``loaded``'s
    project, as ``manifest generate`` would write it; without it (no project given, or the
    matrix no longer shows the artifact passing there) it is null and a reason says why. A
    reason of the entry before (a pin long cleared, its abort) is never carried on."""
    rollout = entry.pop("rollout")
    name = str(rollout["artifact"]["name"])
    entry["rollback"] = _rollback_after(
        entry.get("artifact"), rollout["artifact"], entry.get("rollback")
    )
    entry["artifact"] = dict(rollout["artifact"])
    entry["decision"] = "candidate"
    done = f"rollout {rollout['id']} of {name} reached every host"
    entry["evidence"], entry["run_ids"] = None, []
    decision = None
    if loaded is not None:
        runs = {r.run_id: r for r in db.decision_runs()}
        decided = decide(loaded.project, db.decision_cells(), runs, previous=manifest)
        decision = next((d for d in decided if d.host_class == host_class), None)
    if (
        decision is not None
        and decision.artifact_digest == rollout["artifact"]["digest"]
        and decision.evidence is not None
    ):
        entry["evidence"] = decision.evidence.model_dump(mode="json")
        entry["run_ids"] = list(decision.run_ids)
        entry["reasons"] = [{"code": "rollout_completed", "message": done}] + [
            r.model_dump(mode="json") for r in decision.reasons
        ]
    else:
        why = (
            "no project file was given to re-judge it"
            if loaded is None
            else f"the matrix does not now show {name} passing on this class"
        )
        message = f"{done}; no evidence in this entry: {why}"[:500]
        entry["reasons"] = [{"code": "rollout_completed", "message": message}]
    entry["summary"] = f"{host_class} runs {name}: {done}"[:500]
    return entry


def _steer(
    db: Store,
    host_class: str,
    action: str,
    entry: dict[str, Any],
    signed: dict[str, Any],
    *,
    artifact: str,
    key_path: Path,
    out: Path,
    now: datetime,
    expires_in: timedelta,
    per_class_dir: Path | None = None,
    why: str,
    who: Callable[[], str],
) -> int:
    rollout = entry.pop("rollout", None)
    signed["entries"] = {**signed["entries"], host_class: entry}
    rollout_id = rollout["id"] if rollout is not None else f"{host_class}-{action}"
    return _publish(
        db,
        signed,
        log=_log(rollout_id, host_class, action, 0, 0, artifact, who(), why, now),
        key_path=key_path,
        out=out,
        now=now,
        expires_in=expires_in,
        per_class_dir=per_class_dir,
    )


def hold_class(
    db: Store,
    host_class: str,
    *,
    key_path: Path,
    out: Path,
    now: datetime,
    expires_in: timedelta,
    per_class_dir: Path | None = None,
    why: str,
    who: Callable[[], str] = actor,
) -> RolloutAction:
    """Publish ``host_class`` as held: every host of it keeps what it runs now (a rollout in
    progress stops where it is, its cohort on the new artifact), and later releases keep the
    hold until `clear_class`.

    Raises:
        QualifyError: no published manifest, an unknown class, or one already held or pinned.
    """
    _, signed = _current(db)
    entry = _entry(signed, host_class)
    _not_steered(db, host_class)
    rollout = entry.get("rollout")
    stopped = f" (rollout {rollout['id']} stopped at {rollout['percent']}%)" if rollout else ""
    entry["decision"] = "hold"
    entry["rollback"] = _rollback_after(entry.get("artifact"), None, entry.get("rollback"))
    entry["artifact"] = None
    entry["evidence"] = None
    entry["reasons"] = [{"code": "held", "message": f"held by {who()}: {why}"[:500]}]
    entry["summary"] = f"{host_class} is held: its hosts keep what they run{stopped} ({why})"[:500]
    version = _steer(
        db,
        host_class,
        "hold",
        entry,
        signed,
        artifact="",
        key_path=key_path,
        out=out,
        now=now,
        expires_in=expires_in,
        why=why,
        who=who,
        per_class_dir=per_class_dir,
    )
    return RolloutAction(host_class, version, out, f"{host_class}: held{stopped} (v{version})")


def pin_class(
    loaded: LoadedProject,
    db: Store,
    host_class: str,
    *,
    key_path: Path,
    out: Path,
    now: datetime,
    expires_in: timedelta,
    per_class_dir: Path | None = None,
    why: str,
    artifact: str | None = None,
    who: Callable[[], str] = actor,
) -> RolloutAction:
    """Publish ``host_class`` pinned to ``artifact`` (default: what it runs now): one of the
    artifacts the class runs or returns to, or the approved baseline, for every host of it;
    later releases keep the pin until `clear_class`.

    Raises:
        QualifyError: no published manifest, an unknown class or artifact, a class already held
            or pinned, or a rollout in progress (abort it, or let it complete, first).
    """
    _, signed = _current(db)
    entry = _entry(signed, host_class)
    _not_steered(db, host_class)
    if entry.get("rollout") is not None:
        raise QualifyError(
            f"{host_class} has rollout {entry['rollout']['id']} in progress: abort it or let it "
            "complete before pinning the class"
        )
    choices: dict[str, dict[str, Any]] = {}
    for known in (entry.get("rollback"), entry.get("artifact")):
        if known is not None:
            choices[str(known["name"])] = {k: known[k] for k in ("name", "digest", "length", "uri")}
    baseline = loaded.project.artifacts.baseline.label
    if baseline not in choices:
        store = ArtifactStore(Path(db.path).resolve().parent / "artifacts")
        digests, refs = artifact_refs(loaded, store, None)
        ref = refs[digests[baseline]]
        choices[baseline] = {
            "name": baseline,
            "digest": digests[baseline],
            "length": ref.length,
            "uri": ref.uri,
        }
    name = artifact or (entry.get("artifact") or {}).get("name")
    if name is None:
        raise QualifyError(
            f"{host_class} runs nothing in the current manifest (held): pass --artifact, one of "
            + ", ".join(sorted(choices))
        )
    if name not in choices:
        raise QualifyError(
            f"{host_class} can be pinned to what it runs or returns to, or the approved baseline "
            f"({', '.join(sorted(choices))}), not {name!r}"
        )
    old = (entry.get("artifact") or {}).get("digest")
    entry["rollback"] = _rollback_after(entry.get("artifact"), choices[name], entry.get("rollback"))
    entry["artifact"] = choices[name]
    entry["decision"] = "baseline" if name == baseline else "candidate"
    if old != choices[name]["digest"]:
        entry["evidence"] = None  # the evidence was the other artifact's
    entry["reasons"] = [{"code": "pinned", "message": f"pinned by {who()}: {why}"[:500]}]
    entry["summary"] = f"{host_class} is pinned to {name} ({why})"[:500]
    version = _steer(
        db,
        host_class,
        "pin",
        entry,
        signed,
        artifact=name,
        key_path=key_path,
        out=out,
        now=now,
        expires_in=expires_in,
        why=why,
        who=who,
        per_class_dir=per_class_dir,
    )
    return RolloutAction(host_class, version, out, f"{host_class}: pinned to {name} (v{version})")


def clear_class(
    db: Store,
    host_class: str,
    *,
    now: datetime,
    why: str,
    who: Callable[[], str] = actor,
) -> str:
    """Lift a hold, a pin or an aborted rollout: nothing is published; the next ``manifest
    generate`` decides the class from the matrix again. Returns what happened, for people.

    Raises:
        QualifyError: nothing a person steers is in force on the class.
    """
    row = steering(db).get(host_class)
    if row is None:
        raise QualifyError(
            f"{host_class} is neither held nor pinned, and no aborted rollout is in force on it"
        )
    db.record_rollout(
        str(row["rollout_id"]),
        host_class,
        "clear",
        int(row["version"]),
        0,
        0,
        str(row["artifact"]),
        who(),
        why,
        now,
    )
    what = {"hold": "hold", "pin": "pin", "abort": f"abort of rollout {row['rollout_id']}"}
    return (
        f"{host_class}: {what[str(row['action'])]} cleared; the next qualify manifest generate "
        "decides it from the matrix again"
    )
