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
* A document is **written** as the canonical bytes of the whole envelope, and that is the only
  layout a reader accepts (`split_envelope`). The signed bytes are then a verbatim slice of the
  file (``"signatures"`` sorts before ``"signed"``): a reader checks the signature on that slice
  and parses it once, after the check. Nothing else is parsed before it, and every reader
  (``resolve-artifact``, ``manifest verify``/``show``, the report) parses the same verified
  bytes with the same parser, so no two can read one file differently. (A host reading one
  class, `parse_signed_entry`, skips the other entries but answers exactly as that parser does,
  and leaves every case it cannot tell to it.) A re-indented copy is
  refused, not re-encoded: re-encoding hostile bytes before the signature check was 12 s and
  half a gigabyte for a 62 MB file, and a second parser is a second answer.
"""

from __future__ import annotations

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

# ``resolve-artifact`` imports this module at every service start, so its import costs only what
# a host must pay: no typing, re, json, base64, datetime or collections (each pulls in more, and
# together they were most of the start-up). Type-only names come from this flag, which mypy
# treats as ``typing.TYPE_CHECKING``; the regular expressions, ``json`` and ``datetime`` load
# where they are needed, off the host path.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import re
    from collections.abc import Mapping
    from datetime import datetime
    from typing import Any, ClassVar
    from typing import NamedTuple as _NamedTuple
else:

    def __getattr__(name: str) -> Any:  # PEP 562: TIME_RE and POINTER_RE, compiled on first use
        if name in _PATTERNS:
            import re

            globals()[name] = compiled = re.compile(_PATTERNS[name])
            return compiled
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    "LightNamedTuple",
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
    "seconds_of",
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

_PATTERNS = {
    "TIME_RE": r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z",
    "POINTER_RE": r"v[0-9]{1,19}\n?",
}
if TYPE_CHECKING:
    TIME_RE: re.Pattern[str]
    POINTER_RE: re.Pattern[str]
# TIME_RE: the time format; use it with ``fullmatch`` (ASCII digits only, no trailing newline).
# POINTER_RE: what the ``current`` pointer of a per-class directory holds. Both are compiled on
# first use (``__getattr__`` above); the host path checks with `is_time` and `is_pointer`.

CURRENT_POINTER = "current"
"""The file of a per-class directory naming its published set, ``v<version>`` (see
``manifest.build.write_per_class``)."""

MAX_SIGNATURES = 16
"""Most signatures a document may carry: more are refused before any is checked."""
_MAX_SIGNATURES_BYTES = 16 * 1024
MAX_VERSION = 2**63 - 1
"""Largest ``version`` accepted (a 64-bit integer, as the matrix stores it)."""
_HEAD = b'{"signatures":'
_SIGNED = b',"signed":{'
_LOWER_HEX = "0123456789abcdef"
_DIGITS = "0123456789"

_SPKI_PREFIX = bytes.fromhex("302a300506032b6570032100")
_PEM_BEGIN = "-----BEGIN PUBLIC KEY-----"
_PEM_END = "-----END PUBLIC KEY-----"
_SAFE_NAME = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")


def _field(index: int) -> property:
    def get(self: tuple[object, ...]) -> object:
        return self[index]

    return property(get)


class LightNamedTuple(tuple):  # type: ignore[type-arg]
    """At run time, the base of this package's ``NamedTuple`` records; mypy sees
    ``typing.NamedTuple`` in its place (``if TYPE_CHECKING``).

    ``typing`` alone costs more than the rest of a host's lookup, and ``collections.namedtuple``
    half as much, so the records ``resolve-artifact`` builds get their fields from the class's
    annotations here: positional or keyword construction, defaults, field properties,
    ``_fields``, ``_replace``, ``_asdict``, tuple equality and a NamedTuple ``repr``.
    """

    __slots__ = ()
    _fields: ClassVar[tuple[str, ...]] = ()
    _field_defaults: ClassVar[dict[str, object]] = {}

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        names = tuple(cls.__dict__.get("__annotations__", {}))  # noqa: RUF063 (no inspect)
        cls._fields = names
        cls._field_defaults = {n: cls.__dict__[n] for n in names if n in cls.__dict__}
        for index, name in enumerate(names):
            setattr(cls, name, _field(index))

    def __new__(cls, *args: object, **kwargs: object) -> LightNamedTuple:
        names = cls._fields
        if len(args) > len(names):
            raise TypeError(f"{cls.__name__}() takes {len(names)} arguments, {len(args)} given")
        values = list(args)
        for name in names[len(args) :]:
            if name in kwargs:
                values.append(kwargs.pop(name))
            elif name in cls._field_defaults:
                values.append(cls._field_defaults[name])
            else:
                raise TypeError(f"{cls.__name__}() missing argument {name!r}")
        if kwargs:
            raise TypeError(f"{cls.__name__}() got unexpected or repeated {sorted(kwargs)}")
        return tuple.__new__(cls, values)

    def __repr__(self) -> str:
        shown = ", ".join(f"{n}={v!r}" for n, v in zip(self._fields, self, strict=True))
        return f"{type(self).__name__}({shown})"

    def __getnewargs__(self) -> tuple[object, ...]:
        return tuple(self)

    def _asdict(self) -> dict[str, object]:
        return dict(zip(self._fields, self, strict=True))

    def _replace(self, **changes: object) -> LightNamedTuple:
        return type(self)(**{**self._asdict(), **changes})


if not TYPE_CHECKING:
    _NamedTuple = LightNamedTuple


def is_hex(text: object, limit: int = 256) -> bool:
    """Whether ``text`` is 1 to ``limit`` lowercase hex digits (ASCII only)."""
    return isinstance(text, str) and 0 < len(text) <= limit and not text.strip(_LOWER_HEX)


def is_pointer(text: str) -> bool:
    """Whether ``text`` is what a per-class directory's ``current`` file holds: ``v<version>``
    (1 to 19 ASCII digits), an optional final newline. ``POINTER_RE.fullmatch`` without ``re``."""
    body = text[:-1] if text.endswith("\n") else text
    digits = body[1:]
    return body[:1] == "v" and 0 < len(digits) <= 19 and not digits.strip(_DIGITS)


_MONTH_DAYS = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def seconds_of(text: str) -> int:
    """POSIX seconds of a ``YYYY-MM-DDTHH:MM:SSZ`` time: what ``parse_time(text).timestamp()``
    gives, checked the same way, without importing ``datetime`` (``resolve-artifact``).

    Raises:
        ValueError: not of that form (``TIME_RE``), or no real time (month 13, 31 April, 24:00).
    """
    if (
        not isinstance(text, str)
        or len(text) != 20
        or text[4] + text[7] + text[10] + text[13] + text[16] + text[19] != "--T::Z"
        or (text[:4] + text[5:7] + text[8:10] + text[11:13] + text[14:16] + text[17:19]).strip(
            _DIGITS
        )
    ):
        raise ValueError(f"{text[:40]!r} is not a time of the form YYYY-MM-DDTHH:MM:SSZ")
    year, month, day = int(text[:4]), int(text[5:7]), int(text[8:10])
    hour, minute, second = int(text[11:13]), int(text[14:16]), int(text[17:19])
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    if not (
        year >= 1
        and 1 <= month <= 12
        and 1 <= day <= _MONTH_DAYS[month - 1] + (month == 2 and leap)
        and hour < 24
        and minute < 60
        and second < 60
    ):
        raise ValueError(f"{text!r} is not a valid time (no such date or time of day)")
    # Days from 1970-01-01 to the date (the proleptic Gregorian calendar, as datetime's).
    y = year - (month <= 2)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    days = era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468
    return days * 86400 + hour * 3600 + minute * 60 + second


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
    import json
    from json.encoder import encode_basestring

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
    import json

    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise CanonicalError(f"{path}: not a JSON value: {exc}") from exc


def _batch() -> Any:
    """``paused_gc()``, unless a batch paused the collector already (a fleet's entries, one by
    one): encoding makes no cycles, and a collection triggered mid-way would walk every live
    object of the caller (the whole matrix when generating a manifest, up to 0.5 s for 10,000
    classes)."""
    import gc

    if not gc.isenabled():
        from contextlib import nullcontext

        return nullcontext()
    from manifest._batch import paused_gc

    return paused_gc()


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

    seconds_of(text)  # the form and the calendar, checked as the host path checks them
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError as exc:  # 2026-13-45T99:00:00Z has the form but is no time
        raise ValueError(f"{text!r} is not a valid time ({exc})") from exc


def key_id(public_raw: bytes) -> str:
    """The key id of an Ed25519 public key: hex sha256 of its 32 raw bytes."""
    return sha256_hex(public_raw)


def public_pem(public_raw: bytes) -> str:
    """The PEM ``SubjectPublicKeyInfo`` text of a raw 32-byte Ed25519 public key."""
    import binascii

    body = binascii.b2a_base64(_SPKI_PREFIX + public_raw, newline=False).decode("ascii")
    return f"{_PEM_BEGIN}\n{body}\n{_PEM_END}\n"


_BASE64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _plain_base64(text: str) -> bytes | None:
    """``binascii.a2b_base64(text, strict_mode=True)`` for plain padded base64 (what a PEM body
    is): a multiple of 4 characters of the standard alphabet, then at most two ``=``. None for
    anything else (then binascii decides). A host reads one 60-character key at every start;
    loading binascii's shared library for it cost more than decoding it here."""
    data = text.rstrip("=")
    if not text or len(text) % 4 or len(text) - len(data) > 2 or data.strip(_BASE64):
        return None
    value = 0
    for char in data:
        value = value << 6 | _BASE64.index(char)
    size = len(data) * 6 // 8
    return (value >> (len(data) * 6 - size * 8)).to_bytes(size, "big")


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
    der = _plain_base64(body)
    if der is None:  # not plain padded base64: binascii decides, and says why
        import binascii

        try:
            # What base64.b64decode(validate=True) checks, without base64's import of re.
            der = binascii.a2b_base64(body.encode("ascii", "replace"), strict_mode=True)
        except ValueError as exc:
            raise KeyFileError(f"{source}: the PEM body is not base64: {exc}") from exc
    if len(der) != len(_SPKI_PREFIX) + 32 or not der.startswith(_SPKI_PREFIX):
        raise KeyFileError(
            f"{source}: not an Ed25519 public key; manifests are signed with Ed25519"
        )
    return der[len(_SPKI_PREFIX) :]


