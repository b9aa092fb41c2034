"""The ``qualify`` command line: the composition root.

Owns parsing options, calling one library function per command, and printing or writing its
result. Every user-facing error of every package is turned into a one-line message and an exit
code here (``--debug`` shows the traceback instead). No SQL, statistics or HTML lives here.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from qualify import __version__
from qualify.errors import QualifyError

if TYPE_CHECKING:
    from matrix.store import Store
    from qualify.project.view import ProjectView

__all__ = ["main"]

DEFAULT_PROJECT = "qualify.yaml"
DEFAULT_DB = "qualify.duckdb"

F = TypeVar("F", bound=Callable[..., Any])
M = TypeVar("M")


def _user_errors() -> tuple[type[Exception], ...]:
    from manifest.errors import ManifestError
    from matrix.errors import MatrixError
    from reports.errors import ReportError

    return (QualifyError, MatrixError, ManifestError, ReportError)


EXIT_INTERNAL = 70
"""An unexpected error (a bug), as sysexits' EX_SOFTWARE."""


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


def _say(message: str) -> None:
    """A line on stderr, whatever stderr is (a wait must be said in a pipe too)."""
    click.echo(f"qualify: {message}", err=True)


def _fail(message: str, code: int = 2) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


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
) -> bool:
    """Write the CI files asked for; True when ``gate`` is on and the release is blocked.
    ``published``: --manifest and --pubkey, the published manifest to compare with.

    ``gaps``: classes this very command ended without a measurement, and why (a fleet run's;
    they count whatever older cells the matrix holds). Without a matrix file the files say that
    nothing was measured."""
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


@click.group(cls=_QualifyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="qualify")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
def cli(debug: bool) -> None:
    """Qualify ONNX artifacts per host class and publish signed release manifests."""


@cli.command("run")
@click.option("--host-class", "host_class", required=True, help="Host class to qualify.")
@_project_option
@_db_option
@click.option(
    "--emulate",
    is_flag=True,
    help="Measure even if this host does not match the class (cells are marked emulated), and "
    "compute parity on an emulated CPU of the class's ISA under QEMU where one exists (see "
    "qualify emulators show).",
)
@click.option(
    "--shared-host",
    is_flag=True,
    help="Measure without the host-wide lock, alongside other runs on this host (their tails "
    "suffer each other); cells say measured_alone false.",
)
@click.option(
    "--soak",
    "soak",
    metavar="DURATION",
    help="After the interleaved rounds, serve every artifact this long (e.g. 10m) at the gate "
    "config and judge drift (overrides workload.soak_s).",
)
@click.option(
    "--open-loop",
    "open_loop",
    is_flag=True,
    help="After the interleaved rounds, find each artifact's highest request rate (Poisson "
    "arrivals) whose p99 meets the class's budget (workload.open_loop, or its defaults).",
)
@click.option(
    "--lock-wait",
    "lock_wait",
    metavar="DURATION",
    default="10m",
    show_default=True,
    help="How long to wait for another run measuring on this host (the host-wide lock) before "
    "giving up, e.g. 30s, 1h; who holds it is said every 10 s.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the run summary as JSON.")
@_ci_options
def run_cmd(
    host_class: str,
    project_path: Path,
    db_path: Path,
    emulate: bool,
    shared_host: bool,
    soak: str | None,
    open_loop: bool,
    lock_wait: str,
    as_json: bool,
    junit_xml: Path | None,
    summary_md: Path | None,
    gate: bool,
    published_manifest: Path | None,
    published_pubkey: Path | None,
) -> None:
    """Qualify every artifact on one host class and store the cells in the matrix.

    Exit status: 0 when every cell was measured (whatever its verdict), 1 when any cell ended
    in error, 2 for a usage or project-file error or a host that does not match the class, 3
    with --gate when the release cannot proceed for this class.
    """
    from datetime import timedelta

    from qualify.measure.runner import start_probe

    start_probe()  # its interpreter starts while this one loads the run and the project
    from qualify.console import RunDisplay, run_summary
    from qualify.project.load import load_project
    from qualify.release.generate import parse_duration
    from qualify.run import RunOptions, qualify_run

    soak_s = None
    if soak is not None:
        soak_s = parse_duration(soak, what="--soak", most=timedelta(days=7)).total_seconds()
        if soak_s < 10:
            _fail(f"--soak {soak!r}: a soak needs at least 10s to have windows worth comparing")
    lock_wait_s = parse_duration(
        lock_wait, what="--lock-wait", most=timedelta(days=1)
    ).total_seconds()
    loaded = load_project(project_path)
    options = RunOptions(
        db_path=db_path,
        emulate=emulate,
        measure_alone=not shared_host,
        host_lock_wait_s=lock_wait_s,
        soak_s=soak_s,
        open_loop=open_loop,
    )
    with RunDisplay(enabled=not as_json) as display:
        waits = display.event if display.console.is_terminal and not as_json else _say
        outcome = qualify_run(
            loaded,
            host_class,
            options,
            on_event=display.event,
            on_wait=waits,
            on_progress=display.progress,
        )
    summary = run_summary(outcome.bundle)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        display.print_cells(outcome.bundle, loaded.project)
    blocked = _ci_outputs(
        loaded,
        db_path,
        [host_class],
        junit=junit_xml,
        summary=summary_md,
        gate=gate,
        published=(published_manifest, published_pubkey),
    )
    sys.exit(1 if not outcome.ok else GATE_EXIT if blocked else 0)


@cli.command("candidates")
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


