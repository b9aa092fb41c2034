"""The page is its registered sections and each class's table its registered rows: a new one
needs its module (and, for a section, its template) and one entry, not the builder."""

from __future__ import annotations

import pytest
from jinja2 import ChoiceLoader, DictLoader

import reports.context
import reports.rows
from reports import ReportView, build_report, render_report
from reports.inputs import Classes, Inputs, Section
from reports.render import environment
from reports.rows.table import Table
from reports.sections import SECTIONS
from reports.view import CompareRow
from tests.reports.factories import CLOCK, VERSION, scripted_fleet
from tests.reports.htmltree import parse


def _main_sections(html: str) -> list[str]:
    (main,) = parse(html).find_all("main")
    # The glossary closes the page's main part after the sections; it is not one of them.
    ids = [node.attrs["id"] for node in main.children if node.tag == "section"]
    return [i for i in ids if i != "glossary"]


def test_the_page_shows_every_registered_section_in_order(
    golden_view: ReportView, golden_html: str
) -> None:
    names = [s.name for s in SECTIONS]
    assert [s.name for s in golden_view.sections] == names  # the golden view has them all
    assert _main_sections(golden_html) == names


def _view() -> ReportView:
    fleet, current, _ = scripted_fleet()
    return build_report(
        fleet.project,
        fleet.cells,
        fleet.runs,
        fleet.samples,
        now=CLOCK,
        tool_version=VERSION,
        manifest=current,
        signature_status="unsigned",
    )


def test_a_section_that_has_nothing_to_show_is_left_off() -> None:
    view = _view()  # no previous manifest, rollouts, tunes or lineage
    assert [s.name for s in view.sections] == ["matrix", "classes"]
    assert view.section("diff") is None
    assert _main_sections(render_report(view)) == ["matrix", "classes"]


def test_a_new_section_and_a_new_row_need_only_their_own_entry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def count(inputs: Inputs, classes: Classes) -> str:
        return f"{len(classes.views)} classes, {len(inputs.cells)} cells"

    def cells_row(table: Table) -> list[CompareRow]:
        return [table.row("cell id", lambda c: (c.run_id, ""))]

    env = environment()
    extra = DictLoader({"sections/count.html": '<section id="count">{{ section }}</section>\n'})
    monkeypatch.setattr(env, "loader", ChoiceLoader([extra, env.loader]))
    monkeypatch.setattr(
        reports.context, "SECTIONS", (*SECTIONS, Section("count", "sections/count.html", count))
    )
    monkeypatch.setattr(reports.rows, "ROWS", (*reports.rows.ROWS, cells_row))
    view = _view()
    html = render_report(view)
    assert _main_sections(html) == ["matrix", "classes", "count"]
    assert '<section id="count">5 classes, ' in html
    measured = [c for c in view.classes if c.artifacts]
    assert measured and all(c.compare[-1].label == "cell id" for c in measured)


def test_manifest_history_shows_who_published_each_version_and_says_not_recorded_before(
    golden_view: ReportView, golden_html: str
) -> None:
    rows = golden_view.section("releases")
    assert rows is not None
    # the draft and the discarded publication never reached a host: left off
    assert [(r.version, r.by, r.why[:13], r.shown) for r in rows] == [
        (1, "not recorded", "not recorded", False),
        (2, "maria.lopez", "June release:", True),
    ]
    (table,) = [
        t for t in parse(golden_html).find_all("table") if t.attrs.get("class") == "releases"
    ]
    first = table.find_all("tr")[1]
    assert [td.attrs.get("class") for td in first.find_all("td")][-2:] == [
        "long unknown",
        "long unknown",
    ]
