"""Building the report's view model from the matrix: the pure function ``build_report``.

Owns turning schema objects (the project, the matrix's cells, run records, raw latency samples and
optionally the current and previous manifests) into the view model of ``reports.view``: every
class and artifact placed in the heat map, each class's side-by-side table, parity checks, runs
and rollback package, the manifest diff, the header's counts and the glossary of reason codes.
Every missing measurement is said as "not measured". Every verdict shown is the cell's under
the project file now (``manifest.verdict``: the one rule ``matrix show``, the gate and
``manifest generate`` apply), with the parity limits it applied; a project artifact's column
shows the cell of its bytes now.

Does not own I/O (the CLI reads the matrix, verifies the signature and passes the results in),
the clock (``now`` is a parameter), the decision (the manifest's entries are displayed, never
recomputed), the words for a number (``reports.formatting``), a value's tone
(``reports.tones``), the charts' data (``reports.charts``) or HTML (``reports.render`` and the
templates). Nothing here invents a number: a value absent from the inputs is shown as absent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from manifest.diff import diff_manifests
from manifest.gates import assess
from manifest.policy import artifact_digests
from manifest.verdict import STALE_CODES, CurrentVerdict, Judge
from reports.charts import Samples, SamplesSource, latency_chart, samples_reader
from reports.formatting import (
    NOT_MEASURED,
    VERDICT_WORDS,
    bare_ms,
    mb,
    ms,
    number,
    plural,
    provider_name,
    short_digest,
    tolerance,
    utc_minute,
)
from reports.tones import gate_tones, verdict_tone, with_tone
from reports.tuning import lineage_rows, tuning_views
from reports.view import (
    ArtifactColumn,
    ClassView,
    CompareRow,
    DiffRow,
    DiffView,
    Header,
    HeatCell,
    HeatRow,
    ParityRow,
    ReasonView,
    ReportView,
    RolloutRow,
    RunView,
    SignatureStatus,
    SteeredRow,
    Tone,
)
from schemas.cell import Cell, OutputParity, RunRecord, recency
from schemas.lineage import Lineage
from schemas.manifest import (
    DECISION_REASON_CODES,
    ChangeSide,
    Manifest,
    ManifestEntry,
    ManifestSigned,
)
from schemas.project import HostClass, OutputTolerance, Project, TaskTolerance
from schemas.reasons import REASONS
from schemas.rules import fallback_count
from schemas.tune import TuneRecord

__all__ = ["build_report"]


def _reasons(items: Iterable[Any], codes: Mapping[str, str]) -> tuple[ReasonView, ...]:
    return tuple(
        ReasonView(code=r.code, message=r.message, meaning=codes.get(r.code, "")) for r in items
    )


# -- per class ---------------------------------------------------------------------------------


def _latest_by_artifact(cells: Iterable[Cell]) -> dict[str, Cell]:
    latest: dict[str, Cell] = {}
    for cell in cells:
        found = latest.get(cell.artifact_name)
        if found is None or recency(cell) > recency(found):
            latest[cell.artifact_name] = cell
    return latest


def _emulated(cell: Cell, runs: Mapping[str, RunRecord]) -> bool:
    run = runs.get(cell.run_id)
    return cell.emulated or (run is not None and run.emulated)


def _p99_text(cell: Cell, budget: float | None, tone: Tone) -> tuple[str, Tone]:
    gate = cell.gate_latency
    if gate is None:
        return "p99 " + NOT_MEASURED, "muted"
    of = f" of {ms(budget)}" if budget is not None else ""
    if gate.p99_upper_ms is None:
        return f"p99 {ms(gate.p99_ms)}, no bound{of}", "warn"
    return f"p99 ≤ {ms(gate.p99_upper_ms)}{of}", tone


def _parity_text(cell: Cell, now: CurrentVerdict) -> tuple[str, Tone]:
    if cell.role == "baseline":
        return "reference", "muted"
    if cell.parity is None:
        return "parity " + NOT_MEASURED, "muted"
    if now.stale:
        return "parity stale", "muted"
    verdict = "parity fail" if "parity_failed" in now.codes else "parity pass"
    # The task-level figures first where parity.post asks for them: what users see.
    applied = {o.name: o.task for o in now.parity}
    tasks = [
        f"{o.name} {check} {number(getattr(o, attr))}"
        for o in cell.parity.outputs
        if (task := applied.get(o.name, o.task_tolerance)) is not None
        for check, attr, limit in _TASK_CHECKS
        if getattr(task, limit) is not None and getattr(o, attr) is not None
    ]
    return (f"{verdict} ({'; '.join(tasks)})" if tasks else verdict), ""


def _heat_cell(
    name: str, cell: Cell | None, now: CurrentVerdict | None, cls: HostClass | None, emulated: bool
) -> HeatCell:
    if cell is None or now is None:
        return HeatCell(
            artifact=name,
            verdict="missing",
            verdict_text=NOT_MEASURED,
            p99_text="",
            p99_tone="muted",
            parity_text="",
            parity_tone="muted",
            fallback_text="",
            emulated=False,
            stale=False,
        )
    tones = _tones(cell, now, cls)
    p99, p99_tone = _p99_text(cell, cls.budgets.p99_ms if cls else None, tones.get("p99", ""))
    parity, parity_tone = with_tone(_parity_text(cell, now), tones.get("parity"))
    return HeatCell(
        artifact=name,
        verdict=now.verdict,
        verdict_text=VERDICT_WORDS[now.verdict],
        p99_text=p99,
        p99_tone=p99_tone,
        parity_text=parity,
        parity_tone=parity_tone,
        fallback_text=(
            f"fallback: {cell.placement.fallback_nodes} nodes"
            if cell.placement is not None and cell.placement.fallback_nodes
            else ""
        ),
        emulated=emulated,
        stale=now.stale,
    )


def _tones(cell: Cell, now: CurrentVerdict, cls: HostClass | None) -> dict[str, Tone]:
    """`gate_tones`, with the parity's tone as judged under the project's tolerances now."""
    tones = gate_tones(cell, cls) if not now.stale else {}
    if cell.parity is not None and cell.role == "candidate" and not now.stale:
        tones["parity"] = "bad" if "parity_failed" in now.codes else "ok"
    return tones


def _against(
    value: float | None, budget: float | None, fmt: Callable[[float | None], str]
) -> tuple[str, Tone]:
    if value is None:
        return NOT_MEASURED, "muted"
    if budget is None:
        return f"{fmt(value)} (no budget)", ""
    share = value / budget
    return f"{fmt(value)} of {fmt(budget)} ({share:.0%})", ""


def _placement_parts(cell: Cell | None) -> tuple[tuple[str, bool], ...]:
    # Most nodes first; a provider other than the expected one that ran nodes is fallback.
    placement = cell.placement if cell is not None else None
    if placement is None:
        return ()
    ranked = sorted(placement.nodes_per_provider.items(), key=lambda kv: (-kv[1], kv[0]))
    kernel = placement.kernel_ms_per_provider or {}
    parts = tuple(
        (
            f"{provider_name(p)} {n}"
            + (f" ({kernel[p]:.3g} ms kernel time)" if p in kernel else "")
            + (" (fallback)" if fallback else ""),
            fallback,
        )
        for p, n in ranked
        for fallback in [p != placement.expected_provider and n > 0]
    )
    if placement.source == "profiler":
        parts += (("counted from the profiler: this onnxruntime has no placement API", False),)
    return parts


_RSS_SOURCES = {
    "wait4": "os.wait4",
    "vmhwm": "child's VmHWM",
    "vmhwm-before-kill": "VmHWM before the timeout kill",
}


def _measured_by(shown: tuple[str, Tone], source: str | None) -> tuple[str, Tone]:
    text, tone = shown
    if source is None or text == NOT_MEASURED:
        return shown
    return f"{text}, by {_RSS_SOURCES.get(source, source)}", tone


def _fallback_text(cell: Cell, cls: HostClass | None) -> tuple[str, Tone]:
    placement = cell.placement
    if placement is None:
        return NOT_MEASURED, "muted"
    expected = cls.provider.expected if cls is not None else placement.expected_provider
    fallback = fallback_count(placement.nodes_per_provider, expected)
    if placement.nodes_per_provider.get(expected, 0) == 0:
        return (
            f"{fallback} of {placement.total_nodes} nodes; {provider_name(expected)} ran none",
            "",
        )
    allowed = cls.provider.fallback_allowance if cls is not None else 0
    suffix = f" (allowed {allowed})" if allowed else ""
    return f"{fallback} of {placement.total_nodes} nodes{suffix}", ""


_Value = Callable[[Cell], tuple[str, Tone]]
"""One artifact's value in a row of the side-by-side table: its text and own tone."""


