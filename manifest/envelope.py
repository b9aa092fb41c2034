"""The signed envelope ``{"signed": {...}, "signatures": [...]}``: what both sides of a manifest
must agree on byte for byte (canonical JSON, the time format, key ids, the public key file, the
per-class file name) and the checks a document passes before anyone trusts it. Does not own
making keys or signing (``manifest.signing``) nor what is inside ``signed`` (``manifest.build``).

Canonical JSON is ``json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False)`` in
UTF-8 of a document holding no float; times are ``YYYY-MM-DDTHH:MM:SSZ`` (UTC); a key id is the
hex sha256 of the raw Ed25519 key. A document is written as the canonical bytes of the whole
envelope, and that is the only layout a reader accepts: the signed bytes are then a verbatim
slice of the file, checked before anything in them is parsed.
"""

from __future__ import annotations

import binascii
import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from json.encoder import encode_basestring
from typing import Any, NamedTuple

from manifest._batch import paused_gc
from manifest.errors import (
    CanonicalError,
    ClassMismatchError,
    ExpiredError,
    KeyFileError,
    MalformedError,
    RollbackError,
    SignatureError,
    ValidityError,
)

__all__ = [
    "CLASS_TYPE",
    "CURRENT_POINTER",
    "FORMAT",
    "MANIFEST_TYPE",
    "MAX_BYTES",
    "MAX_MANIFEST_BYTES",
    "MAX_SIGNATURES",
    "MAX_VERSION",
    "POINTER_RE",
    "TIME_RE",
    "Encoded",
    "RawJSON",
    "Verified",
    "canonical_parts",
    "canonical_text",
    "check_envelope",
    "check_signed",
    "class_filename",
    "encode_canonical",
    "encode_envelope",
    "format_time",
    "is_hex",
    "is_pointer",
    "key_id",
    "loads_strict",
    "parse_public_pem",
    "parse_signed",
    "parse_signed_entry",
    "parse_time",
    "public_pem",
    "sha256_hex",
    "split_envelope",
    "verify_envelope",
    "verify_signature",
    "verify_signed_span",
]

FORMAT = "qualify-manifest/1"
"""Format version of the signed content, manifest and per-class document alike."""

MANIFEST_TYPE = "qualify-manifest"
"""``signed.type`` of a whole manifest."""

CLASS_TYPE = "qualify-class-manifest"
"""``signed.type`` of a per-class document: one class's entry, signed on its own."""

MAX_BYTES = 64 * 1024 * 1024
"""Largest document a host reads by default (``resolve-artifact --max-bytes``): a whole manifest
of about 37,000 classes at the ~1.8 KB an entry takes (10,000 classes: 17.7 MB). A larger fleet
serves its hosts per-class documents (``manifest generate --per-class``), each a few KB."""

MAX_MANIFEST_BYTES = 512 * 1024 * 1024
"""Largest manifest qualify itself publishes and reads back (the previous manifest a generation
reads from the matrix, a draft, ``manifest show|verify|diff``, the report, the telemetry check):
about 300,000 classes. Bounded like every input, but above `MAX_BYTES`, so that a fleet past what
hosts read whole can still generate release after release."""

TIME_RE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z")
"""The time format; use it with ``fullmatch``."""
POINTER_RE = re.compile(r"v[0-9]{1,19}\n?")
"""What the ``current`` pointer of a per-class directory holds; use it with ``fullmatch``."""

CURRENT_POINTER = "current"
"""The file of a per-class directory naming its published set, ``v<version>`` (see
``manifest.perclass.write_per_class``)."""

MAX_SIGNATURES = 16
"""Most signatures a document may carry: more are refused before any is checked."""
_MAX_SIGNATURES_BYTES = 16 * 1024
MAX_VERSION = 2**63 - 1
"""Largest ``version`` accepted (a 64-bit integer, as the matrix stores it)."""
_HEAD = b'{"signatures":'
_SIGNED = b',"signed":{'
_LOWER_HEX = "0123456789abcdef"

