"""Golden files: the canonical signed manifest and per-class documents of a fixed scenario.

Fixed clock, fixed test key (Ed25519 signatures are deterministic), fixed fleet: the bytes must
not change unless the format does. To rewrite them deliberately::

    QUALIFY_UPDATE_GOLDEN=1 .venv/bin/pytest tests/manifest/test_golden.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from manifest import envelope
from manifest.build import per_class_documents
from manifest.signing import load_public_key, sign_document, verify
from schemas.manifest import ClassDocument, Manifest
from tests.manifest.factories import GOLDEN, fixed_key, scenario, signed_manifest

UPDATE = os.environ.get("QUALIFY_UPDATE_GOLDEN") == "1"


def golden_files() -> dict[str, bytes]:
    """Relative path -> bytes of every golden file, built from the fixed scenario."""
    key = fixed_key()
    doc = signed_manifest(scenario(), key)
    files = {"manifest.json": envelope.encode_canonical(doc)}
    for name, signed in per_class_documents(doc["signed"]).items():
        files[f"classes/{envelope.class_filename(name)}"] = envelope.encode_canonical(
            sign_document(signed, key)
        )
    return files


@pytest.mark.parametrize("relpath", sorted(golden_files()))
def test_generated_documents_match_the_golden_files(relpath: str) -> None:
    got = golden_files()[relpath]
    path = GOLDEN / relpath
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(got)
    assert path.exists(), f"{path} is missing; run with QUALIFY_UPDATE_GOLDEN=1 to write it"
    assert got == path.read_bytes(), (
        f"{relpath} drifted from the golden file; if the change is intended, rerun with "
        "QUALIFY_UPDATE_GOLDEN=1 and review the diff"
    )


def test_golden_manifest_verifies_and_validates() -> None:
    doc = json.loads((GOLDEN / "manifest.json").read_bytes())
    verify(doc, load_public_key(GOLDEN / "test.pub"))
    manifest = Manifest.model_validate(doc)
    decisions = {n: e.decision for n, e in manifest.signed.entries.items()}
    assert decisions == {
        "x86-vnni": "candidate",
        "gpu-a10": "baseline",
        "arm-old": "hold",
        "arm-new": "hold",
    }


def test_golden_class_documents_validate() -> None:
    paths = sorted((GOLDEN / "classes").glob("*.json"))
    assert len(paths) == 4
    for path in paths:
        doc = ClassDocument.model_validate_json(path.read_bytes())
        assert envelope.class_filename(doc.signed.host_class) == path.name


def test_golden_manifest_is_canonical_bytes_with_no_floats() -> None:
    raw = (GOLDEN / "manifest.json").read_bytes()
    assert envelope.encode_canonical(json.loads(raw)) == raw
    assert not _has_float(json.loads(raw))


def _has_float(value: object) -> bool:
    if isinstance(value, float):
        return True
    if isinstance(value, dict):
        return any(_has_float(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_float(v) for v in value)
    return False


def test_golden_key_is_the_committed_test_key() -> None:
    pub = Path(GOLDEN / "test.pub").read_text()
    assert (
        envelope.key_id(envelope.parse_public_pem(pub))
        == json.loads((GOLDEN / "manifest.json").read_bytes())["signatures"][0]["keyid"]
    )


def test_every_reason_code_appears_once_per_entry() -> None:
    import json

    from schemas.manifest import DECISION_REASON_CODES

    document = json.loads((GOLDEN / "manifest.json").read_text())
    for name, entry in document["signed"]["entries"].items():
        codes = [r["code"] for r in entry["reasons"]]
        assert len(codes) == len(set(codes)), (name, codes)
        assert set(codes) <= set(DECISION_REASON_CODES), (name, codes)