@cli.command("tune")
@click.option("--host-class", "host_class", required=True, help="Host class to tune.")
@_project_option
@_db_option
@click.option(
    "--budget",
    "budget",
    default="2m",
    show_default=True,
    metavar="DURATION",
    help="Wall time for the race of configurations (the winner's qualification run comes on "
    "top), e.g. 90s, 5m.",
)
@click.option(
    "--max-trials",
    type=click.IntRange(2, 32),
    default=8,
    show_default=True,
    help="Configurations raced, the class's current settings included.",
)
@click.option("--artifact", help="Artifact to tune with; default: the first candidate.")
@click.option(
    "--no-write",
    "no_write",
    is_flag=True,
    help="Do not write the winner into the project file (still raced, qualified and stored).",
)
@click.option("--emulate", is_flag=True, help="Tune even if this host does not match the class.")
@click.option("--json", "as_json", is_flag=True, help="Print the tune record as JSON.")
def tune_cmd(
    host_class: str,
    project_path: Path,
    db_path: Path,
    budget: str,
    max_trials: int,
    artifact: str | None,
    no_write: bool,
    emulate: bool,
    as_json: bool,
) -> None:
    """Race session settings for one class and keep the fastest that passes every gate.

    Tries the class's current provider settings against changes of threads, execution mode,
    graph optimisation level, thread spinning, CPU affinity, integer precision and the
    provider's own options, each in its own process with interleaved, paired rounds, dropping
    the clearly slower half after each stage. A configuration wins only when its p50 and p99
    ratios to the current settings have upper confidence bounds of at most 1; it is then
    qualified by a full run (parity included) and, on pass, written into the class's provider
    section. Every trial is stored in the matrix (qualify report shows them).

    Exit status: 0 when the tune finished (whether or not anything beat the current settings),
    1 when the winner's qualification run failed or no trial finished to be compared with the
    current settings (every one timed out or failed: each is said), 2 for a usage or
    project-file error.
    """
    from datetime import timedelta

    from qualify.console import RunDisplay
    from qualify.project.load import load_project
    from qualify.release.generate import parse_duration
    from qualify.run import RunOptions
    from qualify.tune import TuneOptions, tune_class

    budget_s = parse_duration(budget, what="--budget", most=timedelta(hours=12)).total_seconds()
    if budget_s < 5:
        _fail(f"--budget {budget!r}: a race needs at least 5s to compare anything")
    loaded = load_project(project_path)
    options = RunOptions(db_path=db_path, emulate=emulate)
    tune = TuneOptions(
        budget_s=budget_s, max_trials=max_trials, artifact=artifact, write=not no_write
    )
    with RunDisplay(enabled=not as_json) as display:
        outcome = tune_class(
            loaded, host_class, options, tune, on_event=display.event, on_progress=display.progress
        )
    record = outcome.record
    if as_json:
        click.echo(record.model_dump_json(indent=2))
    else:
        for trial in record.trials:
            r = trial.vs_current
            ratio = (
                f"p50 x{r.p50_ratio:.3f} [{_bound(r.p50_lower)}, {_bound(r.p50_upper)}]  "
                f"p99 x{r.p99_ratio:.3f} [{_bound(r.p99_lower)}, {_bound(r.p99_upper)}]"
                if r is not None and r.p50_ratio is not None and r.p99_ratio is not None
                else "no paired rounds"
                if trial.trial
                else "reference"
            )
            click.echo(f"  {trial.trial:>2} {trial.status:<9} {trial.label:<40} {ratio}")
        if outcome.measured:
            click.echo(f"winner: {record.winner_label}: {record.outcome}")
        else:
            click.echo(f"no winner: {record.outcome}")
    failed = record.winner != 0 and record.qualification_verdict != "pass"
    sys.exit(1 if failed or not outcome.measured else 0)


def _bound(value: float | None) -> str:
    return "?" if value is None else f"{value:.3f}"


@cli.group("emulators")
def emulators_group() -> None:
    """What --emulate needs to measure a class's numerics on an emulated CPU of its ISA."""


@emulators_group.command("prepare")
@click.option("--class", "class_name", help="Host class to prepare for.")
@click.option(
    "--arch",
    type=click.Choice(["aarch64"]),
    help="Prepare for this architecture instead of a class (this host's onnxruntime and numpy).",
)
@_project_option
@click.option(
    "--into",
    type=click.Path(path_type=Path, file_okay=False),
    help="Emulators folder; default: $QUALIFY_EMULATORS, else ~/.cache/qualify/emulators "
    "(runs also look in 'emulators' beside the matrix).",
)
@click.option(
    "--onnxruntime",
    "onnxruntime",
    metavar="VERSION",
    help="onnxruntime version to pin; default: this host's, when the class's runtime.version "
    "takes it.",
)
@click.option("--force", is_flag=True, help="Download and assemble it again even if prepared.")
def emulators_prepare(
    class_name: str | None,
    arch: str | None,
    project_path: Path,
    into: Path | None,
    onnxruntime: str | None,
    force: bool,
) -> None:
    """Download and assemble the runtime a class's emulated CPU needs (the only command that
    downloads: Debian's packages of the architecture's Python, onnxruntime and numpy wheels
    from PyPI, each recorded with its digest)."""
    from importlib import metadata

    from qualify.measure.emulators import prepare_for_class
    from qualify.measure.runner import probe_runtime
    from qualify.measure.sysroot import prepare_runtime, user_emulator_dir
    from qualify.project.load import load_project

    if (class_name is None) == (arch is None):
        _fail("pass --class NAME (from the project file) or --arch aarch64, one of them")

    def say(message: str) -> None:
        click.echo(f"  {message}", err=True)

    folder = into or user_emulator_dir()
    host_version = str(probe_runtime()["version"])
    if arch is not None:
        path: Path | None = prepare_runtime(
            arch,
            onnxruntime or host_version,
            metadata.version("numpy"),
            folder,
            on_event=say,
            force=force,
        )
    else:
        classes = load_project(project_path, check_models=False).project.host_classes
        if class_name not in classes:
            _fail(f"{project_path}: host_classes: no class named {class_name!r}")
        path = prepare_for_class(
            classes[str(class_name)],
            folder,
            host_version=host_version,
            numpy_version=metadata.version("numpy"),
            onnxruntime=onnxruntime,
            on_event=say,
            force=force,
        )
    if path is not None:
        click.echo(f"prepared {path}")


@emulators_group.command("show")
@_project_option
@_db_option
def emulators_show(project_path: Path, db_path: Path) -> None:
    """QEMU, the prepared runtimes, and each class's emulated CPU (each runtime verified)."""
    from qualify.measure.emulators import Emulators, status_lines
    from qualify.measure.sysroot import emulator_dirs
    from qualify.project.load import load_project

    classes = load_project(project_path, check_models=False).project.host_classes
    dirs = emulator_dirs(db_path.resolve().parent)
    for line in status_lines(classes, Emulators(runtime_dirs=dirs)):
        click.echo(line)


@cli.group("matrix")
def matrix_group() -> None:
    """Read, load and export the qualification matrix."""


@matrix_group.command("show")
@_db_option
@_project_option
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json", "csv"]),
    default="table",
    show_default=True,
    help="Output format.",
)
def matrix_show(db_path: Path, project_path: Path, fmt: str) -> None:
    """Show each class x artifact of the project with its verdict under the project file now
    (budgets, tolerances and the artifacts' bytes as they are today; stale where the stored
    evidence cannot say), and every gap. Without a project file: the latest cell per
    (hardware, runtime, provider, artifact), as measured."""
    from matrix.store import Store
    from qualify.release.coverage import CoverageItem, coverage_line, unmeasured
    from qualify.table import (
        TITLE,
        TITLE_NOW,
        print_matrix,
        rows_to_csv,
        warning_lines,
        with_budgets,
    )
    from qualify.text import one_line

    _require_db(db_path)
    items: list[CoverageItem] | None = None
    orphans = 0
    title = TITLE
    with Store.open(db_path, read_only=True) as db:  # showing never writes, nor migrates
        rows = with_budgets(db.matrix_rows(), None)
        unserved = db.unserved()
        warned = db.latest_warnings() if fmt == "table" else []
        if project_path.exists() and not rows and db.model_line() is None:
            # Nothing measured, of any line: every class x artifact is a gap, which the
            # project's recorded view says without validating the file again.
            items = unmeasured(_project_view(project_path, db), unserved=unserved)
        elif project_path.exists():
            from qualify.project.load import load_project
            from qualify.release.current import show_now

            loaded = load_project(project_path, check_models=False)
            db.require_model_line(loaded.project.model)
            shown = show_now(loaded, db, unserved=unserved)
            rows, items, orphans, title = shown.rows, shown.items, shown.orphans, TITLE_NOW
    if fmt == "json":
        click.echo(json.dumps(rows, indent=2, default=str))
    elif fmt == "csv":
        click.echo(rows_to_csv(rows), nl=False)
    else:
        print_matrix(rows, sys.stdout, title=title)
        for line in warning_lines(warned):
            click.echo(line)
        for item in items or ():
            if item.gap is not None:
                click.echo(
                    f"gap: {one_line(item.host_class)} x {one_line(item.artifact)}: "
                    + one_line(item.note)
                )
        if items is not None:
            click.echo(coverage_line(items))
        if orphans:
            click.echo(
                f"not shown: {orphans} cell(s) measured on keys no class of {project_path} has"
            )


