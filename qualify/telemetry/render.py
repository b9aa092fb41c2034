"""The watch commands' text for people: a telemetry check and the list of what to re-run.

Owns how ``qualify telemetry check`` and ``qualify matrix stale`` read in a terminal
(``render_check``, ``render_stale``). Every piece of text that may come from hosts' events
(class names, messages) goes through ``qualify.text.one_line``, so an event cannot forge or
break lines. Computes nothing: the check is ``qualify.telemetry.check``'s, the list
``qualify.telemetry.staleness``'s; their JSON is the models' own (``schemas.telemetry``).
"""

from __future__ import annotations

from collections.abc import Sequence

from qualify.text import one_line
from schemas.telemetry import StaleItem, TelemetryCheck

__all__ = ["render_check", "render_stale"]


def render_check(check: TelemetryCheck) -> str:
    """Plain text for people: one line per class, then each alert with its action."""
    judged = ", ".join(f"v{v}" for v in check.versions)
    lines = [
        f"telemetry {check.window_start:%Y-%m-%d %H:%M} .. {check.checked_at:%Y-%m-%d %H:%M} "
        f"UTC, {check.events} events"
        + (f" of {one_line(check.model)}" if check.model else "")
        + f", manifest v{check.manifest_version}"
        + (f", events judged against {judged}" if judged else "")
    ]
    for state in check.classes:
        p99 = (
            f"p99 {state.observed_p99_ms:.3g} ms" if state.observed_p99_ms is not None else "p99 -"
        )
        lines.append(
            f"  {one_line(state.host_class):<16} {state.state:<17} {state.events:>9} events "
            f"{state.hosts:>5} hosts  {p99}  {one_line(', '.join(state.alerts))}"
        )
        lines.extend(f"      {one_line(note)}" for note in state.notes)
    lines.extend(_skipped(check))
    for alert in check.alerts:
        # Every part may carry text from hosts' events: one line each, never forged ones.
        lines.append(
            f"\n[{alert.severity}] {one_line(alert.host_class)}: {alert.kind}: "
            f"{one_line(alert.message)}"
        )
        lines.append(f"  -> {one_line(alert.suggested_action)}")
    lines.append(
        f"\n{len(check.alerts)} alert(s)" if check.alerts else "\nno alerts: every class is ok"
    )
    return "\n".join(lines)


def _skipped(check: TelemetryCheck) -> list[str]:
    """What was left unjudged as another model line's, one line each."""
    found = []
    for skipped in check.skipped:
        whose = (
            f"name model line {one_line(skipped.model)!r}"
            if skipped.model is not None
            else "name no model line and run digests this line never had ("
            + ", ".join(d[:19] for d in skipped.example_digests)
            + "): add 'model' to the hosts' events if they are this line's"
        )
        found.append(
            f"  skipped: {skipped.events} event(s) from {skipped.hosts} host(s) that {whose}"
        )
    return found


def render_stale(items: Sequence[StaleItem]) -> str:
    """Plain text: one line per item, or a sentence saying nothing is stale."""
    if not items:
        return "nothing to re-run: every cell matches the project file and every runtime seen"
    return "\n".join(f"{one_line(i.host_class)}: {i.reason}: {one_line(i.message)}" for i in items)
