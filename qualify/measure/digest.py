"""The artifact's bytes held to its digest around the measuring child's load, on the parent side.

Owns `mismatch`: the sha256 of the file a job names against the job's ``expected_digest``, as the
``digest_mismatch`` a cell records. `qualify.measure.runner` asks it just before it spawns the child
and again once the child has loaded the file; the child itself never hashes, because ``hashlib``
loads OpenSSL's libcrypto, ~3.5 MB resident that the child's measured peak would carry.
"""

from __future__ import annotations

from qualify.measure.job import WorkerJob
from schemas.atomic import file_sha256

__all__ = ["AFTER_LOADING", "BEFORE_LOADING", "mismatch"]

BEFORE_LOADING = "before the measuring process started"
AFTER_LOADING = "after the measuring process loaded it"


def mismatch(job: WorkerJob, when: str) -> tuple[str, str] | None:
    """``(reason code, message)`` when the file ``job`` names does not hold the bytes its
    ``expected_digest`` names (``digest_mismatch``) or cannot be read (``load_failed``), said
    as found ``when``; None when it holds them."""
    try:
        found = file_sha256(job.artifact_path)
    except OSError as exc:
        return "load_failed", f"cannot read {job.artifact_path} {when}: {exc.strerror or exc}"
    if found != job.expected_digest:
        return (
            "digest_mismatch",
            f"{job.artifact_path} has {found} {when}, expected {job.expected_digest}; "
            "the file was modified",
        )
    return None
