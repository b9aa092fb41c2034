"""The decision rule: which artifact each host class may run, with reasons and evidence.

Owns ``decide``, a pure function over the project file, cells and run records (no disk, clock or
database: the CLI reads the matrix and hands them over). Does not own judging a measurement
against budgets (``manifest.gates.judge``, which this module calls again with the class's
*current* budgets), nor building or signing the manifest (``manifest.build``).

The rule, per host class of the project (classes of other keys in the cells are ignored):

* Only cells on the class's **exact key** count. Per artifact digest the latest cell measured
  under the class's current settings is used; if every cell of that digest is stale, the latest
  stale one is reported as ``stale``.
* A candidate qualifies only if that cell is not stale; is not emulated (unless the policy
  allows it); has runner verdict ``pass``; has parity that passed against *this* baseline's
  digest and still holds under the project's current tolerance; passes ``gates.judge`` under the
  current budgets (p99 upper bound within budget, ``insufficient`` is not a pass; expected
  provider executed and fallback within the allowance; peak memory and cold init within budget);
  has peak memory and cold init measured where the class has a budget; and the class's rollback
  artifact was shown to load by the latest current evidence on the key.
* Several qualify: ``policy.choose`` picks (lowest p99 upper bound; ties by name, then digest).
* None qualifies: the class gets the **baseline**, if the baseline has a current, usable cell on
  the key that loaded (verdict other than ``error``).
* The baseline's latest current cell on the key fails the class's own gates (typically: the
  class lost its accelerator path and the baseline now runs on the CPU, over budget): **hold**,
  unless ``policy.failing_baseline`` is ``baseline``.
* The baseline's latest current cell on the key is ``error`` (it cannot run there): **hold**.
  Shipping an artifact known not to load is never safer than shipping nothing new.
* No cell at all on the key, or none of the baseline that is current and usable (only stale or
  emulated ones): the class is as unknown as a new one, so ``policy.unknown_class`` applies.

A class's **rollback** is the most recent artifact it was assigned before, other than the
entry's own, proven to load on the class's current runtime (the latest current evidence on the
key: a run's rollback check, or a cell of that digest); the baseline when there is none
(``rollback_proven`` then says whether it loads); an entry on the baseline has none, and says it
has nothing further to go back to (``no_rollback``). What it was assigned before is read from
the previous manifest's entry: its artifact, then its rollback (`_Rollbacks`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from operator import attrgetter
from typing import NamedTuple

from manifest._batch import paused_gc
from manifest.envelope import format_time
from manifest.errors import PolicyError
from manifest.gates import gate_of, judge
from schemas.cell import Cell, OutputParity, Reason, RunRecord, latest, recency
from schemas.manifest import (
    ClassDecision,
    Evidence,
    Manifest,
    OutputParitySummary,
    ParitySummary,
    PreviousManifest,
)
from schemas.project import (
    HostClass,
    HostClassKey,
    OutputTolerance,
    Project,
    ProviderSpec,
    RuntimeSpec,
)
from schemas.rules import (
    applicable,
    fallback_count,
    resolve_tolerance,
    task_failures,
    tolerance_failures,
)

__all__ = ["RollbackTarget", "artifact_digests", "decide", "decide_each", "rollback_target"]

_Key = tuple[str, str, str]
_key_of: Callable[[HostClassKey], _Key] = attrgetter("hardware", "runtime", "provider")
"""``HostClassKey.as_tuple`` in C: the policy groups every cell and run of the matrix by it."""


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


@lru_cache(maxsize=4096)
def _time(moment: datetime) -> str:
    """``format_time`` of a cell's time (naive means UTC), cached: runs share timestamps."""
    return format_time(_aware(moment))


def _ms(value: float) -> str:
    return f"{value:.3g} ms" if value < 100 else f"{value:.0f} ms"


def _us(ms: float | None) -> int | None:
    return None if ms is None or not math.isfinite(ms) else round(ms * 1000)


