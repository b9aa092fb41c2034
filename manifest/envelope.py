"""The signed envelope ``{"signed": {...}, "signatures": [...]}``, on the standard library.

Owns what both sides of a manifest must agree on byte for byte: canonical JSON, the time format,
key ids, the Ed25519 public key file format, the file name of a per-class document, and the
checks a document must pass before anyone trusts it (size, shape, signature, type, expiry,
version, class name). ``cryptography`` is imported lazily, only to check a signature. Does not
own making keys or signing (``manifest.signing``), nor what is inside ``signed``
(``schemas.manifest`` describes it, ``manifest.build`` fills it).

Choices, fixed here for both sides:

* **Canonical JSON** is ``json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False)``
  encoded as UTF-8, of a document that holds no float: ``encode_canonical`` refuses one.
  Durations are integer microseconds (``p99_us``); measured ratios are strings rendered with
  ``format(x, ".6e")``. So the bytes never depend on how a language prints a float.
* **Times** are UTC, second precision, ``YYYY-MM-DDTHH:MM:SSZ``. Fixed width, so comparing two of
  them as strings compares the instants.
* **Key id** is the hex sha256 of the 32 raw Ed25519 public key bytes.
* **Public key files** are PEM ``SubjectPublicKeyInfo`` (what ``openssl pkey -pubout`` writes);
  the 44-byte DER of an Ed25519 key has a fixed 12-byte prefix, so it is read without ASN.1.
* **Signatures** are hex of the 64-byte Ed25519 signature over the canonical bytes of ``signed``.
* A document is **written** as the canonical bytes of the whole envelope. Then the signed bytes
  are a verbatim slice of the file (``"signatures"`` sorts before ``"signed"``), and a reader
  checks the signature on that slice and parses once. A file laid out otherwise (re-indented by
  hand) still verifies, by re-encoding ``signed``: the slower path of python-tuf.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from manifest._batch import paused_gc
from manifest.errors import (
    CanonicalError,
    ClassMismatchError,
    ExpiredError,
    KeyFileError,
    MalformedError,
    RollbackError,
    SignatureError,
)

if TYPE_CHECKING:
    from datetime import datetime

__all__ = [
    "CLASS_TYPE",
    "FORMAT",
    "MANIFEST_TYPE",
    "MAX_BYTES",
    "TIME_RE",
    "check_envelope",
    "check_signed",
    "class_filename",
    "encode_canonical",
    "encode_envelope",
    "format_time",
    "key_id",
    "parse_public_pem",
    "parse_time",
    "public_pem",
    "verify_signature",
]

FORMAT = "qualify-manifest/1"
"""Format version of the signed content, manifest and per-class document alike."""

MANIFEST_TYPE = "qualify-manifest"
"""``signed.type`` of a whole manifest."""

CLASS_TYPE = "qualify-class-manifest"
"""``signed.type`` of a per-class document: one class's entry, signed on its own."""

MAX_BYTES = 64 * 1024 * 1024
"""Largest document a reader accepts by default (a 100,000-class manifest is ~40 MB)."""

TIME_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")

_SPKI_PREFIX = bytes.fromhex("302a300506032b6570032100")
_PEM_BEGIN = "-----BEGIN PUBLIC KEY-----"
_PEM_END = "-----END PUBLIC KEY-----"
_SAFE_NAME = re.compile(r"[A-Za-z0-9._-]")


def _has_float(value: Any) -> bool:
    """Whether a float or a non-string key hides anywhere in ``value`` (fast: no paths)."""
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
        elif isinstance(item, float):
            return True
    return False


_PLAIN = frozenset({str, int, bool, type(None)})


