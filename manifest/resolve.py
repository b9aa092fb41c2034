"""``resolve-artifact``: on a host, which artifact does this host run? Standard library and
``cryptography`` only (never pydantic, numpy, duckdb or onnxruntime: it runs at every service
start).

Owns the host side of a release: read a manifest, a per-class document or a per-class directory
bounded, check it (``manifest.envelope``), keep the rollback floor and last-known-good per model
line (``manifest.hoststate``), find this host's class (``manifest.hostmatch``), check the host's
runtime and the artifact URI, and print the answer. Every failure is an exit code, never a
traceback: 0 resolved, 2 usage error or unknown class, 3 hold, 4 verification failed and no usable
last-known-good, 5 no compatible artifact, 6 served from an expired last-known-good within grace.
"""

from __future__ import annotations

import argparse
import fnmatch
import gc
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple, NoReturn

from manifest import envelope, hoststate
from manifest.errors import (
    ForkError,
    KeyFileError,
    LineMismatchError,
    MalformedError,
    PointerMismatchError,
    RollbackError,
    VerificationError,
)
from manifest.hoststate import (
    LKG_FILE,
    STATE_FILE,
    Accepted,
    encode_state,
    parse_state,
)
from manifest.hoststate import read_bounded as _read_bounded

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
    "LKG_FILE",
    "PROVIDER_LIBRARIES",
    "STATE_FILE",
    "Accepted",
    "Fresh",
    "HostRuntime",
    "Line",
    "Outcome",
    "cohort_point",
    "detect_runtime",
    "encode_state",
    "main",
    "model_of",
    "parse_state",
    "requirement_failures",
    "resolve",
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

PROVIDER_LIBRARIES: dict[str, str] = {
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
    "nv_tensorrt_rtx": "NvTensorRTRTXExecutionProvider",
    "rocm": "ROCMExecutionProvider",
    "migraphx": "MIGraphXExecutionProvider",
    "openvino": "OpenVINOExecutionProvider",
    "dnnl": "DnnlExecutionProvider",
    "vitisai": "VitisAIExecutionProvider",
    "qnn": "QNNExecutionProvider",
    "cann": "CANNExecutionProvider",
}
"""Provider library suffix (``libonnxruntime_providers_<suffix>.so``) -> provider name."""

_NOT_RUNTIMES = ("onnxruntime-extensions", "onnxruntime-genai", "onnxruntime-tools")
"""Distributions named onnxruntime* that are not the runtime itself."""


class HostRuntime(NamedTuple):
    """The onnxruntime this host has, as far as can be told without importing it."""

    package: str | None
    version: str | None
    providers: frozenset[str]
    source: str


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


def _normalise(name: str) -> str:
    return "-".join(name.lower().replace("_", "-").replace(".", "-").split("-"))


def _capi_providers(capi: str) -> set[str]:
    found = {"CPUExecutionProvider"}
    try:
        names = os.listdir(capi)
    except OSError:
        return found
    for name in names:
        stem = name.split(".", 1)[0]
        for prefix in ("libonnxruntime_providers_", "onnxruntime_providers_"):
            if stem.startswith(prefix) and stem[len(prefix) :] in PROVIDER_LIBRARIES:
                found.add(PROVIDER_LIBRARIES[stem[len(prefix) :]])
    return found


def _installed(entry: str) -> tuple[str, str, set[str]] | None:
    """(package, version, providers) of an onnxruntime distribution in one sys.path entry."""
    try:  # only the few names that can be one sorted (the standard library's folder has 200)
        names = sorted(n for n in os.listdir(entry or ".") if n.startswith("onnxruntime"))
    except OSError:
        return None
    for name in names:
        if not (name.startswith("onnxruntime") and name.endswith(".dist-info")):
            continue
        dist, _, version = name[: -len(".dist-info")].partition("-")
        package = _normalise(dist)
        if package.startswith(_NOT_RUNTIMES):
            continue
        return package, version, _capi_providers(os.path.join(entry or ".", "onnxruntime", "capi"))
    return None