def _compare(
    cells: Sequence[Cell | None],
    nows: Sequence[CurrentVerdict | None],
    cls: HostClass | None,
    runs: Mapping[str, RunRecord],
) -> tuple[CompareRow, ...]:
    budgets = cls.budgets if cls else None
    now_of = {id(c): n for c, n in zip(cells, nows, strict=True) if c is not None and n}
    tones = [
        None if cell is None or now is None else _tones(cell, now, cls)
        for cell, now in zip(cells, nows, strict=True)
    ]

    def row(label: str, fn: _Value, gate: str | None = None) -> CompareRow:
        # A row a gate judges takes that gate's tone: one rule, as the runner and policy apply it.
        return CompareRow(
            label=label,
            values=tuple(
                (NOT_MEASURED, "muted")
                if cell is None or tone is None
                else with_tone(fn(cell), tone.get(gate) if gate else None)
                for cell, tone in zip(cells, tones, strict=True)
            ),
        )

    def flags(cell: Cell) -> tuple[str, Tone]:
        return _flags(cell, runs, now_of.get(id(cell)))

    flagged = any(flags(c)[0] != "current" for c in cells if c is not None)
    staged = any(
        c is not None and c.gate_latency is not None and c.gate_latency.stage_share is not None
        for c in cells
    )
    return (
        row("verdict", lambda c: _verdict(now_of.get(id(c)))),
        *([row("measured", flags)] if flagged else []),
        row("gate config", _config),
        row("p50" + (" end to end" if staged else ""), _gate_ms("p50_ms")),
        row("p99" + (" end to end" if staged else ""), _gate_ms("p99_ms")),
        *([row("inference alone", _inference), row("stages", _stages)] if staged else []),
        row("gates", lambda c: _judged(c, now_of.get(id(c)), cls)),
        row("p99 bound", _bound, "p99"),
        row("parity", lambda c: _parity_text(c, now_of[id(c)]), "parity"),
        CompareRow(
            label="nodes per provider",
            values=tuple((NOT_MEASURED, "muted") for _ in cells),
            parts=tuple(_placement_parts(cell) for cell in cells),
        ),
        row("fallback", lambda c: _fallback_text(c, cls), "placement"),
        row(
            "cold init",
            lambda c: _against(c.cold_init_ms, budgets.cold_init_ms if budgets else None, ms),
            "cold init",
        ),
        row(
            "warm init",
            lambda c: (ms(c.warm_init_ms), "" if c.warm_init_ms is not None else "muted"),
        ),
        row(
            "peak memory",
            lambda c: _measured_by(
                _against(c.peak_rss_mb, budgets.peak_rss_mb if budgets else None, mb),
                c.peak_rss_source,
            ),
            "memory",
        ),
        row("energy", _energy_text, "energy"),
        *([row("soak", _soak_text, "sustained")] if any(c and c.soak for c in cells) else []),
        *(
            [row("request rate", _rate_text, "rate")]
            if any(c and c.open_loop for c in cells)
            else []
        ),
        row("digest", lambda c: (short_digest(c.artifact_digest), "")),
        row("other configs", _other_configs),
    )


