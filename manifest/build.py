"""Building and writing release manifests.

Owns turning the policy's decisions into the ``signed`` part of a manifest (each entry the
``model_dump`` of its parts, encoded once as ``envelope.encode_canonical`` encodes it: the walk for
floats made of the provider settings alone, the one part that may hold one), splitting it into one
document per host class, and writing both atomically. Does not own the decision
(``manifest.policy``), keys and signatures (``manifest.signing``) nor reading a manifest back
(``manifest.load``). No clock: ``created`` and ``expires`` are arguments.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from manifest import envelope
from manifest._batch import paused_gc
from manifest.encoded import EncodedEntries, EntryText, holds_float, plain_canonical
from manifest.envelope import encode_canonical
from manifest.errors import BuildError
from manifest.signing import sign_document
from schemas.atomic import write_atomic
from schemas.manifest import ArtifactRef, ClassDecision, Manifest, PreviousManifest
from schemas.project import HostClass, Project

__all__ = [
    "build_manifest",
    "next_version",
    "per_class_documents",
    "sign_document",
    "write_manifest",
]


def next_version(previous: Manifest | PreviousManifest | None) -> int:
    """The version of the next manifest: one above the previous one, 1 for the first."""
    return 1 if previous is None else previous.signed.version + 1


class _Locations:
    """Where the previous manifest says each artifact it points at is: digest -> location,
    indexed on the first lookup (most builds never look), the first entry naming a digest (in
    the manifest's order; an entry's artifact before its rollback) winning."""

    def __init__(self, previous: Manifest | PreviousManifest | None) -> None:
        self._previous = previous
        self._known: dict[str, dict[str, Any]] | None = None

    def get(self, digest: str) -> dict[str, Any] | None:
        if self._known is None:
            self._known = {}
            entries = self._previous.signed.entries.values() if self._previous else ()
            for entry in entries:
                for item in (entry.artifact, entry.rollback):
                    if item is not None and item.digest not in self._known:
                        self._known[item.digest] = {
                            "name": item.name,
                            "digest": item.digest,
                            "length": item.length,
                            "uri": item.uri,
                        }
        found = self._known.get(digest)
        return None if found is None else dict(found)


def _artifact(
    digest: str,
    artifacts: Mapping[str, ArtifactRef],
    previous: _Locations,
    host_class: str,
    role: str,
) -> dict[str, Any]:
    ref = artifacts.get(digest)
    if ref is not None:
        return {"name": ref.name, "digest": digest, "length": ref.length, "uri": ref.uri}
    # A rollback may be an artifact the project no longer lists: the previous manifest knows it.
    found = previous.get(digest)
    if found is not None:
        return found
    raise BuildError(
        f"class '{host_class}': the {role} artifact {digest} has no location; add it to "
        "'artifacts' (digest -> name, uri, length) from the artifact store"
    )


def build_manifest(
    project: Project,
    decisions: Iterable[ClassDecision],
    *,
    release: str,
    version: int,
    created: datetime,
    expires: datetime,
    snapshot: str,
    artifacts: Mapping[str, ArtifactRef],
    previous: Manifest | PreviousManifest | None = None,
    encoded: bool = False,
) -> dict[str, Any]:
    """The ``signed`` part of a manifest.

    Args:
        project: the project file (match rules, runtime and provider requirements per class).
        decisions: ``manifest.policy.decide``'s output, one per class; or
            ``decide_each``'s, each entry then written as its batch of classes is decided.
        release: release name.
        version: this manifest's version; must be above ``previous``'s.
        created: when it is generated (aware datetime; seconds kept).
        expires: from when hosts refuse it; must be after ``created``.
        snapshot: the matrix snapshot the decisions were read from.
        artifacts: digest -> where hosts fetch it.
        previous: the previous manifest (version check, locations of old rollback artifacts).
        encoded: hold ``entries`` as an `EncodedEntries`, each entry's canonical bytes as they
            were written (what generating a release signs, writes and splits without encoding the
            entries again), rather than as parsed JSON objects.

    Returns:
        The ``signed`` mapping: canonical-JSON content with no floats, ready for
        ``sign_document``.

    Raises:
        BuildError: a version not above the previous one, ``expires`` not after ``created``, a
            decision for a class the project lacks, or an artifact without a location.
    """
    created_s, expires_s = _checked(release, version, created, expires, previous)
    with paused_gc():
        written = _entries(project, decisions, artifacts, previous)
        entries = written if encoded else dict(written)
    return {
        "type": envelope.MANIFEST_TYPE,
        "format": envelope.FORMAT,
        "release": release,
        "version": version,
        "created": created_s,
        "expires": expires_s,
        "model": project.model,
        "snapshot": snapshot,
        "policy": project.policy.model_dump(mode="json"),
        "entries": entries,
    }


def _checked(
    release: str,
    version: int,
    created: datetime,
    expires: datetime,
    previous: Manifest | PreviousManifest | None,
) -> tuple[str, str]:
    """`build_manifest`'s checks of its arguments; ``created`` and ``expires`` as written."""
    if not release:
        raise BuildError("release: the release name must not be empty; pass --release NAME")
    if version < 1:
        raise BuildError(f"version: must be >= 1, found {version}")
    if previous is not None and version <= previous.signed.version:
        raise BuildError(
            f"version: {version} must be > {previous.signed.version}, the previous manifest's "
            f"(release {previous.signed.release!r}); a lower version is never generated"
        )
    created_s, expires_s = envelope.format_time(created), envelope.format_time(expires)
    if expires_s <= created_s:
        raise BuildError(f"expires: {expires_s} must be after created {created_s}")
    return created_s, expires_s


