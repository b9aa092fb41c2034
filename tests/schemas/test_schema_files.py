"""The published JSON Schema files: committed, current, valid and fully described."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from pydantic import Field

from schemas.base import Document
from schemas.generate import (
    DOCUMENTS,
    JSON_SCHEMA_DIALECT,
    SCHEMA_DIR,
    generate,
    load_model,
    main,
    render_schema,
    undescribed_fields,
)


class _Inner(Document):
    """A nested model with one field nobody described."""

    described: int = Field(description="Has one.")
    bare: int


class _Outer(Document):
    """A registered model whose own fields are described."""

    inner: list[_Inner] | None = Field(default=None, description="Nested through a list.")


_OUTER = f"{__name__}:_Outer"


def test_committed_schema_files_match_a_regeneration() -> None:
    stale = generate(check=True)
    assert stale == [], (
        f"stale JSON Schema files in {SCHEMA_DIR}: {', '.join(stale)}. "
        "Regenerate them with: python -m schemas.generate"
    )


def test_every_field_of_every_document_is_described() -> None:
    missing = undescribed_fields()
    assert missing == [], (
        "these fields have no description, so the published schema does not explain them: "
        + ", ".join(missing)
    )


def test_undescribed_field_of_a_nested_model_is_found() -> None:
    assert undescribed_fields([("outer.schema.json", _OUTER)]) == ["_Inner.bare"]


def test_every_registered_document_has_a_valid_2020_12_schema_file() -> None:
    for filename, dotted in DOCUMENTS:
        schema = json.loads((SCHEMA_DIR / filename).read_text(encoding="utf-8"))
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["$schema"] == JSON_SCHEMA_DIALECT
        assert schema["$id"].endswith(filename.removesuffix(".schema.json"))
        assert schema["title"] == load_model(dotted).__name__
        assert schema["additionalProperties"] is False


def test_rendering_is_deterministic_with_sorted_keys_and_a_final_newline() -> None:
    model = load_model("schemas.project:Project")
    first = render_schema("project.schema.json", model)
    assert first == render_schema("project.schema.json", model)
    assert first.endswith("}\n")
    assert list(json.loads(first)) == sorted(json.loads(first))


def test_check_names_stale_and_missing_files_and_writes_nothing(tmp_path: Path) -> None:
    registry = [("project.schema.json", "schemas.project:Project"), ("outer.schema.json", _OUTER)]
    assert generate(check=True, directory=tmp_path, documents=registry) == [
        "outer.schema.json",
        "project.schema.json",
    ]
    assert list(tmp_path.iterdir()) == []


def test_generate_writes_then_reports_nothing_stale(tmp_path: Path) -> None:
    registry = [("outer.schema.json", _OUTER)]
    assert generate(directory=tmp_path, documents=registry) == ["outer.schema.json"]
    assert generate(check=True, directory=tmp_path, documents=registry) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outer.schema.json"]


def test_edited_file_is_stale_until_regenerated(tmp_path: Path) -> None:
    registry = [("outer.schema.json", _OUTER)]
    generate(directory=tmp_path, documents=registry)
    target = tmp_path / "outer.schema.json"
    target.write_text(target.read_text(encoding="utf-8").replace("Nested", "Edited"))
    assert generate(check=True, directory=tmp_path, documents=registry) == ["outer.schema.json"]
    assert generate(directory=tmp_path, documents=registry) == ["outer.schema.json"]
    assert "Nested through a list." in target.read_text(encoding="utf-8")


def test_schema_file_of_an_unregistered_document_is_stale_and_removed(tmp_path: Path) -> None:
    registry = [("outer.schema.json", _OUTER)]
    generate(directory=tmp_path, documents=registry)
    (tmp_path / "gone.schema.json").write_text("{}\n")
    (tmp_path / "notes.json").write_text("{}\n")
    assert generate(check=True, directory=tmp_path, documents=registry) == ["gone.schema.json"]
    assert generate(directory=tmp_path, documents=registry) == ["gone.schema.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.json", "outer.schema.json"]


@pytest.mark.parametrize("dotted", ["schemas.project", "schemas.project:Nope", "json:loads"])
def test_load_model_refuses_what_is_not_a_model(dotted: str) -> None:
    with pytest.raises(ValueError, match=r"module:Class|pydantic model"):
        load_model(dotted)


def test_check_command_exits_zero_on_the_committed_files(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--check"]) == 0
    assert "up to date" in capsys.readouterr().out
