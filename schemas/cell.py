"""Results of a qualification run: cells, the run record and the portable run bundle.

Owns the models only. The runner fills them in, ``matrix`` stores them, ``manifest`` decides
over them. Missing measurements are ``null``, never a made-up number.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Annotated, Literal, NamedTuple

from pydantic import BeforeValidator, Field, field_validator

from schemas.base import Digest, Document, Precision, Role, Verdict
from schemas.host import Fingerprint
from schemas.project import HostClassKey, OutputTolerance, TaskTolerance
from schemas.reasons import CELL_CODES, REASONS
from schemas.rules import OFF_PROVIDER_KEPT

__all__ = [
    "BUNDLE_FORMAT",
    "REASON_CODES",
    "Cell",
    "LatencyConfig",
    "LatencyResult",
    "LoggedWarning",
    "Numerics",
    "NumericsSource",
    "OffProviderNode",
    "OpenLoopResult",
    "OutputParity",
    "ParityResult",
    "PeakRssSource",
    "Placement",
    "RateProbe",
    "Reason",
    "RollbackCheck",
    "RoundFigure",
    "RunBundle",
    "RunRecord",
    "Slowdown",
    "Soak",
    "SoakWindow",
    "dims_text",
    "latest",
    "recency",
    "soak_drifted",
    "worst_first",
]

BUNDLE_FORMAT = "qualify-run-bundle/1"

PeakRssSource = Literal["wait4", "vmhwm", "vmhwm-before-kill"]
"""How a peak RSS was measured (see ``qualify.measure.runner.child_peak_rss_mb``)."""

REASON_CODES: dict[str, str] = {code: REASONS[code] for code in CELL_CODES}
"""The codes of a cell's reasons and their meanings (from `schemas.reasons`)."""


class Reason(Document):
    """A machine-readable reason code with a sentence a person can act on."""

    code: str = Field(
        description="Reason code, one of schemas.reasons.REASONS: "
        + "; ".join(f"{code}: {meaning}" for code, meaning in REASONS.items())
        + ".",
        json_schema_extra={"enum": list(REASONS)},
    )
    message: str = Field(description="One sentence with the evidence.")

    @field_validator("code")
    @classmethod
    def _known_code(cls, code: str) -> str:
        if code not in REASONS:
            raise ValueError(
                f"unknown reason code {code[:60]!r}; known: {', '.join(REASONS)} "
                "(written by a newer qualify? use that version to read it)"
            )
        return code


class LoggedWarning(Document):
    """One distinct warning given while the artifact was measured, and how often."""

    message: str = Field(
        description="The warning as onnxruntime (or Python, or qualify) gave it, terminal "
        "escapes and onnxruntime's timestamp removed, at most 500 characters."
    )
    count: int = Field(default=1, ge=1, description="How many times it was given.")


def _logged(value: object) -> object:
    """A warning as cells before counts recorded it (a plain string) reads as given once."""
    if isinstance(value, list):
        return [{"message": v, "count": 1} if isinstance(v, str) else v for v in value]
    return value


class OffProviderNode(Document):
    """A node that ran on another provider than the class's expected one."""

    name: str = Field(max_length=512, description="The node's name in the session's graph.")
    op_type: str = Field(max_length=256, description="Its operator type (Conv, MatMul, ...).")
    domain: str = Field(
        default="", max_length=256, description="Its operator domain; empty for ai.onnx."
    )
    provider: str = Field(max_length=256, description="The provider it ran on instead.")


