"""``resolve-artifact``: on a host, which artifact does this host run? Standard library only.

Owns the host side of a release: read a manifest (or this class's per-class document), check it
(size, Ed25519 signature by the trusted key, type, expiry, a version not lower than the last one
this host accepted, the class name of a per-class document), keep the last-known-good copy, find
this host's class, check the host's runtime can run the answer, and print it. Does not own the
checks themselves (``manifest.envelope``) or the match rules (``manifest.hostmatch``).

It runs at every service start on every host, so it imports the standard library plus
``cryptography`` (lazily, for the signature), never pydantic, click, duckdb, pandas, pyarrow,
jinja2 or onnxruntime; a test runs it in a subprocess and looks at ``sys.modules``.

Usage::

    resolve-artifact --manifest PATH [--host-class NAME] [--pubkey K] [--state-dir DIR]
                     [--verify-file PATH] [--json] [--runtime PKG==VER] [--providers A,B]
                     [--emit-telemetry FILE] [--host-id ID] [--max-bytes N]

``--manifest`` is a manifest file, one per-class document, or a directory of per-class documents
(then ``--host-class`` picks ``DIR/<class>.json``). ``--pubkey`` defaults to ``$QUALIFY_PUBKEY``;
``--state-dir`` to ``$QUALIFY_STATE_DIR`` (without one, there is no rollback protection across
runs and no last-known-good). ``--emit-telemetry FILE`` (or ``$QUALIFY_TELEMETRY``) appends one
``qualify-telemetry/1`` event for the answer (``manifest.telemetry``): class, served digest, the
requested providers this host has, runtime revision and manifest version; a failure to append
warns on stderr and never changes the exit code. The ``--json`` answer's ``providers`` lists the
served artifact's execution providers that this host has, in order (empty on hold).

Exit codes:

* 0 resolved: the artifact's URI is printed (with ``--json``, an object).
* 2 usage error, or this host's class is unknown (not in the manifest, or no/several matches).
* 3 the class is on hold: deploy nothing new.
* 4 verification failed and there is no usable last-known-good manifest, or ``--verify-file``
  does not match the digest.
* 5 no compatible artifact: neither the entry's artifact nor its rollback can run on this
  host's runtime and providers.

When the manifest fails a check, the last-known-good manifest in the state directory is used
instead and stderr says why. The last-known-good is used even if it has expired since (with a
warning): it is the newest manifest this host ever verified, so an attacker gains nothing by
forcing it, and refusing it would stop every service start once releases stop flowing.

How the host's runtime is found without importing onnxruntime: ``--runtime PKG==VER`` (or
``$QUALIFY_RUNTIME``), else the first ``onnxruntime*.dist-info`` directory on ``sys.path`` of the
Python running this command. Providers: ``--providers`` (or ``$QUALIFY_PROVIDERS``), else
``CPUExecutionProvider`` plus one per provider library shipped in that package's ``capi``
directory (``libonnxruntime_providers_cuda.so`` means ``CUDAExecutionProvider``). Like
``onnxruntime.get_available_providers()``, this says a provider is built, not that its device
works; providers linked into the core library (CoreML, XNNPACK, Azure) are not seen, so pass
``--providers`` where they matter. The entry's ``build_info`` is not checked here.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from manifest import envelope
from manifest.errors import ExpiredError, KeyFileError, VerificationError

__all__ = [
    "EXIT_HOLD",
    "EXIT_INCOMPATIBLE",
    "EXIT_RESOLVED",
    "EXIT_UNKNOWN",
    "EXIT_USAGE",
    "EXIT_VERIFY",
    "PROVIDER_LIBRARIES",
    "HostRuntime",
    "Outcome",
    "detect_runtime",
    "main",
    "requirement_failures",
    "resolve",
]

EXIT_RESOLVED = 0
EXIT_USAGE = 2
EXIT_UNKNOWN = 2
EXIT_HOLD = 3
EXIT_VERIFY = 4
EXIT_INCOMPATIBLE = 5

STATE_FILE = "state.json"
LKG_FILE = "last-known-good.json"

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
    accepted_version: int | None


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
    try:
        names = sorted(os.listdir(entry or "."))
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
    from fnmatch import fnmatchcase

    found: list[str] = []
    want_pkg = _normalise(str(runtime.get("package") or "onnxruntime"))
    pattern = str(runtime.get("version") or "*")
    if host.package is None or host.version is None:
        found.append(f"no onnxruntime distribution found on this host (needs {want_pkg} {pattern})")
    else:
        if host.package != want_pkg:
            found.append(f"runtime package is {host.package}, needs {want_pkg}")
        if not fnmatchcase(host.version, pattern):
            found.append(f"onnxruntime version is {host.version}, needs {pattern}")
    expected = provider.get("expected")
    if expected and expected not in host.providers:
        have = ", ".join(sorted(host.providers)) or "none"
        found.append(f"provider {expected} is not available (available: {have})")
    return found


def _read_bounded(path: Path, max_bytes: int) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(max_bytes + 1)


def _accept(
    raw: bytes,
    public_raw: bytes,
    *,
    now: str,
    min_version: int,
    host_class: str | None,
    max_bytes: int,
    source: str,
) -> dict[str, Any]:
    signed = envelope.check_envelope(
        raw, public_raw, source=source, max_bytes=max_bytes, only_class=host_class
    )
    envelope.check_signed(
        signed, now=now, min_version=min_version, expected_class=host_class, source=source
    )
    return signed


def _entries(signed: Mapping[str, Any]) -> dict[str, Any]:
    if signed["type"] == envelope.CLASS_TYPE:
        return {signed["host_class"]: signed["entry"]}
    entries: dict[str, Any] = signed["entries"]
    return entries


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
                EXIT_VERIFY, f"entry {host_class!r} names class {entry.get('host_class')!r}"
            )
        return host_class, entry
    if facts is None:
        raise _Refused(EXIT_UNKNOWN, "no --host-class and host detection is off")
    from manifest.hostmatch import match_failures

    host = facts()
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
    raise _Refused(
        EXIT_UNKNOWN,
        f"this host matches several classes ({', '.join(sorted(matches))}); pass --host-class",
    )


def _pointer(art: Any) -> dict[str, Any] | None:
    if not isinstance(art, dict):
        return None
    return {"digest": art.get("digest"), "uri": art.get("uri")}


def _usable(provider: Mapping[str, Any], host: HostRuntime) -> list[str]:
    """The requirement's execution providers this host has, in the order they are requested."""
    wanted = provider.get("execution_providers") or []
    return [str(p) for p in wanted if p in host.providers]


