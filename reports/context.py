"""The report's view models and the pure function that builds them from the matrix.

Owns turning schema objects (the project, the latest cells, run records, raw latency samples and
optionally the current and previous manifests) into frozen, display-ready view models: every
number formatted with its unit, every missing measurement said as "not measured", every class
and artifact placed in the heat map, and each latency distribution downsampled for its chart.

Does not own I/O (the CLI reads the matrix, verifies the signature and passes the results in),
the clock (``now`` is a parameter), the decision (the manifest's entries are displayed, never
recomputed) or HTML (``reports.render`` and the templates). Nothing here invents a number: a
value absent from the inputs is shown as absent.

Charts: each class gets one percentile plot of its artifacts' gate latency configs, the
inverse CDF drawn on a "nines" axis (x = -log10(1 - q), so 90 %, 99 % and 99.9 % are equally
spaced and the tail is readable). The grid is shared by the class's series, so a chart is a few
hundred numbers of JSON; quantiles beyond what a series' sample count supports are null.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from manifest.build import diff_manifests
from manifest.gates import GateOutcome, assess
from schemas.cell import (
    REASON_CODES,
    Cell,
    LatencyResult,
    OutputParity,
    RunRecord,
    recency,
)
from schemas.manifest import (
    DECISION_REASON_CODES,
    ChangeSide,
    Manifest,
    ManifestEntry,
    ManifestSigned,
)
from schemas.project import HostClass, OutputTolerance, Project
from schemas.rules import fallback_count, order_rank

__all__ = [
    "CHART_POINTS",
    "ArtifactColumn",
    "ChartView",
    "ClassView",
    "CompareRow",
    "DiffRow",
    "DiffView",
    "Header",
    "HeatCell",
    "HeatRow",
    "ParityRow",
    "ReasonView",
    "ReportView",
    "RunView",
    "Samples",
    "SamplesSource",
    "SignatureStatus",
    "Tone",
    "build_report",
]

CHART_POINTS = 40
"""Points per series in a chart: a smooth curve, and small enough for 1,000 classes."""

Tone = Literal["", "ok", "bad", "warn", "muted"]
"""How a value is highlighted: nothing, good, bad, doubtful, absent."""

Samples = Mapping[tuple[int, int], npt.NDArray[np.int64]]
"""Raw latencies of one cell: ``{(batch_size, concurrency): latency_ns array}``."""

SamplesSource = Callable[[str, str], Samples] | Mapping[tuple[str, str], Samples]
"""Where raw samples come from: ``(run_id, artifact_digest) -> Samples`` (``Store.samples_by_config``)
or a mapping with those keys."""

NOT_MEASURED = "not measured"
_VERDICT_WORDS = {
    "pass": "pass",
    "fail": "fail",
    "insufficient": "insufficient",
    "error": "error",
    "missing": "not measured",
}
_DECISION_WORDS = {"candidate": "candidate", "baseline": "baseline", "hold": "hold"}


# -- small values ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SignatureStatus:
    """The manifest's signature status, as the caller verified it (this package only shows it).

    Attributes:
        state: ``verified``, ``unverified`` (signed, but no trusted key was given to check it),
            ``unsigned`` or ``invalid``.
        detail: For ``invalid``: why; for ``verified``: optionally which key.
    """

    state: Literal["verified", "unverified", "unsigned", "invalid"]
    detail: str | None = None

    @classmethod
    def parse(cls, text: str) -> SignatureStatus:
        """Read ``verified``, ``unsigned`` or ``invalid: <why>`` (also ``verified: <key>``).

        Raises:
            ValueError: the text starts with none of the three words.
        """
        word, _, rest = text.partition(":")
        word = word.strip()
        detail = rest.strip() or None
        if word == "verified":
            return cls("verified", detail)
        if word == "unsigned":
            return cls("unsigned", detail)
        if word == "unverified":
            return cls("unverified", detail)
        if word == "invalid":
            return cls("invalid", detail)
        raise ValueError(
            f"signature status {text!r}: expected 'verified', 'unsigned' or 'invalid: <why>'"
        )

    @property
    def text(self) -> str:
        """The status for people, e.g. ``signature INVALID: bad key``."""
        head = {
            "verified": "signature verified",
            "unverified": "signature NOT VERIFIED",
            "unsigned": "UNSIGNED",
            "invalid": "signature INVALID",
        }[self.state]
        return f"{head}: {self.detail}" if self.detail else head

    @property
    def tone(self) -> Tone:
        """``ok`` when verified, ``bad`` when invalid, ``warn`` when unsigned."""
        tones: dict[str, Tone] = {
            "verified": "ok",
            "unverified": "warn",
            "unsigned": "warn",
            "invalid": "bad",
        }
        return tones[self.state]


@dataclass(frozen=True)
class ReasonView:
    """A reason code with its sentence."""

    code: str
    message: str
    meaning: str


@dataclass(frozen=True)
class ArtifactColumn:
    """One artifact of the heat map: a column."""

    name: str
    role: str
    precision: str
    in_project: bool


@dataclass(frozen=True)
class HeatCell:
    """One heat-map cell: a class measured with an artifact."""

    artifact: str
    verdict: str
    verdict_text: str
    p99_text: str
    p99_tone: Tone
    parity_text: str
    parity_tone: Tone
    fallback_text: str
    emulated: bool
    stale: bool


@dataclass(frozen=True)
class HeatRow:
    """One heat-map row: a host class."""

    host_class: str
    anchor: str
    key_text: str
    decision: str
    decision_text: str
    cells: tuple[HeatCell, ...]


@dataclass(frozen=True)
class CompareRow:
    """One row of a class's side-by-side table: a measurement, one value per artifact."""

    label: str
    values: tuple[tuple[str, Tone], ...]
    parts: tuple[tuple[tuple[str, bool], ...], ...] = ()
    """When set, one list of (text, highlighted) per artifact replaces ``values``."""


