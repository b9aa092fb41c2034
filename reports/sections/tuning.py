"""The tuning section: the latest ``qualify tune`` of each class, a latency bar per trial.

A trial that measured nothing shows "not measured", never a zero.
"""

from __future__ import annotations

from collections.abc import Sequence

from reports.formatting import ms, utc_minute
from reports.inputs import Classes, Inputs
from reports.view import Tone, TrialRow, TuningView
from schemas.cell import Slowdown
from schemas.project import Project
from schemas.tune import Trial, TuneRecord

__all__ = ["build", "tuning_views"]

_STATUS_TONES: dict[str, Tone] = {
    "winner": "ok",
    "reference": "",
    "finalist": "",
    "dropped": "muted",
    "numerics_changed": "bad",
}


def _bound(value: float | None) -> str:
    return "?" if value is None else f"{value:.3g}"


def _ratio(r: Slowdown | None) -> str:
    if r is None:
        return "reference"
    if r.p50_ratio is None or r.p99_ratio is None:
        return "no paired rounds"
    return (
        f"p50 x{r.p50_ratio:.3g} [{_bound(r.p50_lower)}, {_bound(r.p50_upper)}], "
        f"p99 x{r.p99_ratio:.3g} [{_bound(r.p99_lower)}, {_bound(r.p99_upper)}]"
    )


def _numerics(trial: Trial) -> str:
    parity = trial.cell.parity
    if trial.trial == 0:
        return "reference"
    if parity is None:
        return "not compared"
    if parity.passed:
        return "same within tolerance"
    failed = [o.name for o in parity.outputs if not o.passed]
    return "differ: " + ", ".join(failed)


def _row(trial: Trial, scale: float) -> TrialRow:
    gate = trial.cell.latency[0] if trial.cell.latency else None
    p50 = gate.p50_ms if gate is not None else None
    p99 = gate.p99_ms if gate is not None else None
    return TrialRow(
        trial=trial.trial,
        label=trial.label,
        status=trial.status,
        tone=_STATUS_TONES.get(trial.status, ""),
        p50_text=ms(p50),
        p99_text=ms(p99),
        p50_pct=round(100 * p50 / scale, 2) if p50 is not None and scale > 0 else 0.0,
        p99_pct=round(100 * p99 / scale, 2) if p99 is not None and scale > 0 else 0.0,
        ratio=_ratio(trial.vs_current),
        numerics=_numerics(trial),
    )


def _view(record: TuneRecord) -> TuningView:
    p99s = [t.cell.latency[0].p99_ms for t in record.trials if t.cell.latency]
    scale = max(p99s) if p99s else 0.0
    if record.winner == 0:
        tone: Tone = ""
    else:
        tone = "ok" if record.applied or record.qualification_verdict == "pass" else "bad"
    return TuningView(
        host_class=record.host_class,
        anchor=f"tune-{record.host_class}",
        artifact=record.artifact_name,
        config=record.config,
        when=utc_minute(record.finished_at),
        budget=f"{record.budget_s:g} s",
        winner=record.winner_label,
        outcome=record.outcome
        + (f" (run {record.qualification_run_id})" if record.qualification_run_id else ""),
        outcome_tone=tone,
        scale_ms=scale,
        trials=tuple(_row(t, scale) for t in record.trials),
    )


def tuning_views(project: Project, tunes: Sequence[TuneRecord]) -> tuple[TuningView, ...]:
    """The latest tune of each class that has one, in the project's class order (classes the
    project no longer has come last, by name)."""
    latest: dict[str, TuneRecord] = {}
    for record in sorted(tunes, key=lambda r: (r.started_at, r.tune_id)):
        latest[record.host_class] = record
    order = [*project.host_classes, *sorted(set(latest) - set(project.host_classes))]
    return tuple(_view(latest[name]) for name in order if name in latest)


def build(inputs: Inputs, classes: Classes) -> tuple[TuningView, ...] | None:
    """Shown when some class was tuned."""
    return tuning_views(inputs.project, inputs.tunes) or None
