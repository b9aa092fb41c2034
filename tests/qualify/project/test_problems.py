"""How a class name the project file (or the manifest) does not define is answered
(`no_such_class`, `class_choices`): by every command that takes one (run, fleet run, emulators
prepare, the project editor, the rollout steps)."""

from __future__ import annotations

from qualify.project.problems import class_choices, no_such_class


def test_a_misspelt_class_is_answered_with_the_closest_name_and_the_classes() -> None:
    said = no_such_class("qualify.yaml", "x86-v5", ["x86-v4", "arm-r5", "x86-v3-1t"])
    assert said == (
        "qualify.yaml: host_classes: no class named 'x86-v5'. Fix: did you mean 'x86-v4'? "
        "The file's classes: arm-r5, x86-v3-1t, x86-v4."
    )


def test_a_name_like_none_of_them_lists_the_classes_without_a_guess() -> None:
    said = no_such_class("p.yaml", "zzz", ["x86-v4", "arm-r5"])
    assert said.endswith("Fix: use one of the file's classes: arm-r5, x86-v4.")


def test_a_large_fleet_lists_a_few_classes_and_counts_them_all() -> None:
    fleet = [f"c{i:05d}" for i in range(10_000)]
    said = no_such_class("p.yaml", "c0000x", fleet)
    assert "did you mean" in said and said.endswith(", c00009, ... (10,000 classes).")
    assert len(said) < 300


def test_a_file_without_classes_says_so() -> None:
    assert no_such_class("p.yaml", "a", []).endswith("Fix: the file's classes: none yet.")


def test_the_manifest_s_classes_are_offered_for_a_rollout_step() -> None:
    fix = class_choices("x86v4", ["x86-v4", "arm-r5"], "the manifest's")
    assert fix == "did you mean 'x86-v4'? The manifest's classes: arm-r5, x86-v4."
