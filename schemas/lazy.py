"""Package exports loaded on first use (PEP 562), so that importing one light module of a package
does not import all of its heavy siblings.

A package lists where each public name lives and delegates its module ``__getattr__`` here::

    _WHERE = {"Store": "matrix.store", ...}

    def __getattr__(name: str) -> object:
        return attribute(globals(), _WHERE, name)

Type checkers read the same names from an ``if TYPE_CHECKING:`` block of plain imports.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, MutableMapping
from typing import Any

__all__ = ["attribute"]


def attribute(namespace: MutableMapping[str, Any], where: Mapping[str, str], name: str) -> Any:
    """``name`` imported from the module ``where`` maps it to, cached in the package's
    ``namespace``; AttributeError, as for any missing attribute, when ``where`` does not name it."""
    module = where.get(name)
    if module is None:
        raise AttributeError(f"module {namespace.get('__name__')!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    namespace[name] = value
    return value
