"""Keys, key ids, canonical JSON and the sign/verify round trip, with real Ed25519."""

from __future__ import annotations

import copy
import hashlib
import json
import stat
from datetime import timedelta
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from manifest import envelope
from manifest.errors import (
    CanonicalError,
    ExpiredError,
    KeyFileError,
    MalformedError,
    SignatureError,
)
from manifest.signing import (
    check_publishable,
    generate_keypair,
    key_id,
    load_private_key,
    load_public_key,
    public_raw,
    sign_document,
    sign_encoded,
    verify,
)
from tests.manifest.factories import CLOCK, fixed_key, scenario, signed_manifest


def test_keygen_writes_a_private_key_only_its_owner_can_read(tmp_path: Path) -> None:
    key_path, pub_path = generate_keypair("release", tmp_path)
    assert (key_path.name, pub_path.name) == ("release.key", "release.pub")
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    private, public = load_private_key(key_path), load_public_key(pub_path)
    assert key_id(private) == key_id(public)


def test_keygen_never_overwrites_an_existing_key(tmp_path: Path) -> None:
    key_path, _ = generate_keypair("release", tmp_path)
    before = key_path.read_bytes()
    with pytest.raises(KeyFileError, match="already exists"):
        generate_keypair("release", tmp_path)
    assert key_path.read_bytes() == before


def test_keygen_refuses_a_name_that_is_a_path(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="plain file stem"):
        generate_keypair("../evil", tmp_path)


def test_key_id_is_sha256_of_the_raw_public_key() -> None:
    key = fixed_key()
    raw = public_raw(key.public_key())
    assert key_id(key) == hashlib.sha256(raw).hexdigest()


def test_public_key_file_is_standard_pem(tmp_path: Path) -> None:
    _, pub_path = generate_keypair("k", tmp_path)
    loaded = serialization.load_pem_public_key(pub_path.read_bytes())
    raw = loaded.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert envelope.parse_public_pem(pub_path.read_text()) == raw


def test_loading_a_non_ed25519_or_garbage_key_says_what_is_wrong(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pub"
    bad.write_text("hello")
    with pytest.raises(KeyFileError, match="not a PEM public key"):
        load_public_key(bad)
    with pytest.raises(KeyFileError, match="cannot read"):
        load_private_key(tmp_path / "missing.key")
    bad.write_text("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    with pytest.raises(KeyFileError, match="not an unencrypted PEM private key"):
        load_private_key(bad)


def test_signed_manifest_round_trips() -> None:
    key = fixed_key()
    doc = signed_manifest(scenario(), key)
    verify(doc, key.public_key())
    verify(doc, key.public_key(), now=CLOCK)


def test_changed_content_does_not_verify() -> None:
    key = fixed_key()
    doc = signed_manifest(scenario(), key)
    forged = copy.deepcopy(doc)
    forged["signed"]["entries"]["gpu-a10"]["decision"] = "candidate"
    with pytest.raises(SignatureError, match="does not match"):
        verify(forged, key.public_key())


def test_signature_by_another_key_does_not_verify() -> None:
    doc = signed_manifest(scenario(), Ed25519PrivateKey.generate())
    with pytest.raises(SignatureError, match="no signature by the trusted key"):
        verify(doc, fixed_key().public_key())


def test_expired_manifest_is_refused_given_a_clock() -> None:
    key = fixed_key()
    doc = signed_manifest(scenario(), key)
    with pytest.raises(ExpiredError, match="expired at 2025-07-01T12:00:00Z"):
        verify(doc, key.public_key(), now=CLOCK.replace(year=2026))


def test_canonical_json_refuses_floats_and_sorts_keys() -> None:
    assert envelope.encode_canonical({"b": 1, "a": ["é", None, True]}) == (
        '{"a":["é",null,true],"b":1}'.encode()
    )
    with pytest.raises(CanonicalError, match=r"\$\.x\[0\]: 0\.5 is a float"):
        envelope.encode_canonical({"x": [0.5]})
    with pytest.raises(CanonicalError, match="not a string"):
        envelope.encode_canonical({1: "a"})


def test_signing_refuses_float_content() -> None:
    with pytest.raises(CanonicalError):
        sign_document({"p99_ms": 41.5}, fixed_key())


def test_time_format_is_fixed_width_utc() -> None:
    assert envelope.format_time(CLOCK) == "2025-06-01T12:00:00Z"
    assert envelope.parse_time("2025-06-01T12:00:00Z") == CLOCK
    with pytest.raises(ValueError, match="no time zone"):
        envelope.format_time(CLOCK.replace(tzinfo=None))


@pytest.mark.parametrize(
    ("name", "filename"),
    [
        ("x86-vnni", "x86-vnni.json"),
        ("a/b", "a%2Fb.json"),
        ("..", "%2E%2E.json"),
        ("é", "%C3%A9.json"),
    ],
)
def test_class_file_names_cannot_escape_the_directory(name: str, filename: str) -> None:
    assert envelope.class_filename(name) == filename


def test_canonical_json_finds_a_float_nested_in_any_mapping_or_sequence() -> None:
    from collections import OrderedDict

    with pytest.raises(CanonicalError, match=r"\$\.a\.b\[1\]\.c: 1\.5 is a float"):
        envelope.encode_canonical({"a": OrderedDict(b=(1, {"c": 1.5}))})
    with pytest.raises(CanonicalError, match="nan"):
        envelope.encode_canonical([float("nan")])


_JSON_LEAF = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**63), st.text()
)
_JSON = st.recursive(
    _JSON_LEAF,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(), _JSON, max_size=5))