def _verdict(now: CurrentVerdict | None) -> tuple[str, Tone]:
    # The verdict under the project file now (``manifest.verdict``), not the runner's.
    if now is None:
        return NOT_MEASURED, "muted"
    return VERDICT_WORDS[now.verdict], verdict_tone(now.verdict)


def _flags(
    cell: Cell, runs: Mapping[str, RunRecord], now: CurrentVerdict | None
) -> tuple[str, Tone]:
    # What makes a cell's numbers doubtful here: emulation, another ISA's numerics, staleness.
    marks = []
    if _emulated(cell, runs):
        marks.append("emulated")
    if cell.isa_mismatch:
        marks.append("numerics from another ISA (" + "; ".join(cell.isa_mismatch) + ")")
    numerics = cell.numerics
    if numerics is not None and numerics.source == "emulated":
        marks.append(f"numerics of this ISA, emulated on {numerics.cpu} (QEMU {numerics.qemu})")
    if now is not None and now.stale:
        marks.append("stale: " + "; ".join(r.message for r in now.reasons))
    return (", ".join(marks), "warn") if marks else ("current", "")


def _config(cell: Cell) -> tuple[str, Tone]:
    # The latency config the gates judged (the other configs have their own row).
    gate = cell.gate_latency
    if gate is None:
        return NOT_MEASURED, "muted"
    tput = f", {gate.throughput_ips:,.0f}/s" if gate.throughput_ips is not None else ""
    return (
        f"{gate.config.label.replace('concurrency', 'conc.')}, n={gate.samples:,}{tput}",
        "",
    )


def _gate_ms(attr: str) -> _Value:
    # One duration of the gate's latency config, e.g. ``p50_ms``.
    def get(cell: Cell) -> tuple[str, Tone]:
        gate = cell.gate_latency
        if gate is None:
            return NOT_MEASURED, "muted"
        return ms(getattr(gate, attr)), ""

    return get


def _soak_text(cell: Cell) -> tuple[str, Tone]:
    # The p99 of each soak window, first to last, and the heat where the host said it.
    soak = cell.soak
    if soak is None:
        return NOT_MEASURED, "muted"
    p99s = ", ".join("?" if w.p99_ms is None else f"{w.p99_ms:.3g}" for w in soak.windows)
    temps = [w.temp_c for w in soak.windows if w.temp_c is not None]
    heat = f"; up to {max(temps):.0f} °C" if temps else ""
    verdict = {True: "drifted", False: "steady", None: "undecided"}[soak.drifted]
    return f"{soak.seconds:.0f} s, p99 by window {p99s} ms: {verdict}{heat}", ""


def _rate_text(cell: Cell) -> tuple[str, Tone]:
    # The highest Poisson arrival rate whose p99 met the budget, and the closed-loop ceiling.
    found = cell.open_loop
    if found is None:
        return NOT_MEASURED, "muted"
    ceiling = (
        f" of {found.closed_loop_rps:,.0f}/s back to back"
        if found.closed_loop_rps is not None
        else ""
    )
    if found.max_rate_rps is None:
        return f"none within p99 {found.budget_ms:g} ms: {found.missing}", "muted"
    best = max((p for p in found.probes if p.met), key=lambda p: p.rate_rps)
    return (
        f"{found.max_rate_rps:,.0f}/s{ceiling} (p99 {ms(best.p99_ms)} at it, "
        f"{len(found.probes)} rates probed)",
        "",
    )


def _energy_text(cell: Cell) -> tuple[str, Tone]:
    # Energy per inference at the gate config and the counters it came from, or why none.
    gate = cell.gate_latency
    if gate is None:
        return NOT_MEASURED, "muted"
    if gate.energy_mj is None:
        why = f": {gate.energy_missing}" if gate.energy_missing else ""
        return f"{NOT_MEASURED}{why}", "muted"
    return f"{gate.energy_mj:.3g} mJ per inference ({', '.join(gate.energy_source or [])})", ""


def _inference(cell: Cell) -> tuple[str, Tone]:
    # The model call alone, beside the end-to-end figures, when a pipeline was timed.
    gate = cell.gate_latency
    if gate is None or gate.inference_p50_ms is None or gate.inference_p99_ms is None:
        return NOT_MEASURED, "muted"
    return f"p50 {ms(gate.inference_p50_ms)}, p99 {ms(gate.inference_p99_ms)}", ""


def _stages(cell: Cell) -> tuple[str, Tone]:
    # Each stage's share of the timed time: a reader sees when pre-processing dominates.
    gate = cell.gate_latency
    if gate is None or gate.stage_share is None:
        return NOT_MEASURED, "muted"
    shares = gate.stage_share
    text = ", ".join(f"{stage} {share:.0%}" for stage, share in shares.items())
    return text, "warn" if shares.get("inference", 1.0) < 0.5 else ""


def _judged(cell: Cell, now: CurrentVerdict | None, cls: HostClass | None) -> tuple[str, Tone]:
    # Which gates fail or cannot decide under the project now (manifest.verdict), in a sentence.
    if cls is None or now is None:
        return "no class to judge against", "muted"
    if now.stale:
        return "not judged: stale (" + ", ".join(STALE_CODES[c] for c in now.codes) + ")", "warn"
    if cell.error is not None:
        return "not judged: it could not run", "muted"
    # The gates as the current verdict applies them: parity against the tolerances now.
    rejudged = cell.role == "candidate" and cell.parity is not None
    findings = assess(cell, cls, skip=("parity",) if rejudged else ())
    failed = [g.name for g, f in findings if f.outcome == "fail"]
    undecided = [g.name for g, f in findings if f.outcome == "undecided"]
    if rejudged and "parity_failed" in now.codes:
        failed.insert(0, "parity")
    if not failed and not undecided:
        return "every configured gate held", "ok"
    parts = ([f"failed: {', '.join(failed)}"] if failed else []) + (
        [f"undecided: {', '.join(undecided)}"] if undecided else []
    )
    return "; ".join(parts), "bad" if failed else "warn"