def _project_view(project_path: Path, db: Store) -> ProjectView:
    """What ``matrix show`` needs of the project file: the view a writer recorded for these very
    bytes, else the file validated in full (its errors are the project loader's)."""
    from qualify.project.view import ProjectView, recorded_view

    view = recorded_view(db, project_path)
    if view is not None:
        return view
    from qualify.project.load import load_project

    return ProjectView.of(load_project(project_path, check_models=False).project)


def _require_db(db_path: Path) -> None:
    if not db_path.exists():
        _fail(
            f"{db_path}: no matrix database here. Fix: run 'qualify run --host-class NAME' "
            "first, or pass --db PATH."
        )


@matrix_group.command("gate")
@_db_option
@_project_option
@_published_options
@click.option("--classes", help="Comma-separated classes in scope; default: every class.")
@click.option(
    "--junit-xml",
    "junit_xml",
    type=_RegularFile(),
    help="Write JUnit XML: one test case per class x artifact, and one per class's decision.",
)
@click.option(
    "--summary-md",
    "summary_md",
    type=_RegularFile(),
    help="Write a markdown summary for a CI job (e.g. $GITHUB_STEP_SUMMARY).",
)
def matrix_gate(
    db_path: Path,
    project_path: Path,
    published_manifest: Path | None,
    published_pubkey: Path | None,
    classes: str | None,
    junit_xml: Path | None,
    summary_md: Path | None,
) -> None:
    """Whether a release can proceed from the matrix as it is (e.g. after ingesting bundles).

    Compares with --manifest (the published manifest, fetched), else the newest manifest the
    matrix published; with neither it says that a regression cannot be seen.

    Exit status: 0 when every class in scope has a measured decision and none regressed from
    the current manifest, 3 when the release cannot proceed, 2 for a usage or project error.
    """
    from qualify.project.load import load_project

    _require_db(db_path)
    loaded = load_project(project_path, check_models=False)
    known = list(loaded.project.host_classes)
    scope = [c.strip() for c in classes.split(",") if c.strip()] if classes else known
    unknown = [c for c in scope if c not in known]
    if unknown:
        _fail(f"--classes: {', '.join(unknown)} not in {loaded.path}; pick from {', '.join(known)}")
    blocked = _ci_outputs(
        loaded,
        db_path,
        scope,
        junit=junit_xml,
        summary=summary_md,
        gate=True,
        published=(published_manifest, published_pubkey),
    )
    if not blocked:
        click.echo("release gate: the release can proceed for " + ", ".join(scope))
    sys.exit(GATE_EXIT if blocked else 0)


@matrix_group.command("ingest")
@click.argument("bundles", nargs=-1, required=True, type=click.Path(path_type=Path, exists=True))
@_db_option
def matrix_ingest(bundles: tuple[Path, ...], db_path: Path) -> None:
    """Load run bundles (from other hosts) into the matrix; idempotent by run id."""
    from matrix.ingest import ingest_bundles
    from matrix.store import Store
    from qualify.measure.hostlock import lock_wait_message

    with Store.open(db_path, on_wait=lock_wait_message()) as db:
        report = ingest_bundles(db, list(bundles))
    for item in report.bundles:
        state = "ingested" if item.status == "ingested" else "already present"
        click.echo(f"{item.run_id}: {state} ({item.cells} cells, {item.samples} samples)")


@matrix_group.command("export")
@click.option(
    "--parquet",
    "out_dir",
    required=True,
    type=click.Path(path_type=Path, file_okay=False),
    help="Directory to write one Parquet file per table.",
)
@_db_option
def matrix_export(out_dir: Path, db_path: Path) -> None:
    """Export the matrix tables and view as Parquet."""
    from matrix.store import Store

    _require_db(db_path)
    with Store.open(db_path, read_only=True) as db:
        paths = db.export_parquet(out_dir)
    for p in paths:
        click.echo(str(p))


@matrix_group.command("split")
@click.option("--model", required=True, help="The model line to copy out (a project's 'model').")
@click.option(
    "--out",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="The new matrix to write (must not exist).",
)
@_db_option
def matrix_split(model: str, out: Path, db_path: Path) -> None:
    """Copy one model line out of a matrix that mixes lines (written before qualify kept one line
    per matrix) into a new matrix of that line alone: its runs, cells and samples, its manifests
    and rollouts, and the telemetry, tunes and lineage of its artifacts. The source is only
    read; run it once per line, then give each project its own --db."""
    from matrix.store import Store

    _require_db(db_path)
    copied = Store.split_model_line(db_path, model, out)
    said = ", ".join(f"{n} {table}" for table, n in copied.items() if n)
    click.echo(f"{out}: model line {model!r}: {said or 'nothing'} copied from {db_path}")


@matrix_group.command("stale")
@_db_option
@_project_option
@click.option(
    "--since",
    default="7d",
    show_default=True,
    help="How far back telemetry counts for runtime revisions never qualified.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON for automation.")
def matrix_stale(db_path: Path, project_path: Path, since: str, as_json: bool) -> None:
    """List classes and cells to re-run: settings changed, or unqualified runtimes in telemetry."""
    import json
    from datetime import UTC, datetime

    from qualify.project.load import load_project
    from qualify.release.current import file_digests
    from qualify.telemetry.render import render_stale
    from qualify.telemetry.watch import run_stale

    loaded = load_project(project_path, check_models=False)
    _require_db(db_path)
    items = run_stale(
        db_path,
        loaded.project,
        now=datetime.now(UTC),
        since=since,
        digests=file_digests(loaded),
    )
    if as_json:
        click.echo(json.dumps({"stale": [i.model_dump(mode="json") for i in items]}, indent=2))
    else:
        click.echo(render_stale(items))


@cli.group("telemetry")
def telemetry_group() -> None:
    """Load telemetry from deployed hosts and check it against what was qualified."""


@telemetry_group.command("ingest")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@_db_option
def telemetry_ingest(files: tuple[Path, ...], db_path: Path) -> None:
    """Load JSON-lines telemetry files; idempotent, bad lines reported and skipped."""
    from datetime import UTC, datetime

    from qualify.telemetry.watch import ingest_files

    report = ingest_files(db_path, list(files), now=datetime.now(UTC))
    for f in report.files:
        click.echo(
            f"{f.path}: {f.status}, {f.events} events, {f.bad_lines} bad lines"
            + (
                f", {f.pending_bytes} bytes after the last newline kept for later"
                if f.pending_bytes
                else ""
            )
        )
        for bad in f.bad:
            click.echo(f"  {f.path}:{bad.line}: {bad.message}", err=True)


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


