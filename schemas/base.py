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
    "NAME_RE",
    "NAME_RULE",
    "Digest",
    "Document",
    "Name",
    "Precision",
    "Role",
    "Verdict",
    "check_name",
]

DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


def _check_digest(value: str) -> str:
    if not DIGEST_RE.match(value):
        raise ValueError(f"expected 'sha256:' followed by 64 lowercase hex digits, found {value!r}")
    return value


Digest = Annotated[str, AfterValidator(_check_digest)]
"""An artifact identity: ``sha256:<hex>`` of the file's bytes."""

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
"""The one charset of every name a user gives (host classes, artifacts, key labels, the model):
what is safe as a file name, a URL segment, a terminal word and a markup-free label."""

NAME_RULE = (
    "1 to 64 characters: letters, digits, '.', '_', '+' or '-', starting with a letter or digit"
)


def check_name(value: str) -> str:
    """``value`` if it is a name (`NAME_RE`), else ValueError saying the rule and a fix."""
    if not NAME_RE.fullmatch(value):
        suggestion = re.sub(r"[^A-Za-z0-9._+-]+", "-", value).strip("-._+")[:64]
        fix = f" (e.g. {suggestion!r})" if suggestion and NAME_RE.fullmatch(suggestion) else ""
        raise ValueError(f"{value[:80]!r} is not a name: use {NAME_RULE}{fix}")
    return value


Name = Annotated[str, AfterValidator(check_name)]
"""A user-given name (see `NAME_RE`)."""

Precision = Literal["fp32", "fp16", "int8", "pruned"]
Role = Literal["baseline", "candidate"]
Verdict = Literal["pass", "fail", "insufficient", "error"]


class Document(BaseModel):
    """Base of every qualify document: strict, immutable, self-describing."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=False)
