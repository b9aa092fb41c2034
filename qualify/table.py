"""The matrix as text: ``matrix show``'s table (aligned columns, never wrapped; colour only on a
terminal), its CSV of plain values, and one-line reasons for every listing. Computes nothing
that is not in the rows; imports the standard library only (``matrix show`` starts fast)."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Mapping
from datetime import date, datetime
from typing import IO, Any

from qualify.text import one_line

__all__ = [
    "VERDICT_COLOR",
    "csv_value",
    "matrix_table",
    "print_matrix",
    "rows_to_csv",
    "shorten",
    "use_color",
    "warning_lines",
    "with_budgets",
]

TITLE = "qualification matrix (latest cell per key and artifact, verdicts as measured)"

TITLE_NOW = "qualification matrix (each class x artifact, verdicts under the project file now)"

EMPTY = "the matrix is empty: run 'qualify run --host-class NAME' first"

VERDICT_COLOR = {
    "pass": "green",
    "fail": "red",
    "insufficient": "yellow",
    "error": "magenta",
    "stale": "yellow",
}
"""The colour of each verdict, here and in the run's display (``qualify.console``)."""

_SGR = {"green": "32", "red": "31", "yellow": "33", "magenta": "35"}
"""The terminal's code for each colour of `VERDICT_COLOR`."""


REASON_WIDTH = 120
"""Characters a reason (a why, a message) may take in a line of a table or a listing: the rest
is cut with an ellipsis; ``--json`` and the report have the whole text."""