class Placement(Document):
    """Where the nodes actually ran: onnxruntime's graph assignment, or its profiler."""

    nodes_per_provider: dict[str, int] = Field(description="Node count per execution provider.")
    total_nodes: int = Field(description="Nodes assigned in total.")
    expected_provider: str = Field(description="The class's expected provider.")
    fallback_nodes: int = Field(description="Nodes not on the expected provider.")
    session_providers: list[str] = Field(
        description="session.get_providers(): registered, not necessarily used."
    )
    warnings: Annotated[list[LoggedWarning], BeforeValidator(_logged)] = Field(
        default_factory=list,
        description="What onnxruntime warned (and errors it logged) while the artifact was "
        "measured, from the child's stderr and Python's warnings: each distinct message once "
        "with its count, at most 20 and a closing entry counting the rest (cells recorded "
        "before counts held plain strings, read as given once).",
    )
    kernel_ms_per_provider: dict[str, float] | None = Field(
        default=None,
        description="Mean kernel time per inference by provider, from a separate profiling pass "
        "(profiling slows inference, so never in the timed loop); null if not profiled.",
    )
    off_provider_nodes: list[OffProviderNode] | None = Field(
        default=None,
        max_length=OFF_PROVIDER_KEPT,
        description=f"The nodes that ran off the expected provider, by name and op type: the "
        f"first {OFF_PROVIDER_KEPT} in onnxruntime's graph-assignment order (fallback_nodes "
        "counts them all); the profiler's kernels on builds without the placement API (fused "
        "kernels count as one); null in cells recorded before they were named.",
    )
    source: Literal["graph_assignment", "profiler"] = Field(
        default="graph_assignment",
        description="graph_assignment: session.get_provider_graph_assignment_info() (onnxruntime "
        ">= 1.31, with session.record_ep_graph_assignment_info); profiler: the provider the "
        "profiler recorded for each kernel of one profiled inference (older builds). The "
        "profiler counts kernels after fusion, so its totals can be lower (a QDQ group fused "
        "into one QLinear kernel counts once).",
    )


class RoundFigure(Document):
    """One artifact's share of one interleaved round at one latency config."""

    round: int = Field(ge=0, description="Round number, from 0.")
    position: int = Field(ge=0, description="Where in the round's order it sampled (0 = first).")
    samples: int = Field(ge=0, description="Timed inferences in this round.")
    p50_ms: float | None = Field(description="Median of this round; null without samples.")
    p99_ms: float | None = Field(description="99th percentile of this round; null without samples.")
    load_avg_1m: float = Field(description="1-minute load average when the round started.")
    steal_fraction: float | None = Field(
        description="Share of CPU time stolen by the hypervisor during the round (/proc/stat); "
        "null where the kernel does not say."
    )


class Slowdown(Document):
    """Candidate/baseline latency ratio from the paired rounds of an interleaved A/B.

    Each paired round gives one ratio per metric (the candidate's round p50 over the baseline's
    round p50, likewise p99); the ratio reported is their median and the bounds are
    distribution-free confidence bounds of that median (order statistics, as for p99), so one
    round hit by a load spike cannot decide it.
    """

    rounds: int = Field(ge=0, description="Rounds in which both artifacts sampled.")
    confidence: float = Field(
        description="One-sided confidence of each bound, Bonferroni-corrected over p50 and p99 "
        "and every latency config."
    )
    p50_ratio: float | None = Field(
        description="Median per-round ratio of p50 (with an A/A control: to the baseline pooled "
        "over its two processes, each round's geometric mean)."
    )
    p50_lower: float | None = Field(
        description="Lower bound of it; null with too few rounds. With an A/A control it is "
        "net of the process noise: the least of the bound against each baseline process and the "
        "pooled bound over p50_spread, so that a candidate above max_slowdown is slower than "
        "every process the baseline ran in, by more than two processes of one artifact differed."
    )
    p50_upper: float | None = Field(
        description="Upper bound of it; null with too few rounds (with a control: the greatest "
        "of the bound against each baseline process and the pooled bound times p50_spread)."
    )
    p99_ratio: float | None = Field(description="Median per-round ratio of p99.")
    p99_lower: float | None = Field(
        description="Lower bound of it, as p50_lower; null with too few rounds."
    )
    p99_upper: float | None = Field(
        description="Upper bound of it, as p50_upper; null with too few rounds."
    )
    p50_spread: float | None = Field(
        default=None,
        description="The between-process spread at p50 (a factor >= 1) from the run's A/A "
        "control: how far the baseline's second process was shown to differ from its first in "
        "the same rounds (the bound of their ratio nearest 1; 1.0 when its interval holds 1). "
        "Null without a control: the bounds then carry no process noise.",
    )
    p99_spread: float | None = Field(
        default=None, description="The same at p99; null without a control."
    )
    p50_detectable: float | None = Field(
        default=None,
        description="How big a p50 slowdown this run could have seen: the smallest median ratio "
        "whose lower bound, as wide as this run's, would be above 1.0 (p50_ratio / p50_lower); "
        "times max_slowdown for another limit. Null with too few rounds.",
    )