def _bound(cell: Cell) -> tuple[str, Tone]:
    # The p99's confidence interval; a sample too small for one says so.
    gate = cell.gate_latency
    if gate is None:
        return NOT_MEASURED, "muted"
    if gate.p99_upper_ms is None or gate.p99_lower_ms is None:
        return f"none: {gate.samples} samples too few", "warn"
    return (
        f"{bare_ms(gate.p99_lower_ms)} to {ms(gate.p99_upper_ms)} ({gate.confidence:.0%})",
        "",
    )


def _other_configs(cell: Cell) -> tuple[str, Tone]:
    # Latency configs other than the gate's, one short clause each (the gate has its own rows).
    gate = cell.gate_latency
    others = [r for r in cell.latency if r is not gate]
    if not others:
        return "none", "muted"
    return "; ".join(
        f"{r.config.short}: p50 {bare_ms(r.p50_ms)}, p99 {bare_ms(r.p99_ms)} "
        f"(≤ {bare_ms(r.p99_upper_ms) if r.p99_upper_ms is not None else '?'}) ms, "
        f"n={r.samples:,}, {r.decision}"
        for r in others
    ), ""


_PARITY_CHECKS: tuple[tuple[str, str, str], ...] = (
    # (check, measured attribute, tolerance attribute)
    ("max |a-b|", "max_abs", "max_abs"),
    ("mean |a-b|", "mean_abs", "mean_abs"),
    ("max relative", "max_rel", "max_rel"),
    ("min cosine", "cosine_min", "cosine_min"),
    ("top-1 agreement", "top1_agreement", "top1_agreement_min"),
)


_TASK_CHECKS: tuple[tuple[str, str, str], ...] = (
    # (check, measured attribute, task tolerance attribute): shown first, what users see
    ("exact match", "exact_match", "exact_match_min"),
    ("box F1", "box_f1", "box_f1_min"),
)


_TASK_PHRASES = tuple(attr for _, attr, _ in _TASK_CHECKS)
"""How `schemas.rules.task_failures` phrases begin (``exact_match 0.84 < 0.95``)."""


def _parity_rows(cell: Cell, now: CurrentVerdict) -> list[ParityRow]:
    if cell.parity is None:
        return []
    # The limits the current verdict applied (the project's tolerances now, merged field by
    # field); a stale cell was not judged now, so the run's own limits are shown for it.
    judged = {o.name: o for o in now.parity}
    rows = []
    numerics = cell.numerics
    here = numerics.native_max_abs if numerics is not None else None
    # Task-level outputs first (what a user of the service sees), then the tensors.
    for out in sorted(cell.parity.outputs, key=lambda o: o.task_tolerance is None):
        found = judged.get(out.name)
        failures = out.failures if found is None else found.failures
        task = out.task_tolerance if found is None else found.task
        rows.extend(_task_rows(cell.artifact_name, out, task, failures))
        # The task-level failures have rows of their own (above): not repeated as the tensors'.
        tensors = [f for f in failures if not f.startswith(_TASK_PHRASES)]
        limits = out.tolerance if found is None else found.limits
        rows.extend(_output_rows(cell.artifact_name, out, limits, tensors))
        if numerics is not None and here is not None and out.name in here:
            # The difference the ISA makes: the same pair on the measuring host's own CPU.
            rows.append(
                ParityRow(
                    artifact=cell.artifact_name,
                    output=out.name,
                    check=f"max |a-b| on the measuring host, not {numerics.cpu}",
                    measured=number(here[out.name]),
                    tolerance="not judged",
                    min_passing="—",
                    tone="muted",
                )
            )
    return rows


def _task_rows(
    artifact: str, out: OutputParity, task: TaskTolerance | None, failures: Sequence[str]
) -> list[ParityRow]:
    """The task-level checks of one answer under ``task`` (``parity.post`` now, or the run's
    for a stale cell): exact match, box F1."""
    if task is None:
        return []
    rows = []
    for check, measured_attr, tol_attr in _TASK_CHECKS:
        limit = getattr(task, tol_attr)
        if limit is None:
            continue
        measured = getattr(out, measured_attr)
        label = f"{check} at IoU {number(task.iou)}" if measured_attr == "box_f1" else check
        failed = any(f.startswith(measured_attr) for f in failures)
        rows.append(
            ParityRow(
                artifact=artifact,
                output=out.name,
                check=label,
                measured=number(measured) if measured is not None else NOT_MEASURED,
                tolerance=f"≥ {tolerance(limit)}",
                min_passing=number(measured) if measured is not None else "none",
                tone="bad" if failed else "ok",
            )
        )
    return rows


def _output_rows(
    artifact: str, out: OutputParity, tol: OutputTolerance, failures: Sequence[str]
) -> list[ParityRow]:
    rows = []
    unchecked = []
    for check, measured_attr, tol_attr in _PARITY_CHECKS:
        measured = getattr(out, measured_attr)
        limit = getattr(tol, tol_attr)
        smallest = getattr(out.min_passing, tol_attr)
        at_run = getattr(out.tolerance, tol_attr)
        if limit is None:
            if measured is not None:
                unchecked.append(f"{check} {number(measured)}")
            continue
        failed = any(f.startswith(tol_attr) or f.startswith(measured_attr) for f in failures)
        rows.append(
            ParityRow(
                artifact=artifact,
                output=out.name,
                check=check,
                measured=number(measured),
                tolerance=tolerance(limit)
                + ("" if at_run == limit else f" (run: {tolerance(at_run) if at_run else 'off'})"),
                min_passing=number(smallest) if smallest is not None else "none",
                tone="bad" if failed else "ok",
            )
        )
    if failures and not any(r.tone == "bad" for r in rows):
        rows.append(
            ParityRow(
                artifact=artifact,
                output=out.name,
                check="failures",
                measured="; ".join(failures),
                tolerance="",
                min_passing="",
                tone="bad",
            )
        )
    if unchecked:
        rows.append(
            ParityRow(
                artifact=artifact,
                output=out.name,
                check="no tolerance",
                measured=", ".join(unchecked),
                tolerance="not checked",
                min_passing="",
                tone="muted",
            )
        )
    rows.extend(_output_notes(artifact, out))
    return rows