@dataclass(frozen=True)
class ParityRow:
    """One check of one output of one candidate: measured, tolerance, smallest passing."""

    artifact: str
    output: str
    check: str
    measured: str
    tolerance: str
    min_passing: str
    tone: Tone


@dataclass(frozen=True)
class ChartView:
    """One latency chart: the data the page's script draws, and a text alternative.

    ``data`` is plain JSON-able data (rendered with Jinja's ``tojson``, which escapes it for a
    script element): ``nines_max``, ``points``, ``budget``, ``confidence`` and ``series`` (each
    with ``label``, ``role``, ``y`` in ms or null, ``p50``, ``p99``, ``lo``, ``hi``).
    """

    dom_id: str
    data: Mapping[str, Any]
    caption: str


@dataclass(frozen=True)
class RunView:
    """The run a class's cells came from, and the host it was measured on."""

    run_id: str
    when: str
    emulated: bool
    mismatches: tuple[str, ...]
    facts: tuple[tuple[str, str], ...]
    rollback_text: str
    rollback_tone: Tone


@dataclass(frozen=True)
class ClassView:
    """Everything the page says about one host class."""

    name: str
    anchor: str
    key_text: str
    in_project: bool
    decision: str
    decision_text: str
    summary: str
    reasons: tuple[ReasonView, ...]
    emulated: bool
    stale: bool
    budgets_text: str
    artifacts: tuple[str, ...]
    compare: tuple[CompareRow, ...]
    cell_reasons: tuple[tuple[str, str, tuple[ReasonView, ...], str | None], ...]
    """Per artifact with reasons or an error: (artifact, verdict, reasons, error detail)."""
    chart: ChartView | None
    chart_note: str
    parity: tuple[ParityRow, ...]
    warnings: tuple[tuple[str, str], ...]
    rollback_text: str
    rollback_tone: Tone
    runs: tuple[RunView, ...]


