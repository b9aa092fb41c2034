"""Staged rollouts, holds and pins: each action publishes a new signed version edited from the
newest one (``qualify.release.edit``) with only its class's entry changed, so that anti-rollback
holds on every host (an abort is a *higher* version pointing back at the rollback), and records
who ran it and why. Does not own a step's telemetry gate (``qualify.telemetry.canary``) nor the
cohort hash (``manifest.lookup.cohort_point``)."""

from __future__ import annotations

import getpass
import itertools
import os
import pwd
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from manifest.policy import decide
from matrix.publications import steering
from matrix.store import Store
from qualify.artifacts import ArtifactStore
from qualify.errors import QualifyError
from qualify.project.load import LoadedProject
from qualify.release.edit import ManifestEdit, edit_manifest
from qualify.release.generate import artifact_refs
from qualify.release.publishing import PublishOptions
from qualify.telemetry.canary import StepVerdict, judge_cohort
from schemas.cell import Reason
from schemas.manifest import (
    ClassDecision,
    Manifest,
    ManifestArtifact,
    ManifestEntry,
    Rollback,
    Rollout,
)
from schemas.telemetry import CheckSettings

__all__ = [
    "SAID_MOST",
    "Note",
    "RolloutAction",
    "abort_rollout",
    "actor",
    "advance_rollout",
    "clear_class",
    "hold_class",
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
    model: str
    """The model line of the manifest it published."""


def _model(edit: ManifestEdit) -> str:
    return edit.manifest.signed.model


SAID_MOST = 500
"""The most characters of a sentence an action writes into an entry (its reason's message, its
summary): they hold a person's ``--why`` and name, of any length."""


@dataclass(frozen=True)
class Note:
    """What a person's action says in the entry it edits: one reason and the summary, each cut
    to `SAID_MOST` here, the one place that bounds them."""

    code: str
    message: str
    summary: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "message", self.message[:SAID_MOST])
        object.__setattr__(self, "summary", self.summary[:SAID_MOST])

    def on(
        self, entry: ManifestEntry, *, also: Sequence[Reason] = (), **update: Any
    ) -> ManifestEntry:
        """``entry`` with ``update``, this note's reason (then ``also``) and its summary."""
        reasons = [Reason(code=self.code, message=self.message), *also]
        return entry.model_copy(update={**update, "reasons": reasons, "summary": self.summary})


def _not_steered(db: Store, host_class: str) -> None:
    row = db.class_holds().get(host_class)
    if row is not None:
        raise QualifyError(
            f"{host_class} is {'held' if row['action'] == 'hold' else 'pinned'} by "
            f"{row['actor']} ({row['why']}); qualify rollout clear {host_class} first"
        )


def _plain(artifact: ManifestArtifact) -> ManifestArtifact:
    """An artifact's location alone (a rollback's, less what it was approved under)."""
    return ManifestArtifact(
        name=artifact.name, digest=artifact.digest, length=artifact.length, uri=artifact.uri
    )


def _rollback_after(
    replaced: ManifestArtifact | None,
    new: ManifestArtifact | None,
    rollback: Rollback | None,
) -> Rollback | None:
    """An entry's rollback once a person moved it from ``replaced`` to ``new`` (None: held):
    the most recent artifact the class was assigned other than ``new`` (never the entry's own):
    the one it replaces (its hosts ran it, so it loads there), else the rollback it had, else
    none."""
    mine = None if new is None else new.digest
    if replaced is not None and replaced.digest != mine:
        return Rollback.ran(replaced)
    if rollback is not None and rollback.digest != mine:
        return rollback
    return None