def _output_notes(artifact: str, out: OutputParity) -> list[ParityRow]:
    """What the metrics were taken over, and the metrics that do not apply, with why."""
    notes = [("measured over", out.over)] if out.over else []
    reasons: dict[str, list[str]] = {}
    for metric, why in out.skipped.items():
        reasons.setdefault(why, []).append(metric.replace("_", " "))
    notes += [(f"not applied: {', '.join(metrics)}", why) for why, metrics in reasons.items()]
    return [
        ParityRow(
            artifact=artifact,
            output=out.name,
            check=check,
            measured=text,
            tolerance="",
            min_passing="",
            tone="muted",
        )
        for check, text in notes
    ]


def _warnings(cells: Sequence[Cell]) -> tuple[tuple[str, str, int], ...]:
    """(artifact, message, count) of what the runtime warned while each cell was measured,
    each cell's most frequent first."""
    return tuple(
        (cell.artifact_name, warning.message, warning.count)
        for cell in cells
        if cell.placement is not None
        for warning in sorted(cell.placement.warnings, key=lambda w: -w.count)
    )


def _run_view(run: RunRecord, cls: HostClass | None) -> RunView:
    fp = run.fingerprint
    rt = fp.runtime
    wanted = cls.match.cpu_flags if cls else []
    have = set(fp.cpu_flags)

    def has(flag: str) -> bool:
        spellings = {flag, flag.replace("_", "")}
        return bool(spellings & (have | {f.replace("_", "") for f in have}))

    flags = f"{len(fp.cpu_flags)} flags"
    if wanted:
        flags += "; required: " + ", ".join(
            f"{f} {'present' if has(f) else 'MISSING'}" for f in wanted
        )
    facts: list[tuple[str, str]] = [
        ("host", fp.hostname),
        ("arch", fp.arch),
        ("cpu", fp.cpu_model or NOT_MEASURED),
        ("cpu flags", flags),
        ("cores", f"{fp.cores} (affinity {len(fp.affinity)})"),
        ("memory", f"{fp.memory_mb:,} MB" if fp.memory_mb is not None else NOT_MEASURED),
        ("os", fp.os),
        ("python", fp.python),
        ("onnxruntime", f"{rt.version} ({rt.package or 'package unknown'})"),
        ("build info", rt.build_info or "not offered"),
        ("providers", ", ".join(rt.available_providers) or "none available"),
        (
            "load average",
            f"{' / '.join(f'{x:.2f}' for x in run.load_avg_before)} before, "
            f"{' / '.join(f'{x:.2f}' for x in run.load_avg_after)} after",
        ),
    ]
    if run.rollback is None:
        rb_text, rb_tone = "rollback artifact not checked in this run", "warn"
    elif run.rollback.loaded:
        rb_text = f"rollback artifact {short_digest(run.rollback.artifact_digest)} loaded and ran"
        rb_tone = "ok"
    else:
        rb_text = (
            f"rollback artifact {short_digest(run.rollback.artifact_digest)} did NOT load: "
            f"{run.rollback.error or 'no detail'}"
        )
        rb_tone = "bad"
    return RunView(
        run_id=run.run_id,
        when=f"{utc_minute(run.started_at)} to {utc_minute(run.finished_at)}",
        emulated=run.emulated,
        mismatches=tuple(run.mismatches),
        facts=tuple(facts),
        rollback_text=rb_text,
        rollback_tone=rb_tone,  # type: ignore[arg-type]
    )


def _entry_text(entry: ManifestEntry | None, has_manifest: bool) -> tuple[str, str, str]:
    if entry is None:
        if has_manifest:
            return "none", "not in the manifest", "The manifest has no entry for this class."
        return "none", "no decision", "No manifest yet: this report shows measurements only."
    what = "hold" if entry.artifact is None else f"{entry.decision}: {entry.artifact.name}"
    return entry.decision, what, entry.summary


def _rollback_entry(
    name: str, entry: ManifestEntry | None, runs: Mapping[str, RunRecord]
) -> tuple[str, Tone]:
    """The manifest's rollback package, and the runtime that really loaded it (never the
    class's declared one: a CPU build under emulation proves nothing about a GPU build)."""
    if entry is None or entry.rollback is None:
        return ("no rollback package in the manifest" if entry else "no manifest yet"), "muted"
    rb = entry.rollback
    declared = rb.runtime or entry.runtime  # null: the entry's own runtime
    package = f"{rb.name} ({short_digest(rb.digest)}, {rb.uri})"
    if not rb.proven_to_load:
        return (
            f"{package}, NOT proven to load; hosts run {declared.package} {declared.version}",
            "bad",
        )
    proofs = [
        run
        for run in runs.values()
        if run.host_class == name
        and run.rollback is not None
        and run.rollback.artifact_digest == rb.digest
        and run.rollback.loaded
    ]
    proof = max(proofs, key=lambda r: (r.finished_at, r.run_id), default=None)
    if proof is None:
        return f"{package}, proven to load by a measured cell", "ok"
    rt = proof.fingerprint.runtime
    how = f"onnxruntime {rt.version} ({rt.package or 'package unknown'})"
    if proof.emulated:
        how += ", emulated"
    return f"{package}, proven to load in run {proof.run_id} under {how}", "ok"


def _budgets_text(cls: HostClass | None) -> str:
    # The class's budgets and provider expectation in one line; "" for a class not in the project.
    if cls is None:
        return ""
    b = cls.budgets
    parts = [f"p99 {ms(b.p99_ms)}"]
    parts.append(f"peak memory {mb(b.peak_rss_mb)}" if b.peak_rss_mb else "no memory budget")
    parts.append(f"cold init {ms(b.cold_init_ms)}" if b.cold_init_ms else "no cold-init budget")
    parts.append(
        f"expected provider {provider_name(cls.provider.expected)}, "
        f"{plural(cls.provider.fallback_allowance, 'fallback node', 'fallback nodes')} allowed"
    )
    return " · ".join(parts)


