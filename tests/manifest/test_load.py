"""Reading a manifest file back into its model: every failure names the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from manifest import envelope
from manifest.errors import MalformedError
from manifest.load import load_manifest
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