def _qualified(
    loaded: LoadedProject,
    db: Store,
    previous: Manifest,
    host_class: str,
    artifact: str | None,
    artifact_base_uri: str | None,
) -> tuple[ClassDecision, ManifestArtifact]:
    """The candidate the matrix supports on ``host_class``, decided as ``manifest generate``
    and the release gate decide (the same cells, runs and digests): its decision, and where
    hosts fetch it.

    Raises:
        QualifyError: none qualified there, or not ``artifact``.
    """
    runs = {r.run_id: r for r in db.decision_runs()}
    store = ArtifactStore(Path(db.path).resolve().parent / "artifacts")
    digests, refs = artifact_refs(loaded, store, artifact_base_uri)
    decided = decide(
        loaded.project, db.decision_cells_by_key(), runs, previous=previous, digests=digests
    )
    decision = next((d for d in decided if d.host_class == host_class), None)
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
    ref = refs[decision.artifact_digest]
    where = ManifestArtifact(
        name=ref.name, digest=decision.artifact_digest, length=ref.length, uri=ref.uri
    )
    return decision, where


def start_rollout(
    loaded: LoadedProject,
    db: Store,
    host_class: str,
    options: PublishOptions,
    *,
    steps: Sequence[int],
    artifact: str | None = None,
    artifact_base_uri: str | None = None,
) -> RolloutAction:
    """Publish a version whose entry for ``host_class`` rolls ``artifact`` (default: the
    candidate the matrix now supports for it) out to ``steps[0]`` percent of its hosts.

    Raises:
        QualifyError: no published manifest, an unknown class, a rollout already in progress,
            or an artifact that has not qualified on the class.
    """
    with edit_manifest(db, options) as edit:
        entry = edit.entry(host_class)
        _not_steered(db, host_class)
        if entry.rollout is not None:
            raise QualifyError(
                f"{host_class} already has rollout {entry.rollout.id!r} in progress (step "
                f"{entry.rollout.step}); abort it first"
            )
        decision, ref = _qualified(
            loaded, db, edit.manifest, host_class, artifact, artifact_base_uri
        )
        current = entry.artifact.digest if entry.artifact is not None else None
        if current == ref.digest:
            raise QualifyError(f"{host_class} already runs {ref.name} at 100%")
        rollout_id = _new_rollout_id(db, host_class, options.now)
        rollout = Rollout(id=rollout_id, artifact=ref, percent=steps[0], step=1, steps=list(steps))
        edit.entries[host_class] = _rolling(entry, host_class, rollout, decision.reasons)
        edit.record(
            rollout_id,
            host_class,
            "start",
            step=1,
            percent=steps[0],
            artifact=ref.name,
            why=options.why,
        )
    summary = f"rollout {rollout_id} of {ref.name} started at {steps[0]}% (v{edit.version})"
    return RolloutAction(
        host_class, edit.version, options.out, f"{host_class}: {summary}", _model(edit)
    )


def _rolling(
    entry: ManifestEntry, host_class: str, rollout: Rollout, reasons: Sequence[Reason]
) -> ManifestEntry:
    """``entry`` rolling ``rollout`` out. Its own reasons were those of the release before (why
    the class did not get the candidate then): now that it qualified and rolls out, they say
    so, followed by the candidate's."""
    name = rollout.artifact.name
    rest = entry.artifact.name if entry.artifact is not None else "what they run (held)"
    going = f"rollout {rollout.id} of {name} in progress"
    note = Note(
        "rollout_in_progress",
        f"{going}: the hosts of its cohort run {name}, the rest {rest}",
        f"{host_class} runs {rest} while rollout {rollout.id} of {name} reaches its hosts "
        "step by step",
    )
    return note.on(entry, also=reasons, rollout=rollout)


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
    loaded: LoadedProject, db: Store, host_class: str, options: PublishOptions
) -> RolloutAction:
    """Publish a sanctioned rollback: a newer version whose entry for ``host_class`` has no
    rollout, so that every host, canary or not, runs what the rest of the class runs (the
    cohort's rollback, as ``canary_view`` judges it), or, for a class that ran nothing (held),
    its rollback package; no host has to accept an older document. Releases keep the class
    so until ``qualify rollout clear`` or a new ``rollout start``.

    Raises:
        QualifyError: no published manifest, an unknown class, or nothing to abort.
    """
    with edit_manifest(db, options) as edit:
        entry = edit.entry(host_class)
        rollout = entry.rollout
        if rollout is None:
            raise QualifyError(f"{host_class} has no rollout in progress to abort")
        update, target = _back(entry, loaded.project.artifacts.baseline.label)
        why = options.why
        note = Note(
            "rolled_back",
            f"rollout {rollout.id} aborted: {why}",
            f"{host_class} was rolled back to {target}: rollout {rollout.id} aborted ({why})",
        )
        edit.entries[host_class] = note.on(entry, rollout=None, **update)
        edit.record(
            rollout.id,
            host_class,
            "abort",
            step=rollout.step,
            percent=0,
            artifact=rollout.artifact.name,
            why=why,
        )
    return RolloutAction(
        host_class,
        edit.version,
        options.out,
        f"{host_class}: rollout {rollout.id} aborted; every host goes back to {target} "
        f"(v{edit.version})",
        _model(edit),
    )


