"""The report's tuning and lineage sections: the latest ``qualify tune`` of each class as a
chart of latency per configuration, and how every candidate ``qualify candidates`` made was
derived.

Owns turning ``schemas.tune.TuneRecord`` and ``schemas.lineage.Lineage`` into view rows; the
templates (``_tuning.html``, ``_lineage.html``) draw them. A trial that measured nothing shows
"not measured", never a zero.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from reports.formatting import ms, short_digest, utc_minute
from reports.view import LineageRow, Tone, TrialRow, TuningView
from schemas.cell import Slowdown
from schemas.lineage import Lineage
from schemas.project import Project
from schemas.tune import Trial, TuneRecord

__all__ = ["lineage_rows", "tuning_views"]

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


def lineage_rows(lineage: Mapping[str, Lineage]) -> tuple[LineageRow, ...]:
    """Every made candidate, by name."""
    rows = []
    for item in sorted(lineage.values(), key=lambda i: (i.name, i.artifact_digest)):
        rows.append(
            LineageRow(
                name=item.name,
                digest=item.artifact_digest,
                precision=item.precision,
                parent=f"{item.parent_name} ({short_digest(item.parent_digest)})",
                tool=f"{item.tool} {item.tool_version}",
                params=", ".join(
                    f"{k}={v if isinstance(v, str | int | float | bool) else json.dumps(v)}"
                    for k, v in sorted(item.params.items())
                ),
                calibration=item.calibration_digest or "none",
                note=item.note or "",
            )
        )
    return tuple(rows)
