"""Invariants of the decision rule over random matrices and fleets (hypothesis).

* No class ever receives a candidate whose cell on its exact key did not pass every gate: checked
  by an oracle that reads the scripted measurements directly, not through the policy's code.
* A class with no cell on its key never receives a candidate.
* Generation is deterministic for the same inputs and clock, whatever order the cells come in.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from manifest import envelope, policy
from manifest.build import build_manifest
from schemas.cell import Cell
from schemas.manifest import ClassDecision, ManifestEntry
from tests.manifest.factories import (
    BASELINE,
    CLOCK,
    Fleet,
    artifact_refs,
    class_spec,
    digest_of,
    make_project,
)

CANDIDATES = ("a-int8", "b-int8")
STALE = "sha256:" + "0" * 64

random_run = st.fixed_dictionaries(
    {
        "candidate": st.sampled_from((*CANDIDATES, None)),
        "p99_upper_ms": st.sampled_from((None, 10.0, 79.0, 81.0, 200.0)),
        "parity_passed": st.booleans(),
        "parity_reference": st.sampled_from((None, None, digest_of("other-fp32"))),
        "fallback_nodes": st.sampled_from((0, 0, 1, 5)),
        "expected_nodes": st.sampled_from((10, 10, 0)),
        "peak_rss_mb": st.sampled_from((None, 100.0, 600.0)),
        "cold_init_ms": st.sampled_from((None, 100.0, 2000.0)),
        "verdict": st.sampled_from(("pass", "pass", "fail", "insufficient", "error")),
        "baseline_verdict": st.sampled_from(("pass", "pass", "fail", "error")),
        "emulated": st.booleans(),
        "rollback_loaded": st.sampled_from((True, True, False, None)),
        "stale": st.booleans(),
        "other_key": st.booleans(),
    }
)

GOOD_RUN: dict[str, Any] = {
    "p99_upper_ms": 10.0,
    "parity_passed": True,
    "parity_reference": None,
    "fallback_nodes": 0,
    "expected_nodes": 10,
    "peak_rss_mb": 100.0,
    "cold_init_ms": 100.0,
    "verdict": "pass",
    "baseline_verdict": "pass",
    "emulated": False,
    "rollback_loaded": True,
    "stale": False,
    "other_key": False,
}


@st.composite
def nearly_good_run(draw: st.DrawFn) -> dict[str, Any]:
    """A run that passes every gate, with at most one measurement drawn at random."""
    run = {**GOOD_RUN, "candidate": draw(st.sampled_from(CANDIDATES))}
    spoiled = draw(random_run)
    field = draw(st.sampled_from((None, None, *GOOD_RUN)))
    if field is not None:
        run[field] = spoiled[field]
    return run


run_strategy = st.one_of(nearly_good_run(), random_run)

fleet_strategy = st.fixed_dictionaries(
    {
        "classes": st.lists(
            st.fixed_dictionaries(
                {
                    "fallback_allowance": st.sampled_from((0, 0, 2)),
                    "runs": st.lists(run_strategy, max_size=3),
                }
            ),
            min_size=1,
            max_size=5,
        ),
        "unknown_class": st.sampled_from(("hold", "baseline")),
        "allow_emulated": st.booleans(),
        "seed": st.integers(0, 2**16),
    }
)


def build_fleet(spec: dict[str, Any]) -> Fleet:
    classes = {
        f"c{i}": class_spec(i, fallback_allowance=c["fallback_allowance"])
        for i, c in enumerate(spec["classes"])
    }
    fleet = Fleet(
        make_project(
            classes,
            candidates=CANDIDATES,
            unknown_class=spec["unknown_class"],
            allow_emulated=spec["allow_emulated"],
        )
    )
    names = list(classes)
    for i, c in enumerate(spec["classes"]):
        for run in c["runs"]:
            run = dict(run)
            stale, other = run.pop("stale"), run.pop("other_key")
            key_of = names[(i + 1) % len(names)] if other and len(names) > 1 else None
            p99_upper = run["p99_upper_ms"]
            fleet.qualify(
                f"c{i}",
                p99_ms=(p99_upper or 50.0) * 0.95,
                p99_lower_ms=None if p99_upper is None else p99_upper * 0.9,
                settings_digest=STALE if stale else None,
                key_of=key_of,
                **run,
            )
    return fleet


def oracle_passes(fleet: Fleet, name: str, d: ClassDecision) -> bool:
    """Did the cell this class's candidate rests on pass every gate? Read from raw fields."""
    cls = fleet.project.host_classes[name]
    current = cls.settings_digest()
    on_key = [
        c
        for c in fleet.cells
        if c.key == cls.key
        and c.artifact_digest == d.artifact_digest
        and c.settings_digest == current
    ]
    if not on_key:
        return False
    cell = max(on_key, key=lambda c: (c.measured_at, c.run_id))
    run = fleet.runs[cell.run_id]
    gate = cell.latency[0] if cell.latency else None
    placement = cell.placement
    on_expected = placement.nodes_per_provider.get(cls.provider.expected, 0) if placement else 0
    budgets = cls.budgets
    rollback_ok = any(
        r.key == cls.key
        and r.settings_digest == current
        and r.rollback is not None
        and r.rollback.loaded
        for r in fleet.runs.values()
    ) or any(
        c.key == cls.key
        and c.settings_digest == current
        and c.artifact_name == BASELINE
        and c.verdict != "error"
        for c in fleet.cells
    )
    # The runner's verdict is not read: the measurements are judged under the project now.
    out = cell.parity.outputs[0] if cell.parity is not None else None
    return bool(
        cell.error is None
        and (fleet.project.policy.allow_emulated or not (cell.emulated or run.emulated))
        and cell.parity is not None
        and out is not None
        and (out.max_abs or 0) <= 0.05
        and (out.cosine_min or 0) >= 0.99
        and (out.top1_agreement or 0) >= 0.98
        and cell.parity.reference_digest == digest_of(BASELINE)
        and gate is not None
        and gate.p99_upper_ms is not None
        and gate.p99_upper_ms <= budgets.p99_ms
        and placement is not None
        and on_expected > 0
        and placement.total_nodes - on_expected <= cls.provider.fallback_allowance
        and cell.peak_rss_mb is not None
        and budgets.peak_rss_mb is not None
        and cell.peak_rss_mb <= budgets.peak_rss_mb
        and cell.cold_init_ms is not None
        and budgets.cold_init_ms is not None
        and cell.cold_init_ms <= budgets.cold_init_ms
        and rollback_ok
    )