def _back(entry: ManifestEntry, baseline: str) -> tuple[dict[str, Any], str]:
    """What an abort changes in ``entry`` besides its rollout and note, and what its hosts go
    back to: what the rest of the class runs (its rollback stays), else, for a held class, its
    rollback package."""
    if entry.artifact is not None:
        return {}, entry.artifact.name
    rollback = entry.rollback
    if rollback is None:
        return {}, "nothing new (held)"
    artifact = _plain(rollback)
    return {
        "artifact": artifact,
        "decision": "baseline" if rollback.name == baseline else "candidate",
        "evidence": None,  # a held entry's evidence was not this artifact's
        "rollback": _rollback_after(None, artifact, rollback),
    }, rollback.name


def _step_started(db: Store, rollout_id: str) -> datetime:
    acted = [r for r in db.rollout_log() if r["rollout_id"] == rollout_id and r["action"] != "halt"]
    if not acted:
        raise QualifyError(f"rollout {rollout_id} is not recorded in this matrix")
    return acted[-1]["acted_at"]  # type: ignore[no-any-return]


def advance_rollout(
    db: Store,
    host_class: str,
    options: PublishOptions,
    *,
    settings: CheckSettings | None = None,
    loaded: LoadedProject | None = None,
) -> tuple[RolloutAction | None, StepVerdict]:
    """Advance ``host_class``'s rollout one step if the cohort's telemetry since the step began
    allows it (``qualify.telemetry.canary``); at the last step (100%) the rollout's artifact
    becomes the entry's and the one it replaced its rollback (`_completed`: with ``loaded``, the
    entry's evidence and reasons are the matrix's for that artifact under today's project, never
    the ones of what it replaced). A halt publishes nothing and is recorded.

    Returns:
        What was published (None when halted) and the verdict with its evidence.
    """
    settings = settings or CheckSettings()
    with edit_manifest(db, options) as edit:
        entry = edit.entry(host_class)
        rollout = entry.rollout
        if rollout is None:
            raise QualifyError(f"{host_class} has no rollout in progress to advance")
        start = _step_started(db, rollout.id)
        verdict = judge_cohort(
            db,
            edit.manifest,
            host_class,
            rollout.id,
            start=start,
            now=options.now,
            settings=settings,
        )
        if not verdict.ok:
            edit.discard()
            db.record_rollout(
                rollout.id,
                host_class,
                "halt",
                edit.manifest.signed.version,
                rollout.step,
                rollout.percent,
                rollout.artifact.name,
                options.who,
                "; ".join(verdict.problems),
                options.now,
            )
            return None, verdict
        said = _step(edit, host_class, rollout, verdict, loaded, db)
    done = RolloutAction(
        host_class,
        edit.version,
        options.out,
        f"{host_class}: {said} (v{edit.version})",
        _model(edit),
    )
    return done, verdict