def _float_path(value: Any, path: str) -> CanonicalError | None:
    """The error naming the first float or non-string key (slow: only after _has_float)."""
    if isinstance(value, float):
        return CanonicalError(
            f"{path}: {value!r} is a float; canonical JSON here holds integers and strings only "
            "(render durations as integer microseconds, ratios as strings)"
        )
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return CanonicalError(f"{path}: key {key!r} is not a string")
            found = _float_path(item, f"{path}.{key}")
            if found is not None:
                return found
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            found = _float_path(item, f"{path}[{i}]")
            if found is not None:
                return found
    return None


def encode_canonical(value: Any) -> bytes:
    """The canonical bytes of a JSON value.

    Args:
        value: dicts with string keys, lists, strings, integers, booleans and ``None``.

    Returns:
        UTF-8 bytes: sorted keys, ``,``/``:`` separators, no whitespace, non-ASCII kept as is.

    Raises:
        CanonicalError: the value holds a float or a non-string key (the message gives its path).
    """
    # Encoding makes no cycles; a collection triggered mid-way would walk every live object of
    # the caller (the whole matrix when generating a manifest): up to 0.5 s for 10,000 classes.
    with paused_gc():
        if _has_float(value):
            raise _float_path(value, "$") or CanonicalError("$: holds a float or a non-string key")
        try:
            text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            raise CanonicalError(f"$: not a JSON value: {exc}") from exc
        return text.encode("utf-8")


def encode_envelope(signatures: list[dict[str, str]], signed_bytes: bytes) -> bytes:
    """The canonical bytes of ``{"signed": ..., "signatures": ...}`` from already-encoded content.

    Equal to ``encode_canonical({"signed": signed, "signatures": signatures})`` when
    ``signed_bytes == encode_canonical(signed)`` (the keys sort as "signatures", "signed"), so a
    signer that has just encoded ``signed`` to sign it does not encode it a second time to
    write it: for a 10,000-class manifest that second pass was ~0.5 s of ``json.dumps``. It is
    the layout ``_fast_split`` reads back.

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
    from datetime import UTC

    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"{moment!r} has no time zone; pass an aware datetime (UTC)")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> datetime:
    """Parse a time written by ``format_time``.

    Raises:
        ValueError: ``text`` is not ``YYYY-MM-DDTHH:MM:SSZ``.
    """
    from datetime import UTC, datetime

    if not TIME_RE.match(text):
        raise ValueError(f"{text!r} is not a time of the form YYYY-MM-DDTHH:MM:SSZ")
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def key_id(public_raw: bytes) -> str:
    """The key id of an Ed25519 public key: hex sha256 of its 32 raw bytes."""
    # cryptography's SHA-256, not hashlib: resolve-artifact loads cryptography anyway, and
    # hashlib's OpenSSL would cost a second library load at every service start.
    from cryptography.hazmat.primitives import hashes

    digest = hashes.Hash(hashes.SHA256())
    digest.update(public_raw)
    return digest.finalize().hex()


def public_pem(public_raw: bytes) -> str:
    """The PEM ``SubjectPublicKeyInfo`` text of a raw 32-byte Ed25519 public key."""
    body = base64.b64encode(_SPKI_PREFIX + public_raw).decode("ascii")
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
        der = base64.b64decode(body, validate=True)
    except ValueError as exc:
        raise KeyFileError(f"{source}: the PEM body is not base64: {exc}") from exc
    if len(der) != len(_SPKI_PREFIX) + 32 or not der.startswith(_SPKI_PREFIX):
        raise KeyFileError(
            f"{source}: not an Ed25519 public key; manifests are signed with Ed25519"
        )
    return der[len(_SPKI_PREFIX) :]


def verify_signature(public_raw: bytes, signature: bytes, data: bytes) -> bool:
    """Whether ``signature`` is a valid Ed25519 signature of ``data`` by ``public_raw``."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        Ed25519PublicKey.from_public_bytes(public_raw).verify(signature, data)
    except (InvalidSignature, ValueError):
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
        ch if _SAFE_NAME.match(ch) else "".join(f"%{b:02X}" for b in ch.encode("utf-8"))
        for ch in name
    )
    if out in (".", ".."):
        out = out.replace(".", "%2E")
    filename = out + ".json"
    if len(filename.encode("ascii")) > 255:
        raise ValueError(f"host class name {name[:40]!r}... is too long for a file name")
    return filename