def _judged_cells(
    name: str,
    cls: HostClass | None,
    cells: Sequence[Cell],
    columns: Sequence[ArtifactColumn],
    judge: Judge,
) -> list[tuple[Cell, CurrentVerdict] | None]:
    """Per column, the cell the class rests on and its current verdict (``manifest.verdict``):
    a project artifact's cell of its bytes now on the class's key, or for an artifact or class
    the project file does not have, its latest cell (stale: not in the project)."""
    latest = _latest_by_artifact(cells)
    found: list[tuple[Cell, CurrentVerdict] | None] = []
    for col in columns:
        if cls is not None and col.in_project:
            standing = judge.standing(name, col.name, cells)
            cell, now = standing.cell, standing.current
        else:
            cell = latest.get(col.name)
            now = judge.verdict(cell) if cell is not None else None
        found.append((cell, now) if cell is not None and now is not None else None)
    return found


def _class_view(
    index: int,
    name: str,
    cls: HostClass | None,
    cells: Sequence[Cell],
    columns: Sequence[ArtifactColumn],
    entry: ManifestEntry | None,
    has_manifest: bool,
    runs: Mapping[str, RunRecord],
    samples: Callable[[str, str], Samples],
    judge: Judge,
) -> tuple[ClassView, HeatRow]:
    anchor = f"class-{index}"
    key = cls.key if cls else (entry.key if entry else None)
    key_text = " · ".join(key.as_tuple()) if key else ""
    judged = _judged_cells(name, cls, cells, columns, judge)
    present = [pair for pair in judged if pair is not None]
    shown_cells = [cell for cell, _ in present]
    nows = [now for _, now in present]
    emulated = {c.artifact_name: _emulated(c, runs) for c in shown_cells}
    budget = cls.budgets.p99_ms if cls else None
    decision, decision_text, summary = _entry_text(entry, has_manifest)
    heat = HeatRow(
        host_class=name,
        anchor=anchor,
        key_text=key_text,
        decision=decision,
        decision_text=decision_text,
        cells=tuple(
            _heat_cell(
                col.name,
                pair[0] if pair else None,
                pair[1] if pair else None,
                cls,
                emulated.get(col.name, False),
            )
            for col, pair in zip(columns, judged, strict=True)
        ),
    )
    shown = [col.name for col, pair in zip(columns, judged, strict=True) if pair is not None]
    chart, chart_note = latency_chart(index, shown_cells, budget, samples)
    run_ids = sorted({c.run_id for c in shown_cells})
    run_views = tuple(
        _run_view(runs[r], cls)
        for r in sorted(
            run_ids,
            key=lambda r: runs[r].finished_at if r in runs else datetime.min.replace(tzinfo=UTC),
            reverse=True,
        )
        if r in runs
    )
    rollback_text, rollback_tone = _rollback_entry(name, entry, runs)
    view = ClassView(
        name=name,
        anchor=anchor,
        key_text=key_text,
        in_project=cls is not None,
        decision=decision,
        decision_text=decision_text,
        summary=summary,
        reasons=_reasons(entry.reasons, DECISION_REASON_CODES) if entry else (),
        emulated=any(emulated.values()),
        stale=any(now.stale for now in nows),
        budgets_text=_budgets_text(cls),
        artifacts=tuple(shown),
        compare=_compare(shown_cells, nows, cls, runs) if shown_cells else (),
        cell_reasons=tuple(
            (c.artifact_name, now.verdict, _reasons(now.reasons, REASONS), c.error)
            for c, now in present
            if now.reasons or c.error
        ),
        chart=chart,
        chart_note=chart_note,
        parity=tuple(row for c, now in present for row in _parity_rows(c, now)),
        warnings=_warnings(shown_cells),
        rollback_text=rollback_text,
        rollback_tone=rollback_tone,
        runs=run_views,
    )
    return view, heat


# -- header and diff ---------------------------------------------------------------------------


def _decision_line(entries: Mapping[str, ManifestEntry]) -> tuple[str, tuple[tuple[str, int], ...]]:
    counts = {"candidate": 0, "baseline": 0, "hold": 0}
    for entry in entries.values():
        counts[entry.decision] = counts.get(entry.decision, 0) + 1
    parts = []
    if counts["candidate"]:
        n = counts["candidate"]
        parts.append(f"{plural(n, 'class gets', 'classes get')} the candidate")
    if counts["baseline"]:
        n = counts["baseline"]
        parts.append(f"{plural(n, 'class keeps', 'classes keep')} the baseline")
    if counts["hold"]:
        parts.append(f"{counts['hold']} held")
    line = ", ".join(parts) if parts else "the manifest has no classes"
    return line, tuple((k, v) for k, v in counts.items())


def _matrix_line(views: Sequence[ClassView], heat: Sequence[HeatRow]) -> tuple[str, dict[str, int]]:
    # The heat map's cells counted by verdict, as a clause of the header and as counts.
    verdicts = {"pass": 0, "fail": 0, "insufficient": 0, "error": 0, "stale": 0}
    for row in heat:
        for hc in row.cells:
            if hc.verdict in verdicts:
                verdicts[hc.verdict] += 1
    unmeasured = sum(1 for v in views if not v.artifacts)
    if not verdicts["stale"]:
        del verdicts["stale"]  # said only where some cell is stale
    cell_line = ", ".join(f"{n} {v}" for v, n in verdicts.items()) + " cells"
    if unmeasured:
        cell_line += f"; {plural(unmeasured, 'class has', 'classes have')} no measurement"
    return cell_line, verdicts