def _ratio(value: float | None) -> str | None:
    return None if value is None else format(value, ".6e")


def artifact_digests(project: Project, cells: Sequence[Cell]) -> dict[str, str]:
    """The digest of each artifact label of the project, as the cells measured it.

    When a label was measured with several digests (the file changed), the most recently
    measured one wins. The CLI should prefer the digests of the files it hashed.

    Args:
        project: the project file.
        cells: cells from the matrix.

    Returns:
        label -> digest, for the labels some cell measured.
    """
    labels = {project.artifacts.baseline.label, *(c.label for c in project.artifacts.candidates)}
    newest: dict[str, tuple[tuple[datetime, str], str]] = {}
    for cell in cells:
        if cell.artifact_name not in labels:
            continue
        stamp = (recency(cell), cell.artifact_digest)
        if cell.artifact_name not in newest or stamp > newest[cell.artifact_name]:
            newest[cell.artifact_name] = stamp
    return {label: stamp[1] for label, stamp in newest.items()}


class _Pick(NamedTuple):
    """The cell used for one digest on one key, and whether it is stale.

    (Named tuples, here and for ``_RollbackState``: made once or twice per class of a fleet, and
    a frozen dataclass's ``__init__`` costs a few times as much.)"""

    cell: Cell
    stale: bool


def _pick(cells: Sequence[Cell], digest: str, current: str) -> _Pick | None:
    mine = [c for c in cells if c.artifact_digest == digest]
    if len(mine) == 1:  # one cell of the digest on the key (a fleet's usual case): no ordering
        return _Pick(mine[0], stale=mine[0].settings_digest != current)
    fresh = latest(c for c in mine if c.settings_digest == current)
    if fresh is not None:
        return _Pick(fresh, stale=False)
    old = latest(mine)
    return None if old is None else _Pick(old, stale=True)


def _emulated(cell: Cell, runs: Mapping[str, RunRecord]) -> bool:
    run = runs.get(cell.run_id)
    return cell.emulated or (run is not None and run.emulated)


def _measured(out: OutputParity) -> OutputTolerance:
    values = (out.max_abs, out.mean_abs, out.max_rel, out.cosine_min, out.top1_agreement)
    kept = out.min_passing
    if (
        values
        == (
            kept.max_abs,
            kept.mean_abs,
            kept.max_rel,
            kept.cosine_min,
            kept.top1_agreement_min,
        )
        and 0.0 not in values
    ):
        # The runner records the measured values as min_passing (qualify.parity): the same
        # model, without validating a copy per cell. (A zero is rebuilt: 0.0 == -0.0, and the
        # sign would show in a message.)
        return kept
    return OutputTolerance(
        max_abs=out.max_abs,
        mean_abs=out.mean_abs,
        max_rel=out.max_rel,
        cosine_min=out.cosine_min,
        top1_agreement_min=out.top1_agreement,
    )


