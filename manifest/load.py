"""Reading a manifest file back into its model.

Owns ``load_manifest``: bounded in size, split with the canonical layout and parsed with the same
parser as ``resolve-artifact`` (``manifest.envelope``), so that a file cannot read one way here
and another way on a host; then validated into ``schemas.manifest.Manifest`` with a message that
names the field. Also ``load_previous``: the same read into ``PreviousManifest``, the parts of the
published manifest that generating the next one reads (validated as strictly, the rest not at
all: for 10,000 classes, validating every entry's evidence and reasons was most of a second spent
on fields nothing reads). Does not check the signature (``manifest.signing.verify``), build or write a
manifest (``manifest.build``), nor read the host side's per-class documents
(``manifest.resolve``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from manifest import envelope
from manifest.errors import MalformedError
from schemas.manifest import Manifest, ManifestEntry, PreviousManifest

__all__ = [
    "load_editable",
    "load_manifest",
    "load_previous",
    "parse_manifest",
    "read_manifest_file",
    "validate_entry",
]

_Model = TypeVar("_Model", bound=BaseModel)


def load_manifest(raw: bytes | Path, *, source: str | None = None) -> Manifest:
    """Parse and validate a manifest (its signature is not checked here: ``signing.verify``).

    Only the canonical layout is read (``envelope.split_envelope``), with the same parser as
    ``resolve-artifact``, and at most ``envelope.MAX_MANIFEST_BYTES`` of it (a path is read no
    further): qualify reads back what it publishes, whole manifests larger than hosts read.

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
            raw = read_manifest_file(raw)
        except OSError as exc:
            raise MalformedError(f"{source}: cannot read ({exc.strerror or exc})") from exc
    source = source or "manifest"
    signatures, signed = parse_manifest(raw, source=source)
    return _validate(Manifest, {"signed": signed, "signatures": signatures}, source)


def read_manifest_file(path: Path) -> bytes:
    """A manifest file's bytes, at most one past ``envelope.MAX_MANIFEST_BYTES``: a larger file
    is refused by `parse_manifest` without being read whole.

    Raises:
        OSError: as ``schemas.atomic.read_bounded`` (a device or a pipe included).
    """
    from schemas.atomic import read_bounded

    return read_bounded(path, envelope.MAX_MANIFEST_BYTES)


def load_previous(raw: bytes, *, source: str) -> tuple[PreviousManifest, dict[str, Any]]:
    """Read the published manifest the next one is generated after.

    The bytes are bounded, split and parsed as `load_manifest` does; what generating the next
    manifest reads of them (version, release, and per class the artifact, runtime, provider,
    rollback and rollout) is validated with the models of ``schemas.manifest``, the other fields
    are not read. An entry copied verbatim into the next manifest (a class kept as published)
    must be validated whole by the caller first (``schemas.manifest.ManifestEntry``).

    Args:
        raw: the document's bytes.
        source: name for messages.

    Returns:
        The validated view and the parsed ``signed`` object.

    Raises:
        MalformedError: too large, not the canonical layout, not JSON, or a field read is invalid
            (the message names it).
    """
    signatures, signed = parse_manifest(raw, source=source)
    return _validate(PreviousManifest, {"signed": signed, "signatures": signatures}, source), signed


def load_editable(raw: bytes, *, source: str) -> tuple[Manifest, dict[str, Any]]:
    """A published manifest read once for an edit: its model, and the parsed ``signed`` object
    the model was validated from (the wire form of every entry the edit leaves as it was).

    Raises:
        MalformedError: as `load_manifest`.
    """
    signatures, signed = parse_manifest(raw, source=source)
    return _validate(Manifest, {"signed": signed, "signatures": signatures}, source), signed


def validate_entry(entry: Any, *, name: str, source: str) -> Any:
    """``entry`` (class ``name``'s entry of a manifest read from ``source``), once it validates
    as a ``ManifestEntry``, unchanged: what a generation copies verbatim into the next manifest.

    Raises:
        MalformedError: it does not (the message names the field as `load_manifest` would).
    """
    _validate(ManifestEntry, entry, source, where=f"signed.entries.{name}")
    return entry


def parse_manifest(raw: bytes, *, source: str) -> tuple[list[dict[str, str]], dict[str, Any]]:
    """A manifest's signatures and ``signed`` object, not validated (a draft being published is
    compared with what the matrix recorded instead).

    Raises:
        MalformedError: larger than ``envelope.MAX_MANIFEST_BYTES``, not the canonical layout,
            or not JSON.
    """
    limit = envelope.MAX_MANIFEST_BYTES  # qualify's own reading; hosts keep MAX_BYTES
    if len(raw) > limit:
        raise MalformedError(f"{source}: larger than the {limit}-byte limit of a manifest")
    # The layout and the parser every reader uses (resolve-artifact included), so that a file
    # cannot read one way here and another way on a host.
    signatures, signed_bytes = envelope.split_envelope(raw, source)
    return signatures, envelope.parse_signed(signed_bytes, source)


def _validate(model: type[_Model], document: Any, source: str, *, where: str = "") -> _Model:
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join([where, *(str(p) for p in first["loc"])][0 if where else 1 :])
        where = where or "(document)"
        raise MalformedError(
            f"{source}: {where}: {first['msg']} ({exc.error_count()} problem(s)); is this a "
            "manifest written by 'qualify manifest generate'?"
        ) from exc