PROPERTY = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(fleet_strategy)
def test_no_class_receives_a_candidate_it_did_not_pass_on_its_exact_key(
    spec: dict[str, Any],
) -> None:
    fleet = build_fleet(spec)
    for name, d in fleet.decide().items():
        if d.decision == "candidate":
            assert oracle_passes(fleet, name, d), (name, d.reasons)


@PROPERTY
@given(fleet_strategy)
def test_class_without_evidence_never_receives_a_candidate(spec: dict[str, Any]) -> None:
    fleet = build_fleet(spec)
    measured = {c.key for c in fleet.cells}
    for name, d in fleet.decide().items():
        if fleet.project.host_classes[name].key not in measured:
            assert d.decision == spec["unknown_class"]
            assert {r.code for r in d.reasons} >= {"no_evidence"}


def _generate(fleet: Fleet, cells: list[Cell]) -> bytes:
    shuffled = Fleet(fleet.project, cells=cells, runs=fleet.runs)
    signed = build_manifest(
        fleet.project,
        list(shuffled.decide().values()),
        release="prop",
        version=1,
        created=CLOCK,
        expires=CLOCK.replace(year=2026),
        snapshot="s",
        artifacts=artifact_refs(fleet.project),
    )
    return envelope.encode_canonical(signed)


@PROPERTY
@given(fleet_strategy)
def test_generation_is_deterministic_for_the_same_inputs_and_clock(spec: dict[str, Any]) -> None:
    fleet = build_fleet(spec)
    first = _generate(fleet, list(fleet.cells))
    assert _generate(fleet, list(fleet.cells)) == first
    shuffled = list(fleet.cells)
    random.Random(spec["seed"]).shuffle(shuffled)
    assert _generate(fleet, shuffled) == first