@telemetry_group.command("check")
@click.option(
    "--since",
    default=lambda: _check_defaults().since,
    show_default="24h",
    help="Judge events from this far back.",
)
@_tolerance_option
@_min_samples_option
@click.option(
    "--propagation-deadline",
    default=lambda: _check_defaults().propagation_deadline,
    show_default="6h",
    help="How long after a manifest version changed what a host runs the host may still be on "
    "an older one before that is a 'lagging' warning (before it, lagging hosts are only "
    "reported).",
)
@click.option(
    "--manifest",
    "manifest_path",
    type=_RegularFile(exists=True),
    help="Manifest to compare with; default: the newest in the matrix, else ./manifest.json.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the alerts as JSON.")
@_db_option
def telemetry_check(
    since: str,
    tolerance: float,
    min_samples: int,
    propagation_deadline: str,
    manifest_path: Path | None,
    as_json: bool,
    db_path: Path,
) -> None:
    """Alert per host class on digest, provider, fallback, p99, runtime, lag and no-data
    problems. Each event is judged against the manifest version it reports (or the one
    published at its time); events of another model line are skipped and counted.

    Exit status: 0 no alerts, 1 alerts raised (gate a cron job or CI on it), 2 usage errors.
    """
    from datetime import UTC, datetime

    from qualify.release.generate import parse_duration
    from qualify.telemetry.render import render_check
    from qualify.telemetry.watch import run_check
    from schemas.telemetry import CheckSettings

    settings = _settings(
        CheckSettings,
        {
            "since": since,
            "p99_tolerance": tolerance,
            "min_samples": min_samples,
            "propagation_deadline": propagation_deadline,
        },
        {
            "since": "--since",
            "p99_tolerance": "--tolerance",
            "min_samples": "--min-samples",
            "propagation_deadline": "--propagation-deadline",
        },
    )
    # a bad value is said before anything is read
    parse_duration(settings.since, what="--since")
    parse_duration(settings.propagation_deadline, what="--propagation-deadline")
    _require_db(db_path)
    check = run_check(
        db_path, now=datetime.now(UTC), settings=settings, manifest_path=manifest_path
    )
    click.echo(check.model_dump_json(indent=2) if as_json else render_check(check))
    sys.exit(1 if check.alerts else 0)


@cli.command("keygen")
@click.argument("name")
@click.option(
    "--dir",
    "directory",
    type=click.Path(path_type=Path, file_okay=False),
    default=".",
    show_default=True,
    help="Where to write NAME.key and NAME.pub.",
)
@click.option("--force", is_flag=True, help="Overwrite an existing key pair.")
def keygen_cmd(name: str, directory: Path, force: bool) -> None:
    """Create an Ed25519 signing key pair: NAME.key (mode 600) and NAME.pub."""
    from manifest.signing import generate_keypair, key_id, load_public_key

    directory.mkdir(parents=True, exist_ok=True)
    key_path, pub_path = generate_keypair(name, directory, overwrite=force)
    click.echo(f"private key: {key_path} (keep it secret)")
    click.echo(f"public key:  {pub_path} (ship it to hosts)")
    click.echo(f"key id:      {key_id(load_public_key(pub_path))}")


@cli.group("manifest")
def manifest_group() -> None:
    """Generate, verify, compare and show signed release manifests."""


def _key_option(f: F) -> F:
    return click.option(
        "--key",
        "key_path",
        type=_RegularFile(exists=True),
        help="Ed25519 private key (from 'qualify keygen').",
    )(f)


def _publish_options(f: F) -> F:
    for option in reversed(
        (
            _key_option,
            click.option("--unsigned", is_flag=True, help="Publish it unsigned (hosts refuse it)."),
            click.option(
                "--expires", default="30d", show_default=True, help="Validity, e.g. 30d, 12h."
            ),
            click.option(
                "--per-class",
                "per_class_dir",
                type=click.Path(path_type=Path, file_okay=False),
                help="Also write one signed document per host class into this directory.",
            ),
        )
    ):
        f = option(f)
    return f


def _signing_choice(key_path: Path | None, unsigned: bool, expires: str) -> Any:
    from qualify.release.generate import MAX_VALIDITY, parse_duration

    if key_path is None and not unsigned:
        _fail("pass --key KEYFILE to sign the manifest (or --unsigned to write one hosts refuse)")
    if key_path is not None and unsigned:
        _fail("--key and --unsigned contradict each other; pass one")
    return parse_duration(expires, what="--expires", most=MAX_VALIDITY)


def _recover(db: Any) -> None:
    """Complete or discard what an interrupted publish left (``qualify.release.publishing.recover``)
    before anything else is published, and say which: every publishing command does this."""
    from qualify.release.publishing import recover

    for line in recover(db):
        click.echo(f"recovered: {line}")


def _echo_published(result: Any, out: Path, per_class_dir: Path | None) -> None:
    from qualify.text import one_line

    # The document as written (built from validated parts and checked as a host checks it):
    # reading it back into the model would cost as much as signing a large fleet's.
    signed = result.document["signed"]
    click.echo(
        f"manifest {out}: release {signed['release']} version {signed['version']}, "
        f"{'signed' if result.signed else 'UNSIGNED'}, expires {signed['expires']}, published"
    )
    for name, entry in signed["entries"].items():
        kept = result.kept.get(name)
        click.echo(
            f"  {one_line(name)}: {entry['decision']} — {one_line(entry['summary'])}"
            + (f" [kept: {kept}]" if kept else "")
        )
    if per_class_dir is not None:
        click.echo(f"per-class documents: {per_class_dir}")
    _warn_if_hosts_refuse(out, per_class_dir)


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


