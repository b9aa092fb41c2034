"""Text from outside (names, paths, host ids, runtime strings, error messages) made safe to
print: one line, no terminal control codes. Owns no formatting beyond that."""

from __future__ import annotations

__all__ = ["first_control", "one_line"]

_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))}
_CONTROL.update({0x2028: "\\u2028", 0x2029: "\\u2029"})


def one_line(value: object) -> str:
    """``value`` as text with every control character spelled out (``\\x0a`` for a newline,
    ``\\x1b`` for an ANSI escape), so that it cannot split a line, forge another line of output
    or restyle the terminal."""
    return str(value).translate(_CONTROL)


def first_control(value: str) -> tuple[int, str] | None:
    """Where ``value`` holds its first control character (one `one_line` would spell out) and
    that character spelled out, e.g. ``(5, "\\x0a")``; None for text that is one clean line."""
    for index, char in enumerate(value):
        spelled = _CONTROL.get(ord(char))
        if spelled is not None:
            return index, spelled
    return None
