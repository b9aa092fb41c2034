"""A per-class directory (``--per-class DIR``): qualify's own, and only what qualify wrote there.

Owns the directory's layout, its ownership marker, and the three steps that publish a version
into it: `stage` (the version's set written into ``v<version>/``, hosts see nothing yet),
`point` (the pointer ``current`` moved to it, older sets removed) and `discard` (a staged set
that was never pointed at, removed). `write_per_class` is `stage` then `point`;
a publishing command runs them around writing the whole manifest, so that a kill at any
instant leaves the matrix's record and the files in agreement (``qualify.release.publishing``).

More: docs/internals.md, ``manifest.perclass``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from manifest import envelope
from manifest.errors import BuildError
from manifest.signing import key_id, sign_encoded
from schemas.atomic import remove_leftovers, temp_prefix, write_atomic

__all__ = [
    "MARKER",
    "Ownership",
    "claim",
    "discard",
    "point",
    "published_set",
    "stage",
    "write_per_class",
]

MARKER = ".qualify-per-class.json"
"""The file that makes a directory qualify's: ``{"format", "model", "sets"}``."""
_FORMAT = "qualify-per-class/1"
_SET = re.compile(r"v[0-9]{1,19}")
_LEFTOVER = re.compile(r"\..+\.p[0-9]{1,10}\.[^/]*\.tmp")
"""A temporary a qualify writer names (``schemas.atomic.temp_prefix``)."""
_MAX_ENTRIES = 100_000
"""Entries looked at before a directory is called too full to be one of ours."""
_MARKER_BYTES = 1 << 20


@dataclass(frozen=True)
class Ownership:
    """What the marker says: the model line the directory serves, and the sets qualify wrote."""

    model: str
    sets: tuple[str, ...]


def _pointer(directory: Path) -> str | None:
    try:
        text = (directory / envelope.CURRENT_POINTER).read_text("ascii")
    except (OSError, UnicodeDecodeError):
        return None
    return text.strip() if envelope.is_pointer(text) else None


def _read_marker(directory: Path) -> Ownership | None:
    """The marker, or None when there is none.

    Raises:
        BuildError: a marker that is not one qualify writes.
    """
    path = directory / MARKER
    if not path.exists():
        return None
    try:
        from schemas.atomic import read_bounded

        doc = json.loads(read_bounded(path, _MARKER_BYTES))
        model, sets = doc["model"], doc["sets"]
        if doc.get("format") != _FORMAT or not isinstance(model, str) or not isinstance(sets, list):
            raise ValueError("not a per-class marker")
        if not all(isinstance(s, str) and _SET.fullmatch(s) for s in sets):
            raise ValueError("a set that is not v<version>")
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise BuildError(
            f"{path}: not a marker qualify writes ({str(exc)[:200]}); restore it, or publish per-class "
            "documents into a new directory"
        ) from exc
    return Ownership(model, tuple(sets))


def published_set(directory: Path) -> tuple[str, int] | None:
    """The model line a per-class directory qualify wrote serves and the version its pointer
    names; None for any other directory (no marker or pointer, or one qualify does not write)."""
    try:
        owned = _read_marker(directory)
    except BuildError:
        return None
    current = _pointer(directory)
    if owned is None or current is None:
        return None
    return owned.model, _number(current)


def _write_marker(directory: Path, owned: Ownership) -> None:
    text = json.dumps(
        {"format": _FORMAT, "model": owned.model, "sets": sorted(set(owned.sets), key=_number)},
        sort_keys=True,
    )
    write_atomic(directory / MARKER, text + "\n")


def _number(name: str) -> int:
    return int(name[1:])


def _is_class_document(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(b'{"signatures":'))
            body = head + fh.read(16 << 20)
        return head == b'{"signatures":' and json.loads(body)["signed"]["type"] == (
            envelope.CLASS_TYPE
        )
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return False


def _adoptable(entry: os.DirEntry[str]) -> bool:
    """Whether an entry of a directory without a marker is what an earlier qualify wrote: the
    pointer, or a ``v<version>/`` set of signed per-class documents."""
    if entry.name == envelope.CURRENT_POINTER:
        return entry.is_file(follow_symlinks=False)
    if not (_SET.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False)):
        return False
    with os.scandir(entry.path) as files:  # closed also when all() stops at the first miss
        return all(
            f.is_file(follow_symlinks=False)
            and f.name.endswith(".json")
            and _is_class_document(Path(f.path))
            for f in files
        )


def _refuse(directory: Path, strangers: list[str], model: str | None = None) -> BuildError:
    # the user's own files first (hidden ones, a tool's folders, last)
    ordered = sorted(strangers, key=lambda n: (n.startswith("."), n))
    shown = ", ".join(ordered[:10]) + (
        f" and {len(ordered) - 10} more" if len(ordered) > 10 else ""
    )
    owner = f" for model line {model!r}" if model else ""
    return BuildError(
        f"--per-class {directory}: it holds files qualify did not write there{owner} ({shown}); "
        "qualify deletes older per-class sets in this directory, so it must be its own: choose "
        "an empty or new directory (or move those files away)"
    )


