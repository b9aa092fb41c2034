"""Ed25519 keys and signatures for manifests, on the generating side.

Owns making a key pair, reading key files, key ids, signing a ``signed`` mapping into the
``{"signed": ..., "signatures": [...]}`` envelope and verifying one. Does not own canonical JSON,
the public key format or the checks a host runs (``manifest.envelope``, shared with
``resolve-artifact``), nor building the content (``manifest.build``).

Key files: ``NAME.key`` is the private key as unencrypted PEM PKCS#8, created with mode 0600
(never overwritten unless asked); ``NAME.pub`` is the public key as PEM SubjectPublicKeyInfo.
Both are what ``openssl genpkey -algorithm ed25519`` and ``openssl pkey -pubout`` read and write.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from manifest import envelope
from manifest.encoded import EncodedEntries
from manifest.errors import CanonicalError, KeyFileError, MalformedError, SignatureError
from schemas.atomic import read_bounded, write_atomic

__all__ = [
    "check_publishable",
    "generate_keypair",
    "key_id",
    "load_private_key",
    "load_public_key",
    "public_raw",
    "sign_document",
    "sign_encoded",
    "verify",
]

MAX_KEY_BYTES = 64 * 1024
"""The largest key file read: an Ed25519 PEM key is a few hundred bytes."""


def public_raw(public_key: Ed25519PublicKey) -> bytes:
    """The 32 raw bytes of a public key."""
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(public_key: Ed25519PublicKey | Ed25519PrivateKey) -> str:
    """The key id: hex sha256 of the raw public key bytes (a private key gives its public's)."""
    if isinstance(public_key, Ed25519PrivateKey):
        public_key = public_key.public_key()
    return envelope.key_id(public_raw(public_key))


def _write_private(path: Path, data: bytes) -> None:
    write_atomic(path, data, mode=0o600)


def _write_public(path: Path, text: str) -> None:
    write_atomic(path, text, mode=0o644)


def generate_keypair(name: str, directory: Path, *, overwrite: bool = False) -> tuple[Path, Path]:
    """Make a new Ed25519 key pair: ``directory/NAME.key`` (mode 0600) and ``NAME.pub``.

    Args:
        name: the key's name (file stem); no path separators.
        directory: where to write both files (must exist).
        overwrite: replace existing files; without it an existing key is never touched.

    Returns:
        ``(key_path, pub_path)``.

    Raises:
        KeyFileError: a bad name, a missing directory, or the files exist and ``overwrite`` is off.
    """
    if not name or "/" in name or os.sep in name or name in (".", ".."):
        raise KeyFileError(f"key name {name!r} must be a plain file stem, e.g. 'release'")
    if not directory.is_dir():
        raise KeyFileError(f"{directory}: no such directory; create it first")
    key_path, pub_path = directory / f"{name}.key", directory / f"{name}.pub"
    if not overwrite:
        for path in (key_path, pub_path):
            if path.exists():
                raise KeyFileError(
                    f"{path} already exists; refusing to overwrite a key (remove it, or choose "
                    "another name)"
                )
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    _write_private(key_path, pem)
    _write_public(pub_path, envelope.public_pem(public_raw(private.public_key())))
    return key_path, pub_path


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """Read a private key written by ``generate_keypair`` (PEM PKCS#8, unencrypted).

    Raises:
        KeyFileError: missing, unreadable, encrypted, or not an Ed25519 private key.
    """
    try:
        data = read_bounded(path, MAX_KEY_BYTES)
    except OSError as exc:
        raise KeyFileError(f"{path}: cannot read the private key ({exc.strerror or exc})") from exc
    if len(data) > MAX_KEY_BYTES:
        raise KeyFileError(f"{path}: larger than a key file ({MAX_KEY_BYTES // 1024} KiB)")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(
            f"{path}: not an unencrypted PEM private key ({exc}); make one with 'qualify keygen'"
        ) from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"{path}: a {type(key).__name__}, not an Ed25519 private key")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    """Read a public key (PEM SubjectPublicKeyInfo, Ed25519).

    Raises:
        KeyFileError: missing, unreadable, or not an Ed25519 public key.
    """
    try:
        data = read_bounded(path, MAX_KEY_BYTES)
    except OSError as exc:
        raise KeyFileError(f"{path}: cannot read the public key ({exc.strerror or exc})") from exc
    if len(data) > MAX_KEY_BYTES:
        raise KeyFileError(f"{path}: larger than a key file ({MAX_KEY_BYTES // 1024} KiB)")
    text = data.decode("ascii", errors="replace")
    return Ed25519PublicKey.from_public_bytes(envelope.parse_public_pem(text, source=str(path)))


def sign_document(
    signed: Mapping[str, Any], private_key: Ed25519PrivateKey, *, keyid: str | None = None
) -> dict[str, Any]:
    """Sign the canonical bytes of ``signed``.

    Args:
        signed: the content (integers, strings, booleans, null, lists, objects; no floats).
        private_key: the signing key.
        keyid: ``key_id(private_key)`` when the caller signs many documents with one key.

    Returns:
        ``{"signed": signed, "signatures": [{"keyid": ..., "sig": ...}]}``.

    Raises:
        CanonicalError: ``signed`` holds a float or a non-string key.
    """
    return sign_encoded(signed, private_key, keyid=keyid)[0]


