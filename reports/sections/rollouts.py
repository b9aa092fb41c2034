"""The rollout history section: the classes a person steers, then every staged-rollout action."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from reports.inputs import Classes, Inputs
from reports.view import RolloutRow, RolloutsView, SteeredRow, Tone

__all__ = ["build"]

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
    return RolloutRow(
        when=_when(row["acted_at"]),
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


def build(inputs: Inputs, classes: Classes) -> RolloutsView | None:
    """Shown when the matrix logged any rollout action."""
    if not inputs.rollouts:
        return None
    return RolloutsView(
        steered=tuple(_steered_row(n, r) for n, r in sorted(inputs.steering.items())),
        rows=tuple(_rollout_row(r) for r in inputs.rollouts),
    )
