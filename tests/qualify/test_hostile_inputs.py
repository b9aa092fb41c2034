"""Hostile project files and command-line values: each is exit 2, one line naming the problem
and its fix, no traceback, and nothing written (no matrix, no bundle, no store)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qualify.cli import cli
from tests.qualify.project.test_load import VALID, write_tree


def _bomb(_: str) -> str:
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for i in range(8):
        prev, name = chr(97 + i), chr(98 + i)
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n"


EDITS: dict[str, tuple[Callable[[str], str], str]] = {
    "alias bomb": (_bomb, "aliases are expanded"),
    "nested 20,000 deep": (lambda t: "a: " + "[" * 20_000 + "]" * 20_000 + "\n", "levels deep"),
    "block nesting": (
        lambda t: "".join(f"{' ' * i}k{i}:\n" for i in range(200)) + " " * 200 + "v: 1\n",
        "levels deep",
    ),
    "p99 .inf": (lambda t: t.replace("p99_ms: 40", "p99_ms: .inf"), "finite"),
    "p99 .nan": (lambda t: t.replace("p99_ms: 40", "p99_ms: .nan"), "finite"),
    "shape too large": (
        lambda t: t.replace(
            "shape: [1, 3, 8, 8], dtype: float32, source: recorded, file: data/x.npy",
            "shape: [1, 100000, 100000, 100], source: generated",
        ),
        "GiB",
    ),
    "markup in an artifact name": (
        lambda t: t.replace(
            "precision: int8, derived_from", "name: 'int8[/]', precision: int8, derived_from"
        ),
        "is not a name",
    ),
    "space in a class name": (
        lambda t: t.replace("  x86-avx2:\n", "  x86 avx2:\n"),
        "is not a name",
    ),
    "newline in a class name": (
        lambda t: t.replace("  x86-avx2:\n", '  "x86\\navx2":\n'),
        "is not a name",
    ),
    "markup in a key label": (
        lambda t: t.replace("hardware: x86-avx2", "hardware: '[red]x'"),
        "is not a name",
    ),
    "not UTF-8": (lambda t: t.replace("ocr-rec", "ocr-\udcff"), "UTF-8"),
    "2 MB of text": (lambda t: t + "# " + "x" * 2_100_000 + "\n", "larger than"),
    "a memory limit of 10^30 MB": (
        lambda t: t.replace(
            "      p99_ms: 40\n", "      p99_ms: 40\n      memory_limit_mb: 1" + "0" * 30 + "\n"
        ),
        "budgets.memory_limit_mb: must be at most 16777216",
    ),
    "a memory limit of .inf": (
        lambda t: t.replace(
            "      p99_ms: 40\n", "      p99_ms: 40\n      memory_limit_mb: .inf\n"
        ),
        "memory_limit_mb",
    ),
    "a soak longer than the timeout": (
        lambda t: t.replace("  concurrency: [1, 2]\n", "  concurrency: [1, 2]\n  soak_s: 600\n"),
        "workload.soak_s (600 s) is not shorter than budgets.timeout_s (300 s)",
    ),
    "an open loop longer than the timeout": (
        lambda t: t.replace(
            "  concurrency: [1, 2]\n",
            "  concurrency: [1, 2]\n  open_loop: {probes: 20, probe_s: 30}\n",
        ),
        "takes 600 s, not less than budgets.timeout_s (300 s)",
    ),
}


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


@pytest.mark.parametrize("case", sorted(EDITS))
def test_hostile_project_file_is_exit_2_one_line_and_writes_nothing(
    tmp_path: Path, case: str
) -> None:
    edit, expected = EDITS[case]
    project = write_tree(tmp_path / "p")
    text = edit(VALID)
    project.write_bytes(text.encode("utf-8", "surrogateescape"))
    before = sorted(p.name for p in project.parent.iterdir())
    code, output = _run(
        "run",
        "--host-class",
        "x86-avx2",
        "--project",
        str(project),
        "--emulate",
        "--db",
        str(project.parent / "qualify.duckdb"),
    )
    assert code == 2, output
    assert "Traceback" not in output
    assert output.startswith("error: ") and expected in output, output
    assert output.count("\n") == 1, output
    assert sorted(p.name for p in project.parent.iterdir()) == before


@pytest.mark.parametrize("path", ["/dev/zero", "/proc/self/status"])
def test_a_device_or_proc_file_as_the_project_is_refused(path: str) -> None:
    code, output = _run("matrix", "show", "--project", path)
    assert code == 2 and "Traceback" not in output and output.startswith("error: ")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            [
                "manifest",
                "generate",
                "--publish",
                "--unsigned",
                "--release",
                "r",
                "--expires",
                "99999999999d",
            ],
            "--expires",
        ),
        (
            [
                "manifest",
                "generate",
                "--publish",
                "--unsigned",
                "--release",
                "r",
                "--expires",
                "400d",
            ],
            "366",
        ),
        (
            [
                "manifest",
                "generate",
                "--publish",
                "--unsigned",
                "--release",
                "r",
                "--expires",
                "-3d",
            ],
            "--expires",
        ),
        (["telemetry", "check", "--tolerance", "nan"], "--tolerance"),
        (["telemetry", "check", "--tolerance", "inf"], "--tolerance"),
        (["telemetry", "check", "--min-samples", "-5"], "--min-samples"),
        (["telemetry", "check", "--since", "99999999999d"], "--since"),
        (["matrix", "show", "--db", "/proc/nope/x.duckdb"], "/proc/nope/x.duckdb"),
    ],
)
def test_bad_command_line_values_are_one_line_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], expected: str
) -> None:
    monkeypatch.chdir(tmp_path)
    project = write_tree(tmp_path)
    code, output = _run(*args, *(["--project", str(project)] if args[0] == "manifest" else []))
    assert code == 2, output
    assert "Traceback" not in output and output.startswith("error: "), output
    assert expected in output and output.count("\n") == 1, output


@pytest.mark.parametrize(
    "content",
    [b"[1, 2]", b"{}", b"[" * 100_000, b'{"signatures":[],"signed":' + b"[" * 100_000, b"\xff"],
)
def test_manifest_commands_refuse_what_is_not_a_manifest(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "m.json"
    path.write_bytes(content)
    pub = tmp_path / "k.pub"
    pub.write_text(
        "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=\n"
        "-----END PUBLIC KEY-----\n"
    )
    for args in (
        ["manifest", "verify", str(path), "--pubkey", str(pub)],
        ["manifest", "show", str(path)],
    ):
        code, output = _run(*args)
        assert code == 2, output
        assert "Traceback" not in output and re.match(r"error: .*m\.json", output), output


def _numeric_options() -> list[tuple[list[str], str]]:
    """(command path, option) of every int or float option of the command line, found by
    walking it: an option added later is covered without editing this test."""
    import click

    found: list[tuple[list[str], str]] = []

    def walk(command: click.Command, path: list[str]) -> None:
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                walk(sub, [*path, name])
            return
        for param in command.params:
            kind = param.type
            if isinstance(kind, click.types.FloatParamType | click.types.IntParamType):
                found.append((path, param.opts[0]))

    walk(cli, [])
    return found


def _required(path: list[str]) -> list[str]:
    """Values for the command's required arguments and options (parsing stops at the bad one)."""
    import click

    command: click.Command = cli
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    args: list[str] = []
    for param in command.params:
        if param.required and isinstance(param, click.Argument):
            args.append("x")
        elif param.required:
            args += [param.opts[0], "x"]
    return args


