"""The manifest package's surface: one documented error tree (each module's ``__all__`` is
`tests/test_public_api.py`)."""

from __future__ import annotations

from manifest import errors


def test_every_error_is_drawn_in_the_tree_and_derives_from_manifest_error() -> None:
    doc = errors.__doc__ or ""
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.ManifestError)
        assert name in doc, f"{name} is not drawn in manifest.errors' docstring"


def test_verification_errors_have_distinct_codes() -> None:
    subclasses = errors.VerificationError.__subclasses__()
    codes = [cls.code for cls in subclasses]
    assert len(codes) == len(set(codes)) == 9
