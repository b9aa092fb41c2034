"""Suite-wide isolation: no test reads or writes this machine's own resolve-artifact state or
takes its host-wide measurement lock."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from qualify.measure.sysroot import user_emulator_dir

settings.register_profile("shared-machine", deadline=None)
settings.load_profile("shared-machine")
"""No property test fails for how long one example took: Hypothesis's default 200 ms deadline
(and its too-slow health check, five deadlines of drawing) judges time, and on a shared 2-core
machine one example of a parser's test took 69 ms (test_job, beside the demo and a CPU hog), a
third of it. The properties are what the tests check; most already said ``deadline=None``."""

PREPARED_EMULATORS = user_emulator_dir()
"""Where this machine's user keeps prepared runtimes (``qualify emulators prepare``; CI prepares
one in .ci/run), read before any test hides it."""


def need_emulator(what: str) -> None:
    """Skip for a missing emulator piece, with the fix; on CI (``$CI`` set), where .ci/run
    installs every piece, fail instead."""
    message = f"{what} (.ci/run installs it)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


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
    # No runtime this machine's user prepared for another architecture: what --emulate does in
    # a test does not depend on it (the tests that want one ask for `prepared_emulators`).
    monkeypatch.setenv("QUALIFY_EMULATORS", str(home / "emulators"))
    yield