@PROPERTY
@given(fleet_strategy)
def test_every_written_entry_reads_back_as_its_decision(spec: dict[str, Any]) -> None:
    # The builder writes each entry's text once, straight from the decision: read back and
    # validated as a manifest reader does, it says what was decided, on the class's settings,
    # and the document with its entries as text encodes as the one with them parsed.
    fleet = build_fleet(spec)
    decisions = list(fleet.decide().values())
    refs = artifact_refs(fleet.project)
    common: dict[str, Any] = {
        "release": "prop",
        "version": 1,
        "created": CLOCK,
        "expires": CLOCK.replace(year=2026),
        "snapshot": "s",
        "artifacts": refs,
    }
    encoded = build_manifest(fleet.project, decisions, **common, encoded=True)
    plain = build_manifest(fleet.project, decisions, **common)
    for d in decisions:
        data = b"".join(encoded["entries"].encoded(d.host_class).canonical_parts())
        assert envelope.encode_canonical(plain["entries"][d.host_class]) == data
        entry = ManifestEntry.model_validate(json.loads(data))
        cls = fleet.project.host_classes[d.host_class]
        assert (entry.host_class, entry.decision, entry.summary) == (
            d.host_class,
            d.decision,
            d.summary,
        )
        assert (entry.evidence, entry.reasons, entry.run_ids) == (
            d.evidence,
            list(d.reasons),
            list(d.run_ids),
        )
        assert (entry.key, entry.runtime, entry.provider) == (cls.key, cls.runtime, cls.provider)
        assert entry.match == cls.match
        digest = None if entry.artifact is None else entry.artifact.digest
        assert digest == d.artifact_digest
    assert envelope.encode_canonical(encoded) == envelope.encode_canonical(plain)


def _decided_in_batches(fleet: Fleet, size: int) -> Iterator[ClassDecision]:
    digests = {label: digest_of(label) for label in (BASELINE, *CANDIDATES)}
    return policy.decide_each(fleet.project, fleet.cells, fleet.runs, digests=digests, batch=size)


@PROPERTY
@given(fleet_strategy, st.sampled_from((2, 3, policy.BATCH)))
def test_deciding_in_batches_decides_each_class_as_deciding_one_at_a_time(
    spec: dict[str, Any], size: int
) -> None:
    # decide_each hands decisions on a batch at a time: the batch's size changes when a class
    # is decided, never what is decided, nor the order.
    fleet = build_fleet(spec)
    one_at_a_time = list(_decided_in_batches(fleet, 1))
    assert list(_decided_in_batches(fleet, size)) == one_at_a_time
    assert list(fleet.decide().values()) == one_at_a_time


def test_decide_each_decides_a_batch_before_handing_on_its_first_decision() -> None:
    good = {**GOOD_RUN, "candidate": CANDIDATES[0]}
    five = [{"fallback_allowance": 0, "runs": [good]} for _ in range(5)]
    fleet = build_fleet({"classes": five, "unknown_class": "hold", "allow_emulated": False})
    made: list[str] = []
    decide = policy._ClassDecider.decide

    def counted(self: Any) -> ClassDecision:
        made.append(self.name)
        return decide(self)

    with patch.object(policy._ClassDecider, "decide", counted):
        each = _decided_in_batches(fleet, 2)
        first = next(each)
        assert len(made) == 2 and first.host_class == made[0]
        next(each)
        assert len(made) == 2  # the batch's second decision was made already
        next(each)
        assert len(made) == 4
        assert [d.host_class for d in each] == made[3:] == list(fleet.project.host_classes)[3:]


def test_decide_each_refuses_a_batch_below_one() -> None:
    fleet = build_fleet(
        {
            "classes": [{"fallback_allowance": 0, "runs": []}],
            "unknown_class": "hold",
            "allow_emulated": False,
        }
    )
    with pytest.raises(ValueError, match="at least 1 class"):
        next(_decided_in_batches(fleet, 0))
