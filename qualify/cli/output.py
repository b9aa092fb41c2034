"""Machine output, one convention for every command: ``--json`` (the document a read command
prints instead of its text, published as ``schemas/<name>.schema.json``: ``schemas.output``),
``--quiet`` (no progress on stderr), and how a JSON document is written. Imports click and the
standard library only: ``--help`` and ``matrix show`` load it."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import date, datetime
from typing import Any, TypeVar

import click

__all__ = ["echo_json", "json_option", "quiet_option"]

F = TypeVar("F", bound=Callable[..., Any])


def json_option(schema: str) -> Callable[[F], F]:
    """``--json``: print the command's document (``schemas/SCHEMA.schema.json``) on stdout instead
    of its text; progress and warnings stay on stderr."""
    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        help=f"Print JSON instead of text (schema: schemas/{schema}.schema.json).",
    )


def quiet_option(f: F) -> F:
    """``--quiet``: no progress on stderr (results, warnings and errors are still said)."""
    return click.option(
        "--quiet",
        "-q",
        is_flag=True,
        help="Say no progress on stderr (results, warnings and errors still).",
    )(f)


def _plain(value: object) -> object:
    """What ``json`` cannot write itself: a timestamp as ISO 8601 (UTC as stored)."""
    if isinstance(value, datetime | date):
        return value.isoformat()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def echo_json(document: Any) -> None:
    """Print ``document`` as indented JSON: a pydantic model as its ``model_dump_json`` (the
    published schema's shape), anything else (dicts, lists, timestamps) with the standard
    library."""
    dump = getattr(document, "model_dump_json", None)
    if dump is not None:
        click.echo(dump(indent=2))
        return
    click.echo(json.dumps(document, indent=2, default=_plain, ensure_ascii=False))
