"""The matrix package's boundary: its public names, and what it does not import."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import matrix

REPO = Path(__file__).resolve().parents[2]
MODULES = ["bundle", "errors", "ingest", "migrations", "samples", "store", "tables"]


def test_every_public_name_is_importable_from_its_module() -> None:
    for name in MODULES:
        module = importlib.import_module(f"matrix.{name}")
        assert module.__doc__
        for public in module.__all__:
            assert hasattr(module, public), f"matrix.{name}.__all__ names missing {public}"
    for public in matrix.__all__:
        assert hasattr(matrix, public)


def test_matrix_imports_neither_qualify_nor_manifest_nor_heavy_runtimes() -> None:
    code = (
        "import sys, matrix, matrix.store, matrix.ingest\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'qualify', 'manifest', 'reports', 'onnxruntime', 'jinja2', 'click'})\n"
        "print(','.join(bad))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == ""