def _ed25519_loader() -> Any:
    """``Ed25519PublicKey.from_public_bytes``, straight from cryptography's compiled core.

    The public class is a thin abstract wrapper whose ``from_public_bytes`` returns this
    function's result, the same object with the same ``verify``; importing the wrapper also
    imports ``typing``, ``enum``, ``re`` and the hash and serialization modules, which cost a
    host more than the verification itself (measured with ``bench/resolve.py``). Where a
    cryptography release moves the core, the public class is used (slower, same answer); a
    test checks that the installed release takes the direct path.
    """
    try:
        from cryptography.hazmat.bindings._rust import openssl as rust_openssl

        return rust_openssl.ed25519.from_public_bytes
    except (ImportError, AttributeError):
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        return Ed25519PublicKey.from_public_bytes


def verify_signature(public_raw: bytes, signature: bytes, data: bytes | memoryview) -> bool:
    """Whether ``signature`` is a valid Ed25519 signature of ``data`` by ``public_raw``."""
    try:
        _ed25519_loader()(public_raw).verify(signature, data)
    except ValueError:  # a key that is not 32 bytes
        return False
    except Exception as exc:
        from cryptography.exceptions import InvalidSignature  # only on the refusing path

        if isinstance(exc, InvalidSignature):
            return False
        raise
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


