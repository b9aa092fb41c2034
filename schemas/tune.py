"""A tune of one class's session settings (``qualify tune``): every trial and the outcome.

Owns the models only; ``qualify.tune`` makes them and ``matrix.store`` keeps them in the
``tunes`` table, apart from the cells that decisions rest on.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from schemas.base import Digest, Document
from schemas.cell import Cell, Slowdown
from schemas.project import HostClassKey, ProviderSpec

__all__ = ["Trial", "TrialStatus", "TuneRecord"]

TrialStatus = Literal["reference", "winner", "finalist", "dropped", "numerics_changed"]


class Trial(Document):
    """One configuration of session settings, raced against the class's current ones."""

    trial: int = Field(ge=0, description="Its number; 0 is the class's current settings.")
    label: str = Field(description="What it changes, e.g. 'intra_op=1 intra_op.allow_spinning=0'.")
    change: dict[str, Any] = Field(description="The fields of the provider section it changes.")
    provider: ProviderSpec = Field(description="The whole provider section it ran under.")
    status: TrialStatus = Field(
        description="reference (the current settings), winner, finalist (ran to the last "
        "stage), dropped (clearly slower, or in the slower half of a stage) or "
        "numerics_changed (its outputs differ from the current settings' beyond the "
        "artifact's parity tolerance: its cell's parity says how)."
    )
    stage: int = Field(ge=0, description="The last stage of the race it ran in.")
    dropped_at_stage: int | None = Field(
        description="The stage after which it stopped; 0: its process never became ready."
    )
    vs_current: Slowdown | None = Field(
        description="Its latency over the current settings' in the paired rounds of its last "
        "stage (p50 and p99 ratios with confidence bounds); null for the reference."
    )
    cell: Cell = Field(
        description="What it measured, as a cell (never used by decisions); its parity is "
        "against the current settings' outputs of the same artifact."
    )


class TuneRecord(Document):
    """One ``qualify tune`` of one class."""

    tune_id: str = Field(description="Unique id (a run id).")
    host_class: str = Field(description="The class tuned.")
    key: HostClassKey = Field(description="Its key.")
    artifact_name: str = Field(description="The artifact the settings were raced with.")
    artifact_digest: Digest = Field(description="Its digest.")
    config: str = Field(description="The latency config raced at, e.g. 'b1 c1'.")
    started_at: datetime = Field(description="Start (UTC).")
    finished_at: datetime = Field(description="End (UTC).")
    budget_s: float = Field(gt=0, description="The race's time budget, seconds.")
    emulated: bool = Field(description="The host did not match the class.")
    winner: int = Field(ge=0, description="The winning trial; 0: the current settings stay.")
    winner_label: str = Field(description="What the winner changes.")
    qualification_run_id: str | None = Field(
        description="The qualification run under the winner's settings; null when the current "
        "settings won."
    )
    qualification_verdict: str | None = Field(
        description="The tuned artifact's verdict in that run; the winner is applied only on "
        "'pass'."
    )
    applied: bool = Field(description="Whether the winner was written into the project file.")
    outcome: str = Field(description="One sentence: what happened to the winner.")
    trials: list[Trial] = Field(description="Every trial, the reference first.")
