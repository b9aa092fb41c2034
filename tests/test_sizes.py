"""Sizes a reader can hold: no function over a screen, no module over 800 lines.

A function's size is its lines without its docstring (the docstring is what a reader wants more
of, not less); a module's is its lines. The allow-lists are short and say why each one stays;
an entry that no longer needs its place fails too, so the lists only ever shrink.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("schemas", "matrix", "manifest", "qualify", "reports")
FUNCTION_MOST_LINES = 60
MODULE_MOST_LINES = 800

LONG_FUNCTIONS: dict[str, str] = {}
"""``path:qualified name`` -> why it stays longer than a screen."""

LONG_MODULES: dict[str, str] = {}
"""``path`` -> why it stays longer than 800 lines, and what splits it next."""


def _docstring_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    first = node.body[0] if node.body else None
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        return (first.end_lineno or first.lineno) - first.lineno + 1
    return 0


def function_sizes(source: str) -> dict[str, int]:
    """Every function and method of ``source`` (nested ones too) by qualified name, with its
    lines less its docstring's."""
    sizes: dict[str, int] = {}

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = prefix + child.name
                lines = (child.end_lineno or child.lineno) - child.lineno + 1
                sizes[name] = lines - _docstring_lines(child)
                walk(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                walk(child, prefix + child.name + ".")
            else:
                walk(child, prefix)

    walk(ast.parse(source), "")
    return sizes


def _sources() -> list[Path]:
    return [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]


def _measure() -> tuple[dict[str, int], dict[str, int]]:
    functions: dict[str, int] = {}
    modules: dict[str, int] = {}
    for path in _sources():
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text(encoding="utf-8")
        modules[rel] = len(text.splitlines())
        for name, size in function_sizes(text).items():
            functions[f"{rel}:{name}"] = size
    return functions, modules


FUNCTIONS, MODULES = _measure()


def test_the_size_walk_counts_a_function_without_its_docstring_and_finds_methods() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(61))
    source = (
        f'def long():\n    """Doc.\n\n    More.\n    """\n{body}\n'
        f"class C:\n    def short(self):\n        return 1\n"
    )
    sizes = function_sizes(source)
    assert sizes == {"long": 62, "C.short": 2}
    assert sizes["long"] > FUNCTION_MOST_LINES


def test_no_function_is_over_a_screen() -> None:
    over = {
        name: size
        for name, size in FUNCTIONS.items()
        if size > FUNCTION_MOST_LINES and name not in LONG_FUNCTIONS
    }
    assert not over, (
        f"functions over {FUNCTION_MOST_LINES} lines (docstring not counted): split them, or "
        f"say in LONG_FUNCTIONS why not: {dict(sorted(over.items()))}"
    )


def test_no_module_is_over_800_lines() -> None:
    over = {
        path: size
        for path, size in MODULES.items()
        if size > MODULE_MOST_LINES and path not in LONG_MODULES
    }
    assert not over, (
        f"modules over {MODULE_MOST_LINES} lines: split them by what they own, or say in "
        f"LONG_MODULES why not: {dict(sorted(over.items()))}"
    )


@pytest.mark.parametrize(
    ("allowed", "found", "limit"),
    [(LONG_FUNCTIONS, FUNCTIONS, FUNCTION_MOST_LINES), (LONG_MODULES, MODULES, MODULE_MOST_LINES)],
    ids=["functions", "modules"],
)
def test_the_allow_lists_hold_only_what_still_needs_them(
    allowed: dict[str, str], found: dict[str, int], limit: int
) -> None:
    stale = sorted(name for name in allowed if found.get(name, 0) <= limit)
    assert not stale, f"no longer over {limit} lines (or gone): remove from the list: {stale}"
