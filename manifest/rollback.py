"""A class's rollback: the artifact its hosts fall back to, and whether it is proven to load.

Owns the rule (`Rollbacks`): an entry's rollback is the most recent artifact the class was
assigned before, other than the entry's own, proven to load on the class's current runtime;
the baseline when there is none; an entry on the baseline has nothing further to go back to.
``manifest.policy`` applies it to each decision; the runner proves `rollback_target` loads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NamedTuple

from schemas.cell import Cell, Reason, RunRecord
from schemas.manifest import Manifest, PreviousManifest
from schemas.project import HostClass, ProviderSpec, RuntimeSpec

__all__ = [
    "RollbackState",
    "RollbackTarget",
    "Rollbacks",
    "aware",
    "emulated",
    "final_rollback",
    "rollback_target",
]


def aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def emulated(cell: Cell, runs: Mapping[str, RunRecord]) -> bool:
    run = runs.get(cell.run_id)
    return cell.emulated or (run is not None and run.emulated)


class RollbackState(NamedTuple):
    digest: str | None
    name: str | None
    runtime: RuntimeSpec
    provider: ProviderSpec
    proven: bool
    reason: Reason | None


@dataclass(frozen=True)
class RollbackTarget:
    """What a class's hosts fall back to: the artifact, and the runtime and provider it runs
    under there."""

    digest: str | None
    name: str | None
    runtime: RuntimeSpec
    provider: ProviderSpec


def rollback_target(
    name: str,
    cls: HostClass,
    previous: Manifest | PreviousManifest | None,
    baseline: tuple[str | None, str],
) -> RollbackTarget:
    """The artifact a class rolls back to: what the latest manifest gave it (its artifact, or
    for a held class its rollback package), else the baseline.

    The one owner of that rule: the runner proves this artifact loads, the policy writes it into
    the next manifest's rollback package.

    Args:
        name: The host class.
        cls: Its settings in the project file now.
        previous: The latest published manifest, if any.
        baseline: The baseline's (digest, label); the digest is None when it is unknown.
    """
    return RollbackTarget(*_target(name, cls, previous, baseline))


def _target(
    name: str,
    cls: HostClass,
    previous: Manifest | PreviousManifest | None,
    baseline: tuple[str | None, str],
) -> tuple[str | None, str | None, RuntimeSpec, ProviderSpec]:
    """`rollback_target`'s rule, as a plain tuple (the policy asks once per class of a fleet)."""
    entry = previous.signed.entries.get(name) if previous is not None else None
    if entry is None:
        return baseline[0], baseline[1], cls.runtime, cls.provider
    if entry.artifact is not None:
        return entry.artifact.digest, entry.artifact.name, entry.runtime, entry.provider
    if entry.rollback is not None:
        return (
            entry.rollback.digest,
            entry.rollback.name,
            entry.rollback.runtime or entry.runtime,
            entry.rollback.provider or entry.provider,
        )
    return baseline[0], baseline[1], cls.runtime, cls.provider


