"""The latency charts: one percentile plot per class, as data the page's script draws.

Each series is a cell's raw gate latencies on a shared "nines" axis (x = -log10(1 - q)); a
quantile its sample count cannot support is null, a series without samples has no curve.
Drawing is ``static/report.js`` with the vendored uPlot.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from reports.view import ChartView
from schemas.cell import Cell, LatencyConfig, LatencyResult
from schemas.rules import order_rank

__all__ = ["CHART_POINTS", "Samples", "SamplesSource", "latency_chart", "samples_reader"]

CHART_POINTS = 40
"""Points per series in a chart: a smooth curve, and small enough for 1,000 classes."""

Samples = Mapping[LatencyConfig, npt.NDArray[np.int64]]
"""Raw latencies of one cell: ``{LatencyConfig: latency_ns array}``."""

SamplesSource = Callable[[str, str], Samples] | Mapping[tuple[str, str], Samples]
"""Where raw samples come from: ``(run_id, artifact_digest) -> Samples``
(``Store.samples_by_config``) or a mapping with those keys."""


def samples_reader(source: SamplesSource | None) -> Callable[[str, str], Samples]:
    """One way to read samples, whatever the caller passed: ``(run_id, digest) -> Samples``.

    None and a key the mapping lacks read as no samples.
    """
    if source is None:
        return lambda run_id, digest: {}
    if callable(source):
        return source
    mapping = source
    return lambda run_id, digest: mapping.get((run_id, digest), {})


def _sig(value: float) -> float:
    # Three significant digits: a chart cannot show more; the tables carry the exact numbers.
    return float(f"{value:.3g}")


def _series(
    label: str,
    role: str,
    gate: LatencyResult,
    latencies_ns: npt.NDArray[np.int64] | None,
    grid: npt.NDArray[np.float64],
) -> dict[str, Any]:
    y: list[float | None] = []
    if latencies_ns is not None and latencies_ns.size:
        ms = np.sort(latencies_ns.astype(np.float64)) / 1e6
        n = ms.size
        q = 1.0 - np.power(10.0, -grid)
        supported = grid <= math.log10(n) + 1e-9
        # The order statistic every quantile of qualify is (schemas.rules.order_rank).
        index = np.array([order_rank(n, float(level)) - 1 for level in q], dtype=np.int64)
        values = ms[index]
        y = [_sig(float(v)) if ok else None for v, ok in zip(values, supported, strict=True)]
    return {
        "label": label,
        "role": role,
        "y": y,
        "p50": _sig(gate.p50_ms),
        "p99": _sig(gate.p99_ms),
        "lo": None if gate.p99_lower_ms is None else _sig(gate.p99_lower_ms),
        "hi": None if gate.p99_upper_ms is None else _sig(gate.p99_upper_ms),
    }


def latency_chart(
    index: int,
    cells: Sequence[Cell],
    budget_ms: float | None,
    samples: Callable[[str, str], Samples],
) -> tuple[ChartView | None, str]:
    """One class's chart and the note under it.

    Args:
        index: The class's place on the page (the chart's DOM id is ``chart-<index>``).
        cells: The class's latest cell per artifact, in column order.
        budget_ms: The class's p99 budget, drawn as a line; None draws none.
        samples: The raw-sample reader from ``samples_reader``.

    Returns:
        The chart, or None when no cell has a latency or no raw samples are stored; and a note
        saying why there is no chart or which artifacts' samples are missing ("" when none are).
    """
    gated = [(cell, cell.gate_latency) for cell in cells]
    with_latency = [(cell, gate) for cell, gate in gated if gate is not None]
    if not with_latency:
        return None, "No latency was measured on this class, so there is no distribution to draw."
    raw: list[npt.NDArray[np.int64] | None] = []
    for cell, gate in with_latency:
        by_config = samples(cell.run_id, cell.artifact_digest)
        raw.append(by_config.get(gate.config))
    counts = [r.size for r in raw if r is not None and r.size]
    missing = [
        cell.artifact_name
        for (cell, _), r in zip(with_latency, raw, strict=True)
        if r is None or not r.size
    ]
    if not counts:
        return None, (
            "Raw latency samples are not in the matrix for this class; the numbers in the "
            "table are the stored percentiles."
        )
    nines_max = round(math.log10(max(counts)), 4)
    grid = np.linspace(0.0, nines_max, CHART_POINTS)
    series = []
    for (cell, gate), latencies in zip(with_latency, raw, strict=True):
        label = f"{cell.artifact_name} ({gate.config.short})"
        series.append(_series(label, cell.role, gate, latencies, grid))
    data = {
        "nines_max": nines_max,
        "points": CHART_POINTS,
        "budget": budget_ms,
        "series": series,
    }
    caption = "Latency percentile chart: " + ", ".join(c.artifact_name for c, _ in with_latency)
    note = (
        f"Raw samples missing for {', '.join(missing)}: drawn from the others only."
        if missing
        else ""
    )
    return ChartView(dom_id=f"chart-{index}", data=data, caption=caption), note
