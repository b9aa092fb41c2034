"""Fixtures of the matrix tests: a fresh store on a real DuckDB file per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from matrix.store import Store


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """Where a test's matrix file lives (not yet created)."""
    return tmp_path / "matrix.duckdb"


@pytest.fixture
def store(db_path: Path) -> Iterator[Store]:
    """A migrated store on a real DuckDB file, closed after the test."""
    with Store.open(db_path) as opened:
        yield opened
