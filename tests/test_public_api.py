"""Every module's surface: its ``__all__`` lists each public function and class it defines."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("schemas", "matrix", "manifest", "qualify", "reports")
MODULES = sorted(
    ".".join(p.relative_to(ROOT).with_suffix("").parts)
    for pkg in PACKAGES
    for p in (ROOT / pkg).rglob("*.py")
    if p.name not in ("__init__.py", "__main__.py")
)


@pytest.mark.parametrize("name", MODULES)
def test_all_lists_every_public_function_and_class(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{name} has no __all__"
    public = {
        n
        for n, obj in vars(module).items()
        if not n.startswith("_")
        and (inspect.isfunction(obj) or inspect.isclass(obj))
        and getattr(obj, "__module__", None) == name
    }
    assert public <= set(exported), f"{name}: missing from __all__: {public - set(exported)}"
    assert all(hasattr(module, n) for n in exported)


@pytest.mark.parametrize("package", ["matrix", "reports", "qualify"])
def test_lazy_package_exports_name_where_each_lives(package: str) -> None:
    """A package that loads its exports on first use maps every public name, and only those."""
    module = importlib.import_module(package)
    assert set(module._WHERE) == set(module.__all__)
    for name, where in module._WHERE.items():
        assert getattr(module, name) is getattr(importlib.import_module(where), name)
    assert set(module.__all__) <= set(dir(module))
    with pytest.raises(AttributeError, match="no attribute 'not_there'"):
        module.not_there  # noqa: B018