NUMERIC = _numeric_options()


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e309", "NaN"])
@pytest.mark.parametrize(("path", "option"), NUMERIC, ids=[" ".join([*p, o]) for p, o in NUMERIC])
def test_non_finite_values_at_every_numeric_option_are_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: list[str], option: str, value: str
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, [*path, f"{option}={value}", *_required(path)])
    assert result.exit_code == 2, result.output
    assert option in result.output and "Traceback" not in result.output, result.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e309"])
@pytest.mark.parametrize("option", ["--grace-days", "--max-validity-days", "--max-bytes"])
def test_non_finite_values_at_resolve_artifacts_numeric_options_are_refused(
    capsys: pytest.CaptureFixture[str], option: str, value: str
) -> None:
    from manifest import resolve

    assert resolve.main(["--manifest", "m.json", option, value]) == 2
    err = capsys.readouterr().err
    assert option in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        (["--soak", "10m"], "--soak (600 s) is not shorter than budgets.timeout_s (300 s)"),
        (["--open-loop"], "--open-loop (7 probes of at least 50 s each"),
    ],
)
def test_a_soak_or_open_loop_asked_on_the_command_line_that_outlasts_the_timeout_is_refused(
    tmp_path: Path, option: list[str], expected: str
) -> None:
    text = VALID.replace("      p99_ms: 40\n", "      p99_ms: 1000\n")  # init's placeholder
    project = write_tree(tmp_path / "p", text)
    before = sorted(p.name for p in project.parent.iterdir())
    code, output = _run(
        "run",
        "--host-class",
        "x86-avx2",
        "--emulate",
        "--project",
        str(project),
        "--db",
        str(project.parent / "qualify.duckdb"),
        *option,
    )
    assert code == 2, output
    assert output.startswith(f"error: {project}: host class 'x86-avx2' with {option[0]}")
    assert expected in output and output.count("\n") == 1, output
    assert sorted(p.name for p in project.parent.iterdir()) == before


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    case=st.sampled_from(NUMERIC),
    value=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.text(max_size=40),
        st.sampled_from(["nan", "-nan", "+inf", "Infinity", "1e999", "0x10", "1_000", " 1"]),
    ),
)
def test_any_value_at_a_numeric_option_is_a_clean_answer_never_a_traceback(
    tmp_path: Path, case: tuple[list[str], str], value: str
) -> None:
    path, option = case
    with contextlib.chdir(tmp_path):
        result = CliRunner().invoke(cli, [*path, f"{option}={value}", *_required(path)])
    # Nothing here can succeed (no project, no matrix, "x" for every required value): whatever
    # the value, a one-line refusal, never a bug's exit 70.
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "internal error" not in result.output
    assert list(tmp_path.iterdir()) == []
