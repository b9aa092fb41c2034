"""Suite-wide isolation: no test reads or writes this machine's own resolve-artifact state or
takes its host-wide measurement lock."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _private_state_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """``resolve-artifact`` keeps its rollback floor under ``$XDG_STATE_HOME`` by default; each
    test (and every subprocess it starts) gets its own, empty one."""
    home: Path = tmp_path_factory.mktemp("state-home")
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    monkeypatch.delenv("QUALIFY_STATE_DIR", raising=False)
    # Each test its own host measurement lock: the suite's parallel workers are not two
    # qualifications competing for one host (the lock's own tests share one on purpose).
    monkeypatch.setenv("QUALIFY_HOST_LOCK", str(home / "measure.lock"))
    yield
