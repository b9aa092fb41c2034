"""Whether a rollout step may advance: the cohort's telemetry since the step began, judged by
``telemetry check``'s own rules on the manifest as the cohort sees it (`canary_view`). Any alert,
too few latencies to bound the cohort's p99, no event at all (``no_data`` never passes), or a
cohort slower than the rest of the class halts it. Does not own the rollout actions
(``qualify.rollout``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from matrix.store import Store
from matrix.telemetry.queries import rollout_reported
from matrix.telemetry.scope import Cohort
from qualify.errors import QualifyError
from schemas.manifest import Manifest, Rollback
from schemas.telemetry import CheckSettings, ClassState, TelemetryCheck

__all__ = ["StepVerdict", "canary_view", "judge_cohort", "judge_step"]


def canary_view(manifest: Manifest, host_class: str) -> Manifest:
    """The manifest as the rollout's cohort sees it, holding only ``host_class``: its entry
    assigns the rollout's artifact, with the current one as the rollback (so that the rest of
    the class, running it, is a warning and not an alert)."""
    entry = manifest.signed.entries[host_class]
    if entry.rollout is None:
        raise QualifyError(f"{host_class} has no rollout in progress")
    current = entry.artifact
    rollback = Rollback.ran(current) if current is not None else entry.rollback
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


def judge_cohort(
    db: Store,
    manifest: Manifest,
    host_class: str,
    rollout_id: str,
    *,
    start: datetime,
    now: datetime,
    settings: CheckSettings,
) -> StepVerdict:
    """`judge_step` of ``host_class``'s rollout ``rollout_id`` over the telemetry ``db`` holds
    from ``start`` to ``now``: the cohort
    against the manifest as it sees it (`canary_view`), the rest of the class as ``telemetry
    check`` judges it, each host against the version it reports.

    Raises:
        QualifyError: ``host_class`` has no rollout in progress.
    """
    from qualify.telemetry.check import check_telemetry
    from qualify.telemetry.watch import gather_aggregates, load_releases

    cells = db.latest_cells()
    view = canary_view(manifest, host_class)
    # Hosts that say which side of the rollout they are on are judged by it (a canary host
    # still on the old artifact is then an unexpected digest); hosts too old to say are told
    # apart by the artifact they report.
    sides: tuple[Cohort, Cohort] | tuple[None, None] = (
        ((rollout_id, "canary"), (rollout_id, "rest"))
        if rollout_reported(db, rollout_id, start=start, end=now)
        else (None, None)
    )
    cohort = check_telemetry(
        view,
        cells,
        gather_aggregates(
            db, view, start=start, end=now, settings=settings, cohort=sides[0], cells=cells
        ),
        now=now,
        settings=settings,
    )
    releases = load_releases(db, manifest, start=start, end=now)
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
            releases=releases,
            cells=cells,
        ),
        now=now,
        settings=settings,
    )
    return judge_step(
        host_class, cohort, whole, settings.p99_tolerance, sides_reported=sides[0] is not None
    )