_SPKI_PREFIX = bytes.fromhex("302a300506032b6570032100")
_PEM_BEGIN = "-----BEGIN PUBLIC KEY-----"
_PEM_END = "-----END PUBLIC KEY-----"
_SAFE_NAME = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")


def is_hex(text: object, limit: int = 256) -> bool:
    """Whether ``text`` is 1 to ``limit`` lowercase hex digits (ASCII only)."""
    return isinstance(text, str) and 0 < len(text) <= limit and not text.strip(_LOWER_HEX)


def is_pointer(text: str) -> bool:
    """Whether ``text`` is what a per-class directory's ``current`` file holds: ``v<version>``,
    an optional final newline (`POINTER_RE`)."""
    return POINTER_RE.fullmatch(text) is not None


class Encoded:
    """A JSON value whose canonical bytes are made already: ``encode_canonical`` puts them where
    the value stands instead of encoding the value again. A manifest's entries are one
    (``manifest.encoded.EncodedEntries``): the builder writes each entry's canonical bytes once,
    straight from the policy's decisions, and signing, writing and splitting per class reuse
    them. The bytes must be the canonical JSON of one value, as ``encode_canonical`` makes it."""

    __slots__ = ()

    def canonical_parts(self) -> list[bytes]:
        """The value's canonical bytes, in pieces to be joined (a manifest's entries are as large
        as the manifest: joined once, with the rest of the document, not first on their own)."""
        raise NotImplementedError


class RawJSON(Encoded):
    """Canonical JSON bytes, held as they are (see `Encoded`)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def canonical_parts(self) -> list[bytes]:
        return [self.data]


def _unusual(value: Any) -> bool:
    """Whether a float, a non-string key or an `Encoded` value hides anywhere in ``value``
    (fast: no paths; `_collect` encodes such a value, or names the float)."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind in _PLAIN:
            continue
        if kind is dict or isinstance(item, dict):
            for key in item:
                if type(key) is not str:
                    return True
            stack.extend(item.values())
        elif kind is list or kind is tuple or isinstance(item, list | tuple):
            stack.extend(item)
        elif isinstance(item, float | Encoded):
            return True
    return False


_PLAIN = frozenset({str, int, bool, type(None)})


def canonical_parts(value: Any, path: str = "$") -> list[bytes]:
    """``encode_canonical(value)`` in pieces, member by member: `Encoded` values as their bytes,
    the rest as ``json.dumps`` writes it (the same sorted keys, separators and escapes). Slow for
    a large plain value: for those holding an `Encoded` one (a float is refused, by its path).

    Raises:
        CanonicalError: a float or a non-string key (the message gives its path).
    """
    parts: list[bytes] = []
    _collect(value, path, parts)
    return parts


def _collect(value: Any, path: str, parts: list[bytes]) -> None:
    if isinstance(value, Encoded):
        parts += value.canonical_parts()
    elif isinstance(value, float):
        raise CanonicalError(
            f"{path}: {value!r} is a float; canonical JSON here holds integers and strings only "
            "(render durations as integer microseconds, ratios as strings)"
        )
    elif isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise CanonicalError(f"{path}: key {key!r} is not a string")
        parts.append(b"{")
        for key in sorted(value):
            parts += (encode_basestring(key).encode("utf-8"), b":")
            _collect(value[key], f"{path}.{key}", parts)
            parts.append(b",")
        parts[-1] = b"}" if parts[-1] == b"," else b"{}"
    elif isinstance(value, list | tuple):
        parts.append(b"[")
        for i, item in enumerate(value):
            _collect(item, f"{path}[{i}]", parts)
            parts.append(b",")
        parts[-1] = b"]" if parts[-1] == b"," else b"[]"
    else:
        try:
            parts.append(json.dumps(value, ensure_ascii=False).encode("utf-8"))
        except (TypeError, ValueError) as exc:
            raise CanonicalError(f"{path}: not a JSON value: {exc}") from exc


