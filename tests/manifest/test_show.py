"""One manifest as text for people (``qualify manifest show``)."""

from __future__ import annotations

from manifest.show import render_manifest
from schemas.manifest import Manifest
from tests.manifest.factories import fixed_key, scenario, signed_manifest


def test_show_lists_every_class_with_its_decision() -> None:
    text = render_manifest(Manifest.model_validate(signed_manifest(scenario(), fixed_key())))
    assert "ocr-rec release 2025.06, version 1" in text
    assert "  gpu-a10: baseline rec-fp32; rollback none (nothing further to go back to)" in text
    assert "  arm-new: hold; rollback rec-fp32 (not proven to load)" in text
