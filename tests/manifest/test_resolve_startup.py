"""``resolve-artifact`` start-up (issue 15): what it imports, its hand-written argument parser, the
light stand-ins it uses for ``json``, ``re``, ``datetime``, ``fnmatch`` and ``typing.NamedTuple``
(each checked against the original), and that an unchanged start writes nothing."""

from __future__ import annotations

import binascii
import fnmatch
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import cryptography
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from manifest import envelope, host_events, hostmatch, resolve
from manifest.build import per_class_documents
from manifest.signing import sign_document
from tests.manifest.factories import fixed_key
from tests.manifest.test_resolve import LINE, PUB, dump, fresh

ROOT = Path(__file__).resolve().parents[2]
SITE = str(Path(cryptography.__file__).resolve().parent.parent)

# What `import manifest.resolve` may add to an interpreter that has only imported `site`.
IMPORTED = {
    "__future__",
    "gc",
    "manifest",
    "manifest.envelope",
    "manifest.errors",
    "manifest.hoststate",
    "manifest.resolve",
}
# What a run on a per-class document may add on top: the C JSON scanner, CPython's SHA-256 and
# cryptography's compiled core (no typing, re, enum, json, pathlib, datetime or hashlib).
CRYPTO_CORE = {
    "_cffi_backend",
    "_openssl",  # registered by the compiled core itself
    "_openssl.lib",
    "cryptography",
    "cryptography.__about__",
    "cryptography.hazmat",
    "cryptography.hazmat.bindings",
    "cryptography.hazmat.bindings._rust",
    "types",
}
RUN = IMPORTED | CRYPTO_CORE | {"_json"}
SHA = {"_sha256", "_sha2"}  # CPython 3.11 / 3.12 and later


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


def test_importing_resolve_loads_only_its_own_light_modules() -> None:
    assert _modules_after("import manifest.resolve") <= IMPORTED


def test_a_held_class_run_loads_only_the_crypto_core_and_the_json_scanner(tmp_path: Path) -> None:
    added = _modules_after(_run_code(_class_document(tmp_path, "arm-new"), "arm-new"))
    assert added - SHA <= RUN, f"more than the floor: {sorted(added - SHA - RUN)}"


def test_a_resolved_run_adds_only_the_settings_module_and_what_it_imports(tmp_path: Path) -> None:
    settings = _modules_after("import schemas.settings")  # typing, until settings.py drops it
    added = _modules_after(_run_code(_class_document(tmp_path, "x86-vnni"), "x86-vnni", "--json"))
    assert added - SHA <= RUN | settings, f"unexpected: {sorted(added - SHA - RUN - settings)}"
    assert not {"json", "re", "pathlib", "argparse", "datetime", "hashlib", "fnmatch"} & (
        added - settings
    )


