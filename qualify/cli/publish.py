"""What every publishing command (``manifest generate --publish``, ``manifest publish``, each
``qualify rollout`` step) shares: its publish options, read as one value (`Publishing`), and
what it does around its publish: complete or discard what an interrupted one left first, and
warn when hosts would refuse the whole manifest written."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from qualify.cli.errors import _fail
from qualify.cli.options import _RegularFile

if TYPE_CHECKING:
    from qualify.release.publishing import PublishOptions

__all__ = ["Publishing", "publish_options"]


@dataclass(frozen=True)
class Publishing:
    """The publish options as given on the command line, one value; `options` makes them the
    action's `PublishOptions` once the matrix is open (the action's time is taken then)."""

    out: Path | None
    """``--out``; ``None`` where the command's default depends on what it does."""
    key_path: Path | None
    unsigned: bool
    expires: str
    per_class_dir: Path | None
    asks: bool = False
    """The command has ``--who`` and ``--why`` (``manifest publish``, ``generate``); a rollout
    step has its own ``--why`` and says who itself (`qualify.rollout.actor`)."""
    who: str | None = None
    """``--who``; ``None``: not given (the OS user name)."""
    why: str | None = None
    """``--why``; ``None``: not given."""

    def said(self) -> tuple[str, str]:
        """Who publishes (``--who``, else the OS user name; empty where there is none) and why
        (``--why``, empty when not given), checked.

        Raises:
            QualifyError: a bad ``--who`` or ``--why`` (`publishing.check_said`).
        """
        from qualify.release.publishing import check_said, os_user

        why = self.why or ""
        if self.who is not None:
            check_said(self.who, why)
            return self.who, why
        who = os_user()
        check_said(who, why, who_is="the OS user name (the default of --who)")
        return who or "", why

    def validity(self) -> timedelta:
        """``--expires`` as a span; a usage error for a bad one, a contradictory signing
        choice (neither ``--key`` nor ``--unsigned``, or both), or a bad ``--who``/``--why``."""
        from qualify.release.generate import MAX_VALIDITY, parse_duration

        if self.asks:
            self.said()
        if self.key_path is None and not self.unsigned:
            _fail(
                "pass --key KEYFILE to sign the manifest (or --unsigned to write one hosts refuse)"
            )
        if self.key_path is not None and self.unsigned:
            _fail("--key and --unsigned contradict each other; pass one")
        return parse_duration(self.expires, what="--expires", most=MAX_VALIDITY)

    def options(self, *, out: Path | None = None, why: str = "", who: str = "") -> PublishOptions:
        """The action's `PublishOptions`, its time now (``out``: where ``--out`` was left to
        the command's default; ``why`` and ``who``: a rollout step's, where the command has no
        ``--who``/``--why`` of its own, `asks`)."""
        from datetime import UTC, datetime

        from qualify.release.publishing import PublishOptions

        target = out or self.out
        if target is None:  # a command that leaves --out to a default passes it here
            raise ValueError("Publishing.options needs out= when --out has no default")
        validity = self.validity()
        if self.asks:
            who, why = self.said()
        return PublishOptions(
            key_path=self.key_path,
            out=target,
            now=datetime.now(UTC),
            expires_in=validity,
            per_class_dir=self.per_class_dir,
            why=why,
            who=who,
        )


