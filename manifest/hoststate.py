"""What ``resolve-artifact`` keeps on a host between runs, per model line and signing key.

Owns the state directory's layout, reading it bounded, migrating the layout of earlier releases,
and writing it atomically. Does not own what the records mean for a document (the rollback floor
and the fork check are ``manifest.resolve``'s) nor verifying signatures (``manifest.envelope``).

More: docs/internals.md, ``manifest.hoststate``.

Standard library only (``resolve-artifact`` imports this at every service start); the writer,
``schemas.atomic``, is imported only on the rare path that writes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from stat import S_ISDIR, S_ISREG
from typing import NamedTuple

from manifest import envelope

__all__ = [
    "LKG_FILE",
    "MAX_SOURCES",
    "STATE_FILE",
    "Accepted",
    "LineState",
    "StateRecord",
    "encode_state",
    "find_line",
    "line_dir",
    "line_name",
    "load_line",
    "migrate_legacy",
    "open_regular",
    "parse_state",
    "parse_state_file",
    "read_bounded",
    "save_line",
    "source_id",
]

STATE_FILE = "state.json"
LKG_FILE = "last-known-good.json"
STATE_BYTES = 4096
"""The most a ``state.json`` may hold: more is refused unread, never trusted as a floor."""
MAX_SOURCES = 8
"""Manifest paths a line remembers it was read from (the most recent)."""
_MAX_LINES = 1024
"""Lines looked at when a manifest cannot say its own: a bound on a hostile directory."""
_KEY_CHARS = 16


class Accepted(NamedTuple):
    """What this host accepted, as ``state.json`` keeps it: the rollback floor and the identity
    of the document at that version (two documents of one version must be the same bytes)."""

    version: int
    kind: str | None
    """``signed.type``; None in a state written before it was kept."""
    host_class: str | None
    """The class of a per-class document; None for a whole manifest."""
    digest: str | None
    """Hex sha256 of the signed bytes; None in a state written before it was kept."""
    signature: str | None = None
    """``<key id>:<signature>`` of the trusted key's signature that verified the document (hex).
    Ed25519 signatures are deterministic, so under one key an equal signature means the same
    signed bytes: a start that finds the document it accepted last knows its digest without
    hashing it again (1.7 MB of SHA-256 for a 1,000-class manifest). None in an older state."""


class StateRecord(NamedTuple):
    """A ``state.json`` as read: the record, and the line and manifests it belongs to (None and
    empty in the layout of earlier releases)."""

    record: Accepted
    model: str | None
    keyid: str | None
    sources: tuple[str, ...]


class LineState(NamedTuple):
    """What the state directory holds for one line."""

    model: str
    keyid: str
    record: Accepted | None
    """Its ``state.json``'s record, if readable (or a top-level one of an unknown line)."""
    last_known_good: bytes | None
    sources: tuple[str, ...]
    state_file: str
    """The file that keeps the floor (for messages)."""
    unknown_floor: str | None = None
    """A top-level ``state.json`` of the earlier layout whose line is unknown, when its floor
    is part of ``record``: named in a refusal, so a person can tell whose floor it is."""


def line_name(model: str, keyid: str) -> str:
    """The folder of a line: ``<model>@<first 16 hex of the key id>``; a model that cannot be
    a file name (empty, too long, ``.``) is ``~<its sha256>`` (``~`` is escaped in the other)."""
    try:
        safe = envelope.class_filename(model)[: -len(".json")]
    except ValueError:
        safe = ""
    if not safe or len(safe) > 128:
        safe = "~" + envelope.sha256_hex(model.encode("utf-8", "surrogatepass"))[:32]
    return f"{safe}@{keyid[:_KEY_CHARS]}"


def line_dir(state_dir: str, model: str, keyid: str) -> str:
    """The folder of a line in ``state_dir``."""
    return os.path.join(state_dir, line_name(model, keyid))


def source_id(path: str) -> str:
    """How a line remembers a manifest it was read from: the sha256 of its absolute path (fixed
    length, whatever the path; 32 hex)."""
    text = os.path.abspath(path)
    return envelope.sha256_hex(text.encode("utf-8", "surrogateescape"))[:32]


