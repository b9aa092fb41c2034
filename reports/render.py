"""Rendering: the one Jinja2 environment, the page as a string, the page written atomically.

Autoescape on, undefined names are errors; the chart library, script and style are inlined so
the page opens with no network. What the page says is the sections' work, not this module's.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from pathlib import Path

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from reports.errors import ReportWriteError
from reports.view import ReportView
from schemas.atomic import write_atomic

__all__ = ["environment", "render_report", "write_report"]

_STATIC = ("uPlot.iife.min.js", "uPlot.min.css", "report.js", "report.css")


@cache
def environment() -> Environment:
    """The report's only Jinja2 environment (built once).

    Autoescape is on for every template, so any name from a project file renders as text;
    undefined names raise instead of rendering empty.
    """
    env = Environment(
        loader=PackageLoader("reports", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    # Compact, stable JSON for the charts' data (``tojson`` still escapes <, >, & and ').
    env.policies["json.dumps_kwargs"] = {"sort_keys": True, "separators": (",", ":")}
    return env


@cache
def _static() -> dict[str, Markup]:
    folder = resources.files("reports") / "static"
    found: dict[str, Markup] = {}
    for name in _STATIC:
        text = (folder / name).read_text(encoding="utf-8")
        # Inlined into <script>/<style>: the files are ours or vendored, and must not be able
        # to close the element early.
        if "</script" in text.lower() or "</style" in text.lower():
            raise ReportWriteError(f"reports/static/{name} contains a closing tag; cannot inline")
        found[name.replace(".", "_").replace("-", "_")] = Markup(text)
    return found


def render_report(view: ReportView) -> str:
    """Render the page.

    Args:
        view: The view model from ``reports.build_report``.

    Returns:
        One self-contained HTML document (script, style and chart data inline).

    Raises:
        jinja2.UndefinedError: a template used a name the view does not have (a bug).
    """
    template = environment().get_template("report.html")
    return template.render(view=view, static=_static())


def write_report(view: ReportView, path: Path | str) -> Path:
    """Render the page and write it atomically (temp file in the same folder, fsync, rename).

    Args:
        view: The view model.
        path: Where the page goes; its folder must exist.

    Returns:
        The path written.

    Raises:
        ReportWriteError: the folder is missing or not writable; nothing is left half-written.
    """
    target = Path(path)
    html = render_report(view).encode("utf-8")
    folder = target.parent
    if not folder.is_dir():
        raise ReportWriteError(
            f"cannot write the report to {target}: folder {folder} does not exist; create it or "
            "pass another --out"
        )
    try:
        write_atomic(target, html, sync_dir=True)
    except OSError as error:
        raise ReportWriteError(f"cannot write the report to {target}: {error.strerror}") from error
    return target