@manifest_group.command("generate")
@click.option("--release", required=True, help="Release name, e.g. digits-2026.12.")
@click.option(
    "--out",
    type=_RegularFile(),
    help="File to write: the draft (default manifest.draft.json), or with --publish the "
    "published manifest (default manifest.json).",
)
@click.option(
    "--publish",
    is_flag=True,
    help="Publish at once (as 'qualify manifest publish' would): needs --key or --unsigned.",
)
@_publish_options
@click.option(
    "--artifact-base-uri",
    help="Base URL hosts fetch artifacts from (BASE/sha256/<hex>.onnx); default: file:// URIs "
    "of the artifact store beside the matrix.",
)
@_project_option
@_db_option
def manifest_generate(
    release: str,
    out: Path | None,
    publish: bool,
    key_path: Path | None,
    unsigned: bool,
    expires: str,
    per_class_dir: Path | None,
    artifact_base_uri: str | None,
    project_path: Path,
    db_path: Path,
) -> None:
    """Decide every host class from the matrix and write a draft manifest (or, with
    --publish, sign and publish it at once).

    A class gets the candidate only where its own (hardware, runtime, provider) cell passed
    every gate; otherwise the approved baseline, or the unknown-class policy without evidence.
    A class being rolled out, held or pinned keeps its published entry. A draft is unsigned and
    nothing treats it as current: review it (qualify manifest show / diff), then run
    qualify manifest publish.
    """
    from datetime import UTC, datetime

    from matrix.store import Store
    from qualify.measure.hostlock import lock_wait_message
    from qualify.project.load import load_project
    from qualify.project.view import record_view
    from qualify.release.generate import (
        MAX_VALIDITY,
        draft_manifest,
        generate_manifest,
        parse_duration,
    )

    if publish:
        validity = _signing_choice(key_path, unsigned, expires)
    else:
        if key_path is not None or unsigned or per_class_dir is not None:
            _fail(
                "a draft is not signed: add --publish to sign and publish now, or run "
                "qualify manifest publish --key KEYFILE after reviewing the draft"
            )
        validity = parse_duration(expires, what="--expires", most=MAX_VALIDITY)
    target = out or Path("manifest.json" if publish else "manifest.draft.json")
    loaded = load_project(project_path)
    _require_db(db_path)
    with Store.open(db_path, on_wait=lock_wait_message(), model=loaded.project.model) as db:
        _recover(db)
        record_view(db, loaded.project, loaded.sha256)
        if publish:
            result = generate_manifest(
                loaded,
                db,
                release=release,
                out=target,
                now=datetime.now(UTC),
                expires_in=validity,
                key_path=key_path,
                per_class_dir=per_class_dir,
                artifact_base_uri=artifact_base_uri,
            )
            _echo_published(result, target, per_class_dir)
            return
        draft = draft_manifest(
            loaded,
            db,
            release=release,
            out=target,
            now=datetime.now(UTC),
            expires_in=validity,
            artifact_base_uri=artifact_base_uri,
        )
    click.echo(f"draft {target}: release {release} version {draft.version}, not published")
    from qualify.text import one_line

    for name, entry in draft.signed["entries"].items():
        kept = draft.kept.get(name)
        click.echo(
            f"  {one_line(name)}: {entry['decision']} — {one_line(entry['summary'])}"
            + (f" [kept: {kept}]" if kept else "")
        )
    click.echo(
        f"next: qualify manifest diff manifest.json {target}, then "
        f"qualify manifest publish {target} --key KEYFILE"
    )


@manifest_group.command("publish")
@click.argument("draft", required=False, type=_RegularFile(exists=True))
@click.option(
    "--out",
    type=_RegularFile(),
    default="manifest.json",
    show_default=True,
    help="Manifest file hosts read (replaced atomically).",
)
@_publish_options
@_db_option
def manifest_publish(
    draft: Path | None,
    out: Path,
    key_path: Path | None,
    unsigned: bool,
    expires: str,
    per_class_dir: Path | None,
    db_path: Path,
) -> None:
    """Sign the draft DRAFT (default: the matrix's newest) and make it the current manifest.

    DRAFT must be exactly what manifest generate recorded; a draft older than a published
    version (a rollout step came after it) is refused: generate a new one.
    """
    from datetime import UTC, datetime

    from matrix.store import Store
    from qualify.measure.hostlock import lock_wait_message
    from qualify.release.generate import publish_manifest

    validity = _signing_choice(key_path, unsigned, expires)
    _require_db(db_path)
    with Store.open(db_path, on_wait=lock_wait_message()) as db:
        _recover(db)
        result = publish_manifest(
            db,
            out=out,
            now=datetime.now(UTC),
            expires_in=validity,
            key_path=key_path,
            draft_path=draft,
            per_class_dir=per_class_dir,
        )
    _echo_published(result, out, per_class_dir)


@manifest_group.command("verify")
@click.argument("path", type=_RegularFile(exists=True))
@click.option(
    "--pubkey",
    required=True,
    type=_RegularFile(exists=True),
    help="Trusted public key (NAME.pub).",
)
def manifest_verify(path: Path, pubkey: Path) -> None:
    """Check a manifest's signature, format and expiry."""
    from datetime import UTC, datetime

    from manifest.load import load_manifest, read_manifest_file
    from manifest.signing import load_public_key, verify

    raw = read_manifest_file(path)
    verify(raw, load_public_key(pubkey), now=datetime.now(UTC), source=str(path))
    manifest = load_manifest(raw, source=str(path))
    click.echo(
        f"{path}: OK — release {manifest.signed.release} version {manifest.signed.version}, "
        f"{len(manifest.signed.entries)} classes, expires {manifest.signed.expires}"
    )


@manifest_group.command("diff")
@click.argument("old", type=_RegularFile(exists=True))
@click.argument("new", type=_RegularFile(exists=True))
def manifest_diff(old: Path, new: Path) -> None:
    """Say which host class changes from what to what between two manifests, and why."""
    from manifest.diff import diff_manifests, render_changes
    from manifest.load import load_manifest, read_manifest_file

    a = load_manifest(read_manifest_file(old), source=str(old))
    b = load_manifest(read_manifest_file(new), source=str(new))
    click.echo(render_changes(diff_manifests(a, b), a, b))


@manifest_group.command("show")
@click.argument(
    "path",
    type=_RegularFile(exists=True),
    default="manifest.json",
)
def manifest_show(path: Path) -> None:
    """Print a manifest for people: per class, the decision, the artifact and why."""
    from manifest.load import load_manifest, read_manifest_file
    from manifest.show import render_manifest

    click.echo(render_manifest(load_manifest(read_manifest_file(path), source=str(path))))


@cli.command("report")
@click.option(
    "--out",
    type=_RegularFile(),
    default="report.html",
    show_default=True,
    help="HTML file to write (self-contained).",
)
@click.option(
    "--manifest",
    "manifest_path",
    type=_RegularFile(exists=True),
    help="Manifest to report on; default: the newest one recorded in the matrix.",
)
@click.option(
    "--pubkey",
    type=_RegularFile(exists=True),
    help="Trusted public key to verify the manifest's signature for the header.",
)
@_project_option
@_db_option
def report_cmd(
    out: Path, manifest_path: Path | None, pubkey: Path | None, project_path: Path, db_path: Path
) -> None:
    """Write the HTML qualification report: matrix heat map, per-class evidence, manifest diff."""
    from datetime import UTC, datetime

    from matrix.store import Store
    from qualify.project.load import load_project
    from qualify.reporting import write_qualification_report

    loaded = load_project(project_path, check_models=False)
    _require_db(db_path)
    with Store.open(db_path, read_only=True, model=loaded.project.model) as db:
        path = write_qualification_report(
            loaded, db, out, now=datetime.now(UTC), manifest_path=manifest_path, pubkey=pubkey
        )
    click.echo(f"report: {path}")


@cli.command("demo")
@click.option(
    "--workdir",
    type=click.Path(path_type=Path, file_okay=False),
    default="demo",
    show_default=True,
    help="Directory to build the demo in: missing or empty.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Start clean over an earlier demo: delete what a demo wrote in --workdir first. A "
    "folder no demo made, or holding other files, is refused and left as it is.",
)
def demo_cmd(workdir: Path, force: bool) -> None:
    """Build the demo project offline and qualify all of its host classes.

    The demo is one story in one folder: over an existing non-empty --workdir it refuses
    (exit 2) unless --force.
    """
    from qualify.demo.story import run_demo

    ok = run_demo(workdir, echo=click.echo, force=force)
    sys.exit(0 if ok else 1)


