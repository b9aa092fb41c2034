"""Files that are not files, at every path option of the command line: a named pipe, a device and
a folder where a file is read or written, and a disk that fills up while one is written. Each
case is exit 2, one line naming the path, no wait on the pipe, and nothing of the project's
changed: its files byte for byte, the matrix row for row."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from qualify.cli import cli
from tests.qualify.projects import ROOT, run_qualify, write_project

P = "{P}"
"""Where a case puts the hostile path."""

CASES: dict[str, list[str]] = {
    "run --project": ["run", "--host-class", "here-cpu", "--project", P],
    "run --db": ["run", "--host-class", "here-cpu", "--db", P],
    "run --junit-xml": ["run", "--host-class", "here-cpu", "--junit-xml", P],
    "run --summary-md": ["run", "--host-class", "here-cpu", "--summary-md", P],
    "candidates --project": ["candidates", "--variant", "fp16", "--no-write", "--project", P],
    "candidates --db": ["candidates", "--variant", "fp16", "--no-write", "--db", P],
    "tune --project": ["tune", "--host-class", "here-cpu", "--budget", "5s", "--project", P],
    "tune --db": ["tune", "--host-class", "here-cpu", "--budget", "5s", "--db", P],
    "matrix show --db": ["matrix", "show", "--db", P],
    "matrix show --project": ["matrix", "show", "--project", P],
    "matrix gate --db": ["matrix", "gate", "--db", P],
    "matrix gate --junit-xml": ["matrix", "gate", "--junit-xml", P],
    "matrix ingest BUNDLE": ["matrix", "ingest", P],
    "matrix stale --db": ["matrix", "stale", "--db", P],
    "matrix export --db": ["matrix", "export", "--parquet", "exported", "--db", P],
    "telemetry ingest FILE": ["telemetry", "ingest", P],
    "telemetry ingest --db": ["telemetry", "ingest", "telemetry.jsonl", "--db", P],
    "telemetry check --manifest": ["telemetry", "check", "--manifest", P],
    "telemetry check --db": ["telemetry", "check", "--db", P],
    "manifest generate --key": [
        "manifest",
        "generate",
        "--release",
        "r2",
        "--publish",
        "--key",
        P,
        "--out",
        "m2.json",
    ],
    "manifest generate --project": ["manifest", "generate", "--release", "r2", "--project", P],
    "manifest generate --db": ["manifest", "generate", "--release", "r2", "--db", P],
    "manifest generate --out": ["manifest", "generate", "--release", "r2", "--out", P],
    "manifest publish DRAFT": ["manifest", "publish", P, "--key", "release.key"],
    "manifest publish --key": ["manifest", "publish", "draft.json", "--key", P],
    "manifest verify PATH": ["manifest", "verify", P, "--pubkey", "release.pub"],
    "manifest verify --pubkey": ["manifest", "verify", "manifest.json", "--pubkey", P],
    "manifest diff OLD": ["manifest", "diff", P, "manifest.json"],
    "manifest diff NEW": ["manifest", "diff", "manifest.json", P],
    "manifest show PATH": ["manifest", "show", P],
    "report --manifest": ["report", "--out", "r.html", "--manifest", P],
    "report --pubkey": ["report", "--out", "r.html", "--pubkey", P],
    "report --project": ["report", "--out", "r.html", "--project", P],
    "report --db": ["report", "--out", "r.html", "--db", P],
    "report --out": ["report", "--out", P],
    "init MODEL": ["init", P, "--out", "new.yaml"],
    "init --candidate": ["init", "models/identity_mlp.onnx", "--candidate", P, "--out", "n.yaml"],
    "init --out": ["init", "models/identity_mlp.onnx", "--out", P, "--force"],
    "rollout start --key": ["rollout", "start", "here-cpu", "--key", P],
    "rollout start --db": ["rollout", "start", "here-cpu", "--key", "release.key", "--db", P],
    "rollout status --db": ["rollout", "status", "--db", P],
    "rollout log --db": ["rollout", "log", "--db", P],
}

KINDS = ("fifo", "/dev/zero", "folder")


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project measured once, a key pair, a published manifest, a draft and telemetry."""
    tmp = tmp_path_factory.mktemp("hostile-files")
    write_project(tmp, ["identity_mlp_perturbed"])
    for args in (
        ("run", "--host-class", "here-cpu", "--json"),
        ("keygen", "release"),
        ("manifest", "generate", "--release", "r1", "--publish", "--key", "release.key"),
        ("manifest", "generate", "--release", "r2", "--out", "draft.json"),
    ):
        done = run_qualify(*args, cwd=tmp)
        assert done.returncode == 0, (args, done.stderr)
    (tmp / "telemetry.jsonl").write_text("")
    return tmp


