"""The one atomic file write every package uses: temp file beside the target, fsync, rename.

It lives in ``schemas`` because that is the bottom layer every package may import; it imports
only the standard library, so the host-side ``resolve-artifact`` may use it too. A reader never
sees a half-written file: either the old one or the complete new one.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["write_atomic"]


def write_atomic(
    path: Path | str,
    data: bytes | str,
    *,
    mode: int = 0o644,
    fsync: bool = True,
    sync_dir: bool = False,
) -> None:
    """Replace ``path`` with ``data`` atomically.

    Args:
        path: the target; its folder must exist.
        data: bytes, or text written as UTF-8 with ``\\n`` line ends.
        mode: permission bits of the new file (0o600 for a private key), set before any byte
            is written.
        fsync: force the bytes to disk before the rename (off only for many files that the
            caller syncs at once).
        sync_dir: also fsync the folder, so the rename itself survives a power cut.

    Raises:
        OSError: the folder does not exist or is not writable; nothing is left behind.
    """
    target = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            if fsync:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if sync_dir:
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