class _StrictContext:
    """The settings ``json.loads(data, parse_constant=_bad_constant)`` hands its C scanner."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = staticmethod(_bad_constant)


_JSON_SPACE = " \t\n\r"
_scanner: Any = None


def _scan(data: bytes) -> Any:
    """``json.loads`` of UTF-8 bytes with ``json``'s own C scanner, without importing ``json``
    (whose ``re`` patterns cost a host more than parsing a per-class document). Raises on
    anything unusual, and the caller then asks ``json`` itself."""
    scanner = _json_scanner()
    text = data.decode("utf-8", "surrogatepass")  # what json.loads does with UTF-8 bytes
    value, end = scanner(text, len(text) - len(text.lstrip(_JSON_SPACE)))
    if len(text.rstrip(_JSON_SPACE)) != end:
        raise ValueError("extra data")
    return value


def loads_strict(data: bytes) -> Any:
    """``json.loads`` that refuses NaN/Infinity and turns a nesting too deep for the parser
    (RecursionError) into ValueError: what a reader must do with bytes it has not chosen.

    UTF-8 bytes (what every writer here writes) are parsed by ``json``'s C scanner directly;
    anything else, and every input that scanner refuses, goes through ``json.loads`` itself, so
    the result and the error are ``json``'s.
    """
    if isinstance(data, bytes) and data and 0 < data[0] < 0x80 and (len(data) < 2 or data[1]):
        try:  # no BOM and no NUL in the first two bytes: json.loads would decode it as UTF-8
            return _scan(data)
        except (ValueError, StopIteration, RecursionError):
            pass  # json.loads below gives its own answer, and its own message
    import json

    try:
        return json.loads(data, parse_constant=_bad_constant)
    except RecursionError as exc:
        raise ValueError("nested too deeply") from exc


def _canonical_signatures(signatures: list[dict[str, str]]) -> bytes:
    """``encode_canonical(signatures)`` for a list of ``{keyid, sig}`` of lowercase hex (no
    escaping needed), without ``json``."""
    body = ",".join(f'{{"keyid":"{s["keyid"]}","sig":"{s["sig"]}"}}' for s in signatures)
    return f"[{body}]".encode("ascii")


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
    """`parse_signed` for a reader that needs one class: the same object, except that a
    manifest's ``entries`` holds only ``host_class``'s entry, found without parsing the others.

    For verified bytes only (a signer's own ``encode_canonical`` output): `_entry_view` checks
    every property of the layout it relies on, and wherever one does not hold (no such class, a
    string holding a bracket, an escape ``encode_canonical`` never writes, a member not where
    the canonical layout puts it, nesting deeper than 64) the whole document is parsed instead.
    So the class's entry and every other member are exactly `parse_signed`'s, and so is the
    error for a document that is not a JSON object. What it does not do is parse the other
    entries: a signed document that is not JSON *inside another class's entry* (which no signer
    here can write) is answered for this class rather than refused.

    Args:
        data: bytes holding the signed part at ``data[start:end]`` (the whole file, say, as
            `verify_signed_span` locates it: no copy is made of it).
        host_class: the class whose entry to keep.
        source: where the bytes came from, for messages.

    Raises:
        MalformedError: as `parse_signed`.
    """
    stop = len(data) if end is None else end
    try:
        view = _entry_view(data, start, stop, host_class)
    except (ValueError, StopIteration, RecursionError, IndexError):  # UnicodeError included
        view = None
    if view is not None:
        return view
    return parse_signed(data if (start, stop) == (0, len(data)) else data[start:stop], source)


_ENTRIES = b'"entries":{'
_KEEP = b'"[]{}'
_BLOCK = 1 << 16
"""Translated in blocks this size: a bigger slice is a fresh buffer, each page a fault."""
_MAX_ENTRY_HITS = 4096
"""More occurrences of ``"<class>":`` than this, and the document is parsed whole."""
_MAX_ESCAPES = 4096
"""More backslashes than this after ``"entries"``, and the document is parsed whole."""
_MAX_NESTING = 64
"""Deeper nesting than this inside ``entries``, and the document is parsed whole."""
_SHORT_ESCAPES = frozenset(b'"bfnrt')
_NAMED_CONTROLS = (b"0008", b"0009", b"000a", b"000c", b"000d")
_WINDOW = 16 * 1024
_drop: bytes | None = None


def _not_structure() -> bytes:
    """The bytes ``translate`` deletes to leave only quotes and brackets (built on first use)."""
    global _drop
    if _drop is None:
        _drop = bytes(range(256)).translate(None, _KEEP)
    return _drop


def _json_scanner() -> Any:
    """The strict C scanner `loads_strict` uses (built on first use)."""
    global _scanner
    if _scanner is None:
        from _json import make_scanner

        # typeshed asks for a JSONDecoder: the scanner reads only the settings this holds.
        _scanner = make_scanner(_StrictContext())  # type: ignore[arg-type]
    return _scanner


def _decode(data: bytes) -> str:
    """``data.decode("utf-8", "surrogatepass")``, as `loads_strict` decodes, by the faster strict
    decoder wherever that succeeds (it then gives the same text)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("utf-8", "surrogatepass")