@dataclass(frozen=True)
class DiffRow:
    """What changes for one class from the previous manifest to this one."""

    host_class: str
    anchor: str | None
    change: str
    before: str
    after: str
    fields: str
    summary: str
    reasons: tuple[ReasonView, ...]


@dataclass(frozen=True)
class DiffView:
    """The manifest diff section."""

    previous_text: str
    current_text: str
    rows: tuple[DiffRow, ...]


@dataclass(frozen=True)
class Header:
    """The top of the page."""

    model: str
    release: str
    manifest_text: str
    has_manifest: bool
    signature_text: str
    signature_tone: Tone
    snapshot: str
    snapshot_note: str
    generated: str
    tool_version: str
    verdict_line: str
    counts: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class ReportView:
    """The whole page, ready for the templates."""

    header: Header
    artifacts: tuple[ArtifactColumn, ...]
    heatmap: tuple[HeatRow, ...]
    classes: tuple[ClassView, ...]
    diff: DiffView | None
    notes: tuple[str, ...]
    glossary: tuple[tuple[str, str], ...]
    """Every reason code on the page with its meaning, sorted."""


# -- formatting --------------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return NOT_MEASURED
    if value < 1:
        return f"{value:.3f} ms"
    if value < 10:
        return f"{value:.2f} ms"
    if value < 1000:
        return f"{value:.1f} ms"
    return f"{value:,.0f} ms"


def _bare(value: float | None) -> str:
    # A duration in ms without the unit, where the unit follows once for several numbers.
    return _ms(value).removesuffix(" ms")