def claim(directory: Path, model: str) -> Ownership:
    """Make sure ``directory`` is qualify's per-class directory for ``model`` (creating it, or
    adopting one an earlier release wrote), and return what its marker says.

    Raises:
        BuildError: it holds anything qualify did not write there, it serves another model
            line, or its marker is damaged.
    """
    if directory.exists() and not directory.is_dir():
        raise BuildError(f"--per-class {directory}: not a directory")
    directory.mkdir(parents=True, exist_ok=True)
    owned = _read_marker(directory)
    entries = [e for e in os.scandir(directory) if not _LEFTOVER.fullmatch(e.name)]
    if len(entries) > _MAX_ENTRIES:
        raise _refuse(directory, [f"{len(entries)} entries"])
    if owned is not None:
        if owned.model != model:
            raise BuildError(
                f"--per-class {directory}: it serves model line {owned.model!r}, not {model!r}; "
                "each model line needs its own per-class directory"
            )
        mine = {MARKER, envelope.CURRENT_POINTER, *owned.sets}
        strangers = [e.name for e in entries if e.name not in mine]
        if strangers:
            raise _refuse(directory, strangers, owned.model)
        return owned
    strangers = [e.name for e in entries if not _adoptable(e)]
    if strangers:
        raise _refuse(directory, strangers)
    owned = Ownership(model, tuple(e.name for e in entries if e.name != envelope.CURRENT_POINTER))
    _write_marker(directory, owned)
    return owned


def stage(doc: Mapping[str, Any], key: Ed25519PrivateKey, directory: Path) -> dict[str, Path]:
    """Write the version's set of signed per-class documents into ``directory/v<version>/``,
    where no host looks until `point` moves ``current`` to it.

    The set is written into a temporary folder, synced and renamed into place, after the
    marker names it (so a kill leaves nothing the marker does not own).

    Args:
        doc: the manifest (signed document or its ``signed`` part).
        key: the signing key.
        directory: created if missing.

    Returns:
        class name -> path written (inside ``v<version>/``).

    Raises:
        BuildError: as `claim`; a class name that cannot be a file name; this version already
            staged or published there.
    """
    from manifest.build import per_class_documents

    signed_part = doc.get("signed", doc)
    version = int(signed_part["version"])
    name = f"v{version}"
    owned = claim(directory, str(signed_part["model"]))
    final = directory / name
    if final.exists():
        raise BuildError(
            f"{final}: version {version} is already published there; per-class sets are "
            "never rewritten (generate a new version)"
        )
    remove_leftovers(directory)  # sets a killed publisher left half-written
    _write_marker(directory, Ownership(owned.model, (*owned.sets, name)))
    work = Path(tempfile.mkdtemp(dir=directory, prefix=temp_prefix(name), suffix=".tmp"))
    written: dict[str, Path] = {}
    kid = key_id(key)  # derived from the key once, not once per class
    try:
        for cls, signed in per_class_documents(doc).items():
            try:
                filename = envelope.class_filename(cls)
            except ValueError as exc:
                raise BuildError(f"class '{cls[:60]}': {exc}") from exc
            with open(work / filename, "wb") as fh:
                fh.write(sign_encoded(signed, key, keyid=kid)[1])
            written[cls] = final / filename
        os.chmod(work, 0o755)
        os.sync()  # every document on disk before any name points at them
        os.rename(work, final)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return written


def point(directory: Path, version: int) -> None:
    """Publish staged set ``v<version>``: the pointer ``current`` moves to it atomically (never
    back to an older set than it names), then the sets no reader may need are removed: every
    set the marker lists but the one published and the one before it (for hosts that read the
    pointer just before it moved).

    Raises:
        BuildError: the set was not staged.
    """
    name = f"v{version}"
    if not (directory / name).is_dir():
        raise BuildError(f"{directory / name}: no such per-class set to publish")
    before = _pointer(directory)
    if before is not None and _number(before) > version:
        return  # a newer set is published already; this one stays for the record
    owned = _read_marker(directory)
    if before != name:
        write_atomic(directory / envelope.CURRENT_POINTER, name + "\n", sync_dir=True)
    if owned is None:
        return
    keep = {name, before} if before is not None else {name}
    for old in owned.sets:
        if old not in keep:
            shutil.rmtree(directory / old, ignore_errors=True)
    _write_marker(directory, Ownership(owned.model, tuple(s for s in owned.sets if s in keep)))


def discard(directory: Path, version: int) -> bool:
    """Remove set ``v<version>`` if qualify staged it and the pointer does not name it (a
    publication that never happened). Returns whether there was one."""
    name = f"v{version}"
    try:
        owned = _read_marker(directory)
    except BuildError:
        return False
    if owned is None or name not in owned.sets or _pointer(directory) == name:
        return False
    found = (directory / name).exists()
    shutil.rmtree(directory / name, ignore_errors=True)
    remove_leftovers(directory)
    _write_marker(directory, Ownership(owned.model, tuple(s for s in owned.sets if s != name)))
    return found


def write_per_class(
    doc: Mapping[str, Any], key: Ed25519PrivateKey, directory: Path
) -> dict[str, Path]:
    """Publish one signed document per class, all at once, into ``directory``: the version's
    set staged (`stage`), then the pointer moved to it and older sets removed (`point`). Only
    what qualify wrote there is ever removed, and a directory holding anything else is refused
    (`claim`).

    Args:
        doc: the manifest (signed document or its ``signed`` part).
        key: the signing key.
        directory: created if missing.

    Returns:
        class name -> path written (inside ``v<version>/``).

    Raises:
        BuildError: a directory that is not qualify's, a class name that cannot be a file name,
            or this version already published there.
    """
    written = stage(doc, key, directory)
    point(directory, int(doc.get("signed", doc)["version"]))
    return written
