"""Which manifest the report shows, and the signature status its header says."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from manifest.envelope import encode_canonical
from manifest.signing import generate_keypair, load_private_key
from qualify.reporting import _manifest, signature_status
from reports import SignatureStatus
from tests.manifest.factories import CLOCK, scenario, signed_manifest


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """A manifest signed with a fresh key, and that key's public half."""
    key_path, pub_path = generate_keypair("release", tmp_path_factory.mktemp("keys"))
    return signed_manifest(scenario(), load_private_key(key_path)), pub_path


def test_a_good_signature_past_its_date_is_said_valid_and_expired(
    release: tuple[dict[str, Any], Path],
) -> None:
    doc, pub = release
    raw = json.dumps(doc).encode()
    assert signature_status(raw, pub, now=CLOCK).startswith("verified: key ")
    late = signature_status(raw, pub, now=CLOCK + timedelta(days=31))
    expires = doc["signed"]["expires"]
    assert late == f"expired: {expires}"
    status = SignatureStatus.parse(late)
    assert (status.text, status.tone) == (f"signature valid; manifest expired on {expires}", "warn")


def test_a_bad_signature_past_its_date_is_still_invalid(
    release: tuple[dict[str, Any], Path],
) -> None:
    doc, pub = release
    forged = json.loads(json.dumps(doc))
    forged["signed"]["release"] = "2099.01"
    said = signature_status(json.dumps(forged).encode(), pub, now=CLOCK + timedelta(days=31))
    assert said.startswith("invalid: ")
    assert SignatureStatus.parse(said).text.startswith("signature INVALID")


class _Matrix:
    """The one question the report asks the matrix about manifests: the newest published."""

    def __init__(self, newest: tuple[int, str] | None) -> None:
        self.newest = newest

    def latest_manifest(self) -> tuple[int, str] | None:
        return self.newest


def test_the_report_defaults_to_the_hosts_manifest_json_else_the_newest_published(
    release: tuple[dict[str, Any], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc, _ = release
    model = doc["signed"]["model"]
    monkeypatch.chdir(tmp_path)
    newest = _Matrix((7, encode_canonical(doc).decode()))
    current, _, source = _manifest(newest, None, model)  # type: ignore[arg-type]
    assert current is not None and source is not None
    assert "newest published, version 7" in source and "no ./manifest.json" in source

    on_hosts = json.loads(json.dumps(doc))
    on_hosts["signed"]["release"] = "what-hosts-get"
    (tmp_path / "manifest.json").write_bytes(encode_canonical(on_hosts))
    current, raw, source = _manifest(newest, None, model)  # type: ignore[arg-type]
    assert current is not None and current.signed.release == "what-hosts-get"
    assert source == "./manifest.json (what hosts get)" and json.loads(raw) == on_hosts

    # Another model's manifest.json (two projects share the folder) is passed over.
    on_hosts["signed"]["model"] = "another-model"
    (tmp_path / "manifest.json").write_bytes(encode_canonical(on_hosts))
    current, _, source = _manifest(newest, None, model)  # type: ignore[arg-type]
    assert current is not None and current.signed.release == doc["signed"]["release"]
    assert source is not None and "version 7" in source
    assert f"./manifest.json is model another-model's, not {model}'s" in source

    given = tmp_path / "other.json"
    given.write_bytes(encode_canonical(doc))
    current, _, source = _manifest(newest, given, model)  # type: ignore[arg-type]
    assert current is not None and current.signed.release == doc["signed"]["release"]
    assert source == str(given)

    assert _manifest(_Matrix(None), tmp_path / "other.json", model)[2] == str(given)
    (tmp_path / "manifest.json").unlink()
    assert _manifest(_Matrix(None), None, model) == (None, b"", None)  # type: ignore[arg-type]
