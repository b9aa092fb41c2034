"""Parity tolerances merge field by field: the built-in default, then the project's family entry,
then the per-output override; a limit is off only where it is set to null."""

from __future__ import annotations

import textwrap

from hypothesis import given
from hypothesis import strategies as st

from qualify.project.load import dump_project, parse_project
from schemas.project import DEFAULT_TOLERANCES, OutputTolerance, Project, Tolerance
from schemas.rules import TOLERANCE_FIELDS
from schemas.tolerance import merge_tolerance, resolve_tolerance

PROJECT = """\
model: m
artifacts:
  baseline: {path: a.onnx}
  candidates: [{path: b.onnx, precision: pruned}, {path: c.onnx, precision: int8}]
workload:
  inputs: {x: {shape: [1, 4], source: generated, seed: 1}}
%s
host_classes:
  c: {key: {hardware: h, runtime: r, provider: p}, budgets: {p99_ms: 5}}
"""


def project(parity: str) -> Project:
    return parse_project(PROJECT % textwrap.dedent(parity))


def test_a_per_output_override_keeps_the_family_defaults_it_does_not_name() -> None:
    # The case: pruned's cosine_min 0.98 used to vanish, and a cosine of 0.936 passed.
    found = project("parity: {pruned: {outputs: {probs: {max_abs: 0.5, top1_agreement_min: 0.3}}}}")
    limits = resolve_tolerance(found.tolerance("pruned"), "probs")
    assert limits == OutputTolerance(
        max_abs=0.5, cosine_min=0.98, top1_agreement_min=0.3, mean_abs=None, max_rel=None
    )
    other = resolve_tolerance(found.tolerance("pruned"), "logits")
    assert other == OutputTolerance(max_abs=0.1, cosine_min=0.98, top1_agreement_min=0.97)


def test_a_family_entry_replaces_only_the_limits_it_sets() -> None:
    found = project("parity: {int8: {max_abs: 0.5}}")
    assert found.tolerance("int8") == Tolerance(
        max_abs=0.5, cosine_min=0.99, top1_agreement_min=0.98
    )
    # A family the file leaves out is the default itself.
    assert found.tolerance("fp16") == DEFAULT_TOLERANCES["fp16"]


def test_null_turns_a_limit_off_for_the_family_or_for_one_output() -> None:
    found = project(
        """\
        parity:
          int8:
            cosine_min: null
            outputs: {logits: {top1_agreement_min: null}, boxes: {max_abs: null, mean_abs: 0.01}}
        """
    )
    family = found.tolerance("int8")
    assert family.cosine_min is None and family.max_abs == 0.05
    assert resolve_tolerance(family, "logits") == OutputTolerance(max_abs=0.05)
    assert resolve_tolerance(family, "boxes") == OutputTolerance(
        mean_abs=0.01, top1_agreement_min=0.98
    )
    assert resolve_tolerance(family, "other") == OutputTolerance(
        max_abs=0.05, top1_agreement_min=0.98
    )


def test_the_merged_limits_survive_writing_the_project_back_with_its_defaults() -> None:
    found = project("parity: {int8: {max_abs: 0.5, outputs: {y: {cosine_min: null}}}}")
    again = parse_project(dump_project(found, include_defaults=True))
    for family in DEFAULT_TOLERANCES:
        for output in ("y", "z"):
            assert resolve_tolerance(again.tolerance(family), output) == resolve_tolerance(
                found.tolerance(family), output
            )


_LIMIT = st.one_of(st.none(), st.floats(0, 1))
_PARTIAL = st.dictionaries(st.sampled_from(TOLERANCE_FIELDS), _LIMIT)


@given(entry=_PARTIAL, override=_PARTIAL)
def test_each_limit_comes_from_the_nearest_level_that_sets_it(
    entry: dict[str, float | None], override: dict[str, float | None]
) -> None:
    base = DEFAULT_TOLERANCES["int8"]
    merged = merge_tolerance(base, Tolerance(**entry, outputs={"y": OutputTolerance(**override)}))
    limits = resolve_tolerance(merged, "y")
    for field in TOLERANCE_FIELDS:
        expected = override.get(field, entry.get(field, getattr(base, field)))
        assert getattr(limits, field) == expected, field