def worst_first(p99_upper_ms: float | None, p99_ms: float) -> tuple[float, float]:
    """The order in which latency configs are worse for the p99 gate: by upper bound, a
    missing bound above any, then by the observed p99 (`Cell.gate_latency`, and the runner's
    choice of the config a soak serves)."""
    return (p99_upper_ms if p99_upper_ms is not None else math.inf, p99_ms)


def dims_text(dims: dict[str, int]) -> str:
    """The swept sizes of a latency config as the matrix keys them: ``seq=64,width=32`` (names
    sorted), ``""`` when nothing is swept."""
    return ",".join(f"{name}={size}" for name, size in sorted(dims.items()))


class LatencyConfig(NamedTuple):
    """What one latency config is: batch size, concurrency and the swept dimensions' sizes
    (`dims_text`, ``""`` when none); hashable, so results and samples are keyed by it."""

    batch_size: int
    concurrency: int
    dims: str = ""

    @property
    def sizes(self) -> dict[str, int]:
        """The swept sizes as a mapping (``{}`` when none)."""
        if not self.dims:
            return {}
        pairs = (item.partition("=") for item in self.dims.split(","))
        return {name: int(size) for name, _, size in pairs}

    @property
    def label(self) -> str:
        """``batch 1, concurrency 2`` and the swept sizes (``, seq 64``), for sentences."""
        extra = "".join(f", {name} {size}" for name, size in self.sizes.items())
        return f"batch {self.batch_size}, concurrency {self.concurrency}{extra}"

    @property
    def short(self) -> str:
        """``b1 c2`` and the swept sizes (`` seq=64``), for tables and charts."""
        return f"b{self.batch_size} c{self.concurrency}" + (f" {self.dims}" if self.dims else "")