def encode_canonical(value: Any) -> bytes:
    """The canonical bytes of a JSON value.

    Args:
        value: dicts with string keys, lists, strings, integers, booleans and ``None``; and
            `Encoded` values, whose bytes are used as they are.

    Returns:
        UTF-8 bytes: sorted keys, ``,``/``:`` separators, no whitespace, non-ASCII kept as is.

    Raises:
        CanonicalError: the value holds a float or a non-string key (the message gives its path).
    """
    with _batch():
        if _unusual(value):
            return b"".join(canonical_parts(value))
        return _dumps(value, "$").encode("utf-8")


def canonical_text(value: Any, path: str = "$") -> str:
    """`encode_canonical` as text (for a text to splice into a larger one); ``path`` names
    ``value`` in messages."""
    with _batch():
        if _unusual(value):
            return b"".join(canonical_parts(value, path)).decode("utf-8")
        return _dumps(value, path)


def _dumps(value: Any, path: str) -> str:
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise CanonicalError(f"{path}: not a JSON value: {exc}") from exc


def _batch() -> Any:
    """``paused_gc()``, unless a batch paused the collector already: encoding makes no cycles,
    and a collection mid-way would walk every live object of the caller."""
    import gc
    from contextlib import nullcontext

    return paused_gc() if gc.isenabled() else nullcontext()


def encode_envelope(signatures: list[dict[str, str]], signed_bytes: bytes) -> bytes:
    """The canonical bytes of ``{"signed": ..., "signatures": ...}`` from already-encoded content.

    Equal to ``encode_canonical({"signed": signed, "signatures": signatures})`` when
    ``signed_bytes == encode_canonical(signed)`` (the keys sort as "signatures", "signed"), so a
    signer that has just encoded ``signed`` to sign it does not encode it a second time to
    write it (for a large fleet, a second pass over megabytes). It is the layout
    `split_envelope` reads back.

    Args:
        signatures: ``[{"keyid": ..., "sig": ...}]`` (may be empty for an unsigned document).
        signed_bytes: ``encode_canonical(signed)``; must be a JSON object.

    Raises:
        CanonicalError: ``signed_bytes`` is not an encoded object.
    """
    if not (signed_bytes.startswith(b"{") and signed_bytes.endswith(b"}")):
        raise CanonicalError("$.signed: expected the canonical bytes of a JSON object")
    return b"".join(
        (b'{"signatures":', encode_canonical(signatures), b',"signed":', signed_bytes, b"}")
    )


def format_time(moment: datetime) -> str:
    """Render an aware datetime as ``YYYY-MM-DDTHH:MM:SSZ`` (UTC, microseconds dropped).

    Raises:
        ValueError: ``moment`` is naive (no time zone): a naive time is ambiguous.
    """
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"{moment!r} has no time zone; pass an aware datetime (UTC)")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> datetime:
    """Parse a time written by ``format_time``.

    Raises:
        ValueError: ``text`` is not ``YYYY-MM-DDTHH:MM:SSZ``.
    """
    if not isinstance(text, str) or TIME_RE.fullmatch(text) is None:
        raise ValueError(f"{text[:40]!r} is not a time of the form YYYY-MM-DDTHH:MM:SSZ")
    try:  # fromisoformat reads the Z as UTC (and needs no _strptime, as strptime does)
        return datetime.fromisoformat(text)
    except ValueError as exc:  # 2026-13-45T99:00:00Z has the form but is no time
        raise ValueError(f"{text!r} is not a valid time ({exc})") from exc


def key_id(public_raw: bytes) -> str:
    """The key id of an Ed25519 public key: hex sha256 of its 32 raw bytes."""
    return sha256_hex(public_raw)


def public_pem(public_raw: bytes) -> str:
    """The PEM ``SubjectPublicKeyInfo`` text of a raw 32-byte Ed25519 public key."""
    body = binascii.b2a_base64(_SPKI_PREFIX + public_raw, newline=False).decode("ascii")
    return f"{_PEM_BEGIN}\n{body}\n{_PEM_END}\n"