def shorten(value: object, width: int = REASON_WIDTH) -> str:
    """``value`` on one line (`one_line`), cut to ``width`` characters with an ellipsis."""
    text = one_line(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def with_budgets(
    rows: list[dict[str, Any]], budgets: Mapping[str, float] | None
) -> list[dict[str, Any]]:
    """Add each row's class p99 budget as ``p99_budget_ms`` (None without a project file)."""
    known = budgets or {}
    for row in rows:
        row["p99_budget_ms"] = known.get(row["host_class"])
    return rows


def _ms(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.3f}" if value < 10 else f"{value:.1f}"


def _cell_text(row: Mapping[str, Any]) -> tuple[str, str]:
    """The verdict and the rest of one cell's text."""
    budget = row.get("p99_budget_ms")
    upper = row.get("p99_upper_ms")
    text = f"p99≤{_ms(upper)}" if upper is not None else "p99 ?"
    if budget is not None:
        text += f"/{_ms(budget)} ms"
    if row.get("fallback_nodes"):
        text += f" fb={row['fallback_nodes']}"
    if row.get("emulated"):
        text += " emulated"
    if row.get("isa_mismatch"):
        text += " other-ISA"
    if row.get("numerics") == "emulated":
        text += f" numerics:{row.get('numerics_cpu')}"
    return one_line(row["verdict"]), text


def matrix_table(rows: list[dict[str, Any]], *, color: bool = False, title: str = TITLE) -> str:
    """Host classes x artifacts (baseline first), each cell its verdict and p99 bound against
    the budget; the text ends with a newline. Every value from the matrix is printed on one line
    with control characters spelled out (`one_line`), so no name can forge a row."""
    if not rows:
        return EMPTY + "\n"
    names = [
        name for _, name in sorted({(r["role"] != "baseline", r["artifact_name"]) for r in rows})
    ]
    by_class: dict[tuple[str, str, str, str], dict[str, Mapping[str, Any]]] = {}
    for row in rows:
        key = (row["host_class"], row["hardware"], row["runtime"], row["provider"])
        shown = by_class.setdefault(key, {})
        earlier = shown.get(row["artifact_name"])
        # Two cells of one name on a key (the file changed between runs): the later one.
        if earlier is None or _when(row) >= _when(earlier):
            shown[row["artifact_name"]] = row
    header = ["host class", "key (hardware, runtime, provider)", *(one_line(n) for n in names)]
    # Each cell: (plain text, SGR colour of its first len(verdict) characters or "").
    body: list[list[tuple[str, str, int]]] = []
    for (cls, hw, rt, pv), cells in sorted(by_class.items()):
        line = [(one_line(cls), "", 0), (one_line(f"{hw}, {rt}, {pv}"), "", 0)]
        for name in names:
            cell = cells.get(name)
            if cell is None:
                line.append(("—", "", 0))
                continue
            verdict, rest = _cell_text(cell)
            line.append(
                (
                    f"{verdict} {rest}",
                    _SGR.get(VERDICT_COLOR.get(str(cell["verdict"]), ""), ""),
                    len(verdict),
                )
            )
        body.append(line)
    widths = [len(h) for h in header]
    for line in body:
        widths = [max(w, len(text)) for w, (text, _, _) in zip(widths, line, strict=True)]
    out = [title, _join(header, widths), _join(["-" * w for w in widths], widths)]
    for line in body:
        texts = []
        for (text, sgr, n), width in zip(line, widths, strict=True):
            padded = text.ljust(width)
            if color and sgr:
                padded = f"\x1b[{sgr}m{padded[:n]}\x1b[0m{padded[n:]}"
            texts.append(padded)
        out.append("  ".join(texts).rstrip())
    return "\n".join(out) + "\n"


def _when(row: Mapping[str, Any]) -> tuple[str, str]:
    return (str(row.get("measured_at") or ""), str(row.get("run_id") or ""))


def _join(texts: list[str], widths: list[int]) -> str:
    return "  ".join(t.ljust(w) for t, w in zip(texts, widths, strict=True)).rstrip()


WARNINGS_PER_CELL = 3
"""Distinct warnings ``matrix show`` prints per cell, most frequent first."""


def warning_lines(found: list[tuple[str, str, list[tuple[str, int]]]]) -> list[str]:
    """``warning: CLASS x ARTIFACT: warned 412x: MESSAGE`` for what the runtime said while each
    latest cell was measured (`matrix.store.Store.latest_warnings`), at most
    `WARNINGS_PER_CELL` per cell and a line that counts the rest."""
    lines = []
    for host_class, name, said in found:
        where = f"warning: {one_line(host_class)} x {one_line(name)}"
        ranked = sorted(said, key=lambda item: -item[1])
        for message, count in ranked[:WARNINGS_PER_CELL]:
            lines.append(f"{where}: warned {count}x: {one_line(message)}")
        if len(ranked) > WARNINGS_PER_CELL:
            lines.append(
                f"{where}: and {len(ranked) - WARNINGS_PER_CELL} other warning(s) (qualify report)"
            )
    return lines


def use_color(stream: IO[str]) -> bool:
    """Colour for a terminal, never for a pipe or a file; ``NO_COLOR`` (any value) turns it off
    and ``FORCE_COLOR`` on, as https://no-color.org and most tools agree."""
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and os.environ.get("TERM") != "dumb"


def print_matrix(rows: list[dict[str, Any]], stream: IO[str], *, title: str = TITLE) -> None:
    """Write `matrix_table` to ``stream``, in colour where `use_color` says so."""
    stream.write(matrix_table(rows, color=use_color(stream), title=title))


def csv_value(value: object) -> object:
    """One CSV cell as a plain value, never a Python repr: empty for null, ``true``/``false``,
    ISO 8601 for a timestamp, JSON text for a list or a mapping (``["avx512f", "vnni"]``: a
    spreadsheet shows it, and any JSON parser reads it back whole, where a "; " join could not
    tell an item holding "; " from two items)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, list | tuple | dict):
        return json.dumps(value, ensure_ascii=False, default=str)
    return value


def rows_to_csv(rows: list[dict[str, Any]]) -> str:
    """The matrix rows as CSV with a header line, every cell a plain value (`csv_value`)."""
    if not rows:
        return ""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0].keys()), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: csv_value(v) for k, v in row.items()})
    return out.getvalue()
