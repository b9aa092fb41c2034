"""``resolve-artifact``: on a host, which artifact does this host run? Standard library and
``cryptography`` only (never pydantic, numpy, duckdb or onnxruntime: it runs at every service
start).

Owns the command: its line (argparse), the host's state directory and last-known-good kept per
model line (``manifest.hoststate``), ``--verify-file``, the telemetry event, and printing the
answer. The lookup itself is ``manifest.lookup``; the host's runtime, ``manifest.hostruntime``.
Every failure is an exit code, never a traceback: 0 resolved, 2 usage error or unknown class, 3
hold, 4 verification failed and no usable last-known-good, 5 no compatible artifact, 6 served from
an expired last-known-good within grace.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, NoReturn

from manifest import envelope, hoststate
from manifest.errors import KeyFileError
from manifest.hostruntime import HostRuntime, detect_runtime
from manifest.hoststate import Accepted
from manifest.hoststate import read_bounded as _read_bounded
from manifest.lookup import (
    DEFAULT_GRACE_DAYS,
    DEFAULT_MAX_VALIDITY_DAYS,
    DEFAULT_URI_SCHEMES,
    EXIT_RESOLVED,
    EXIT_STALE,
    EXIT_USAGE,
    EXIT_VERIFY,
    Fresh,
    Line,
    Outcome,
    model_of,
    record_of,
    resolve,
    show,
    verify_document,
    verify_fresh,
)

__all__ = ["main"]


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
    from cryptography.hazmat.primitives.hashes import SHA256, Hash

    h = Hash(SHA256())
    with os.fdopen(hoststate.open_regular(path)[0], "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return "sha256:" + h.finalize().hex()


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
        say(f"warning: cannot append telemetry to {path} ({show(str(exc))})")


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
                f"{show(text, 40)!r}: expected a number from {low:g} to {high:g}"
            )
        return value

    return parse


class _Parser(argparse.ArgumentParser):
    """argparse, with every usage error said on one line (``resolve-artifact: error: ...``,
    exit 2, by `_run`) rather than the usage block, and ``--help`` returning to `_run`."""

    def error(self, message: str) -> NoReturn:
        raise _Usage(show(message, 300))

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
        why = f"{pointer_file} holds {show(text[:40])}, not v<version>"
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
        say(f"internal error, failing closed ({type(exc).__name__}: {show(str(exc))})")
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
        kept = verify_document(
            data, public_raw, None, source="last-known-good", max_bytes=len(data)
        )
        envelope.check_signed(kept.signed, now=None, source="last-known-good")
        model = model_of(kept)
        if model is None:
            raise ValueError("a last-known-good without a model line")
        return model, record_of(kept)

    hoststate.migrate_legacy(state_dir, keyid, identify=identify, max_bytes=args.max_bytes, say=say)
    model = args.model or model_of(fresh.document) or hoststate.find_line(state_dir, keyid, source)
    if model is None:
        if fresh.document is None:
            say(
                f"note: no model line of this key was read from {show(args.manifest)} on this "
                "host before, so there is no last-known-good to fall back to (--model NAME "
                "names the line)"
            )
        return None
    return hoststate.load_line(
        state_dir, model, keyid, max_bytes=args.max_bytes, say=say, same_as=raw
    )


if __name__ == "__main__":
    sys.exit(main())
