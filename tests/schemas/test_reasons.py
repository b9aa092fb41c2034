"""One table of reason codes: every document that carries a code gives it the table's meaning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from schemas.cell import Reason
from schemas.reasons import REASONS

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


@pytest.mark.parametrize(
    "name",
    [
        "cell.schema.json",
        "run-bundle.schema.json",
        "manifest.schema.json",
        "class-manifest.schema.json",
    ],
)
def test_every_published_schema_lists_each_code_once_with_the_tables_meaning(name: str) -> None:
    reason = json.loads((SCHEMAS / name).read_text())["$defs"]["Reason"]["properties"]["code"]
    assert reason["enum"] == list(REASONS)
    for code, meaning in REASONS.items():
        assert reason["description"].count(f"{code}: {meaning}") == 1, code


def test_a_reason_code_outside_the_table_is_refused_by_name() -> None:
    with pytest.raises(ValidationError, match="unknown reason code 'made_up'"):
        Reason(code="made_up", message="x")
    assert Reason(code="hold", message="x").code == "hold"


def _codes_made_in(path: Path) -> list[tuple[int, object]]:
    """Every ``Reason(...)`` call in a module and the code it passes (a string literal, or
    the expression's node when the code is computed)."""
    import ast

    found: list[tuple[int, object]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "Reason"
        ):
            continue
        given = [k.value for k in node.keywords if k.arg == "code"]
        assert given, f"{path.name}:{node.lineno}: Reason without a code"
        code = given[0]
        found.append((node.lineno, code.value if isinstance(code, ast.Constant) else code))
    return found


@pytest.mark.parametrize(
    "module",
    ["manifest/policy.py", "manifest/gates.py", "manifest/verdict.py", "manifest/rollback.py"],
)
def test_every_reason_the_code_makes_names_a_code_of_the_table(module: str) -> None:
    # Validation refuses an unknown code only when the line runs; holding each literal to the
    # table here also covers the branches no test reaches. Computed codes are a reason's own
    # code passed on, or a gate's "<code>_missing"/"<code>_over_budget" (held to the gate's
    # codes by test_gates).
    made = _codes_made_in(SCHEMAS.parent / module)
    assert made, f"{module}: no Reason(...) call found; does it still make reasons?"
    literals = [(line, code) for line, code in made if isinstance(code, str)]
    assert len(literals) >= len(made) // 2
    for line, code in literals:
        assert code in REASONS, f"{module}:{line}: {code!r} is not in schemas.reasons.REASONS"


def test_every_code_that_makes_a_verdict_stale_is_in_the_table() -> None:
    from manifest.verdict import STALE_CODES

    assert set(STALE_CODES) <= set(REASONS)
