"""Reading a manifest file back into its model: every failure names the file and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from manifest import envelope
from manifest.errors import MalformedError
from manifest.load import load_manifest, load_previous, validate_entry
from tests.manifest.factories import fixed_key, scenario, signed_manifest


def test_load_manifest_names_the_bad_field(tmp_path: Path) -> None:
    doc = signed_manifest(scenario(), fixed_key())
    doc["signed"]["version"] = 0
    path = tmp_path / "m.json"
    path.write_bytes(envelope.encode_canonical(doc))
    with pytest.raises(MalformedError, match=r"signed\.version"):
        load_manifest(path)
    with pytest.raises(MalformedError, match="cannot read"):
        load_manifest(tmp_path / "missing.json")


def test_the_previous_manifest_is_read_for_what_the_next_one_needs() -> None:
    doc = signed_manifest(scenario(), fixed_key())
    raw = envelope.encode_canonical(doc)
    previous, signed = load_previous(raw, source="matrix manifest v1")
    assert previous.signed.version == 1 and signed == doc["signed"]
    full = load_manifest(raw)
    for name, entry in full.signed.entries.items():
        seen = previous.signed.entries[name]
        assert (seen.artifact, seen.rollback) == (entry.artifact, entry.rollback)
        assert (seen.runtime, seen.provider) == (entry.runtime, entry.provider)


def test_a_previous_manifest_with_a_bad_field_that_generation_reads_is_refused_by_name() -> None:
    doc = signed_manifest(scenario(), fixed_key())
    doc["signed"]["entries"]["x86-vnni"]["rollback"]["digest"] = "sha256:nope"
    with pytest.raises(MalformedError, match=r"^matrix manifest v1: signed\.entries\.x86-vnni"):
        load_previous(envelope.encode_canonical(doc), source="matrix manifest v1")
    with pytest.raises(MalformedError, match="not in the canonical layout"):
        load_previous(json.dumps(doc, indent=1).encode(), source="matrix manifest v1")


def test_an_entry_carried_over_verbatim_is_validated_whole() -> None:
    doc = signed_manifest(scenario(), fixed_key())
    entry = doc["signed"]["entries"]["x86-vnni"]
    assert validate_entry(entry, name="x86-vnni", source="v1") is entry
    entry["evidence"]["p99_us"] = "fast"  # a field generation does not read otherwise
    with pytest.raises(MalformedError, match=r"^v1: signed\.entries\.x86-vnni\.evidence\.p99_us"):
        validate_entry(entry, name="x86-vnni", source="v1")


def test_a_manifest_larger_than_qualify_reads_is_refused_without_reading_it_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = envelope.encode_canonical(signed_manifest(scenario(), fixed_key()))
    path = tmp_path / "m.json"
    path.write_bytes(raw + b" " * (1 << 20))  # 1 MiB of padding past the limit below
    monkeypatch.setattr(envelope, "MAX_MANIFEST_BYTES", len(raw))
    read: list[int] = []
    real = __import__("schemas.atomic", fromlist=["read_bounded"]).read_bounded

    def bounded(p: Path, limit: int) -> bytes:
        data = real(p, limit)
        read.append(len(data))
        return data

    monkeypatch.setattr("schemas.atomic.read_bounded", bounded)
    with pytest.raises(MalformedError, match=rf"larger than the {len(raw)}-byte limit"):
        load_manifest(path)
    assert read == [len(raw) + 1]  # one byte past the limit, not the file's 1 MiB
    with pytest.raises(MalformedError, match="larger than"):
        load_previous(raw + b" ", source="matrix manifest v1")
    assert load_manifest(raw).signed.version == 1  # at the limit: read
