"""Decisions built without validation (``Document.trusted``) equal their validated twins.

``manifest.policy`` makes each ``ClassDecision`` and its ``Evidence`` with ``Document.trusted``:
per class of a fleet, validating objects built from validated ones was a fifth of deciding. The
price is that nothing checks them as they are made, so these tests do, over every branch of the
golden fleet (both releases) and over random fleets: dumping a decision and validating the dump
gives an equal object, nested models of the declared types included (a plain dict where a model
belongs, a tuple for a list or a wrong literal fails the comparison or the validation).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given

from schemas.base import Document
from schemas.cell import Reason
from schemas.manifest import ClassDecision, Evidence, Manifest, ParitySummary
from tests.manifest.factories import fixed_key, signed_manifest
from tests.manifest.test_generate_bytes import _fleet, _project
from tests.manifest.test_properties import PROPERTY, build_fleet, fleet_strategy


def _assert_validated_twin(decision: ClassDecision) -> None:
    twin = ClassDecision.model_validate(decision.model_dump())
    assert twin == decision, decision.host_class
    assert decision.model_fields_set == twin.model_fields_set
    for field in ClassDecision.model_fields:  # same types, not only equal values
        assert type(getattr(decision, field)) is type(getattr(twin, field)), field
    if decision.evidence is not None:
        assert type(decision.evidence) is Evidence
        parity = decision.evidence.parity
        assert parity is None or type(parity) is ParitySummary
    assert all(type(r) is Reason for r in decision.reasons)


def test_every_decision_of_the_golden_fleet_equals_its_validated_twin() -> None:
    fleet = _fleet(_project(second=False))
    first = list(fleet.decide().values())
    kinds = {d.decision for d in first}
    assert kinds == {"candidate", "baseline", "hold"}  # every branch makes one
    assert any(d.evidence is not None and d.evidence.parity is not None for d in first)
    for decision in first:
        _assert_validated_twin(decision)
    # The next release: rollbacks come from the previous manifest, under other settings.
    previous = Manifest.model_validate(signed_manifest(fleet, fixed_key()))
    fleet.project = _project(second=True)
    for decision in fleet.decide(previous=previous).values():
        _assert_validated_twin(decision)


@PROPERTY
@given(fleet_strategy)
def test_decisions_of_random_fleets_equal_their_validated_twins(spec: dict[str, Any]) -> None:
    for decision in build_fleet(spec).decide().values():
        _assert_validated_twin(decision)


class _Pair(Document):
    name: str
    count: int


def test_trusted_holds_the_fields_as_given_and_compares_like_a_validated_model() -> None:
    fields: dict[str, Any] = {"name": "a", "count": 2}
    made = _Pair.trusted(fields)
    assert made == _Pair(name="a", count=2)
    assert made.model_dump() == fields
    assert made.model_fields_set == {"name", "count"}
    with pytest.raises(Exception, match="frozen"):
        made.count = 3
    # Nothing is checked: that is the caller's promise, which the tests above hold it to.
    assert _Pair.trusted({"name": "a", "count": "2"}) != _Pair(name="a", count=2)
