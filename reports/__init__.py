"""HTML qualification reports: view models, Jinja2 templates and rendering.

The CLI reads the matrix (and verifies the manifest), then::

    view = reports.build_report(project, cells, runs, store.samples_by_config, now=..., ...)
    reports.write_report(view, path)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from schemas.lazy import attribute

if TYPE_CHECKING:
    from reports.context import build_report
    from reports.errors import ReportError, ReportWriteError
    from reports.render import render_report, write_report
    from reports.view import ReportView, SignatureStatus

__all__ = [
    "ReportError",
    "ReportView",
    "ReportWriteError",
    "SignatureStatus",
    "build_report",
    "render_report",
    "write_report",
]

_WHERE = {
    "ReportError": "reports.errors",
    "ReportView": "reports.view",
    "ReportWriteError": "reports.errors",
    "SignatureStatus": "reports.view",
    "build_report": "reports.context",
    "render_report": "reports.render",
    "write_report": "reports.render",
}
"""Where each public name lives: imported on first use, so that one light module of
the package does not pull in its heavy siblings (pyarrow, Jinja2)."""


def __getattr__(name: str) -> Any:
    return attribute(globals(), _WHERE, name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