def _is_signature(text: object) -> bool:
    """Whether ``text`` is ``<key id>:<signature>`` as `Accepted.signature` keeps it."""
    if not isinstance(text, str):
        return False
    keyid, sep, sig = text.partition(":")
    return bool(sep) and len(keyid) == 64 and len(sig) == 128 and envelope.is_hex(keyid + sig)


def parse_state_file(data: bytes) -> StateRecord:
    """A ``state.json``'s bytes, of this layout or the one before it.

    Raises:
        ValueError: not the object `encode_state` writes (NaN, ``1e400``, a huge or non-integer
            version, nesting too deep, a model or key id of the wrong kind: all refused, never
            trusted as a floor).
    """
    if len(data) > STATE_BYTES:
        raise ValueError(f"larger than {STATE_BYTES} bytes")
    doc = envelope.loads_strict(data)
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    version = doc.get("version")
    if type(version) is not int or not 1 <= version <= envelope.MAX_VERSION:
        raise ValueError(f"version {str(version)[:40]!r} is not an integer from 1 to 2**63-1")
    kind, cls, digest = doc.get("type"), doc.get("host_class"), doc.get("signed_sha256")
    signature = doc.get("signature")
    record = Accepted(
        version,
        kind if kind in (envelope.MANIFEST_TYPE, envelope.CLASS_TYPE) else None,
        cls if isinstance(cls, str) else None,
        digest if isinstance(digest, str) else None,
        signature if _is_signature(signature) else None,
    )
    model, keyid, sources = doc.get("model"), doc.get("keyid"), doc.get("sources", [])
    if model is not None and not isinstance(model, str):
        raise ValueError("model is not a string")
    if keyid is not None and not (
        isinstance(keyid, str) and len(keyid) == 64 and envelope.is_hex(keyid)
    ):
        raise ValueError("keyid is not 64 hex digits")
    if not isinstance(sources, list) or len(sources) > MAX_SOURCES:
        raise ValueError(f"sources is not a list of at most {MAX_SOURCES}")
    if not all(isinstance(s, str) and len(s) == 32 and envelope.is_hex(s) for s in sources):
        raise ValueError("sources holds something other than 32 hex digits")
    return StateRecord(record, model, keyid, tuple(sources))


def parse_state(data: bytes) -> Accepted:
    """The record in a ``state.json``'s bytes (`parse_state_file`'s).

    Raises:
        ValueError: as `parse_state_file`.
    """
    return parse_state_file(data).record


def encode_state(
    record: Accepted,
    *,
    model: str | None = None,
    keyid: str | None = None,
    sources: tuple[str, ...] = (),
) -> bytes:
    """The bytes of a ``state.json`` for ``record`` (of ``model`` under ``keyid``, read from
    ``sources``; without them, the layout of earlier releases)."""
    state: dict[str, object] = {
        "format": 1,
        "version": record.version,
        "type": record.kind,
        "host_class": record.host_class,
        "signed_sha256": record.digest,
        "signature": record.signature,
    }
    if model is not None and keyid is not None:
        state.update(format=2, model=model, keyid=keyid, sources=list(sources[:MAX_SOURCES]))
    return envelope.encode_canonical(state)


