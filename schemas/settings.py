"""Session settings in the one form a class's qualified settings and a host's live session are
compared in.

A class is qualified under its ``provider`` section (threads, execution mode, graph optimisation
level, session config entries, provider options, CPU affinity): those change speed and, for some
(``session.x64quantprecision``, the graph level), numbers. The manifest entry carries the
section; ``resolve-artifact --json`` answers it as ``settings`` in this form;
``manifest.host_events.record_session`` reads the same keys back from the live session and
reports them; ``qualify telemetry check`` alerts ``settings_differ`` on any difference.

More: docs/internals.md, ``schemas.settings``.

Standard library only at import: ``resolve-artifact`` and the host-side event writer use it.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's own flag without importing typing (a host's resolve loads this)
if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "CORE_KEYS",
    "MAX_SETTINGS_CHARS",
    "WATCHED_CONFIG_KEYS",
    "decode_settings",
    "encode_settings",
    "option_text",
    "qualified_settings",
    "settings_differences",
]

CORE_KEYS = ("execution_mode", "graph_optimization_level", "inter_op_threads", "intra_op_threads")
"""Keys every settings map has."""

WATCHED_CONFIG_KEYS = (
    "session.disable_cpu_ep_fallback",
    "session.inter_op.allow_spinning",
    "session.intra_op.allow_spinning",
    "session.intra_op_thread_affinities",
    "session.set_denormal_as_zero",
    "session.x64quantprecision",
)
"""Session config entries a host reports even where the class does not set them: each changes
speed or numbers, so a host that sets one the class was not qualified with differs."""

MAX_SETTINGS_CHARS = 4096
"""The longest encoded settings an event may carry."""

_LEVELS = ("disable", "basic", "extended", "all")
_MODES = ("sequential", "parallel")


def option_text(value: object) -> str:
    """An option value as onnxruntime holds it: text, booleans as ``1``/``0``."""
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _count(value: object) -> str:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else "0"


def qualified_settings(provider: Mapping[str, object]) -> dict[str, str]:
    """The settings of a provider section (a project class's ``provider`` dumped, or a manifest
    entry's ``provider`` as JSON), in the compared form."""
    level = provider.get("graph_optimization_level")
    mode = provider.get("execution_mode")
    out = {
        "intra_op_threads": _count(provider.get("intra_op_threads")),
        "inter_op_threads": _count(provider.get("inter_op_threads")),
        "execution_mode": mode if isinstance(mode, str) and mode in _MODES else "sequential",
        "graph_optimization_level": level if isinstance(level, str) and level in _LEVELS else "all",
    }
    config = provider.get("session_config")
    if isinstance(config, dict):
        for key, value in config.items():
            out[f"config:{key}"] = option_text(value)
    if provider.get("strict_fallback") is True:
        out["config:session.disable_cpu_ep_fallback"] = "1"
    options = provider.get("provider_options")
    if isinstance(options, dict):
        for name, values in options.items():
            if isinstance(values, dict):
                for key, value in values.items():
                    out[f"option:{name}:{key}"] = option_text(value)
    affinity = provider.get("cpu_affinity")
    if isinstance(affinity, list) and affinity:
        cpus = sorted({c for c in affinity if isinstance(c, int) and not isinstance(c, bool)})
        out["cpu_affinity"] = ",".join(str(c) for c in cpus)
    return dict(sorted(out.items()))


def encode_settings(settings: Mapping[str, str]) -> str:
    """One line of sorted, percent-encoded ``key=value`` pairs joined by ``;``."""
    from urllib.parse import quote  # not at import: resolve-artifact loads this module

    return ";".join(
        f"{quote(k, safe=':')}={quote(v, safe=':,')}" for k, v in sorted(settings.items())
    )


def decode_settings(text: str) -> dict[str, str]:
    """The map `encode_settings` wrote.

    Raises:
        ValueError: over `MAX_SETTINGS_CHARS`, a pair without ``=``, an empty or repeated key,
            or a core key missing.
    """
    from urllib.parse import unquote

    if len(text) > MAX_SETTINGS_CHARS:
        raise ValueError(f"settings longer than {MAX_SETTINGS_CHARS} characters")
    out: dict[str, str] = {}
    for pair in text.split(";") if text else []:
        key, sep, value = pair.partition("=")
        name = unquote(key)
        if not sep or not name:
            raise ValueError(f"settings pair {pair[:60]!r} is not key=value")
        if name in out:
            raise ValueError(f"settings key {name[:60]!r} appears twice")
        out[name] = unquote(value)
    missing = [k for k in CORE_KEYS if k not in out]
    if missing:
        raise ValueError(f"settings lack {', '.join(missing)}")
    return out


def settings_differences(qualified: Mapping[str, str], observed: Mapping[str, str]) -> list[str]:
    """What differs, one phrase per key (``intra_op_threads 4, qualified 2``): every key the
    qualified settings have, and every session config entry the host set that they lack."""
    keys = set(qualified) | {k for k in observed if k.startswith("config:")}
    out = []
    for key in sorted(keys):
        want, got = qualified.get(key), observed.get(key)
        if want != got:
            out.append(f"{key} {got if got is not None else 'unset'}, qualified {want or 'unset'}")
    return out