class _Tolerances:
    """Parity against the project's current tolerances, for one decide: the tolerance of each
    (precision, output name) resolved once, and the failure phrases of each distinct set of
    measured values remembered (``tolerance_failures`` is a function of the values and the
    limits alone; values holding a zero are not remembered: 0.0 == -0.0 as a key, and the sign
    would show in a phrase)."""

    def __init__(self, project: Project) -> None:
        self._project = project
        self._limits: dict[tuple[str, str], OutputTolerance] = {}
        self._found: dict[tuple[object, ...], tuple[str, ...]] = {}
        wl = project.workload
        # Outputs the project says are not class scores today (a state fed back, or kind set):
        # top-1 agreement measured on them by an older run is not held against them.
        self._not_scores = {str(i.state_from) for i in wl.inputs.values() if i.state_from}
        self._not_scores |= {n for n, o in wl.outputs.items() if o.kind in ("state", "values")}

    def failures(self, precision: str, out: OutputParity) -> tuple[str, ...]:
        """``<output> <phrase>`` for each tolerance the output fails under ``precision``: the
        task-level ones (``parity.post``) first, then the tensor ones that apply to it."""
        values = (out.max_abs, out.mean_abs, out.max_rel, out.cosine_min, out.top1_agreement)
        tasks = (out.exact_match, out.box_f1, out.iou)
        key = (precision, out.name, values, tasks, frozenset(out.skipped))
        found = self._found.get(key)
        if found is None:
            limits = self._limits.get((precision, out.name))
            if limits is None:
                limits = resolve_tolerance(self._project.tolerance(precision), out.name)
                if out.name in self._not_scores:
                    limits = applicable(limits, ["top1_agreement"])
                self._limits[(precision, out.name)] = limits
            task = self._project.parity.task(out.name)
            phrases = [
                *task_failures(out.exact_match, out.box_f1, out.iou, task),
                *tolerance_failures(_measured(out), applicable(limits, out.skipped)),
            ]
            found = tuple(f"{out.name} {f}" for f in phrases)
            if 0.0 not in values:
                self._found[key] = found
        return found


def _parity_reasons(
    cell: Cell, baseline_digest: str | None, tolerances: _Tolerances
) -> list[Reason]:
    parity = cell.parity
    if parity is None:
        return [Reason.of(code="parity_missing", message="no parity result against the baseline")]
    if baseline_digest is not None and parity.reference_digest != baseline_digest:
        return [
            Reason.of(
                code="parity_reference_mismatch",
                message=f"parity was measured against {parity.reference_digest[:19]}, not the "
                f"baseline {baseline_digest[:19]}",
            )
        ]
    failures: list[str] = []
    for out in parity.outputs:
        failures.extend(tolerances.failures(cell.precision, out))
    if failures:
        return [
            Reason.of(
                code="parity_failed",
                message=f"parity fails the current {cell.precision} tolerance: {'; '.join(failures)}",
            )
        ]
    return []


def _one_per_code(reasons: Sequence[Reason]) -> list[Reason]:
    """Each code once, in first-seen order; the messages of a repeated code joined, so an entry
    that cites two candidates failing parity says both under one ``parity_failed``."""
    if len({reason.code for reason in reasons}) == len(reasons):
        return list(reasons)  # each code once already: the reasons as they are (immutable)
    merged: dict[str, list[str]] = {}
    for reason in reasons:
        messages = merged.setdefault(reason.code, [])
        if reason.message not in messages:
            messages.append(reason.message)
    return [Reason.of(code=code, message="; ".join(messages)) for code, messages in merged.items()]


class _RollbackState(NamedTuple):
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


class _Rollbacks:
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
            stamp = (_aware(run.finished_at), run.run_id)
            if best is None or stamp > best[0]:
                best = (stamp, check.loaded, check.error)
        for cell in self._cells:
            if cell.artifact_digest != digest or cell.settings_digest != self._current:
                continue
            if not self._allow_emulated and _emulated(cell, self._all_runs):
                continue
            stamp = (_aware(cell.measured_at), cell.run_id)
            if best is None or stamp > best[0]:
                best = (stamp, cell.verdict != "error", cell.error)
        self._proofs[digest] = best
        return best

    def of(self, own: str | None) -> _RollbackState:
        """The rollback of an entry whose artifact is ``own`` (None: held)."""
        cls = self._cls
        for digest, label, runtime, provider in self._history:
            if digest == own:
                continue
            proof = self._proof(digest)
            if proof is not None and proof[1]:
                return _RollbackState(digest, label, runtime, provider, True, None)
        base, label = self._baseline
        if base is None:
            return _RollbackState(None, None, cls.runtime, cls.provider, False, None)
        if base == own:
            nothing = Reason.of(
                code="no_rollback",
                message=f"it runs the baseline {label} and was assigned no other artifact "
                "proven to load on its current runtime: nothing further to go back to",
            )
            return _RollbackState(None, None, cls.runtime, cls.provider, False, nothing)
        digest = base
        proof = self._proof(digest)
        if proof is None:
            reason = Reason.of(
                code="rollback_unchecked",
                message=f"no current run showed that rollback {label} ({digest[:19]}) loads "
                "under this class's runtime",
            )
            return _RollbackState(digest, label, cls.runtime, cls.provider, False, reason)
        (_, run_id), loaded, error = proof
        if loaded:
            return _RollbackState(digest, label, cls.runtime, cls.provider, True, None)
        reason = Reason.of(
            code="rollback_failed",
            message=f"rollback {label} did not load in run {run_id}: {error or 'no detail'}",
        )
        return _RollbackState(digest, label, cls.runtime, cls.provider, False, reason)