def _unescaped_quotes(data: bytes, begin: int, end: int) -> bytes | None:
    """``data`` as it is, but for ``\\\\`` and ``\\"`` escapes: each becomes ``__``, so that from
    ``begin`` on no quote is left inside a string. None when an escape in ``data[begin:end]``
    is not one ``encode_canonical`` writes (``\\"``, ``\\\\``, ``\\b \\f \\n \\r \\t``, and
    ``\\u00XX`` in lowercase for the other control characters): a string could then be spelled
    two ways, so a key could be the class without being its canonical spelling.

    Why it is exact: in JSON a backslash occurs only inside a string and escapes are read left
    to right, so the first of a run of backslashes starts an escape; the run's pairs are escaped
    backslashes, paired left to right as ``bytes.replace`` pairs them, and a lone last one
    escapes the byte after the run. Each backslash left then starts an escape, so each ``\\"``
    left is an escaped quote.
    """
    text = data.replace(b"\\\\", b"__")
    at = text.find(b"\\", begin, end)
    seen = 0
    while at >= 0:
        seen += 1
        code = text[at + 1 : at + 6]
        if seen > _MAX_ESCAPES:
            return None
        if not code or code[0] not in _SHORT_ESCAPES:
            hexa = code[1:]
            if not (
                code[:1] == b"u"
                and hexa[:2] == b"00"
                and hexa[2:3] in (b"0", b"1")
                and len(hexa) == 4
                and hexa[3] in b"0123456789abcdef"
                and hexa not in _NAMED_CONTROLS
            ):
                return None
        at = text.find(b"\\", at + 2, end)
    return text.replace(b'\\"', b"__")