@cli.command("init")
@click.argument("model", type=_RegularFile(exists=True))
@click.option(
    "--candidate",
    "candidates",
    multiple=True,
    type=_RegularFile(exists=True),
    help="A candidate artifact (repeat for several).",
)
@click.option(
    "--out",
    type=_RegularFile(),
    default=DEFAULT_PROJECT,
    show_default=True,
    help="Project file to write.",
)
@click.option("--force", is_flag=True, help="Replace an existing project file.")
def init_cmd(model: Path, candidates: tuple[Path, ...], out: Path, force: bool) -> None:
    """Write a first project file from MODEL's own inputs, dtypes and shapes.

    Inputs are generated (seeded); dynamic dimensions other than the batch get a value and a
    comment saying what to choose; one host class matches this host; budgets are placeholders
    marked SET. The file loads and runs as written: then edit what it marks.
    """
    import platform

    from qualify.measure.runner import probe_runtime
    from qualify.project.init import write_initial_project

    if (out.exists() or out.is_symlink()) and not force:
        _fail(f"{out} exists; pass --force to replace it, or --out another path")
    version = str(probe_runtime()["version"])
    write_initial_project(
        model, list(candidates), out, arch=platform.machine(), runtime_version=version
    )
    click.echo(
        f"wrote {out}: edit the lines marked CHOOSE and SET, then: qualify run --host-class this-host"
    )


@cli.group("fleet")
def fleet_group() -> None:
    """Qualify every class on real hosts of that class, through Ray (pip install qualify[fleet])."""


def _connect_timeout_option(f: F) -> F:
    return click.option(
        "--connect-timeout",
        "connect_timeout",
        default="10s",
        show_default=True,
        metavar="DURATION",
        help="Most time to wait for the head's address to answer before giving up (exit 2).",
    )(f)


def _seconds(text: str, option: str, most: str = "7d") -> float:
    from datetime import timedelta

    from qualify.release.generate import parse_duration

    limit = timedelta(days=int(most[:-1]))
    return parse_duration(text, what=option, most=limit).total_seconds()


@fleet_group.command("join")
@click.option("--address", required=True, help="The Ray cluster's head, HOST:PORT.")
@_project_option
@click.option("--node-ip", "node_ip", help="The address this host is reached at (default: Ray's).")
@_connect_timeout_option
def fleet_join(address: str, project_path: Path, node_ip: str | None, connect_timeout: str) -> None:
    """Join this host to the cluster as the project's classes it matches, until stopped.

    Fingerprints the host, advertises one Ray resource per matching class
    (qualify/class/NAME), and as node labels its fingerprint, its qualify version, the digest
    of the project file and its machine (host name and boot id), then runs `ray start --block`:
    the node leaves when this command is stopped. A fleet run sends a class only to hosts whose
    version and project digest equal its own: rejoin after editing the project file.
    """
    from qualify.fleet.cluster import (
        is_loopback,
        join_argv,
        node_offer,
        parse_address,
        probe_address,
        read_boot_id,
    )
    from qualify.measure.fingerprint import take_fingerprint
    from qualify.measure.runner import probe_runtime
    from qualify.project.load import load_project

    host, _ = parse_address(address)
    if is_loopback(host):
        _fail(
            f"--address {address}: Ray's 'ray start' rewrites a loopback head address to this "
            "machine's interface address, where a head bound to loopback does not listen. Fix: "
            "start the head on an address the hosts reach (ray start --head --node-ip-address "
            "ADDR) and join ADDR:PORT"
        )
    probe_address(address, _seconds(connect_timeout, "--connect-timeout"))
    loaded = load_project(project_path)
    offer = node_offer(loaded, take_fingerprint(probe_runtime), boot_id=read_boot_id())
    for name, failures in offer.unmatched.items():
        click.echo(f"not {name}: " + "; ".join(failures))
    if not offer.classes:
        _fail(f"this host matches none of the classes of {loaded.path}; nothing to offer", 1)
    click.echo("offering: " + ", ".join(offer.classes))
    argv = join_argv(address, offer, node_ip=node_ip)
    if not Path(argv[0]).is_file():
        _fail("the fleet commands need Ray: pip install 'qualify[fleet]' (or pip install ray)")
    sys.stdout.flush()
    os.execv(argv[0], argv)


@fleet_group.command("status")
@click.option("--address", required=True, help="The Ray cluster's head, HOST:PORT.")
@_project_option
@_connect_timeout_option
def fleet_status_cmd(address: str, project_path: Path, connect_timeout: str) -> None:
    """Per class, the live hosts that can serve it, the hosts that advertise it but disagree
    with this project file or qualify version (and why), and nodes that share a machine.

    Exit status: 0 when every class has a host that may take it, 1 when some class has none,
    2 for a bad address, one that does not answer, or a project error.
    """
    from qualify.fleet.cluster import fleet_status, read_nodes
    from qualify.project.load import load_project

    loaded = load_project(project_path)
    nodes = read_nodes(address, timeout_s=_seconds(connect_timeout, "--connect-timeout"))
    status = fleet_status(loaded, nodes)
    for name, hosts in status.hosts.items():
        click.echo(f"{name}: " + (", ".join(hosts) if hosts else "no host (unserved)"))
        for line in status.mismatched.get(name, []):
            click.echo(f"  not used: {line}")
    for group in status.shared:
        click.echo("one machine, measured one at a time: " + ", ".join(group))
    if status.unknown:
        click.echo("advertised but not in the project: " + ", ".join(status.unknown))
    sys.exit(1 if status.unserved else 0)