def _manifest_header(
    project: Project,
    current: ManifestSigned,
    status: SignatureStatus,
    snapshot: str | None,
    cell_line: str,
    generated: str,
    tool_version: str,
) -> Header:
    line, counts = _decision_line(current.entries)
    snapshot_note = ""
    if snapshot is not None and snapshot != current.snapshot:
        snapshot_note = (
            f"The manifest was built from matrix snapshot {short_digest(current.snapshot)}; the "
            "matrix has changed since, so some measurements below were not decided on."
        )
    return Header(
        model=project.model,
        release=current.release,
        manifest_text=(
            f"manifest version {current.version}, created {current.created}, "
            f"expires {current.expires}"
        ),
        has_manifest=True,
        signature_text=status.text,
        signature_tone=status.tone,
        snapshot=snapshot or current.snapshot,
        snapshot_note=snapshot_note,
        generated=generated,
        tool_version=tool_version,
        verdict_line=f"{line}. Matrix: {cell_line}.",
        counts=counts,
    )


def _matrix_header(
    project: Project,
    snapshot: str | None,
    cell_line: str,
    verdicts: Mapping[str, int],
    generated: str,
    tool_version: str,
) -> Header:
    # A matrix-only report: no decisions, so the counts are the cells' verdicts.
    return Header(
        model=project.model,
        release="no manifest yet",
        manifest_text="no manifest yet: no decisions, measurements only",
        has_manifest=False,
        signature_text="no manifest to sign",
        signature_tone="muted",
        snapshot=snapshot or "not given",
        snapshot_note="",
        generated=generated,
        tool_version=tool_version,
        verdict_line=f"No manifest yet. Matrix: {cell_line}.",
        counts=tuple(verdicts.items()),
    )


def _side_text(side: ChangeSide | None) -> str:
    if side is None:
        return "absent"
    if side.decision == "hold":
        return "hold"
    return f"{side.decision} {side.artifact_name} ({short_digest(side.artifact_digest)})"


def _diff(
    previous: ManifestSigned, current: ManifestSigned, anchors: Mapping[str, str]
) -> DiffView:
    changes = diff_manifests(
        Manifest(signed=previous, signatures=[]), Manifest(signed=current, signatures=[])
    )
    rows = tuple(
        DiffRow(
            host_class=ch.host_class,
            anchor=anchors.get(ch.host_class),
            change=ch.change,
            before=_side_text(ch.before),
            after=_side_text(ch.after),
            fields=", ".join(ch.fields),
            summary=ch.summary,
            reasons=_reasons(ch.reasons, DECISION_REASON_CODES),
        )
        for ch in changes
    )
    return DiffView(
        previous_text=f"{previous.release} version {previous.version} ({previous.created})",
        current_text=f"{current.release} version {current.version} ({current.created})",
        rows=rows,
    )


def _signed(doc: Manifest | ManifestSigned | None) -> ManifestSigned | None:
    if doc is None:
        return None
    return doc.signed if isinstance(doc, Manifest) else doc


# -- the page as a whole -----------------------------------------------------------------------


def _columns(project: Project, cells: Sequence[Cell]) -> list[ArtifactColumn]:
    # The project's artifacts in file order (baseline first), then any other artifact the
    # matrix measured, baselines first and by name.
    columns = [
        ArtifactColumn(
            name=project.artifacts.baseline.label,
            role="baseline",
            precision=project.artifacts.baseline.precision,
            in_project=True,
        ),
        *(
            ArtifactColumn(name=c.label, role="candidate", precision=c.precision, in_project=True)
            for c in project.artifacts.candidates
        ),
    ]
    known = {col.name for col in columns}
    for cell in sorted(cells, key=lambda c: (c.role != "baseline", c.artifact_name)):
        if cell.artifact_name not in known:
            known.add(cell.artifact_name)
            columns.append(
                ArtifactColumn(
                    name=cell.artifact_name,
                    role=cell.role,
                    precision=cell.precision,
                    in_project=False,
                )
            )
    return columns


def _classes(
    project: Project,
    current: ManifestSigned | None,
    cells: Sequence[Cell],
    columns: Sequence[ArtifactColumn],
    runs: Mapping[str, RunRecord],
    samples: Callable[[str, str], Samples],
    judge: Judge,
) -> tuple[list[ClassView], list[HeatRow], int]:
    """Each class's section and heat-map row, in page order, and how many cells no class has.

    The project's classes come first in file order, then classes only the manifest names, by
    name; a class's cells are those measured on its exact key.
    """
    entries = current.entries if current else {}
    by_key: dict[tuple[str, str, str], list[Cell]] = {}
    for cell in cells:
        by_key.setdefault(cell.key.as_tuple(), []).append(cell)
    names: list[tuple[str, HostClass | None]] = list(project.host_classes.items())
    names += [(n, None) for n in sorted(set(entries) - set(project.host_classes))]
    used_keys: set[tuple[str, str, str]] = set()
    views: list[ClassView] = []
    heat: list[HeatRow] = []
    for index, (name, cls) in enumerate(names, start=1):
        entry = entries.get(name)
        key = cls.key if cls else (entry.key if entry else None)
        class_cells = by_key.get(key.as_tuple(), []) if key else []
        if key:
            used_keys.add(key.as_tuple())
        view, row = _class_view(
            index, name, cls, class_cells, columns, entry, current is not None, runs, samples, judge
        )
        views.append(view)
        heat.append(row)
    orphans = sum(len(v) for k, v in by_key.items() if k not in used_keys)
    return views, heat, orphans


def _notes(orphans: int, columns: Sequence[ArtifactColumn]) -> tuple[str, ...]:
    # What the page leaves out or adds beyond the project file.
    notes: list[str] = []
    if orphans:
        notes.append(
            f"{plural(orphans, 'cell was', 'cells were')} measured on keys that no class of the "
            "project file has; they are not shown."
        )
    extra = [c.name for c in columns if not c.in_project]
    if extra:
        notes.append(f"Artifacts measured but not in the project file: {', '.join(extra)}.")
    return tuple(notes)


