"""How the command line fails: every user-facing error of every package becomes a one-line
message and an exit code here (``--debug`` shows the traceback instead), a bug becomes one line
and exit 70, never a bare traceback, and a reader that closed the pipe ends the command quietly
(exit 141, as a tool SIGPIPE stopped). The group class the ``qualify`` group is made of."""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Iterator
from typing import Any, NoReturn

import click

from qualify.errors import QualifyError

__all__ = ["EXIT_CLOSED_PIPE", "EXIT_INTERNAL", "end_on_closed_pipe", "flushed_at_exit"]


def _user_errors() -> tuple[type[Exception], ...]:
    from manifest.errors import ManifestError
    from matrix.errors import MatrixError
    from reports.errors import ReportError

    return (QualifyError, MatrixError, ManifestError, ReportError)


EXIT_INTERNAL = 70
"""An unexpected error (a bug), as sysexits' EX_SOFTWARE."""

EXIT_CLOSED_PIPE = 141
"""The reader of the output went away (``qualify rollout log | head -1``): 128 + SIGPIPE, what a
shell reports for ``yes | head -1``'s ``yes``."""


class _QualifyGroup(click.Group):
    """A group that turns known errors into messages and exit codes."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except _user_errors() as exc:
            if ctx.find_root().params.get("debug"):
                raise
            _fail(str(exc), getattr(exc, "exit_code", 2))
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except BrokenPipeError:  # before OSError: a closed pipe is no error of the user's
            end_on_closed_pipe()
        except OSError as exc:  # a file the command was pointed at: say which and why
            if ctx.find_root().params.get("debug"):
                raise
            where = f"{exc.filename}: " if exc.filename else ""
            _fail(f"{where}{exc.strerror or exc}", 2)
        except (RecursionError, MemoryError) as exc:
            if ctx.find_root().params.get("debug"):
                raise
            _fail(f"input too large or too deeply nested to process ({type(exc).__name__})", 2)
        except Exception as exc:  # a bug: one line and a distinct code, never a bare traceback
            if ctx.find_root().params.get("debug"):
                raise
            if _disk_full(exc):  # from a library that says so in words (DuckDB, Arrow)
                _fail(f"the disk is full: {' '.join(str(exc).split())[:400]}", 2)
            _fail(
                f"internal error ({type(exc).__name__}: {exc}); this is a bug: run again with "
                "'qualify --debug ...' and report the traceback",
                EXIT_INTERNAL,
            )


_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_FULL_WORDS = ("No space left on device", "Disk quota exceeded", "File too large")


def _disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) says the disk, a quota or a file-size limit is full:
    DuckDB and Arrow say it in their messages, with the file's path, not as an ``OSError``."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 8:
        if isinstance(current, OSError) and current.errno in _FULL_ERRNOS:
            return True
        if any(words in str(current) for words in _FULL_WORDS):
            return True
        current, seen = current.__cause__ or current.__context__, seen + 1
    return False


def end_on_closed_pipe() -> NoReturn:
    """Stop quietly because the reader of stdout (or stderr) closed the pipe, as Unix tools do:
    no message (there is no one to read it) and `EXIT_CLOSED_PIPE`. Python ignores SIGPIPE, so a
    write raises instead of ending the process; stdout is pointed at /dev/null first so that
    the interpreter's last flush of what is still buffered cannot complain at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real stdout (a test's captured one): nothing to flush
        pass
    sys.exit(EXIT_CLOSED_PIPE)


@contextlib.contextmanager
def flushed_at_exit() -> Iterator[None]:
    """Flush stdout when the command ends, here and not by the interpreter at exit, where a
    closed pipe would print "Exception ignored ... BrokenPipeError" (`end_on_closed_pipe`)."""
    try:
        yield
    finally:
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            end_on_closed_pipe()


def _say(message: str) -> None:
    """A line on stderr, whatever stderr is (a wait must be said in a pipe too)."""
    click.echo(f"qualify: {message}", err=True)


def _fail(message: str, code: int = 2) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)