def _step(
    edit: ManifestEdit,
    host_class: str,
    rollout: Rollout,
    verdict: StepVerdict,
    loaded: LoadedProject | None,
    db: Store,
) -> str:
    """Edit ``host_class``'s entry one step on (or complete it) and record it; what it did."""
    step, steps, name = rollout.step, rollout.steps, rollout.artifact.name
    entry = edit.entry(host_class)
    if step >= len(steps) or steps[step - 1] >= 100:
        entry = _completed(entry, rollout, host_class, loaded, db, edit.manifest)
        action, percent, said = "complete", 100, f"completed: every host runs {name}"
    else:
        percent = steps[step]
        entry = entry.model_copy(
            update={"rollout": rollout.model_copy(update={"step": step + 1, "percent": percent})}
        )
        action, said = "advance", f"advanced to {percent}% (step {step + 1} of {len(steps)})"
    edit.entries[host_class] = entry
    why = edit.options.why
    edit.record(
        rollout.id,
        host_class,
        action,
        step=min(step + 1, len(steps)),
        percent=percent,
        artifact=name,
        why=verdict.evidence() + (f"; {why}" if why else ""),
    )
    return said


def _completed(
    entry: ManifestEntry,
    rollout: Rollout,
    host_class: str,
    loaded: LoadedProject | None,
    db: Store,
    manifest: Manifest,
) -> ManifestEntry:
    """The entry once its ``rollout`` reached every host: the rollout's artifact is the entry's,
    the one it replaced its rollback (proven: its hosts ran it), and the reasons say so. The
    evidence is the cell the matrix decides the class on for that artifact under ``loaded``'s
    project, as ``manifest generate`` would write it; without it (no project given, or the
    matrix no longer shows the artifact passing there) it is null and a reason says why. A
    reason of the entry before (a pin long cleared, its abort) is never carried on."""
    name = rollout.artifact.name
    done = f"rollout {rollout.id} of {name} reached every host"
    update: dict[str, Any] = {
        "rollout": None,
        "rollback": _rollback_after(entry.artifact, rollout.artifact, entry.rollback),
        "artifact": rollout.artifact,
        "decision": "candidate",
        "evidence": None,
        "run_ids": [],
    }
    summary = f"{host_class} runs {name}: {done}"
    decision = None
    if loaded is not None:
        runs = {r.run_id: r for r in db.decision_runs()}
        decided = decide(loaded.project, db.decision_cells(), runs, previous=manifest)
        decision = next((d for d in decided if d.host_class == host_class), None)
    if (
        decision is not None
        and decision.artifact_digest == rollout.artifact.digest
        and decision.evidence is not None
    ):
        update.update(evidence=decision.evidence, run_ids=list(decision.run_ids))
        return Note("rollout_completed", done, summary).on(entry, also=decision.reasons, **update)
    why = (
        "no project file was given to re-judge it"
        if loaded is None
        else f"the matrix does not now show {name} passing on this class"
    )
    note = Note("rollout_completed", f"{done}; no evidence in this entry: {why}", summary)
    return note.on(entry, **update)


def _steered(
    edit: ManifestEdit, host_class: str, action: str, entry: ManifestEntry, artifact: str
) -> None:
    """Put ``entry`` (no rollout: a hold stops one where it is) in the edit and record
    ``action``, under the rollout it stopped or the class's ``<class>-<action>``."""
    rollout = edit.entry(host_class).rollout
    edit.entries[host_class] = entry.model_copy(update={"rollout": None})
    rollout_id = rollout.id if rollout is not None else f"{host_class}-{action}"
    edit.record(
        rollout_id,
        host_class,
        action,
        step=0,
        percent=0,
        artifact=artifact,
        why=edit.options.why,
    )


