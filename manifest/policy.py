"""The decision rule: which artifact each host class may run, with reasons and evidence.

Owns ``decide``, a pure function over the project file, cells and run records (no disk, clock or
database: the CLI reads the matrix and hands them over), with each entry's rollback by the rule
of ``manifest.rollback``. Does not own judging a measurement against budgets
(``manifest.gates.judge``, called again with the class's *current* budgets), nor building or
signing the manifest (``manifest.build``). The rule, exactly: docs/releases.md, "The decision
rule".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from operator import attrgetter

from manifest._batch import paused_gc
from manifest.envelope import format_time
from manifest.errors import PolicyError
from manifest.gates import gate_of
from manifest.rollback import Rollbacks, aware, emulated, final_rollback
from manifest.verdict import CurrentVerdict, Judge, Standing, pick
from schemas.base import Verdict
from schemas.cell import Cell, Reason, RunRecord, recency
from schemas.manifest import (
    ClassDecision,
    Decision,
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
)
from schemas.rules import fallback_count

__all__ = ["BATCH", "artifact_digests", "decide", "decide_each"]

BATCH = 512
"""Classes `decide_each` decides before it hands their decisions on."""

_Key = tuple[str, str, str]
_key_of: Callable[[HostClassKey], _Key] = attrgetter("hardware", "runtime", "provider")
"""``HostClassKey.as_tuple`` in C: the policy groups every cell and run of the matrix by it."""


@lru_cache(maxsize=4096)
def _time(moment: datetime) -> str:
    """``format_time`` of a cell's time (naive means UTC), cached: runs share timestamps."""
    return format_time(aware(moment))


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
    return [Reason(code=code, message="; ".join(messages)) for code, messages in merged.items()]


def _evidence(cell: Cell, now: CurrentVerdict, cls: HostClass, emulated: bool) -> Evidence:
    gate = gate_of(cell)
    placement = cell.placement
    parity = cell.parity
    return Evidence(
        run_id=cell.run_id,
        artifact_digest=cell.artifact_digest,
        artifact_name=cell.artifact_name,
        role=cell.role,
        verdict=_verdict_now(cell, now),
        measured_at=_time(cell.measured_at),
        emulated=emulated,
        isa_mismatch=list(cell.isa_mismatch),
        emulated_numerics=_emulated_numerics(cell),
        p99_us=None if gate is None else _us(gate.p99_ms),
        p99_upper_us=None if gate is None else _us(gate.p99_upper_ms),
        p99_budget_us=round(cls.budgets.p99_ms * 1000),
        batch_size=None if gate is None else gate.batch_size,
        concurrency=None if gate is None else gate.concurrency,
        samples=None if gate is None else gate.samples,
        fallback_nodes=None
        if placement is None
        else fallback_count(placement.nodes_per_provider, cls.provider.expected),
        peak_rss_kb=None if cell.peak_rss_mb is None else round(cell.peak_rss_mb * 1024),
        cold_init_us=_us(cell.cold_init_ms),
        parity=None
        if parity is None
        else ParitySummary(
            passed=parity.passed,
            samples=parity.samples,
            outputs={
                o.name: OutputParitySummary(
                    passed=o.passed,
                    max_abs=_ratio(o.max_abs),
                    cosine_min=_ratio(o.cosine_min),
                    top1_agreement=_ratio(o.top1_agreement),
                )
                for o in parity.outputs
            },
        ),
    )


def _verdict_now(cell: Cell, now: CurrentVerdict) -> Verdict:
    """The evidence's verdict under the project deciding (an entry never rests on a stale cell:
    a stale one keeps its stored verdict)."""
    verdict = now.verdict
    return cell.verdict if verdict == "stale" else verdict


def _emulated_numerics(cell: Cell) -> EmulatedNumerics | None:
    """The evidence's note that its parity came from an emulated CPU of the class's ISA."""
    n = cell.numerics
    if n is None or n.source != "emulated" or n.cpu is None or n.qemu is None:
        return None
    return EmulatedNumerics(cpu=n.cpu, arch=n.arch, qemu=n.qemu)