@fleet_group.command("run")
@click.option("--address", help="The Ray cluster's head, HOST:PORT; default: Ray on this host.")
@click.option("--classes", help="Comma-separated classes to qualify; default: every class.")
@click.option(
    "--timeout",
    "timeout",
    default="1h",
    show_default=True,
    metavar="DURATION",
    help="Most time one class may measure on its host, from the moment it starts measuring "
    "(waiting for a host, its host lock or a shared machine excluded).",
)
@click.option(
    "--deadline",
    "deadline",
    default="12h",
    show_default=True,
    metavar="DURATION",
    help="Most time the whole run may take; classes not back by then end as fleet_timeout.",
)
@click.option(
    "--host-wait",
    "host_wait",
    default="30s",
    show_default=True,
    metavar="DURATION",
    help="Most time a class waits once no live host can take it (its hosts left) before it "
    "ends as node_lost or unserved.",
)
@_connect_timeout_option
@_project_option
@_db_option
@_ci_options
def fleet_run_cmd(
    address: str | None,
    classes: str | None,
    timeout: str,
    deadline: str,
    host_wait: str,
    connect_timeout: str,
    project_path: Path,
    db_path: Path,
    junit_xml: Path | None,
    summary_md: Path | None,
    gate: bool,
    published_manifest: Path | None,
    published_pubkey: Path | None,
) -> None:
    """Qualify each class on a host of that class, in parallel across hosts, into this matrix.

    Every class ends as cells or as a gap with its reason (unserved, node_lost, host_mismatch,
    fleet_timeout, host_failed, driver_stopped, driver_failed), written to the matrix as soon
    as it is known; --junit-xml and --summary-md are written whatever happens once the project
    file loads, also when the driver fails or is stopped.

    Exit status: 0 when every class came back measured without an error cell, 1 when a class
    ended as a gap or with an error cell (or the driver failed or was stopped), 2 for a usage,
    address or project error, 3 with --gate when every class came back but the release cannot
    proceed.
    """
    from qualify.fleet.cluster import FleetOptions, fleet_run
    from qualify.project.load import load_project

    options = FleetOptions(
        db_path=db_path,
        address=address,
        timeout_s=_seconds(timeout, "--timeout"),
        deadline_s=_seconds(deadline, "--deadline", most="30d"),
        host_wait_s=_seconds(host_wait, "--host-wait", most="1d"),
        connect_timeout_s=_seconds(connect_timeout, "--connect-timeout", most="1d"),
    )
    loaded = load_project(project_path)
    known = list(loaded.project.host_classes)
    wanted = [c.strip() for c in classes.split(",") if c.strip()] if classes else None
    scope = [c for c in dict.fromkeys(wanted or known) if c in known]

    def ci(gaps: dict[str, str]) -> bool:
        return _ci_outputs(
            loaded,
            db_path,
            scope,
            junit=junit_xml,
            summary=summary_md,
            gate=gate,
            published=(published_manifest, published_pubkey),
            gaps=gaps,
        )

    try:
        # Ray prints the cluster's error reports (a dead raylet's last log lines) to stdout from
        # a thread of its own: they go to stderr with the run's progress, and stdout keeps the
        # one line per class.
        with contextlib.redirect_stdout(sys.stderr):
            outcome = fleet_run(
                loaded,
                options,
                classes=wanted,
                on_event=lambda m: click.echo(f"fleet: {m}", err=True),
                signals=True,
            )
    except QualifyError as exc:
        from qualify.fleet.driver import unmeasured

        ci(unmeasured(scope, exc))
        raise
    for run in outcome.classes:
        shown = run.message if run.state == "done" else f"{run.state} ({run.reason}): {run.message}"
        click.echo(f"{run.host_class}: {shown}")
    blocked = ci(outcome.gaps)
    sys.exit(1 if not outcome.ok else GATE_EXIT if blocked else 0)


@cli.group("rollout")
def rollout_group() -> None:
    """Staged rollouts: a class's new artifact to a cohort of its hosts, then a rollback."""


def _rollout_publish_options(f: F) -> F:
    f = click.option(
        "--per-class",
        "per_class_dir",
        type=click.Path(path_type=Path, file_okay=False),
        help="Also write the version as one signed document per host class into this directory "
        "(where hosts of a large fleet read theirs).",
    )(f)
    f = click.option(
        "--expires", default="30d", show_default=True, help="Validity, e.g. 30d, 12h."
    )(f)
    f = click.option(
        "--key",
        "key_path",
        required=True,
        type=_RegularFile(exists=True),
        help="Ed25519 private key (from 'qualify keygen'); every step is a signed version.",
    )(f)
    return click.option(
        "--out",
        type=_RegularFile(),
        default="manifest.json",
        show_default=True,
        help="Manifest file hosts read (the new version replaces it atomically).",
    )(f)


@contextlib.contextmanager
def _rollout_session(
    db_path: Path, expires: str, model: str | None = None
) -> Iterator[tuple[Any, dict[str, Any]]]:
    """The matrix opened for a rollout action (of model line ``model``, when the action reads the
    project file), and the action's time and validity."""
    from datetime import UTC, datetime

    from matrix.store import Store
    from qualify.measure.hostlock import lock_wait_message
    from qualify.release.generate import MAX_VALIDITY, parse_duration

    validity = parse_duration(expires, what="--expires", most=MAX_VALIDITY)
    _require_db(db_path)
    with Store.open(db_path, on_wait=lock_wait_message(), model=model) as db:
        _recover(db)
        yield db, {"now": datetime.now(UTC), "expires_in": validity}


@rollout_group.command("start")
@click.argument("host_class")
@click.option("--steps", default="5,25,100", show_default=True, help="Percent of hosts per step.")
@click.option(
    "--artifact", help="The candidate to roll out (default: the one the matrix supports)."
)
@click.option("--why", default="", help="Why, recorded with the step.")
@click.option("--artifact-base-uri", help="Base URL hosts fetch artifacts from.")
@_rollout_publish_options
@_project_option
@_db_option
def rollout_start(
    host_class: str,
    steps: str,
    artifact: str | None,
    why: str,
    artifact_base_uri: str | None,
    out: Path,
    key_path: Path,
    expires: str,
    per_class_dir: Path | None,
    project_path: Path,
    db_path: Path,
) -> None:
    """Publish a version in which HOST_CLASS's hosts in the first step's cohort run the new
    artifact (chosen per host by a stable hash of its id) and the rest keep the current one."""
    from qualify.project.load import load_project
    from qualify.rollout import parse_steps, start_rollout

    plan = parse_steps(steps)
    loaded = load_project(project_path)
    with _rollout_session(db_path, expires, loaded.project.model) as (db, when):
        done = start_rollout(
            loaded,
            db,
            host_class,
            steps=plan,
            per_class_dir=per_class_dir,
            key_path=key_path,
            out=out,
            artifact=artifact,
            why=why,
            artifact_base_uri=artifact_base_uri,
            **when,
        )
    click.echo(f"{done.summary}; wrote {done.path}")
    _warn_if_hosts_refuse(done.path, per_class_dir)


@rollout_group.command("abort")
@click.argument("host_class")
@click.option("--why", required=True, help="Why, recorded with the rollback.")
@_rollout_publish_options
@_project_option
@_db_option
def rollout_abort(
    host_class: str,
    why: str,
    out: Path,
    key_path: Path,
    expires: str,
    per_class_dir: Path | None,
    project_path: Path,
    db_path: Path,
) -> None:
    """Publish a sanctioned rollback: a newer version sending every host of HOST_CLASS, canary
    or not, to what the rest of the class runs (a held class: its rollback package), so that
    hosts never have to accept an older document; releases keep it until 'rollout clear'."""
    from qualify.project.load import load_project
    from qualify.rollout import abort_rollout

    loaded = load_project(project_path, check_models=False)
    with _rollout_session(db_path, expires, loaded.project.model) as (db, when):
        done = abort_rollout(
            loaded,
            db,
            host_class,
            per_class_dir=per_class_dir,
            key_path=key_path,
            out=out,
            why=why,
            **when,
        )
    click.echo(f"{done.summary}; wrote {done.path}")
    _warn_if_hosts_refuse(done.path, per_class_dir)


