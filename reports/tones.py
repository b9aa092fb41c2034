"""How the report highlights a value: the tone of the gate's finding, or of a verdict.

A quantity a gate judges takes that gate's finding (``manifest.gates.assess``, the rules the
runner and the policy apply); what was not measured stays muted whatever judged it.
"""

from __future__ import annotations

from manifest.gates import GateOutcome, assess
from reports.view import Tone
from schemas.cell import Cell
from schemas.project import HostClass

__all__ = ["gate_tones", "verdict_tone", "with_tone"]

_TONE_OF: dict[GateOutcome, Tone] = {"pass": "ok", "fail": "bad", "undecided": "warn", "off": ""}
"""How a gate's finding colours the quantity it judged."""

_VERDICT_TONES: dict[str, Tone] = {
    "pass": "ok",
    "fail": "bad",
    "insufficient": "warn",
    "error": "bad",
}


def gate_tones(cell: Cell, cls: HostClass | None) -> dict[str, Tone]:
    """Gate name -> the tone of its finding on this cell; empty without a class to judge against."""
    if cls is None:
        return {}
    return {gate.name: _TONE_OF[finding.outcome] for gate, finding in assess(cell, cls)}


def with_tone(shown: tuple[str, Tone], tone: Tone | None) -> tuple[str, Tone]:
    """A measured value's text in its gate's tone; what was not measured stays muted."""
    text, own = shown
    return (text, own) if tone is None or own == "muted" else (text, tone)


def verdict_tone(verdict: str) -> Tone:
    """``ok`` for a pass, ``bad`` for a fail or an error, ``warn`` when insufficient, else muted."""
    return _VERDICT_TONES.get(verdict, "muted")