def _fast_split(raw: bytes) -> tuple[Any, bytes] | None:
    """(signatures, signed bytes) of a file laid out canonically, else None."""
    head = b'{"signatures":'
    if not raw.startswith(head):
        return None
    text_end = raw.find(b',"signed":{', len(head))
    if text_end < 0:
        return None
    try:
        signatures = json.loads(raw[len(head) : text_end])
    except ValueError:
        return None
    body = raw[:-1] if raw.endswith(b"\n") else raw
    if not body.endswith(b"}"):
        return None
    return signatures, body[text_end + len(b',"signed":') : -1]


def _peek(signed_bytes: bytes, name: str) -> dict[str, Any] | None:
    """A manifest's signed part with only ``name``'s entry parsed, or None to parse it all.

    Works on verified canonical bytes, whose layout is known: top-level keys sorted, so
    ``"created"`` comes before ``"entries"`` and every other top-level key after it, and each
    entry is an object whose first key is ``"artifact"``. Anything unexpected returns None and
    the caller parses the whole document, so this is only ever a shortcut, never a different
    answer: the entry found must also name itself ``name``.
    """
    start = signed_bytes.find(b',"entries":{')
    tail = signed_bytes.rfind(b'},"expires":"')
    if start < 0 or tail < start:
        return None
    key = json.dumps(name, ensure_ascii=False).encode("utf-8")
    pos = signed_bytes.find(key + b':{"artifact":', start, tail)
    if pos < 0 or signed_bytes[pos - 1 : pos] not in (b"{", b","):
        return None
    try:
        head = json.loads(signed_bytes[:start] + b"}")
        rest = json.loads(b"{" + signed_bytes[tail + 2 :])
        text = signed_bytes[pos + len(key) + 1 : tail + 1].decode("utf-8")
        entry, _ = json.JSONDecoder().raw_decode(text)
    except ValueError:
        return None
    if not (isinstance(head, dict) and isinstance(rest, dict) and isinstance(entry, dict)):
        return None
    if entry.get("host_class") != name:
        return None
    return {**head, **rest, "entries": {name: entry}}


def check_envelope(
    raw: bytes,
    public_raw: bytes,
    *,
    source: str = "manifest",
    max_bytes: int = MAX_BYTES,
    only_class: str | None = None,
) -> dict[str, Any]:
    """Check a document's size, shape and signature; return its ``signed`` part.

    Args:
        raw: the file's bytes (read at most ``max_bytes + 1`` of them).
        public_raw: the trusted Ed25519 public key, 32 raw bytes.
        source: where the bytes came from, for messages (a path).
        max_bytes: the largest document accepted.
        only_class: for a whole manifest laid out canonically, parse only this class's entry
            (the signature still covers every byte); ``entries`` then holds that entry alone,
            or every entry when the shortcut does not apply.

    Returns:
        The ``signed`` object, parsed.

    Raises:
        MalformedError: too large, not JSON, or not ``{"signed": {...}, "signatures": [...]}``.
        SignatureError: no signature by the trusted key id, or it does not verify.
    """
    if len(raw) > max_bytes:
        raise MalformedError(
            f"{source}: larger than the {max_bytes}-byte limit; refusing to parse it "
            "(raise --max-bytes if the fleet really is that large, or use per-class documents)"
        )
    signed: Any = None
    split = _fast_split(raw)
    if split is not None:
        signatures, signed_bytes = split
    else:
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise MalformedError(f"{source}: not JSON ({exc})") from exc
        if not isinstance(doc, dict) or set(doc) != {"signed", "signatures"}:
            raise MalformedError(
                f"{source}: expected an object with exactly 'signed' and 'signatures'"
            )
        signed, signatures = doc["signed"], doc["signatures"]
        if not isinstance(signed, dict):
            raise MalformedError(f"{source}: 'signed' is not an object")
        try:
            signed_bytes = encode_canonical(signed)
        except CanonicalError as exc:
            raise MalformedError(f"{source}: {exc}") from exc
    if not isinstance(signatures, list) or not all(
        isinstance(s, dict) and isinstance(s.get("keyid"), str) and isinstance(s.get("sig"), str)
        for s in signatures
    ):
        raise MalformedError(f"{source}: 'signatures' is not a list of {{keyid, sig}} objects")
    trusted = key_id(public_raw)
    mine = [s for s in signatures if s["keyid"] == trusted]
    if not mine:
        found = ", ".join(s["keyid"][:16] for s in signatures) or "none"
        raise SignatureError(
            f"{source}: no signature by the trusted key {trusted[:16]} (signed by: {found}); "
            "check --pubkey is the key the manifest was signed with"
        )
    if not any(_hex_verifies(public_raw, sig["sig"], signed_bytes) for sig in mine):
        raise SignatureError(
            f"{source}: the signature by key {trusted[:16]} does not match the signed content "
            "(the file was changed after signing)"
        )
    if signed is None and only_class is not None:
        signed = _peek(signed_bytes, only_class)
    if signed is None:
        try:
            signed = json.loads(signed_bytes)
        except ValueError as exc:
            raise MalformedError(f"{source}: the signed part is not JSON ({exc})") from exc
    if not isinstance(signed, dict):
        raise MalformedError(f"{source}: 'signed' is not an object")
    return signed