def _snapshot(folder: Path) -> dict[str, str]:
    """Every file's bytes, by digest: the project's, the published manifest's and the matrix's
    (a command that only opened the DuckDB file and refused leaves it byte for byte)."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


@contextlib.contextmanager
def _hostile(kind: str, folder: Path) -> Iterator[Path]:
    if kind == "/dev/zero":
        yield Path("/dev/zero")
        return
    path = folder / "hostile"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    try:
        yield path
    finally:
        if path.is_dir():
            path.rmdir()
        else:
            path.unlink()


def _invoke(args: list[str], cwd: Path, fifo: Path | None) -> tuple[int, str]:
    """Run the command in this process; a command that blocks on the pipe past a minute is
    released (its other end opened) and the case fails."""
    done: dict[str, object] = {}

    def call() -> None:
        with contextlib.chdir(cwd):
            result = CliRunner().invoke(cli, args)
        done["code"], done["output"] = result.exit_code, result.output

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(60)
    if worker.is_alive():
        if fifo is not None:
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail(f"{' '.join(args)} blocked on {fifo}")
    return int(done["code"]), str(done["output"])  # type: ignore[call-overload]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_what_is_not_a_file_at_a_path_option_is_refused_by_name_and_changes_nothing(
    state: Path, case: str, kind: str
) -> None:
    before = _snapshot(state)
    with _hostile(kind, state) as path:
        args = [str(path) if a == P else a for a in CASES[case]]
        code, output = _invoke(args, state, path if kind == "fifo" else None)
    assert code == 2, output
    assert "Traceback" not in output and "internal error" not in output, output
    assert str(path) in output or f"'{path}'" in output or path.name in output, output
    assert _snapshot(state) == before
    for made in ("exported", "m2.json", "r.html", "new.yaml", "n.yaml", "manifest.draft.json"):
        assert not (state / made).exists(), made


def _mount_full(folder: Path) -> bool:
    """A 64 KiB tmpfs at ``folder``, where this user may mount one (root); else False."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)],
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


def _fill(path: Path) -> None:
    """Write ``path`` until the file system has no room left."""
    with path.open("wb", buffering=0) as fh, contextlib.suppress(OSError):
        while True:
            fh.write(b"\0" * 4096)


def _limit_file_size() -> None:  # in the child, before exec: writes past 64 bytes fail (EFBIG)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


FULL_CASES: dict[str, list[str]] = {
    "matrix export --parquet": ["matrix", "export", "--parquet", "{F}/export"],
    "report --out": ["report", "--out", "{F}/report.html"],
    "keygen --dir": ["keygen", "spare", "--dir", "{F}/keys"],
    "init --out": ["init", "models/identity_mlp.onnx", "--out", "{F}/qualify.yaml"],
}


@pytest.fixture(params=["tmpfs", "file-size limit"])
def full(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A folder with no room left: a full 64 KiB tmpfs where one can be mounted (root), and
    always a file-size limit on the command's process (its writes fail with EFBIG)."""
    folder = tmp_path / "full"
    folder.mkdir()
    how = str(request.param)
    if how == "tmpfs":
        if not _mount_full(folder):
            pytest.skip("cannot mount a tmpfs here (not root)")
        try:
            _fill(folder / "ballast")
            yield folder, how
        finally:
            subprocess.run(["umount", str(folder)], check=False)
    else:
        yield folder, how


@pytest.mark.parametrize("case", sorted(FULL_CASES))
def test_a_full_disk_is_exit_2_naming_the_path_with_nothing_half_written(
    state: Path, full: tuple[Path, str], case: str
) -> None:
    folder, how = full
    before = _snapshot(state)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "qualify",
            *[a.replace("{F}", str(folder)) for a in FULL_CASES[case]],
        ],
        capture_output=True,
        text=True,
        cwd=state,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        preexec_fn=_limit_file_size if how != "tmpfs" else None,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    assert str(folder) in done.stderr, done.stderr
    assert any(
        words in done.stderr
        for words in ("No space left on device", "File too large", os.strerror(errno.EFBIG))
    ), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    left = sorted(p.name for p in folder.iterdir() if p.name != "ballast")
    assert left in ([], ["export"], ["keys"]), left
    for sub in ("export", "keys"):
        if (folder / sub).exists():
            assert list((folder / sub).iterdir()) == []
    assert _snapshot(state) == before
    assert json.loads((state / "manifest.json").read_text())["signed"]["version"] == 1
