"""``qualify candidates``: make variants of the baseline (`qualify.candidates.make`)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from qualify.cli.errors import _fail
from qualify.cli.options import _db_option, _FiniteRange, _project_option

__all__ = ["candidates_cmd"]


@click.command("candidates")
@_project_option
@_db_option
@click.option(
    "--variant",
    "variants",
    multiple=True,
    metavar="NAME",
    help="A variant to make (repeatable): int8-dynamic, int8-qdq-per-channel, "
    "int8-qdq-reduce-range, fp16, pruned; default: all.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Folder for the variant files; default: models/candidates beside the project file.",
)
@click.option(
    "--prune-ratio",
    type=_FiniteRange(0.01, 0.9),
    default=0.25,
    show_default=True,
    help="Share of hidden units the pruned variant removes (by weight magnitude).",
)
@click.option(
    "--no-write", "no_write", is_flag=True, help="Do not add the variants to the project file."
)
def candidates_cmd(
    project_path: Path,
    db_path: Path,
    variants: tuple[str, ...],
    out_dir: Path | None,
    prune_ratio: float,
    no_write: bool,
) -> None:
    """Make candidate variants of the baseline and add them to the project file.

    int8 dynamic (per-channel, 7-bit weights), int8 static QDQ calibrated on the workload's
    recorded inputs (per-channel, and per-tensor with reduce_range: integer kernels differ
    between CPUs), fp16 with float32 inputs and outputs, and a structurally pruned model
    (hidden units of MatMul pairs removed by weight magnitude; not fine-tuned). A workload
    without recorded inputs (as qualify init writes it) skips static int8 and says how to
    record them. Each variant goes into the artifact store with its lineage in the matrix
    (parent digest, tool and version, every parameter, calibration data digest; the report
    and qualify.open(...).lineage() show it) and into the project file with a one-line how:;
    qualify run then qualifies them like any candidate.

    Exit status: 0 when a variant was made (each one not made is named on stderr, once, with
    why and the fix), 1 when none could be, 2 for a usage or project-file error.
    """
    from qualify.candidates.convert import VARIANTS
    from qualify.candidates.make import make_candidates
    from qualify.project.load import load_project

    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        _fail(f"--variant {unknown[0]!r}: not a variant; pick from {', '.join(VARIANTS)}")
    loaded = load_project(project_path)
    outcome = make_candidates(
        loaded,
        db_path=db_path,
        out_dir=out_dir,
        which=variants or None,
        prune_ratio=prune_ratio,
        write=not no_write,
        on_event=lambda line: click.echo(line),
    )
    for name, why in outcome.failed.items():
        click.echo(f"qualify: {name}: not made: {why}", err=True)
    for why, names in _grouped(outcome.skipped).items():
        click.echo(f"qualify: {' and '.join(names)}: skipped: {why}", err=True)
    if outcome.made and not no_write:
        click.echo(
            f"added {len(outcome.made)} candidate(s) to {loaded.path}; next: qualify run "
            "--host-class NAME"
        )
    sys.exit(outcome.exit_code)


def _grouped(reasons: dict[str, str]) -> dict[str, list[str]]:
    """Names by the reason they share, so that one reason is said once."""
    grouped: dict[str, list[str]] = {}
    for name, why in reasons.items():
        grouped.setdefault(why, []).append(name)
    return grouped
