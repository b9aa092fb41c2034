"""What onnxruntime said while an artifact was measured: its warnings and errors, each once.

Owns reading the measuring child's stderr for onnxruntime's own log lines (``[W:onnxruntime:...]``
and ``[E:onnxruntime:...]``), stripping what makes every copy of one message look new (terminal
colour escapes, the timestamp onnxruntime prefixes), and counting the copies: a model whose
declared output shape disagrees with what it returns makes onnxruntime warn
``VerifyOutputSizes`` on every inference, thousands of identical lines a person needs to read
once, with how often. Bounded on every side: at most `MAX_DISTINCT` messages of at most
`MAX_CHARS` characters are kept, lines are read at most `MAX_LINE_BYTES` at a time, and the file
is streamed, never held. Does not decide anything: the cell keeps what is found, the run's output,
``matrix show`` and the report show it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "MAX_CHARS",
    "MAX_DISTINCT",
    "MAX_LINE_BYTES",
    "Logged",
    "clean",
    "count_lines",
    "merge",
    "read_log",
]

MAX_DISTINCT = 20
"""Distinct messages kept per artifact; the rest are counted in one closing entry."""
MAX_CHARS = 500
"""Characters kept of one message."""
MAX_LINE_BYTES = 64 * 1024
"""Bytes read of one line at a time (a line without a newline cannot fill the memory)."""

Logged = tuple[str, int]
"""A distinct message and how many times it was given."""

# CSI sequences (colours, cursor moves), OSC sequences (titles, links) and lone escapes.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]?")
# onnxruntime's prefix: "2025-01-31 12:00:00.123456789 " before "[W:onnxruntime:...".
_STAMP = re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d+)? +")
_RUNTIME = re.compile(r"\[[WE]:onnxruntime:")


def clean(text: str) -> str:
    """``text`` without terminal escapes, other control characters or a leading timestamp,
    trimmed to `MAX_CHARS`."""
    text = _ESCAPES.sub("", text)
    text = "".join(ch if ch.isprintable() else " " for ch in text).strip()
    text = _STAMP.sub("", text)
    return text[:MAX_CHARS]


def _runtime_line(line: str) -> str | None:
    """The message of one onnxruntime warning or error line, cleaned; None for other output."""
    text = clean(line)
    return text if _RUNTIME.search(text) else None


def count_lines(lines: Iterable[str]) -> list[Logged]:
    """onnxruntime's warnings and errors among ``lines``, each distinct message once with its
    count, in order of first appearance; past `MAX_DISTINCT`, one closing entry counts the
    lines of the messages not kept."""
    counts: dict[str, int] = {}
    dropped_lines = 0
    dropped: set[str] = set()
    for line in lines:
        text = _runtime_line(line)
        if text is None:
            continue
        if text in counts:
            counts[text] += 1
        elif len(counts) < MAX_DISTINCT:
            counts[text] = 1
        else:
            dropped_lines += 1
            if len(dropped) < 10_000:  # how many distinct ones, up to a bound
                dropped.add(text)
    found = list(counts.items())
    if dropped_lines:
        many = f"{len(dropped)}" if len(dropped) < 10_000 else "10,000 or more"
        found.append(
            (
                f"(and {many} other onnxruntime messages, not kept: qualify keeps {MAX_DISTINCT})",
                dropped_lines,
            )
        )
    return found


def _bounded_lines(path: Path) -> Iterable[str]:
    with path.open("rb") as fh:
        while chunk := fh.readline(MAX_LINE_BYTES):
            yield chunk.decode("utf-8", errors="replace")


def read_log(path: Path) -> list[Logged]:
    """`count_lines` over a child's stderr file, streamed; empty when it cannot be read."""
    try:
        return count_lines(_bounded_lines(path))
    except OSError:
        return []


def merge(*groups: Iterable[Logged | str]) -> list[Logged]:
    """Several lists of messages (a plain string counts once) as one: each message cleaned and
    once, the counts added, in order of first appearance, at most `MAX_DISTINCT` + 1 kept."""
    counts: dict[str, int] = {}
    for group in groups:
        for item in group:
            text, count = (item, 1) if isinstance(item, str) else item
            key = clean(text)
            if key in counts or len(counts) <= MAX_DISTINCT:
                counts[key] = counts.get(key, 0) + int(count)
    return list(counts.items())
