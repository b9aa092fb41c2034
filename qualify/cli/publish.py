"""What every publishing command (``manifest generate --publish``, ``manifest publish``, each
``qualify rollout`` step) does around its publish: complete or discard what an interrupted one
left first, and warn when hosts would refuse the whole manifest written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

__all__ = []


def _recover(db: Any) -> None:
    """Complete or discard what an interrupted publish left (``qualify.release.publishing.recover``)
    before anything else is published, and say which: every publishing command does this."""
    from qualify.release.publishing import recover

    for line in recover(db):
        click.echo(f"recovered: {line}")


def _warn_if_hosts_refuse(out: Path, per_class_dir: Path | None) -> None:
    """Say so on stderr when the whole manifest just written to ``out`` is larger than hosts'
    ``resolve-artifact`` reads by default (a fleet past ~37,000 classes), and what serves them."""
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