def hold_class(db: Store, host_class: str, options: PublishOptions) -> RolloutAction:
    """Publish ``host_class`` as held: every host of it keeps what it runs now (a rollout in
    progress stops where it is, its cohort on the new artifact), and later releases keep the
    hold until `clear_class`.

    Raises:
        QualifyError: no published manifest, an unknown class, or one already held or pinned.
    """
    with edit_manifest(db, options) as edit:
        entry = edit.entry(host_class)
        _not_steered(db, host_class)
        rollout = entry.rollout
        stopped = f" (rollout {rollout.id} stopped at {rollout.percent}%)" if rollout else ""
        why = options.why
        note = Note(
            "held",
            f"held by {options.who}: {why}",
            f"{host_class} is held: its hosts keep what they run{stopped} ({why})",
        )
        held = note.on(
            entry,
            decision="hold",
            rollback=_rollback_after(entry.artifact, None, entry.rollback),
            artifact=None,
            evidence=None,
        )
        _steered(edit, host_class, "hold", held, "")
    summary = f"{host_class}: held{stopped} (v{edit.version})"
    return RolloutAction(host_class, edit.version, options.out, summary, _model(edit))


def _pin_choices(
    loaded: LoadedProject, db: Store, entry: ManifestEntry
) -> tuple[dict[str, ManifestArtifact], str]:
    """What ``entry``'s class may be pinned to, by name: what it runs or returns to, and the
    approved baseline (whose name comes second)."""
    choices: dict[str, ManifestArtifact] = {}
    for known in (entry.rollback, entry.artifact):
        if known is not None:
            choices[known.name] = _plain(known)
    baseline = loaded.project.artifacts.baseline.label
    if baseline not in choices:
        store = ArtifactStore(Path(db.path).resolve().parent / "artifacts")
        digests, refs = artifact_refs(loaded, store, None)
        ref = refs[digests[baseline]]
        choices[baseline] = ManifestArtifact(
            name=baseline, digest=digests[baseline], length=ref.length, uri=ref.uri
        )
    return choices, baseline


def pin_class(
    loaded: LoadedProject,
    db: Store,
    host_class: str,
    options: PublishOptions,
    *,
    artifact: str | None = None,
) -> RolloutAction:
    """Publish ``host_class`` pinned to ``artifact`` (default: what it runs now): one of the
    artifacts the class runs or returns to, or the approved baseline, for every host of it;
    later releases keep the pin until `clear_class`.

    Raises:
        QualifyError: no published manifest, an unknown class or artifact, a class already held
            or pinned, or a rollout in progress (abort it, or let it complete, first).
    """
    with edit_manifest(db, options) as edit:
        entry = edit.entry(host_class)
        _not_steered(db, host_class)
        if entry.rollout is not None:
            raise QualifyError(
                f"{host_class} has rollout {entry.rollout.id} in progress: abort it or let it "
                "complete before pinning the class"
            )
        choices, baseline = _pin_choices(loaded, db, entry)
        name = artifact or (entry.artifact.name if entry.artifact is not None else None)
        if name is None:
            raise QualifyError(
                f"{host_class} runs nothing in the current manifest (held): pass --artifact, "
                "one of " + ", ".join(sorted(choices))
            )
        if name not in choices:
            raise QualifyError(
                f"{host_class} can be pinned to what it runs or returns to, or the approved "
                f"baseline ({', '.join(sorted(choices))}), not {name!r}"
            )
        chosen = choices[name]
        update: dict[str, Any] = {
            "rollback": _rollback_after(entry.artifact, chosen, entry.rollback),
            "artifact": chosen,
            "decision": "baseline" if name == baseline else "candidate",
        }
        if entry.artifact is None or entry.artifact.digest != chosen.digest:
            update["evidence"] = None  # the evidence was the other artifact's
        note = Note(
            "pinned",
            f"pinned by {options.who}: {options.why}",
            f"{host_class} is pinned to {name} ({options.why})",
        )
        _steered(edit, host_class, "pin", note.on(entry, **update), name)
    summary = f"{host_class}: pinned to {name} (v{edit.version})"
    return RolloutAction(host_class, edit.version, options.out, summary, _model(edit))


def clear_class(
    db: Store,
    host_class: str,
    *,
    now: datetime,
    why: str,
    who: str,
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
        who,
        why,
        now,
    )
    what = {"hold": "hold", "pin": "pin", "abort": f"abort of rollout {row['rollout_id']}"}
    return (
        f"{host_class}: {what[str(row['action'])]} cleared; the next qualify manifest generate "
        "decides it from the matrix again"
    )