class LatencyResult(Document):
    """Latency at one (batch size, concurrency, swept sizes) with its p99 evidence."""

    batch_size: int = Field(description="Rows per inference.")
    concurrency: int = Field(description="Threads sharing one session.")
    dims: dict[str, int] = Field(
        default_factory=dict,
        description="The sizes of the dimensions workload.dims sweeps, at this config ({} when "
        "none is swept).",
    )
    samples: int = Field(description="Timed inferences after warm-up.")
    p50_ms: float = Field(description="Median latency.")
    p90_ms: float = Field(description="90th percentile.")
    p99_ms: float = Field(description="99th percentile (point estimate).")
    max_ms: float = Field(description="Slowest timed inference.")
    mean_ms: float = Field(description="Mean latency.")
    p99_lower_ms: float | None = Field(
        description="Distribution-free lower confidence bound of p99; null with too few samples."
    )
    p99_upper_ms: float | None = Field(
        description="Distribution-free upper confidence bound of p99; null with too few samples."
    )
    confidence: float = Field(description="Confidence of the bounds.")
    decision: Literal["pass", "fail", "insufficient"] = Field(
        description="p99 against the budget: pass (upper <= budget), fail (lower > budget)."
    )
    stopped: Literal["decided", "max_samples", "time_cap"] = Field(
        description="Why sampling stopped."
    )
    duration_s: float = Field(description="Wall time spent sampling.")
    time_cap_s: float | None = Field(
        default=None,
        description="The sampling time cap applied (workload.time_cap_s, else adapted to the "
        "measured rate); null in cells recorded before it was kept.",
    )
    throughput_ips: float | None = Field(
        description="Inferences per second from the separate throughput pass; null if not run."
    )
    rounds: list[RoundFigure] = Field(
        default_factory=list, description="Per-round figures of the interleaved A/B."
    )
    vs_baseline: Slowdown | None = Field(
        default=None,
        description="For a candidate: its latency relative to the baseline's in the same rounds.",
    )
    control: Slowdown | None = Field(
        default=None,
        description="For the baseline: the A/A control (workload.aa_control), a second process "
        "of the same bytes in the same rounds, against the first: how far two processes of one "
        "artifact differ (the between-process spread every candidate's slowdown is judged "
        "beyond); null without a control.",
    )
    control_rounds: list[RoundFigure] = Field(
        default_factory=list,
        description="For the baseline: the A/A control's own per-round figures (empty without "
        "a control).",
    )
    inference_p50_ms: float | None = Field(
        default=None,
        description="With workload.pipeline: median of the model call alone (the p50/p99 above "
        "are end to end: pre + inference + post); null without a pipeline.",
    )
    inference_p99_ms: float | None = Field(
        default=None, description="With workload.pipeline: p99 of the model call alone."
    )
    stage_share: dict[Literal["pre", "inference", "post"], float] | None = Field(
        default=None,
        description="With workload.pipeline: each stage's share of the timed time (sums to 1).",
    )
    energy_mj: float | None = Field(
        default=None,
        description="Energy per inference over the timed rounds, millijoules, from the counters "
        "named in energy_source (a package counter counts the whole socket: honest when the "
        "host measured alone); null when none was readable, see energy_missing.",
    )
    energy_source: list[str] | None = Field(
        default=None, description="The counters read, e.g. 'intel-rapl:0 (package-0)'."
    )
    energy_missing: str | None = Field(
        default=None, description="Why energy_mj is null (no counters, not readable, ...)."
    )

    @property
    def config(self) -> LatencyConfig:
        """The config this result is for."""
        return LatencyConfig(self.batch_size, self.concurrency, dims_text(self.dims))


class SoakWindow(Document):
    """One window of a soak: its latency and the host's heat at its end."""

    start_s: float = Field(description="Seconds from the soak's start.")
    samples: int = Field(description="Timed inferences in the window.")
    p50_ms: float | None = Field(default=None, description="Median; null without samples.")
    p99_ms: float | None = Field(default=None, description="p99; null without samples.")
    p99_lower_ms: float | None = Field(
        default=None, description="p99 lower confidence bound; null with too few samples."
    )
    p99_upper_ms: float | None = Field(
        default=None, description="p99 upper confidence bound; null with too few samples."
    )
    cpu_mhz: float | None = Field(
        default=None, description="Mean current CPU frequency at its end; null if not exposed."
    )
    temp_c: float | None = Field(
        default=None, description="Hottest thermal zone at its end, °C; null if not exposed."
    )


