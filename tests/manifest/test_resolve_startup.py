"""``resolve-artifact`` start-up: what it imports (our light modules, the standard library and,
to check a signature, cryptography), its argparse command line, and that an unchanged start
writes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import cryptography
import pytest

from manifest import envelope, host_events, hoststate, lookup, resolve
from manifest.build import per_class_documents
from manifest.signing import sign_document
from tests.manifest.factories import fixed_key
from tests.manifest.test_resolve import LINE, PUB, dump, fresh

ROOT = Path(__file__).resolve().parents[2]
SITE = str(Path(cryptography.__file__).resolve().parent.parent)

IMPORTED = {
    "manifest",
    "manifest._batch",
    "manifest.envelope",
    "manifest.errors",
    "manifest.hostruntime",
    "manifest.hoststate",
    "manifest.lookup",
    "manifest.resolve",
}
"""Our modules `import manifest.resolve` may load; anything else must be the standard library."""
RUN = IMPORTED | {"manifest.hostmatch", "schemas", "schemas.settings"}
"""Ours that a run may add (the match rules; the answer's settings)."""
THIRD_PARTY = {"cryptography", "_cffi_backend", "_openssl"}
"""What a run may load besides ours and the standard library: the signature check."""


OPTIONS = (
    *("--manifest", "--host-class", "--pubkey", "--model", "--state-dir", "--no-state"),
    *("--verify-file", "--json", "--runtime", "--providers", "--emit-telemetry", "--host-id"),
    *("--max-bytes", "--grace-days", "--max-validity-days", "--uri-schemes"),
)
"""The command line of ``resolve-artifact``, every option of it."""


def foreign(added: set[str], ours: set[str]) -> set[str]:
    """The modules of ``added`` that are neither in ``ours``, nor the standard library, nor
    `THIRD_PARTY`."""
    return {
        m
        for m in added - ours
        if m.split(".")[0] not in sys.stdlib_module_names and m.split(".")[0] not in THIRD_PARTY
    }


def _modules_after(code: str) -> set[str]:
    """Modules loaded by ``code`` beyond ``import site``, in an interpreter without site's
    start-up (``-S``: no .pth files, so no editable finder preloading pathlib and re), with
    this checkout and the installed cryptography on the path: the import set of a wheel install."""
    prelude = (
        f"import sys, site; sys.path[:0] = [{str(ROOT)!r}, {SITE!r}]; before = set(sys.modules)\n"
    )
    report = "\nprint(','.join(sorted(set(sys.modules) - before)))\n"
    out = subprocess.run(
        [sys.executable, "-S", "-c", prelude + code + report],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, "QUALIFY_STATE_DIR": "", "XDG_STATE_HOME": "/nonexistent-state"},
    )
    return set(out.stdout.strip().splitlines()[-1].split(",")) - {""}


def _class_document(tmp_path: Path, name: str) -> Path:
    doc = fresh()
    one = per_class_documents(doc["signed"])[name]
    path = tmp_path / "classes" / envelope.class_filename(name)
    path.parent.mkdir()
    path.write_bytes(envelope.encode_canonical(sign_document(one, fixed_key())))
    return path


def _run_code(path: Path, name: str, *extra: str) -> str:
    argv = ["--manifest", str(path), "--pubkey", str(PUB), "--host-class", name, "--no-state"]
    argv += ["--runtime", "onnxruntime==1.32.0", "--providers", "CPUExecutionProvider", *extra]
    return f"from manifest.resolve import main\nrc = main({argv!r})\nassert rc in (0, 3), rc"


def test_importing_resolve_loads_only_its_own_light_modules_and_the_standard_library() -> None:
    assert foreign(_modules_after("import manifest.resolve"), IMPORTED) == set()


def test_a_held_class_run_loads_the_standard_library_and_cryptography_only(
    tmp_path: Path,
) -> None:
    added = _modules_after(_run_code(_class_document(tmp_path, "arm-new"), "arm-new"))
    assert foreign(added, RUN) == set()
    assert "cryptography" in added  # the signature was checked


def test_a_resolved_run_imports_nothing_heavy(tmp_path: Path) -> None:
    added = _modules_after(_run_code(_class_document(tmp_path, "x86-vnni"), "x86-vnni", "--json"))
    assert foreign(added, RUN) == set()
    heavy = {"pydantic", "numpy", "duckdb", "onnxruntime", "pyarrow", "pandas", "click"}
    assert not heavy & {m.split(".")[0] for m in added}


# -- arguments ------------------------------------------------------------------------------


