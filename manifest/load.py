"""Reading a manifest file back into its model.

Owns ``load_manifest``: bounded in size, split with the canonical layout and parsed with the same
parser as ``resolve-artifact`` (``manifest.envelope``), so that a file cannot read one way here
and another way on a host; then validated into ``schemas.manifest.Manifest`` with a message that
names the field. Does not check the signature (``manifest.signing.verify``), build or write a
manifest (``manifest.build``), nor read the host side's per-class documents
(``manifest.resolve``).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from manifest import envelope
from manifest.errors import MalformedError
from schemas.manifest import Manifest

__all__ = ["load_manifest"]


def load_manifest(raw: bytes | Path, *, source: str | None = None) -> Manifest:
    """Parse and validate a manifest (its signature is not checked here: ``signing.verify``).

    Only the canonical layout is read (``envelope.split_envelope``), with the same parser as
    ``resolve-artifact``.

    Args:
        raw: the file's bytes, or its path.
        source: name for messages (defaults to the path).

    Returns:
        The manifest model.

    Raises:
        MalformedError: unreadable, not JSON, or not a manifest (the message names the field).
    """
    if isinstance(raw, Path):
        source = source or str(raw)
        try:
            raw = raw.read_bytes()
        except OSError as exc:
            raise MalformedError(f"{source}: cannot read ({exc.strerror})") from exc
    source = source or "manifest"
    if len(raw) > envelope.MAX_BYTES:
        raise MalformedError(f"{source}: larger than the {envelope.MAX_BYTES}-byte limit")
    # The layout and the parser every reader uses (resolve-artifact included), so that a file
    # cannot read one way here and another way on a host.
    signatures, signed_bytes = envelope.split_envelope(raw, source)
    signed = envelope.parse_signed(signed_bytes, source)
    try:
        return Manifest.model_validate({"signed": signed, "signatures": signatures})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(document)"
        raise MalformedError(
            f"{source}: {where}: {first['msg']} ({exc.error_count()} problem(s)); is this a "
            "manifest written by 'qualify manifest generate'?"
        ) from exc
