"""qualify's own modules the measuring child imports, and their bytecode cache.

Owns `CHILD_MODULES` (a test holds it to what the child loads) and `cache_child_bytecode`, which
`qualify.measure.runner` calls before it spawns a child, so that no child compiles qualify's
sources itself inside the peak it measures.
"""

from __future__ import annotations

import functools
from pathlib import Path

__all__ = ["CHILD_MODULES", "cache_child_bytecode"]

CHILD_MODULES = (
    "qualify/__init__.py",
    "qualify/measure/__init__.py",
    "qualify/measure/worker.py",
    "qualify/measure/contain.py",
    "qualify/measure/job.py",
    "qualify/measure/procfs.py",
    "qualify/measure/failures.py",
    "qualify/measure/hooks.py",
    "qualify/measure/feeds.py",
    "qualify/measure/session.py",
    "qualify/measure/timing.py",
    "qualify/measure/arrivals.py",
    "qualify/measure/energy.py",
    "qualify/measure/cpus.py",
    "qualify/measure/stats.py",
    "schemas/__init__.py",
    "schemas/rules.py",
    "schemas/atomic.py",
    "schemas/settings.py",
)
"""qualify's own modules the measuring child imports (a test holds this to what it loads)."""


@functools.cache
def cache_child_bytecode() -> int:
    """Compile the measuring child's own modules to their bytecode cache, once per process.

    A child that finds no cached bytecode (``PYTHONDONTWRITEBYTECODE`` set, or a checkout never
    imported) compiles qualify's sources itself, and the compiler's transient memory lands in
    the very peak it reports: +1.5 to 2.3 MB on the demo's 58 MB fp32 MLP, which no installed
    service pays (a wheel ships its bytecode). A read-only install that already has it is left
    alone; one that cannot be written is skipped, the cost then stays in the number.

    Returns:
        How many modules were (re)compiled.
    """
    import importlib.util
    import py_compile

    root = Path(__file__).resolve().parents[2]
    compiled = 0
    for rel in CHILD_MODULES:
        source = root / rel
        try:
            cached = Path(importlib.util.cache_from_source(str(source)))
            if _bytecode_current(cached, source):
                continue
            py_compile.compile(
                str(source),
                cfile=str(cached),
                doraise=True,
                invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP,
            )
            compiled += 1
        except (OSError, py_compile.PyCompileError, NotImplementedError, ValueError):
            continue
    return compiled


def _bytecode_current(cached: Path, source: Path) -> bool:
    """Whether ``cached`` is what the import system would accept for ``source`` as it is now
    (a timestamp pyc: magic, flags 0, the source's mtime and size)."""
    import importlib.util

    try:
        with cached.open("rb") as fh:
            head = fh.read(16)
        st = source.stat()
    except OSError:
        return False
    return (
        len(head) == 16
        and head[:4] == importlib.util.MAGIC_NUMBER
        and int.from_bytes(head[4:8], "little") == 0
        and int.from_bytes(head[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF
        and int.from_bytes(head[12:16], "little") == st.st_size & 0xFFFFFFFF
    )
