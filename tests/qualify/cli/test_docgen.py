"""Every command has help, and the README's CLI reference is what the commands say."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from qualify.cli import cli
from qualify.cli.docgen import README, _walk, cli_reference, glossary, render_readme

COMMANDS = [" ".join(path[1:]) for path, _ in _walk(cli, ["qualify"])]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command: str) -> None:
    result = CliRunner().invoke(cli, [*command.split(), "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) >= 3, f"'{command}' has no description"


def test_readme_cli_reference_matches_the_commands() -> None:
    current = README.read_text(encoding="utf-8")
    assert render_readme(current, cli_reference()) == current, (
        "README.md's CLI reference is stale: run `make docs`"
    )


def test_readme_glossary_is_the_gates_table_and_the_reason_codes() -> None:
    from manifest.gates import GATES
    from schemas.reasons import REASONS

    current = README.read_text(encoding="utf-8")
    assert render_readme(current, cli_reference(), glossary()) == current, (
        "README.md's glossary is stale: run `make docs`"
    )
    for code, meaning in REASONS.items():
        assert current.count(f"| `{code}` | {meaning} |") == 1, code
    for gate in GATES:
        assert f"| {gate.name} | {gate.meaning} |" in current
