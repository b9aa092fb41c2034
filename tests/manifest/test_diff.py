"""Comparing two manifests: which class changes from what to what, and why."""

from __future__ import annotations

from manifest.diff import diff_manifests, render_changes
from schemas.manifest import Manifest
from tests.manifest.factories import (
    Fleet,
    class_spec,
    fixed_key,
    make_project,
    scenario,
    signed_manifest,
)


def test_diff_says_which_class_changes_from_what_to_what_and_why() -> None:
    key = fixed_key()
    fleet = scenario()
    a = Manifest.model_validate(signed_manifest(fleet, key, version=1))
    fleet.qualify("gpu-a10")  # the CUDA fallback is fixed
    fleet.qualify("arm-new")  # first evidence for the new class
    b = Manifest.model_validate(signed_manifest(fleet, key, version=2, previous=a))
    changes = {c.host_class: c for c in diff_manifests(a, b)}
    # x86 keeps its candidate, and its rollback: the baseline, never its own artifact
    assert set(changes) == {"gpu-a10", "arm-new"}
    gpu = changes["gpu-a10"]
    assert (gpu.change, gpu.before and gpu.before.decision, gpu.after and gpu.after.decision) == (
        "changed",
        "baseline",
        "candidate",
    )
    assert "gpu-a10: baseline rec-fp32 -> candidate rec-int8." in gpu.summary
    assert changes["arm-new"].summary.startswith("arm-new: hold -> candidate rec-int8.")
    assert changes["gpu-a10"].fields[:2] == ["decision", "artifact"]
    text = render_changes(list(changes.values()), a, b)
    assert "(version 1) -> 2025.06 (version 2): 2 class(es) change." in text
    assert "reasons: candidate_passed" in text


def test_diff_of_a_manifest_with_itself_is_empty() -> None:
    a = Manifest.model_validate(signed_manifest(scenario(), fixed_key()))
    assert diff_manifests(a, a) == []
    assert render_changes([], a, a).endswith("no class changes.\n")


def test_diff_reports_added_and_removed_classes() -> None:
    key = fixed_key()
    one = Fleet(make_project({"a": class_spec(1)}))
    two = Fleet(make_project({"b": class_spec(2)}))
    a = Manifest.model_validate(signed_manifest(one, key))
    b = Manifest.model_validate(signed_manifest(two, key, version=2))
    kinds = {c.host_class: c.change for c in diff_manifests(a, b)}
    assert kinds == {"a": "removed", "b": "added"}