def publish_options(
    *,
    out_help: str,
    out_default: str | None = "manifest.json",
    unsigned: bool = False,
    asks: bool = False,
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """``--out``, ``--key`` (``--unsigned`` too where ``unsigned``: else the key is
    required), ``--expires``, ``--per-class`` and, where ``asks``, ``--who`` and ``--why``,
    handed to the command as one ``publishing`` argument (`Publishing`)."""

    def decorate(f: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(f)
        def command(
            *args: Any,
            out: Path | None,
            key_path: Path | None,
            expires: str,
            per_class_dir: Path | None,
            **kwargs: Any,
        ) -> None:
            said = kwargs.pop("unsigned", False)
            # a rollout step's own --why is its command's, not these
            who, why = (kwargs.pop("who"), kwargs.pop("why")) if asks else (None, None)
            publishing = Publishing(
                out, key_path, said, expires, per_class_dir, asks=asks, who=who, why=why
            )
            f(*args, publishing=publishing, **kwargs)

        options = _signing_options(out_help, out_default, unsigned)
        if asks:
            options += _said_options()
        wrapped: Callable[..., None] = command
        for option in reversed(options):
            wrapped = option(wrapped)
        return wrapped

    return decorate


def _signing_options(
    out_help: str, out_default: str | None, unsigned: bool
) -> list[Callable[[Any], Any]]:
    """``--out``, ``--key`` (and ``--unsigned``), ``--expires`` and ``--per-class``."""
    return [
        click.option(
            "--out",
            type=_RegularFile(),
            default=out_default,
            show_default=out_default is not None,
            help=out_help,
        ),
        click.option(
            "--key",
            "key_path",
            required=not unsigned,
            type=_RegularFile(exists=True),
            help="Ed25519 private key (from 'qualify keygen'); every version is signed with it.",
        ),
        *(
            [
                click.option(
                    "--unsigned", is_flag=True, help="Publish it unsigned (hosts refuse it)."
                )
            ]
            if unsigned
            else []
        ),
        click.option(
            "--expires", default="30d", show_default=True, help="Validity, e.g. 30d, 12h."
        ),
        click.option(
            "--per-class",
            "per_class_dir",
            type=click.Path(path_type=Path, file_okay=False),
            help="Also write the version as one signed document per host class into this "
            "directory (where hosts of a large fleet read theirs).",
        ),
    ]


def _said_options() -> list[Callable[[Any], Any]]:
    """``--who`` and ``--why``: recorded with the version the command publishes (their bounds
    are checked, and said, by ``qualify.release.publishing.check_said``)."""
    return [
        click.option(
            "--who",
            metavar="NAME",
            help="Who publishes, recorded with the version (see qualify manifest history); one "
            "line of text.  [default: the OS user name]",
        ),
        click.option(
            "--why",
            metavar="TEXT",
            help="Why it is published, recorded with the version; one line of text.",
        ),
    ]


def _recover(db: Any) -> None:
    """Complete or discard what an interrupted publish left (``qualify.release.publishing.recover``)
    before anything else is published, and say which: every publishing command does this."""
    from qualify.release.publishing import recover

    for line in recover(db):
        click.echo(f"recovered: {line}")


_BESIDE_MOST = 1_000
"""Entries of the manifest file's folder looked at for per-class directories left behind."""


def _warn_if_hosts_refuse(out: Path, per_class_dir: Path | None, version: int, model: str) -> None:
    """Say so on stderr when hosts will not see version ``version`` just written to ``out``:
    a per-class directory of the same model line beside it still names an older version (this
    one was not written there), or the whole manifest is larger than ``resolve-artifact``
    reads by default (a fleet past ~37,000 classes)."""
    _warn_left_behind(out, per_class_dir, version, model)
    _warn_if_too_large(out, per_class_dir)


def _warn_left_behind(out: Path, per_class_dir: Path | None, version: int, model: str) -> None:
    import itertools
    import os

    from manifest.perclass import MARKER, published_set
    from qualify.text import one_line

    written = per_class_dir.resolve() if per_class_dir is not None else None
    try:
        with os.scandir(out.resolve().parent) as entries:
            beside = [Path(e.path) for e in itertools.islice(entries, _BESIDE_MOST) if e.is_dir()]
    except OSError:
        return
    for folder in beside:
        try:  # after the publication: nothing here may fail the command
            if folder == written or not (folder / MARKER).is_file():
                continue
            found = published_set(folder)
        except OSError:
            continue
        if found is not None and found[0] == model and found[1] < version:
            shown = one_line(folder)
            click.echo(
                f"warning: {shown} holds {one_line(model)}'s per-class documents at "
                f"v{found[1]}, and v{version} was not written there: hosts that read it stay "
                f"on v{found[1]} until it expires; publish with --per-class {shown}",
                err=True,
            )


def _warn_if_too_large(out: Path, per_class_dir: Path | None) -> None:
    from manifest import envelope

    try:
        size = out.stat().st_size
    except OSError:
        return
    if size > envelope.MAX_BYTES:
        served = "written above" if per_class_dir is not None else "(--per-class DIR)"
        click.echo(
            f"warning: {out} is {size:,} bytes, over the {envelope.MAX_BYTES:,} that "
            f"resolve-artifact reads by default: serve hosts the per-class documents {served}, "
            f"or run them with --max-bytes {size}",
            err=True,
        )
