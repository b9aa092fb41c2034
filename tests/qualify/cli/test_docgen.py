"""Every command has help, and docs/cli.md and the glossary are what the code says."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from qualify.cli import cli
from qualify.cli.docgen import (
    CLI_DOC,
    CONCEPTS,
    _walk,
    cli_doc,
    cli_reference,
    glossary,
    render_concepts,
)

COMMANDS = [" ".join(path[1:]) for path, _ in _walk(cli, ["qualify"])]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command: str) -> None:
    result = CliRunner().invoke(cli, [*command.split(), "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) >= 3, f"'{command}' has no description"


def test_cli_doc_is_what_the_commands_say() -> None:
    assert CLI_DOC.read_text(encoding="utf-8") == cli_doc(cli_reference()), (
        "docs/cli.md is stale: run `make docs`"
    )


def test_cli_doc_has_every_command() -> None:
    current = CLI_DOC.read_text(encoding="utf-8")
    for command in COMMANDS:
        assert f"## `{' '.join(['qualify', *command.split()])}`" in current, command


def test_glossary_is_the_gates_table_and_the_reason_codes() -> None:
    from manifest.gates import GATES
    from schemas.reasons import REASONS

    current = CONCEPTS.read_text(encoding="utf-8")
    assert render_concepts(current, glossary()) == current, (
        "docs/concepts.md's glossary is stale: run `make docs`"
    )
    for code, meaning in REASONS.items():
        assert current.count(f"| `{code}` | {meaning} |") == 1, code
    for gate in GATES:
        assert f"| {gate.name} | {gate.meaning} |" in current


def test_the_readme_links_the_generated_pages() -> None:
    readme = (CLI_DOC.parents[1] / "README.md").read_text(encoding="utf-8")
    assert "(docs/cli.md)" in readme and "(docs/concepts.md)" in readme
