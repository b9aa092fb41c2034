"""The report's view model: the frozen, display-ready shapes the templates read.

Every field is already text (or a tone, a flag, chart data): a template only places what it is
given. Building them is the sections' work (``reports.sections``, ``reports.rows``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "ArtifactColumn",
    "ChartView",
    "ClassView",
    "CompareRow",
    "DiffRow",
    "DiffView",
    "Header",
    "HeatCell",
    "HeatRow",
    "LineageRow",
    "MatrixView",
    "ParityRow",
    "ReasonView",
    "ReleaseRow",
    "ReportView",
    "RolloutRow",
    "RolloutsView",
    "RunView",
    "SectionView",
    "SignatureStatus",
    "SteeredRow",
    "Tone",
    "TrialRow",
    "TuningView",
]

Tone = Literal["", "ok", "bad", "warn", "muted"]
"""How a value is highlighted: nothing, good, bad, doubtful, absent."""


SignatureState = Literal["verified", "unverified", "unsigned", "expired", "invalid"]
_STATES: dict[str, SignatureState] = {
    "verified": "verified",
    "unverified": "unverified",
    "unsigned": "unsigned",
    "expired": "expired",
    "invalid": "invalid",
}
_SIGNATURE_WORDS: dict[SignatureState, tuple[str, Tone]] = {
    "verified": ("signature verified", "ok"),
    "unverified": ("signature NOT VERIFIED", "warn"),
    "unsigned": ("UNSIGNED", "warn"),
    "expired": ("signature valid; manifest expired", "warn"),
    "invalid": ("signature INVALID", "bad"),
}


@dataclass(frozen=True)
class SignatureStatus:
    """The manifest's signature status, as the caller verified it (this package only shows it).

    Attributes:
        state: ``verified``, ``unverified`` (signed, but no trusted key was given to check it),
            ``unsigned``, ``expired`` (the signature verifies; the document is past its
            ``expires``) or ``invalid``.
        detail: For ``invalid``: why; for ``expired``: when; for ``verified``: which key.
    """

    state: SignatureState
    detail: str | None = None

    @classmethod
    def parse(cls, text: str) -> SignatureStatus:
        """Read ``verified``, ``unverified``, ``unsigned``, ``expired: <when>`` or
        ``invalid: <why>`` (also ``verified: <key>``).

        Raises:
            ValueError: the text starts with none of these words.
        """
        word, _, rest = text.partition(":")
        word = word.strip()
        detail = rest.strip() or None
        if word in _STATES:
            return cls(_STATES[word], detail)
        raise ValueError(
            f"signature status {text!r}: expected 'verified', 'unverified', 'unsigned', "
            "'expired: <when>' or 'invalid: <why>'"
        )

    @property
    def text(self) -> str:
        """The status for people, e.g. ``signature INVALID: bad key`` or ``signature valid;
        manifest expired on 2025-07-01T12:00:00Z``."""
        head = _SIGNATURE_WORDS[self.state][0]
        if self.state == "expired":
            return f"{head} on {self.detail}" if self.detail else head
        return f"{head}: {self.detail}" if self.detail else head

    @property
    def tone(self) -> Tone:
        """``ok`` when verified, ``bad`` when invalid, ``warn`` otherwise."""
        return _SIGNATURE_WORDS[self.state][1]


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
    warnings: tuple[tuple[str, str, int], ...]
    """(artifact, message, how many times) of what the runtime warned while measuring."""
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
class RolloutRow:
    """One staged-rollout action: the version it published and the evidence that allowed it."""

    when: str
    host_class: str
    rollout: str
    action: str
    version: int
    percent: int
    artifact: str
    actor: str
    why: str
    tone: Tone


@dataclass(frozen=True)
class SteeredRow:
    """A class a person steers (held, pinned, its rollout aborted): every release keeps its
    published entry until ``qualify rollout clear`` (or, after an abort, a new rollout)."""

    host_class: str
    what: str
    since: str
    version: int
    actor: str
    why: str


@dataclass(frozen=True)
class TrialRow:
    """One raced configuration of a tune, as the chart and table show it."""

    trial: int
    label: str
    status: str
    tone: Tone
    p50_text: str
    p99_text: str
    p50_pct: float
    """Bar length of p50, percent of the chart's width (0 when not measured)."""
    p99_pct: float
    ratio: str
    """'p50 x0.77 [0.76, 0.78], p99 x0.54 [0.47, 0.63]' against the current settings."""
    numerics: str
    """'same' / 'differ: ...' / 'not compared'."""


@dataclass(frozen=True)
class TuningView:
    """The latest tune of one class: every trial, the winner and what happened to it."""

    host_class: str
    anchor: str
    artifact: str
    config: str
    when: str
    budget: str
    winner: str
    outcome: str
    outcome_tone: Tone
    scale_ms: float
    """The chart's full width, ms."""
    trials: tuple[TrialRow, ...]


@dataclass(frozen=True)
class LineageRow:
    """How one candidate was made."""

    name: str
    digest: str
    precision: str
    parent: str
    tool: str
    params: str
    calibration: str
    note: str


@dataclass(frozen=True)
class ReleaseRow:
    """One published manifest version: when, by whom and why (``not recorded`` for a version
    published before the matrix recorded them)."""

    version: int
    release: str
    when: str
    by: str
    why: str
    by_recorded: bool
    """Whether the matrix recorded who published it (else ``by`` says it did not)."""
    why_recorded: bool
    """Whether the matrix recorded why (else ``why`` says it did not)."""
    shown: bool
    """The version this report shows (its header's manifest)."""


@dataclass(frozen=True)
class MatrixView:
    """The heat map: a column per artifact, a row per class."""

    artifacts: tuple[ArtifactColumn, ...]
    rows: tuple[HeatRow, ...]


@dataclass(frozen=True)
class RolloutsView:
    """The rollout history: the classes a person steers now, then every action, oldest first."""

    steered: tuple[SteeredRow, ...]
    rows: tuple[RolloutRow, ...]


@dataclass(frozen=True)
class SectionView:
    """One section on the page: its name, its template and what the template shows."""

    name: str
    template: str
    view: Any


@dataclass(frozen=True)
class ReportView:
    """The whole page, ready for the templates."""

    header: Header
    artifacts: tuple[ArtifactColumn, ...]
    heatmap: tuple[HeatRow, ...]
    classes: tuple[ClassView, ...]
    notes: tuple[str, ...]
    glossary: tuple[tuple[str, str], ...]
    """Every reason code on the page with its meaning, sorted."""
    sections: tuple[SectionView, ...]
    """The main part's sections in page order (``reports.sections.SECTIONS``), those shown."""

    def section(self, name: str) -> Any:
        """What section ``name`` shows; None when it is not on the page."""
        return next((s.view for s in self.sections if s.name == name), None)