def test_signing_once_gives_exactly_the_canonical_bytes_of_the_signed_document(
    signed: dict[str, object],
) -> None:
    key = fixed_key()
    doc, data = sign_encoded(signed, key)
    assert data == envelope.encode_canonical(doc)
    assert doc == sign_document(signed, key)
    assert envelope.encode_envelope([], envelope.encode_canonical(signed)) == (
        envelope.encode_canonical({"signed": signed, "signatures": []})
    )


def test_signed_bytes_are_read_back_by_the_verifier_and_refuse_non_objects() -> None:
    key = fixed_key()
    doc, data = sign_encoded(signed_manifest(scenario(), key)["signed"], key)
    assert json.loads(data) == doc
    verify(json.loads(data), key.public_key(), now=CLOCK)
    with pytest.raises(CanonicalError, match="object"):
        envelope.encode_envelope([], b"[1,2]")


def test_a_manifest_is_checked_as_a_host_will_on_the_bytes_about_to_be_published() -> None:
    key = fixed_key()
    signed = signed_manifest(scenario(), key)["signed"]
    _, raw = sign_encoded(signed, key)
    check_publishable(raw, signed, key, now=CLOCK)
    unsigned = envelope.encode_envelope([], envelope.encode_canonical(signed))
    check_publishable(unsigned, signed, None, now=CLOCK)

    flipped = raw.replace(b'"decision":"candidate"', b'"decision":"baseline!"', 1)
    with pytest.raises(SignatureError, match="does not verify"):
        check_publishable(flipped, signed, key, now=CLOCK)
    with pytest.raises(SignatureError, match="does not verify"):
        check_publishable(raw, signed, Ed25519PrivateKey.generate(), now=CLOCK)
    with pytest.raises(SignatureError, match="does not verify"):
        check_publishable(unsigned, signed, key, now=CLOCK)  # signed, but nothing signed it
    with pytest.raises(MalformedError, match="canonical layout"):
        check_publishable(json.dumps(json.loads(raw), indent=1).encode(), signed, key, now=CLOCK)
    with pytest.raises(ExpiredError):
        check_publishable(raw, signed, key, now=CLOCK + timedelta(days=31))


def test_a_manifest_larger_than_qualify_reads_back_is_not_published(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key = fixed_key()
    signed = signed_manifest(scenario(), key)["signed"]
    _, raw = sign_encoded(signed, key)
    monkeypatch.setattr(envelope, "MAX_MANIFEST_BYTES", len(raw))
    check_publishable(raw, signed, key, now=CLOCK)  # at the limit
    monkeypatch.setattr(envelope, "MAX_MANIFEST_BYTES", len(raw) - 1)
    classes = len(signed["entries"])
    with pytest.raises(MalformedError) as refused:
        check_publishable(raw, signed, key, now=CLOCK, source="out.json")
    assert str(refused.value) == (
        f"out.json: {len(raw):,} bytes for {classes} classes, over the {len(raw) - 1:,}-byte "
        "limit of a manifest; nothing was published. Split the fleet across projects, one "
        "manifest each"
    )


def test_an_entry_filed_under_another_class_or_without_a_decision_is_not_published() -> None:
    key = fixed_key()
    signed = copy.deepcopy(signed_manifest(scenario(), key)["signed"])
    entries = signed["entries"]
    entries["x86-vnni"], entries["arm-old"] = entries["arm-old"], entries["x86-vnni"]
    with pytest.raises(MalformedError, match=r"signed\.entries\.(x86-vnni|arm-old)"):
        check_publishable(sign_encoded(signed, key)[1], signed, key, now=CLOCK)
    signed = copy.deepcopy(signed_manifest(scenario(), key)["signed"])
    signed["entries"]["gpu-a10"]["decision"] = "maybe"
    with pytest.raises(MalformedError, match=r"signed\.entries\.gpu-a10"):
        check_publishable(sign_encoded(signed, key)[1], signed, key, now=CLOCK)