class Soak(Document):
    """Sustained load at the gate config (``workload.soak_s``, ``qualify run --soak``)."""

    batch_size: int = Field(description="Rows per inference.")
    concurrency: int = Field(description="Threads sharing one session.")
    dims: dict[str, int] = Field(
        default_factory=dict, description="The swept sizes of the config served ({} if none)."
    )
    seconds: float = Field(description="How long it was served.")
    tolerance: float = Field(description="workload.soak_tolerance it was judged with.")
    floor: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description="workload.soak_floor it was measured with: a drift counts against the class "
        "only when the last window's p99 lower bound is above the first window's upper bound "
        "by at least this share of the class's p99 budget (0.1 for soaks recorded before it).",
    )
    windows: list[SoakWindow] = Field(description="Equal windows, in order.")
    drifted: bool | None = Field(
        description="The last window's p99 lower bound above the first's upper bound times "
        "1 + tolerance; null when a window had too few samples to bound its p99."
    )

    @property
    def config(self) -> LatencyConfig:
        """The config served."""
        return LatencyConfig(self.batch_size, self.concurrency, dims_text(self.dims))

    def under(self, tolerance: float, floor: float) -> Soak:
        """This soak judged with another ``workload.soak_tolerance`` and ``soak_floor`` (the
        project's now): its windows are the evidence, the drift is decided again from their
        bounds. Itself when both are the ones it was judged with."""
        if tolerance == self.tolerance and floor == self.floor:
            return self
        drift = soak_drifted(self.windows, tolerance)
        return self.model_copy(update={"tolerance": tolerance, "floor": floor, "drifted": drift})


def soak_drifted(windows: Sequence[SoakWindow], tolerance: float) -> bool | None:
    """Whether the last window is slower than the first beyond ``tolerance`` with confidence
    (its p99 lower bound above the first's upper bound times 1 + tolerance); None when the
    bounds needed are missing (too few samples in a window)."""
    if len(windows) < 2:
        return None
    first, last = windows[0].p99_upper_ms, windows[-1].p99_lower_ms
    if first is None or last is None:
        return None
    return last > first * (1.0 + tolerance)


class RateProbe(Document):
    """One probed request rate of an open-loop search."""

    rate_rps: float = Field(description="Target rate of the Poisson arrivals, requests/s.")
    arrivals: int = Field(description="Requests that arrived.")
    achieved_rps: float = Field(description="Requests served per second of the probe.")
    p50_ms: float = Field(description="Median latency from the scheduled arrival.")
    p99_ms: float = Field(description="p99 latency from the scheduled arrival.")
    p99_lower_ms: float | None = Field(
        default=None, description="p99 lower confidence bound; null with too few requests."
    )
    p99_upper_ms: float | None = Field(
        default=None, description="p99 upper confidence bound; null with too few requests."
    )
    service_p50_ms: float = Field(description="Median time in service alone (no queueing).")
    met: bool = Field(description="Whether p99_ms is within the class's budgets.p99_ms.")


class OpenLoopResult(Document):
    """The highest request rate that meets the p99 budget (``workload.open_loop``)."""

    servers: int = Field(description="Threads taking requests from the one queue.")
    budget_ms: float = Field(description="budgets.p99_ms the rates were held to.")
    closed_loop_rps: float | None = Field(
        description="Requests/s served back to back at batch 1 by the same threads: the "
        "ceiling the search bisects below; null if it could not be measured."
    )
    max_rate_rps: float | None = Field(
        description="Highest probed rate whose p99 met the budget; null when none did."
    )
    probes: list[RateProbe] = Field(description="Every rate probed, in the order probed.")
    missing: str | None = Field(
        default=None, description="Why max_rate_rps is null (no rate met it, the worker ended)."
    )