def detect_runtime(
    *,
    runtime: str | None = None,
    providers: str | None = None,
    search_path: Sequence[str] | None = None,
) -> HostRuntime:
    """This host's onnxruntime distribution and providers, without importing onnxruntime.

    Args:
        runtime: ``PACKAGE==VERSION`` to use instead of looking (``--runtime``).
        providers: comma-separated provider names to use instead of looking (``--providers``).
        search_path: directories to look in (default ``sys.path``).

    Returns:
        The runtime; ``package``/``version`` are ``None`` when none is installed and none given.

    Raises:
        ValueError: ``runtime`` is not ``PACKAGE==VERSION``.
    """
    package: str | None = None
    version: str | None = None
    found: set[str] = set()
    source = "installed distribution"
    if runtime:
        pkg, sep, ver = runtime.partition("==")
        if not sep or not pkg.strip() or not ver.strip():
            raise ValueError(
                f"--runtime {runtime!r}: expected PACKAGE==VERSION, e.g. onnxruntime==1.32.0"
            )
        package, version, source = _normalise(pkg.strip()), ver.strip(), "--runtime"
    if not (runtime and providers):
        for entry in search_path if search_path is not None else sys.path:
            hit = _installed(entry)
            if hit is not None:
                if not runtime:
                    package, version = hit[0], hit[1]
                found = hit[2]
                break
    if providers:
        return HostRuntime(
            package,
            version,
            frozenset(p.strip() for p in providers.split(",") if p.strip()),
            source,
        )
    return HostRuntime(package, version, frozenset(found), source)


def requirement_failures(
    host: HostRuntime, runtime: Mapping[str, Any], provider: Mapping[str, Any]
) -> list[str]:
    """Why this host cannot run an artifact with these requirements; empty when it can.

    Args:
        host: the host's runtime.
        runtime: the requirement's ``runtime`` (``package``, ``version`` pattern, fnmatch-style).
        provider: the requirement's ``provider`` (its ``expected`` provider must be available).

    Returns:
        One sentence per unmet requirement.
    """
    found: list[str] = []
    want_pkg = _normalise(str(runtime.get("package") or "onnxruntime"))
    pattern = str(runtime.get("version") or "*")
    if host.package is None or host.version is None:
        found.append(f"no onnxruntime distribution found on this host (needs {want_pkg} {pattern})")
    else:
        if host.package != want_pkg:
            found.append(f"runtime package is {host.package}, needs {want_pkg}")
        if not _version_matches(host.version, pattern):
            found.append(f"onnxruntime version is {host.version}, needs {pattern}")
    expected = provider.get("expected")
    if expected and expected not in host.providers:
        have = ", ".join(sorted(host.providers)) or "none"
        found.append(f"provider {expected} is not available (available: {have})")
    return found


def _version_matches(version: str, pattern: str) -> bool:
    """Whether ``version`` matches the shell-style ``pattern`` (``1.32.*``)."""
    return fnmatch.fnmatchcase(version, pattern)


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


