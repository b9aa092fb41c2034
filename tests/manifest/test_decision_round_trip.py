"""Every decision the policy makes survives its dump: validating ``model_dump`` gives it back.

``manifest.policy`` builds each ``ClassDecision``, its ``Evidence`` and their reasons validated
(pydantic's construction without validation was slower for these models, measured with
``bench/generate.py``). What a reader validates from the written entry must be the same object:
these tests hold that over every branch of the golden fleet (both releases) and over random
fleets, nested models of the declared types included.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given

from schemas.cell import Reason
from schemas.manifest import ClassDecision, Evidence, Manifest, ParitySummary
from tests.manifest.factories import fixed_key, signed_manifest
from tests.manifest.test_generate_bytes import _fleet, _project
from tests.manifest.test_properties import PROPERTY, build_fleet, fleet_strategy


def _assert_reads_back(decision: ClassDecision) -> None:
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


def test_every_decision_of_the_golden_fleet_reads_back_from_its_dump() -> None:
    fleet = _fleet(_project(second=False))
    first = list(fleet.decide().values())
    kinds = {d.decision for d in first}
    assert kinds == {"candidate", "baseline", "hold"}  # every branch makes one
    assert any(d.evidence is not None and d.evidence.parity is not None for d in first)
    for decision in first:
        _assert_reads_back(decision)
    # The next release: rollbacks come from the previous manifest, under other settings.
    previous = Manifest.model_validate(signed_manifest(fleet, fixed_key()))
    fleet.project = _project(second=True)
    for decision in fleet.decide(previous=previous).values():
        _assert_reads_back(decision)


@PROPERTY
@given(fleet_strategy)
def test_decisions_of_random_fleets_read_back_from_their_dumps(spec: dict[str, Any]) -> None:
    for decision in build_fleet(spec).decide().values():
        _assert_reads_back(decision)
