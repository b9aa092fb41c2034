"""Each of docs/ci.md's recipes, run as written, catches a regression from the published
manifest.

A small executor runs the recipe's jobs in order: each job in a fresh copy of the repository
(``actions/checkout``), its ``run:`` steps in ``bash -e`` with the job's ``env:`` (after a
failed step only those marked ``if: always()``), the
expressions ``${{ matrix.* }}`` and ``${{ vars.* }}`` substituted, artifacts as folders
(``upload-artifact``/``download-artifact``) and ``$GITHUB_STEP_SUMMARY`` a file. Only three
things stand in for a CI service: the ``pip install`` lines are this test's environment (its
``qualify`` first on ``PATH``), the ``runs-on`` labels are this machine, and the matrix lists
this machine's class. ``curl`` fetches the published manifest from a ``file://`` URL. The
recipe with Ray runs against a real Ray cluster of one node on 127.0.0.1 (``fleet`` marker).

The planted regression: the release hosts run (v1, signed) gives ``here-cpu`` the candidate;
the commit under test tightens the class's p99 budget below anything measurable, so the matrix
now supports only a hold. The gate job must exit 3 and its summary must show the manifest it
compared with.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from manifest.signing import generate_keypair
from matrix.store import Store
from qualify.project.load import load_project
from qualify.release.generate import generate_manifest
from qualify.release.publishing import PublishOptions
from qualify.run import RunOptions, qualify_run
from tests.qualify.projects import ROOT, loosen_slowdown, write_project
from tests.qualify.scripted import Script, ScriptedWorkers, digest_of

pytestmark = pytest.mark.slow

RECIPES = ROOT / "docs" / "ci.md"
CANDIDATE = "identity_mlp_perturbed"
_EXPRESSION = re.compile(r"\$\{\{\s*([A-Za-z_][\w.]*)\s*\}\}")


def recipes() -> dict[str, dict[str, Any]]:
    """Each '## ' section's YAML block, by heading."""
    sections = re.split(r"^## ", RECIPES.read_text(), flags=re.M)[1:]
    found = {}
    for section in sections:
        title = section.split("\n", 1)[0].strip()
        block = re.search(r"```yaml\n(.*?)```", section, re.S)
        if block is not None:
            found[title] = YAML(typ="safe", pure=True).load(block.group(1))
    return found


def expand(text: str, context: Mapping[str, str]) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        assert name in context, f"the recipe uses ${{{{ {name} }}}}, which this run does not set"
        return context[name]

    return _EXPRESSION.sub(value, text)


