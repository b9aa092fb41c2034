"""The content-addressed artifact store beside the matrix.

Owns identifying artifacts by ``sha256:<hex>`` of their bytes and keeping one immutable copy of
each under ``<store>/sha256/<hex>.onnx``. A copy is written atomically and verified again before
every load (the runner re-hashes the file before the measuring child starts and once it has loaded
it: `qualify.measure.digest`), because a flipped byte in the weights loads without any error.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from qualify.errors import ArtifactError
from schemas.atomic import file_sha256, open_binary

__all__ = ["ArtifactStore", "digest_file"]

CHUNK = 1 << 20


def digest_file(path: Path) -> str:
    """``sha256:<hex>`` of a file's bytes.

    Raises:
        ArtifactError: the file cannot be read.
    """
    try:
        return file_sha256(path)  # a pipe or a device is refused by name
    except OSError as exc:
        raise ArtifactError(f"{path}: cannot read artifact: {exc.strerror or exc}") from exc


class ArtifactStore:
    """Immutable artifact copies named by digest."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path_of(self, digest: str) -> Path:
        """Where the copy of ``digest`` lives (it may not exist)."""
        return self.root / "sha256" / (digest.removeprefix("sha256:") + ".onnx")

    def add(self, source: Path) -> tuple[str, Path]:
        """Copy ``source`` into the store (once) and return its digest and stored path.

        Raises:
            ArtifactError: the file is missing or the stored copy is corrupt.
        """
        digest = digest_file(source)
        target = self.path_of(digest)
        if target.exists():
            if digest_file(target) != digest:
                raise ArtifactError(
                    f"{target}: stored copy of {digest} is corrupt; delete it and run again"
                )
            return digest, target
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".incoming-")
        try:
            with os.fdopen(fd, "wb") as out, open_binary(source) as src:
                shutil.copyfileobj(src, out, CHUNK)
                out.flush()
                os.fsync(out.fileno())
            if digest_file(Path(tmp)) != digest:
                raise ArtifactError(f"{source}: changed while being copied; run again")
            os.chmod(tmp, 0o444)
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return digest, target

    def verify(self, digest: str) -> Path:
        """The stored path of ``digest`` after re-checking its bytes.

        Raises:
            ArtifactError: missing or modified.
        """
        path = self.path_of(digest)
        if not path.exists():
            raise ArtifactError(f"{path}: artifact {digest} is not in the store")
        actual = digest_file(path)
        if actual != digest:
            raise ArtifactError(f"{path}: holds {actual}, expected {digest}; the copy was modified")
        return path