@rollout_group.command("advance")
@click.argument("host_class")
@click.option("--why", default="", help="Why, recorded with the step.")
@_tolerance_option
@_min_samples_option
@_rollout_publish_options
@click.option(
    "--project",
    "project_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Project file: a completed rollout's entry gets the evidence the matrix has for its "
    f"artifact under it [default: {DEFAULT_PROJECT}, where there is one]",
)
@_db_option
def rollout_advance(
    host_class: str,
    why: str,
    tolerance: float,
    min_samples: int,
    out: Path,
    key_path: Path,
    expires: str,
    per_class_dir: Path | None,
    project_path: Path | None,
    db_path: Path,
) -> None:
    """Advance HOST_CLASS's rollout one step, only if its cohort's telemetry since the step
    began shows no alert, enough latencies to bound its p99 within the qualified bound, and no
    p99 above the rest of the class's, both with --tolerance's slack (a class whose
    max_slowdown accepts a candidate slower than the baseline needs that slowdown here too).

    Exit status: 0 advanced (or completed), 1 halted (the reasons are printed and recorded).
    """
    from qualify.project.load import load_project
    from qualify.rollout import advance_rollout
    from schemas.telemetry import CheckSettings

    if project_path is None and Path(DEFAULT_PROJECT).is_file():
        project_path = Path(DEFAULT_PROJECT)
    loaded = load_project(project_path, check_models=False) if project_path else None

    settings = _settings(
        CheckSettings,
        {"p99_tolerance": tolerance, "min_samples": min_samples},
        {"p99_tolerance": "--tolerance", "min_samples": "--min-samples"},
    )
    with _rollout_session(db_path, expires) as (db, when):
        done, verdict = advance_rollout(
            db,
            host_class,
            per_class_dir=per_class_dir,
            key_path=key_path,
            out=out,
            why=why,
            settings=settings,
            loaded=loaded,
            **when,
        )
    click.echo(f"evidence: {verdict.evidence() or 'none'}")
    if done is None:
        for problem in verdict.problems:
            click.echo(f"halted: {problem}")
        sys.exit(1)
    click.echo(f"{done.summary}; wrote {done.path}")
    _warn_if_hosts_refuse(done.path, per_class_dir)


@rollout_group.command("hold")
@click.argument("host_class")
@click.option("--why", required=True, help="Why, recorded with the hold.")
@_rollout_publish_options
@_db_option
def rollout_hold(
    host_class: str,
    why: str,
    out: Path,
    key_path: Path,
    expires: str,
    per_class_dir: Path | None,
    db_path: Path,
) -> None:
    """Publish HOST_CLASS as held: its hosts keep what they run (a rollout stops where it
    is), and later releases keep the hold until 'qualify rollout clear'."""
    from qualify.rollout import hold_class

    with _rollout_session(db_path, expires) as (db, when):
        done = hold_class(
            db, host_class, per_class_dir=per_class_dir, key_path=key_path, out=out, why=why, **when
        )
    click.echo(f"{done.summary}; wrote {done.path}")
    _warn_if_hosts_refuse(done.path, per_class_dir)


@rollout_group.command("pin")
@click.argument("host_class")
@click.option("--artifact", help="What to pin it to (default: what it runs now).")
@click.option("--why", required=True, help="Why, recorded with the pin.")
@_rollout_publish_options
@_project_option
@_db_option
def rollout_pin(
    host_class: str,
    artifact: str | None,
    why: str,
    out: Path,
    key_path: Path,
    expires: str,
    per_class_dir: Path | None,
    project_path: Path,
    db_path: Path,
) -> None:
    """Publish HOST_CLASS pinned to one artifact (what it runs, its rollback or the approved
    baseline) for every host; later releases keep the pin until 'qualify rollout clear'."""
    from qualify.project.load import load_project
    from qualify.rollout import pin_class

    loaded = load_project(project_path)
    with _rollout_session(db_path, expires, loaded.project.model) as (db, when):
        done = pin_class(
            loaded,
            db,
            host_class,
            per_class_dir=per_class_dir,
            key_path=key_path,
            out=out,
            why=why,
            artifact=artifact,
            **when,
        )
    click.echo(f"{done.summary}; wrote {done.path}")
    _warn_if_hosts_refuse(done.path, per_class_dir)


@rollout_group.command("clear")
@click.argument("host_class")
@click.option("--why", required=True, help="Why, recorded.")
@_db_option
def rollout_clear(host_class: str, why: str, db_path: Path) -> None:
    """Lift HOST_CLASS's hold, pin or aborted rollout (publishes nothing: the next manifest
    generate decides the class from the matrix again)."""
    from qualify.rollout import clear_class

    with _rollout_session(db_path, "30d") as (db, when):
        click.echo(clear_class(db, host_class, now=when["now"], why=why))


@rollout_group.command("status")
@_db_option
def rollout_status(db_path: Path) -> None:
    """The rollouts in progress (or halted) in the current manifest, the classes held, pinned
    or whose rollout was aborted (each in force until 'qualify rollout clear'), and a
    publication a kill interrupted."""
    from matrix.publications import pending, steering
    from matrix.store import Store
    from qualify.console import plain
    from qualify.release.generate import previous_manifest

    _require_db(db_path)
    with Store.open(db_path, read_only=True) as db:
        current = previous_manifest(db)
        steered = steering(db)
        last = {str(r["rollout_id"]): r for r in db.rollout_log()}
        left = pending(db)
    for p in left:
        click.echo(
            f"v{p.version} ({plain(str(p.intent.get('what', 'a publish')))}) was interrupted: "
            "the next publishing command completes or discards it"
        )
    if current is None:
        _fail("no manifest has been published from this matrix", 1)
    for name, row in sorted(steered.items()):
        what = {
            "hold": "held",
            "pin": f"pinned to {row['artifact']}",
            "abort": f"rollout {row['rollout_id']} aborted (its hosts stay on the rollback)",
        }[str(row["action"])]
        click.echo(
            f"{plain(name)}: {plain(what)} by {plain(row['actor'])} since "
            f"{row['acted_at']:%Y-%m-%d %H:%M:%SZ} (v{row['version']}): {plain(row['why'])}"
        )
    found = bool(steered)
    for name, entry in current.signed.entries.items():
        if entry.rollout is None:
            continue
        found = True
        r = entry.rollout
        rest = entry.artifact.name if entry.artifact is not None else "nothing (hold)"
        halted = last.get(r.id)
        state = (
            f"HALTED ({plain(str(halted['why']))[:200]})"
            if halted is not None and halted["action"] == "halt"
            else "in progress"
        )
        click.echo(
            f"{plain(name)}: rollout {plain(r.id)} of {plain(r.artifact.name)} at {r.percent}% "
            f"(step {r.step} of {len(r.steps)}: {', '.join(map(str, r.steps))}), {state}; the "
            f"rest run {plain(rest)} (v{current.signed.version})"
        )
    if not found:
        click.echo(f"no rollout, hold, pin or abort in force (manifest v{current.signed.version})")


@rollout_group.command("log")
@click.option("--host-class", "host_class", help="Only this class.")
@_db_option
def rollout_log(host_class: str | None, db_path: Path) -> None:
    """Every rollout action: when, the version it published, who and why."""
    from matrix.store import Store
    from qualify.console import plain

    _require_db(db_path)
    with Store.open(db_path, read_only=True) as db:
        rows = db.rollout_log(host_class)
    if not rows:
        click.echo("no rollout recorded")
    for r in rows:
        click.echo(
            f"{r['acted_at']:%Y-%m-%d %H:%M:%SZ} {plain(r['host_class'])} {plain(r['rollout_id'])} "
            f"{r['action']} v{r['version']} step {r['step']} {r['percent']}% "
            f"{plain(r['artifact'])} by {plain(r['actor'])}: {plain(r['why'] or '-')}"
        )


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="qualify")
