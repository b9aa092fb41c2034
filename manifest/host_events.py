"""What a deployed host writes: ``qualify-telemetry/1`` events, appended to a JSON-lines file.

Owns what a deployed host writes about the path its model takes: the event of a
``resolve-artifact`` decision (``event_from_resolution``), the sampled event of a live
onnxruntime session (``record_session``), and appending one line per event (``append_event``).
Does not own the event schema (``schemas.telemetry.TelemetryEvent`` and the published
``schemas/telemetry-event.schema.json``; a test keeps this module's output valid against it),
storing events (``matrix.telemetry.ingest``) or judging them (``qualify.telemetry.check``).

More: docs/internals.md, ``manifest.host_events``.

Standard library only, like ``manifest.resolve`` which imports it: it never imports
onnxruntime, pydantic or anything heavy. ``record_session`` takes the host's own session object
(duck-typed) and reads the runtime version from the ``onnxruntime`` module the host has already
imported, if any.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from schemas.rules import fallback_count
from schemas.settings import WATCHED_CONFIG_KEYS, encode_settings

if TYPE_CHECKING:  # resolve-artifact imports this module at start-up: keep datetime off it
    from datetime import datetime

__all__ = [
    "FORMAT",
    "PLACEMENT_OPTION",
    "append_event",
    "cohort_fields",
    "encode_event",
    "event_from_resolution",
    "format_time",
    "host_id",
    "placement_of",
    "record_session",
    "session_settings",
]

FORMAT = "qualify-telemetry/1"
"""The event format every line carries."""

PLACEMENT_OPTION = "session.record_ep_graph_assignment_info"
"""The session config entry that must be "1" for actual placement to be readable."""


def format_time(moment: float | datetime | None = None) -> str:
    """An event time: ``YYYY-MM-DDTHH:MM:SS.mmmZ`` (UTC, milliseconds).

    Args:
        moment: Unix seconds, an aware datetime, or None for now.

    Returns:
        The formatted time.

    Raises:
        ValueError: a naive datetime (its zone is unknown).
    """
    if moment is None or isinstance(moment, int | float):
        seconds = time.time() if moment is None else float(moment)
    else:
        if moment.tzinfo is None:
            raise ValueError("event times must be timezone-aware (UTC)")
        seconds = moment.timestamp()
    whole = math.floor(seconds)
    millis = min(round((seconds - whole) * 1000), 999)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{millis:03d}Z"


def host_id() -> str:
    """This host's id: ``$QUALIFY_HOST_ID``, else the node name."""
    return os.environ.get("QUALIFY_HOST_ID") or os.uname().nodename or "unknown"


def encode_event(event: Mapping[str, Any]) -> bytes:
    """One event as its JSON line: sorted keys, no spaces, UTF-8, ending in a newline.

    Raises:
        ValueError: the event holds something JSON cannot (NaN, a non-string key).
    """
    text = json.dumps(event, separators=(",", ":"), sort_keys=True, allow_nan=False)
    return (text + "\n").encode("utf-8")


def append_event(
    path: str | os.PathLike[str], event: Mapping[str, Any], *, fsync: bool = False
) -> None:
    """Append one event as one JSON line (one ``write`` on an ``O_APPEND`` descriptor).

    Args:
        path: The JSON-lines file; created (mode 0644) if missing.
        event: The event (see ``schemas.telemetry.TelemetryEvent``).
        fsync: Force the line to disk before returning.

    Raises:
        OSError: the file cannot be opened or written, or is not a regular file: a named pipe,
            a socket or a device is refused without waiting on it (opened non-blocking), so
            that telemetry never holds up the service start it rides on.
        ValueError: the event holds something JSON cannot (NaN, a non-string key).
    """
    line = encode_event(event)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = stat.S_IFREG  # created below
    _refuse_unless_regular(path, mode)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o644)
    try:
        _refuse_unless_regular(path, os.fstat(fd).st_mode)  # what was opened, if it changed
        written = os.write(fd, line)
        if written != len(line):  # a short write on a full disk: say so rather than cut a line
            raise OSError(f"{os.fspath(path)}: wrote {written} of {len(line)} bytes of an event")
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _refuse_unless_regular(path: str | os.PathLike[str], mode: int) -> None:
    if not stat.S_ISREG(mode):
        what = "a named pipe (FIFO)" if stat.S_ISFIFO(mode) else "a device, a socket or a folder"
        raise OSError(errno.EINVAL, f"not a regular file: it is {what}", os.fspath(path))