def _reduced(brackets: bytes) -> bytes | None:
    """``brackets`` (``{}[]``) with every matched pair taken out, innermost first: what is left
    is the unmatched ones (empty when balanced and properly nested); None past 64 levels."""
    for _ in range(_MAX_NESTING):
        fewer = brackets.replace(b"{}", b"").replace(b"[]", b"")
        if len(fewer) == len(brackets):
            return brackets
        brackets = fewer
    return None


def _structure(marked: bytes) -> tuple[bytes, list[tuple[int, int]]] | None:
    """The brackets (and marks) of ``marked`` (quotes, brackets and marks) outside strings, and
    for each string holding brackets, where it lies among them and how many ``}`` it holds.
    None where a mark is inside a string.

    Removing each ``""`` (counted once, left to right) leaves every run of quotes of odd
    length as one quote and every even run as none; the runs are split by brackets and marks,
    and a string holding one of them is the first whose run is odd. So what is left has one
    quote per boundary of such a string: split at the quotes, its pieces are in turn outside
    and inside strings. Usually no string holds a bracket, which two counts tell at once.
    """
    brackets = marked.translate(None, b'"')
    if len(marked) - len(brackets) == 2 * marked.count(b'""'):
        return brackets, []
    pieces = marked.replace(b'""', b"").split(b'"')
    if len(pieces) % 2 == 0 or any(b"\0" in piece for piece in pieces[1::2]):
        return None
    quoted: list[tuple[int, int]] = []
    at = 0
    for index, piece in enumerate(pieces):
        if index % 2:
            quoted.append((at, piece.count(b"}")))
        else:
            at += len(piece)
    return b"".join(pieces[0::2]), quoted


def _entries_brackets(brackets: bytes) -> bytes | None:
    """The brackets (and marks) inside ``entries``, given those from just after its opening
    brace to the end of the document: the prefix before the ``}`` that matches that brace,
    i.e. the one before which the brackets are balanced and properly nested. Tried from the
    end of the document over its last 64 ``}``; the prefix before the leftmost tried is reduced
    once (`_reduced`), and each candidate only adds what follows it."""
    ends: list[int] = []
    at = brackets.rfind(b"}")  # the document's own closing brace: not entries'
    while len(ends) < _MAX_NESTING and (at := brackets.rfind(b"}", 0, at)) >= 0:
        ends.append(at)
    if not ends:
        return None
    first = ends[-1]
    base = _reduced(brackets[:first].replace(b"\0", b""))
    if base is None or b"}" in base or b"]" in base:
        return None
    for end in ends:
        if _reduced(base + brackets[first:end].replace(b"\0", b"")) == b"":
            return brackets[:end]
    return None