class OutputParity(Document):
    """Parity of one output against the baseline."""

    name: str = Field(description="Output name.")
    max_abs: float | None = Field(
        description="Largest |a-b|; null if the output could not be compared."
    )
    mean_abs: float | None = Field(description="Mean |a-b|; null if not comparable.")
    max_rel: float | None = Field(
        description="Largest |a-b| / max(|a|, eps); null if not comparable."
    )
    cosine_min: float | None = Field(
        description="Smallest per-sample cosine similarity; null if not comparable."
    )
    top1_agreement: float | None = Field(
        description="Share of positions whose arg-max over the last axis agrees (rows of [N, "
        "classes], steps of [N, steps, classes]); null if the output is not class scores."
    )
    exact_match: float | None = Field(
        default=None,
        description="Share of samples whose answer equals the baseline's exactly (strings, "
        "integers, booleans: the whole answer to one sample); null for floating-point outputs.",
    )
    box_f1: float | None = Field(
        default=None,
        description="F1 of the candidate's boxes against the baseline's at IoU iou (micro over "
        "samples), when parity.post asks for it; null otherwise.",
    )
    iou: float | None = Field(
        default=None, description="The IoU at which boxes matched for box_f1; null without it."
    )
    task_tolerance: TaskTolerance | None = Field(
        default=None,
        description="The task-level tolerance applied (parity.post), null for a tensor output.",
    )
    samples: int | None = Field(
        default=None,
        description="Samples compared (one inference each); null in cells before it was kept.",
    )
    over: str | None = Field(
        default=None,
        description="What the metrics were taken over: the samples, the output's batch axis and "
        "where that came from (the model's graph, the workload, the project), the positions of "
        "top-1 agreement. Null in cells before it was kept.",
    )
    skipped: dict[str, str] = Field(
        default_factory=dict,
        description="Metrics that do not apply to this output, each with why (top1_agreement "
        "on a recurrent state or on values that are not class scores; the tensor metrics on "
        "strings); a tolerance set for one is not checked.",
    )
    tolerance: OutputTolerance = Field(description="The tolerance applied.")
    passed: bool = Field(description="Whether every tolerance held.")
    failures: list[str] = Field(
        default_factory=list, description="Which checks failed and by how much."
    )
    min_passing: OutputTolerance = Field(
        description="The tightest tolerance that would have passed (the measured values)."
    )


class ParityResult(Document):
    """Parity of a candidate against the baseline on identical inputs."""

    reference_digest: Digest = Field(description="The baseline compared against.")
    samples: int = Field(description="Input rows compared.")
    passed: bool = Field(description="Whether every output passed.")
    outputs: list[OutputParity] = Field(description="Per-output results.")


NumericsSource = Literal["native", "emulated", "other_isa"]
"""How a cell's parity outputs were computed (`Numerics`)."""


class Numerics(Document):
    """How a cell's parity outputs were computed: on the measuring host's own CPU, or under
    QEMU user-mode emulation on a CPU of the class's instruction set."""

    source: NumericsSource = Field(
        description="native: on the measuring host's CPU, whose ISA is the class's; emulated: "
        "under QEMU on 'cpu', a CPU of the class's ISA, so by the kernels onnxruntime picks for "
        "it; other_isa: on the measuring host's CPU, whose ISA is not the class's (isa_mismatch "
        "says how)."
    )
    arch: str = Field(description="The architecture whose kernels computed them.")
    cpu: str | None = Field(
        default=None, description="The emulated CPU model (QEMU's name); null when not emulated."
    )
    qemu: str | None = Field(
        default=None, description="The QEMU version that emulated it; null when not emulated."
    )
    runtime_version: str | None = Field(
        default=None,
        description="The onnxruntime version that computed them under emulation (for another "
        "architecture, that of its prepared runtime); null when not emulated.",
    )
    note: str | None = Field(
        default=None,
        description="Why the class's numerics were not emulated although --emulate asked (no "
        "emulated CPU for its ISA, QEMU or the prepared runtime missing), or what failed under "
        "emulation; null otherwise.",
    )
    native_max_abs: dict[str, float] | None = Field(
        default=None,
        description="For a candidate whose numerics were emulated: the largest |candidate - "
        "baseline| per output when both ran natively on the measuring host in the same run "
        "(that host's numerics), beside the emulated figures in 'parity'; null otherwise.",
    )

    @property
    def label(self) -> str:
        """``emulated neoverse-n1 (QEMU 7.2.22)``, ``native`` or ``other ISA``."""
        if self.source == "emulated":
            return f"emulated {self.cpu} (QEMU {self.qemu})"
        return "other ISA" if self.source == "other_isa" else "native"