def test_the_direct_ed25519_path_is_taken_where_the_installed_cryptography_has_it() -> None:
    try:
        from cryptography.hazmat.bindings._rust import openssl

        direct = openssl.ed25519.from_public_bytes
    except (ImportError, AttributeError):  # a release that moved its core: the public class
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        assert envelope._ed25519_loader() == Ed25519PublicKey.from_public_bytes
        pytest.skip("this cryptography release has no compiled ed25519 core where expected")
    assert envelope._ed25519_loader() is direct


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
        (["--", "--json"], "unrecognized arguments: --json"),
        (["--ma", "x"], "ambiguous option: --ma could match --manifest, --max-bytes"),
        (["--json"] * 200, "too many arguments (211); resolve-artifact takes at most 128"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(
    good: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, out, err = _main(capsys, *_base(good), "--host-class", "x86-vnni", *args)
    assert (code, out) == (resolve.EXIT_USAGE, "")
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


def test_equals_form_prefixes_and_a_final_double_dash_are_accepted(
    good: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _main(capsys, *_base(good), "--host-cl=x86-vnni", "--js", "--")
    assert code == 0 and json.loads(out)["host_class"] == "x86-vnni"


def test_a_value_may_start_with_a_dash_in_the_equals_form(
    good: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _main(capsys, *_base(good), "--host-class=-odd")
    assert code == resolve.EXIT_UNKNOWN and "'-odd' is not in manifest" in err


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_lists_every_option_and_exits_0(capsys: pytest.CaptureFixture[str], flag: str) -> None:
    code, out, err = _main(capsys, flag)
    assert (code, err) == (0, "") and out.startswith("usage: resolve-artifact --manifest PATH")
    for option in (*resolve._FLAGS, *resolve._VALUES):
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
        f"{LINE}/{resolve.LKG_FILE}",
        f"{LINE}/{resolve.STATE_FILE}",
    ]
    assert _main(capsys, *argv, "x86-vnni")[0] == 0
    again = sorted(state.rglob("*"))
    assert [(p.name, p.stat().st_mtime_ns, p.stat().st_ino) for p in again] == stamps


# -- the light stand-ins, against the originals --------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b'{"a":[1,2,{"b":null}],"c":true,"d":"\\u00e9\\ud800x","e":-12345678901234567890}',
        b'  {"a": 1}\n',
        b'{"a":1} x',
        b'{"a":NaN}',
        b'{"a":1e400}',
        b'"\xed\xa0\x80"',
        b"\xef\xbb\xbf{}",
        '{"a":1}'.encode("utf-16-le"),
        b"",
        b"   ",
        b"[" * 100_000,
        b'{"a":"\xff"}',
        b'{"a":1,"a":2}',
    ],
)
def test_loads_strict_answers_as_json_loads(data: bytes) -> None:
    def original(raw: bytes) -> Any:
        try:
            return ("ok", json.loads(raw, parse_constant=envelope._bad_constant))
        except RecursionError:
            return ("error", ValueError)
        except ValueError as exc:
            return ("error", type(exc))

    try:
        got: Any = ("ok", envelope.loads_strict(data))
    except ValueError as exc:
        got = ("error", ValueError if isinstance(exc.__cause__, RecursionError) else type(exc))
    assert got == original(data)


@pytest.mark.parametrize(
    "text",
    [
        "1970-01-01T00:00:00Z",
        "2024-02-29T23:59:59Z",
        "2023-02-29T00:00:00Z",
        "2100-02-29T00:00:00Z",
        "2000-02-29T12:00:00Z",
        "0001-01-01T00:00:00Z",
        "0000-01-01T00:00:00Z",
        "9999-12-31T23:59:59Z",
        "2026-04-31T00:00:00Z",
        "2026-13-01T00:00:00Z",
        "2026-01-01T24:00:00Z",
        "2026-01-01T00:60:00Z",
        "2026-01-01T00:00:60Z",
        "2026-01-01T00:00:00Z\n",
        "2026-01-01 00:00:00Z",
        "\uff12\uff10\uff12\uff16-01-01T00:00:00Z",
        "",
    ],
)
def test_seconds_of_agrees_with_parse_time(text: str) -> None:
    try:
        want: int | None = int(envelope.parse_time(text).timestamp())
    except ValueError:
        want = None
    try:
        got: int | None = envelope.seconds_of(text)
    except ValueError:
        got = None
    assert got == want


def test_time_and_pointer_patterns_still_load_on_demand() -> None:
    assert envelope.TIME_RE.fullmatch("2026-01-01T00:00:00Z")
    for text in ("v1", "v12\n", "v", "v1\n\n", "x1", "v" + "9" * 20, "v\uff11", "v1 "):
        assert envelope.is_pointer(text) == bool(envelope.POINTER_RE.fullmatch(text)), text


@pytest.mark.parametrize("size", [0, 32, 100_000, 300_000])
def test_sha256_hex_is_sha256(size: int) -> None:
    data = os.urandom(size)
    assert envelope.sha256_hex(data) == hashlib.sha256(data).hexdigest()


def test_direct_and_public_ed25519_verification_agree() -> None:
    key = Ed25519PrivateKey.generate()
    raw = key.public_key().public_bytes_raw()
    sig = key.sign(b"data")
    assert envelope.verify_signature(raw, sig, b"data")
    assert not envelope.verify_signature(raw, sig, b"date")
    assert not envelope.verify_signature(raw, sig[:-1] + bytes([sig[-1] ^ 1]), b"data")
    assert not envelope.verify_signature(raw[:31], sig, b"data")


@pytest.mark.parametrize("pattern", ["1.32.*", "*", "1.3?.0", "1.32.0", "*.0", "1*2*3", "", "**"])
@pytest.mark.parametrize("version", ["1.32.0", "1.32.10", "1.31.2", "1*2", "", "1.32.0rc1"])
def test_version_patterns_match_as_fnmatch(pattern: str, version: str) -> None:
    assert resolve._version_matches(version, pattern) == fnmatch.fnmatchcase(version, pattern)


def test_json_answer_is_what_json_dumps_writes() -> None:
    answer = {
        "host_class": 'q"uote\\é\u2028\x01',
        "n": [1, -2, True, False, None, {"z": [], "a": {}}],
        "release": {"x": 1.5},  # a float: left to json itself
    }
    assert resolve._dumps(answer) == json.dumps(answer, sort_keys=True)
    del answer["release"]
    assert resolve._dumps(answer) == json.dumps(answer, sort_keys=True)


@settings(max_examples=500, deadline=None)
@given(
    st.text(
        alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=é -", max_size=12
    )
)
def test_plain_base64_decodes_as_binascii_or_leaves_it_to_binascii(text: str) -> None:
    try:
        expected: bytes | None = binascii.a2b_base64(
            text.encode("ascii", "replace"), strict_mode=True
        )
    except ValueError:
        expected = None
    got = envelope._plain_base64(text)
    assert got is None or got == expected


@given(st.binary(min_size=1, max_size=60))
def test_plain_base64_reads_every_padded_encoding(data: bytes) -> None:
    assert envelope._plain_base64(binascii.b2a_base64(data, newline=False).decode()) == data


def test_light_named_tuples_behave_as_named_tuples() -> None:
    record = resolve.Accepted(3, "qualify-manifest", None, digest="ab")
    assert record == (3, "qualify-manifest", None, "ab", None) and record.version == 3
    assert record._replace(version=4).version == 4 and record._asdict()["digest"] == "ab"
    assert record.signature is None  # a default
    assert repr(record) == (
        "Accepted(version=3, kind='qualify-manifest', host_class=None, digest='ab', signature=None)"
    )
    facts = hostmatch.HostFacts("x86_64", None, frozenset(), 4, None)
    assert facts.providers == frozenset() and facts.cores == 4
    with pytest.raises(TypeError, match="missing argument 'digest'"):
        resolve.Accepted(1, None, None)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected"):
        resolve.Accepted(1, None, None, None, extra=1)  # type: ignore[call-arg]


@pytest.mark.parametrize("env", [None, "host-7"])
def test_default_host_id_is_host_events_host_id(
    monkeypatch: pytest.MonkeyPatch, env: str | None
) -> None:
    if env is None:
        monkeypatch.delenv("QUALIFY_HOST_ID", raising=False)
    else:
        monkeypatch.setenv("QUALIFY_HOST_ID", env)
    assert resolve._default_host_id() == host_events.host_id()
