"""The published manifest a release gate compares with, fetched by a CI job: read, its
signature and model line checked, and said in the summary (or its absence said)."""

from __future__ import annotations

from pathlib import Path

import pytest

from manifest.envelope import encode_canonical, encode_envelope
from manifest.errors import SignatureError
from manifest.signing import generate_keypair
from qualify.errors import QualifyError
from qualify.release.coverage import ReleaseGate, summary_markdown
from qualify.release.generate import load_published
from tests.manifest.factories import GOLDEN, fixed_key, scenario, signed_manifest


def published(tmp_path: Path) -> Path:
    path = tmp_path / "published-manifest.json"
    doc = signed_manifest(scenario(), fixed_key(), version=4)
    path.write_bytes(encode_envelope(doc["signatures"], encode_canonical(doc["signed"])))
    return path


def test_a_fetched_manifest_of_this_model_line_is_read_and_its_signature_checked(
    tmp_path: Path,
) -> None:
    found = load_published(published(tmp_path), model="ocr-rec", pubkey=GOLDEN / "test.pub")
    assert found.signed.version == 4


def test_a_fetched_manifest_of_another_model_line_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(QualifyError, match="model line 'ocr-rec', the project is 'speech'"):
        load_published(published(tmp_path), model="speech")


def test_a_fetched_manifest_signed_by_another_key_is_refused(tmp_path: Path) -> None:
    _, other = generate_keypair("other", tmp_path)
    with pytest.raises(SignatureError):
        load_published(published(tmp_path), model="ocr-rec", pubkey=other)


def test_the_summary_says_what_it_compared_with_or_that_nothing_could_be_compared() -> None:
    gate = ReleaseGate(decisions={"x86": ("candidate", "int8")}, current={}, problems={})
    without = summary_markdown([], gate, title="t")
    assert "No published manifest to compare with" in without and "--manifest" in without
    named = summary_markdown([], gate, title="t", against="manifest v7 (r7)")
    assert "Compared with the current manifest: manifest v7 (r7)." in named