class Rollbacks:
    """The rollback rule for one class: an entry's rollback is the most recent artifact the
    class was assigned before, other than the entry's own, proven to load on the class's current
    runtime (the latest current evidence on the key: a run's rollback check, or a cell of that
    digest); the baseline when there is none (proven or not: ``rollback_proven`` says); and an
    entry on the baseline has nothing further to go back to (no rollback).

    What the class was assigned before, most recent first, is what the previous manifest says:
    its artifact, then its own rollback (which this same rule chose from the ones before, so the
    chain reaches back through the releases without reading them all)."""

    def __init__(
        self,
        name: str,
        cls: HostClass,
        previous: Manifest | PreviousManifest | None,
        baseline: tuple[str | None, str],
        key_cells: Sequence[Cell],
        key_runs: Sequence[RunRecord],
        runs: Mapping[str, RunRecord],
        current: str,
        allow_emulated: bool,
    ) -> None:
        self._cls = cls
        self._baseline = baseline
        self._cells, self._runs, self._all_runs = key_cells, key_runs, runs
        self._current, self._allow_emulated = current, allow_emulated
        self._proofs: dict[str, tuple[tuple[datetime, str], bool, str | None] | None] = {}
        entry = previous.signed.entries.get(name) if previous is not None else None
        # (digest, label, the runtime and provider it was approved under: a host still on an
        # older runtime can fall back to it while the class moves to a newer one)
        self._history: list[tuple[str, str, RuntimeSpec, ProviderSpec]] = []
        if entry is not None:
            if entry.artifact is not None:
                art = entry.artifact
                self._history.append((art.digest, art.name, entry.runtime, entry.provider))
            if entry.rollback is not None:
                rb = entry.rollback
                runtime, provider = rb.runtime or entry.runtime, rb.provider or entry.provider
                self._history.append((rb.digest, rb.name, runtime, provider))

    def _proof(self, digest: str) -> tuple[tuple[datetime, str], bool, str | None] | None:
        """The latest current evidence that ``digest`` loads (or not) on the key, by (time,
        run id); on a tie the first seen (runs, then cells). None: no current evidence."""
        if digest in self._proofs:
            return self._proofs[digest]
        best: tuple[tuple[datetime, str], bool, str | None] | None = None
        for run in self._runs:
            check = run.rollback
            if check is None or check.artifact_digest != digest:
                continue
            if run.settings_digest != self._current or (run.emulated and not self._allow_emulated):
                continue
            stamp = (aware(run.finished_at), run.run_id)
            if best is None or stamp > best[0]:
                best = (stamp, check.loaded, check.error)
        for cell in self._cells:
            if cell.artifact_digest != digest or cell.settings_digest != self._current:
                continue
            if not self._allow_emulated and emulated(cell, self._all_runs):
                continue
            stamp = (aware(cell.measured_at), cell.run_id)
            if best is None or stamp > best[0]:
                best = (stamp, cell.verdict != "error", cell.error)
        self._proofs[digest] = best
        return best

    def of(self, own: str | None) -> RollbackState:
        """The rollback of an entry whose artifact is ``own`` (None: held)."""
        cls = self._cls
        for digest, label, runtime, provider in self._history:
            if digest == own:
                continue
            proof = self._proof(digest)
            if proof is not None and proof[1]:
                return RollbackState(digest, label, runtime, provider, True, None)
        base, label = self._baseline
        if base is None:
            return RollbackState(None, None, cls.runtime, cls.provider, False, None)
        if base == own:
            nothing = Reason(
                code="no_rollback",
                message=f"it runs the baseline {label} and was assigned no other artifact "
                "proven to load on its current runtime: nothing further to go back to",
            )
            return RollbackState(None, None, cls.runtime, cls.provider, False, nothing)
        digest = base
        proof = self._proof(digest)
        if proof is None:
            reason = Reason(
                code="rollback_unchecked",
                message=f"no current run showed that rollback {label} ({digest[:19]}) loads "
                "under this class's runtime",
            )
            return RollbackState(digest, label, cls.runtime, cls.provider, False, reason)
        (_, run_id), loaded, error = proof
        if loaded:
            return RollbackState(digest, label, cls.runtime, cls.provider, True, None)
        reason = Reason(
            code="rollback_failed",
            message=f"rollback {label} did not load in run {run_id}: {error or 'no detail'}",
        )
        return RollbackState(digest, label, cls.runtime, cls.provider, False, reason)


def final_rollback(
    rollbacks: Rollbacks, kind: str, digest: str | None, reasons: list[Reason]
) -> RollbackState:
    """The decided entry's rollback; an entry on the baseline with none says so (``reasons``)."""
    rollback = rollbacks.of(None if kind == "hold" else digest)
    if kind == "baseline" and rollback.digest is None and rollback.reason is not None:
        reasons.append(rollback.reason)
    return rollback
