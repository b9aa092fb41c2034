"""The current verdict (`manifest.verdict.Judge`): the class's settings now, and the gates
judged again under the project now, as `manifest.gates.judge` judges them."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from manifest.gates import judge
from manifest.verdict import Judge
from schemas.cell import Cell
from schemas.project import Project
from tests.manifest.factories import Fleet, class_spec, digest_of, make_project, tight_soak


def judge_of(project: Project) -> Judge:
    labels = [project.artifacts.baseline.label, *(c.label for c in project.artifacts.candidates)]
    return Judge(project, {label: digest_of(label) for label in labels})


def test_classes_whose_settings_differ_only_in_a_values_type_have_their_own_digests() -> None:
    # 1, true and 1.0 are equal in Python and apart in the digest's JSON: a class must never
    # be given another's digest from a cache.
    values: list[Any] = [1, True, 1.0, "1", 0.0, -0.0]
    classes = {}
    for index, value in enumerate(values):
        spec = class_spec(index)
        spec["provider"]["session_config"] = {"session.x": value}
        classes[f"c{index}"] = spec
    project = make_project(classes)
    judge_ = judge_of(project)
    digests = [judge_.settings(name) for name in classes]
    assert digests == [cls.settings_digest() for cls in project.host_classes.values()]
    assert len(set(digests)) == len(values)


def test_classes_with_the_same_settings_share_the_digest_their_own_would_give() -> None:
    project = make_project({f"c{i}": class_spec(i, version=f"1.3{i % 2}.*") for i in range(4)})
    judge_ = judge_of(project)
    for name, cls in project.host_classes.items():
        assert judge_.settings(name) == cls.settings_digest()


def _soaked_baseline(
    budget_ms: float, first_ms: float, last_ms: float, tolerance: float, floor: float
) -> tuple[Cell, Any]:
    project = make_project({"c": class_spec(0, p99_ms=budget_ms)})
    fleet = Fleet(project)
    fleet.qualify("c", candidate=None)
    (cell,) = fleet.cells
    soak = tight_soak(
        [first_ms, first_ms, last_ms],
        tolerance=tolerance,
        floor=floor,
        drifted=last_ms * 0.98 > first_ms * 1.02 * (1 + tolerance),
    )
    return cell.model_copy(update={"soak": soak}), project


@given(
    budget=st.sampled_from([0.2, 1.0, 5.0]),
    first=st.floats(0.01, 2.0),
    factor=st.floats(0.5, 8.0),
    then=st.tuples(st.sampled_from([0.0, 0.2, 1.0]), st.sampled_from([0.0, 0.1, 0.5])),
    now=st.tuples(st.sampled_from([0.0, 0.2, 1.0, 6.0]), st.sampled_from([0.0, 0.1, 0.5])),
)
def test_a_soak_is_judged_as_the_gate_judges_it_under_the_projects_soak_settings_now(
    budget: float,
    first: float,
    factor: float,
    then: tuple[float, float],
    now: tuple[float, float],
) -> None:
    cell, project = _soaked_baseline(budget, first, first * factor, *then)
    workload = project.workload.model_copy(update={"soak_tolerance": now[0], "soak_floor": now[1]})
    project = project.model_copy(update={"workload": workload})
    soak = cell.soak
    assert soak is not None
    rejudged = cell.model_copy(update={"soak": soak.under(*now)})
    verdict, reasons = judge(rejudged, project.host_classes["c"])
    found = judge_of(project).verdict(cell)
    assert (found.verdict, list(found.reasons)) == (verdict, reasons)


def test_a_baseline_cell_is_judged_by_every_gate_but_parity_and_a_candidate_by_all() -> None:
    project = make_project({"c": class_spec(0)})
    fleet = Fleet(project)
    fleet.qualify("c", fallback_nodes=3, p99_upper_ms=99.0, p99_lower_ms=90.0)
    base, cand = fleet.cells
    assert (base.role, cand.role) == ("baseline", "candidate")
    cls = project.host_classes["c"]
    judge_ = judge_of(project)
    now = judge_.verdict(base)
    assert (now.verdict, list(now.reasons)) == judge(base, cls)
    # A candidate with no parity evidence: the parity gate is not re-judged here, it applies.
    bare = cand.model_copy(update={"parity": None})
    now = judge_.verdict(bare)
    assert (now.verdict, list(now.reasons)) == judge(bare, cls)
    assert now.codes[-1] == "baseline_failed"
    # Its parity re-judged here: the gates less parity, after the parity's own failure.
    now = judge_.verdict(cand)
    assert (now.verdict, list(now.reasons)) == judge(cand, cls, skip=("parity",))
    assert now.codes == ["provider_fallback", "p99_over_budget"]
