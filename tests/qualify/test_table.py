"""The matrix table ``matrix show`` prints: every character of every cell (a pipe is never
truncated), colour only where asked, and no value from the matrix can forge a line."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from typing import Any

import pytest

from qualify.table import EMPTY, matrix_table, print_matrix, rows_to_csv, use_color, with_budgets


def _row(host_class: str, artifact: str, role: str, **extra: Any) -> dict[str, Any]:
    return {
        "host_class": host_class,
        "hardware": "x86-v3",
        "runtime": "ort-r8",
        "provider": "cpu-1thread",
        "artifact_name": artifact,
        "role": role,
        "verdict": "pass",
        "p99_upper_ms": 2.5,
        "measured_at": datetime(2025, 6, 1, tzinfo=UTC),
        **extra,
    }


def test_every_cell_is_printed_whole_with_its_budget_and_flags() -> None:
    long_name = "int8-qdq-per-channel-reduce-range-calibrated-on-recorded-traffic"
    rows = with_budgets(
        [
            _row("x86-v3-1t", "fp32", "baseline"),
            _row("x86-v3-1t", long_name, "candidate", verdict="fail", fallback_nodes=3),
            _row("x86-v4", "fp32", "baseline", emulated=True, p99_upper_ms=None),
        ],
        {"x86-v3-1t": 20.0},
    )
    text = matrix_table(rows)
    lines = text.splitlines()
    assert lines[1].split()[:2] == ["host", "class"]
    assert long_name in lines[1]  # the baseline's column comes first, then the candidate's
    assert lines[1].index("fp32") < lines[1].index(long_name)
    assert "pass p99≤2.500/20.0 ms" in lines[3]
    assert "fail p99≤2.500/20.0 ms fb=3" in lines[3]
    assert "pass p99 ? emulated" in lines[4] and "—" in lines[4]  # x86-v4 has no candidate cell
    # Aligned: each column starts where its header does.
    assert lines[3].index("fail") == lines[1].index(long_name)
    assert "\x1b" not in text


def test_colour_marks_only_the_verdict_and_only_when_asked() -> None:
    rows = [_row("c", "fp32", "baseline", verdict="fail")]
    coloured = matrix_table(rows, color=True)
    assert "\x1b[31mfail\x1b[0m" in coloured
    assert coloured.replace("\x1b[31m", "").replace("\x1b[0m", "") == matrix_table(rows)


def test_a_name_cannot_forge_a_line_or_restyle_the_terminal() -> None:
    rows = [_row("c\nx86 pass", "fp32\x1b[2J", "baseline", verdict="pass\r")]
    text = matrix_table(rows, color=True)
    assert len(text.splitlines()) == 4
    assert "\\x0a" in text and "\\x1b[2J" in text and "\x1b[2J" not in text


def test_an_empty_matrix_says_how_to_fill_it() -> None:
    assert matrix_table([]) == EMPTY + "\n"
    assert rows_to_csv([]) == ""


def test_a_pipe_gets_no_colour_and_no_colour_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert use_color(Tty()) and not use_color(io.StringIO())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not use_color(Tty())
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert use_color(io.StringIO())
    out = io.StringIO()
    print_matrix([_row("c", "fp32", "baseline")], out)
    assert "\x1b[32mpass" in out.getvalue()


def test_csv_has_a_header_and_empty_for_missing() -> None:
    text = rows_to_csv([_row("c", "fp32", "baseline", p99_upper_ms=None)])
    header, line = text.splitlines()
    assert header.split(",")[:2] == ["host_class", "hardware"]
    assert ",," in line


def test_numerics_of_this_isa_emulated_read_apart_from_another_isas() -> None:
    rows = [
        _row(
            "arm-r5",
            "fp32",
            "baseline",
            emulated=True,
            numerics="emulated",
            numerics_cpu="neoverse-n1",
        ),
        _row(
            "arm-old",
            "fp32",
            "baseline",
            emulated=True,
            isa_mismatch=["no asimddp"],
            numerics="other_isa",
        ),
        _row("x86-v4", "fp32", "baseline", numerics="native"),
    ]
    lines = {line.split()[0]: line for line in matrix_table(rows).splitlines()[2:]}
    assert "emulated numerics:neoverse-n1" in lines["arm-r5"] and "other-ISA" not in lines["arm-r5"]
    assert "other-ISA" in lines["arm-old"] and "numerics:" not in lines["arm-old"]
    assert "numerics:" not in lines["x86-v4"] and "other-ISA" not in lines["x86-v4"]
