"""The one pydantic base every document model derives from.

Owns the shared model configuration (unknown keys forbidden, frozen, every field described) and
the small value types several documents use. Owns no document itself.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict

__all__ = [
    "DIGEST_RE",
    "Digest",
    "Document",
    "Precision",
    "Role",
    "Verdict",
]

DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


def _check_digest(value: str) -> str:
    if not DIGEST_RE.match(value):
        raise ValueError(f"expected 'sha256:' followed by 64 lowercase hex digits, found {value!r}")
    return value


Digest = Annotated[str, AfterValidator(_check_digest)]
"""An artifact identity: ``sha256:<hex>`` of the file's bytes."""

Precision = Literal["fp32", "fp16", "int8", "pruned"]
Role = Literal["baseline", "candidate"]
Verdict = Literal["pass", "fail", "insufficient", "error"]


class Document(BaseModel):
    """Base of every qualify document: strict, immutable, self-describing."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=False)