def _answer(
    signed: Mapping[str, Any],
    host_class: str,
    entry: Mapping[str, Any],
    host: HostRuntime,
    notes: list[dict[str, str]],
) -> tuple[int, dict[str, Any], list[str]]:
    messages: list[str] = []
    reasons = list(entry.get("reasons") or []) + notes
    decision = entry.get("decision")
    rollback = entry.get("rollback")
    answer: dict[str, Any] = {
        "host_class": host_class,
        "decision": decision,
        "artifact": None,
        "rollback": _pointer(rollback),
        "manifest_version": signed["version"],
        "release": signed.get("release"),
        "served": None,
        "providers": [],
        "reasons": reasons,
    }
    if decision == "hold":
        messages.append(f"class {host_class!r} is on hold: {entry.get('summary', '')}")
        return EXIT_HOLD, answer, messages
    artifact = entry.get("artifact")
    if decision not in ("candidate", "baseline") or not isinstance(artifact, dict):
        raise _Refused(
            EXIT_VERIFY, f"entry {host_class!r} has no artifact for decision {decision!r}"
        )
    provider = entry.get("provider") or {}
    failures = requirement_failures(host, entry.get("runtime") or {}, provider)
    if not failures:
        answer["artifact"], answer["served"] = _pointer(artifact), "artifact"
        answer["providers"] = _usable(provider, host)
        return EXIT_RESOLVED, answer, messages
    why = "; ".join(failures)
    reasons.append({"code": "runtime_incompatible", "message": f"{artifact.get('name')}: {why}"})
    if isinstance(rollback, dict):
        rb_provider = rollback.get("provider") or provider
        rb_failures = requirement_failures(
            host, rollback.get("runtime") or entry.get("runtime") or {}, rb_provider
        )
        if not rb_failures:
            messages.append(
                f"{decision} {artifact.get('name')} cannot run here ({why}); answering with "
                f"rollback {rollback.get('name')}"
            )
            reasons.append(
                {"code": "served_rollback", "message": f"rollback {rollback.get('name')} fits"}
            )
            answer["artifact"], answer["served"] = _pointer(rollback), "rollback"
            answer["providers"] = _usable(rb_provider, host)
            return EXIT_RESOLVED, answer, messages
        why += f"; rollback {rollback.get('name')}: {'; '.join(rb_failures)}"
    messages.append(f"no compatible artifact for class {host_class!r}: {why}")
    return EXIT_INCOMPATIBLE, answer, messages


