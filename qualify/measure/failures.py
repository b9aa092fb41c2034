"""How a measurement inside the measuring child ends badly: a reason code and its message.

Owns `Failure` (raised anywhere in the child, it ends the job with its code: the worker writes it
into the result) and `classify_exception` (the code of an exception onnxruntime or a model raised
while loading or running). Standard library only, imported by every part of the child. What a
verdict makes of a code is the gates' (``manifest.gates``), not the child's.
"""

from __future__ import annotations

__all__ = ["OOM_MARKERS", "Failure", "classify_exception"]

OOM_MARKERS = ("bad_alloc", "failed to allocate", "out of memory", "cannot allocate memory")


class Failure(Exception):
    """A measurement that cannot go on: ``code`` is the result's reason code (``load_failed``,
    ``hook_failed``, ``run_failed``...), the message says what happened. (``digest_mismatch`` is
    the parent's: it hashes the artifact around the child's load, `qualify.measure.digest`.)"""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def classify_exception(exc: BaseException, stage: str) -> str:
    """Reason code for an exception raised at ``stage`` ('load' or 'run')."""
    text = f"{type(exc).__name__}: {exc}".lower()
    if isinstance(exc, MemoryError) or any(m in text for m in OOM_MARKERS):
        return "out_of_memory"
    return "load_failed" if stage == "load" else "run_failed"