def _final_rollback(
    rollbacks: _Rollbacks, kind: str, digest: str | None, reasons: list[Reason]
) -> _RollbackState:
    """The decided entry's rollback; an entry on the baseline with none says so (``reasons``)."""
    rollback = rollbacks.of(None if kind == "hold" else digest)
    if kind == "baseline" and rollback.digest is None and rollback.reason is not None:
        reasons.append(rollback.reason)
    return rollback


def _evidence(cell: Cell, cls: HostClass, emulated: bool) -> Evidence:
    # Built without validation (``Document.trusted``): every value is a validated cell's, or an
    # integer or string made here; a test holds it equal to validating the same mapping.
    gate = gate_of(cell)
    placement = cell.placement
    parity = cell.parity
    return Evidence.trusted(
        {
            "run_id": cell.run_id,
            "artifact_digest": cell.artifact_digest,
            "artifact_name": cell.artifact_name,
            "role": cell.role,
            "verdict": cell.verdict,
            "measured_at": _time(cell.measured_at),
            "emulated": emulated,
            "isa_mismatch": list(cell.isa_mismatch),
            "p99_us": None if gate is None else _us(gate.p99_ms),
            "p99_upper_us": None if gate is None else _us(gate.p99_upper_ms),
            "p99_budget_us": round(cls.budgets.p99_ms * 1000),
            "batch_size": None if gate is None else gate.batch_size,
            "concurrency": None if gate is None else gate.concurrency,
            "samples": None if gate is None else gate.samples,
            "fallback_nodes": None
            if placement is None
            else fallback_count(placement.nodes_per_provider, cls.provider.expected),
            "peak_rss_kb": None if cell.peak_rss_mb is None else round(cell.peak_rss_mb * 1024),
            "cold_init_us": _us(cell.cold_init_ms),
            "parity": None
            if parity is None
            else ParitySummary.trusted(
                {
                    "passed": parity.passed,
                    "samples": parity.samples,
                    "outputs": {
                        o.name: OutputParitySummary.trusted(
                            {
                                "passed": o.passed,
                                "max_abs": _ratio(o.max_abs),
                                "cosine_min": _ratio(o.cosine_min),
                                "top1_agreement": _ratio(o.top1_agreement),
                            }
                        )
                        for o in parity.outputs
                    },
                }
            ),
        }
    )