class RollbackCheck(Document):
    """Whether the class's rollback artifact loads and runs under this runtime."""

    artifact_digest: Digest = Field(description="The rollback artifact.")
    loaded: bool = Field(description="Loaded and ran one inference.")
    error: str | None = Field(default=None, description="Why it did not, if it did not.")


class Cell(Document):
    """One result: (hardware, runtime, provider, artifact digest, run id)."""

    run_id: str = Field(description="The run this cell belongs to.")
    host_class: str = Field(description="Host class name.")
    key: HostClassKey = Field(description="(hardware, runtime, provider).")
    artifact_digest: Digest = Field(description="sha256 of the artifact's bytes.")
    artifact_name: str = Field(description="Artifact label from the project file.")
    role: Role = Field(description="baseline or candidate.")
    precision: Precision = Field(description="Precision family.")
    verdict: Verdict = Field(description="pass, fail, insufficient or error.")
    reasons: list[Reason] = Field(default_factory=list, description="Why, with evidence.")
    emulated: bool = Field(description="Measured on a host that does not match the class.")
    isa: list[str] | None = Field(
        default=None,
        description="ISA features of the host that measured it (int8/fp16 numerics depend on "
        "them); null in cells older than this field.",
    )
    isa_mismatch: list[str] = Field(
        default_factory=list,
        description="How that ISA differs from what the class's hosts have (a required feature "
        "missing, another architecture): non-empty means numerics from another ISA.",
    )
    numerics: Numerics | None = Field(
        default=None,
        description="How its parity outputs were computed (natively, or on an emulated CPU of "
        "the class's ISA); null in cells older than this field, which read as native unless "
        "isa_mismatch says another ISA.",
    )
    measured_at: datetime = Field(description="When the artifact's subprocess finished (UTC).")
    settings_digest: str = Field(description="Digest of the class's runtime and provider settings.")
    workload_digest: str | None = Field(
        default=None,
        description="Digest of the workload it was measured under (what was fed and timed: "
        "schemas.workload.EVIDENCE_FIELDS); a cell of another workload is stale. Null in cells "
        "recorded before it was kept, which are judged as before.",
    )
    runtime_version: str | None = Field(description="onnxruntime version that ran it.")
    cold_init_ms: float | None = Field(
        description="Fresh process: session creation + first inference."
    )
    warm_init_ms: float | None = Field(description="Second session in the same process.")
    peak_rss_mb: float | None = Field(
        description="Peak RSS of the artifact's subprocess; null if it could not be measured."
    )
    peak_rss_source: PeakRssSource | None = Field(
        default=None,
        description="wait4: ru_maxrss from os.wait4 (above the parent's own peak, so the child's); "
        "vmhwm: the child's VmHWM from /proc, read at its exit (wait4's value could have been "
        "the pre-exec image); vmhwm-before-kill: VmHWM read just before a timeout kill; null "
        "when not measured, or recorded by a qualify that did not say.",
    )
    import_rss_mb: float | None = Field(
        default=None,
        description="The subprocess's peak RSS (VmHWM) with numpy and onnxruntime imported and no "
        "model loaded: the interpreter's share of peak_rss_mb; null if not read.",
    )
    import_ms: float | None = Field(
        default=None, description="Time to import numpy and onnxruntime in the subprocess."
    )
    placement: Placement | None = Field(description="Actual node placement; null if not loaded.")
    latency: list[LatencyResult] = Field(
        default_factory=list, description="One result per (batch size, concurrency)."
    )
    parity: ParityResult | None = Field(
        description="Parity against the baseline; null for the baseline itself or on error."
    )
    error: str | None = Field(default=None, description="Error detail for verdict 'error'.")
    measured_alone: bool | None = Field(
        default=None,
        description="Whether the run held the host-wide measurement lock while measuring (no "
        "other qualify run measured on the host at the same time); false with --shared-host; "
        "null in cells recorded before it was kept.",
    )
    soak: Soak | None = Field(
        default=None, description="Sustained load, when the run soaked; null otherwise."
    )
    open_loop: OpenLoopResult | None = Field(
        default=None,
        description="The open-loop rate search, when the workload asked for one; null otherwise.",
    )
    cpus: list[int] | None = Field(
        default=None,
        description="The CPUs the measuring process ran on (provider.cpu_affinity / numa_node "
        "applied, else all it was allowed); null in cells recorded before it was kept.",
    )
    fleet_node: str | None = Field(
        default=None,
        description="The Ray node that measured it (qualify fleet run), with its host name; "
        "null for a run started on the host itself.",
    )
    containment: str | None = Field(
        default=None,
        description="How everything the measuring process started (the pipeline hooks' "
        "processes) was kept from outliving it: 'process-group+subreaper+tag' (its own process "
        "group and session, a child subreaper that kills its children before it exits, and an "
        "environment tag the parent sweeps for once it has ended), 'process-group+tag' where "
        "the subreaper was not available; null in cells recorded before it was kept.",
    )
    stray_processes: int | None = Field(
        default=None,
        ge=0,
        description="Processes the measuring process left running that were killed once it had "
        "ended (a hook that forked a daemon); null in cells recorded before it was kept.",
    )

    @property
    def numerics_source(self) -> NumericsSource:
        """How its parity outputs were computed; a cell from before `numerics` existed reads as
        it did then (another ISA's where isa_mismatch says so, else native)."""
        if self.numerics is not None:
            return self.numerics.source
        return "other_isa" if self.isa_mismatch else "native"

    @property
    def gate_latency(self) -> LatencyResult | None:
        """The latency config the p99 gate rests on: the worst case, the one with the highest
        p99 upper bound (no bound counts as the highest), ties (several with no bound yet)
        broken by the highest observed p99, so that the gate and the evidence name the slowest
        config rather than the first."""
        if not self.latency:
            return None
        return max(self.latency, key=lambda r: worst_first(r.p99_upper_ms, r.p99_ms))


