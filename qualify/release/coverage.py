"""Coverage and the CI gate: every class of the project x every artifact, with the cell it rests
on today and its current verdict, or the reason there is none, and whether a release can proceed.

Owns the coverage rule (`coverage`: a class x artifact pair rests on the cell of that artifact's
bytes now on the class's key that ``manifest.verdict`` picks; its gap is ``stale`` when that
cell's current verdict is stale (other settings, a baseline or budget it cannot answer for);
without a cell it is ``never_run`` (also when only the artifact's earlier bytes were measured:
a file re-exported in place is a new artifact), or ``unserved`` when the fleet found no host for
the class; `with_fleet_gaps` makes it ``fleet_gap`` when the fleet's latest attempt at the
class ended without a measurement, whatever older cell there is), the release gate
(`release_gate`: every class in scope has a measured decision and none regressed from its entry
in the current manifest), and the two files CI reads (`junit_xml`, which counts errors apart
from failures, and `summary_markdown`). Pure: the caller reads the matrix and the artifact files
(``qualify.release.current``) and writes the files (atomically).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from manifest.verdict import Standing
    from qualify.project.view import ProjectView
    from schemas.manifest import ClassDecision, ManifestEntry

__all__ = [
    "CoverageItem",
    "ReleaseGate",
    "coverage",
    "coverage_line",
    "junit_xml",
    "release_gate",
    "summary_markdown",
    "unmeasured",
    "with_fleet_gaps",
]

Gap = Literal["never_run", "stale", "unserved", "fleet_gap"]

_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff\ud800-\udfff]")
"""Characters XML 1.0 cannot hold at all, even escaped (a message may carry any)."""

_RANK = {"hold": 0, "baseline": 1, "candidate": 2}
"""How far a decision goes: moving down this order is a regression."""


@dataclass(frozen=True)
class CoverageItem:
    """One class x artifact of the project."""

    host_class: str
    artifact: str
    role: str
    standing: Standing | None
    """The cell it rests on and its current verdict (``manifest.verdict``); None when the
    matrix has no cell at all (``unmeasured``)."""
    gap: Gap | None
    """Why there is no current cell: never run, stale, or no host."""
    budget_ms: float | None = None
    """The class's p99 budget now."""
    detail: str | None = None
    """For a ``fleet_gap`` (the fleet's latest attempt at the class ended without a
    measurement, after the cell it rests on): its reason code and sentence."""

    @property
    def verdict(self) -> str | None:
        """The current verdict (``stale`` included); None without a cell."""
        current = self.standing.current if self.standing is not None else None
        return current.verdict if current is not None else None

    @property
    def reasons(self) -> list[str]:
        """The current verdict's reasons, ``code: sentence`` each."""
        current = self.standing.current if self.standing is not None else None
        return [f"{r.code}: {r.message}" for r in current.reasons] if current else []

    @property
    def note(self) -> str:
        """The gap in words ("" when there is none)."""
        if self.gap == "stale":
            return "stale: " + "; ".join(self.reasons)
        if self.gap == "never_run":
            earlier = self.standing.replaced if self.standing is not None else None
            if earlier is not None:
                digest = (self.standing.digest or "") if self.standing is not None else ""
                return (
                    f"never run on this class's key as its file is now ({digest[:19]}); run "
                    f"{earlier.run_id} measured its earlier bytes ({earlier.artifact_digest[:19]})"
                )
            return "never run on this class's key"
        if self.gap == "unserved":
            return "no host in the fleet serves this class"
        if self.gap == "fleet_gap":
            return f"the latest fleet run ended it without a measurement: {self.detail or '?'}"
        return ""


def coverage(
    standings: Iterable[Standing],
    *,
    budgets: Mapping[str, float] | None = None,
    unserved: Iterable[str] = (),
) -> list[CoverageItem]:
    """Every class x artifact of the project, in the file's order, with what it rests on.

    Args:
        standings: ``manifest.verdict.standings`` (``qualify.release.current.read_now``).
        budgets: p99 budget per class now (for the CI summary).
        unserved: Classes the fleet found no host for (``qualify fleet run``).
    """
    known = budgets or {}
    lost = set(unserved)
    items: list[CoverageItem] = []
    for standing in standings:
        gap: Gap | None = None
        current = standing.current
        if current is None:
            gap = "unserved" if standing.host_class in lost else "never_run"
        elif current.stale:
            gap = "stale"
        items.append(
            CoverageItem(
                standing.host_class,
                standing.label,
                standing.role,
                standing,
                gap,
                known.get(standing.host_class),
            )
        )
    return items