def open_regular(path: str) -> tuple[int, int]:
    """``schemas.atomic.open_regular`` (a read-only descriptor, only of a regular file: a pipe or
    a device is refused without blocking on it), with the file's size.

    Raises:
        IsADirectoryError: it is a folder.
        OSError: it cannot be opened, or is not a regular file (``EINVAL``).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    info = os.fstat(fd)
    if S_ISREG(info.st_mode):
        return fd, info.st_size
    os.close(fd)
    import errno

    if S_ISDIR(info.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a folder", str(path))
    raise OSError(errno.EINVAL, "not a regular file (a device or a pipe)", str(path))


def read_bounded(path: str, max_bytes: int, same_as: bytes | None = None) -> bytes:
    """``schemas.atomic.read_bounded``: at most ``max_bytes + 1`` bytes of a regular file (one
    more than the limit, so that the caller can tell a file that is too large). The first read
    asks for the size the file has, plus one: a manifest read in 1 MB chunks and joined paid for
    three buffers the size of the file, each new page of them a fault.

    Args:
        same_as: bytes the file probably holds (the last-known-good is usually the manifest
            just read): compared in small reads, and if the file holds exactly them, they are
            returned, the file never held in memory a second time.

    Raises:
        OSError: as `open_regular`.
    """
    fd, size = open_regular(path)
    try:
        if same_as is not None and size == len(same_as) and _holds(fd, same_as):
            return same_as
        chunks: list[bytes] = []
        left = max_bytes + 1
        want = min(left, size + 1)
        while left > 0 and (chunk := os.read(fd, want)):
            chunks.append(chunk)
            left -= len(chunk)
            want = min(left, 1 << 16)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    finally:
        os.close(fd)


def _holds(fd: int, data: bytes) -> bool:
    """Whether the file open at ``fd`` holds exactly ``data``, read in 64 kB pieces; else the
    descriptor is back at the start."""
    piece = bytearray(1 << 16)
    view = memoryview(piece)
    at = 0
    while count := os.readv(fd, [piece]):
        if not data.startswith(view[:count], at):
            break
        at += count
    else:
        if at == len(data):
            return True
    os.lseek(fd, 0, os.SEEK_SET)
    return False


def _read_state(path: str, say: Callable[[str], None]) -> StateRecord | None:
    try:
        return parse_state_file(read_bounded(path, STATE_BYTES))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        say(f"warning: {path} is unusable ({exc}); the rollback floor comes from what is left")
        return None


def _read_lkg(
    path: str, max_bytes: int, say: Callable[[str], None], same_as: bytes | None
) -> bytes | None:
    try:
        return read_bounded(path, max_bytes, same_as=same_as)
    except FileNotFoundError:
        return None
    except OSError as exc:
        say(f"warning: cannot read {path} ({exc})")
        return None


def load_line(
    state_dir: str,
    model: str,
    keyid: str,
    *,
    max_bytes: int,
    say: Callable[[str], None],
    same_as: bytes | None = None,
) -> LineState:
    """The state of one line (none yet: an empty one); what is unreadable is said and skipped
    (the floor then comes from what is left). A last-known-good holding the same bytes as
    ``same_as`` (the usual start: nothing new) is ``same_as`` itself. A ``state.json`` naming
    another line (copied from one) is not this line's. A top-level ``state.json`` of the
    earlier layout whose line is unknown and whose key is this one (or unsaid) floors it too."""
    folder = line_dir(state_dir, model, keyid)
    state_file = os.path.join(folder, STATE_FILE)
    found = _read_state(state_file, say)
    record: Accepted | None = None
    sources: tuple[str, ...] = ()
    if found is not None:
        if (found.model, found.keyid) in ((model, keyid), (None, None)):
            record, sources = found.record, found.sources
        else:
            say(f"warning: {state_file} names another line; the floor comes from what is left")
    lkg = _read_lkg(os.path.join(folder, LKG_FILE), max_bytes, say, same_as)
    unknown: str | None = None
    legacy_file = os.path.join(state_dir, STATE_FILE)
    legacy = _read_state(legacy_file, say) if os.path.lexists(legacy_file) else None
    if (
        legacy is not None
        and _signed_by(legacy.record, keyid) is not False
        and (record is None or legacy.record.version > record.version)
    ):
        record, unknown = legacy.record, legacy_file
    return LineState(model, keyid, record, lkg, sources, state_file, unknown)


def _signed_by(record: Accepted, keyid: str) -> bool | None:
    """Whether the record's signature is by ``keyid``; None when it keeps no signature."""
    if record.signature is None:
        return None
    return record.signature.partition(":")[0] == keyid


def find_line(state_dir: str, keyid: str, source: str) -> str | None:
    """The model of the line of ``keyid`` last read from manifest ``source`` (a `source_id`),
    or None: for a manifest that cannot say its own line (unreadable, or failing its signature
    check). Bounded: at most `_MAX_LINES` folders are looked at."""
    suffix = "@" + keyid[:_KEY_CHARS]
    try:
        names = [n for n in os.listdir(state_dir) if n.endswith(suffix)][:_MAX_LINES]
    except OSError:
        return None
    for name in sorted(names):
        found = _read_state(os.path.join(state_dir, name, STATE_FILE), lambda _: None)
        if (
            found is not None
            and found.model is not None
            and found.keyid == keyid
            and source in found.sources
            and line_name(found.model, keyid) == name
        ):
            return found.model
    return None