def parse_public_pem(text: str, source: str = "public key") -> bytes:
    """The raw 32 bytes of an Ed25519 public key in PEM ``SubjectPublicKeyInfo`` form.

    Args:
        text: the file's text.
        source: where it came from, for the message (a path).

    Raises:
        KeyFileError: not a PEM public key, or not an Ed25519 one.
    """
    begin, end = text.find(_PEM_BEGIN), text.find(_PEM_END)
    if begin < 0 or end < begin:
        raise KeyFileError(
            f"{source}: not a PEM public key (no '{_PEM_BEGIN}' block); pass the .pub file "
            "'qualify keygen' wrote"
        )
    body = "".join(text[begin + len(_PEM_BEGIN) : end].split())
    try:
        der = binascii.a2b_base64(body.encode("ascii", "replace"), strict_mode=True)
    except ValueError as exc:
        raise KeyFileError(f"{source}: the PEM body is not base64: {exc}") from exc
    if len(der) != len(_SPKI_PREFIX) + 32 or not der.startswith(_SPKI_PREFIX):
        raise KeyFileError(
            f"{source}: not an Ed25519 public key; manifests are signed with Ed25519"
        )
    return der[len(_SPKI_PREFIX) :]


def verify_signature(public_raw: bytes, signature: bytes, data: bytes | memoryview) -> bool:
    """Whether ``signature`` is a valid Ed25519 signature of ``data`` by ``public_raw``
    (cryptography is imported here: reading a document for display needs none of it)."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        Ed25519PublicKey.from_public_bytes(public_raw).verify(signature, bytes(data))
    except (ValueError, InvalidSignature):  # ValueError: a key that is not 32 bytes
        return False
    return True


def class_filename(name: str) -> str:
    """The file name of a class's per-class document: the name, %-escaped, plus ``.json``.

    Letters, digits, ``.``, ``_`` and ``-`` stay; every other UTF-8 byte becomes ``%XX``. So every
    class name maps to one safe name and back, and no name can climb out of the directory.

    Raises:
        ValueError: the name is empty or its file name would exceed 255 bytes.
    """
    if not name:
        raise ValueError("a host class name must not be empty")
    out = "".join(
        ch if ch in _SAFE_NAME else "".join(f"%{b:02X}" for b in ch.encode("utf-8")) for ch in name
    )
    if out in (".", ".."):
        out = out.replace(".", "%2E")
    filename = out + ".json"
    if len(filename.encode("ascii")) > 255:
        raise ValueError(f"host class name {name[:40]!r}... is too long for a file name")
    return filename


def _bad_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def loads_strict(data: bytes) -> Any:
    """``json.loads`` that refuses NaN/Infinity and turns a nesting too deep for the parser
    (RecursionError) into ValueError: what a reader must do with bytes it has not chosen.

    """
    try:
        return json.loads(data, parse_constant=_bad_constant)
    except RecursionError as exc:
        raise ValueError("nested too deeply") from exc


def _canonical_signatures(signatures: list[dict[str, str]]) -> bytes:
    return encode_canonical(signatures)


def split_envelope(raw: bytes, source: str = "manifest") -> tuple[list[dict[str, str]], bytes]:
    """The signatures and the signed bytes of a document in the canonical layout.

    The only layout accepted is the one ``qualify manifest generate`` writes, the canonical bytes
    of the whole envelope (``{"signatures":[...],"signed":{...}}``, an optional final newline).
    Before the signature is checked, nothing but the signatures list is parsed, and that list is
    bounded (`MAX_SIGNATURES`, hex key ids and signatures only), so no size, nesting or count
    of hostile bytes costs more than reading them; the signed part is parsed only once verified.

    Raises:
        MalformedError: any other layout (re-indented, reordered, edited), or signatures that
            are not a short list of ``{"keyid": hex, "sig": hex}``.
    """
    signatures, start, end = _split_span(raw, source)
    return signatures, raw[start:end]


def _split_span(raw: bytes, source: str) -> tuple[list[dict[str, str]], int, int]:
    """`split_envelope`, with the signed bytes given as where they are: ``raw[start:end]``
    (a 1.7 MB copy is a millisecond of page faults in a process that has just started)."""
    stop = len(raw) - 1 if raw.endswith(b"\n") else len(raw)  # the document without it
    if not (raw.startswith(_HEAD, 0, stop) and raw.endswith(b"}", 0, stop)):
        if raw.startswith(_HEAD) and not raw.rstrip().endswith(b"}"):
            raise MalformedError(
                f"{source}: truncated: its {len(raw):,} bytes end before the document's closing "
                "brace (an interrupted download or copy); fetch the whole file again"
            )
        what = "empty" if not raw.strip() else "not in the canonical layout"
        raise MalformedError(
            f'{source}: {what}: a signed document starts with {{"signatures": and is '
            "distributed byte for byte as 'qualify manifest generate' wrote it (a re-indented "
            "or edited copy is refused; publish the generated file itself)"
        )
    end = raw.find(_SIGNED, len(_HEAD), min(stop, len(_HEAD) + _MAX_SIGNATURES_BYTES))
    if end < 0:
        raise MalformedError(
            f"{source}: no 'signed' object after a signatures list of at most "
            f"{_MAX_SIGNATURES_BYTES} bytes ({MAX_SIGNATURES} signatures); not a manifest "
            "written by 'qualify manifest generate'"
        )
    segment = raw[len(_HEAD) : end]
    try:
        signatures = loads_strict(segment)
    except ValueError as exc:
        raise MalformedError(f"{source}: the signatures list is not JSON ({exc})") from exc
    if (
        not isinstance(signatures, list)
        or len(signatures) > MAX_SIGNATURES
        or not all(
            isinstance(s, dict)
            and set(s) == {"keyid", "sig"}
            and isinstance(s["keyid"], str)
            and isinstance(s["sig"], str)
            and is_hex(s["keyid"])
            and is_hex(s["sig"])
            for s in signatures
        )
        or _canonical_signatures(signatures) != segment
    ):
        raise MalformedError(
            f"{source}: 'signatures' must be a canonical list of at most {MAX_SIGNATURES} "
            "{keyid, sig} objects in lowercase hex"
        )
    return signatures, end + len(_SIGNED) - 1, stop - 1


def parse_signed(signed_bytes: bytes, source: str = "manifest") -> dict[str, Any]:
    """Parse the ``signed`` part (after its signature was checked, or for display).

    Raises:
        MalformedError: not a JSON object (invalid UTF-8, NaN, nesting too deep included).
    """
    try:
        signed = loads_strict(signed_bytes)
    except ValueError as exc:
        raise MalformedError(f"{source}: the signed part is not JSON ({exc})") from exc
    if not isinstance(signed, dict):
        raise MalformedError(f"{source}: 'signed' is not an object")
    return signed


def parse_signed_entry(
    data: bytes,
    host_class: str,
    source: str = "manifest",
    *,
    start: int = 0,
    end: int | None = None,
) -> dict[str, Any]:
    """`parse_signed` of ``data[start:end]`` for a reader that needs one class: a manifest's
    ``entries`` then holds only ``host_class``'s entry (all of them when it has none, so that
    the caller answers as it would for the whole document).

    Raises:
        MalformedError: as `parse_signed`.
    """
    stop = len(data) if end is None else end
    signed = parse_signed(data if (start, stop) == (0, len(data)) else data[start:stop], source)
    entries = signed.get("entries")
    if isinstance(entries, dict) and host_class in entries:
        signed["entries"] = {host_class: entries[host_class]}
    return signed


class Verified(NamedTuple):
    """A document whose signature by the trusted key was checked."""

    signed: dict[str, Any]
    """The ``signed`` object, parsed from the verified bytes."""
    digest: str
    """Hex sha256 of the signed bytes: two documents with it equal say the same thing."""


def verify_envelope(
    raw: bytes, public_raw: bytes, *, source: str = "manifest", max_bytes: int = MAX_BYTES
) -> Verified:
    """Check a document's size, layout and signature; parse its ``signed`` part.

    Args:
        raw: the file's bytes (read at most ``max_bytes + 1`` of them).
        public_raw: the trusted Ed25519 public key, 32 raw bytes.
        source: where the bytes came from, for messages (a path).
        max_bytes: the largest document accepted.

    Raises:
        MalformedError: too large, not the canonical layout, or the signed part not an object.
        SignatureError: no signature by the trusted key id, or it does not verify.
    """
    start, end, _ = verify_signed_span(raw, public_raw, source=source, max_bytes=max_bytes)
    signed_bytes = raw[start:end]
    return Verified(parse_signed(signed_bytes, source), sha256_hex(signed_bytes))


def verify_signed_span(
    raw: bytes, public_raw: bytes, *, source: str = "manifest", max_bytes: int = MAX_BYTES
) -> tuple[int, int, str]:
    """`verify_envelope`'s checks (size, layout, a signature by the trusted key), without
    parsing or copying the signed part: for a reader that keeps only one class of it
    (`parse_signed_entry`).

    Returns:
        ``(start, end, sig)``: the signed bytes are ``raw[start:end]``; ``sig`` is the hex
        signature by the trusted key that verified them (Ed25519 is deterministic: under one
        key, an equal signature means equal signed bytes).

    Raises:
        MalformedError: too large, or not the canonical layout.
        SignatureError: no signature by the trusted key id, or it does not verify.
    """
    if len(raw) > max_bytes:
        raise MalformedError(
            f"{source}: larger than the {max_bytes}-byte limit; refusing to parse it "
            "(raise --max-bytes if the fleet really is that large, or use per-class documents)"
        )
    signatures, start, end = _split_span(raw, source)
    trusted = key_id(public_raw)
    mine = [s for s in signatures if s["keyid"] == trusted]
    if not mine:
        found = ", ".join(s["keyid"][:16] for s in signatures) or "none"
        raise SignatureError(
            f"{source}: no signature by the trusted key {trusted[:16]} (signed by: {found}); "
            "check --pubkey is the key the manifest was signed with"
        )
    signed = memoryview(raw)[start:end]
    good = next((s["sig"] for s in mine if _hex_verifies(public_raw, s["sig"], signed)), None)
    if good is None:
        raise SignatureError(
            f"{source}: the signature by key {trusted[:16]} does not match the signed content "
            "(the file was changed after signing)"
        )
    return start, end, good


def check_envelope(
    raw: bytes, public_raw: bytes, *, source: str = "manifest", max_bytes: int = MAX_BYTES
) -> dict[str, Any]:
    """`verify_envelope`'s ``signed`` object alone."""
    return verify_envelope(raw, public_raw, source=source, max_bytes=max_bytes).signed