class RunRecord(Document):
    """One `qualify run` on one host for one class."""

    run_id: str = Field(description="Unique run id.")
    host_class: str = Field(description="Host class name.")
    key: HostClassKey = Field(description="(hardware, runtime, provider).")
    model: str = Field(description="Model name from the project file.")
    started_at: datetime = Field(description="Start (UTC).")
    finished_at: datetime = Field(description="End (UTC).")
    emulated: bool = Field(description="The host did not match the class and --emulate was given.")
    mismatches: list[str] = Field(
        default_factory=list, description="Match rules the host failed (why it was emulated)."
    )
    settings_digest: str = Field(description="Digest of the class's runtime and provider settings.")
    fingerprint: Fingerprint = Field(description="The host measured on.")
    load_avg_before: list[float] = Field(description="1/5/15-minute load average before.")
    load_avg_after: list[float] = Field(description="1/5/15-minute load average after.")
    rollback: RollbackCheck | None = Field(description="Rollback artifact check; null if not run.")
    host_busy: bool = Field(
        default=False,
        description="The 1-minute load average exceeded the usable cores during some round: "
        "something else competed for the CPUs while measuring.",
    )


class RunBundle(Document):
    """The portable record of a run: this JSON plus samples.parquet beside it."""

    format: Literal["qualify-run-bundle/1"] = Field(
        default="qualify-run-bundle/1", description="Bundle format version."
    )
    run: RunRecord = Field(description="The run.")
    cells: list[Cell] = Field(description="One cell per artifact.")


def recency(cell: Cell) -> tuple[datetime, str]:
    """The order "latest" means everywhere: ``measured_at`` (naive read as UTC), ties broken by
    the larger run id; the matrix view (``matrix.migrations``) orders its rows the same way."""
    moment = cell.measured_at
    return (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC), cell.run_id)


def latest(cells: Iterable[Cell]) -> Cell | None:
    """The latest of ``cells`` by `recency`; None when there are none."""
    return max(cells, key=recency, default=None)
