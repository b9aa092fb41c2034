"""The import rules of DESIGN.md, enforced on the source tree."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.manifest.test_resolve_startup import IMPORTED

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("schemas", "matrix", "manifest", "qualify", "reports")

# Which first-party packages each package may import.
ALLOWED = {
    "schemas": {"schemas"},
    "matrix": {"matrix", "schemas"},
    "manifest": {"manifest", "schemas"},
    "reports": {"reports", "matrix", "manifest", "schemas"},
    "qualify": {"qualify", "reports", "matrix", "manifest", "schemas"},
}
# Third-party packages confined to one room.
CONFINED = {
    "duckdb": ("matrix/",),
    "onnxruntime": ("qualify/measure/worker.py", "qualify/candidates/convert.py"),
    "jinja2": ("reports/",),
    "ray": ("qualify/fleet/cluster.py", "qualify/fleet/driver.py", "qualify/fleet/host.py"),
    "pandas": ("qualify/reader.py",),
}
HEAVY = ("pydantic", "duckdb", "pandas", "pyarrow", "onnxruntime", "jinja2", "click")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def _sources() -> list[tuple[str, Path]]:
    return [(pkg, p) for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]


@pytest.mark.parametrize(("package", "path"), _sources(), ids=lambda v: str(v))
def test_imports_flow_one_way(package: str, path: Path) -> None:
    first_party = _imports(path) & set(PACKAGES)
    forbidden = first_party - ALLOWED[package]
    assert not forbidden, f"{path.relative_to(ROOT)} imports {sorted(forbidden)}"


@pytest.mark.parametrize(("package", "path"), _sources(), ids=lambda v: str(v))
def test_heavy_dependencies_stay_in_their_room(package: str, path: Path) -> None:
    rel = path.relative_to(ROOT).as_posix()
    for module, rooms in CONFINED.items():
        if module in _imports(path):
            assert rel.startswith(rooms), f"{rel} imports {module}; only {rooms} may"


def test_resolve_imports_no_heavy_module() -> None:
    code = (
        "import sys, manifest.resolve\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert out.stdout.strip() == "", f"manifest.resolve pulled in: {out.stdout.strip()}"


# What importing manifest.resolve may add to an interpreter that has imported only `site`
# (issue 15: typing, re, json, pathlib, argparse, datetime and collections are all gone); the
# startup tests hold the same set.
RESOLVE_IMPORTS = IMPORTED


def test_resolve_imports_only_its_own_light_modules() -> None:
    # -S: no .pth files, so no editable finder preloading pathlib and re: a wheel install's view.
    code = (
        f"import sys, site; sys.path.insert(0, {str(ROOT)!r}); before = set(sys.modules)\n"
        "import manifest.resolve\n"
        "print(','.join(sorted(set(sys.modules) - before)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    added = set(out.stdout.strip().split(","))
    assert added <= RESOLVE_IMPORTS, (
        f"manifest.resolve pulled in: {sorted(added - RESOLVE_IMPORTS)}"
    )
