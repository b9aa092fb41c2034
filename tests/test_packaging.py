"""`pip install .` ships everything the commands need at run time, not just the .py files."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_wheel_carries_demo_assets_templates_static_files_and_schemas(tmp_path: Path) -> None:
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
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("qualify-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "qualify/demo_assets/digits-mlp-fp32.onnx",
        "qualify/demo_assets/digits-mlp-int8.onnx",
        "qualify/demo_assets/digits_inputs.npy",
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
