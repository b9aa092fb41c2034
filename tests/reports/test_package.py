"""The reports package's surface: what it exports (each module's ``__all__`` is
`tests/test_public_api.py`)."""

from __future__ import annotations

import reports


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