def event_from_resolution(
    answer: Mapping[str, Any],
    *,
    runtime_package: str | None,
    runtime_version: str | None,
    when: str,
    host: str | None = None,
) -> dict[str, Any]:
    """The event of one ``resolve-artifact`` answer (what it decided to serve; nothing ran yet).

    Args:
        answer: ``resolve``'s answer (the ``--json`` object): host_class, decision, artifact,
            manifest_version, model and providers.
        runtime_package: The host's onnxruntime distribution, if known.
        runtime_version: Its version, if known ("unknown" is written otherwise).
        when: The event time, ``format_time`` style.
        host: The host id; defaults to ``host_id()``.

    Returns:
        The event, ready for ``append_event``.
    """
    artifact = answer.get("artifact")
    digest = artifact.get("digest") if isinstance(artifact, Mapping) else None
    version = answer.get("manifest_version")
    model = answer.get("model")
    return {
        "format": FORMAT,
        "time": when,
        "source": "resolve",
        "host_id": host or host_id(),
        "host_class": str(answer.get("host_class")),
        "model_digest": digest,
        "runtime_revision": runtime_version or "unknown",
        "runtime_package": runtime_package,
        "providers": [str(p) for p in answer.get("providers") or []],
        "placement": "requested",
        "nodes_per_provider": None,
        "fallback_nodes": None,
        "latency_ms": None,
        "manifest_version": version if isinstance(version, int) and version >= 1 else None,
        "decision": answer.get("decision"),
        "model": model if isinstance(model, str) and model else None,
        **cohort_fields(answer.get("cohort")),
    }


def cohort_fields(cohort: object) -> dict[str, str | None]:
    """An event's ``rollout`` and ``cohort`` from resolve-artifact's ``cohort`` answer (its
    ``--json`` field: the rollout id and whether this host is a member); both null without a
    rollout."""
    if not isinstance(cohort, Mapping) or not isinstance(cohort.get("rollout"), str):
        return {"rollout": None, "cohort": None}
    return {
        "rollout": str(cohort["rollout"]),
        "cohort": "canary" if cohort.get("member") is True else "rest",
    }


def placement_of(session: Any) -> dict[str, int] | None:
    """Nodes per provider of a live session, or None when the session did not record them.

    Args:
        session: An ``onnxruntime.InferenceSession`` (any object with
            ``get_provider_graph_assignment_info()`` returning subgraphs that have ``ep_name``
            and ``get_nodes()``).

    Returns:
        ``{provider: nodes}`` sorted by provider, or None: the method is missing (onnxruntime
        older than 1.23) or the session was created without ``PLACEMENT_OPTION`` set to "1".
    """
    getter = getattr(session, "get_provider_graph_assignment_info", None)
    if getter is None:
        return None
    try:
        subgraphs = getter()
    except Exception:  # onnxruntime raises its own Fail when the option was not set
        return None
    counts: dict[str, int] = {}
    for subgraph in subgraphs:
        name = str(subgraph.ep_name)
        counts[name] = counts.get(name, 0) + len(subgraph.get_nodes())
    return dict(sorted(counts.items()))


_LEVEL_NAMES = {0: "disable", 1: "basic", 2: "extended", 99: "all"}


