"""Read commands import only what they use: showing the matrix or a manifest, or printing help,
never loads the runtime, pyarrow, the report's templates or the measuring code.

Each command runs in a fresh interpreter, as a user's shell would start it, and reports the
modules it ended with; the bound is a list of top-level packages that must be absent.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from matrix.store import Store
from qualify.project.load import load_project
from qualify.project.view import record_view
from tests.qualify.projects import write_project

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "manifest" / "golden"

NEVER = (
    "onnxruntime",
    "onnx",
    "pyarrow",
    "pandas",
    "numpy",
    "jinja2",
    "ray",
    "hypothesis",
    "ruamel",
    "matrix.bundle",
    "qualify.run",
    "qualify.measure.runner",
    "reports.render",
    "reports.context",
)
"""What no read command needs (numpy and pyarrow only come with measuring or bundles)."""

ALSO_NEVER: dict[str, tuple[str, ...]] = {
    # The error handler names each package's error tree, so their light errors modules load.
    "help": ("duckdb", "pydantic", "yaml", "rich", "cryptography", "matrix.store", "schemas.base"),
    "manifest show": ("duckdb", "yaml", "matrix"),
    # The project file is unchanged since a writer recorded its view: no validation, no YAML.
    "matrix show": ("cryptography", "pydantic", "yaml", "rich", "schemas.project"),
}

_PROBE = """\
import atexit, json, sys
def _report():
    with open({out!r}, "w") as f:
        json.dump(sorted(sys.modules), f)
atexit.register(_report)
sys.argv = ["qualify", *{args!r}]
from qualify.cli import main
main()
"""


def _modules_after(args: list[str], cwd: Path, tmp_path: Path) -> tuple[set[str], str]:
    out = tmp_path / "modules.json"
    code = _PROBE.format(out=str(out), args=args)
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return set(json.loads(out.read_text())), result.stdout


def _loaded(modules: set[str], name: str) -> bool:
    return name in modules or any(m.startswith(name + ".") for m in modules)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project, an empty migrated matrix and a signed manifest, as a user's directory."""
    root = tmp_path_factory.mktemp("read-commands")
    loaded = load_project(write_project(root, []), check_models=False)
    with Store.open(root / "qualify.duckdb") as db:
        record_view(db, loaded.project, loaded.sha256)  # as qualify run does
    shutil.copy(GOLDEN / "manifest.json", root / "manifest.json")
    return root


@pytest.mark.parametrize(
    ("label", "args"),
    [
        ("help", ["--help"]),
        ("help", ["matrix", "--help"]),
        ("help", ["manifest", "show", "--help"]),
        ("matrix show", ["matrix", "show"]),
        ("matrix show", ["matrix", "show", "--format", "json"]),
        ("manifest show", ["manifest", "show", "manifest.json"]),
    ],
)
def test_read_commands_import_only_what_they_use(
    label: str, args: list[str], workdir: Path, tmp_path: Path
) -> None:
    modules, stdout = _modules_after(args, workdir, tmp_path)
    assert stdout.strip(), "the command printed nothing"
    loaded = [name for name in (*NEVER, *ALSO_NEVER[label]) if _loaded(modules, name)]
    assert loaded == [], f"qualify {' '.join(args)} imported {loaded}"


def test_matrix_show_of_an_edited_project_file_validates_it_again(
    workdir: Path, tmp_path: Path
) -> None:
    """No recorded view for the new bytes: the file is validated in full, and its new budget
    and classes are what the table and the coverage lines show."""
    edited = tmp_path / "edited"
    shutil.copytree(workdir, edited)
    project = edited / "qualify.yaml"
    text = project.read_text()
    project.write_text(text.replace("p99_ms: 50", "p99_ms: 51", 1))
    modules, stdout = _modules_after(["matrix", "show", "--format", "json"], edited, tmp_path)
    assert _loaded(modules, "pydantic")
    modules, stdout = _modules_after(["matrix", "show"], edited, tmp_path)
    assert "gap: here-cpu x identity_mlp: never run" in stdout


def test_the_probe_sees_what_a_command_imports(workdir: Path, tmp_path: Path) -> None:
    """The bound can fail: showing the matrix does import DuckDB, which the probe reports."""
    modules, _ = _modules_after(["matrix", "show"], workdir, tmp_path)
    assert _loaded(modules, "duckdb") and _loaded(modules, "qualify.cli")