def sign_encoded(
    signed: Mapping[str, Any], private_key: Ed25519PrivateKey, *, keyid: str | None = None
) -> tuple[dict[str, Any], bytes]:
    """``sign_document`` plus the signed document's canonical bytes, ``signed`` encoded once.

    Returns:
        ``(document, encode_canonical(document))``, ready for ``write_atomic``.

    Raises:
        CanonicalError: ``signed`` holds a float or a non-string key.
    """
    data = envelope.encode_canonical(signed)
    signatures = [{"keyid": keyid or key_id(private_key), "sig": private_key.sign(data).hex()}]
    return {"signed": signed, "signatures": signatures}, envelope.encode_envelope(signatures, data)


def verify(
    doc: Mapping[str, Any] | bytes,
    public_key: Ed25519PublicKey,
    *,
    now: datetime | None = None,
    source: str = "manifest",
) -> None:
    """Check a document's signature by ``public_key`` and, given ``now``, its type and expiry.

    Args:
        doc: the file's bytes (as every reader should pass them), or ``{"signed": ...,
            "signatures": [...]}`` already in memory (encoded canonically first).
        public_key: the trusted key.
        now: reference time; when given, the type, format and expiry are checked too.
        source: where the bytes came from, for messages.

    A document is read up to ``envelope.MAX_MANIFEST_BYTES``, the bound of qualify's own
    reading (``resolve-artifact`` on a host keeps ``envelope.MAX_BYTES`` unless told).

    Raises:
        MalformedError: not an envelope, larger than that bound, or ``signed`` is not
            canonical-JSON content.
        SignatureError: no signature by this key, or it does not verify.
        ExpiredError: ``now`` is given and the document expired.
    """
    if isinstance(doc, bytes):
        raw = doc
    else:
        try:
            raw = envelope.encode_canonical(dict(doc))
        except CanonicalError as exc:
            raise MalformedError(f"manifest: {exc}") from exc
    signed = envelope.check_envelope(
        raw, public_raw(public_key), source=source, max_bytes=envelope.MAX_MANIFEST_BYTES
    )
    if now is not None:
        envelope.check_signed(signed, now=envelope.format_time(now), source=source)


_DECISIONS = frozenset({"candidate", "baseline", "hold"})


def check_publishable(
    raw: bytes,
    signed: Mapping[str, Any],
    private_key: Ed25519PrivateKey | None,
    *,
    now: datetime,
    source: str = "manifest",
) -> None:
    """Check a manifest about to be published the way a host will, on the very bytes to write.

    ``raw`` must be in the canonical layout (``envelope.split_envelope``); signed, it must carry
    a signature by ``private_key``'s public key that verifies over its signed bytes
    (``envelope.verify_signature``, what ``resolve-artifact`` runs); ``signed`` must pass the
    host's checks of type, format, version and expiry at ``now`` (``envelope.check_signed``),
    and each entry must be the object of the class it is filed under, with a decision. ``signed`` is what ``raw``'s signed bytes encode (the caller built
    both), so they are not parsed back: for 10,000 classes parsing and validating the document
    again was a second, for a document made of validated parts.

    Args:
        raw: the document's bytes (``sign_encoded``'s, or an unsigned envelope).
        signed: the ``signed`` mapping ``raw`` encodes.
        private_key: the key it was signed with; None for an unsigned document.
        now: the publishing time (the document must not be expired at it).
        source: where it will be written, for messages.

    Raises:
        MalformedError: larger than `envelope.MAX_MANIFEST_BYTES`, not the canonical layout, or
            a field a host reads is missing or wrong.
        SignatureError: no signature by this key verifies over the signed bytes.
        ExpiredError: already expired at ``now``.
    """
    if len(raw) > envelope.MAX_MANIFEST_BYTES:
        # What qualify could not read back (the next generation, show, verify, the report) is
        # not published.
        raise MalformedError(
            f"{source}: {len(raw):,} bytes for {len(signed.get('entries') or ())} classes, over "
            f"the {envelope.MAX_MANIFEST_BYTES:,}-byte limit of a manifest; nothing was "
            "published. Split the fleet across projects, one manifest each"
        )
    signatures, signed_bytes = envelope.split_envelope(raw, source)
    if private_key is not None:
        public = public_raw(private_key.public_key())
        trusted = envelope.key_id(public)
        if not any(
            s["keyid"] == trusted
            and envelope.verify_signature(public, bytes.fromhex(s["sig"]), signed_bytes)
            for s in signatures
        ):
            raise SignatureError(
                f"{source}: the signature by key {trusted[:16]} does not verify over the bytes "
                "to be published; nothing was published"
            )
    entries: Any = signed.get("entries")
    # The host's checks of the document's fields; the entries are checked one by one below
    # (without parsing those still held as their canonical bytes).
    envelope.check_signed(
        {**signed, "entries": {}} if isinstance(entries, EncodedEntries) else signed,
        now=envelope.format_time(now),
        source=source,
    )
    if signed.get("type") != envelope.MANIFEST_TYPE:
        raise MalformedError(f"{source}: signed.type is {signed.get('type')!r}, not a manifest")
    heads = (
        entries.heads()
        if isinstance(entries, EncodedEntries)
        else (
            (name, e.get("host_class"), e.get("decision"))
            if isinstance(e, dict)
            else (name, None, None)
            for name, e in entries.items()
        )
    )
    for name, host_class, decision in heads:
        if host_class != name or decision not in _DECISIONS:
            raise MalformedError(
                f"{source}: signed.entries.{name}: not the entry of class {name!r} with a "
                "decision; nothing was published"
            )