def _config_entries(options: Any, keys: Iterable[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for key in keys:
        try:
            found[f"config:{key}"] = str(options.get_session_config_entry(key))
        except Exception:  # onnxruntime raises when the entry is not set
            continue
    return found


def _provider_entries(session: Any, qualified: Mapping[str, str]) -> dict[str, str]:
    wanted = [k.split(":", 2) for k in qualified if k.startswith("option:")]
    if not wanted:
        return {}
    try:
        live = session.get_provider_options()
    except Exception:
        return {}
    found: dict[str, str] = {}
    for _, provider, key in (w for w in wanted if len(w) == 3):
        values = live.get(provider) if isinstance(live, dict) else None
        if isinstance(values, dict) and key in values:
            found[f"option:{provider}:{key}"] = str(values[key])
    return found


def session_settings(
    session: Any, qualified: Mapping[str, str] | None = None
) -> dict[str, str] | None:
    """The settings a live session runs with, in `schemas.settings` form, read back from the
    session itself (``get_session_options()``, ``get_provider_options()``), not from what the
    caller meant to set.

    Args:
        session: The live ``onnxruntime.InferenceSession`` (duck-typed).
        qualified: resolve-artifact's ``settings`` answer: the session config entries and
            provider options it names are read too, and the process's CPU affinity where it
            names one.

    Returns:
        The settings, or None when the session cannot report them (no
        ``get_session_options``).
    """
    getter = getattr(session, "get_session_options", None)
    if getter is None:
        return None
    try:
        options = getter()
        mode = str(options.execution_mode)
        out = {
            "intra_op_threads": str(int(options.intra_op_num_threads)),
            "inter_op_threads": str(int(options.inter_op_num_threads)),
            "execution_mode": "parallel" if "PARALLEL" in mode.upper() else "sequential",
            "graph_optimization_level": _LEVEL_NAMES.get(
                int(options.graph_optimization_level), "all"
            ),
        }
    except Exception:
        return None
    qualified = qualified or {}
    keys = {*WATCHED_CONFIG_KEYS, *(k[7:] for k in qualified if k.startswith("config:"))}
    out.update(_config_entries(options, sorted(keys)))
    out.update(_provider_entries(session, qualified))
    if "cpu_affinity" in qualified and hasattr(os, "sched_getaffinity"):
        out["cpu_affinity"] = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    return dict(sorted(out.items()))


def _runtime_version() -> str:
    module = sys.modules.get("onnxruntime")  # the host's own import; never imported here
    version = getattr(module, "__version__", None)
    return str(version) if version else "unknown"


def record_session(
    session: Any,
    *,
    path: str | os.PathLike[str],
    host_class: str,
    model_digest: str | None,
    manifest_version: int | None,
    expected_provider: str,
    latency_ms: float | None = None,
    sample_rate: float = 0.01,
    rng: Callable[[], float] | None = None,
    host: str | None = None,
    when: float | datetime | None = None,
    runtime_revision: str | None = None,
    runtime_package: str | None = None,
    decision: str | None = None,
    cohort: Mapping[str, Any] | None = None,
    settings: Mapping[str, str] | None = None,
    model: str | None = None,
    fsync: bool = False,
) -> dict[str, Any] | None:
    """Append, with probability ``sample_rate``, the event of a live session's inference.

    Call it after each timed inference (or once per session with ``sample_rate=1``). When the
    session recorded its placement, the event lists the providers that received nodes and the
    nodes off ``expected_provider``; otherwise it lists ``session.get_providers()`` with
    ``placement: "registered"`` and no fallback count (placement unknown).

    Args:
        session: The live ``onnxruntime.InferenceSession`` (duck-typed).
        path: The JSON-lines file to append to.
        host_class: The class this host resolved as.
        model_digest: ``sha256:<hex>`` of the model the session runs.
        manifest_version: The manifest version the host resolved.
        expected_provider: The class's expected provider (the manifest entry's
            ``provider.expected``).
        latency_ms: The sampled inference's latency, if timed.
        sample_rate: Probability of writing this call's event, 0..1.
        rng: Returns a float in [0, 1); an event is written when it is below ``sample_rate``
            (default ``random.random``, imported only here: resolve never samples).
        host: The host id; defaults to ``host_id()``.
        when: The event time; defaults to now.
        runtime_revision: The onnxruntime version; defaults to the imported module's.
        runtime_package: The onnxruntime distribution, if known.
        decision: The manifest's decision for the class, if known.
        cohort: resolve-artifact's ``cohort`` answer, when the class is in a staged rollout:
            the event says which rollout and which side of it this host is on.
        settings: resolve-artifact's ``settings`` answer (the settings the class was qualified
            with). The event reports the settings the session really runs with
            (`session_settings`, which reads the keys these name too); ``qualify telemetry
            check`` alerts ``settings_differ`` where they differ.
        model: The model line the session serves (resolve-artifact's ``model`` answer, the
            manifest's ``model``): a host serving several models writes them into one file,
            and ``qualify telemetry check`` judges each line's events only against its own
            manifests. Without it an event is attributed by its digest.
        fsync: Force the line to disk.

    Returns:
        The event written, or None when this call was not sampled.

    Raises:
        ValueError: ``sample_rate`` outside [0, 1], a negative or non-finite latency.
        OSError: the file cannot be written.
    """
    if not 0.0 <= sample_rate <= 1.0:
        raise ValueError(f"sample_rate must be within [0, 1], got {sample_rate!r}")
    if latency_ms is not None and not (math.isfinite(latency_ms) and latency_ms >= 0):
        raise ValueError(f"latency_ms must be a finite number >= 0, got {latency_ms!r}")
    if rng is None:
        import random

        rng = random.random
    if rng() >= sample_rate:
        return None
    event = _session_event(session, expected_provider, latency_ms)
    event.update(
        {
            "time": format_time(when),
            "host_id": host or host_id(),
            "host_class": host_class,
            "model_digest": model_digest,
            "runtime_revision": runtime_revision or _runtime_version(),
            "runtime_package": runtime_package,
            "manifest_version": manifest_version,
            "decision": decision,
            **cohort_fields(cohort),
        }
    )
    if model:
        event["model"] = model
    observed = session_settings(session, settings)
    if observed is not None:
        event["settings"] = encode_settings(observed)
    append_event(path, event, fsync=fsync)
    return event


def _session_event(
    session: Any, expected_provider: str, latency_ms: float | None
) -> dict[str, Any]:
    """What a session event says of the session itself: where its nodes ran, and how fast."""
    nodes = placement_of(session)
    providers: Sequence[str]
    if nodes is not None:
        providers = [name for name, count in nodes.items() if count > 0]
        fallback: int | None = fallback_count(nodes, expected_provider)
    else:
        providers = [str(p) for p in session.get_providers()]
        fallback = None
    return {
        "format": FORMAT,
        "source": "session",
        "providers": list(providers),
        "placement": "actual" if nodes is not None else "registered",
        "nodes_per_provider": nodes,
        "fallback_nodes": fallback,
        "latency_ms": None if latency_ms is None else round(float(latency_ms), 6),
    }
