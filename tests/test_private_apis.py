"""Public APIs only: no package module imports a private module or name of a dependency (the
standard library included: ``_json``, ``_sha2``), statically or by a string literal handed to
``importlib.import_module`` or ``__import__`` (or any string naming exactly a private module of the
standard library: a loop over ``("_sha2", "_sha256")`` imports them as well), nor reaches for a
private attribute of one.

A private name is one with a single leading underscore (``_rust``, ``_compute``); dunders
(``__future__``, ``__version__``) are public, pydantic's own ``__pydantic_*__`` apart (its
documented hooks aside). Our own packages may import each other's private names: that is a matter of the architecture test, not of our dependencies' promises.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("qualify", "manifest", "matrix", "schemas", "reports")
OURS = frozenset(PACKAGES)

PRIVATE_DUNDER_PREFIX = "__pydantic_"
"""pydantic's own dunders (its instance slots, its core serializer and validator) are private all
the same: write through ``model_construct`` or validation, read through ``model_dump_json`` or
``model_validate``."""
DOCUMENTED_HOOKS = frozenset({"__pydantic_init_subclass__", "__pydantic_on_complete__"})
"""Such dunders pydantic documents as hooks a model may define."""
PRIVATE_STDLIB = frozenset(
    n for n in sys.stdlib_module_names if n.startswith("_") and not n.startswith("__")
)
"""The standard library's private modules (``_json``, ``_sha2``, ``_hashlib``...)."""
DOCUMENTED = frozenset({("os", "_exit")})
"""Underscored names their library documents as public (``os._exit``: exit without cleanup)."""


def _private_dunder(name: str) -> bool:
    return name.startswith(PRIVATE_DUNDER_PREFIX) and name not in DOCUMENTED_HOOKS


def _private(name: str) -> bool:
    return (name.startswith("_") and not name.startswith("__")) or _private_dunder(name)


def _ours(module: str) -> bool:
    return module.split(".")[0] in OURS


def _foreign_names(tree: ast.AST) -> set[str]:
    """The names a module binds to a dependency's module or object by importing it."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(
                alias.asname or alias.name.split(".")[0]
                for alias in node.names
                if not _ours(alias.name)
            )
        elif _foreign_from(node):
            names.update(alias.asname or alias.name for alias in node.names)  # type: ignore[attr-defined]
    return names


def _foreign_from(node: ast.AST) -> bool:
    """Whether ``node`` is ``from <a dependency> import ...``."""
    return (
        isinstance(node, ast.ImportFrom)
        and node.level == 0
        and node.module is not None
        and not _ours(node.module)
        and node.module != "__future__"
    )


def _import_uses(node: ast.AST) -> list[str]:
    """The private modules and names an import statement of a dependency names."""
    if isinstance(node, ast.Import):
        return [
            f"import {a.name}"
            for a in node.names
            if not _ours(a.name) and any(map(_private, a.name.split(".")))
        ]
    if not isinstance(node, ast.ImportFrom) or not _foreign_from(node):
        return []
    module = str(node.module)
    found = [f"from {module} import ..."] if any(map(_private, module.split("."))) else []
    return found + [f"from {module} import {a.name}" for a in node.names if _private(a.name)]


def _dynamic_import(node: ast.AST) -> str | None:
    """A dependency's private module named by a string literal to ``import_module`` (bare or
    as ``importlib.import_module``) or ``__import__``, or a standard library's private module
    named by any string literal."""
    if isinstance(node, ast.Constant) and node.value in PRIVATE_STDLIB:
        return f"name {node.value!r}"  # for name in ("_sha2", "_sha256"): import_module(name)
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    first = node.args[0]
    if called not in ("import_module", "__import__") or not isinstance(first, ast.Constant):
        return None
    module = first.value
    if not isinstance(module, str) or module.startswith(".") or _ours(module):
        return None  # a relative name is within the calling package: ours
    return f"{called}({module!r})" if any(map(_private, module.split("."))) else None


def _attribute_use(node: ast.AST, foreign: set[str]) -> str | None:
    """A private attribute of a dependency's module or object, or a known private name."""
    if isinstance(node, ast.Attribute) and _private(node.attr):
        base = node.value
        named = isinstance(base, ast.Name) and base.id in foreign
        if named and (base.id, node.attr) in DOCUMENTED:  # type: ignore[attr-defined]
            return None
        if named or _private_dunder(node.attr):
            return f"attribute .{node.attr}"
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and _private_dunder(node.value)
    ):
        return f"name {node.value!r}"  # BaseModel.__dict__["__pydantic_extra__"]
    return None


def violations(source: str, filename: str = "<source>") -> list[str]:
    """Each use of a dependency's private module, name or attribute in ``source``."""
    tree = ast.parse(source, filename)
    foreign = _foreign_names(tree)
    found: list[str] = []
    for node in ast.walk(tree):
        uses = _import_uses(node)
        uses += [use for use in (_attribute_use(node, foreign), _dynamic_import(node)) if use]
        found += [f"{filename}:{getattr(node, 'lineno', 0)}: {use}" for use in uses]
    return found


def _modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def test_no_package_module_uses_a_private_api_of_a_dependency() -> None:
    found = [
        v
        for path in _modules()
        for v in violations(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    ]
    assert found == [], "private APIs of dependencies:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        "import _json",
        "from _json import make_scanner",
        "from _sha2 import sha256",
        "from cryptography.hazmat.bindings._rust import openssl",
        "import cryptography.hazmat.bindings._rust",
        "from pyarrow._compute import call_function",
        "from json import _default_decoder",
        "import pydantic\nx = pydantic._internal",
        "from pydantic import BaseModel\nBaseModel.__dict__['__pydantic_extra__']",
        "def f(m):\n    m.__pydantic_fields_set__ = set()",
        "def f(m):\n    return type(m).__pydantic_serializer__.to_json(m)",
        "def f(m):\n    return type(m).__pydantic_decorators__",
        "import numpy as np\nnp._core",
        "import importlib\nimportlib.import_module('_sha2').sha256()",
        "from importlib import import_module\nimport_module('_json')",
        "__import__('_sha256')",
        "import importlib\nimportlib.import_module('somelib.bindings._native')",
        "import importlib\nfor n in ('_sha2', '_sha256'):\n    importlib.import_module(n)",
    ],
)
def test_the_check_finds_each_kind_of_private_use(source: str) -> None:
    assert violations(source) != []


@pytest.mark.parametrize(
    "source",
    [
        "from __future__ import annotations",
        "import json\njson.dumps({})",
        "import pyarrow.compute as pc\npc.call_function('unique', [])",
        "from qualify.cli.errors import _fail",
        "from manifest._batch import paused_gc",
        "class A:\n    def f(self):\n        return self._x",
        "from pydantic import BaseModel\nBaseModel.model_construct()",
        "import qualify\nqualify.__version__",
        "from pydantic import BaseModel\nclass M(BaseModel):\n    @classmethod\n"
        "    def __pydantic_init_subclass__(cls, **kw):\n"
        "        super().__pydantic_init_subclass__(**kw)",
        "import os\nos._exit(0)",
        "import importlib\nimportlib.import_module('json')",
        "__import__('hashlib')",
        "import importlib\nimportlib.import_module('qualify.measure._x')",
        "import importlib\nimportlib.import_module('._x', 'qualify')",
        "import importlib\nimportlib.import_module(name)",
    ],
)
def test_the_check_lets_public_apis_and_our_own_private_names_through(source: str) -> None:
    assert violations(source) == []
