"""qualify: a fleet qualification matrix and release-manifest manager for ONNX models.

This package holds the host side of a qualification run: fingerprint, artifact store, the
runner (onnxruntime in a subprocess), statistics, parity, the run itself and the click CLI
(the composition root). Importing it imports nothing heavy.

For notebooks and scripts, ``qualify.open("qualify.duckdb")`` reads a matrix as pandas
DataFrames (`qualify.reader`, docs/python.md); it is imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from qualify.reader import Matrix, open

__version__ = "0.1.0"

__all__ = ["Matrix", "open"]

_WHERE = {"Matrix": "qualify.reader", "open": "qualify.reader"}
"""Where each public name lives: imported on first use, so that the measuring child, which
imports this package, loads neither the matrix nor pandas."""


def __getattr__(name: str) -> Any:
    if name not in _WHERE:  # a submodule's name: let the import system look for it
        raise AttributeError(f"module 'qualify' has no attribute {name!r}")
    from schemas.lazy import attribute

    return attribute(globals(), _WHERE, name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
