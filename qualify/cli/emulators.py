"""``qualify emulators``: prepare and show what ``--emulate`` needs (`qualify.measure.emulators`,
`qualify.measure.sysroot`)."""

from __future__ import annotations

from pathlib import Path

import click

from qualify.cli.errors import _fail
from qualify.cli.options import _db_option, _project_option
from qualify.cli.output import echo_json, json_option, quiet_option

__all__ = ["emulators_group"]


@click.group("emulators")
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
@quiet_option
def emulators_prepare(
    class_name: str | None,
    arch: str | None,
    project_path: Path,
    into: Path | None,
    onnxruntime: str | None,
    force: bool,
    quiet: bool,
) -> None:
    """Download and assemble the runtime a class's emulated CPU needs (the only command that
    downloads: Debian's packages of the architecture's Python, onnxruntime and numpy wheels
    from PyPI, each recorded with its digest)."""
    from importlib import metadata

    from qualify.measure.emulators import prepare_for_class
    from qualify.measure.runner import probe_runtime
    from qualify.measure.sysroot import prepare_runtime, user_emulator_dir
    from qualify.project.load import load_project
    from qualify.project.problems import no_such_class

    if (class_name is None) == (arch is None):
        _fail("pass --class NAME (from the project file) or --arch aarch64, one of them")

    def say(message: str) -> None:
        if not quiet:
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
            _fail(no_such_class(project_path, str(class_name), classes))
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
@json_option("emulators-show")
def emulators_show(project_path: Path, db_path: Path, as_json: bool) -> None:
    """QEMU, the prepared runtimes, and each class's emulated CPU (each runtime verified)."""
    from qualify.measure.emulators import Emulators, emulator_status, status_lines
    from qualify.measure.sysroot import emulator_dirs
    from qualify.project.load import load_project

    classes = load_project(project_path, check_models=False).project.host_classes
    dirs = emulator_dirs(db_path.resolve().parent)
    if as_json:
        echo_json(emulator_status(classes, Emulators(runtime_dirs=dirs)))
        return
    for line in status_lines(classes, Emulators(runtime_dirs=dirs)):
        click.echo(line)