def _candidate_reasons(
    pick: _Pick,
    cls: HostClass,
    project: Project,
    runs: Mapping[str, RunRecord],
    baseline_digest: str | None,
    rollbacks: _Rollbacks,
    tolerances: _Tolerances,
) -> list[Reason]:
    """Every gate the candidate's cell fails; empty when it qualifies (its rollback, chosen by
    `_Rollbacks` for it, included)."""
    cell = pick.cell
    found: list[Reason] = []
    if pick.stale:
        found.append(
            Reason.of(
                code="stale",
                message=f"its latest cell (run {cell.run_id}) was measured under settings "
                f"{cell.settings_digest[:19]}; the class's are now different",
            )
        )
    run = runs.get(cell.run_id)
    if run is None:
        found.append(Reason.of(code="run_missing", message=f"run {cell.run_id} was not supplied"))
    if _emulated(cell, runs) and not project.policy.allow_emulated:
        found.append(
            Reason.of(
                code="emulated", message=f"run {cell.run_id} ran on a host that does not match"
            )
        )
    if run is not None and run.host_busy and project.policy.busy_host == "refuse":
        found.append(
            Reason.of(
                code="host_busy",
                message=f"run {cell.run_id} measured on a host whose load average exceeded its "
                "cores, and policy.busy_host is 'refuse'",
            )
        )
    if cell.verdict != "pass":
        codes = ", ".join(r.code for r in cell.reasons) or "no reason recorded"
        found.append(
            Reason.of(
                code="verdict_not_pass",
                message=f"the runner's verdict was {cell.verdict} ({codes})",
            )
        )
    found.extend(_parity_reasons(cell, baseline_digest, tolerances))
    # Parity is re-judged above against the *current* tolerance (_parity_reasons); the
    # gate's copy is the runner's, under the tolerance of the day it ran.
    _, gate_reasons = judge(cell, cls, skip=_NO_PARITY)
    for reason in gate_reasons:
        if reason.code == "expected_provider_missing" and cell.placement is None:
            reason = Reason.of(code="placement_missing", message=reason.message)
        found.append(reason)
    rollback = rollbacks.of(cell.artifact_digest)
    if rollback.reason is not None:
        found.append(rollback.reason)
    return found


def _upper(cell: Cell) -> float:
    gate = gate_of(cell)
    return math.inf if gate is None or gate.p99_upper_ms is None else gate.p99_upper_ms


def _passing_candidates(
    cls: HostClass,
    project: Project,
    key_cells: Sequence[Cell],
    runs: Mapping[str, RunRecord],
    digests: Mapping[str, str],
    current: str,
    baseline_digest: str | None,
    rollbacks: _Rollbacks,
    reasons: list[Reason],
    looked: set[str],
    tolerances: _Tolerances,
) -> list[Cell]:
    """The candidates' cells that pass every gate on the key; why each other one does not is
    added to ``reasons`` and every run looked at to ``looked``."""
    passing: list[Cell] = []
    if not project.artifacts.candidates:
        reasons.append(Reason.of(code="no_candidates", message="the project lists no candidate"))
    for spec in project.artifacts.candidates:
        digest = digests.get(spec.label)
        pick = _pick(key_cells, digest, current) if digest else None
        if pick is None:
            key_text = "(" + ", ".join(cls.key.as_tuple()) + ")"
            reasons.append(
                Reason.of(
                    code="no_candidate_cell",
                    message=f"candidate {spec.label} was never measured on {key_text}",
                )
            )
            continue
        looked.add(pick.cell.run_id)
        failed = _candidate_reasons(
            pick, cls, project, runs, baseline_digest, rollbacks, tolerances
        )
        if failed:
            reasons.extend(
                Reason.of(code=r.code, message=f"candidate {spec.label}: {r.message}")
                for r in failed
            )
        else:
            passing.append(pick.cell)
    return passing


# The reasons whose message names nothing of the class, made once: a fleet's decisions share
# them (a Reason is immutable).
_HOLD_FAILING_BASELINE = Reason.of(
    code="hold",
    message="the policy for a class whose baseline fails its gates is 'hold': "
    "hosts keep what they run",
)
_HOLD_UNKNOWN = Reason.of(code="hold", message="the policy for unknown classes is 'hold'")
_BASELINE_UNKNOWN = Reason.of(
    code="baseline_chosen", message="the policy for unknown classes is 'baseline'"
)
_NO_PARITY = frozenset({"parity"})
"""The gates the policy skips when it re-judges a candidate (it judges parity itself)."""