def _hex_verifies(public_raw: bytes, sig_hex: str, data: bytes) -> bool:
    try:
        sig = bytes.fromhex(sig_hex)
    except ValueError:
        return False
    return verify_signature(public_raw, sig, data)


def check_signed(
    signed: Mapping[str, Any],
    *,
    now: str,
    min_version: int = 0,
    expected_class: str | None = None,
    source: str = "manifest",
) -> None:
    """Check a verified ``signed`` part: type, format, expiry, version and class name.

    A pure check, as python-tuf's: the reference time and the last accepted version are
    arguments, not read here.

    Args:
        signed: the ``signed`` object (its signature already checked).
        now: the reference time, ``YYYY-MM-DDTHH:MM:SSZ`` (see ``format_time``).
        min_version: the last version this host accepted; a lower one is refused.
        expected_class: for a per-class document, the class it was read for.
        source: where it came from, for messages.

    Raises:
        MalformedError: unknown type or format, or a field of the wrong type.
        ExpiredError: ``expires`` is not after ``now``.
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
    version = signed.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise MalformedError(f"{source}: signed.version must be an integer >= 1, found {version!r}")
    expires = signed.get("expires")
    if not isinstance(expires, str) or not TIME_RE.match(expires):
        raise MalformedError(f"{source}: signed.expires {expires!r} is not YYYY-MM-DDTHH:MM:SSZ")
    if kind == MANIFEST_TYPE:
        if not isinstance(signed.get("entries"), dict):
            raise MalformedError(f"{source}: signed.entries is not an object")
    else:
        if not isinstance(signed.get("host_class"), str) or not isinstance(
            signed.get("entry"), dict
        ):
            raise MalformedError(f"{source}: a per-class document needs host_class and entry")
        if expected_class is not None and signed["host_class"] != expected_class:
            raise ClassMismatchError(
                f"{source}: this document is for class {signed['host_class']!r}, not "
                f"{expected_class!r}; it was moved or copied under another class's name"
            )
    if version < min_version:
        raise RollbackError(
            f"{source}: version {version} is lower than version {min_version} this host already "
            f"accepted; new version must be >= {min_version} (a replayed older manifest?)"
        )
    if expires <= now:
        raise ExpiredError(
            f"{source}: expired at {expires} (now {now}); generate and sign a fresh manifest"
        )
