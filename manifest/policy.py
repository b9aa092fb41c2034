"""The decision rule: which artifact each host class may run, with reasons and evidence.

Owns ``decide``, a pure function over the project file, cells and run records (no disk, clock or
database: the CLI reads the matrix and hands them over), and each entry's rollback. Does not own
judging a measurement against budgets (``manifest.gates.judge``, called again with the class's
*current* budgets), nor building or signing the manifest (``manifest.build``). The rule, exactly:
docs/releases.md, "The decision rule".
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
from manifest.gates import gate_of
from manifest.verdict import CurrentVerdict, Judge, Standing, pick
from schemas.cell import Cell, Reason, RunRecord, recency
from schemas.manifest import (
    ClassDecision,
    EmulatedNumerics,
    Evidence,
    Manifest,
    OutputParitySummary,
    ParitySummary,
    PreviousManifest,
)
from schemas.project import (
    HostClass,
    HostClassKey,
    Project,
    ProviderSpec,
    RuntimeSpec,
)
from schemas.rules import fallback_count

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


def _emulated(cell: Cell, runs: Mapping[str, RunRecord]) -> bool:
    run = runs.get(cell.run_id)
    return cell.emulated or (run is not None and run.emulated)


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


def _evidence(cell: Cell, now: CurrentVerdict, cls: HostClass, emulated: bool) -> Evidence:
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
            # Its verdict under the project deciding (an entry never rests on a stale cell).
            "verdict": cell.verdict if now.stale else now.verdict,
            "measured_at": _time(cell.measured_at),
            "emulated": emulated,
            "isa_mismatch": list(cell.isa_mismatch),
            "emulated_numerics": _emulated_numerics(cell),
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


def _emulated_numerics(cell: Cell) -> EmulatedNumerics | None:
    """The evidence's note that its parity came from an emulated CPU of the class's ISA."""
    n = cell.numerics
    if n is None or n.source != "emulated" or n.cpu is None or n.qemu is None:
        return None
    return EmulatedNumerics.trusted({"cpu": n.cpu, "arch": n.arch, "qemu": n.qemu})


def _candidate_reasons(
    cell: Cell,
    now: CurrentVerdict,
    project: Project,
    runs: Mapping[str, RunRecord],
    rollbacks: _Rollbacks,
) -> list[Reason]:
    """Why the candidate's cell does not qualify (its current verdict's reasons, and what the
    policy weighs of the evidence); empty when it qualifies (its rollback, chosen by
    `_Rollbacks` for it, included)."""
    found: list[Reason] = []
    if now.stale:
        found.extend(now.reasons)
    run = runs.get(cell.run_id)
    if run is None:
        found.append(Reason.of(code="run_missing", message=f"run {cell.run_id} was not supplied"))
    if _emulated(cell, runs) and not project.policy.emulated_hosts_qualify:
        found.append(
            Reason.of(
                code="emulated", message=f"run {cell.run_id} ran on a host that does not match"
            )
        )
    numerics = cell.numerics
    if (
        numerics is not None
        and numerics.source == "emulated"
        and not project.policy.emulated_numerics_qualify
    ):
        found.append(
            Reason.of(
                code="emulated_numerics",
                message=f"run {cell.run_id} computed its parity on an emulated {numerics.cpu} "
                "(policy.allow_emulated 'parity' or true accepts that)",
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
    if not now.stale and now.verdict != "pass":
        if cell.parity is None and cell.error is None:
            found.append(
                Reason.of(code="parity_missing", message="no parity result against the baseline")
            )
        for reason in now.reasons:
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
    name: str,
    cls: HostClass,
    project: Project,
    key_cells: Sequence[Cell],
    runs: Mapping[str, RunRecord],
    judge_: Judge,
    rollbacks: _Rollbacks,
    reasons: list[Reason],
    looked: set[str],
) -> list[Cell]:
    """The candidates' cells that pass every gate on the key; why each other one does not is
    added to ``reasons`` and every run looked at to ``looked``."""
    passing: list[Cell] = []
    if not project.artifacts.candidates:
        reasons.append(Reason.of(code="no_candidates", message="the project lists no candidate"))
    for spec in project.artifacts.candidates:
        standing = judge_.standing(name, spec.label, key_cells)
        cell, now = standing.cell, standing.current
        if cell is None or now is None:
            key_text = "(" + ", ".join(cls.key.as_tuple()) + ")"
            earlier = standing.replaced
            reasons.append(
                Reason.of(
                    code="no_candidate_cell",
                    message=f"candidate {spec.label} was never measured on {key_text}"
                    + (
                        f" as its file is now ({(standing.digest or '')[:19]}); run "
                        f"{earlier.run_id} measured its earlier bytes"
                        if earlier is not None
                        else ""
                    ),
                )
            )
            continue
        looked.add(cell.run_id)
        failed = _candidate_reasons(cell, now, project, runs, rollbacks)
        if failed:
            reasons.extend(
                Reason.of(code=r.code, message=f"candidate {spec.label}: {r.message}")
                for r in failed
            )
        else:
            passing.append(cell)
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
_PASSED = CurrentVerdict("pass", ())
"""The current verdict of every candidate that qualifies (one that did not pass never does)."""


def _unusable(
    standing: Standing, allow_emulated: bool, runs: Mapping[str, RunRecord]
) -> str | None:
    """Why the baseline's cell on the key cannot decide the class (``only a stale cell ...``),
    or None when it can."""
    cell, now = standing.cell, standing.current
    if cell is None or now is None:
        return "no cell"
    if now.stale:
        return f"only a stale cell ({', '.join(now.codes)})"
    if not allow_emulated and _emulated(cell, runs):
        return "only emulated cells"
    return None


def _verdict_of(standing: Standing) -> str | None:
    return standing.current.verdict if standing.current is not None else None


def _standing_evidence(
    standing: Standing, cls: HostClass, runs: Mapping[str, RunRecord]
) -> Evidence | None:
    cell, now = standing.cell, standing.current
    if cell is None or now is None:
        return None
    return _evidence(cell, now, cls, _emulated(cell, runs))


def _decide_class(
    name: str,
    cls: HostClass,
    project: Project,
    key_cells: Sequence[Cell],
    key_runs: Sequence[RunRecord],
    runs: Mapping[str, RunRecord],
    judge_: Judge,
    previous: Manifest | PreviousManifest | None,
) -> ClassDecision:
    policy = project.policy
    baseline_label = project.artifacts.baseline.label
    baseline_digest = judge_.baseline_digest
    current = judge_.settings(name)
    rollbacks = _Rollbacks(
        name,
        cls,
        previous,
        (baseline_digest, baseline_label),
        key_cells,
        key_runs,
        runs,
        current,
        policy.emulated_hosts_qualify,
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

    # The baseline's cell now; its verdict is judged only when no candidate qualifies.
    found = pick(key_cells, baseline_digest, current) if baseline_digest else None
    base = found.cell if found is not None else None
    if base is not None:
        looked.add(base.run_id)

    passing = _passing_candidates(
        name, cls, project, key_cells, runs, judge_, rollbacks, reasons, looked
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
            _evidence(chosen, _PASSED, cls, _emulated(chosen, runs)),
            f"{name} gets candidate {chosen.artifact_name}: it passed every gate on {key_text} in "
            f"run {chosen.run_id} (p99 upper bound {upper}, budget {budget}).",
        )

    failed_codes = sorted({r.code for r in reasons if r.code not in ("no_candidates",)})
    why = f"no candidate qualified ({', '.join(failed_codes)})" if failed_codes else "no candidate"
    base_now = judge_.verdict(base, name=name) if base is not None else None
    standing = Standing(name, baseline_label, "baseline", baseline_digest, base, base_now)
    unusable = _unusable(standing, policy.emulated_hosts_qualify, runs)

    def base_evidence() -> Evidence | None:
        return _standing_evidence(standing, cls, runs)

    if base is not None and unusable is None and _verdict_of(standing) == "error":
        reasons.append(
            Reason.of(
                code="baseline_failed",
                message=f"baseline {baseline_label} could not run on {key_text} in run "
                f"{base.run_id}: {base.error or 'no detail'}",
            )
        )
        return decision(
            "hold",
            (None, None),
            base_evidence(),
            f"{name} is held: {why}, and the baseline {baseline_label} itself could "
            "not run on this class.",
        )
    if base is None or base_now is None or unusable is not None:
        state = unusable or "no cell"
        reasons.append(
            Reason.of(
                code="baseline_unmeasured",
                message=f"baseline {baseline_label} has {state} on {key_text}",
            )
        )
        return unknown(f"{why}, and the baseline has {state} on this key")
    base_why = base_now.reasons
    if base_now.verdict == "fail" and policy.failing_baseline == "hold":
        # The class lost the path its budgets assume (typically its accelerator: the baseline now
        # runs on the CPU over budget). Shipping the baseline would move every host of the class
        # onto a known-failing artifact; holding keeps what they run until a person decides.
        codes = ", ".join(sorted({r.code for r in base_why}))
        reasons.append(
            Reason.of(
                code="baseline_fails_gates",
                message=f"baseline {baseline_label} fails this class's own gates on {key_text} "
                f"in run {base.run_id} ({codes})",
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
            message=f"baseline {baseline_label} ran on {key_text} in run {base.run_id}",
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
    judge_ = Judge(project, known, current_settings=overrides)
    for name, cls in project.host_classes.items():
        key = _key_of(cls.key)
        yield _decide_class(
            name,
            cls,
            project,
            by_key.get(key, ()),
            runs_by_key.get(key, ()),
            runs,
            judge_,
            previous,
        )
