"""`pip install .` ships everything the commands need at run time, not just the .py files."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_wheel_carries_demo_assets_templates_static_files_and_schemas(tmp_path: Path) -> None:
    # Built from a copy: setuptools writes build/ and *.egg-info beside the sources it builds.
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache"
    )
    shutil.copytree(ROOT, src, ignore=ignore)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(src),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("qualify-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "qualify/demo/assets/digits-mlp-fp32.onnx",
        "qualify/demo/assets/digits-mlp-int8.onnx",
        "qualify/demo/assets/digits_inputs.npy",
        "reports/templates/base.html",
        "schemas/project.schema.json",
        "schemas/manifest.schema.json",
        "manifest/resolve.py",
    ):
        assert needed in names, needed
    assert any(n.startswith("reports/static/") and n.endswith(".js") for n in names)
    assert not any(n.startswith("tests/") for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "qualify = qualify.cli:main" in text
    assert "resolve-artifact = manifest.resolve:main" in text


def _runtime_imports(path: Path) -> set[str]:
    """Top-level modules a source file imports when it runs: at module level or inside a
    function, but not under ``if TYPE_CHECKING:`` (read by type checkers only)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and ast.unparse(node.test) in (
            "TYPE_CHECKING",
            "typing.TYPE_CHECKING",
        ):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


def _requirement_name(spec: str) -> str:
    return re.split(r"[<>=!~;\[ ]", spec, maxsplit=1)[0].strip().lower()


def test_every_declared_dependency_is_imported_and_every_import_is_declared() -> None:
    """The dependency list holds exactly what the packages import when they run: nothing that is
    only installed (a core dependency nobody imports costs every install its bytes), nothing
    that is imported but only arrives by chance with another package."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    core = {_requirement_name(spec) for spec in project["dependencies"]}
    extras = {
        _requirement_name(spec): extra
        for extra, specs in project["optional-dependencies"].items()
        for spec in specs
    }
    provides: dict[str, set[str]] = {}  # distribution -> its top-level modules
    for module, dists in importlib.metadata.packages_distributions().items():
        for dist in dists:
            provides.setdefault(dist.lower().replace("_", "-"), set()).add(module)
    imported: dict[str, set[str]] = {}  # module -> files that import it
    for package in ("qualify", "matrix", "manifest", "schemas", "reports"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for module in _runtime_imports(path):
                imported.setdefault(module, set()).add(path.relative_to(ROOT).as_posix())
    first_party = {"qualify", "matrix", "manifest", "schemas", "reports"}
    installed = {m for modules in provides.values() for m in modules}
    # The interpreter's own: the standard library, and its private modules of other versions
    # (an import that falls back across CPython releases names one this Python lacks).
    third_party = {
        m
        for m in set(imported) - first_party - set(sys.stdlib_module_names)
        if m in installed or not m.startswith("_")
    }
    for dist in sorted(core):
        modules = provides.get(dist.replace("_", "-"), set())
        assert modules & set(imported), f"{dist} is a dependency, but nothing imports it"
    declared = {m for dist in core for m in provides.get(dist.replace("_", "-"), set())}
    for module in sorted(third_party - declared):
        owners = [d for d in extras if module in provides.get(d.replace("_", "-"), set())]
        assert owners, f"{module} is imported by {sorted(imported[module])} but not declared"
        assert module == "ray" and extras[owners[0]] == "fleet", (
            f"{module} comes only with an extra ({extras[owners[0]]}), yet "
            f"{sorted(imported[module])} imports it"
        )