@pytest.fixture
def good(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("QUALIFY_PUBKEY", "QUALIFY_STATE_DIR", "QUALIFY_RUNTIME", "QUALIFY_PROVIDERS"):
        monkeypatch.delenv(var, raising=False)
    return dump(fresh(), tmp_path / "m.json")


def _main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = resolve.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _base(path: Path) -> list[str]:
    return ["--manifest", str(path), "--pubkey", str(PUB), "--no-state", "--runtime",
            "onnxruntime==1.32.0", "--providers", "CPUExecutionProvider"]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["stray"], "unrecognized arguments: stray"),
        (["--host-class"], "argument --host-class: expected one argument"),
        (["--host-class", "--json"], "argument --host-class: expected one argument"),
        (["--json=yes"], "argument --json: ignored explicit argument 'yes'"),
        (["--ma", "x"], "ambiguous option: --ma could match --manifest, --max-bytes"),
        (["--json"] * 200, "too many arguments (211); resolve-artifact takes at most 128"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(
    good: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, out, err = _main(capsys, *_base(good), "--host-class", "x86-vnni", *args)
    assert (code, out) == (lookup.EXIT_USAGE, "")
    assert err.count("\n") == 1 and err.startswith("resolve-artifact: error: ")
    assert message in err


def test_manifest_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _main(capsys, "--pubkey", str(PUB))
    assert code == 2 and "the following arguments are required: --manifest" in err


def test_the_last_of_a_repeated_option_wins_as_with_argparse(
    good: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _main(capsys, *_base(good), "--host-class", "nope", "--host-class", "x86-vnni")
    assert (code, out.strip()) == (0, "https://models.example/rec-int8.onnx")


def test_equals_form_and_prefixes_are_accepted(
    good: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _main(capsys, *_base(good), "--host-cl=x86-vnni", "--js")
    assert code == 0 and json.loads(out)["host_class"] == "x86-vnni"


def test_a_value_may_start_with_a_dash_in_the_equals_form(
    good: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _main(capsys, *_base(good), "--host-class=-odd")
    assert code == lookup.EXIT_UNKNOWN and "'-odd' is not in manifest" in err


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_lists_every_option_and_exits_0(capsys: pytest.CaptureFixture[str], flag: str) -> None:
    code, out, err = _main(capsys, flag)
    assert (code, err) == (0, "") and out.startswith("usage: resolve-artifact --manifest PATH")
    for option in OPTIONS:
        assert f"  {option} " in out or f"  {option}\n" in out, option


def test_an_empty_environment_default_counts_as_unset(
    good: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QUALIFY_PUBKEY", "")
    code, _, err = _main(capsys, "--manifest", str(good), "--host-class", "x86-vnni")
    assert code == 2 and "no trusted key" in err


# -- state -------------------------------------------------------------------------------------


def test_an_unchanged_start_writes_no_state_file(
    good: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    state = tmp_path / "state"
    argv = [*_base(good)[:4], "--state-dir", str(state), *_base(good)[5:], "--host-class"]
    assert _main(capsys, *argv, "x86-vnni")[0] == 0
    files = sorted(state.rglob("*"))
    stamps = [(p.name, p.stat().st_mtime_ns, p.stat().st_ino) for p in files]
    assert [p.relative_to(state).as_posix() for p in files] == [
        LINE,
        f"{LINE}/{hoststate.LKG_FILE}",
        f"{LINE}/{hoststate.STATE_FILE}",
    ]
    assert _main(capsys, *argv, "x86-vnni")[0] == 0
    again = sorted(state.rglob("*"))
    assert [(p.name, p.stat().st_mtime_ns, p.stat().st_ino) for p in again] == stamps


def test_time_and_pointer_patterns() -> None:
    assert envelope.TIME_RE.fullmatch("2026-01-01T00:00:00Z")
    assert [envelope.is_pointer(t) for t in ("v1", "v12\n", "v", "v1\n\n", "x1", "v1 ")] == [
        True,
        True,
        False,
        False,
        False,
        False,
    ]


@pytest.mark.parametrize(
    ("text", "valid"),
    [
        ("2024-02-29T23:59:59Z", True),
        ("2023-02-29T00:00:00Z", False),
        ("2026-13-01T00:00:00Z", False),
        ("2026-01-01T24:00:00Z", False),
        ("2026-1-01T00:00:00Z", False),
        ("2026-01-01T00:00:00Z\n", False),
        ("\uff12\uff10\uff12\uff16-01-01T00:00:00Z", False),
    ],
)
def test_parse_time_takes_the_one_format_and_real_times_only(text: str, valid: bool) -> None:
    if valid:
        assert envelope.format_time(envelope.parse_time(text)) == text
    else:
        with pytest.raises(ValueError):
            envelope.parse_time(text)


@pytest.mark.parametrize("env", [None, "host-7"])
def test_default_host_id_is_host_events_host_id(
    monkeypatch: pytest.MonkeyPatch, env: str | None
) -> None:
    if env is None:
        monkeypatch.delenv("QUALIFY_HOST_ID", raising=False)
    else:
        monkeypatch.setenv("QUALIFY_HOST_ID", env)
    assert resolve._default_host_id() == host_events.host_id()
