"""onnxruntime's warnings as a person reads them: each once, with its count, clean and bounded
(qualify.measure.runtime_log)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from qualify.measure import runtime_log
from qualify.measure.runtime_log import MAX_CHARS, MAX_DISTINCT, clean, count_lines, merge, read_log

VERIFY = (
    "\x1b[0;93m2026-12-06 02:51:24.002062703 [W:onnxruntime:, execution_frame.cc:943 "
    "VerifyOutputSizes] Expected shape from model of {-1,3} does not match actual shape of "
    "{1,4} for output y\x1b[m"
)


def test_a_warning_given_on_every_inference_is_kept_once_with_its_count() -> None:
    lines = [VERIFY.replace("002062703", f"{k:09d}") for k in range(500)]
    found = count_lines(["some other output", *lines, "[E:onnxruntime:, x.cc:1 F] broke"])
    assert found == [
        (
            "[W:onnxruntime:, execution_frame.cc:943 VerifyOutputSizes] Expected shape from "
            "model of {-1,3} does not match actual shape of {1,4} for output y",
            500,
        ),
        ("[E:onnxruntime:, x.cc:1 F] broke", 1),
    ]


def test_terminal_escapes_and_control_characters_never_survive() -> None:
    said = clean("\x1b]0;title\x07\x1b[31mred\x1b[0m\tand\rmore\x1b")
    assert said == "red and more"
    assert "\x1b" not in clean(VERIFY)


def test_past_the_distinct_bound_one_entry_counts_the_rest() -> None:
    lines = [f"[W:onnxruntime:, a.cc:{k} F] message {k}" for k in range(MAX_DISTINCT + 7)]
    found = count_lines(lines * 2)
    assert len(found) == MAX_DISTINCT + 1
    assert found[-1][1] == 14 and "7 other onnxruntime messages" in found[-1][0]


def test_a_huge_line_is_read_in_bounded_pieces_and_kept_trimmed(tmp_path: Path) -> None:
    log = tmp_path / "stderr.txt"
    log.write_bytes(b"[W:onnxruntime:, a.cc:1 F] " + b"x" * (3 * runtime_log.MAX_LINE_BYTES))
    found = read_log(log)
    assert len(found) == 1 and len(found[0][0]) == MAX_CHARS
    assert read_log(tmp_path / "missing.txt") == []


def test_merging_adds_counts_of_the_same_message_from_several_sources() -> None:
    merged = merge(["\x1b[33mprovider missing\x1b[0m", "provider missing"], [("other", 4)])
    assert merged == [("provider missing", 2), ("other", 4)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=200), max_size=50))
def test_any_output_gives_bounded_clean_counts(lines: list[str]) -> None:
    found = count_lines(lines)
    assert len(found) <= MAX_DISTINCT + 1
    assert sum(count for _, count in found) <= len(lines)
    for text, count in found:
        assert count >= 1 and len(text) <= 2 * MAX_CHARS
        assert all(ch.isprintable() for ch in text)