def sha256_hex(data: bytes | memoryview) -> str:
    """Hex sha256 of ``data``, through cryptography, which verifying loads anyway (``hashlib``
    would cost every host start a second OpenSSL load: bench/resolve.py)."""
    from cryptography.hazmat.primitives.hashes import SHA256, Hash

    h = Hash(SHA256())
    h.update(data)
    return h.finalize().hex()


def _hex_verifies(public_raw: bytes, sig_hex: str, data: bytes | memoryview) -> bool:
    try:
        sig = bytes.fromhex(sig_hex)
    except ValueError:
        return False
    return verify_signature(public_raw, sig, data)


def _version(signed: Mapping[str, Any], source: str) -> int:
    version = signed.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= MAX_VERSION:
        shown = repr(version) if not isinstance(version, int) else f"{version:.3e}"
        raise MalformedError(
            f"{source}: signed.version must be an integer from 1 to 2**63-1, found {shown[:40]}"
        )
    return version


def _expires(signed: Mapping[str, Any], source: str) -> tuple[str, int]:
    expires = signed.get("expires")
    try:
        if not isinstance(expires, str):
            raise ValueError(f"{expires!r:.40} is not a string")
        return expires, int(parse_time(expires).timestamp())
    except ValueError as exc:
        raise MalformedError(f"{source}: signed.expires: {exc}") from exc