def _candidate_reasons(
    cell: Cell,
    now: CurrentVerdict,
    project: Project,
    runs: Mapping[str, RunRecord],
    rollbacks: Rollbacks,
) -> list[Reason]:
    """Why the candidate's cell does not qualify (its current verdict's reasons, and what the
    policy weighs of the evidence); empty when it qualifies (its rollback, chosen by
    `Rollbacks` for it, included)."""
    found: list[Reason] = []
    if now.stale:
        found.extend(now.reasons)
    run = runs.get(cell.run_id)
    if run is None:
        found.append(Reason(code="run_missing", message=f"run {cell.run_id} was not supplied"))
    if emulated(cell, runs) and not project.policy.emulated_hosts_qualify:
        found.append(
            Reason(code="emulated", message=f"run {cell.run_id} ran on a host that does not match")
        )
    numerics = cell.numerics
    if (
        numerics is not None
        and numerics.source == "emulated"
        and not project.policy.emulated_numerics_qualify
    ):
        found.append(
            Reason(
                code="emulated_numerics",
                message=f"run {cell.run_id} computed its parity on an emulated {numerics.cpu} "
                "(policy.allow_emulated 'parity' or true accepts that)",
            )
        )
    if run is not None and run.host_busy and project.policy.busy_host == "refuse":
        found.append(
            Reason(
                code="host_busy",
                message=f"run {cell.run_id} measured on a host whose load average exceeded its "
                "cores, and policy.busy_host is 'refuse'",
            )
        )
    if not now.stale and now.verdict != "pass":
        if cell.parity is None and cell.error is None:
            found.append(
                Reason(code="parity_missing", message="no parity result against the baseline")
            )
        for reason in now.reasons:
            if reason.code == "expected_provider_missing" and cell.placement is None:
                reason = Reason(code="placement_missing", message=reason.message)
            found.append(reason)
    rollback = rollbacks.of(cell.artifact_digest)
    if rollback.reason is not None:
        found.append(rollback.reason)
    return found


def _upper(cell: Cell) -> float:
    gate = gate_of(cell)
    return math.inf if gate is None or gate.p99_upper_ms is None else gate.p99_upper_ms