def _verify(
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


def _record(document: _Document, *known: Accepted | None) -> Accepted:
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
    mine = _record(document, floor)
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
                f"({len(entries)} classes); check --host-class",
            )
        if entry.get("host_class", host_class) != host_class:
            raise _Refused(
                EXIT_VERIFY, f"entry {host_class!r} names class {_show(entry.get('host_class'))}"
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
    shown = ", ".join(_show(m) for m in sorted(matches)[:10])
    raise _Refused(EXIT_UNKNOWN, f"this host matches several classes ({shown}); pass --host-class")


def _show(value: Any, limit: int = 120) -> str:
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
        raise _Refused(EXIT_VERIFY, f"{what}: digest {_show(digest)} is not sha256:<64 hex>")
    if (
        not isinstance(uri, str)
        or not 0 < len(uri) <= _MAX_URI
        or not all("!" <= ch <= "~" for ch in uri)
    ):
        raise _Refused(
            EXIT_VERIFY, f"{what}: uri {_show(uri)} is not a URI (printable ASCII, no spaces)"
        )
    scheme, sep, _ = uri.partition(":")
    if not sep or scheme.lower() not in schemes:
        raise _Refused(
            EXIT_VERIFY,
            f"{what}: uri {_show(uri)} has scheme {_show(scheme if sep else '')}, not one of "
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
    import hashlib  # only a host in a rollout pays for it

    digest = hashlib.sha256(f"qualify-cohort/1\0{rollout_id}\0{host_id}".encode()).digest()
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
        raise _Refused(EXIT_VERIFY, f"{where}.id is not a rollout id: {_show(rid)}")
    if isinstance(percent, bool) or not isinstance(percent, int) or not 0 <= percent <= 100:
        raise _Refused(EXIT_VERIFY, f"{where}.percent is not in 0..100: {_show(percent)}")
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise _Refused(EXIT_VERIFY, f"{where}.step is not a step number: {_show(step)}")
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
        messages.append(f"class {host_class!r} is on hold: {_show(entry.get('summary', ''), 300)}")
        return EXIT_HOLD, answer, messages
    from schemas.settings import qualified_settings  # an answer with an artifact needs it

    artifact = entry.get("artifact")
    if decision not in ("candidate", "baseline") or not isinstance(artifact, dict):
        raise _Refused(
            EXIT_VERIFY, f"entry {host_class!r} has no artifact for decision {_show(decision)}"
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
    name = _show(entry["artifact"].get("name"))
    reasons.append({"code": "runtime_incompatible", "message": f"{name}: {why}"})
    if isinstance(rollback, dict):
        rb_name = _show(rollback.get("name"))
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
            EXIT_VERIFY, f"unexpected content ({type(exc).__name__}: {_show(str(exc))})"
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
        return Fresh(_verify(raw, public_raw, host_class, source=source, max_bytes=max_bytes), None)
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
    floor = _floor([accepted, _record(kept, accepted) if kept else None], accepted_version)
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
    mine = _record(document, accepted, floor)
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
            else _verify(
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
                f"last-known-good: a document of model line {_show(model_of(kept))!r}, kept "
                f"where line {_show(line.model)!r}'s is (moved or copied there?)"
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
            f"{source}: a document of model line {_show(model_of(document))!r}; {asked} "
            f"line {_show(line.model)!r}" + (" (--model)" if line.pinned else "")
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
        f"; that floor is model line {_show(line.model)!r}'s under this key, kept in "
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


def _default_state_dir() -> str | None:
    env = os.environ.get("QUALIFY_STATE_DIR")
    if env:
        return env
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    if not os.path.isabs(base):
        return None
    return os.path.join(base, "qualify", "resolve")


def _writable(directory: str) -> bool:
    """Whether ``directory``, or the nearest existing folder above it, can be written."""
    probe = os.path.abspath(directory)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            return False
        probe = parent
    return os.path.isdir(probe) and os.access(probe, os.W_OK | os.X_OK)


def _file_digest(path: str) -> str:
    h = hashlib.sha256()
    with os.fdopen(hoststate.open_regular(path)[0], "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def _default_host_id() -> str:
    """``manifest.host_events.host_id()`` (a test keeps the two equal), without importing
    ``host_events`` and its ``json`` at every start."""
    return os.environ.get("QUALIFY_HOST_ID") or os.uname().nodename or "unknown"


def _emit(
    path: str,
    answer: Mapping[str, Any],
    host: HostRuntime,
    host_id: str | None,
    started: float,
    say: Callable[[str], None],
) -> None:
    """Append the resolution's telemetry event; a failure warns and never changes the exit."""
    try:
        from manifest import host_events

        event = host_events.event_from_resolution(
            answer,
            runtime_package=host.package,
            runtime_version=host.version,
            when=host_events.format_time(started),
            host=host_id,
        )
        host_events.append_event(path, event)
    except Exception as exc:  # telemetry is a side channel: it never stops a service start
        say(f"warning: cannot append telemetry to {path} ({_show(str(exc))})")


class _Usage(Exception):
    """Internal: a usage error, said on one line, exit 2."""


class _Help(Exception):
    """Internal: ``--help`` was asked for (and printed)."""


def _bounded(kind: Callable[[str], Any], low: float, high: float) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:  # NaN fails both comparisons
            raise argparse.ArgumentTypeError(
                f"{_show(text, 40)!r}: expected a number from {low:g} to {high:g}"
            )
        return value

    return parse


class _Parser(argparse.ArgumentParser):
    """argparse, with every usage error said on one line (``resolve-artifact: error: ...``,
    exit 2, by `_run`) rather than the usage block, and ``--help`` returning to `_run`."""

    def error(self, message: str) -> NoReturn:
        raise _Usage(_show(message, 300))

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise _Help


def _help_width() -> int:
    """What ``shutil.get_terminal_size`` would give argparse, less its margin of 2."""
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 80
    return (columns or 80) - 2


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's layout with its width given: ``add_argument`` makes a formatter to check each
    option, and one left to find its width imports shutil (and with it bz2 and lzma) at every
    service start."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=_help_width())


_SCHEMES = ",".join(DEFAULT_URI_SCHEMES)
_USAGE = """resolve-artifact --manifest PATH [--host-class NAME] [--pubkey FILE]
                        [--model NAME] [--state-dir DIR] [--no-state] [--verify-file PATH] [--json]
                        [--runtime PKG==VER] [--providers A,B] [--emit-telemetry FILE]
                        [--host-id ID] [--max-bytes N] [--grace-days D]
                        [--max-validity-days D] [--uri-schemes LIST]"""
_DESCRIPTION = """Print the artifact this host runs, from a signed release manifest. Exit codes: 0 resolved,
2 usage error or unknown class, 3 hold, 4 verification failed and no usable last-known-good,
5 no compatible artifact, 6 resolved from an expired last-known-good within its grace."""

MAX_ARGS = 128
"""Most command-line arguments accepted (every option once with its value is 31)."""


def _env(name: str) -> str | None:
    """An environment default; empty counts as unset."""
    return os.environ.get(name) or None


_TEXT_OPTIONS = (
    ("--manifest", "PATH", "manifest file, per-class document, or directory of per-class documents"),
    ("--host-class", "NAME", "class name (default: detect with the match rules)"),
    ("--pubkey", "FILE", "trusted Ed25519 public key, PEM (default $QUALIFY_PUBKEY)"),
    ("--model", "NAME", "the model line this service runs: a manifest of another is refused "
     "(default $QUALIFY_MODEL; unset: the manifest's own)"),
    ("--state-dir", "DIR", "keeps the rollback floor and the last-known-good manifest, one of "
     "each per model line and signing key (default $QUALIFY_STATE_DIR, else "
     "$XDG_STATE_HOME/qualify/resolve or ~/.local/state/qualify/resolve)"),
    ("--verify-file", "PATH", "check this local file's sha256 against the resolved artifact"),
    ("--runtime", "PKG==VER", "PACKAGE==VERSION of the serving runtime (default: the installed "
     "one, or $QUALIFY_RUNTIME)"),
    ("--providers", "A,B", "comma-separated available providers (default: from the installed "
     "package, or $QUALIFY_PROVIDERS)"),
    ("--emit-telemetry", "FILE", "append this resolution's telemetry event (one JSON line) to "
     "FILE (default $QUALIFY_TELEMETRY)"),
    ("--host-id", "ID", "this host's stable id: it places the host in or out of a staged "
     "rollout's cohort and names it in telemetry events (default $QUALIFY_HOST_ID, else the "
     "node name)"),
)  # fmt: skip
_ENV_DEFAULTS = {
    "model": "QUALIFY_MODEL",
    "pubkey": "QUALIFY_PUBKEY",
    "runtime": "QUALIFY_RUNTIME",
    "providers": "QUALIFY_PROVIDERS",
    "emit_telemetry": "QUALIFY_TELEMETRY",
}


def _parser() -> argparse.ArgumentParser:
    """The command line of ``resolve-artifact`` (defaults from the environment, read now)."""
    parser = _Parser(
        prog="resolve-artifact",
        usage=_USAGE,
        description=_DESCRIPTION,
        formatter_class=_Formatter,
    )
    for option, metavar, text in _TEXT_OPTIONS:
        dest = option[2:].replace("-", "_")
        default = _env(_ENV_DEFAULTS[dest]) if dest in _ENV_DEFAULTS else None
        required = option == "--manifest"
        parser.add_argument(option, metavar=metavar, help=text, default=default, required=required)
    parser.add_argument("--no-state", action="store_true", help="keep no state: no rollback "
                        "protection across runs and no last-known-good")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print a JSON object")
    numbers = (
        ("--max-bytes", "N", _bounded(int, 1, 2**31), envelope.MAX_BYTES,
         "largest manifest accepted"),
        ("--grace-days", "D", _bounded(float, 0, 3650), DEFAULT_GRACE_DAYS,
         "serve an expired last-known-good this long after it expired, with exit 6"),
        ("--max-validity-days", "D", _bounded(float, 1, 36500), DEFAULT_MAX_VALIDITY_DAYS,
         "refuse a manifest that expires further ahead than this"),
    )  # fmt: skip
    for option, metavar, kind, number, text in numbers:
        parser.add_argument(
            option,
            metavar=metavar,
            type=kind,
            default=number,
            help=f"{text} (default %(default)s)",
        )
    parser.add_argument("--uri-schemes", metavar="LIST", default=_SCHEMES,
                        help="artifact URI schemes a host may fetch (default %(default)s)")  # fmt: skip
    return parser


def _parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The command line, bounded in length, parsed by argparse.

    Raises:
        _Usage: a usage error, said on one line (exit 2).
        _Help: ``-h``/``--help`` (the help is printed).
    """
    if len(argv) > MAX_ARGS:
        raise _Usage(f"too many arguments ({len(argv)}); resolve-artifact takes at most {MAX_ARGS}")
    return _parser().parse_args([str(a) for a in argv])


def _manifest_path(path: str, host_class: str | None) -> tuple[str, str | None, int | None]:
    """The document to read for ``--manifest``; for a per-class directory, through its
    ``current`` pointer (or the flat layout without one). Returns (path, why unreadable, the
    version the pointer names: the document must be that one)."""
    if not os.path.isdir(path):
        return path, None, None
    if not host_class:
        raise _Usage(f"{path} is a directory of per-class documents; pass --host-class NAME")
    try:
        filename = envelope.class_filename(host_class)
    except ValueError as exc:
        raise _Usage(str(exc)) from exc
    pointer_file = os.path.join(path, envelope.CURRENT_POINTER)
    try:
        pointer = _read_bounded(pointer_file, 64)
    except FileNotFoundError:
        return os.path.join(path, filename), None, None  # the flat layout of earlier releases
    except OSError as exc:
        return os.path.join(path, filename), f"cannot read {pointer_file} ({exc.strerror})", None
    text = pointer.decode("ascii", "replace")
    if not envelope.is_pointer(text):
        why = f"{pointer_file} holds {_show(text[:40])}, not v<version>"
        return os.path.join(path, filename), why, None
    name = text.strip()
    return os.path.join(path, name, filename), None, int(name[1:])


def _state_dir(args: argparse.Namespace, say: Callable[[str], None]) -> str | None:
    if args.no_state:
        return None
    chosen = args.state_dir or _default_state_dir()
    if chosen is None or not _writable(chosen):
        where = f"{chosen}" if chosen is not None else "none (no home directory)"
        say(
            f"warning: no writable state directory ({where}): no rollback protection across "
            "runs and no last-known-good; pass --state-dir DIR, or --no-state to run so knowingly"
        )
        if chosen is None or not os.path.isdir(chosen):
            return None
    return chosen


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``resolve-artifact``; returns the exit code (see the module docstring).

    Never raises: every failure is one of the documented exit codes, with a message on stderr.
    Run as the command (no ``argv``: the console script, ``python -m``), it ends the process
    with that code once stdout and stderr are flushed (`_leave`).
    """
    code = _run(sys.argv[1:] if argv is None else argv)
    if argv is None:
        _leave(code)
    return code


def _leave(code: int) -> None:
    """End the process with ``code`` now (``os._exit``), without the interpreter's teardown.

    Everything the command does is done by then (files written atomically and closed); only
    stdout and stderr may hold text, flushed here. Skipped: freeing every module and object
    and OpenSSL's exit handlers, at every service start (its cost is in docs/benchmarks.md);
    nothing registered with ``atexit`` runs. If a stream cannot be flushed (a closed pipe), this
    returns and the interpreter exits as usual, reporting it.
    """
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return
    os._exit(code)


def _run(argv: Sequence[str]) -> int:
    """`main`'s work: the exit code, every failure mapped to one (never a traceback)."""

    def say(message: str) -> None:
        print(f"resolve-artifact: {message}", file=sys.stderr)

    # A run makes no reference cycles worth collecting, and a 1,000-class manifest makes enough
    # objects to trigger collections that walk all of them: paused for the run, then restored.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _main(argv, say)
    except _Usage as exc:
        say(f"error: {exc}")
        return EXIT_USAGE
    except _Help:
        return EXIT_RESOLVED
    except Exception as exc:  # a bug: fail closed, say what, never a traceback on a host
        say(f"internal error, failing closed ({type(exc).__name__}: {_show(str(exc))})")
        return EXIT_VERIFY
    finally:
        if collecting:
            gc.enable()


def _trusted_key_and_host(args: argparse.Namespace) -> tuple[bytes, HostRuntime]:
    """The trusted public key (raw Ed25519) and this host's runtime, or a usage error."""
    if args.pubkey is None:
        raise _Usage("no trusted key: pass --pubkey FILE or set QUALIFY_PUBKEY")
    try:
        key_text = _read_bounded(args.pubkey, 64 * 1024)
        public_raw = envelope.parse_public_pem(
            key_text.decode("ascii", errors="replace"), str(args.pubkey)
        )
        host = detect_runtime(runtime=args.runtime, providers=args.providers)
    except OSError as exc:
        raise _Usage(f"{args.pubkey}: cannot read the public key ({exc.strerror})") from exc
    except (KeyFileError, ValueError) as exc:
        raise _Usage(str(exc)) from exc
    return public_raw, host


def _digest(answer: Mapping[str, Any] | None) -> str:
    return "" if answer is None else str(answer["artifact"]["digest"])


def _file_matches(path: str, want: str, say: Callable[[str], None]) -> bool:
    """``--verify-file``: whether the file's sha256 is the one the manifest names."""
    try:
        got = _file_digest(path)
    except OSError as exc:
        say(f"--verify-file {path}: cannot read it ({exc.strerror})")
        return False
    if got != want:
        say(f"--verify-file {path}: sha256 is {got}, the manifest says {want}; do not load it")
        return False
    return True


def _main(argv: Sequence[str], say: Callable[[str], None]) -> int:
    args = _parse_args(argv)
    schemes = tuple(s.strip().lower() for s in str(args.uri_schemes).split(",") if s.strip())
    if not schemes:
        raise _Usage("--uri-schemes is empty; name at least one scheme, e.g. https")
    public_raw, host = _trusted_key_and_host(args)

    path, read_error, pointer = _manifest_path(args.manifest, args.host_class)
    state_dir = _state_dir(args, say)
    raw: bytes | None = None
    if read_error is None:
        try:
            raw = _read_bounded(path, args.max_bytes)
        except OSError as exc:
            read_error = f"cannot read it ({exc.strerror})"
    # Verified first: its model line says which of the host's states judges it.
    fresh = verify_fresh(raw, public_raw, args.host_class, source=path, max_bytes=args.max_bytes)
    source = hoststate.source_id(args.manifest)
    state = _line_state(state_dir, args, public_raw, fresh, source, raw, say)
    line = _line(state, args.model)

    def facts() -> Any:
        from manifest.hostmatch import read_host_facts

        return read_host_facts(providers=host.providers)

    started = time.time()
    moment = datetime.fromtimestamp(int(started), UTC)
    outcome = resolve(
        raw,
        public_raw=public_raw,
        now=envelope.format_time(moment),
        host=host,
        host_class=args.host_class,
        facts=facts,
        accepted=state.record if state is not None else None,
        last_known_good=state.last_known_good if state is not None else None,
        max_bytes=args.max_bytes,
        source=str(path),
        read_error=read_error,
        grace_s=args.grace_days * 86400,
        max_validity_s=args.max_validity_days * 86400,
        uri_schemes=schemes,
        host_id=args.host_id or _default_host_id(),
        line=line,
        pointer_version=pointer,
        fresh=fresh,
    )
    if state_dir is not None and state is not None:
        _keep(state_dir, state, outcome, source, say)
    if args.emit_telemetry is not None and outcome.answer is not None:
        _emit(args.emit_telemetry, outcome.answer, host, args.host_id, started, say)
    return _say_outcome(outcome, args, say)


def _say_outcome(outcome: Outcome, args: argparse.Namespace, say: Callable[[str], None]) -> int:
    """Say ``outcome``'s messages, check ``--verify-file``, print the answer; the exit code."""
    for message in outcome.messages:
        say(message)
    code, answer = outcome.code, outcome.answer
    served = code in (EXIT_RESOLVED, EXIT_STALE) and answer is not None
    if served and args.verify_file and not _file_matches(args.verify_file, _digest(answer), say):
        return EXIT_VERIFY
    if answer is not None and args.json:
        print(json.dumps(answer, sort_keys=True))
    elif served and answer is not None:
        print(answer["artifact"]["uri"])
    return code


def _line(state: hoststate.LineState | None, model: str | None) -> Line | None:
    """The line the run is judged as (`Line`): its state's, else ``--model``'s alone."""
    if state is not None:
        return Line(state.model, state.state_file, bool(model), state.unknown_floor)
    return Line(model, None, True) if model else None


def _keep(
    state_dir: str,
    state: hoststate.LineState,
    outcome: Outcome,
    source: str,
    say: Callable[[str], None],
) -> None:
    """Keep what ``outcome`` accepted in the line's state (`hoststate.save_line`)."""
    floor = outcome.record if outcome.accepted is not None else outcome.floor
    try:
        hoststate.save_line(state_dir, state, accepted=outcome.accepted, floor=floor, source=source)
    except OSError as exc:
        say(f"warning: cannot keep the last-known-good in {state_dir} ({exc.strerror})")


def _line_state(
    state_dir: str | None,
    args: argparse.Namespace,
    public_raw: bytes,
    fresh: Fresh,
    source: str,
    raw: bytes | None,
    say: Callable[[str], None],
) -> hoststate.LineState | None:
    """The state of the model line this run is judged by: ``--model``'s, else the verified
    document's own, else (a document that cannot say) the line last read from this manifest
    path. None without a state directory, or when no line can be told."""
    if state_dir is None:
        return None
    keyid = envelope.key_id(public_raw)

    def identify(data: bytes) -> tuple[str, Accepted]:
        kept = _verify(data, public_raw, None, source="last-known-good", max_bytes=len(data))
        envelope.check_signed(kept.signed, now=None, source="last-known-good")
        model = model_of(kept)
        if model is None:
            raise ValueError("a last-known-good without a model line")
        return model, _record(kept)

    hoststate.migrate_legacy(state_dir, keyid, identify=identify, max_bytes=args.max_bytes, say=say)
    model = args.model or model_of(fresh.document) or hoststate.find_line(state_dir, keyid, source)
    if model is None:
        if fresh.document is None:
            say(
                f"note: no model line of this key was read from {_show(args.manifest)} on this "
                "host before, so there is no last-known-good to fall back to (--model NAME "
                "names the line)"
            )
        return None
    return hoststate.load_line(
        state_dir, model, keyid, max_bytes=args.max_bytes, say=say, same_as=raw
    )


if __name__ == "__main__":
    sys.exit(main())