def _glossary(views: Sequence[ClassView], diff: DiffView | None) -> tuple[tuple[str, str], ...]:
    # Every reason code on the page with its meaning, sorted; codes without one are left out.
    used: dict[str, str] = {}
    for v in views:
        for r in v.reasons:
            used[r.code] = r.meaning
        for _, _, cell_reasons, _ in v.cell_reasons:
            for r in cell_reasons:
                used[r.code] = r.meaning
    if diff is not None:
        for d in diff.rows:
            for r in d.reasons:
                used[r.code] = r.meaning
    return tuple(sorted((code, meaning) for code, meaning in used.items() if meaning))


# -- entry point -------------------------------------------------------------------------------


def build_report(
    project: Project,
    cells: Sequence[Cell],
    runs: Mapping[str, RunRecord],
    samples: SamplesSource | None,
    *,
    now: datetime,
    tool_version: str,
    snapshot: str | None = None,
    manifest: Manifest | ManifestSigned | None = None,
    signature_status: SignatureStatus | str | None = None,
    previous: Manifest | ManifestSigned | None = None,
    rollouts: Sequence[Mapping[str, Any]] = (),
    tunes: Sequence[TuneRecord] = (),
    lineage: Mapping[str, Lineage] | None = None,
    steering: Mapping[str, Mapping[str, Any]] | None = None,
    digests: Mapping[str, str] | None = None,
) -> ReportView:
    """Build the report's view model. Pure: no I/O, no clock.

    Args:
        project: The project file; its classes (in file order), artifacts and budgets.
        cells: The cells decisions rest on (``Store.decision_cells()``; the latest cells,
            ``Store.latest_cells()``, are enough where no class's settings went back); cells
            whose key no class of the project has are counted in a note and otherwise left out
            (unless the manifest names their class).
        runs: Run records by run id (emulation, fingerprint, rollback check).
        samples: Raw latencies per cell, ``(run_id, digest) -> {LatencyConfig: ns}``
            (``Store.samples_by_config``) or a mapping with those keys; None draws no charts.
        now: When the report is made (shown in the header).
        tool_version: The qualify version that made it.
        snapshot: The matrix snapshot id (``Store.snapshot_id()``); None if unknown.
        manifest: The current manifest (or its signed part); None for a matrix-only report.
        signature_status: How the caller's verification of ``manifest`` went:
            ``SignatureStatus`` or its text (``verified``, ``unsigned``, ``invalid: <why>``).
        previous: The manifest before ``manifest``; adds the manifest-diff section.
        rollouts: The matrix's rollout log (``Store.rollout_log()``); adds the rollout history.
        tunes: The matrix's tunes (``Store.tunes()``); adds each class's latest tuning trials.
        lineage: How made candidates were derived (``Store.lineage()``); adds the lineage table.
        steering: The classes a person steers now (``matrix.publications.steering``): class ->
            the hold, pin or abort row of the rollout log; listed above the rollout history.
        digests: Artifact label -> the digest of its file now (``qualify.release.current.file_digests``):
            a project artifact's column shows the cell of those bytes, every verdict is the
            cell's under the project now (``manifest.verdict``). Labels missing here take the
            digest the cells last measured under that name.

    Returns:
        The page's view model.

    Raises:
        ValueError: ``signature_status`` text is not one of the three forms.
    """
    reader = samples_reader(samples)
    current = _signed(manifest)
    before = _signed(previous)
    status = (
        SignatureStatus.parse(signature_status)
        if isinstance(signature_status, str)
        else signature_status
    )
    columns = _columns(project, cells)
    judge = Judge(project, {**artifact_digests(project, cells), **(digests or {})})
    views, heat, orphans = _classes(project, current, cells, columns, runs, reader, judge)
    cell_line, verdicts = _matrix_line(views, heat)
    generated = utc_minute(now)
    if current is not None:
        status = status or SignatureStatus("unsigned", "no signature status given")
        header = _manifest_header(
            project, current, status, snapshot, cell_line, generated, tool_version
        )
    else:
        header = _matrix_header(project, snapshot, cell_line, verdicts, generated, tool_version)
    anchors = {v.name: v.anchor for v in views}
    diff = _diff(before, current, anchors) if before is not None and current is not None else None
    return ReportView(
        glossary=_glossary(views, diff),
        header=header,
        artifacts=tuple(columns),
        heatmap=tuple(heat),
        classes=tuple(views),
        diff=diff,
        notes=_notes(orphans, columns),
        rollouts=tuple(_rollout_row(r) for r in rollouts),
        steered=tuple(_steered_row(n, r) for n, r in sorted((steering or {}).items())),
        tunings=tuning_views(project, tunes),
        lineage=lineage_rows(lineage or {}),
    )


_ROLLOUT_TONES: dict[str, Tone] = {"complete": "ok", "abort": "bad", "halt": "warn"}


def _when(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M UTC") if isinstance(value, datetime) else str(value)


def _steered_row(name: str, row: Mapping[str, Any]) -> SteeredRow:
    action = str(row["action"])
    what = {
        "hold": "held",
        "pin": f"pinned to {row['artifact']}",
        "abort": f"rollout {row['rollout_id']} aborted: on its rollback",
    }.get(action, action)
    return SteeredRow(
        host_class=name,
        what=what,
        since=_when(row["acted_at"]),
        version=int(row["version"]),
        actor=str(row["actor"]),
        why=str(row["why"] or ""),
    )


def _rollout_row(row: Mapping[str, Any]) -> RolloutRow:
    when = row["acted_at"]
    return RolloutRow(
        when=when.strftime("%Y-%m-%d %H:%M UTC") if isinstance(when, datetime) else str(when),
        host_class=str(row["host_class"]),
        rollout=str(row["rollout_id"]),
        action=str(row["action"]),
        version=int(row["version"]),
        percent=int(row["percent"]),
        artifact=str(row["artifact"]),
        actor=str(row["actor"]),
        why=str(row["why"] or ""),
        tone=_ROLLOUT_TONES.get(str(row["action"]), ""),
    )