def resolve(
    raw: bytes | None,
    *,
    public_raw: bytes,
    now: str,
    host: HostRuntime,
    host_class: str | None = None,
    facts: Callable[[], Any] | None = None,
    accepted_version: int = 0,
    last_known_good: bytes | None = None,
    max_bytes: int = envelope.MAX_BYTES,
    source: str = "manifest",
    read_error: str | None = None,
) -> Outcome:
    """Decide the answer for this host: the core of ``resolve-artifact``, with no I/O.

    Args:
        raw: the manifest's bytes (``None`` when it could not be read: see ``read_error``).
        public_raw: the trusted Ed25519 public key, 32 raw bytes.
        now: reference time, ``YYYY-MM-DDTHH:MM:SSZ``.
        host: this host's runtime and providers.
        host_class: the class to resolve for; ``None`` detects it with ``facts``.
        facts: returns this host's ``hostmatch.HostFacts`` (called only for detection).
        accepted_version: the last version this host accepted.
        last_known_good: the last accepted document's bytes, if kept.
        max_bytes: largest document accepted.
        source: name of the manifest for messages.
        read_error: why ``raw`` could not be read.

    Returns:
        The outcome: exit code, answer (for ``--json``), messages for stderr, and the bytes and
        version to keep as last-known-good (``None`` when nothing new was accepted).
    """
    messages: list[str] = []
    notes: list[dict[str, str]] = []
    accepted: bytes | None = None
    signed: dict[str, Any] | None = None
    failure: VerificationError | None = None
    if raw is not None:
        try:
            signed = _accept(
                raw,
                public_raw,
                now=now,
                min_version=accepted_version,
                host_class=host_class,
                max_bytes=max_bytes,
                source=source,
            )
            accepted = raw
        except VerificationError as exc:
            failure = exc
    if signed is None:
        why = read_error if failure is None else str(failure)
        check = "unreadable" if failure is None else failure.code
        messages.append(f"refused {source}: {why}")
        if last_known_good is None:
            messages.append("no last-known-good manifest to fall back to; failing closed")
            return Outcome(EXIT_VERIFY, None, messages, None, None)
        try:
            signed = envelope.check_envelope(
                last_known_good,
                public_raw,
                source="last-known-good",
                max_bytes=len(last_known_good),
            )
            try:
                envelope.check_signed(signed, now=now, source="last-known-good")
            except ExpiredError as exc:
                messages.append(f"warning: {exc}; using it anyway, it is the newest this host has")
        except VerificationError as exc:
            messages.append(f"the last-known-good manifest is unusable too: {exc}; failing closed")
            return Outcome(EXIT_VERIFY, None, messages, None, None)
        messages.append(f"using the last-known-good manifest, version {signed['version']}")
        notes.append({"code": "last_known_good", "message": f"{check}: {why}"})
    try:
        name, entry = _find_class(signed, host_class, facts)
        code, answer, more = _answer(signed, name, entry, host, notes)
    except _Refused as exc:
        messages.append(str(exc))
        return Outcome(exc.code, None, messages, accepted, signed["version"] if accepted else None)
    answer["source"] = "manifest" if accepted is not None else "last-known-good"
    return Outcome(code, answer, messages + more, accepted, signed["version"] if accepted else None)


def _load_state(state_dir: Path) -> tuple[int, bytes | None]:
    try:
        version = int(json.loads((state_dir / STATE_FILE).read_bytes())["version"])
    except (OSError, ValueError, KeyError, TypeError):
        version = 0  # no state yet (or unreadable): no version floor
    try:
        lkg: bytes | None = (state_dir / LKG_FILE).read_bytes()
    except OSError:
        lkg = None
    return version, lkg


def _save_state(
    state_dir: Path, raw: bytes, version: int, old_version: int, old_lkg: bytes | None
) -> None:
    if old_version == version and old_lkg == raw:
        return  # the usual service start: nothing new, nothing written
    # Imported here, on the rare path that accepts a new manifest: keeps tempfile off start-up.
    from schemas.atomic import write_atomic

    state_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(state_dir / LKG_FILE, raw)
    write_atomic(state_dir / STATE_FILE, json.dumps({"version": version}))


