"""The options many commands share (``--project``, ``--db``, the telemetry tolerances), the
parameter types that refuse bad values when the command line is parsed, and turning option
values into a settings model with a usage error that names the option."""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from qualify.cli.errors import _fail
from qualify.errors import QualifyError

__all__ = ["DEFAULT_DB", "DEFAULT_PROJECT"]


DEFAULT_PROJECT = "qualify.yaml"
DEFAULT_DB = "qualify.duckdb"

F = TypeVar("F", bound=Callable[..., Any])
M = TypeVar("M")


def _settings(model: type[M], values: dict[str, Any], options: dict[str, str]) -> M:
    """``model(**values)``, or a one-line usage error naming the option and the rule."""
    from pydantic import ValidationError

    try:
        return model(**values)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else ""
        option = options.get(field, field)
        _fail(f"{option} {values.get(field)!r}: {first['msg'].lower()}", 2)


class _FiniteRange(click.types.FloatParamType):
    """A finite float, within ``low``..``high`` where they are given (a bound the settings'
    model holds is left to it: one source of truth). ``click.FloatRange`` lets NaN through
    (every comparison with it is false); this refuses NaN and infinity on one line naming the
    option, as every other refusal (the group turns it into "error: ..." and exit 2)."""

    def __init__(self, low: float | None = None, high: float | None = None) -> None:
        self.low, self.high = low, high

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        low = -math.inf if self.low is None else self.low
        high = math.inf if self.high is None else self.high
        if not math.isfinite(number) or not low <= number <= high:
            span = f" from {low:g} to {high:g}" if self.low is not None else ""
            raise QualifyError(f"{_named(param)} {value!r}: expected a finite number{span}")
        return number


class _RegularFile(click.Path):
    """A file option: a path that is a regular file, or (unless ``exists``) nothing yet. A named
    pipe, a device or a socket is refused by name when the command line is parsed, before
    anything is read or written (a pipe would block a read; a rename over a device as root
    would replace it)."""

    def __init__(self, *, exists: bool = False) -> None:
        super().__init__(path_type=Path, dir_okay=False, exists=exists)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        path = Path(os.fsdecode(super().convert(value, param, ctx)))
        from schemas.atomic import kind_of

        try:
            mode = os.stat(path).st_mode
        except OSError:
            return path  # absent (a file to write), or said by the command that opens it
        if not stat.S_ISREG(mode):
            raise QualifyError(f"{path}: {_named(param)}: {kind_of(mode)}, not a regular file")
        return path


def _named(param: click.Parameter | None) -> str:
    """How the user wrote the parameter: ``--db``, or an argument's name."""
    if param is None:
        return "value"
    return param.opts[0] if isinstance(param, click.Option) else param.human_readable_name


def _project_option(f: F) -> F:
    return click.option(
        "--project",
        "project_path",
        type=_RegularFile(),
        default=DEFAULT_PROJECT,
        show_default=True,
        help="Project file.",
    )(f)


def _db_option(f: F) -> F:
    return click.option(
        "--db",
        "db_path",
        type=_RegularFile(),
        default=DEFAULT_DB,
        show_default=True,
        help="Matrix database (DuckDB file).",
    )(f)


def _require_db(db_path: Path) -> None:
    if not db_path.exists():
        _fail(
            f"{db_path}: no matrix database here. Fix: run 'qualify run --host-class NAME' "
            "first, or pass --db PATH."
        )


def _check_defaults() -> Any:
    from schemas.telemetry import CheckSettings

    return CheckSettings()


_tolerance_option = click.option(
    "--tolerance",
    type=_FiniteRange(),
    default=lambda: _check_defaults().p99_tolerance,
    show_default="0.2",
    help="Observed p99 may exceed the qualified p99 bound (in a rollout step, also the rest "
    "of the class's p99) by this fraction before an alert.",
)
_min_samples_option = click.option(
    "--min-samples",
    type=int,
    default=lambda: _check_defaults().min_samples,
    show_default="662",
    help="Fewest latency samples a class's p99 is judged on.",
)