def _check_class_document(
    signed: Mapping[str, Any], expected_class: str | None, source: str
) -> None:
    if not isinstance(signed.get("host_class"), str) or not isinstance(signed.get("entry"), dict):
        raise MalformedError(f"{source}: a per-class document needs host_class and entry")
    if expected_class is not None and signed["host_class"] != expected_class:
        raise ClassMismatchError(
            f"{source}: this document is for class {signed['host_class']!r}, not "
            f"{expected_class!r}; it was moved or copied under another class's name"
        )


def check_signed(
    signed: Mapping[str, Any],
    *,
    now: str | None,
    min_version: int = 0,
    expected_class: str | None = None,
    source: str = "manifest",
    max_validity_s: float | None = None,
) -> None:
    """Check a verified ``signed`` part: type, format, expiry, version and class name.

    A pure check, as python-tuf's: the reference time and the last accepted version are
    arguments, not read here.

    Args:
        signed: the ``signed`` object (its signature already checked).
        now: the reference time, ``YYYY-MM-DDTHH:MM:SSZ`` (see ``format_time``); None checks
            everything but expiry and validity (a last-known-good, whatever its age).
        min_version: the last version this host accepted; a lower one is refused.
        expected_class: for a per-class document, the class it was read for.
        source: where it came from, for messages.
        max_validity_s: refuse a document that expires further than this after ``now`` (a
            signer's clock or key gone wrong would otherwise pin hosts for years).

    Raises:
        MalformedError: unknown type or format, a field of the wrong type, a version above
            `MAX_VERSION`, or an ``expires`` that is not a real time.
        ExpiredError: ``expires`` is not after ``now``.
        ValidityError: ``expires`` is more than ``max_validity_s`` after ``now``.
        RollbackError: ``version`` is lower than ``min_version``.
        ClassMismatchError: a per-class document of another class.
    """
    kind = signed.get("type")
    if kind not in (MANIFEST_TYPE, CLASS_TYPE):
        raise MalformedError(
            f"{source}: signed.type is {kind!r}, expected {MANIFEST_TYPE!r} or {CLASS_TYPE!r}"
        )
    if signed.get("format") != FORMAT:
        raise MalformedError(
            f"{source}: signed.format is {signed.get('format')!r}; this resolve-artifact reads "
            f"{FORMAT!r} (upgrade it)"
        )
    version = _version(signed, source)
    expires, until = _expires(signed, source)
    if kind == MANIFEST_TYPE:
        if not isinstance(signed.get("entries"), dict):
            raise MalformedError(f"{source}: signed.entries is not an object")
    else:
        _check_class_document(signed, expected_class, source)
    if version < min_version:
        raise RollbackError(
            f"{source}: version {version} is lower than version {min_version} this host already "
            f"accepted; new version must be >= {min_version} (a replayed older manifest?)"
        )
    if now is not None:
        _check_time(expires, until, now, source, max_validity_s)


def _check_time(
    expires: str, until: int, now: str, source: str, max_validity_s: float | None
) -> None:
    """`check_signed`'s expiry (``expires``, ``until`` its POSIX seconds) and validity."""
    if expires <= now:
        raise ExpiredError(
            f"{source}: expired at {expires} (now {now}); generate and sign a fresh manifest"
        )
    if max_validity_s is not None:
        ahead = until - int(parse_time(now).timestamp())
        if ahead > max_validity_s:
            raise ValidityError(
                f"{source}: expires at {expires}, {ahead / 86400:.0f} days from now, more than "
                f"the {max_validity_s / 86400:g} days this host accepts (a signer clock or key "
                "gone wrong?); generate it with a shorter --expires"
            )
