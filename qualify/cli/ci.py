"""What a CI job asks of ``qualify run``, ``matrix gate`` and ``fleet run``: the JUnit XML, the
markdown summary and the release gate (``--gate``, exit 3), compared with the published
manifest (``--manifest``, ``--pubkey``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from qualify.cli.options import F, _RegularFile

__all__ = ["GATE_EXIT"]


GATE_EXIT = 3
"""Exit status of ``--gate`` when the release cannot proceed."""


def _published_options(f: F) -> F:
    f = click.option(
        "--pubkey",
        "published_pubkey",
        type=click.Path(path_type=Path, dir_okay=False, exists=True),
        help="Check --manifest's signature (and expiry) with this trusted public key.",
    )(f)
    return click.option(
        "--manifest",
        "published_manifest",
        type=click.Path(path_type=Path, dir_okay=False, exists=True),
        help="The published manifest to compare with (as a CI job fetched it); default: the "
        "newest the matrix published. A fresh checkout's matrix has none: fetch it, or restore "
        "the matrix (docs/ci.md).",
    )(f)


def _ci_options(f: F) -> F:
    f = _published_options(f)
    f = click.option(
        "--gate",
        is_flag=True,
        help="Exit 3 when the release cannot proceed: a class in scope has no measured decision "
        "or regressed from its entry in the current manifest.",
    )(f)
    f = click.option(
        "--summary-md",
        "summary_md",
        type=_RegularFile(),
        help="Write a markdown summary for a CI job (e.g. $GITHUB_STEP_SUMMARY).",
    )(f)
    return click.option(
        "--junit-xml",
        "junit_xml",
        type=_RegularFile(),
        help="Write JUnit XML: one test case per class x artifact, and one per class's decision.",
    )(f)


def _ci_outputs(
    loaded: Any,
    db_path: Path,
    scope: list[str],
    *,
    junit: Path | None,
    summary: Path | None,
    gate: bool,
    unserved: list[str] | None = None,
    published: tuple[Path | None, Path | None] = (None, None),
    gaps: dict[str, str] | None = None,
    on_check: Callable[[Any], None] | None = None,
) -> bool:
    """Write the CI files asked for; True when ``gate`` is on and the release is blocked.
    ``published``: --manifest and --pubkey, the published manifest to compare with.

    ``gaps``: classes this very command ended without a measurement, and why (a fleet run's;
    they count whatever older cells the matrix holds). Without a matrix file the files say that
    nothing was measured. ``on_check`` is given the `qualify.release.generate.ReleaseCheck`
    (``matrix gate --json`` prints it)."""
    if junit is None and summary is None and not gate:
        return False
    from datetime import UTC, datetime

    from matrix.store import MEMORY, Store
    from qualify.release.coverage import junit_xml, summary_markdown
    from qualify.release.generate import load_published, release_check
    from schemas.atomic import write_atomic

    path, pubkey = published
    current = (
        load_published(path, model=loaded.project.model, pubkey=pubkey, now=datetime.now(UTC))
        if path is not None
        else None
    )
    exists = db_path.exists()
    where = db_path if exists else MEMORY
    with Store.open(where, read_only=exists, model=loaded.project.model) as db:
        check = release_check(
            loaded, db, scope=scope, unserved=unserved or [], current=current, gaps=gaps
        )
    if on_check is not None:
        on_check(check)
    if junit is not None:
        write_atomic(junit, junit_xml(check.items, check.gate))
    if summary is not None:
        title = f"qualify: {loaded.project.model} on {', '.join(scope)}"
        write_atomic(
            summary, summary_markdown(check.items, check.gate, title=title, against=check.against)
        )
    if check.against is None:
        click.echo(
            "release gate: no published manifest to compare with: a regression from what hosts "
            "run cannot be seen (pass --manifest, or restore the matrix; docs/ci.md)",
            err=True,
        )
    for name, why in check.gate.problems.items():
        click.echo(f"release gate: {name}: {why}", err=True)
    return gate and check.gate.blocked