def _decide_class(
    name: str,
    cls: HostClass,
    project: Project,
    key_cells: Sequence[Cell],
    key_runs: Sequence[RunRecord],
    runs: Mapping[str, RunRecord],
    digests: Mapping[str, str],
    previous: Manifest | PreviousManifest | None,
    current: str,
    tolerances: _Tolerances,
) -> ClassDecision:
    policy = project.policy
    baseline_label = project.artifacts.baseline.label
    baseline_digest = digests.get(baseline_label)
    rollbacks = _Rollbacks(
        name,
        cls,
        previous,
        (baseline_digest, baseline_label),
        key_cells,
        key_runs,
        runs,
        current,
        policy.allow_emulated,
    )
    key_text = "(" + ", ".join(cls.key.as_tuple()) + ")"
    reasons: list[Reason] = []
    looked: set[str] = set()

    def decision(
        kind: str, artifact: tuple[str | None, str | None], evidence: Evidence | None, summary: str
    ) -> ClassDecision:
        if kind in ("baseline", "candidate") and artifact[0] is None:
            raise PolicyError(
                f"class '{name}' gets the baseline, but the digest of artifact "
                f"'{baseline_label}' is unknown (no cell measured it); pass digests="
                "{label: 'sha256:...'} from the artifact files"
            )
        hold = kind == "hold"
        rollback = _final_rollback(rollbacks, kind, artifact[0], reasons)
        # Without validation (``Document.trusted``): the key, settings and evidence are models
        # already, the rest strings and lists made here; a test validates every decision of the
        # test fleets again and finds it equal.
        return ClassDecision.trusted(
            {
                "host_class": name,
                "key": cls.key,
                "decision": kind,
                "artifact_digest": None if hold else artifact[0],
                "artifact_name": None if hold else artifact[1],
                "rollback_digest": rollback.digest,
                "rollback_name": rollback.name,
                "rollback_proven": rollback.proven,
                "rollback_runtime": rollback.runtime,
                "rollback_provider": rollback.provider,
                "evidence": evidence,
                "reasons": _one_per_code(reasons),
                "summary": summary,
                "run_ids": sorted(looked),
            }
        )

    def unknown(why: str) -> ClassDecision:
        kind = policy.unknown_class
        if kind == "hold":
            reasons.append(_HOLD_UNKNOWN)
            return decision(
                "hold",
                (None, None),
                None,
                f"{name} is held: {why}, and the policy for unknown classes is 'hold'.",
            )
        reasons.append(_BASELINE_UNKNOWN)
        return decision(
            "baseline",
            (baseline_digest, baseline_label),
            None,
            f"{name} gets the baseline {baseline_label}: {why}, and the policy for "
            "unknown classes is 'baseline'.",
        )

    if not key_cells:
        reasons.append(Reason.of(code="no_evidence", message=f"no cell was measured on {key_text}"))
        return unknown(f"nothing was measured on {key_text}")

    base = _pick(key_cells, baseline_digest, current) if baseline_digest else None
    base_usable = (
        base is not None
        and not base.stale
        and (policy.allow_emulated or not _emulated(base.cell, runs))
    )
    if base is not None:
        looked.add(base.cell.run_id)

    def base_evidence() -> Evidence | None:
        return _evidence(base.cell, cls, _emulated(base.cell, runs)) if base else None

    passing = _passing_candidates(
        cls,
        project,
        key_cells,
        runs,
        digests,
        current,
        baseline_digest,
        rollbacks,
        reasons,
        looked,
        tolerances,
    )

    if passing:
        passing.sort(key=lambda c: (_upper(c), c.artifact_name, c.artifact_digest))
        chosen = passing[0]
        upper, budget = _ms(_upper(chosen)), _ms(cls.budgets.p99_ms)
        reasons.insert(
            0,
            Reason.of(
                code="candidate_passed",
                message=f"candidate {chosen.artifact_name} passed every gate on {key_text} in run "
                f"{chosen.run_id}: p99 upper bound {upper} <= {budget}",
            ),
        )
        reasons.extend(
            Reason.of(
                code="candidate_not_chosen",
                message=f"candidate {other.artifact_name} also passed, with p99 upper bound "
                f"{_ms(_upper(other))} > {upper}",
            )
            for other in passing[1:]
        )
        return decision(
            "candidate",
            (chosen.artifact_digest, chosen.artifact_name),
            _evidence(chosen, cls, _emulated(chosen, runs)),
            f"{name} gets candidate {chosen.artifact_name}: it passed every gate on {key_text} in "
            f"run {chosen.run_id} (p99 upper bound {upper}, budget {budget}).",
        )

    failed_codes = sorted({r.code for r in reasons if r.code not in ("no_candidates",)})
    why = f"no candidate qualified ({', '.join(failed_codes)})" if failed_codes else "no candidate"
    if base is not None and base_usable and base.cell.verdict == "error":
        reasons.append(
            Reason.of(
                code="baseline_failed",
                message=f"baseline {baseline_label} could not run on {key_text} in run "
                f"{base.cell.run_id}: {base.cell.error or 'no detail'}",
            )
        )
        return decision(
            "hold",
            (None, None),
            base_evidence(),
            f"{name} is held: {why}, and the baseline {baseline_label} itself could "
            "not run on this class.",
        )
    if base is None or not base_usable:
        state = (
            "no cell"
            if base is None
            else ("only a stale cell" if base.stale else "only emulated cells")
        )
        reasons.append(
            Reason.of(
                code="baseline_unmeasured",
                message=f"baseline {baseline_label} has {state} on {key_text}",
            )
        )
        return unknown(f"{why}, and the baseline has {state} on this key")
    base_verdict, base_why = judge(base.cell, cls)
    if base_verdict == "fail" and policy.failing_baseline == "hold":
        # The class lost the path its budgets assume (typically its accelerator: the baseline now
        # runs on the CPU over budget). Shipping the baseline would move every host of the class
        # onto a known-failing artifact; holding keeps what they run until a person decides.
        codes = ", ".join(sorted({r.code for r in base_why}))
        reasons.append(
            Reason.of(
                code="baseline_fails_gates",
                message=f"baseline {baseline_label} fails this class's own gates on {key_text} "
                f"in run {base.cell.run_id} ({codes})",
            )
        )
        reasons.append(_HOLD_FAILING_BASELINE)
        return decision(
            "hold",
            (None, None),
            base_evidence(),
            f"{name} is held: {why}, and the baseline {baseline_label} fails this class's gates "
            f"too ({codes}).",
        )
    reasons.append(
        Reason.of(
            code="baseline_chosen",
            message=f"baseline {baseline_label} ran on {key_text} in run {base.cell.run_id}",
        )
    )
    return decision(
        "baseline",
        (baseline_digest, baseline_label),
        base_evidence(),
        f"{name} gets the baseline {baseline_label}: {why}.",
    )