def _members(text: str, at: int, signed: dict[str, Any], scanner: Any) -> int:
    """Parse ``,"key":value`` members of ``text`` from ``at`` into ``signed``, up to where the
    next byte is not a comma; return that position. A key ``entries`` raises (a second one)."""
    from _json import scanstring

    while text[at : at + 1] == ",":
        if text[at + 1 : at + 2] != '"':
            raise ValueError("not a member")
        key, at = scanstring(text, at + 2, True)
        if key == "entries" or text[at : at + 1] != ":":
            raise ValueError("not a member")
        signed[key], at = scanner(text, at + 1)
    return at


def _value_at(data: bytes, begin: int, end: int, scanner: Any) -> tuple[Any, ...]:
    """The JSON value at ``data[begin]``, which must end at ``end`` or at a comma before it, as
    ``(value,)``; ``()`` when it does not. Decodes a window first (an entry is a few kB): a
    value the scanner completes before the window's edge is the value it reads from all of
    ``data[begin:end]``; one that reaches the edge is read again from all of it."""
    window = min(end, begin + _WINDOW)
    while True:
        try:
            text = data[begin:window].decode("utf-8")
        except UnicodeDecodeError:  # the window cut a character, or a lone surrogate
            if window < end:
                window = end
                continue
            text = _decode(data[begin:window])
        try:
            value, stop = scanner(text, 0)
        except (ValueError, StopIteration):
            if window == end:
                raise
            stop = len(text)
        if stop < len(text) or window == end:
            break
        window = end
    return (value,) if stop == len(text) or text[stop] == "," else ()


def _key_colons(data: bytes, plain: bytes, name: str, begin: int, end: int) -> list[int]:
    """Where the colon after each ``"<name>":`` (the key's canonical spelling) in
    ``data[begin:end]`` is, but for those whose quote is an escaped one (inside a string: a
    quote in ``plain``, `_unescaped_quotes`, only where it delimits a string); empty past
    4,096 of them."""
    from _json import encode_basestring

    key = encode_basestring(name).encode("utf-8", "surrogatepass") + b":"
    colons: list[int] = []
    hit = data.rfind(key, begin, end)  # from the end: here rfind is 3 times faster than find
    while hit >= 0:
        if plain[hit] == 0x22:
            colons.append(hit + len(key) - 1)
            if len(colons) > _MAX_ENTRY_HITS:
                return []
        hit = data.rfind(key, begin, hit + len(key) - 1)
    colons.reverse()
    return colons


def _skeleton(plain: bytes, colons: list[int], begin: int, end: int) -> bytes:
    """The quotes and brackets of ``plain[begin:end]``, a NUL byte in place of each colon of
    ``colons``, translated in 64 kB blocks (no slice of the document is a fresh 1 MB buffer)."""
    drop = _not_structure()
    parts: list[bytes] = []
    at = begin
    for stop in [*colons, end]:
        while at < stop:
            upto = min(stop, at + _BLOCK)
            parts.append(plain[at:upto].translate(None, drop))
            at = upto
        if stop < end:
            parts.append(b"\0")
            at = stop + 1
    return b"".join(parts)


def _last_member_mark(inner: bytes) -> int:
    """The index of the last mark at depth 0 of ``inner`` (brackets and marks inside
    ``entries``), i.e. after a key of ``entries`` itself; -1 when none is."""
    depth, chosen = 0, -1
    pieces = inner.split(b"\0")
    for index, piece in enumerate(pieces[:-1]):
        depth += piece.count(b"{") + piece.count(b"[") - piece.count(b"}") - piece.count(b"]")
        if depth == 0:
            chosen = index
    return chosen