def _file_digest(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def _emit(
    path: Path,
    answer: Mapping[str, Any],
    host: HostRuntime,
    host_id: str | None,
    started: float,
    say: Callable[[str], None],
) -> None:
    """Append the resolution's telemetry event; a failure warns and never changes the exit."""
    from manifest import telemetry

    event = telemetry.event_from_resolution(
        answer,
        runtime_package=host.package,
        runtime_version=host.version,
        when=telemetry.format_time(started),
        host=host_id,
    )
    try:
        telemetry.append_event(path, event)
    except (OSError, ValueError) as exc:
        say(f"warning: cannot append telemetry to {path} ({exc})")


def _parser() -> Any:
    import argparse

    p = argparse.ArgumentParser(
        prog="resolve-artifact",
        description="Print the artifact this host runs, from a signed release manifest. "
        "Exit codes: 0 resolved, 2 usage error or unknown class, 3 hold, "
        "4 verification failed and no last-known-good, 5 no compatible artifact.",
    )
    p.add_argument(
        "--manifest",
        required=True,
        type=Path,
        help="manifest file, per-class document, or directory of per-class documents",
    )
    p.add_argument("--host-class", help="class name (default: detect with the match rules)")
    p.add_argument(
        "--pubkey",
        type=Path,
        default=os.environ.get("QUALIFY_PUBKEY"),
        help="trusted Ed25519 public key, PEM (default $QUALIFY_PUBKEY)",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=os.environ.get("QUALIFY_STATE_DIR"),
        help="keeps the last accepted version and last-known-good manifest "
        "(default $QUALIFY_STATE_DIR)",
    )
    p.add_argument(
        "--verify-file",
        type=Path,
        help="check this local file's sha256 against the resolved artifact",
    )
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.add_argument(
        "--runtime",
        default=os.environ.get("QUALIFY_RUNTIME"),
        help="PACKAGE==VERSION of the serving runtime (default: the installed one)",
    )
    p.add_argument(
        "--providers",
        default=os.environ.get("QUALIFY_PROVIDERS"),
        help="comma-separated available providers (default: from the installed package)",
    )
    p.add_argument(
        "--emit-telemetry",
        type=Path,
        default=os.environ.get("QUALIFY_TELEMETRY"),
        help="append this resolution's telemetry event (one JSON line) to FILE "
        "(default $QUALIFY_TELEMETRY)",
    )
    p.add_argument(
        "--host-id",
        default=None,
        help="host id in telemetry events (default $QUALIFY_HOST_ID, else the node name)",
    )
    p.add_argument(
        "--max-bytes",
        type=int,
        default=envelope.MAX_BYTES,
        help=f"largest manifest accepted (default {envelope.MAX_BYTES})",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``resolve-artifact``; returns the exit code (see the module docstring)."""
    args = _parser().parse_args(argv)

    def say(message: str) -> None:
        print(f"resolve-artifact: {message}", file=sys.stderr)

    if args.pubkey is None:
        say("no trusted key: pass --pubkey FILE or set QUALIFY_PUBKEY")
        return EXIT_USAGE
    try:
        public_raw = envelope.parse_public_pem(
            Path(args.pubkey).read_text(encoding="ascii", errors="replace"), str(args.pubkey)
        )
        host = detect_runtime(runtime=args.runtime, providers=args.providers)
    except OSError as exc:
        say(f"{args.pubkey}: cannot read the public key ({exc.strerror})")
        return EXIT_USAGE
    except (KeyFileError, ValueError) as exc:
        say(str(exc))
        return EXIT_USAGE

    path: Path = args.manifest
    if path.is_dir():
        if not args.host_class:
            say(f"{path} is a directory of per-class documents; pass --host-class NAME")
            return EXIT_USAGE
        try:
            path = path / envelope.class_filename(args.host_class)
        except ValueError as exc:
            say(str(exc))
            return EXIT_USAGE

    state_dir: Path | None = args.state_dir
    version, lkg = _load_state(state_dir) if state_dir else (0, None)
    raw: bytes | None = None
    read_error = None
    try:
        raw = _read_bounded(path, args.max_bytes)
    except OSError as exc:
        read_error = f"cannot read it ({exc.strerror})"

    def facts() -> Any:
        from manifest.hostmatch import read_host_facts

        return read_host_facts(providers=host.providers)

    started = time.time()
    outcome = resolve(
        raw,
        public_raw=public_raw,
        now=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        host=host,
        host_class=args.host_class,
        facts=facts,
        accepted_version=version,
        last_known_good=lkg,
        max_bytes=args.max_bytes,
        source=str(path),
        read_error=read_error,
    )
    if state_dir is not None and outcome.accepted is not None and outcome.accepted_version:
        try:
            _save_state(state_dir, outcome.accepted, outcome.accepted_version, version, lkg)
        except OSError as exc:
            say(f"warning: cannot keep the last-known-good in {state_dir} ({exc.strerror})")
    if args.emit_telemetry is not None and outcome.answer is not None:
        _emit(args.emit_telemetry, outcome.answer, host, args.host_id, started, say)
    for message in outcome.messages:
        say(message)
    code, answer = outcome.code, outcome.answer
    if code == EXIT_RESOLVED and answer is not None and args.verify_file is not None:
        want = answer["artifact"]["digest"]
        try:
            got = _file_digest(args.verify_file)
        except OSError as exc:
            say(f"--verify-file {args.verify_file}: cannot read it ({exc.strerror})")
            return EXIT_VERIFY
        if got != want:
            say(
                f"--verify-file {args.verify_file}: sha256 is {got}, the manifest says {want}; "
                "do not load it"
            )
            return EXIT_VERIFY
    if answer is not None and args.json:
        print(json.dumps(answer, sort_keys=True))
    elif code == EXIT_RESOLVED and answer is not None:
        print(answer["artifact"]["uri"])
    return code


if __name__ == "__main__":
    sys.exit(main())
