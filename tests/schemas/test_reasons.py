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