def _entry_view(data: bytes, lo: int, hi: int, name: str) -> dict[str, Any] | None:
    """The signed object ``data[lo:hi]`` with only ``name``'s entry, or None where it cannot be
    told this way.

    For bytes that ``json.loads`` reads as an object ``signed``, the answer is None or exactly
    ``{**signed, "entries": {name: signed["entries"][name]}}``. How:

    1. The members before the first ``"entries":{`` are parsed by the C scanner, one after the
       other from the opening brace; they must end exactly there, so that it is the top-level
       key ``entries`` (its value an object) and not text inside another member.
    2. From there on, after `_unescaped_quotes`, every quote delimits a string (and a key
       spelled otherwise than canonically is ruled out). ``translate`` keeps only quotes and
       brackets (`_skeleton`), with a NUL byte (never in JSON) in place of the colon after each
       ``"<name>"`` (the key's canonical spelling: `_key_colons`). `_structure` takes the
       strings out, brackets in them included; a mark inside a string declines.
    3. The ``}`` closing ``entries`` is the one before which the brackets are balanced and
       properly nested (`_entries_brackets`), and is found in the bytes by counting ``}``
       from the end (every ``}``, in a string or not, counted on both sides).
    4. A mark at depth 0 of ``entries`` follows a key of ``entries``: the last such one is the
       entry ``json.loads`` keeps (of duplicate keys, the last wins). The C scanner reads its
       value, which must end at a comma or at the closing brace.
    5. The members after the closing brace are parsed by the C scanner up to the final ``}``;
       none may be a second ``entries``.
    """
    start = data.find(_ENTRIES, lo, hi)
    if start <= lo or data[lo] != 0x7B or data[hi - 1] != 0x7D:  # { ... }
        return None
    scanner = _json_scanner()
    signed: dict[str, Any] = {}
    head = _decode(data[lo:start])  # {"a":1,"b":2,  or  {  when entries comes first
    if len(head) > 1 and (
        head[-1] != "," or _members("," + head[1:-1], 0, signed, scanner) != len(head) - 1
    ):
        return None
    begin = start + len(_ENTRIES)
    plain = data if data.find(b"\\", begin, hi) < 0 else _unescaped_quotes(data, begin, hi)
    if plain is None:
        return None
    colons = _key_colons(data, plain, name, begin, hi)
    found = _structure(_skeleton(plain, colons, begin, hi)) if colons else None
    inner = _entries_brackets(found[0]) if found is not None else None
    if found is None or inner is None:
        return None
    brackets, quoted = found
    close = hi  # entries' "}": as many "}" before the end of the bytes as in `marked`
    after = brackets.count(b"}", len(inner)) + sum(n for at, n in quoted if at > len(inner))
    for _ in range(after):
        close = data.rfind(b"}", begin, close)
    chosen = _last_member_mark(inner)
    if chosen < 0:
        return None
    entry = _value_at(data, colons[chosen] + 1, close, scanner)
    if not entry:
        return None
    signed["entries"] = {name: entry[0]}
    tail = _decode(data[close + 1 : hi])
    if _members(tail, 0, signed, scanner) != len(tail) - 1 or tail[-1:] != "}":
        return None
    return signed


class Verified(_NamedTuple):
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
    parsing or copying the signed part: for a reader that parses only part of it
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


_SMALL_HASH = 256 * 1024
"""Below this, CPython's built-in SHA-256 beats loading OpenSSL's (``hashlib``: ~2.5 ms)."""


def sha256_hex(data: bytes | memoryview) -> str:
    """Hex sha256 of ``data``.

    Small inputs (a key, a per-class document) use CPython's built-in SHA-256, large ones
    ``hashlib``'s OpenSSL: the same digest, each where it is cheaper for a host to start.
    """
    if len(data) > _SMALL_HASH:
        import hashlib

        return hashlib.sha256(data).hexdigest()
    try:
        from _sha256 import sha256  # CPython 3.11
    except ImportError:
        try:
            from _sha2 import sha256  # CPython 3.12 and later
        except ImportError:
            from hashlib import sha256
    return str(sha256(data).hexdigest())


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
        return expires, seconds_of(expires)
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
    if now is None:
        return
    if expires <= now:
        raise ExpiredError(
            f"{source}: expired at {expires} (now {now}); generate and sign a fresh manifest"
        )
    if max_validity_s is not None:
        ahead = until - seconds_of(now)
        if ahead > max_validity_s:
            raise ValidityError(
                f"{source}: expires at {expires}, {ahead / 86400:.0f} days from now, more than "
                f"the {max_validity_s / 86400:g} days this host accepts (a signer clock or key "
                "gone wrong?); generate it with a shorter --expires"
            )
