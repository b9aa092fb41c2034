"""``resolve-artifact``'s state per model line and signing key (``manifest.hoststate``): one host
serving several models keeps a floor and a last-known-good for each, an older version of the
same line is still refused (and the refusal says where its floor is kept), a state directory of
the earlier one-file layout keeps protecting its line after the upgrade, and a per-class
directory's ``current`` pointer must name the version inside the document it points at."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from manifest import envelope, hoststate, lookup, resolve
from manifest.perclass import write_per_class
from manifest.signing import public_raw, sign_document
from tests.manifest.factories import GOLDEN, fixed_key, scenario, signed_manifest

PUB = GOLDEN / "test.pub"
NOW = datetime.now(UTC).replace(microsecond=0)
KEYID = envelope.key_id(public_raw(fixed_key().public_key()))
URI = "https://models.example/rec-int8.onnx"


def release(model: str, version: int, *, key: Ed25519PrivateKey | None = None) -> bytes:
    """Manifest ``version`` of model line ``model`` (the scenario's fleet), signed now."""
    doc = signed_manifest(
        scenario(), fixed_key(), version=version, created=NOW - timedelta(hours=1)
    )
    signed = {**doc["signed"], "model": model, "release": f"{model}-{version}"}
    return envelope.encode_canonical(sign_document(signed, key or fixed_key()))


class Host:
    """One host with one state directory, serving each model from its own manifest file."""

    def __init__(self, tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
        self.tmp, self.capsys = tmp, capsys
        self.state = tmp / "state"

    def publish(self, model: str, data: bytes) -> Path:
        path = self.tmp / model / "manifest.json"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
        return path

    def resolve(self, manifest: Path, *args: str) -> tuple[int, str, str]:
        code = resolve.main(
            [
                "--manifest",
                str(manifest),
                "--pubkey",
                str(PUB),
                "--host-class",
                "x86-vnni",
                "--runtime",
                "onnxruntime==1.32.0",
                "--providers",
                "CPUExecutionProvider",
                "--state-dir",
                str(self.state),
                "--json",
                *args,
            ]
        )
        out = self.capsys.readouterr()
        return code, out.out, out.err

    def serve(self, model: str, version: int) -> tuple[int, dict[str, Any] | None, str]:
        """Publish ``model``'s ``version`` where its service reads it, and resolve it."""
        code, out, err = self.resolve(self.publish(model, release(model, version)))
        return code, json.loads(out) if out else None, err

    def line(self, model: str) -> Path:
        return self.state / hoststate.line_name(model, KEYID)

    def floor(self, model: str) -> int:
        data = (self.line(model) / hoststate.STATE_FILE).read_bytes()
        return hoststate.parse_state(data).version


@pytest.fixture
def host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Host:
    for var in ("QUALIFY_PUBKEY", "QUALIFY_STATE_DIR", "QUALIFY_MODEL", "QUALIFY_PROVIDERS"):
        monkeypatch.delenv(var, raising=False)
    return Host(tmp_path, capsys)


def test_a_second_model_on_the_same_host_is_judged_by_its_own_floor(host: Host) -> None:
    assert host.serve("digits", 17)[0] == 0  # the README's post-demo resolve: v17 accepted
    code, answer, err = host.serve("ocr", 1)  # a second project's first manifest
    assert code == 0, err
    assert answer is not None and answer["manifest_version"] == 1
    assert (host.floor("digits"), host.floor("ocr")) == (17, 1)


def test_an_older_version_of_the_same_line_is_refused_naming_its_state_file(host: Host) -> None:
    assert host.serve("digits", 17)[0] == 0
    assert host.serve("ocr", 1)[0] == 0
    code, answer, err = host.serve("digits", 5)  # a replayed older release of the first model
    assert code == 0 and answer is not None
    assert answer["source"] == "last-known-good" and answer["manifest_version"] == 17
    assert "version 5 is lower than version 17" in err
    assert str(host.line("digits") / hoststate.STATE_FILE) in err and "--state-dir" in err
    assert host.floor("digits") == 17 and host.floor("ocr") == 1


def test_three_releases_of_two_models_with_replays_and_damage_each_fall_back_to_its_own(
    host: Host,
) -> None:
    """A story: two models released in turn on one host; each replay is refused against its own
    line, and a damaged manifest of either falls back to that model's last-known-good, never
    the other's."""
    for version in (1, 2, 3):
        assert host.serve("digits", version)[0] == 0
        assert host.serve("ocr", version + 10)[0] == 0
    for model, old, kept in (("digits", 2, 3), ("ocr", 12, 13)):
        code, answer, err = host.serve(model, old)
        assert code == 0 and answer is not None and answer["manifest_version"] == kept, err
        assert answer["release"] == f"{model}-{kept}"
    # A model skips ahead (a host that missed a release): accepted, the other untouched.
    assert host.serve("digits", 7)[0] == 0
    assert (host.floor("digits"), host.floor("ocr")) == (7, 13)
    for model, kept in (("digits", 7), ("ocr", 13)):
        path = host.publish(model, b"{}")  # the file its service reads, damaged
        code, out, err = host.resolve(path)
        answer = json.loads(out)
        assert code == 0 and answer["release"] == f"{model}-{kept}", err
        assert answer["source"] == "last-known-good"


def test_a_key_rotation_starts_a_new_line_and_keeps_the_old_keys(host: Host) -> None:
    assert host.serve("digits", 9)[0] == 0
    other = Ed25519PrivateKey.generate()
    pub = host.tmp / "other.pub"
    from manifest.envelope import public_pem

    pub.write_text(public_pem(public_raw(other.public_key())))
    path = host.publish("digits", release("digits", 1, key=other))
    code, out, err = host.resolve(path, "--pubkey", str(pub))
    assert code == 0 and json.loads(out)["manifest_version"] == 1, err
    assert host.floor("digits") == 9  # the first key's line is as it was


def test_a_manifest_of_another_line_is_refused_when_the_service_names_its_model(
    host: Host,
) -> None:
    assert host.serve("digits", 4)[0] == 0
    path = host.publish("digits", release("ocr", 50))  # another model's manifest in its place
    code, out, err = host.resolve(path, "--model", "digits")
    assert code == 0 and json.loads(out)["release"] == "digits-4", err
    assert "model line 'ocr'" in err and "--model" in err
    assert not host.line("ocr").exists()


def test_a_path_no_line_was_read_from_has_nothing_to_fall_back_to_unless_named(
    host: Host,
) -> None:
    assert host.serve("digits", 4)[0] == 0
    stray = host.tmp / "elsewhere.json"
    stray.write_bytes(b"{}")
    code, out, err = host.resolve(stray)
    assert (code, out) == (lookup.EXIT_VERIFY, "")
    assert "no model line of this key was read from" in err and "--model" in err
    code, out, err = host.resolve(stray, "--model", "digits")
    assert code == 0 and json.loads(out)["release"] == "digits-4", err


def test_a_state_file_copied_from_another_line_does_not_floor_this_one(host: Host) -> None:
    assert host.serve("digits", 30)[0] == 0
    assert host.serve("ocr", 2)[0] == 0
    copied = (host.line("digits") / hoststate.STATE_FILE).read_bytes()
    (host.line("ocr") / hoststate.STATE_FILE).write_bytes(copied)
    code, answer, err = host.serve("ocr", 3)
    assert code == 0 and answer is not None and answer["manifest_version"] == 3, err
    assert "names another line" in err
    assert host.floor("ocr") == 3  # repaired
    code, _, err = host.serve("ocr", 1)
    assert "version 1 is lower than version 3" in err  # its own floor still holds


# -- the earlier layout ------------------------------------------------------------------------


def _earlier_layout(state: Path, data: bytes) -> None:
    """The state an earlier resolve-artifact left after accepting ``data``: one ``state.json``
    and one ``last-known-good.json`` at the top of the directory, for every model."""
    raw = data
    start, end, sig = envelope.verify_signed_span(raw, public_raw(fixed_key().public_key()))
    signed = json.loads(raw[start:end])
    record = hoststate.Accepted(
        signed["version"],
        signed["type"],
        None,
        envelope.sha256_hex(raw[start:end]),
        f"{KEYID}:{sig}",
    )
    state.mkdir(parents=True, exist_ok=True)
    (state / hoststate.STATE_FILE).write_bytes(hoststate.encode_state(record))
    (state / hoststate.LKG_FILE).write_bytes(data)


def test_an_upgraded_host_keeps_the_floor_of_the_line_it_served(host: Host) -> None:
    _earlier_layout(host.state, release("digits", 17))
    code, answer, err = host.serve("digits", 5)  # the first start after the upgrade
    assert code == 0 and answer is not None and answer["manifest_version"] == 17, err
    assert "version 5 is lower than version 17" in err and "moved" in err
    assert not (host.state / hoststate.STATE_FILE).exists()
    assert not (host.state / hoststate.LKG_FILE).exists()
    assert host.floor("digits") == 17
    assert host.serve("ocr", 1)[0] == 0  # and a second model is its own line
    assert host.serve("digits", 18)[0] == 0 and host.floor("digits") == 18


def test_an_earlier_state_whose_line_is_unknown_still_floors_and_is_named(host: Host) -> None:
    _earlier_layout(host.state, release("digits", 17))
    (host.state / hoststate.LKG_FILE).unlink()  # its document is gone: whose floor is it?
    code, _, err = host.serve("ocr", 1)
    assert code == lookup.EXIT_VERIFY
    assert "version 1 is lower than version 17" in err
    assert str(host.state / hoststate.STATE_FILE) in err and "remove the file" in err
    (host.state / hoststate.STATE_FILE).unlink()  # a person decides it is not ocr's
    assert host.serve("ocr", 1)[0] == 0


def test_an_earlier_layout_of_another_key_waits_for_that_key(host: Host) -> None:
    other = Ed25519PrivateKey.generate()
    data = envelope.encode_canonical(
        sign_document(json.loads(release("digits", 17))["signed"], other)
    )
    host.state.mkdir()
    (host.state / hoststate.LKG_FILE).write_bytes(data)
    assert host.serve("digits", 3)[0] == 0  # this key's line starts on its own
    assert (host.state / hoststate.LKG_FILE).read_bytes() == data  # left for its own key


# -- per-class directories: the pointer and the document agree -------------------------------


def test_a_per_class_pointer_naming_another_version_than_its_document_is_refused(
    host: Host,
) -> None:
    directory = host.tmp / "manifest.d"
    for version in (2, 3):
        write_per_class(json.loads(release("digits", version)), fixed_key(), directory)
    assert host.resolve(directory)[0] == 0
    # A mixed directory: v3's folder holding v2's document, the pointer at v3.
    name = envelope.class_filename("x86-vnni")
    write_per_class(json.loads(release("digits", 4)), fixed_key(), directory)
    (directory / "v4" / name).write_bytes((directory / "v3" / name).read_bytes())
    code, out, err = host.resolve(directory)
    assert code == 0 and json.loads(out)["source"] == "last-known-good", err
    assert "names v4" in err and json.loads(out)["manifest_version"] == 3


# -- the state file is hostile input ----------------------------------------------------------


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=80),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner),
    max_leaves=20,
)
_FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "format": _JSON,
        "version": st.integers(-5, 2**64) | _JSON,
        "type": st.sampled_from([envelope.MANIFEST_TYPE, envelope.CLASS_TYPE]) | _JSON,
        "host_class": _JSON,
        "signed_sha256": _JSON,
        "signature": _JSON,
        "model": st.text(max_size=40) | _JSON,
        "keyid": st.just(KEYID) | st.text(alphabet="0123456789abcdef", max_size=70) | _JSON,
        "sources": st.lists(st.text(alphabet="0123456789abcdef", min_size=30, max_size=34)) | _JSON,
    },
)