# The reasons whose message names nothing of the class, made once: a fleet's decisions share
# them (a Reason is immutable).
_HOLD_FAILING_BASELINE = Reason(
    code="hold",
    message="the policy for a class whose baseline fails its gates is 'hold': "
    "hosts keep what they run",
)
_HOLD_UNKNOWN = Reason(code="hold", message="the policy for unknown classes is 'hold'")
_BASELINE_UNKNOWN = Reason(
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
    if not allow_emulated and emulated(cell, runs):
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
    return _evidence(cell, now, cls, emulated(cell, runs))


class _ClassDecider:
    """One class's decision as the rule walks it: from the candidates to the baseline, the
    reasons found and the runs looked at accumulate here, and each step returns the decision it
    reaches."""

    def __init__(
        self,
        name: str,
        cls: HostClass,
        project: Project,
        key_cells: Sequence[Cell],
        key_runs: Sequence[RunRecord],
        runs: Mapping[str, RunRecord],
        judge_: Judge,
        previous: Manifest | PreviousManifest | None,
    ) -> None:
        self.name, self.cls, self.project, self.judge = name, cls, project, judge_
        self.key_cells, self.runs = key_cells, runs
        self.baseline = (judge_.baseline_digest, project.artifacts.baseline.label)
        self.current = judge_.settings(name)
        self.rollbacks = Rollbacks(
            name,
            cls,
            previous,
            self.baseline,
            key_cells,
            key_runs,
            runs,
            self.current,
            project.policy.emulated_hosts_qualify,
        )
        self.key_text = "(" + ", ".join(cls.key.as_tuple()) + ")"
        self.reasons: list[Reason] = []
        self.looked: set[str] = set()

    def decide(self) -> ClassDecision:
        if not self.key_cells:
            self.reasons.append(
                Reason(code="no_evidence", message=f"no cell was measured on {self.key_text}")
            )
            return self._unknown(f"nothing was measured on {self.key_text}")
        # The baseline's cell now; its verdict is judged only when no candidate qualifies.
        digest = self.baseline[0]
        found = pick(self.key_cells, digest, self.current) if digest else None
        base = found.cell if found is not None else None
        if base is not None:
            self.looked.add(base.run_id)
        passing = self._passing_candidates()
        if passing:
            return self._candidate(passing)
        return self._without_candidate(base)

    def _decision(
        self,
        kind: Decision,
        artifact: tuple[str | None, str | None],
        evidence: Evidence | None,
        summary: str,
    ) -> ClassDecision:
        if kind in ("baseline", "candidate") and artifact[0] is None:
            raise PolicyError(
                f"class '{self.name}' gets the baseline, but the digest of artifact "
                f"'{self.baseline[1]}' is unknown (no cell measured it); pass digests="
                "{label: 'sha256:...'} from the artifact files"
            )
        hold = kind == "hold"
        rollback = final_rollback(self.rollbacks, kind, artifact[0], self.reasons)
        return ClassDecision(
            host_class=self.name,
            key=self.cls.key,
            decision=kind,
            artifact_digest=None if hold else artifact[0],
            artifact_name=None if hold else artifact[1],
            rollback_digest=rollback.digest,
            rollback_name=rollback.name,
            rollback_proven=rollback.proven,
            rollback_runtime=rollback.runtime,
            rollback_provider=rollback.provider,
            evidence=evidence,
            reasons=_one_per_code(self.reasons),
            summary=summary,
            run_ids=sorted(self.looked),
        )

    def _unknown(self, why: str) -> ClassDecision:
        name, label = self.name, self.baseline[1]
        if self.project.policy.unknown_class == "hold":
            self.reasons.append(_HOLD_UNKNOWN)
            return self._decision(
                "hold",
                (None, None),
                None,
                f"{name} is held: {why}, and the policy for unknown classes is 'hold'.",
            )
        self.reasons.append(_BASELINE_UNKNOWN)
        return self._decision(
            "baseline",
            self.baseline,
            None,
            f"{name} gets the baseline {label}: {why}, and the policy for "
            "unknown classes is 'baseline'.",
        )

    def _passing_candidates(self) -> list[Cell]:
        """The candidates' cells that pass every gate on the key; why each other one does not
        is added to the reasons, and every run looked at to those looked at."""
        passing: list[Cell] = []
        reasons = self.reasons
        candidates = self.project.artifacts.candidates
        if not candidates:
            reasons.append(Reason(code="no_candidates", message="the project lists no candidate"))
        for spec in candidates:
            standing = self.judge.standing(self.name, spec.label, self.key_cells)
            cell, now = standing.cell, standing.current
            if cell is None or now is None:
                reasons.append(_never_measured(spec.label, self.key_text, standing))
                continue
            self.looked.add(cell.run_id)
            failed = _candidate_reasons(cell, now, self.project, self.runs, self.rollbacks)
            if failed:
                reasons.extend(
                    Reason(code=r.code, message=f"candidate {spec.label}: {r.message}")
                    for r in failed
                )
            else:
                passing.append(cell)
        return passing

    def _candidate(self, passing: list[Cell]) -> ClassDecision:
        passing.sort(key=lambda c: (_upper(c), c.artifact_name, c.artifact_digest))
        chosen = passing[0]
        upper, budget = _ms(_upper(chosen)), _ms(self.cls.budgets.p99_ms)
        self.reasons.insert(
            0,
            Reason(
                code="candidate_passed",
                message=f"candidate {chosen.artifact_name} passed every gate on {self.key_text} "
                f"in run {chosen.run_id}: p99 upper bound {upper} <= {budget}",
            ),
        )
        self.reasons.extend(
            Reason(
                code="candidate_not_chosen",
                message=f"candidate {other.artifact_name} also passed, with p99 upper bound "
                f"{_ms(_upper(other))} > {upper}",
            )
            for other in passing[1:]
        )
        return self._decision(
            "candidate",
            (chosen.artifact_digest, chosen.artifact_name),
            _evidence(chosen, _PASSED, self.cls, emulated(chosen, self.runs)),
            f"{self.name} gets candidate {chosen.artifact_name}: it passed every gate on "
            f"{self.key_text} in run {chosen.run_id} (p99 upper bound {upper}, budget {budget}).",
        )

    def _without_candidate(self, base: Cell | None) -> ClassDecision:
        """No candidate qualified: the baseline, a hold, or the policy for unknown classes."""
        failed = sorted({r.code for r in self.reasons if r.code not in ("no_candidates",)})
        why = f"no candidate qualified ({', '.join(failed)})" if failed else "no candidate"
        base_now = self.judge.verdict(base, name=self.name) if base is not None else None
        label = self.baseline[1]
        standing = Standing(self.name, label, "baseline", self.baseline[0], base, base_now)
        unusable = _unusable(standing, self.project.policy.emulated_hosts_qualify, self.runs)
        if base is not None and unusable is None and _verdict_of(standing) == "error":
            self.reasons.append(
                Reason(
                    code="baseline_failed",
                    message=f"baseline {label} could not run on {self.key_text} in run "
                    f"{base.run_id}: {base.error or 'no detail'}",
                )
            )
            return self._decision(
                "hold",
                (None, None),
                _standing_evidence(standing, self.cls, self.runs),
                f"{self.name} is held: {why}, and the baseline {label} itself could "
                "not run on this class.",
            )
        if base is None or base_now is None or unusable is not None:
            state = unusable or "no cell"
            self.reasons.append(
                Reason(
                    code="baseline_unmeasured",
                    message=f"baseline {label} has {state} on {self.key_text}",
                )
            )
            return self._unknown(f"{why}, and the baseline has {state} on this key")
        if base_now.verdict == "fail" and self.project.policy.failing_baseline == "hold":
            return self._hold_failing_baseline(base, base_now, why, standing)
        self.reasons.append(
            Reason(
                code="baseline_chosen",
                message=f"baseline {label} ran on {self.key_text} in run {base.run_id}",
            )
        )
        return self._decision(
            "baseline",
            self.baseline,
            _standing_evidence(standing, self.cls, self.runs),
            f"{self.name} gets the baseline {label}: {why}.",
        )

    def _hold_failing_baseline(
        self, base: Cell, base_now: CurrentVerdict, why: str, standing: Standing
    ) -> ClassDecision:
        # The class lost the path its budgets assume (typically its accelerator: the baseline now
        # runs on the CPU over budget). Shipping the baseline would move every host of the class
        # onto a known-failing artifact; holding keeps what they run until a person decides.
        label = self.baseline[1]
        codes = ", ".join(sorted({r.code for r in base_now.reasons}))
        self.reasons.append(
            Reason(
                code="baseline_fails_gates",
                message=f"baseline {label} fails this class's own gates on {self.key_text} "
                f"in run {base.run_id} ({codes})",
            )
        )
        self.reasons.append(_HOLD_FAILING_BASELINE)
        return self._decision(
            "hold",
            (None, None),
            _standing_evidence(standing, self.cls, self.runs),
            f"{self.name} is held: {why}, and the baseline {label} fails this class's gates "
            f"too ({codes}).",
        )


def _never_measured(label: str, key_text: str, standing: Standing) -> Reason:
    earlier = standing.replaced
    return Reason(
        code="no_candidate_cell",
        message=f"candidate {label} was never measured on {key_text}"
        + (
            f" as its file is now ({(standing.digest or '')[:19]}); run "
            f"{earlier.run_id} measured its earlier bytes"
            if earlier is not None
            else ""
        ),
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
    batch: int = BATCH,
) -> Iterator[ClassDecision]:
    """`decide`, ``batch`` classes at a time: a consumer that writes each entry as it comes
    (``manifest.build``, generating a release) never holds a whole fleet's decisions, and the
    policy and the writer each run over a batch while their code is hot in the processor's
    caches (one class at a time costs more: docs/benchmarks.md, generation). The same
    decisions and errors as `decide` (an error is raised when its class's batch is decided),
    for any ``batch`` >= 1. The consumer pauses the cyclic collector around a fleet's loop
    (``build_manifest`` does); a pause held here across the yields would outlive a consumer
    that stops early.
    """
    if batch < 1:
        raise ValueError(f"batch: decide at least 1 class at a time, not {batch}")
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
    yield from _decide_all(project, by_key, runs_by_key, runs, known, previous, overrides, batch)


def _decide_all(
    project: Project,
    by_key: Mapping[_Key, Sequence[Cell]],
    runs_by_key: Mapping[_Key, list[RunRecord]],
    runs: Mapping[str, RunRecord],
    known: Mapping[str, str],
    previous: Manifest | PreviousManifest | None,
    overrides: Mapping[str, str],
    size: int,
) -> Iterator[ClassDecision]:
    judge_ = Judge(project, known, current_settings=overrides)
    batch: list[ClassDecision] = []
    for name, cls in project.host_classes.items():
        key = _key_of(cls.key)
        batch.append(
            _ClassDecider(
                name,
                cls,
                project,
                by_key.get(key, ()),
                runs_by_key.get(key, ()),
                runs,
                judge_,
                previous,
            ).decide()
        )
        if len(batch) >= size:
            yield from batch
            batch = []
    yield from batch
