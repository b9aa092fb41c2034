"""The package's surface: complete ``__all__`` lists and one documented error tree."""

from __future__ import annotations

import importlib
import inspect

import pytest

from manifest import errors

MODULES = (
    "manifest.errors",
    "manifest.envelope",
    "manifest.signing",
    "manifest.policy",
    "manifest.build",
    "manifest.load",
    "manifest.diff",
    "manifest.show",
    "manifest.host_events",
    "manifest.telemetry",
    "manifest.resolve",
    "schemas.manifest",
)


@pytest.mark.parametrize("name", MODULES)
def test_all_lists_every_public_function_and_class(name: str) -> None:
    module = importlib.import_module(name)
    public = {
        n
        for n, obj in vars(module).items()
        if not n.startswith("_")
        and (inspect.isfunction(obj) or inspect.isclass(obj))
        and getattr(obj, "__module__", None) == name
    }
    assert public <= set(module.__all__), (
        f"{name}: missing from __all__: {public - set(module.__all__)}"
    )
    assert all(hasattr(module, n) for n in module.__all__)


def test_every_error_is_drawn_in_the_tree_and_derives_from_manifest_error() -> None:
    doc = errors.__doc__ or ""
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.ManifestError)
        assert name in doc, f"{name} is not drawn in manifest.errors' docstring"


def test_verification_errors_have_distinct_codes() -> None:
    subclasses = errors.VerificationError.__subclasses__()
    codes = [cls.code for cls in subclasses]
    assert len(codes) == len(set(codes)) == 8
