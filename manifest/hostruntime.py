"""The onnxruntime a host has, told without importing it, and what an artifact requires of it.

Owns finding the installed onnxruntime distribution and its provider libraries on ``sys.path``
(or taking ``--runtime``/``--providers``), and the sentences saying why a host cannot run an
artifact's runtime and provider requirements. Standard library only: ``resolve-artifact`` imports
it at every service start. Does not read manifests (``manifest.lookup``).
"""

from __future__ import annotations

import fnmatch
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

__all__ = ["PROVIDER_LIBRARIES", "HostRuntime", "detect_runtime", "requirement_failures"]

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
