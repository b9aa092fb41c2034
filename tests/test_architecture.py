"""The import rules of DESIGN.md, enforced on the source tree."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.manifest.test_resolve_startup import IMPORTED, foreign

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
    "ray": ("qualify/fleet/",),
    "pandas": ("qualify/reader.py",),
}
HEAVY = ("pydantic", "duckdb", "pandas", "pyarrow", "onnxruntime", "jinja2", "click")

# Inside qualify: its rooms (a sub-package, or a module of its own) by floor. A room imports only
# rooms on lower floors, so nothing below the CLI imports it and no two rooms import each other.
FLOORS = (
    ("errors", "text", "reader"),
    ("artifacts", "table", "measure", "project"),
    ("console", "candidates", "release", "rounds"),
    ("run", "telemetry", "reporting"),
    ("tune", "fleet", "rollout"),
    ("demo",),
    ("cli",),
    ("__main__",),
)
FLOOR = {room: floor for floor, rooms in enumerate(FLOORS) for room in rooms}

# A sub-package's __init__.py holds a docstring at most (importing a module of it, as the
# measuring child imports qualify.measure.worker, runs nothing else), but these, each for a
# reason, and each within INIT_MOST_LINES lines and importing only the standard library, click
# and qualify's own modules.
INIT_HOLDS = {
    "qualify/cli/__init__.py": "the qualify group, its list of commands and main (qualify.cli:main)",
    "qualify/demo/assets/__init__.py": "finds the demo's files, which lie beside it as package data",
}
INIT_MOST_LINES = 60


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


# What importing manifest.resolve may add to an interpreter that has imported only `site`: these
# of ours, and the standard library (argparse, json, datetime, typing...); the startup tests hold
# the same set.
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
    added = set(out.stdout.strip().split(",")) - {""}
    assert foreign(added, RESOLVE_IMPORTS) == set(), (
        f"manifest.resolve pulled in: {sorted(foreign(added, RESOLVE_IMPORTS))}"
    )


def _room(module: str) -> str:
    """The room of qualify a module belongs to: ``qualify.measure.worker`` -> ``measure``."""
    return module.split(".")[1]


def _qualify_imports(path: Path) -> set[str]:
    """The rooms of qualify a source file imports, at module level or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(_room(a.name) for a in node.names if a.name.startswith("qualify."))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("qualify."):
                found.add(_room(node.module))
            elif node.module == "qualify":  # the package's own names (__version__) or a room
                found.update(a.name for a in node.names if a.name in FLOOR)
    return found


def _qualify_rooms() -> list[Path]:
    return [
        p for p in sorted((ROOT / "qualify").rglob("*.py")) if p != ROOT / "qualify/__init__.py"
    ]


@pytest.mark.parametrize("path", _qualify_rooms(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_rooms_of_qualify_import_only_rooms_below_them(path: Path) -> None:
    rel = path.relative_to(ROOT)
    room = rel.parts[1] if len(rel.parts) > 2 else rel.stem
    assert room in FLOOR, f"{rel}: room {room!r} has no floor in FLOORS; give it one"
    above = {r for r in _qualify_imports(path) - {room} if FLOOR[r] >= FLOOR[room]}
    assert not above, f"{rel} ({room}, floor {FLOOR[room]}) imports {sorted(above)}"


def test_every_room_of_qualify_has_a_floor() -> None:
    rooms = {p.stem if p.is_file() else p.name for p in (ROOT / "qualify").iterdir()}
    rooms -= {"__init__", "__pycache__"}
    assert rooms == set(FLOOR)


def _sub_package_inits() -> list[Path]:
    return sorted(
        p for p in (ROOT / "qualify").rglob("__init__.py") if p.parent != ROOT / "qualify"
    )


@pytest.mark.parametrize("path", _sub_package_inits(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_sub_package_init_is_empty_or_tiny(path: Path) -> None:
    rel = path.relative_to(ROOT).as_posix()
    text = path.read_text(encoding="utf-8")
    body = ast.parse(text).body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    if rel not in INIT_HOLDS:
        assert not body, f"{rel} holds code: a sub-package's __init__.py is a docstring at most"
        return
    assert len(text.splitlines()) <= INIT_MOST_LINES, f"{rel}: over {INIT_MOST_LINES} lines"
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or top in ("click", "qualify"), (
                    f"{rel} imports {name} when imported"
                )
