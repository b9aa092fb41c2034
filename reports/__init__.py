"""HTML qualification reports: view models, Jinja2 templates and rendering.

The CLI reads the matrix (and verifies the manifest), then::

    view = reports.build_report(project, cells, runs, store.samples_by_config, now=..., ...)
    reports.write_report(view, path)
"""

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
