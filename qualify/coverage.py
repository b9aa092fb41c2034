"""Coverage and the CI gate: every class of the project x every artifact, with its latest cell
or the reason there is none, and whether a release can proceed.

Owns the coverage rule (`coverage`: a class x artifact pair has the latest matrix row of the
class's key and that artifact's name, which is ``stale`` when measured under other runtime or
provider settings than the project's now; without one it is ``never_run``, or ``unserved`` when
the fleet found no host for the class), the release gate (`release_gate`: every class in scope
has a measured decision and none regressed from its entry in the current manifest), and the two
files CI reads (`junit_xml`, `summary_markdown`). Pure: the caller reads the matrix and writes
the files (atomically).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from qualify.project_view import ProjectView

if TYPE_CHECKING:
    from schemas.manifest import ClassDecision, ManifestEntry
    from schemas.project import Project

__all__ = [
    "CoverageItem",
    "ReleaseGate",
    "coverage",
    "junit_xml",
    "release_gate",
    "summary_markdown",
]

Gap = Literal["never_run", "stale", "unserved"]

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
    row: Mapping[str, Any] | None
    """The latest matrix row (``Store.matrix_rows``) of the class's key and artifact; None when
    there is none."""
    gap: Gap | None
    """Why there is no current cell: never run, measured under other settings, or no host."""

    @property
    def note(self) -> str:
        """The gap in words ("" when there is none)."""
        return {
            None: "",
            "never_run": "never run on this class's key",
            "stale": "measured under other runtime or provider settings than the project's now",
            "unserved": "no host in the fleet serves this class",
        }[self.gap]


def coverage(
    project: Project | ProjectView,
    rows: Iterable[Mapping[str, Any]],
    *,
    unserved: Iterable[str] = (),
) -> list[CoverageItem]:
    """Every class x artifact of ``project``, in the file's order, with its latest row.

    Args:
        project: The project file, or its view.
        rows: The matrix's latest rows (``Store.matrix_rows()``).
        unserved: Classes the fleet found no host for (``qualify fleet run``).
    """
    latest: dict[tuple[str, str, str, str], Mapping[str, Any]] = {}
    for row in rows:
        key = (row["hardware"], row["runtime"], row["provider"], row["artifact_name"])
        best = latest.get(key)
        if best is None or (row["measured_at"], row["run_id"]) > (
            best["measured_at"],
            best["run_id"],
        ):
            latest[key] = row
    lost = set(unserved)
    view = project if isinstance(project, ProjectView) else ProjectView.of(project)
    items: list[CoverageItem] = []
    for host_class in view.classes:
        for role, label in view.artifacts:
            found = latest.get((*host_class.key, label))
            gap: Gap | None = None
            if found is None:
                gap = "unserved" if host_class.name in lost else "never_run"
            elif found.get("settings_digest") != host_class.settings_digest:
                gap = "stale"
            items.append(CoverageItem(host_class.name, label, role, found, gap))
    return items


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
) -> ReleaseGate:
    """Every class in ``scope`` must have a decision resting on a measurement (a hold for want of
    any evidence is none) and must not have regressed from ``current`` (the current manifest's
    entries): a candidate becoming the baseline or a hold, the baseline becoming a hold.

    Args:
        decisions: ``manifest.policy.decide``'s decisions.
        current: The current manifest's ``entries``; None without one.
        scope: The classes the run was about.
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
        if decision.decision == "hold" and "no_evidence" in codes:
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
    row = item.row
    if row is None:
        return item.note
    codes = ", ".join(row.get("reason_codes") or [])
    return (
        f"{row['verdict']}"
        + (f" ({codes})" if codes else "")
        + (f"; {item.note}" if item.gap else "")
    )


def _xml(text: str) -> str:
    return _NOT_XML.sub("\ufffd", text)


def junit_xml(
    items: Sequence[CoverageItem],
    gate: ReleaseGate,
    *,
    reasons: Mapping[tuple[str, str], list[str]] | None = None,
    suite: str = "qualify",
) -> str:
    """A JUnit XML document: one test case per class x artifact (failed unless its latest cell
    passed and is current; the reason sentences in the failure), and one per class for the
    release decision (failed when it blocks the release).

    Args:
        items: `coverage`'s items.
        gate: `release_gate`'s verdict.
        reasons: (run id, artifact digest) -> the cell's reason sentences.
        suite: The test suite's name.
    """
    from xml.etree import ElementTree

    root = ElementTree.Element("testsuites", name=suite)
    by_class: dict[str, list[CoverageItem]] = {}
    for item in items:
        by_class.setdefault(item.host_class, []).append(item)
    failures = 0
    total = 0
    for name, group in by_class.items():
        cases = ElementTree.SubElement(root, "testsuite", name=name)
        failed = 0
        for item in group:
            case = ElementTree.SubElement(cases, "testcase", classname=name, name=item.artifact)
            row = item.row
            ok = row is not None and row.get("verdict") == "pass" and item.gap is None
            if not ok:
                failed += 1
                sentences = []
                if row is not None and reasons is not None:
                    sentences = reasons.get((row["run_id"], row["artifact_digest"]), [])
                kind = "error" if row is None or row.get("verdict") == "error" else "failure"
                node = ElementTree.SubElement(case, kind, message=_xml(_verdict_line(item)))
                node.text = _xml("\n".join(sentences or [item.note or _verdict_line(item)]))
        release = ElementTree.SubElement(cases, "testcase", classname=name, name="release decision")
        if name in gate.problems:
            failed += 1
            ElementTree.SubElement(release, "failure", message=_xml(gate.problems[name]))
        elif name in gate.decisions:
            ElementTree.SubElement(release, "system-out").text = _said(gate.decisions[name])
        cases.set("tests", str(len(group) + 1))
        cases.set("failures", str(failed))
        failures += failed
        total += len(group) + 1
    root.set("tests", str(total))
    root.set("failures", str(failures))
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
        row = item.row
        p99 = "—"
        if row is not None and row.get("p99_upper_ms") is not None:
            p99 = f"{row['p99_upper_ms']:.3g}"
            if row.get("p99_budget_ms") is not None:
                p99 += f" / {row['p99_budget_ms']:g}"
        lines.append(
            f"| {_cell_md(item.host_class)} | {_cell_md(item.artifact)} | "
            f"{_cell_md(_verdict_line(item))} | {p99} | {'gap' if item.gap else ''} |"
        )
    return "\n".join(lines) + "\n"
