"""The host's lookup: which artifact this host runs, from a checked manifest and its own state.

Owns checking a manifest, per-class document or per-class directory against the trusted key and
the host's rollback floor (``manifest.envelope``, ``manifest.hoststate``), finding the class's
entry (``manifest.hostmatch`` when the class is detected), the answer (artifact, hold, rollout
cohort, URI and runtime checks) and falling back to the last-known-good. Standard library and
``cryptography`` only. Does not parse the command line, print or write state (``manifest.resolve``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from manifest import envelope
from manifest.errors import (
    ForkError,
    LineMismatchError,
    MalformedError,
    PointerMismatchError,
    RollbackError,
    VerificationError,
)
from manifest.hostruntime import HostRuntime, requirement_failures
from manifest.hoststate import Accepted

__all__ = [
    "DEFAULT_GRACE_DAYS",
    "DEFAULT_MAX_VALIDITY_DAYS",
    "DEFAULT_URI_SCHEMES",
    "EXIT_HOLD",
    "EXIT_INCOMPATIBLE",
    "EXIT_RESOLVED",
    "EXIT_STALE",
    "EXIT_UNKNOWN",
    "EXIT_USAGE",
    "EXIT_VERIFY",
    "Fresh",
    "Line",
    "Outcome",
    "cohort_point",
    "model_of",
    "record_of",
    "resolve",
    "show",
    "verify_document",
    "verify_fresh",
]

EXIT_RESOLVED = 0
EXIT_USAGE = 2
EXIT_UNKNOWN = 2
EXIT_HOLD = 3
EXIT_VERIFY = 4
EXIT_INCOMPATIBLE = 5
EXIT_STALE = 6

DEFAULT_GRACE_DAYS = 7.0
"""How long after its expiry a last-known-good is still served (exit 6)."""
DEFAULT_MAX_VALIDITY_DAYS = 400.0
"""A manifest expiring further ahead is refused (``qualify manifest generate`` caps at 366)."""
DEFAULT_URI_SCHEMES = ("https", "s3", "gs", "az", "oci", "file")
"""Artifact URI schemes a host may be told to fetch; ``http`` and the rest need
``--uri-schemes``."""
_MAX_URI = 4096


class Outcome(NamedTuple):
    """What ``resolve`` decided: exit code, the answer, messages and what to keep."""

    code: int
    answer: dict[str, Any] | None
    messages: list[str]
    accepted: bytes | None
    """The document to keep as last-known-good: verified and resolved for this host."""
    record: Accepted | None
    """``accepted``'s state record."""
    floor: Accepted | None
    """The highest record this host now has (what ``state.json`` should say)."""