def save_line(
    state_dir: str,
    line: LineState,
    *,
    accepted: bytes | None,
    floor: Accepted | None,
    source: str | None,
) -> None:
    """Keep what a run accepted for ``line``: the document first (``accepted``, when it is not
    the last-known-good already), then the record naming it (``floor``) and ``source`` among the
    manifests it was read from. No write when nothing changed (the usual service start).

    Raises:
        OSError: the state directory cannot be written.
    """
    keep = accepted is not None and accepted != line.last_known_good
    sources = line.sources
    if source is not None and (not sources or sources[0] != source):
        sources = (source, *(s for s in sources if s != source))[:MAX_SOURCES]
    if floor is None or floor.digest is None:
        return  # no record of a document to name: nothing to keep
    if accepted is None and line.unknown_floor is not None:
        return  # the floor is an unknown line's: it stays that file's, not this line's
    if not keep and floor == line.record and line.unknown_floor is None and sources == line.sources:
        return
    # Imported here, on the rare path that writes: keeps it (and tempfile) off start-up.
    from schemas.atomic import write_atomic

    folder = line_dir(state_dir, line.model, line.keyid)
    os.makedirs(folder, exist_ok=True)
    if keep and accepted is not None:
        write_atomic(os.path.join(folder, LKG_FILE), accepted)
    state = encode_state(floor, model=line.model, keyid=line.keyid, sources=sources)
    write_atomic(os.path.join(folder, STATE_FILE), state)


def migrate_legacy(
    state_dir: str,
    keyid: str,
    *,
    identify: Callable[[bytes], tuple[str, Accepted]],
    max_bytes: int,
    say: Callable[[str], None],
) -> None:
    """Move the earlier layout's top-level ``last-known-good.json`` (and the ``state.json``
    beside it, when it is of the same key or says none) into the folder of the line the
    document belongs to, raising that line's floor to theirs; then remove them. A no-op when
    there is nothing of the earlier layout, or its document is not verified by this key (it may
    be another key's: it waits for that one).

    Args:
        identify: the document's (model, state record) once its signature by the trusted key
            verified (``resolve`` checks it); raises ``ValueError`` (or a verification error)
            for one that does not.
    """
    lkg_file = os.path.join(state_dir, LKG_FILE)
    if not os.path.lexists(lkg_file):
        return
    try:
        document = read_bounded(lkg_file, max_bytes)
        model, from_lkg = identify(document)
    except Exception:  # unreadable, or not this key's: left as it is, said where it matters
        return
    legacy_file = os.path.join(state_dir, STATE_FILE)
    legacy = _read_state(legacy_file, say) if os.path.lexists(legacy_file) else None
    ours = (
        legacy.record
        if legacy is not None and _signed_by(legacy.record, keyid) is not False
        else None
    )
    line = load_line(state_dir, model, keyid, max_bytes=max_bytes, say=say)
    candidates = [r for r in (line.record, from_lkg, ours) if r is not None]
    floor = max(candidates, key=lambda r: (r.version, r.digest is not None))
    kept = line.record if line.unknown_floor is None else None
    folder = line_dir(state_dir, model, keyid)
    try:
        from schemas.atomic import write_atomic

        os.makedirs(folder, exist_ok=True)
        if line.last_known_good is None or kept is None or from_lkg.version >= kept.version:
            write_atomic(os.path.join(folder, LKG_FILE), document)
        state = encode_state(floor, model=model, keyid=keyid, sources=line.sources)
        write_atomic(os.path.join(folder, STATE_FILE), state)
        if ours is not None:
            os.unlink(legacy_file)
        os.unlink(lkg_file)
    except OSError as exc:
        say(
            f"warning: cannot move {lkg_file} into {folder} ({exc.strerror}): its floor still holds, its document is not served from there"
        )
        return
    say(
        f"moved {lkg_file}{' and ' + STATE_FILE if ours is not None else ''} to {folder}: this host now "
        f"keeps one rollback floor per model line and signing key (line {model!r}, floor "
        f"version {floor.version})"
    )
