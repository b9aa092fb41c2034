"""The package's surface: each module's ``__all__`` lists what it defines for other modules."""

from __future__ import annotations

import importlib
import inspect

import pytest

import reports

MODULES = (
    "reports.charts",
    "reports.context",
    "reports.errors",
    "reports.formatting",
    "reports.render",
    "reports.tones",
    "reports.view",
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


def test_package_exports_the_builder_the_view_and_rendering() -> None:
    assert sorted(reports.__all__) == [
        "ReportError",
        "ReportView",
        "ReportWriteError",
        "SignatureStatus",
        "build_report",
        "render_report",
        "write_report",
    ]
    assert all(hasattr(reports, n) for n in reports.__all__)