@dataclass
class Runner:
    """Runs a workflow's jobs on this machine, as a CI service would."""

    repository: Path
    root: Path
    variables: dict[str, str]
    matrix: dict[str, list[str]]
    artifacts: Path = field(init=False)
    log: list[tuple[str, str, int, str]] = field(default_factory=list)
    """(job, command, exit status, output) of every step run."""

    def __post_init__(self) -> None:
        self.artifacts = self.root / "artifacts"
        self.artifacts.mkdir(parents=True)

    def workflow(self, jobs: Mapping[str, Any]) -> dict[str, Path]:
        """Every job (``needs`` first); the workspace of each job's last run."""
        done: dict[str, Path] = {}
        pending = dict(jobs)
        while pending:
            name = next(n for n, j in pending.items() if set(_needs(j)) <= set(done))
            spec = pending.pop(name)
            axes = spec.get("strategy", {}).get("matrix", {})
            combos = [{}] if not axes else [{k: v} for k in axes for v in self.matrix[k]]
            for combo in combos:
                done[name] = self.job(name, spec, combo)
        return done

    def job(self, name: str, spec: Mapping[str, Any], combo: Mapping[str, str]) -> Path:
        context = {f"matrix.{k}": v for k, v in combo.items()}
        context |= {f"vars.{k}": v for k, v in self.variables.items()}
        work = self.root / "-".join([name, *combo.values()])
        env = dict(os.environ)
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
        env["GITHUB_STEP_SUMMARY"] = str(work / "step-summary.md")
        env |= {k: expand(str(v), context) for k, v in (spec.get("env") or {}).items()}
        failed = False
        for step in spec["steps"]:
            if failed and step.get("if") != "always()":
                continue  # a failed step ends its job, but for the steps that always run
            if "uses" in step:
                self.action(step["uses"], step.get("with") or {}, work, context)
                continue
            command = expand(step["run"], context).strip()
            if command.startswith("pip install"):
                continue  # this test's environment has qualify installed
            proc = subprocess.run(
                ["bash", "-e", "-c", command],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            self.log.append((name, command, proc.returncode, proc.stdout + proc.stderr))
            failed = failed or proc.returncode != 0
        return work

    def action(
        self, uses: str, given: Mapping[str, Any], work: Path, context: Mapping[str, str]
    ) -> None:
        if uses.startswith("actions/checkout@"):
            shutil.copytree(self.repository, work)
        elif uses.startswith("actions/upload-artifact@"):
            target = self.artifacts / expand(str(given["name"]), context)
            for path in str(given["path"]).split("\n"):
                source = work / path
                if source.is_dir():
                    shutil.copytree(source, target, dirs_exist_ok=True)
                elif source.exists():
                    target.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(source, target / source.name)
        elif uses.startswith("actions/download-artifact@"):
            shutil.copytree(self.artifacts, work / str(given["path"]), dirs_exist_ok=True)
        else:
            raise AssertionError(f"the recipe uses {uses}, which this runner does not know")


def _needs(job: Mapping[str, Any]) -> list[str]:
    needs = job.get("needs") or []
    return [needs] if isinstance(needs, str) else list(needs)


def published_release(where: Path) -> tuple[Path, Path]:
    """What hosts run: v1 of the project, ``here-cpu`` on the candidate (scripted twins, which
    pass every gate), signed. Returns the manifest and the public key."""
    project = write_project(where, [CANDIDATE])
    loosen_slowdown(project)
    loaded = load_project(project)
    models = where / "models"
    twins = ScriptedWorkers(
        {digest_of(models / f"{n}.onnx"): Script() for n in ("identity_mlp", CANDIDATE)}
    )
    db = where / "qualify.duckdb"
    qualify_run(
        loaded, "here-cpu", RunOptions(db_path=db, measure_alone=False), workers=twins.seam()
    )
    key, pub = generate_keypair("release", where)
    with Store.open(db) as store:
        done = generate_manifest(
            loaded,
            store,
            PublishOptions(
                key_path=key,
                out=where / "manifest.json",
                now=datetime.now(UTC),
                expires_in=timedelta(days=30),
            ),
            release="r1",
        )
    entry = done.manifest.signed.entries["here-cpu"]
    assert (entry.decision, entry.artifact and entry.artifact.name) == ("candidate", CANDIDATE)
    return where / "manifest.json", pub


def test_the_recipe_without_ray_catches_a_regression_from_the_published_manifest(
    tmp_path: Path,
) -> None:
    manifest, pub = published_release(tmp_path / "release")
    # The commit under test: the same project and models, the class's budget tightened.
    repository = tmp_path / "repository"
    project = write_project(repository, [CANDIDATE])
    loosen_slowdown(project)
    text = project.read_text()
    tightened = text.replace("budgets: {p99_ms: 50, ", "budgets: {p99_ms: 0.0001, ", 1)
    assert tightened != text
    project.write_text(tightened)
    shutil.copy2(pub, repository / "release.pub")
    runner = Runner(
        repository=repository,
        root=tmp_path / "ci",
        variables={"QUALIFY_MANIFEST_URL": manifest.as_uri()},
        matrix={"host_class": ["here-cpu"]},
    )
    workspaces = runner.workflow(
        recipes()["Without Ray: self-hosted runners labelled by class"]["jobs"]
    )
    said = "\n".join(f"$ {c}\n{out}" for _, c, _, out in runner.log)

    def status(job: str, command: str) -> int:
        return next(rc for j, c, rc, _ in runner.log if j == job and c.startswith(command))

    assert status("measure", "qualify run") == 0, said
    assert status("gate", "curl") == 0, said
    assert status("gate", "qualify matrix ingest") == 0, said
    assert status("gate", "qualify matrix gate") == 3, said
    summary = (workspaces["gate"] / "step-summary.md").read_text()
    assert "Compared with the current manifest: manifest v1 (r1)." in summary
    assert "**Release blocked**" in summary
    escaped = CANDIDATE.replace("_", "\\_")
    assert f"| here-cpu | candidate {escaped} | hold | blocks |" in summary, summary


def only_here(project: Path) -> None:
    """Keep only ``here-cpu``: a Ray node on this machine serves it; the other classes would
    be unserved, which a fleet run reports as a failure of its own (exit 1)."""
    text = project.read_text()
    start = text.index("  lost-gpu:")
    project.write_text(text[:start])


@pytest.mark.fleet
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_the_recipe_with_ray_catches_a_regression_from_the_published_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.qualify.fleet_cluster import Fleet, labels_for

    manifest, pub = published_release(tmp_path / "release")
    repository = tmp_path / "repository"
    project = write_project(repository, [CANDIDATE])
    loosen_slowdown(project)
    only_here(project)
    text = project.read_text()
    project.write_text(text.replace("budgets: {p99_ms: 50, ", "budgets: {p99_ms: 0.0001, ", 1))
    shutil.copy2(pub, repository / "release.pub")
    nodes_tmp = tmp_path / "nodes-tmp"  # the fleet task's work folder, not the machine's /tmp
    nodes_tmp.mkdir()
    cluster = Fleet(
        {"node-a": ["here-cpu"]},
        labels_for(load_project(project)),
        env={"node-a": {"TMPDIR": str(nodes_tmp)}},
    )
    try:
        runner = Runner(
            repository=repository,
            root=tmp_path / "ci",
            variables={"QUALIFY_MANIFEST_URL": manifest.as_uri()},
            matrix={},
        )
        monkeypatch.setenv("RAY_HEAD", cluster.address)  # the driver machine's own setting
        workspaces = runner.workflow(recipes()["With Ray"]["jobs"])
    finally:
        cluster.shutdown()
    said = "\n".join(f"$ {c}\n{out}" for _, c, _, out in runner.log)
    [(_, _, fetched, _), (_, command, gated, _)] = runner.log
    assert fetched == 0, said
    assert command.startswith("qualify fleet run") and gated == 3, said
    summary = (workspaces["qualify"] / "step-summary.md").read_text()
    assert "Compared with the current manifest: manifest v1 (r1)." in summary
    assert "**Release blocked**" in summary
    uploaded = runner.artifacts / "qualify"
    assert (uploaded / "qualify.duckdb").is_file() and (uploaded / "qualify-junit.xml").is_file()