class _Refused(Exception):
    """Internal: stop with an exit code and a message."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _entries(signed: Mapping[str, Any]) -> dict[str, Any]:
    if signed["type"] == envelope.CLASS_TYPE:
        return {signed["host_class"]: signed["entry"]}
    entries: dict[str, Any] = signed["entries"]
    return entries


class _Document:
    """A document whose signature by the trusted key verified: its ``signed`` object (for a
    manifest read for one class, only that class's entry: ``envelope.parse_signed_entry``),
    the signature that verified it, and the digest of its signed bytes, hashed on demand."""

    __slots__ = ("_digest", "signature", "signed", "signed_bytes")

    def __init__(self, signed: dict[str, Any], signed_bytes: memoryview, signature: str) -> None:
        self.signed = signed
        self.signed_bytes = signed_bytes
        self.signature = signature
        self._digest: str | None = None

    def digest(self) -> str:
        if self._digest is None:
            self._digest = envelope.sha256_hex(self.signed_bytes)
        return self._digest


def verify_document(
    raw: bytes, public_raw: bytes, host_class: str | None, *, source: str, max_bytes: int
) -> _Document:
    """``envelope.verify_envelope``, parsing only what a host asking for ``host_class`` needs
    (``envelope.parse_signed_entry``; all of it to detect the class) and copying nothing.

    Raises:
        MalformedError, SignatureError: as ``envelope.verify_envelope``.
    """
    start, end, sig = envelope.verify_signed_span(
        raw, public_raw, source=source, max_bytes=max_bytes
    )
    signed = (
        envelope.parse_signed(raw[start:end], source)
        if host_class is None
        else envelope.parse_signed_entry(raw, host_class, source, start=start, end=end)
    )
    return _Document(signed, memoryview(raw)[start:end], f"{envelope.key_id(public_raw)}:{sig}")


def record_of(document: _Document, *known: Accepted | None) -> Accepted:
    """The state record of a verified document. Its digest comes from a ``known`` record of the
    same document (same version, type, class and signature by the same key), else is hashed."""
    signed = document.signed
    kind = signed["type"]
    cls = signed.get("host_class") if kind == envelope.CLASS_TYPE else None
    version = signed["version"]
    for record in known:
        if (
            record is not None
            and record.digest is not None
            and record.signature == document.signature
            and (record.version, record.kind, record.host_class) == (version, kind, cls)
        ):
            return Accepted(version, kind, cls, record.digest, document.signature)
    return Accepted(version, kind, cls, document.digest(), document.signature)


def _floor(records: Sequence[Accepted | None], accepted_version: int) -> Accepted | None:
    """The highest record this host keeps (one with an identity wins a tie)."""
    known = [r for r in records if r is not None]
    if accepted_version and not any(r.version >= accepted_version for r in known):
        known.append(Accepted(accepted_version, None, None, None))
    if not known:
        return None
    return max(known, key=lambda r: (r.version, r.digest is not None))


def _check_fork(document: _Document, floor: Accepted | None, source: str) -> None:
    if floor is None or floor.digest is None or document.signed["version"] != floor.version:
        return
    mine = record_of(document, floor)
    if (mine.kind, mine.host_class) == (floor.kind, floor.host_class) and (
        mine.digest != floor.digest
    ):
        raise ForkError(
            f"{source}: version {floor.version} differs from the version {floor.version} this "
            "host already accepted (two releases under one version: a compromised key or a "
            "forked release?); publish a new version, never re-sign an old one"
        )


def _find_class(
    signed: Mapping[str, Any], host_class: str | None, facts: Callable[[], Any] | None
) -> tuple[str, dict[str, Any]]:
    entries = _entries(signed)
    if host_class is not None:
        entry = entries.get(host_class)
        if not isinstance(entry, dict):
            raise _Refused(
                EXIT_UNKNOWN,
                f"class {host_class!r} is not in manifest version {signed['version']} "
                f"({len(entries)} classes{_closest(host_class, entries)}); check --host-class",
            )
        if entry.get("host_class", host_class) != host_class:
            raise _Refused(
                EXIT_VERIFY, f"entry {host_class!r} names class {show(entry.get('host_class'))}"
            )
        return host_class, entry
    if facts is None:
        raise _Refused(EXIT_UNKNOWN, "no --host-class and host detection is off")
    from manifest.hostmatch import match_failures

    try:
        host = facts()
    except Exception as exc:  # /proc unreadable, a sandbox: say so, do not guess
        raise _Refused(
            EXIT_UNKNOWN, f"cannot read this host's facts ({exc}); pass --host-class NAME"
        ) from exc
    matches = [
        name
        for name, entry in entries.items()
        if isinstance(entry, dict) and not match_failures(host, entry.get("match") or {})
    ]
    if len(matches) == 1:
        return matches[0], entries[matches[0]]
    if not matches:
        raise _Refused(
            EXIT_UNKNOWN,
            f"this host matches none of the {len(entries)} classes of manifest version "
            f"{signed['version']}; pass --host-class NAME",
        )
    shown = ", ".join(show(m) for m in sorted(matches)[:10])
    raise _Refused(EXIT_UNKNOWN, f"this host matches several classes ({shown}); pass --host-class")


_CLOSEST_AMONG = 10_000
"""Classes a refused --host-class is compared with for a near miss (a host's typo); past that
many, a guess would take seconds of a host's start."""


def _closest(host_class: str, entries: Mapping[str, Any]) -> str:
    """``; did you mean 'x86-v4'?`` for a class name of the manifest close to ``host_class``."""
    if len(entries) > _CLOSEST_AMONG:
        return ""
    import difflib  # only when refusing: a host's start imports nothing it does not use

    close = difflib.get_close_matches(host_class, [str(name) for name in entries], n=1)
    return f"; did you mean '{show(close[0])}'?" if close else ""


def show(value: Any, limit: int = 120) -> str:
    """A value from a document, safe on one terminal line: control characters escaped, cut."""
    text = value if isinstance(value, str) else repr(value)
    if not (text.isascii() and text.isprintable() and "\\" not in text):  # else nothing to escape
        text = text.encode("unicode_escape", "backslashreplace").decode("ascii")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _pointer(art: Any, schemes: Sequence[str], what: str) -> dict[str, Any]:
    """``{digest, uri}`` of an artifact reference, checked: a sha256 digest and a URI of an
    allowed scheme, printable ASCII (what a host will fetch and load)."""
    if not isinstance(art, dict):
        raise _Refused(EXIT_VERIFY, f"{what} is not an object")
    digest, uri = art.get("digest"), art.get("uri")
    if not (
        isinstance(digest, str)
        and len(digest) == 71
        and digest.startswith("sha256:")
        and envelope.is_hex(digest[7:])
    ):
        raise _Refused(EXIT_VERIFY, f"{what}: digest {show(digest)} is not sha256:<64 hex>")
    if (
        not isinstance(uri, str)
        or not 0 < len(uri) <= _MAX_URI
        or not all("!" <= ch <= "~" for ch in uri)
    ):
        raise _Refused(
            EXIT_VERIFY, f"{what}: uri {show(uri)} is not a URI (printable ASCII, no spaces)"
        )
    scheme, sep, _ = uri.partition(":")
    if not sep or scheme.lower() not in schemes:
        raise _Refused(
            EXIT_VERIFY,
            f"{what}: uri {show(uri)} has scheme {show(scheme if sep else '')}, not one of "
            f"{', '.join(schemes)} (allow more with --uri-schemes)",
        )
    return {"digest": digest, "uri": uri}


def _usable(provider: Mapping[str, Any], host: HostRuntime) -> list[str]:
    """The requirement's execution providers this host has, in the order they are requested."""
    wanted = provider.get("execution_providers") or []
    return [str(p) for p in wanted if isinstance(p, str) and p in host.providers]


def _reasons(entry: Mapping[str, Any]) -> list[dict[str, str]]:
    found = entry.get("reasons")
    if not isinstance(found, list):
        return []
    return [
        {"code": r["code"], "message": r["message"]}
        for r in found
        if isinstance(r, dict)
        and isinstance(r.get("code"), str)
        and isinstance(r.get("message"), str)
    ]


def cohort_point(rollout_id: str, host_id: str) -> float:
    """Where a host falls in a rollout, in [0, 100): a stable hash of the rollout id and the
    host id. A host is in the cohort while this is below the step's percentage, so it stays in
    as the percentage grows, and stays put across restarts."""
    from cryptography.hazmat.primitives.hashes import SHA256, Hash

    h = Hash(SHA256())
    h.update(f"qualify-cohort/1\0{rollout_id}\0{host_id}".encode())
    digest = h.finalize()
    return int.from_bytes(digest[:8], "big") / 2.0**64 * 100.0


def _cohort(
    entry: Mapping[str, Any], host_class: str, host_id: str | None
) -> dict[str, Any] | None:
    """The entry's rollout as this host sees it: its id, step, percentage and whether the host
    is in its cohort (a host without an id stays with the rest); None without a rollout."""
    rollout = entry.get("rollout")
    if rollout is None:
        return None
    where = f"entry {host_class!r}: rollout"
    if not isinstance(rollout, dict):
        raise _Refused(EXIT_VERIFY, f"{where} is not an object")
    rid, percent, step = rollout.get("id"), rollout.get("percent"), rollout.get("step")
    if not isinstance(rid, str) or not 0 < len(rid) <= 128:
        raise _Refused(EXIT_VERIFY, f"{where}.id is not a rollout id: {show(rid)}")
    if isinstance(percent, bool) or not isinstance(percent, int) or not 0 <= percent <= 100:
        raise _Refused(EXIT_VERIFY, f"{where}.percent is not in 0..100: {show(percent)}")
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise _Refused(EXIT_VERIFY, f"{where}.step is not a step number: {show(step)}")
    member = host_id is not None and cohort_point(rid, host_id) < percent
    return {"rollout": rid, "step": step, "percent": percent, "member": member}


def _model_line(signed: Mapping[str, Any]) -> str | None:
    """The document's model line, for the answer and its telemetry (None: not a bounded text)."""
    model = signed.get("model")
    return model if isinstance(model, str) and 0 < len(model) <= 256 else None


def _answer(
    signed: Mapping[str, Any],
    host_class: str,
    entry: Mapping[str, Any],
    host: HostRuntime,
    notes: list[dict[str, str]],
    schemes: Sequence[str],
    host_id: str | None = None,
) -> tuple[int, dict[str, Any], list[str]]:
    messages: list[str] = []
    reasons = _reasons(entry) + notes
    decision = entry.get("decision")
    rollback = entry.get("rollback")
    answer: dict[str, Any] = {
        "host_class": host_class,
        "decision": decision,
        "artifact": None,
        "rollback": None,
        "manifest_version": signed["version"],
        "release": signed.get("release"),
        "model": _model_line(signed),
        "served": None,
        "providers": [],
        "settings": None,
        "reasons": reasons,
        "cohort": None,
    }
    if rollback is not None:
        answer["rollback"] = _pointer(rollback, schemes, f"entry {host_class!r}: rollback")
    if decision == "hold":
        messages.append(f"class {host_class!r} is on hold: {show(entry.get('summary', ''), 300)}")
        return EXIT_HOLD, answer, messages
    from schemas.settings import qualified_settings  # an answer with an artifact needs it

    artifact = entry.get("artifact")
    if decision not in ("candidate", "baseline") or not isinstance(artifact, dict):
        raise _Refused(
            EXIT_VERIFY, f"entry {host_class!r} has no artifact for decision {show(decision)}"
        )
    pointer = _pointer(artifact, schemes, f"entry {host_class!r}: artifact")
    provider = entry.get("provider") or {}
    failures = requirement_failures(host, entry.get("runtime") or {}, provider)
    answer["cohort"] = _cohort(entry, host_class, host_id)
    if not failures and answer["cohort"] is not None and answer["cohort"]["member"]:
        staged = entry["rollout"].get("artifact")
        answer["artifact"] = _pointer(staged, schemes, f"entry {host_class!r}: rollout.artifact")
        answer["served"] = "rollout"
        answer["providers"] = _usable(provider, host)
        answer["settings"] = qualified_settings(provider)
        return EXIT_RESOLVED, answer, messages
    if not failures:
        answer["artifact"], answer["served"] = pointer, "artifact"
        answer["providers"] = _usable(provider, host)
        answer["settings"] = qualified_settings(provider)
        return EXIT_RESOLVED, answer, messages
    return _fall_back(entry, host_class, host, answer, reasons, failures, messages)


def _fall_back(
    entry: Mapping[str, Any],
    host_class: str,
    host: HostRuntime,
    answer: dict[str, Any],
    reasons: list[dict[str, str]],
    failures: list[str],
    messages: list[str],
) -> tuple[int, dict[str, Any], list[str]]:
    """`_answer` for a host that cannot run the entry's artifact: its rollback, if it can."""
    from schemas.settings import qualified_settings

    decision, rollback = entry.get("decision"), entry.get("rollback")
    provider = entry.get("provider") or {}
    why = "; ".join(failures)
    name = show(entry["artifact"].get("name"))
    reasons.append({"code": "runtime_incompatible", "message": f"{name}: {why}"})
    if isinstance(rollback, dict):
        rb_name = show(rollback.get("name"))
        rb_provider = rollback.get("provider") or provider
        rb_failures = requirement_failures(
            host, rollback.get("runtime") or entry.get("runtime") or {}, rb_provider
        )
        if not rb_failures:
            messages.append(
                f"{decision} {name} cannot run here ({why}); answering with rollback {rb_name}"
            )
            reasons.append({"code": "served_rollback", "message": f"rollback {rb_name} fits"})
            answer["artifact"], answer["served"] = answer["rollback"], "rollback"
            answer["providers"] = _usable(rb_provider, host)
            answer["settings"] = qualified_settings(rb_provider)
            return EXIT_RESOLVED, answer, messages
        why += f"; rollback {rb_name}: {'; '.join(rb_failures)}"
    messages.append(f"no compatible artifact for class {host_class!r}: {why}")
    return EXIT_INCOMPATIBLE, answer, messages


def _decide(
    verified: _Document,
    host_class: str | None,
    facts: Callable[[], Any] | None,
    host: HostRuntime,
    notes: list[dict[str, str]],
    schemes: Sequence[str],
    host_id: str | None = None,
) -> tuple[int, dict[str, Any], list[str]]:
    """The answer a verified, checked document gives this host.

    Raises:
        _Refused: EXIT_UNKNOWN (the class is not found: the document is fine, the host is not
            in it) or EXIT_VERIFY (the document says something a host must not act on).
    """
    try:
        name, entry = _find_class(verified.signed, host_class, facts)
        return _answer(verified.signed, name, entry, host, notes, schemes, host_id)
    except _Refused:
        raise
    except Exception as exc:  # a verified document breaking an assumption: refused, no crash
        raise _Refused(
            EXIT_VERIFY, f"unexpected content ({type(exc).__name__}: {show(str(exc))})"
        ) from exc


class Line(NamedTuple):
    """The model line whose state a run was given (``manifest.hoststate``): a document of
    another line is refused, and a refusal by its floor says where that floor is kept."""

    model: str
    state_file: str | None = None
    """The file that keeps the line's floor (for messages)."""
    pinned: bool = False
    """``--model`` named the line (else it is the new document's own, or the one its manifest
    path was last read as)."""
    unknown_floor: str | None = None
    """A file of the earlier layout whose floor this line is held to (`hoststate.LineState`)."""


class Fresh(NamedTuple):
    """The new document, verified before ``resolve`` was called (``resolve-artifact`` reads its
    model line to know which state to read): the verified document, or why it failed."""

    document: _Document | None
    failure: VerificationError | None


def verify_fresh(
    raw: bytes | None,
    public_raw: bytes,
    host_class: str | None,
    *,
    source: str = "manifest",
    max_bytes: int = envelope.MAX_BYTES,
) -> Fresh:
    """The new document's signature check (`resolve`'s first step), for a caller that needs its
    model line before it reads the state."""
    if raw is None:
        return Fresh(None, None)
    try:
        return Fresh(
            verify_document(raw, public_raw, host_class, source=source, max_bytes=max_bytes), None
        )
    except VerificationError as exc:
        return Fresh(None, exc)


def model_of(document: _Document | None) -> str | None:
    """The model line a verified document belongs to (None: none, or not a name)."""
    model = document.signed.get("model") if document is not None else None
    return model if isinstance(model, str) and model else None


def resolve(
    raw: bytes | None,
    *,
    public_raw: bytes,
    now: str,
    host: HostRuntime,
    host_class: str | None = None,
    facts: Callable[[], Any] | None = None,
    accepted_version: int = 0,
    accepted: Accepted | None = None,
    last_known_good: bytes | None = None,
    max_bytes: int = envelope.MAX_BYTES,
    source: str = "manifest",
    read_error: str | None = None,
    grace_s: float = DEFAULT_GRACE_DAYS * 86400,
    max_validity_s: float | None = DEFAULT_MAX_VALIDITY_DAYS * 86400,
    uri_schemes: Sequence[str] = DEFAULT_URI_SCHEMES,
    host_id: str | None = None,
    line: Line | None = None,
    pointer_version: int | None = None,
    fresh: Fresh | None = None,
) -> Outcome:
    """Decide the answer for this host: the core of ``resolve-artifact``, with no I/O.

    The answer comes only from a document whose signature verified (``fresh``, or ``raw``
    verified here), at or above the rollback floor (the highest version among ``accepted``, the
    ``last_known_good``'s own and ``accepted_version``; at the floor's version, the same bytes),
    of the model ``line``, at the version a per-class directory's pointer names
    (``pointer_version``), expiring before ``now`` + ``max_validity_s``. Otherwise the
    last-known-good answers (exit 6 within ``grace_s`` of its expiry), or nothing (exit 4).
    ``host_class`` None detects the class with ``facts``; ``host_id`` places the host in or out
    of a rollout's cohort; ``uri_schemes`` bound what a host may be told to fetch.
    """
    messages: list[str] = []
    if fresh is None:
        fresh = verify_fresh(raw, public_raw, host_class, source=source, max_bytes=max_bytes)
    document, failure = fresh
    kept = _kept(last_known_good, raw, document, public_raw, host_class, max_bytes, line, messages)
    floor = _floor([accepted, record_of(kept, accepted) if kept else None], accepted_version)
    if document is not None:
        checks = _Checks(now, host_class, source, max_validity_s, line, pointer_version)
        done = _from_fresh(document, raw, accepted, floor, checks, messages, facts, host,
                           uri_schemes, host_id)  # fmt: skip
        if isinstance(done, Outcome):
            return done
        failure = done
    why = read_error if failure is None else str(failure)
    check = "unreadable" if failure is None else failure.code
    messages.append(f"refused {source}: {why}")
    return _from_last_known_good(
        kept,
        messages,
        f"{check}: {why}",
        floor,
        now=now,
        host=host,
        host_class=host_class,
        facts=facts,
        grace_s=grace_s,
        uri_schemes=uri_schemes,
        host_id=host_id,
    )


class _Checks(NamedTuple):
    """What a fresh document is checked against besides its signature (see `resolve`)."""

    now: str
    host_class: str | None
    source: str
    max_validity_s: float | None
    line: Line | None
    pointer_version: int | None


def _from_fresh(
    document: _Document,
    raw: bytes | None,
    accepted: Accepted | None,
    floor: Accepted | None,
    checks: _Checks,
    messages: list[str],
    facts: Callable[[], Any] | None,
    host: HostRuntime,
    uri_schemes: Sequence[str],
    host_id: str | None,
) -> Outcome | VerificationError:
    """`resolve`'s answer from a verified document, or why it cannot give one (the
    last-known-good then answers)."""
    source, pointer_version = checks.source, checks.pointer_version
    try:
        _check_fresh(document, floor, checks.now, checks.host_class, source,
                     checks.max_validity_s, checks.line)  # fmt: skip
        if pointer_version is not None and document.signed["version"] != pointer_version:
            raise PointerMismatchError(
                f"{source}: version {document.signed['version']}, but the directory's "
                f"current pointer names v{pointer_version} (a per-class set and its pointer "
                "disagree: a mixed or tampered directory); publish again with --per-class"
            )
        code, answer, more = _decide(
            document, checks.host_class, facts, host, [], uri_schemes, host_id
        )
    except VerificationError as exc:
        return exc
    except _Refused as exc:
        if exc.code != EXIT_VERIFY:
            return Outcome(exc.code, None, [*messages, str(exc)], None, None, floor)
        return MalformedError(f"{source}: {exc}")
    answer["source"] = "manifest"
    mine = record_of(document, accepted, floor)
    return Outcome(code, answer, messages + more, raw, mine, mine)


def _kept(
    last_known_good: bytes | None,
    raw: bytes | None,
    fresh: _Document | None,
    public_raw: bytes,
    host_class: str | None,
    max_bytes: int,
    line: Line | None,
    messages: list[str],
) -> _Document | None:
    """The last-known-good, verified (the new document itself when it holds the same bytes),
    or None with a warning when it is unusable: another key's, damaged, another line's."""
    if last_known_good is None:
        return None
    try:
        kept = (
            fresh
            if fresh is not None and last_known_good == raw
            else verify_document(
                last_known_good,
                public_raw,
                host_class,
                source="last-known-good",
                max_bytes=max(max_bytes, len(last_known_good)),
            )
        )
        # Its type, format, version and class, whatever its age: it sets the floor.
        envelope.check_signed(kept.signed, now=None, source="last-known-good")
        if line is not None and model_of(kept) != line.model:
            raise LineMismatchError(
                f"last-known-good: a document of model line {show(model_of(kept))!r}, kept "
                f"where line {show(line.model)!r}'s is (moved or copied there?)"
            )
    except VerificationError as exc:
        messages.append(f"warning: the last-known-good manifest is unusable: {exc}")
        return None
    return kept


def _check_fresh(
    document: _Document,
    floor: Accepted | None,
    now: str,
    host_class: str | None,
    source: str,
    max_validity_s: float | None,
    line: Line | None,
) -> None:
    """`envelope.check_signed` and the fork check, against the floor of the document's own model
    line; a refusal by that floor says where it is kept.

    Raises:
        VerificationError: as `envelope.check_signed`; `ForkError`; `LineMismatchError`.
    """
    if line is not None and model_of(document) != line.model:
        asked = "this host resolves" if line.pinned else "the state read for it is"
        raise LineMismatchError(
            f"{source}: a document of model line {show(model_of(document))!r}; {asked} "
            f"line {show(line.model)!r}" + (" (--model)" if line.pinned else "")
        )
    try:
        envelope.check_signed(
            document.signed,
            now=now,
            min_version=floor.version if floor else 0,
            expected_class=host_class,
            source=source,
            max_validity_s=max_validity_s,
        )
    except RollbackError as exc:
        raise RollbackError(f"{exc}{_floor_note(line)}") from exc
    _check_fork(document, floor, source)


def _floor_note(line: Line | None) -> str:
    """Where the floor that refused a document is kept, and how a person finds it."""
    if line is None or line.state_file is None:
        return ""
    note = (
        f"; that floor is model line {show(line.model)!r}'s under this key, kept in "
        f"{line.state_file} (each model line has its own; --state-dir chooses the directory)"
    )
    if line.unknown_floor is not None:
        note += (
            f"; it includes {line.unknown_floor}, kept by an earlier resolve-artifact for a line "
            "it cannot name: if that floor is not this model's, remove the file"
        )
    return note


def _from_last_known_good(
    kept: _Document | None,
    messages: list[str],
    note: str,
    floor: Accepted | None,
    *,
    now: str,
    host: HostRuntime,
    host_class: str | None,
    facts: Callable[[], Any] | None,
    grace_s: float,
    uri_schemes: Sequence[str],
    host_id: str | None = None,
) -> Outcome:
    """The answer from the last-known-good, when the new document was refused."""
    if kept is None:
        messages.append("no usable last-known-good manifest to fall back to; failing closed")
        return Outcome(EXIT_VERIFY, None, messages, None, None, floor)
    notes = [{"code": "last_known_good", "message": note}]
    stale = False
    expires = kept.signed["expires"]
    if expires <= now:
        late = (envelope.parse_time(now) - envelope.parse_time(expires)).total_seconds()
        days = f"{grace_s / 86400:g}-day"
        if late > grace_s:
            messages.append(
                f"the last-known-good manifest (version {kept.signed['version']}) expired at "
                f"{expires}, longer ago than the {days} grace; failing closed (publish a fresh "
                "manifest, or raise --grace-days)"
            )
            return Outcome(EXIT_VERIFY, None, messages, None, None, floor)
        stale = True
        messages.append(
            f"warning: the last-known-good manifest expired at {expires}; serving it within the "
            f"{days} grace, with exit {EXIT_STALE} until a fresh manifest arrives"
        )
        notes.append({"code": "stale_last_known_good", "message": f"expired at {expires}"})
    messages.append(f"using the last-known-good manifest, version {kept.signed['version']}")
    try:
        code, answer, more = _decide(kept, host_class, facts, host, notes, uri_schemes, host_id)
    except _Refused as exc:
        return Outcome(exc.code, None, [*messages, str(exc)], None, None, floor)
    if stale and code == EXIT_RESOLVED:
        code = EXIT_STALE
    answer["source"] = "last-known-good"
    return Outcome(code, answer, messages + more, None, None, floor)