@settings(max_examples=400, deadline=None)
@given(st.one_of(_FIELDS.map(lambda d: json.dumps(d).encode()), st.binary(max_size=600)))
def test_any_state_file_is_read_as_a_record_or_refused_with_a_value_error(data: bytes) -> None:
    try:
        found = hoststate.parse_state_file(data)
    except ValueError:
        return
    assert 1 <= found.record.version <= envelope.MAX_VERSION
    assert found.model is None or isinstance(found.model, str)
    assert found.keyid is None or (len(found.keyid) == 64 and envelope.is_hex(found.keyid))
    assert len(found.sources) <= hoststate.MAX_SOURCES
    assert all(len(s) == 32 and envelope.is_hex(s) for s in found.sources)


@settings(max_examples=200, deadline=None)
@given(
    version=st.integers(1, envelope.MAX_VERSION),
    model=st.text(min_size=1, max_size=60),
    sources=st.lists(st.text(alphabet="0123456789abcdef", min_size=32, max_size=32), max_size=8),
)
def test_a_state_file_written_is_read_back_the_same(
    version: int, model: str, sources: list[str]
) -> None:
    record = hoststate.Accepted(version, envelope.MANIFEST_TYPE, None, "ab" * 32, None)
    try:
        data = hoststate.encode_state(record, model=model, keyid=KEYID, sources=tuple(sources))
    except Exception:  # a lone surrogate cannot be canonical JSON: never written
        return
    found = hoststate.parse_state_file(data)
    assert found == hoststate.StateRecord(record, model, KEYID, tuple(sources))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300), st.text(max_size=300))
def test_line_folders_are_safe_names_and_two_lines_never_share_one(a: str, b: str) -> None:
    for model in (a, b):
        name = hoststate.line_name(model, KEYID)
        assert "/" not in name and "\0" not in name and name not in (".", "..")
        assert len(name.encode("utf-8", "surrogatepass")) <= 255
    if a != b:
        assert hoststate.line_name(a, KEYID) != hoststate.line_name(b, KEYID)


def test_a_hostile_line_folder_never_crashes_a_start(host: Host) -> None:
    assert host.serve("digits", 4)[0] == 0
    state = host.line("digits") / hoststate.STATE_FILE
    for damage in (b"[" * 50_000, b'{"version":4,"model":7}', b'{"version":4,"sources":{}}'):
        state.write_bytes(damage)
        code, _, err = host.serve("digits", 3)
        assert code == 0 and "Traceback" not in err and "lower than version 4" in err
