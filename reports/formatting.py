"""The words for one value: durations, sizes, numbers, times, counts, digests, a found rate.

Pure text from a value; a missing value reads as missing (``NOT_MEASURED``), never as zero.
Light (standard library only at run time): ``qualify.run`` prints the same words.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from schemas.cell import OpenLoopResult
    from schemas.output import ManifestVersion

__all__ = [
    "NOT_MEASURED",
    "NOT_RECORDED",
    "VERDICT_WORDS",
    "bare_ms",
    "mb",
    "ms",
    "number",
    "open_loop_text",
    "plural",
    "provider_name",
    "publish_reason",
    "published_by",
    "short_digest",
    "tolerance",
    "utc_minute",
]

NOT_MEASURED = "not measured"
"""What the page says wherever a value was not measured."""

VERDICT_WORDS = {
    "pass": "pass",
    "fail": "fail",
    "insufficient": "insufficient",
    "error": "error",
    "stale": "stale",
    "missing": "not measured",
}
"""A cell's verdict under the project now as the page words it (``stale``: its evidence cannot
be judged under the project now; ``missing``: no cell at all)."""


def ms(value: float | None) -> str:
    """A duration in milliseconds with its unit: three decimals below 1 ms, none from 1 s."""
    if value is None or not math.isfinite(value):
        return NOT_MEASURED
    if value < 1:
        return f"{value:.3f} ms"
    if value < 10:
        return f"{value:.2f} ms"
    if value < 1000:
        return f"{value:.1f} ms"
    return f"{value:,.0f} ms"


def bare_ms(value: float | None) -> str:
    """A duration as ``ms`` words it, without the unit, where one unit follows several numbers."""
    return ms(value).removesuffix(" ms")


def mb(value: float | None) -> str:
    """A size in megabytes with its unit: one decimal below 10 MB, none above."""
    if value is None or not math.isfinite(value):
        return NOT_MEASURED
    return f"{value:.1f} MB" if value < 10 else f"{value:,.0f} MB"


def number(value: float | None) -> str:
    """A plain number (a parity error, a cosine): four significant digits, or scientific."""
    if value is None:
        return NOT_MEASURED
    if value == 0:
        return "0"
    if abs(value) >= 1e-3 and abs(value) < 1e4:
        return f"{value:.4g}"
    return f"{value:.3e}"


def tolerance(value: float | None) -> str:
    """A parity tolerance; None means the check is off."""
    return "not checked" if value is None else number(value)


def utc_minute(moment: datetime) -> str:
    """A moment in UTC to the minute (a naive one is taken as UTC)."""
    aware = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return aware.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


NOT_RECORDED = "not recorded"
"""What a manifest version published before the matrix recorded who and why says in their
place: never a name or a reason made up for it."""


def published_by(version: ManifestVersion) -> str:
    """Who published ``version``, for people: the name, or `NOT_RECORDED`."""
    return version.published_by if version.published_by is not None else NOT_RECORDED


def publish_reason(version: ManifestVersion) -> str:
    """Why ``version`` was published, for people: the reason, ``none given``, or
    `NOT_RECORDED`."""
    if version.publish_reason is None:
        return NOT_RECORDED
    return version.publish_reason or "none given"


def plural(count: int, one: str, many: str) -> str:
    """``1 class`` or ``3 classes``: the count with the word that agrees with it."""
    return f"{count} {one if count == 1 else many}"


def short_digest(digest: str | None) -> str:
    """A digest cut to ``sha256:`` and twelve hex digits (other text to twelve characters)."""
    if digest is None:
        return "none"
    return digest[:19] if digest.startswith("sha256:") else digest[:12]


def provider_name(provider: str) -> str:
    """An execution provider without the ``ExecutionProvider`` suffix (``CPU``, ``CUDA``)."""
    return provider.removesuffix("ExecutionProvider") or provider


def open_loop_text(found: OpenLoopResult) -> str:
    """What an open-loop search found: the highest Poisson arrival rate whose p99 met the
    budget, the closed-loop ceiling where measured, or why no rate met it (the run's output and
    the report say the same)."""
    if found.max_rate_rps is None:
        return f"no rate within p99 {found.budget_ms:g} ms: {found.missing}"
    best = max((p for p in found.probes if p.met), key=lambda p: p.rate_rps)
    ceiling = (
        f"of {found.closed_loop_rps:,.0f}/s back to back; "
        if found.closed_loop_rps is not None
        else ""
    )
    return (
        f"{found.max_rate_rps:,.0f} requests/s within p99 {found.budget_ms:g} ms "
        f"({ceiling}p99 {ms(best.p99_ms)} at it, {len(found.probes)} rates probed)"
    )