def with_fleet_gaps(items: Iterable[CoverageItem], gaps: Mapping[str, str]) -> list[CoverageItem]:
    """``items`` with every item of a class in ``gaps`` (class -> ``reason: sentence``: the
    fleet's latest attempt at it ended without a measurement, after its latest cell) made a
    ``fleet_gap``: the older cell it rests on is not this class's current answer."""
    import dataclasses

    return [
        dataclasses.replace(item, gap="fleet_gap", detail=gaps[item.host_class])
        if item.host_class in gaps
        else item
        for item in items
    ]


def unmeasured(view: ProjectView, *, unserved: Iterable[str] = ()) -> list[CoverageItem]:
    """`coverage` of a matrix without any cell: every class x artifact never run (or unserved),
    from the project's view alone (``matrix show`` of an empty matrix needs no more)."""
    lost = set(unserved)
    return [
        CoverageItem(c.name, label, role, None, "unserved" if c.name in lost else "never_run")
        for c in view.classes
        for role, label in view.artifacts
    ]


def coverage_line(items: Sequence[CoverageItem]) -> str:
    """``matrix show``'s summary line: how many class x artifact pairs have a current cell and
    how those judge under the project now (a pass under an old budget is never counted as one),
    or that every pair has one."""
    counts: dict[str, int] = {}
    for item in items:
        if item.gap is None and item.verdict is not None:
            counts[item.verdict] = counts.get(item.verdict, 0) + 1
    said = ", ".join(
        f"{counts[v]} {v}" for v in ("pass", "fail", "insufficient", "error") if v in counts
    )
    current = sum(counts.values())
    if current == len(items):
        return (
            f"coverage: every class x artifact has a current cell ({said}, under the project now)"
        )
    return (
        f"coverage: {current} of {len(items)} class x artifact have a current cell"
        + (f" ({said}, under the project now)" if said else "")
        + f"; {len(items) - current} gap(s)"
    )


@dataclass(frozen=True)
class ReleaseGate:
    """Whether a release can proceed for the classes in scope, and why not."""

    decisions: dict[str, tuple[str, str | None]]
    """Per class in scope: the decision the matrix supports now and its artifact's name."""
    current: dict[str, tuple[str, str | None]]
    """Per class in scope with an entry in the current manifest: that entry."""
    problems: dict[str, str]
    """Per class that blocks the release: why."""

    @property
    def blocked(self) -> bool:
        return bool(self.problems)


def release_gate(
    decisions: Iterable[ClassDecision],
    current: Mapping[str, ManifestEntry] | None,
    *,
    scope: Sequence[str],
    unmeasured: Mapping[str, str] | None = None,
) -> ReleaseGate:
    """Every class in ``scope`` must have a decision resting on a measurement (a hold for want of
    any evidence is none, and so is one whose latest evidence is only a fleet run's loss:
    ``unmeasured``) and must not have regressed from ``current`` (the current manifest's
    entries): a candidate becoming the baseline or a hold, the baseline becoming a hold.

    Args:
        decisions: ``manifest.policy.decide``'s decisions.
        current: The current manifest's ``entries``; None without one.
        scope: The classes the run was about.
        unmeasured: Per class whose latest evidence measured nothing (a fleet gap, or only
            ``node_lost``/``fleet_timeout`` cells): why.
    """
    wanted = set(scope)
    now: dict[str, tuple[str, str | None]] = {}
    problems: dict[str, str] = {}
    for decision in decisions:
        name = decision.host_class
        if name not in wanted:
            continue
        now[name] = (decision.decision, decision.artifact_name)
        codes = {r.code for r in decision.reasons}
        if name in (unmeasured or {}):
            problems[name] = f"no measured decision: {(unmeasured or {})[name]}"
        elif decision.decision == "hold" and "no_evidence" in codes:
            problems[name] = "no decision: nothing was measured on this class's key"
    before: dict[str, tuple[str, str | None]] = {}
    for name, entry in (current or {}).items():
        if name not in wanted:
            continue
        artifact = entry.artifact.name if entry.artifact is not None else None
        before[name] = (entry.decision, artifact)
        if name in now and name not in problems:
            old, new = before[name], now[name]
            if _RANK.get(new[0], 0) < _RANK.get(old[0], 0):
                problems[name] = (
                    f"regressed: the current manifest gives it {_said(old)}, the matrix now "
                    f"supports only {_said(new)}"
                )
    return ReleaseGate(decisions=now, current=before, problems=problems)


def _said(decision: tuple[str, str | None]) -> str:
    kind, artifact = decision
    return f"{kind} {artifact}" if artifact else kind


def _verdict_line(item: CoverageItem) -> str:
    current = item.standing.current if item.standing is not None else None
    if current is None or current.stale or item.gap == "fleet_gap":
        return item.note
    codes = ", ".join(current.codes)
    return f"{current.verdict}" + (f" ({codes})" if codes else "")


def _xml(text: str) -> str:
    return _NOT_XML.sub("\ufffd", text)