def decide(
    project: Project,
    cells: Sequence[Cell] | Mapping[_Key, Sequence[Cell]],
    runs: Mapping[str, RunRecord],
    *,
    previous: Manifest | PreviousManifest | None = None,
    current_settings: Mapping[str, str] | None = None,
    digests: Mapping[str, str] | None = None,
) -> list[ClassDecision]:
    """Decide, for every host class of the project, which artifact it may run.

    Args:
        project: the project file; its classes, budgets, tolerances and policy are the current
            ones every cell is judged against.
        cells: cells from the matrix (the latest per key and digest, or more); cells of keys no
            class of the project has are ignored. Or those cells grouped by their key's
            (hardware, runtime, provider), as ``Store.decision_cells_by_key`` reads them: each
            group's cells must be on that key.
        runs: run records by run id (emulation and the rollback check).
        previous: the previous manifest, for each class's rollback artifact.
        current_settings: class name -> settings digest to treat as current, overriding
            ``HostClass.settings_digest()`` (e.g. when the matrix knows of a driver change).
        digests: artifact label -> digest of the project's files; labels missing here are taken
            from the cells (``artifact_digests``).

    Returns:
        One decision per class, in the project's order.

    Raises:
        PolicyError: a class must get the baseline but the baseline's digest is unknown.
    """
    with paused_gc():  # its lists, models and strings are as many as the classes
        return list(
            decide_each(
                project,
                cells,
                runs,
                previous=previous,
                current_settings=current_settings,
                digests=digests,
            )
        )