def _entries(
    project: Project,
    decisions: Iterable[ClassDecision],
    artifacts: Mapping[str, ArtifactRef],
    previous: Manifest | PreviousManifest | None,
) -> EncodedEntries:
    """Every decision's entry as its canonical bytes, in the decisions' order."""
    items: dict[str, EntryText] = {}
    locations = _Locations(previous)
    for d in decisions:
        cls = project.host_classes.get(d.host_class)
        if cls is None:
            raise BuildError(
                f"decision for class '{d.host_class}', which the project file does not define"
            )
        if d.host_class in items:
            raise BuildError(f"two decisions for class '{d.host_class}'")
        entry = _entry_of(d, cls, artifacts, locations)
        # Only provider settings may hold a float (a YAML session config or provider option):
        # where one does, encode_canonical refuses it by its path; every other member is plain.
        data = encode_canonical(entry) if _provider_float(entry) else plain_canonical(entry)
        items[d.host_class] = EntryText((data, d.host_class, d.decision))
    return EncodedEntries(items)


_DECIDED = {"host_class", "decision", "evidence", "reasons", "summary", "run_ids"}
"""The members of an entry that are its decision's fields as they are."""
_SETTINGS = {"key", "runtime", "provider"}
"""The members of an entry that are its class's settings less their nulls (the key has none)."""


def _entry_of(
    d: ClassDecision,
    cls: HostClass,
    artifacts: Mapping[str, ArtifactRef],
    previous: _Locations,
) -> dict[str, Any]:
    """The manifest entry of decision ``d`` (``cls``: its class's settings in the project file
    now), each part its model's ``model_dump``: match rules less their defaults, runtime and
    provider less their nulls, a rollback's runtime and provider null where they are the
    class's own (most classes; keeps entries small). The decision's members are one dump of
    it, the key, runtime and provider one of the class (a call per part cost more than the
    parts).

    Every member but the provider settings holds integers, strings, booleans and nulls only:
    the fields of validated models (`Evidence` and `Reason` hold no float by their types), and
    artifact locations from `ArtifactRef`."""
    entry = d.model_dump(mode="json", include=_DECIDED)
    entry.update(cls.model_dump(mode="json", include=_SETTINGS, exclude_none=True))
    entry["match"] = cls.match.model_dump(mode="json", exclude_defaults=True)
    entry["artifact"] = None
    if d.artifact_digest is not None:
        entry["artifact"] = _artifact(
            d.artifact_digest, artifacts, previous, d.host_class, d.decision
        )
    entry["rollback"] = None
    if d.rollback_digest is not None:
        entry["rollback"] = {
            **_artifact(d.rollback_digest, artifacts, previous, d.host_class, "rollback"),
            "proven_to_load": d.rollback_proven,
            "runtime": None
            if d.rollback_runtime == cls.runtime
            else d.rollback_runtime.model_dump(mode="json", exclude_none=True),
            "provider": None
            if d.rollback_provider == cls.provider
            else d.rollback_provider.model_dump(mode="json", exclude_none=True),
        }
    return entry


def _provider_float(entry: Mapping[str, Any]) -> bool:
    """Whether the entry's provider settings, or its rollback's, hold a float."""
    rollback = entry["rollback"]
    return holds_float(entry["provider"]) or (
        rollback is not None
        and rollback["provider"] is not None
        and holds_float(rollback["provider"])
    )


def _signed_part(doc: Mapping[str, Any]) -> Mapping[str, Any]:
    inner = doc.get("signed")
    return inner if isinstance(inner, Mapping) else doc


def per_class_documents(signed: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Split a manifest into one ``signed`` part per host class.

    Each carries the manifest's release, version, times, model, snapshot and policy, the class
    name (hosts check it against the name they asked for) and the class's entry.

    Args:
        signed: a manifest's ``signed`` part (or the whole signed document).

    Returns:
        class name -> ``signed`` part of type ``qualify-class-manifest``.
    """
    signed = _signed_part(signed)
    common = {
        k: signed[k] for k in ("release", "version", "created", "expires", "model", "snapshot")
    }
    common["policy"] = signed["policy"]
    entries = signed["entries"]
    # An entry still held as its canonical bytes is not parsed to be encoded again.
    entry_of = entries.encoded if isinstance(entries, EncodedEntries) else entries.__getitem__
    return {
        name: {
            **common,
            "type": envelope.CLASS_TYPE,
            "format": envelope.FORMAT,
            "host_class": name,
            "entry": entry_of(name),
        }
        for name in entries
    }


def write_manifest(doc: Mapping[str, Any] | bytes, path: Path) -> None:
    """Write a signed (or unsigned) document atomically as canonical JSON.

    Args:
        doc: ``{"signed": ..., "signatures": [...]}``, or its canonical bytes as
            ``signing.sign_encoded`` returns them (written as they are, not encoded again).
        path: destination; its directory must exist.

    Raises:
        BuildError: the directory does not exist.
        CanonicalError: the document holds a float.
    """
    if not path.parent.is_dir():
        raise BuildError(f"{path.parent}: no such directory for the manifest; create it first")
    write_atomic(path, doc if isinstance(doc, bytes) else envelope.encode_canonical(doc))
