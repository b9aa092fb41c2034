"""The project view ``matrix show`` reads: what a writer records of a validated project file,
found again only for the very same bytes, and never trusted when the record is not one this code
wrote."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from manifest.verdict import Judge, standings
from matrix.store import Store
from qualify.project.load import load_project
from qualify.project.view import ClassView, ProjectView, record_view, recorded_view, view_key
from qualify.release.coverage import coverage, unmeasured
from tests.manifest.factories import digest_of, scenario
from tests.qualify.projects import write_project


def test_a_view_round_trips_through_its_record() -> None:
    view = ProjectView.of(scenario().project)
    assert ProjectView.from_json(view.to_json()) == view
    assert [c.name for c in view.classes] == list(scenario().project.host_classes)
    assert view.artifacts[0][0] == "baseline"


def test_the_view_carries_what_coverage_of_an_empty_matrix_needs() -> None:
    """A matrix without cells: the view's gaps are the ones the whole project's judge finds."""
    project = scenario().project
    name, host_class = next(iter(project.host_classes.items()))
    labels = [project.artifacts.baseline.label, *(c.label for c in project.artifacts.candidates)]
    judged = standings(Judge(project, {label: digest_of(label) for label in labels}), {})
    from_project = [(i.host_class, i.artifact, i.gap) for i in coverage(judged, unserved=[name])]
    from_view = [
        (i.host_class, i.artifact, i.gap)
        for i in unmeasured(ProjectView.of(project), unserved=[name])
    ]
    assert from_project == from_view
    assert ProjectView.of(project).budgets()[name] == host_class.budgets.p99_ms


def _valid_doc() -> dict[str, object]:
    return json.loads(ProjectView.of(scenario().project).to_json())


def test_a_record_that_is_not_a_view_this_code_wrote_is_a_miss() -> None:
    doc = _valid_doc()
    broken: list[object] = [
        {**doc, "format": "qualify-project-view/0"},
        {**doc, "classes": "x"},
        {**doc, "artifacts": []},
        {**doc, "artifacts": [["candidate", "a"]]},
        {**doc, "classes": [["c", ["a", "b"], "sha256:x", 1.0]]},
        {**doc, "classes": [["c", ["a", "b", "c"], "sha256:x", -1.0]]},
        {**doc, "classes": [["c", ["a", "b", "c"], "sha256:x", True]]},
        {**doc, "classes": [["", ["a", "b", "c"], "sha256:x", 1.0]]},
        {**doc, "classes": [["c", ["a", "b", "c"], 5, 1.0]]},
        [doc],
        None,
    ]
    for item in broken:
        assert ProjectView.from_json(json.dumps(item)) is None, item
    assert ProjectView.from_json("{") is None
    assert ProjectView.from_json("[" * 100_000) is None
    assert (
        ProjectView.from_json('{"format": "qualify-project-view/1", "classes": [[1e999]]}') is None
    )


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.floats() | st.text(max_size=8),
        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
        max_leaves=20,
    )
)
def test_any_json_either_reads_as_a_well_formed_view_or_is_a_miss(value: object) -> None:
    for doc in (value, {**_valid_doc(), "classes": value}, {**_valid_doc(), "artifacts": value}):
        try:
            text = json.dumps(doc)
        except ValueError:
            continue
        view = ProjectView.from_json(text)
        if view is None:
            continue
        assert view.artifacts and view.artifacts[0][0] == "baseline"
        for c in view.classes:
            assert isinstance(c, ClassView) and math.isfinite(c.p99_budget_ms)
            assert c.p99_budget_ms > 0 and len(c.key) == 3


def test_a_recorded_view_is_found_only_for_the_same_bytes(tmp_path: Path) -> None:
    project_path = write_project(tmp_path, [])
    loaded = load_project(project_path, check_models=False)
    with Store.open(tmp_path / "m.duckdb") as db:
        assert recorded_view(db, project_path) is None
        record_view(db, loaded.project, loaded.sha256)
        assert recorded_view(db, project_path) == ProjectView.of(loaded.project)
        project_path.write_text(project_path.read_text().replace("p99_ms: 50", "p99_ms: 60"))
        assert recorded_view(db, project_path) is None  # edited: validate again
        assert recorded_view(db, tmp_path / "missing.yaml") is None
        assert view_key("0" * 64) != view_key("1" * 64)


def test_a_damaged_record_is_a_miss(tmp_path: Path) -> None:
    project_path = write_project(tmp_path, [])
    loaded = load_project(project_path, check_models=False)
    assert loaded.sha256 is not None
    with Store.open(tmp_path / "m.duckdb") as db:
        db.record_project_view(view_key(loaded.sha256), '{"format": "qualify-project-view/1"}')
        assert recorded_view(db, project_path) is None


def test_the_matrix_keeps_a_bounded_number_of_views(tmp_path: Path) -> None:
    view = ProjectView.of(scenario().project).to_json()
    ticks = iter(range(1000))
    clock = lambda: datetime(2025, 6, 1, tzinfo=UTC) + timedelta(seconds=next(ticks))  # noqa: E731
    with Store.open(tmp_path / "m.duckdb", clock=clock) as db:
        for i in range(Store.MAX_PROJECT_VIEWS + 5):
            db.record_project_view(view_key(f"{i:064x}"), view)
        (count,) = db.connection.execute("SELECT count(*) FROM project_views").fetchall()[0]
        assert count == Store.MAX_PROJECT_VIEWS
        assert db.project_view(view_key(f"{Store.MAX_PROJECT_VIEWS + 4:064x}")) == view


def test_a_matrix_that_refuses_the_view_fails_nothing(tmp_path: Path) -> None:
    project_path = write_project(tmp_path, [])
    loaded = load_project(project_path, check_models=False)
    with Store.open(tmp_path / "m.duckdb"):
        pass
    with Store.open(tmp_path / "m.duckdb", read_only=True) as db:
        assert record_view(db, loaded.project, loaded.sha256) is False
        assert recorded_view(db, project_path) is None
    with Store.open(tmp_path / "m.duckdb") as db:
        assert record_view(db, loaded.project, None) is False  # a project built in code
        assert record_view(db, loaded.project, loaded.sha256) is True
