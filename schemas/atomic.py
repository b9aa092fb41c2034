"""The one atomic file write every package uses: temp file beside the target, fsync, rename;
and the clean-up of what a killed writer leaves.

It lives in ``schemas`` because that is the bottom layer every package may import; it imports
only the standard library, so the host-side ``resolve-artifact`` may use it too. A reader never
sees a half-written file: either the old one or the complete new one.

Every temporary file or folder a qualify writer makes beside its target is named
``.<name>.p<pid>.<random>.tmp`` (`temp_prefix`): hidden, and tagged with the writer's process
id, so that `remove_leftovers` can tell what belongs to a process that is gone (killed mid-way)
from what a live one is still writing.
"""

from __future__ import annotations

import errno
import os
import stat

# resolve-artifact reads with this module at start-up: no re or pathlib at import (they load
# where a writer needs them). mypy reads the flag as typing.TYPE_CHECKING.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
    from typing import BinaryIO

__all__ = [
    "file_sha256",
    "kind_of",
    "open_binary",
    "open_regular",
    "pid_alive",
    "read_bounded",
    "remove_leftovers",
    "temp_prefix",
    "write_atomic",
]

_LEFTOVER = r"\..+\.p([0-9]{1,10})\.[^/]*\.tmp"
"""A `temp_prefix` name (compiled when first used: resolve-artifact imports this module)."""


def kind_of(mode: int) -> str:
    """What a file of this ``st_mode`` is, for a message: "a folder", "a named pipe (FIFO)"..."""
    for test, kind in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a named pipe (FIFO)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return kind
    return "not a regular file"


def _not_regular(path: Path | str, mode: int) -> OSError:
    if stat.S_ISDIR(mode):
        return IsADirectoryError(errno.EISDIR, "is a folder, not a file", str(path))
    return OSError(errno.EINVAL, f"not a regular file: it is {kind_of(mode)}", str(path))


def open_regular(path: Path | str) -> int:
    """A read-only descriptor of ``path``, only if it is a regular file: a pipe, a socket or a
    device (``/dev/zero``) is refused by name without opening it (opening a device can have
    effects of its own), blocking on it or reading it.

    Raises:
        IsADirectoryError: it is a folder.
        OSError: it cannot be opened, or is not a regular file (``EINVAL``, the message saying
            what it is).
    """
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise _not_regular(path, mode)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    mode = os.fstat(fd).st_mode  # what was opened, should the path have changed since
    if stat.S_ISREG(mode):
        return fd
    os.close(fd)
    raise _not_regular(path, mode)


def open_binary(path: Path | str) -> BinaryIO:
    """``open(path, "rb")``, only for a regular file (`open_regular`)."""
    fd = open_regular(path)
    try:
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def file_sha256(path: Path | str) -> str:
    """``sha256:<hex>`` of a regular file's bytes (`open_binary`), read 1 MiB at a time.

    Raises:
        OSError: as `open_regular`, or a read that fails.
    """
    import hashlib  # here, not at the top: the measuring child imports this module

    hasher = hashlib.sha256()
    with open_binary(path) as fh:
        while chunk := fh.read(1 << 20):
            hasher.update(chunk)
    return "sha256:" + hasher.hexdigest()


def read_bounded(path: Path | str, max_bytes: int) -> bytes:
    """At most ``max_bytes + 1`` bytes of a regular file (`open_regular`): one more than the
    limit, so that the caller can tell a file that is too large.

    Raises:
        OSError: as `open_regular`.
    """
    fd = open_regular(path)
    try:
        chunks: list[bytes] = []
        left = max_bytes + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def temp_prefix(name: str) -> str:
    """The prefix of a temporary beside ``name``: ``.<name>.p<pid>.`` (pair with ``.tmp``)."""
    return f".{name}.p{os.getpid()}."


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (one owned by another user counts)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OverflowError:
        return False
    return True


def remove_leftovers(directory: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporaries of writers that are no longer running from ``directory``.

    Returns:
        What was removed (files and folders named by `temp_prefix` whose process is gone);
        a folder that cannot be listed gives an empty list.
    """
    import re
    from pathlib import Path

    removed: list[Path] = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        found = re.fullmatch(_LEFTOVER, entry.name)
        if found is None or pid_alive(int(found.group(1))):
            continue
        path = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            import shutil

            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    return removed


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
        OSError: the folder does not exist or is not writable, the disk is full, or ``path``
            exists and is not a regular file (a device, a pipe, a folder: never replaced);
            named in the error, and nothing is left behind.
    """
    import tempfile  # here, not at import: resolve-artifact reads with this module at start-up

    target = os.fspath(path)
    folder = os.path.dirname(target) or "."
    try:
        existing = os.lstat(target).st_mode
    except FileNotFoundError:
        existing = stat.S_IFREG
    if not (stat.S_ISREG(existing) or stat.S_ISLNK(existing)):
        # Renaming over it would replace a device or a pipe (``--out /dev/null`` as root).
        raise OSError(
            errno.EINVAL,
            f"exists and is {kind_of(existing)}; qualify replaces only regular files",
            target,
        )
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(
        prefix=temp_prefix(os.path.basename(target)), suffix=".tmp", dir=folder
    )
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            if fsync:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException as exc:
        from pathlib import Path  # the failing path only

        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is None:
            # A write or fsync on a full disk names no file: name the one that was not written.
            raise OSError(exc.errno, f"{exc.strerror or exc}; nothing was written", target) from exc
        raise
    if sync_dir:
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