def decide_each(
    project: Project,
    cells: Sequence[Cell] | Mapping[_Key, Sequence[Cell]],
    runs: Mapping[str, RunRecord],
    *,
    previous: Manifest | PreviousManifest | None = None,
    current_settings: Mapping[str, str] | None = None,
    digests: Mapping[str, str] | None = None,
) -> Iterator[ClassDecision]:
    """`decide`, one class at a time: each decision is made when the next is asked for, so a
    consumer that writes a class's entry at once (``manifest.build``, generating a release)
    finds the class's cells, settings and decision still in the processor's caches (deciding
    all 10,000 classes of a fleet first, then writing them all, read each from memory twice).
    The same arguments, decisions and errors as `decide`. The consumer pauses the cyclic
    collector around a fleet's loop (``build_manifest`` does); a pause held here across the
    yields would outlive a consumer that stops early.
    """
    labels = {project.artifacts.baseline.label, *(c.label for c in project.artifacts.candidates)}
    given = dict(digests or {})
    if labels <= set(given):
        known = given
    else:
        every = [c for g in cells.values() for c in g] if isinstance(cells, Mapping) else cells
        known = {**artifact_digests(project, every), **given}
    overrides = current_settings or {}
    with paused_gc():  # the grouping: its lists are as many as the cells and runs
        by_key: Mapping[_Key, Sequence[Cell]]
        if isinstance(cells, Mapping):
            by_key = cells
        else:
            grouping: dict[_Key, list[Cell]] = {}
            for cell in cells:
                grouping.setdefault(_key_of(cell.key), []).append(cell)
            by_key = grouping
        runs_by_key: dict[_Key, list[RunRecord]] = {}
        for run in runs.values():
            runs_by_key.setdefault(_key_of(run.key), []).append(run)
    yield from _decide_all(project, by_key, runs_by_key, runs, known, previous, overrides)


def _decide_all(
    project: Project,
    by_key: Mapping[_Key, Sequence[Cell]],
    runs_by_key: Mapping[_Key, list[RunRecord]],
    runs: Mapping[str, RunRecord],
    known: Mapping[str, str],
    previous: Manifest | PreviousManifest | None,
    overrides: Mapping[str, str],
) -> Iterator[ClassDecision]:
    tolerances = _Tolerances(project)
    settings = _SettingsDigests()
    for name, cls in project.host_classes.items():
        key = _key_of(cls.key)
        yield _decide_class(
            name,
            cls,
            project,
            by_key.get(key, ()),
            runs_by_key.get(key, ()),
            runs,
            known,
            previous,
            overrides.get(name) or settings.of(cls),
            tolerances,
        )


class _SettingsDigests:
    """``HostClass.settings_digest`` per class, computed once per distinct runtime and provider
    settings: a fleet's classes share a few runtime builds and provider setups, and hashing
    their canonical JSON class by class was a fifth of deciding 10,000 classes. Two classes
    whose runtime and provider serialise alike have the same digest (it is a function of those
    field values alone)."""

    def __init__(self) -> None:
        self._seen: dict[tuple[bytes, bytes], str] = {}

    def of(self, cls: HostClass) -> str:
        runtime, provider = cls.runtime, cls.provider
        # Their JSON from the serializers themselves (``model_dump_json`` less its wrapper).
        key = (
            type(runtime).__pydantic_serializer__.to_json(runtime),
            type(provider).__pydantic_serializer__.to_json(provider),
        )
        digest = self._seen.get(key)
        if digest is None:
            digest = self._seen[key] = cls.settings_digest()
        return digest