def _mark(item: CoverageItem) -> Literal["error", "failure"] | None:
    """A class x artifact's JUnit mark: ``error`` when nothing was measured (no cell, an error
    cell, a fleet gap), ``failure`` when it was and does not pass now; None when it passes."""
    if item.gap == "fleet_gap" or item.verdict in (None, "error"):
        return "error"
    return None if item.verdict == "pass" else "failure"


def junit_xml(
    items: Sequence[CoverageItem],
    gate: ReleaseGate,
    *,
    suite: str = "qualify",
) -> str:
    """A JUnit XML document: one test case per class x artifact (failed unless its cell passes
    under the project now; the current verdict's reason sentences in the failure), and one per
    class for the release decision (failed when it blocks the release).

    Args:
        items: `coverage`'s items.
        gate: `release_gate`'s verdict.
        suite: The test suite's name.
    """
    from xml.etree import ElementTree

    root = ElementTree.Element("testsuites", name=suite)
    by_class: dict[str, list[CoverageItem]] = {}
    for item in items:
        by_class.setdefault(item.host_class, []).append(item)
    failures = errors = 0
    total = 0
    for name, group in by_class.items():
        cases = ElementTree.SubElement(root, "testsuite", name=name)
        failed = errored = 0
        for item in group:
            case = ElementTree.SubElement(cases, "testcase", classname=name, name=item.artifact)
            kind = _mark(item)
            if kind is not None:
                errored += kind == "error"
                failed += kind == "failure"
                said = [] if item.gap == "fleet_gap" else item.reasons
                node = ElementTree.SubElement(case, kind, message=_xml(_verdict_line(item)))
                node.text = _xml("\n".join(said or [item.note or _verdict_line(item)]))
        release = ElementTree.SubElement(cases, "testcase", classname=name, name="release decision")
        if name in gate.problems:
            failed += 1
            ElementTree.SubElement(release, "failure", message=_xml(gate.problems[name]))
        elif name in gate.decisions:
            ElementTree.SubElement(release, "system-out").text = _said(gate.decisions[name])
        cases.set("tests", str(len(group) + 1))
        cases.set("failures", str(failed))
        cases.set("errors", str(errored))
        failures += failed
        errors += errored
        total += len(group) + 1
    root.set("tests", str(total))
    root.set("failures", str(failures))
    root.set("errors", str(errors))
    ElementTree.indent(root)
    return (
        '<?xml version="1.0" encoding="utf-8"?>\n'
        + ElementTree.tostring(root, encoding="unicode")
        + "\n"
    )


def _cell_md(text: str) -> str:
    """Text safe in a markdown table cell: one line, pipes and markup escaped."""
    flat = " ".join(str(text).split())
    for mark in ("\\", "|", "<", ">", "*", "_", "`", "[", "]"):
        flat = flat.replace(mark, "\\" + mark)
    return flat[:300]


def summary_markdown(
    items: Sequence[CoverageItem], gate: ReleaseGate, *, title: str, against: str | None = None
) -> str:
    """A markdown summary for a CI job: the verdict line, what it compared with (``against``,
    the current manifest; None: there was none), the release decisions per class, and the
    class x artifact table."""
    lines = [f"## {_cell_md(title)}", ""]
    if gate.blocked:
        lines.append(f"**Release blocked** ({len(gate.problems)} class(es)):")
        lines += [f"- `{_cell_md(n)}`: {_cell_md(why)}" for n, why in gate.problems.items()]
    else:
        lines.append("**Release can proceed**: every class has a decision and none regressed.")
    lines += [
        "",
        f"Compared with the current manifest: {_cell_md(against)}."
        if against is not None
        else "No published manifest to compare with: a regression from what hosts run cannot "
        "be seen (fetch it and pass `--manifest`, or restore the matrix).",
    ]
    lines += ["", "| class | current manifest | matrix now | |", "|---|---|---|---|"]
    for name, now in gate.decisions.items():
        before = gate.current.get(name)
        mark = "blocks" if name in gate.problems else "ok"
        lines.append(
            f"| {_cell_md(name)} | {_cell_md(_said(before)) if before else '—'} | "
            f"{_cell_md(_said(now))} | {mark} |"
        )
    lines += [
        "",
        "| class | artifact | verdict | p99 upper / budget (ms) | |",
        "|---|---|---|---|---|",
    ]
    for item in items:
        p99 = "—"
        cell = item.standing.cell if item.standing is not None else None
        measured = cell.gate_latency if cell is not None else None
        if measured is not None and measured.p99_upper_ms is not None:
            p99 = f"{measured.p99_upper_ms:.3g}"
        if item.budget_ms is not None and p99 != "—":
            p99 += f" / {item.budget_ms:g}"
        lines.append(
            f"| {_cell_md(item.host_class)} | {_cell_md(item.artifact)} | "
            f"{_cell_md(_verdict_line(item))} | {p99} | {'gap' if item.gap else ''} |"
        )
    return "\n".join(lines) + "\n"
