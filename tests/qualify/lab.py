"""A small matrix for publishing stories, measured in a second by scripted workers
(`tests.qualify.scripted`): the project of `tests.qualify.projects` with one candidate that
falls back to another provider on the first run (so release 1 gives ``here-cpu`` the baseline)
and qualifies on the second (so a rollout has something to roll out)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from matrix.store import Store
from qualify.cli import cli
from qualify.project.load import load_project
from qualify.release.publishing import PAUSE_ENV
from qualify.run import RunOptions, qualify_run
from tests.qualify.projects import ROOT, write_project
from tests.qualify.scripted import CPU, Script, ScriptedWorkers, digest_of

CANDIDATE = "classifier"
FALLBACK = Script(placement={CPU: 7, "CUDAExecutionProvider": 3})


_WITH_PROJECT = {
    ("manifest", "generate"),
    *(("rollout", a) for a in ("start", "abort", "advance", "pin")),
}
_PUBLISHING = {
    ("manifest", "publish"),
    *(("rollout", a) for a in ("start", "abort", "advance", "hold", "pin")),
}


@dataclass
class Lab:
    """A project, its matrix and a signing key in one folder, driven through the CLI."""

    root: Path

    @property
    def project(self) -> Path:
        return self.root / "qualify.yaml"

    @property
    def db(self) -> Path:
        return self.root / "qualify.duckdb"

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.json"

    @property
    def per_class(self) -> Path:
        return self.root / "manifest.d"

    def measure(self, candidate: Script) -> None:
        """A scripted run of here-cpu: the baseline passes, the candidate behaves as told."""
        models = self.root / "models"
        workers = ScriptedWorkers(
            {
                digest_of(models / "identity_mlp.onnx"): Script(),
                digest_of(models / f"{CANDIDATE}.onnx"): candidate,
            }
        )
        qualify_run(
            load_project(self.project),
            "here-cpu",
            RunOptions(db_path=self.db, measure_alone=False),
            workers=workers.seam(),
        )

    def args(self, *args: str) -> list[str]:
        """``args`` with this lab's project, matrix, key and manifest file where they apply."""
        command = tuple(a for a in args[:2] if not a.startswith("-"))
        extra = ["--db", str(self.db)]
        if command in _WITH_PROJECT:
            extra += ["--project", str(self.project)]
        if command in _PUBLISHING or (command == ("manifest", "generate") and "--publish" in args):
            extra += ["--key", str(self.root / "k.key")]
            if "--out" not in args:
                extra += ["--out", str(self.manifest)]
        elif command == ("manifest", "generate") and "--out" not in args:
            extra += ["--out", str(self.root / "manifest.draft.json")]  # never the cwd's
        return [*args, *extra]

    def cli(self, *args: str, code: int | None = 0) -> str:
        """What ``qualify ARGS`` (with `args`' additions) said, its exit code checked unless
        ``code`` is None."""
        result = CliRunner().invoke(cli, self.args(*args))
        if code is not None:
            assert result.exit_code == code, (args, result.output)
        return result.output

    def killed_at(self, instant: str, *args: str) -> str:
        """Run ``qualify ARGS`` in a real process, SIGKILL it at the named instant of its
        publication (``qualify.release.publishing.PAUSE_ENV``), and return what it said before."""
        return killed_at(instant, self.args(*args), cwd=self.root)

    def published(self) -> tuple[int, dict[str, Any]] | None:
        """The matrix's current manifest: (version, signed part)."""
        with Store.open(self.db, read_only=True) as db:
            latest = db.latest_manifest()
        return None if latest is None else (latest[0], json.loads(latest[1])["signed"])

    def log(self) -> list[tuple[str, int]]:
        """The rollout log: (action, version) per row, oldest first."""
        with Store.open(self.db, read_only=True) as db:
            return [(str(r["action"]), int(r["version"])) for r in db.rollout_log()]

    def entry(self) -> dict[str, Any]:
        """here-cpu's entry in the manifest file hosts read."""
        entry: dict[str, Any] = json.loads(self.manifest.read_bytes())["signed"]["entries"][
            "here-cpu"
        ]
        return entry


def make_lab(root: Path, *, first: Script = FALLBACK) -> Lab:
    """Release 1 (here-cpu on the baseline, published with per-class documents; with
    ``first=Script()``, on the candidate), then the candidate requalified so that the matrix
    supports rolling it out."""
    root.mkdir(parents=True, exist_ok=True)
    write_project(root, [CANDIDATE])
    lab = Lab(root)
    lab.measure(first)
    assert CliRunner().invoke(cli, ["keygen", "k", "--dir", str(root)]).exit_code == 0
    lab.cli(
        "manifest", "generate", "--publish", "--release", "r1", "--per-class", str(lab.per_class)
    )
    assert lab.entry()["decision"] == ("baseline" if first is FALLBACK else "candidate")
    lab.measure(Script())
    return lab


def killed_at(instant: str, args: list[str], *, cwd: Path) -> str:
    """Run ``qualify ARGS`` in a real process, SIGKILL it at the named instant of its
    publication (``qualify.release.publishing.PAUSE_ENV``), and return what it said before."""
    env = {**os.environ, PAUSE_ENV: instant, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "qualify", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    said = []
    try:
        for line in proc.stderr:
            said.append(line)
            if line.strip() == f"qualify: paused at {instant}":
                proc.send_signal(signal.SIGKILL)
                break
        else:
            raise AssertionError(f"never paused at {instant}: {''.join(said)}")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    assert proc.returncode == -signal.SIGKILL
    return "".join(said)
