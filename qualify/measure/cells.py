"""How a worker's outcome becomes a matrix cell: one place for run, tune and fleet.

Owns `cell_of` (a measured outcome, or an end with no outcome such as a lost fleet host, into an
unjudged `schemas.cell.Cell`) and `placement_from`. It does not judge (``manifest.gates`` does),
measure or write anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from qualify.measure.job import WorkerResult
from qualify.measure.runner import WorkerOutcome
from qualify.measure.runtime_log import merge
from schemas.base import Precision, Role
from schemas.cell import (
    Cell,
    LatencyResult,
    LoggedWarning,
    Numerics,
    OffProviderNode,
    OpenLoopResult,
    ParityResult,
    Placement,
    Reason,
    Soak,
)
from schemas.host import Fingerprint
from schemas.project import HostClassKey

__all__ = ["Artifact", "CellSite", "Measured", "cell_of", "placement_from"]


@dataclass(frozen=True)
class CellSite:
    """What every cell of one run shares: where, under which settings, on which host."""

    run_id: str
    host_class: str
    key: HostClassKey
    settings_digest: str
    fingerprint: Fingerprint
    """The measuring host's (its ISA; its runtime version where the child did not say)."""
    emulated: bool = False
    isa_mismatch: tuple[str, ...] = ()
    measured_alone: bool | None = None
    """Whether the host-wide lock was held; None where the caller does not say (a tune)."""
    fleet_node: str | None = None
    workload_digest: str | None = None
    """``Workload.evidence_digest`` of the project the run measured under (None: not said)."""


@dataclass(frozen=True)
class Artifact:
    """Which artifact a cell is of."""

    digest: str
    name: str
    role: Role
    precision: Precision


@dataclass(frozen=True)
class Measured:
    """What the run made of an outcome beyond the child's own result: its latency evidence,
    parity against the baseline, and the rest; empty for an artifact that did not run."""

    latency: Sequence[LatencyResult] = ()
    parity: ParityResult | None = None
    reasons: Sequence[Reason] = ()
    """Reasons found beside the child's own error (a parity pass that could not run)."""
    numerics: Numerics | None = None
    soak: Soak | None = None
    open_loop: OpenLoopResult | None = None


def placement_from(outcome: WorkerOutcome) -> Placement | None:
    """The cell's placement: the child's count, with every warning it and onnxruntime gave."""
    report = outcome.result.placement
    if report is None:
        return None
    warnings = [
        LoggedWarning(message=text, count=count)
        for text, count in merge(outcome.result.warnings, outcome.provider_log)
    ]
    return Placement(
        nodes_per_provider=report.nodes_per_provider,
        total_nodes=report.total_nodes,
        expected_provider=report.expected_provider,
        fallback_nodes=report.fallback_nodes,
        session_providers=list(report.session_providers),
        source=report.source,  # type: ignore[arg-type]  # validated by the model
        off_provider_nodes=[
            OffProviderNode(name=n.name, op_type=n.op_type, domain=n.domain, provider=n.provider)
            for n in report.off_provider_nodes
        ],
        warnings=warnings,
        kernel_ms_per_provider=outcome.result.kernel_ms_per_provider,
    )


def _kib_to_mb(kib: int | None) -> float | None:
    return kib / 1024.0 if kib is not None and kib > 0 else None


def _own_reason(outcome: WorkerOutcome) -> list[Reason]:
    """Why the child did not measure, as the cell's first reason; none when it did."""
    if outcome.error_code is None:
        return []
    return [Reason(code=outcome.error_code, message=outcome.error_message or "")]


def cell_of(
    site: CellSite,
    artifact: Artifact,
    ended: WorkerOutcome | Reason,
    measured_at: datetime,
    measured: Measured = Measured(),
) -> Cell:
    """The unjudged cell of one artifact: ``error`` when it was not measured, else
    ``insufficient`` until ``manifest.gates.judge`` decides.

    Args:
        site: what the run's cells share.
        artifact: the artifact measured.
        ended: the child's outcome (a result, an error, a timeout, a crash), or why there is
            none (a fleet host lost or out of time).
        measured_at: when its process finished.
        measured: the run's own evidence about it.
    """
    outcome = ended if isinstance(ended, WorkerOutcome) else None
    result = outcome.result if outcome is not None else WorkerResult()
    own = [ended] if isinstance(ended, Reason) else _own_reason(ended)
    return Cell(
        run_id=site.run_id,
        host_class=site.host_class,
        key=site.key,
        artifact_digest=artifact.digest,
        artifact_name=artifact.name,
        role=artifact.role,
        precision=artifact.precision,
        verdict="error" if own else "insufficient",
        reasons=[*own, *measured.reasons],
        emulated=site.emulated,
        isa=site.fingerprint.isa,
        isa_mismatch=list(site.isa_mismatch),
        numerics=measured.numerics,
        measured_at=measured_at,
        settings_digest=site.settings_digest,
        workload_digest=site.workload_digest,
        runtime_version=result.runtime_version or site.fingerprint.runtime.version,
        cold_init_ms=result.cold_init_ms,
        warm_init_ms=result.warm_init_ms,
        peak_rss_mb=outcome.peak_rss_mb if outcome is not None else None,
        peak_rss_source=outcome.peak_rss_source if outcome is not None else None,
        import_rss_mb=_kib_to_mb(result.import_hwm_kb),
        import_ms=result.import_ms,
        placement=placement_from(outcome) if outcome is not None else None,
        latency=list(measured.latency),
        parity=measured.parity,
        error=None if not own else outcome.error_message if outcome is not None else own[0].message,
        measured_alone=site.measured_alone,
        cpus=list(result.cpus) if result.cpus is not None else None,
        fleet_node=site.fleet_node,
        containment=outcome.containment if outcome is not None else None,
        stray_processes=outcome.stray_processes if outcome is not None else None,
        soak=measured.soak,
        open_loop=measured.open_loop,
    )
