"""bench/generate.py on a small fleet: every row is printed from a real run, and its floor row
remakes the policy's very decisions (a floor of other decisions would measure nothing)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench import generate


def test_the_generation_bench_prints_each_row_from_a_small_real_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert generate.main(["--classes", "24", "--repeats", "1"]) == 0
    page = capsys.readouterr().out
    for row in (
        "decide + build + sign + write",
        "the same, one class at a time",
        "build + sign + write (no policy)",
        "decide only (the policy)",
        "floor: the same decisions made again as validated models",
        "floor made by `model_construct`",
    ):
        line = next(x for x in page.splitlines() if row in x)
        assert re.search(r"\| \d+\.\d\dx \(\d+\.\d\d\.\.\d+\.\d\d\) \|", line), line
    assert "24 classes (" in page


def test_the_floor_remakes_every_model_the_policy_makes(tmp_path: Path) -> None:
    from manifest.policy import decide_each

    fx = generate.fixture(12, tmp_path)
    inputs = generate._inputs(fx, generate.CLOCK)
    decided = list(
        decide_each(fx.loaded.project, inputs["cells"], inputs["runs"], **inputs["kwargs"])
    )
    for construct in (False, True):
        remade = [generate._remade(d, construct) for d in decided]
        assert remade == decided
        assert all(r is not d for r, d in zip(remade, decided, strict=True))
        evidence = [(r.evidence, d.evidence) for r, d in zip(remade, decided, strict=True)]
        assert any(e is not None and e is not o for e, o in evidence)


def test_the_closing_line_says_what_share_of_the_judging_the_target_leaves() -> None:
    met = generate._gap_note(2.9, 1.4, 1.6, 2.0, 2.1, 100e-6)
    assert met == "The in-memory target (<= 3x) is met: 2.90x."
    note = generate._gap_note(4.0, 1.5, 2.0, 2.0, 2.2, 100e-6)
    assert (
        "leaves the policy's judging 1.00x of the reference, 50% of the 2.00x it takes now" in note
    )
    assert "2.20x (no cheaper)" in note
    cheaper = generate._gap_note(4.0, 1.5, 2.0, 2.5, 2.0, 100e-6)
    assert "2.00x (cheaper)" in cheaper and "50% of the 2.00x" in cheaper
    over = generate._gap_note(4.0, 1.5, 2.0, 3.2, 3.5, 100e-6)
    assert "is itself over the target by 0.20x" in over