def _mb(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return NOT_MEASURED
    return f"{value:.1f} MB" if value < 10 else f"{value:,.0f} MB"


def _num(value: float | None) -> str:
    if value is None:
        return NOT_MEASURED
    if value == 0:
        return "0"
    if abs(value) >= 1e-3 and abs(value) < 1e4:
        return f"{value:.4g}"
    return f"{value:.3e}"


def _tol(value: float | None) -> str:
    return "not checked" if value is None else _num(value)


def _when(moment: datetime) -> str:
    aware = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return aware.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def _plural(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


def _short(digest: str | None) -> str:
    if digest is None:
        return "none"
    return digest[:19] if digest.startswith("sha256:") else digest[:12]


def _reasons(items: Iterable[Any], codes: Mapping[str, str]) -> tuple[ReasonView, ...]:
    return tuple(
        ReasonView(code=r.code, message=r.message, meaning=codes.get(r.code, "")) for r in items
    )


# -- samples -----------------------------------------------------------------------------------


def _samples_reader(source: SamplesSource | None) -> Callable[[str, str], Samples]:
    if source is None:
        return lambda run_id, digest: {}
    if callable(source):
        return source
    mapping = source
    return lambda run_id, digest: mapping.get((run_id, digest), {})


def _sig(value: float) -> float:
    # Three significant digits: a chart cannot show more; the tables carry the exact numbers.
    return float(f"{value:.3g}")


def _series(
    label: str,
    role: str,
    gate: LatencyResult,
    latencies_ns: npt.NDArray[np.int64] | None,
    grid: npt.NDArray[np.float64],
) -> dict[str, Any]:
    y: list[float | None] = []
    if latencies_ns is not None and latencies_ns.size:
        ms = np.sort(latencies_ns.astype(np.float64)) / 1e6
        n = ms.size
        q = 1.0 - np.power(10.0, -grid)
        supported = grid <= math.log10(n) + 1e-9
        # The order statistic every quantile of qualify is (schemas.rules.order_rank).
        index = np.array([order_rank(n, float(level)) - 1 for level in q], dtype=np.int64)
        values = ms[index]
        y = [_sig(float(v)) if ok else None for v, ok in zip(values, supported, strict=True)]
    return {
        "label": label,
        "role": role,
        "y": y,
        "p50": _sig(gate.p50_ms),
        "p99": _sig(gate.p99_ms),
        "lo": None if gate.p99_lower_ms is None else _sig(gate.p99_lower_ms),
        "hi": None if gate.p99_upper_ms is None else _sig(gate.p99_upper_ms),
    }


def _chart(
    index: int,
    cells: Sequence[Cell],
    budget_ms: float | None,
    samples: Callable[[str, str], Samples],
) -> tuple[ChartView | None, str]:
    gated = [(cell, cell.gate_latency) for cell in cells]
    with_latency = [(cell, gate) for cell, gate in gated if gate is not None]
    if not with_latency:
        return None, "No latency was measured on this class, so there is no distribution to draw."
    raw: list[npt.NDArray[np.int64] | None] = []
    for cell, gate in with_latency:
        by_config = samples(cell.run_id, cell.artifact_digest)
        raw.append(by_config.get((gate.batch_size, gate.concurrency)))
    counts = [r.size for r in raw if r is not None and r.size]
    missing = [
        cell.artifact_name
        for (cell, _), r in zip(with_latency, raw, strict=True)
        if r is None or not r.size
    ]
    if not counts:
        return None, (
            "Raw latency samples are not in the matrix for this class; the numbers in the "
            "table are the stored percentiles."
        )
    nines_max = round(math.log10(max(counts)), 4)
    grid = np.linspace(0.0, nines_max, CHART_POINTS)
    series = []
    for (cell, gate), latencies in zip(with_latency, raw, strict=True):
        label = f"{cell.artifact_name} (b{gate.batch_size} c{gate.concurrency})"
        series.append(_series(label, cell.role, gate, latencies, grid))
    data = {
        "nines_max": nines_max,
        "points": CHART_POINTS,
        "budget": budget_ms,
        "series": series,
    }
    caption = "Latency percentile chart: " + ", ".join(c.artifact_name for c, _ in with_latency)
    note = (
        f"Raw samples missing for {', '.join(missing)}: drawn from the others only."
        if missing
        else ""
    )
    return ChartView(dom_id=f"chart-{index}", data=data, caption=caption), note


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


_TONE_OF: dict[GateOutcome, Tone] = {"pass": "ok", "fail": "bad", "undecided": "warn", "off": ""}
"""How a gate's finding colours the quantity it judged."""


def _gate_tones(cell: Cell, cls: HostClass | None) -> dict[str, Tone]:
    """Gate name -> the tone of its finding on this cell (`manifest.gates`, the rules the runner
    and the policy apply); empty without a class to judge against."""
    if cls is None:
        return {}
    return {gate.name: _TONE_OF[finding.outcome] for gate, finding in assess(cell, cls)}


def _p99_text(cell: Cell, budget: float | None, tone: Tone) -> tuple[str, Tone]:
    gate = cell.gate_latency
    if gate is None:
        return "p99 " + NOT_MEASURED, "muted"
    of = f" of {_ms(budget)}" if budget is not None else ""
    if gate.p99_upper_ms is None:
        return f"p99 {_ms(gate.p99_ms)}, no bound{of}", "warn"
    return f"p99 ≤ {_ms(gate.p99_upper_ms)}{of}", tone


def _parity_text(cell: Cell) -> tuple[str, Tone]:
    if cell.role == "baseline":
        return "reference", "muted"
    if cell.parity is None:
        return "parity " + NOT_MEASURED, "muted"
    return ("parity pass", "") if cell.parity.passed else ("parity fail", "")


def _heat_cell(
    name: str, cell: Cell | None, cls: HostClass | None, stale: bool, emulated: bool
) -> HeatCell:
    if cell is None:
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
    tones = _gate_tones(cell, cls)
    p99, p99_tone = _p99_text(cell, cls.budgets.p99_ms if cls else None, tones.get("p99", ""))
    parity, parity_tone = _with_tone(_parity_text(cell), tones.get("parity"))
    return HeatCell(
        artifact=name,
        verdict=cell.verdict,
        verdict_text=_VERDICT_WORDS[cell.verdict],
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
        stale=stale,
    )


def _with_tone(shown: tuple[str, Tone], tone: Tone | None) -> tuple[str, Tone]:
    """A measured value's text in its gate's tone; what was not measured stays muted."""
    text, own = shown
    return (text, own) if tone is None or own == "muted" else (text, tone)


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
            f"{_ep(p)} {n}"
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


def _ep(provider: str) -> str:
    return provider.removesuffix("ExecutionProvider") or provider


def _fallback_text(cell: Cell, cls: HostClass | None) -> tuple[str, Tone]:
    placement = cell.placement
    if placement is None:
        return NOT_MEASURED, "muted"
    expected = cls.provider.expected if cls is not None else placement.expected_provider
    fallback = fallback_count(placement.nodes_per_provider, expected)
    if placement.nodes_per_provider.get(expected, 0) == 0:
        return f"{fallback} of {placement.total_nodes} nodes; {_ep(expected)} ran none", ""
    allowed = cls.provider.fallback_allowance if cls is not None else 0
    suffix = f" (allowed {allowed})" if allowed else ""
    return f"{fallback} of {placement.total_nodes} nodes{suffix}", ""


def _compare(
    cells: Sequence[Cell | None], cls: HostClass | None, runs: Mapping[str, RunRecord]
) -> tuple[CompareRow, ...]:
    budgets = cls.budgets if cls else None
    settings = cls.settings_digest() if cls is not None else None  # a JSON dump + hash: once

    tones = [None if cell is None else _gate_tones(cell, cls) for cell in cells]

    def row(
        label: str, fn: Callable[[Cell], tuple[str, Tone]], gate: str | None = None
    ) -> CompareRow:
        # A row a gate judges takes that gate's tone: one rule, as the runner and policy apply it.
        return CompareRow(
            label=label,
            values=tuple(
                (NOT_MEASURED, "muted")
                if cell is None or tone is None
                else _with_tone(fn(cell), tone.get(gate) if gate else None)
                for cell, tone in zip(cells, tones, strict=True)
            ),
        )

    def gate_value(attr: str) -> Callable[[Cell], tuple[str, Tone]]:
        def get(cell: Cell) -> tuple[str, Tone]:
            gate = cell.gate_latency
            if gate is None:
                return NOT_MEASURED, "muted"
            return _ms(getattr(gate, attr)), ""

        return get

    def bound(cell: Cell) -> tuple[str, Tone]:
        gate = cell.gate_latency
        if gate is None:
            return NOT_MEASURED, "muted"
        if gate.p99_upper_ms is None or gate.p99_lower_ms is None:
            return f"none: {gate.samples} samples too few", "warn"
        return (
            f"{_bare(gate.p99_lower_ms)} to {_ms(gate.p99_upper_ms)} ({gate.confidence:.0%})",
            "",
        )

    def judged(cell: Cell) -> tuple[str, Tone]:
        if cls is None:
            return "no class to judge against", "muted"
        if cell.error is not None:
            return "not judged: it could not run", "muted"
        findings = assess(cell, cls)
        failed = [g.name for g, f in findings if f.outcome == "fail"]
        undecided = [g.name for g, f in findings if f.outcome == "undecided"]
        if not failed and not undecided:
            return "every configured gate held", "ok"
        parts = ([f"failed: {', '.join(failed)}"] if failed else []) + (
            [f"undecided: {', '.join(undecided)}"] if undecided else []
        )
        return "; ".join(parts), "bad" if failed else "warn"

    def config(cell: Cell) -> tuple[str, Tone]:
        gate = cell.gate_latency
        if gate is None:
            return NOT_MEASURED, "muted"
        tput = f", {gate.throughput_ips:,.0f}/s" if gate.throughput_ips is not None else ""
        return (
            f"batch {gate.batch_size}, conc. {gate.concurrency}, n={gate.samples:,}{tput}",
            "",
        )

    def flags(cell: Cell) -> tuple[str, Tone]:
        marks = []
        if _emulated(cell, runs):
            marks.append("emulated")
        if cell.isa_mismatch:
            marks.append("numerics from another ISA (" + "; ".join(cell.isa_mismatch) + ")")
        if settings is not None and cell.settings_digest != settings:
            marks.append("stale")
        return (", ".join(marks), "warn") if marks else ("current", "")

    flagged = any(flags(c)[0] != "current" for c in cells if c is not None)
    return (
        row("verdict", lambda c: (_VERDICT_WORDS[c.verdict], _verdict_tone(c.verdict))),
        *([row("measured", flags)] if flagged else []),
        row("gate config", config),
        row("p50", gate_value("p50_ms")),
        row("p99", gate_value("p99_ms")),
        row("gates", judged),
        row("p99 bound", bound, "p99"),
        row("parity", _parity_text, "parity"),
        CompareRow(
            label="nodes per provider",
            values=tuple((NOT_MEASURED, "muted") for _ in cells),
            parts=tuple(_placement_parts(cell) for cell in cells),
        ),
        row("fallback", lambda c: _fallback_text(c, cls), "placement"),
        row(
            "cold init",
            lambda c: _against(c.cold_init_ms, budgets.cold_init_ms if budgets else None, _ms),
            "cold init",
        ),
        row(
            "warm init",
            lambda c: (_ms(c.warm_init_ms), "" if c.warm_init_ms is not None else "muted"),
        ),
        row(
            "peak memory",
            lambda c: _measured_by(
                _against(c.peak_rss_mb, budgets.peak_rss_mb if budgets else None, _mb),
                c.peak_rss_source,
            ),
            "memory",
        ),
        row("digest", lambda c: (_short(c.artifact_digest), "")),
        row("other configs", _other_configs),
    )


def _other_configs(cell: Cell) -> tuple[str, Tone]:
    # Latency configs other than the gate's, one short clause each (the gate has its own rows).
    gate = cell.gate_latency
    others = [r for r in cell.latency if r is not gate]
    if not others:
        return "none", "muted"
    return "; ".join(
        f"b{r.batch_size} c{r.concurrency}: p50 {_bare(r.p50_ms)}, p99 {_bare(r.p99_ms)} "
        f"(≤ {_bare(r.p99_upper_ms) if r.p99_upper_ms is not None else '?'}) ms, n={r.samples:,}, "
        f"{r.decision}"
        for r in others
    ), ""


def _verdict_tone(verdict: str) -> Tone:
    return {"pass": "ok", "fail": "bad", "insufficient": "warn", "error": "bad"}.get(
        verdict, "muted"
    )  # type: ignore[return-value]


_PARITY_CHECKS: tuple[tuple[str, str, str], ...] = (
    # (check, measured attribute, tolerance attribute)
    ("max |a-b|", "max_abs", "max_abs"),
    ("mean |a-b|", "mean_abs", "mean_abs"),
    ("max relative", "max_rel", "max_rel"),
    ("min cosine", "cosine_min", "cosine_min"),
    ("top-1 agreement", "top1_agreement", "top1_agreement_min"),
)


def _parity_rows(cell: Cell) -> list[ParityRow]:
    if cell.parity is None:
        return []
    rows = []
    for out in cell.parity.outputs:
        rows.extend(_output_rows(cell.artifact_name, out))
    return rows


def _output_rows(artifact: str, out: OutputParity) -> list[ParityRow]:
    rows = []
    unchecked = []
    tol: OutputTolerance = out.tolerance
    for check, measured_attr, tol_attr in _PARITY_CHECKS:
        measured = getattr(out, measured_attr)
        limit = getattr(tol, tol_attr)
        smallest = getattr(out.min_passing, tol_attr)
        if limit is None:
            if measured is not None:
                unchecked.append(f"{check} {_num(measured)}")
            continue
        failed = any(f.startswith(tol_attr) or f.startswith(measured_attr) for f in out.failures)
        rows.append(
            ParityRow(
                artifact=artifact,
                output=out.name,
                check=check,
                measured=_num(measured),
                tolerance=_tol(limit),
                min_passing=_num(smallest) if smallest is not None else "none",
                tone="bad" if failed else "ok",
            )
        )
    if not out.passed and not any(r.tone == "bad" for r in rows):
        rows.append(
            ParityRow(
                artifact=artifact,
                output=out.name,
                check="failures",
                measured="; ".join(out.failures) or "failed",
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
    return rows


def _warnings(cells: Sequence[Cell]) -> tuple[tuple[str, str], ...]:
    return tuple(
        (cell.artifact_name, warning)
        for cell in cells
        if cell.placement is not None
        for warning in cell.placement.warnings
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
        rb_text = f"rollback artifact {_short(run.rollback.artifact_digest)} loaded and ran"
        rb_tone = "ok"
    else:
        rb_text = (
            f"rollback artifact {_short(run.rollback.artifact_digest)} did NOT load: "
            f"{run.rollback.error or 'no detail'}"
        )
        rb_tone = "bad"
    return RunView(
        run_id=run.run_id,
        when=f"{_when(run.started_at)} to {_when(run.finished_at)}",
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
    package = f"{rb.name} ({_short(rb.digest)}, {rb.uri})"
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
) -> tuple[ClassView, HeatRow]:
    anchor = f"class-{index}"
    key = cls.key if cls else (entry.key if entry else None)
    key_text = " · ".join(key.as_tuple()) if key else ""
    latest = _latest_by_artifact(cells)
    ordered = [latest.get(col.name) for col in columns]
    present = [c for c in ordered if c is not None]
    settings = cls.settings_digest() if cls else None
    stale = {
        c.artifact_name: settings is not None and c.settings_digest != settings for c in present
    }
    emulated = {c.artifact_name: _emulated(c, runs) for c in present}
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
                cell,
                cls,
                stale.get(col.name, False),
                emulated.get(col.name, False),
            )
            for col, cell in zip(columns, ordered, strict=True)
        ),
    )
    shown = [col.name for col, cell in zip(columns, ordered, strict=True) if cell is not None]
    shown_cells = present
    chart, chart_note = _chart(index, shown_cells, budget, samples)
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
    budgets_text = ""
    if cls is not None:
        b = cls.budgets
        parts = [f"p99 {_ms(b.p99_ms)}"]
        parts.append(f"peak memory {_mb(b.peak_rss_mb)}" if b.peak_rss_mb else "no memory budget")
        parts.append(
            f"cold init {_ms(b.cold_init_ms)}" if b.cold_init_ms else "no cold-init budget"
        )
        parts.append(
            f"expected provider {_ep(cls.provider.expected)}, "
            f"{_plural(cls.provider.fallback_allowance, 'fallback node', 'fallback nodes')} allowed"
        )
        budgets_text = " · ".join(parts)
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
        stale=any(stale.values()),
        budgets_text=budgets_text,
        artifacts=tuple(shown),
        compare=_compare(shown_cells, cls, runs) if shown_cells else (),
        cell_reasons=tuple(
            (c.artifact_name, c.verdict, _reasons(c.reasons, REASON_CODES), c.error)
            for c in shown_cells
            if c.reasons or c.error
        ),
        chart=chart,
        chart_note=chart_note,
        parity=tuple(row for c in shown_cells for row in _parity_rows(c)),
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
        parts.append(f"{_plural(n, 'class gets', 'classes get')} the candidate")
    if counts["baseline"]:
        n = counts["baseline"]
        parts.append(f"{_plural(n, 'class keeps', 'classes keep')} the baseline")
    if counts["hold"]:
        parts.append(f"{counts['hold']} held")
    line = ", ".join(parts) if parts else "the manifest has no classes"
    return line, tuple((k, v) for k, v in counts.items())


def _side_text(side: ChangeSide | None) -> str:
    if side is None:
        return "absent"
    if side.decision == "hold":
        return "hold"
    return f"{side.decision} {side.artifact_name} ({_short(side.artifact_digest)})"


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
) -> ReportView:
    """Build the report's view model. Pure: no I/O, no clock.

    Args:
        project: The project file; its classes (in file order), artifacts and budgets.
        cells: The latest cells of the matrix (``Store.latest_cells()``); cells whose key no
            class of the project has are counted in a note and otherwise left out (unless the
            manifest names their class).
        runs: Run records by run id (emulation, fingerprint, rollback check).
        samples: Raw latencies per cell, ``(run_id, digest) -> {(batch, concurrency): ns}``
            (``Store.samples_by_config``) or a mapping with those keys; None draws no charts.
        now: When the report is made (shown in the header).
        tool_version: The qualify version that made it.
        snapshot: The matrix snapshot id (``Store.snapshot_id()``); None if unknown.
        manifest: The current manifest (or its signed part); None for a matrix-only report.
        signature_status: How the caller's verification of ``manifest`` went:
            ``SignatureStatus`` or its text (``verified``, ``unsigned``, ``invalid: <why>``).
        previous: The manifest before ``manifest``; adds the manifest-diff section.

    Returns:
        The page's view model.

    Raises:
        ValueError: ``signature_status`` text is not one of the three forms.
    """
    reader = _samples_reader(samples)
    current = _signed(manifest)
    before = _signed(previous)
    entries = current.entries if current else {}
    status = (
        SignatureStatus.parse(signature_status)
        if isinstance(signature_status, str)
        else signature_status
    )

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
            index, name, cls, class_cells, columns, entry, current is not None, runs, reader
        )
        views.append(view)
        heat.append(row)

    notes: list[str] = []
    orphans = sum(len(v) for k, v in by_key.items() if k not in used_keys)
    if orphans:
        notes.append(
            f"{_plural(orphans, 'cell was', 'cells were')} measured on keys that no class of the "
            "project file has; they are not shown."
        )
    extra = [c.name for c in columns if not c.in_project]
    if extra:
        notes.append(f"Artifacts measured but not in the project file: {', '.join(extra)}.")

    verdicts = {"pass": 0, "fail": 0, "insufficient": 0, "error": 0}
    for row in heat:
        for hc in row.cells:
            if hc.verdict in verdicts:
                verdicts[hc.verdict] += 1
    unmeasured = sum(1 for v in views if not v.artifacts)
    cell_line = ", ".join(f"{n} {v}" for v, n in verdicts.items()) + " cells"
    if unmeasured:
        cell_line += f"; {_plural(unmeasured, 'class has', 'classes have')} no measurement"

    if current is not None:
        line, counts = _decision_line(entries)
        status = status or SignatureStatus("unsigned", "no signature status given")
        snapshot_note = ""
        if snapshot is not None and snapshot != current.snapshot:
            snapshot_note = (
                f"The manifest was built from matrix snapshot {_short(current.snapshot)}; the "
                "matrix has changed since, so some measurements below were not decided on."
            )
        header = Header(
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
            generated=_when(now),
            tool_version=tool_version,
            verdict_line=f"{line}. Matrix: {cell_line}.",
            counts=counts,
        )
    else:
        header = Header(
            model=project.model,
            release="no manifest yet",
            manifest_text="no manifest yet: no decisions, measurements only",
            has_manifest=False,
            signature_text="no manifest to sign",
            signature_tone="muted",
            snapshot=snapshot or "not given",
            snapshot_note="",
            generated=_when(now),
            tool_version=tool_version,
            verdict_line=f"No manifest yet. Matrix: {cell_line}.",
            counts=tuple(verdicts.items()),
        )

    anchors = {v.name: v.anchor for v in views}
    diff = _diff(before, current, anchors) if before is not None and current is not None else None
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
    return ReportView(
        glossary=tuple(sorted((code, meaning) for code, meaning in used.items() if meaning)),
        header=header,
        artifacts=tuple(columns),
        heatmap=tuple(heat),
        classes=tuple(views),
        diff=diff,
        notes=tuple(notes),
    )
