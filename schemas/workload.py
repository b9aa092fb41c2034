"""The project file's workload: the inputs a run feeds, its pipeline, outputs and open loop.

Owns the models of ``workload:`` and the base of every part of the project document
(`ProjectPart`); ``schemas.project`` holds the rest of the document and re-exports these.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, ConfigDict, Field, model_validator

from schemas.base import Document
from schemas.rules import batched_on, sample_at

__all__ = [
    "DIM_RE",
    "EVIDENCE_FIELDS",
    "HOOK_RE",
    "ITEMSIZE",
    "MAX_INPUT_BYTES",
    "POOL_ROWS",
    "InputSpec",
    "OpenLoop",
    "OutputSpec",
    "Pipeline",
    "ProjectPart",
    "Workload",
]


class ProjectPart(Document):
    """A part of the project file: what `Document` is, and no NaN or infinity anywhere (YAML's
    ``.inf`` would otherwise pass every ``gt=0`` check)."""

    model_config = ConfigDict(allow_inf_nan=False)


POOL_ROWS = 256
"""Rows generated for each seeded input of a run (recorded inputs keep all their rows)."""

MAX_INPUT_BYTES = 4 * 2**30
"""Largest input data a workload may ask a run to hold, per input (generated rows, or the
batches of the largest batch size)."""

DIM_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
"""A swept dimension's name in an input's shape (``seq`` in ``[1, seq, 16]``), declared with
its values in ``workload.dims``."""


def _check_dim(value: str) -> str:
    if not DIM_RE.fullmatch(value):
        raise ValueError(
            f"{value[:80]!r} is not a dimension name (letters, digits and '_', not starting with "
            "a digit, e.g. 'seq'); name it in workload.dims with the sizes to sweep"
        )
    return value


DimName = Annotated[str, AfterValidator(_check_dim)]
"""A `DIM_RE` name."""

ITEMSIZE = {
    "float32": 4,
    "float16": 2,
    "float64": 8,
    "int64": 8,
    "int32": 4,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}
"""Bytes per element of each input dtype."""

Dtype = Literal["float32", "float16", "float64", "int64", "int32", "int8", "uint8", "bool"]


class InputSpec(ProjectPart):
    """How one model input is fed: recorded data, seeded generation or a fixed value."""

    shape: list[Annotated[int, Field(gt=0)] | DimName] = Field(
        description="Shape of one feed, including the batch axis at batch_axis (which each "
        "batch size replaces); [] for a scalar. A name instead of a size (e.g. 'seq' in "
        "[1, seq, 16]) is a dimension swept over the sizes workload.dims gives it.",
    )
    batch_axis: int | None = Field(
        default=0,
        ge=0,
        description="The axis that batches samples (a recurrent state shaped [layers, batch, "
        "hidden] batches on 1); null for an input fed whole to every inference (a scalar, a "
        "sample rate): then each sample of a recorded or generated source is one whole feed. "
        "Fixed inputs are fed whole, except a recurrent state (state_from).",
    )
    state_from: str | None = Field(
        default=None,
        min_length=1,
        description="A model output whose value becomes this input at the next inference (the "
        "recurrent state): each serving thread carries its own, parity follows one sequence of "
        "steps from the input's own first value.",
    )
    dtype: Dtype = Field(default="float32", description="Element type.")
    source: Literal["recorded", "generated", "fixed"] = Field(
        description="recorded: rows of a .npy file; generated: seeded random; fixed: one value."
    )
    file: str | None = Field(
        default=None, description="For recorded inputs: a .npy file, relative to the project file."
    )
    seed: int = Field(default=0, description="For generated inputs: the random seed.")
    low: float = Field(default=0.0, description="For generated inputs: lower bound (uniform).")
    high: float = Field(default=1.0, description="For generated inputs: upper bound (uniform).")
    value: float | None = Field(
        default=None, description="For fixed inputs: the value every element takes."
    )

    @property
    def batched(self) -> bool:
        """Whether batch sizes apply to this input: it has a batch axis and is not a fixed value
        (a fixed recurrent state, ``state_from``, is batched: its value fills each batch)."""
        return batched_on(self.batch_axis, self.source, self.state_from) is not None

    @property
    def dim_names(self) -> list[str]:
        """The swept dimensions named in ``shape`` (off the batch axis), in axis order."""
        axis = self.batch_axis if self.batched else None
        return [d for k, d in enumerate(self.shape) if isinstance(d, str) and k != axis]

    def sample_shape_at(self, dims: dict[str, int]) -> list[int]:
        """The shape of one sample with each named dimension at its size in ``dims``: ``shape``
        without its batch axis when batched (`schemas.rules.sample_at`)."""
        return sample_at(self.shape, self.batch_axis if self.batched else None, dims)

    @model_validator(mode="after")
    def _source_fields(self) -> InputSpec:
        if self.batch_axis is not None and self.batch_axis >= len(self.shape):
            raise ValueError(
                f"'batch_axis' {self.batch_axis} is not an axis of shape {self.shape} "
                f"(rank {len(self.shape)}); a scalar or an input fed whole takes batch_axis: null"
            )
        if self.source == "recorded" and not self.file:
            raise ValueError("a recorded input needs 'file' (a .npy file of samples)")
        if self.source == "fixed" and self.value is None:
            raise ValueError("a fixed input needs 'value'")
        if self.source == "generated" and self.high <= self.low:
            raise ValueError(f"'high' ({self.high}) must be greater than 'low' ({self.low})")
        return self


HOOK_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")
"""A hook: ``module:function``, the module importable from the project's folder (or
installed), e.g. ``prep:scale`` for ``scale`` in ``prep.py`` beside the project file."""


def _check_hook(value: str | None) -> str | None:
    if value is not None and not HOOK_RE.fullmatch(value):
        raise ValueError(
            f"{value[:80]!r} is not 'module:function' (e.g. 'prep:scale' for def scale in "
            "prep.py beside the project file)"
        )
    return value


Hook = Annotated[str, AfterValidator(_check_hook)]
"""A `HOOK_RE` reference."""


class Pipeline(ProjectPart):
    """The user's own code around every timed inference: what serving does besides the model."""

    pre: Hook | None = Field(
        default=None,
        description="'module:function' called with the batch as the workload built it "
        "({input name: array}) and returning the model's feed; timed as the 'pre' stage.",
    )
    post: Hook | None = Field(
        default=None,
        description="'module:function' called with the model's outputs (a list of arrays, "
        "after workload.postprocess) and returning what the service would answer (an array, or "
        "{name: array}, which parity compares too); timed as the 'post' stage.",
    )


class OpenLoop(ProjectPart):
    """An open-loop scenario: requests arrive at a rate, not back to back (MLPerf LoadGen's
    Server scenario), and the highest rate whose p99 meets the class's budget is searched."""

    servers: int = Field(
        default=1,
        ge=1,
        le=256,
        description="Threads taking requests from the one arrival queue, sharing one session.",
    )
    probe_s: float = Field(
        default=1.0,
        gt=0,
        le=3600,
        description="Seconds of arrivals per probed rate, and never less than 50 times "
        "budgets.p99_ms, so that a rate the servers cannot sustain shows its growing queue.",
    )
    max_arrivals: int = Field(
        default=100_000,
        ge=100,
        le=1_000_000,
        description="Most requests per probed rate (Poisson arrivals, batch 1).",
    )
    probes: int = Field(
        default=7,
        ge=2,
        le=20,
        description="Most rates the bisection probes between zero and the closed-loop rate.",
    )
    seed: int = Field(default=0, ge=0, description="Seed of the arrival times.")
    wait: Literal["spin", "sleep"] = Field(
        default="spin",
        description="How an idle server waits for the next arrival: 'spin' polls the clock, "
        "as a loaded server's threads (and onnxruntime's own pools) stay awake; 'sleep' sleeps, "
        "so that the host's wake-up from idle counts in the latency.",
    )


class OutputSpec(ProjectPart):
    """What one model output is, where the model's graph does not say it: the axis its
    samples lie on and whether it holds class scores (what parity measures on it)."""

    batch_axis: int | None = Field(
        default=None,
        ge=0,
        description="The axis of the output that holds a batch's samples, e.g. 1 for a "
        "time-first [T, N, C] recogniser whose graph leaves N unnamed. Unset: the axis the "
        "model's graph names with the batch symbol of an input, else (a recurrent state) the "
        "batch_axis of the input it is fed back to, else none. Parity compares each sample on "
        "its own either way (one inference per sample); the axis says what a position is.",
    )
    kind: Literal["scores", "state", "values"] | None = Field(
        default=None,
        description="scores: class scores over the last axis (top-1 agreement applies); "
        "state: a recurrent state; values: any other numbers (embeddings, boxes, regressions). "
        "state and values get no top-1 agreement. Unset: state when an input's state_from "
        "names the output, else scores for a floating-point output of rank 2 or more whose "
        "last axis is longer than 1, else values.",
    )


class Workload(ProjectPart):
    """What a run feeds the model and how latency is sampled."""

    inputs: dict[str, InputSpec] = Field(description="Model inputs by name.")
    outputs: dict[str, OutputSpec] = Field(
        default_factory=dict,
        description="What model outputs are, by name, where the graph does not say it (their "
        "batch axis; whether they are class scores, a recurrent state or other values).",
    )
    batch_sizes: list[Annotated[int, Field(gt=0)]] = Field(
        default=[1], min_length=1, description="Batch sizes to time."
    )
    concurrency: list[Annotated[int, Field(gt=0)]] = Field(
        default=[1], min_length=1, description="Concurrency levels: C threads share one session."
    )
    warmup: int = Field(default=50, ge=0, description="Warm-up inferences discarded per config.")
    parity_samples: int = Field(
        default=256, gt=0, description="Rows of input used for parity (baseline vs candidate)."
    )
    min_samples: int = Field(
        default=662,
        ge=459,
        description="Fewest latency samples a p99 is decided on, and the first look of the "
        "sequential p99 test (662: MLPerf LoadGen's minimum for p99 at 99% confidence with one "
        "over-budget sample). The first look gets the share of the error that lets it pass as "
        "well as fail; one that even half the error cannot let decide moves to the first size "
        "that can (459 becomes 528).",
    )
    max_samples: int = Field(
        default=20000, gt=0, description="Sampling stops here even if the bound has not decided."
    )
    time_cap_s: float | None = Field(
        default=None,
        gt=0,
        description="Sampling time cap per artifact and latency config, summed over its rounds; "
        "undecided at the cap means 'insufficient'. Unset, it adapts to the model: time for four "
        "times min_samples at the rate measured in the first round, between 20 s and 300 s.",
    )
    rounds: int = Field(
        default=40,
        ge=1,
        description="Fewest interleaved rounds per latency config: baseline and candidates each "
        "sample in turn, in alternating order, so that machine load hits all alike (raised "
        "automatically to the fewest that can bound the candidate/baseline ratio). Each round "
        "is one paired ratio: with 10 the ratio's lower bound is the smallest of them, and on "
        "a loaded 2-core machine a 13% slowdown was called in 9 runs of 20; with 40 rounds of "
        "at least 100 samples, in 18 of 20 (bench/ab.py, docs/benchmarks.md). The minimum "
        "samples are spread over them.",
    )
    aa_control: bool = Field(
        default=True,
        description="Serve the baseline in a second fresh process that samples in the same "
        "interleaved rounds (an A/A control). Two processes of the same bytes differ by a few "
        "percent for their whole life (code and data placement), which paired rounds cannot "
        "see: the control measures that spread, and a candidate is called slower only beyond "
        "it (the cell says how big a slowdown the run could have seen). Costs one more slice "
        "per round; false: no control, the slowdown gate then ignores the spread.",
    )
    throughput_s: float = Field(
        default=1.0,
        gt=0,
        description="Longest duration of the separate throughput pass per config; it ends "
        "earlier once 1,000 inferences ran (and at least 50 ms passed).",
    )
    confidence: float = Field(
        default=0.99, gt=0.5, lt=1.0, description="Confidence of the p99 bounds."
    )
    profile_runs: int = Field(
        default=100,
        ge=0,
        description="Inferences in the separate profiling pass that measures kernel time per "
        "provider (0 skips it; profiling costs ~20% latency, so it never overlaps timing).",
    )
    postprocess: Literal["none", "argmax", "softmax"] = Field(
        default="none",
        description="Post-processing included in end-to-end timing (applied to the first output).",
    )
    soak_s: float | None = Field(
        default=None,
        ge=10,
        le=7 * 86400,
        description="After the interleaved rounds, serve every artifact this long at the gate "
        "config and judge drift (qualify run --soak overrides it); unset: no soak.",
    )
    soak_tolerance: float = Field(
        default=0.2,
        ge=0,
        description="How much slower the last soak window's p99 may be than the first's.",
    )
    soak_floor: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description="The share of the class's p99 budget (budgets.p99_ms) a drift must add to "
        "the p99 for it to count: a p99 going from 0.02 to 0.06 ms against a 5 ms budget is "
        "beyond the tolerance but not a class to hold; 2 ms appearing against a 1 ms budget "
        "is. 0: every drift beyond the tolerance counts.",
    )
    open_loop: OpenLoop | None = Field(
        default=None,
        description="After the interleaved rounds, find each artifact's highest request rate "
        "(Poisson arrivals, latency from the scheduled arrival so that queueing counts) whose p99 "
        "meets budgets.p99_ms (qualify run --open-loop sets it with its defaults); unset: none.",
    )
    pipeline: Pipeline | None = Field(
        default=None,
        description="Pre- and post-processing hooks run around every timed inference: cells "
        "then report end-to-end latency, inference-only latency and each stage's share.",
    )
    dims: dict[
        DimName, Annotated[list[Annotated[int, Field(gt=0)]], Field(min_length=1, max_length=64)]
    ] = Field(
        default_factory=dict,
        description="Sizes to sweep for each dimension an input's shape names (e.g. "
        "{seq: [16, 64, 256]}): every combination is a latency config of its own. The pool "
        "holds samples at the largest sizes and each config takes their leading part (a "
        "recorded file needs at least the largest size on that axis); parity, cold init, "
        "the profile and the open loop use the largest.",
    )

    @property
    def dim_points(self) -> list[dict[str, int]]:
        """Every combination of the swept sizes, in the order written (``[{}]`` without dims)."""
        points: list[dict[str, int]] = [{}]
        for name, sizes in self.dims.items():
            points = [{**p, name: size} for p in points for size in dict.fromkeys(sizes)]
        return points

    @property
    def largest_dims(self) -> dict[str, int]:
        """Each swept dimension at its largest size: the size the input pool is built at."""
        return {name: max(sizes) for name, sizes in self.dims.items()}

    @model_validator(mode="after")
    def _levels(self) -> Workload:
        if not self.inputs:
            raise ValueError("'inputs' must name at least one model input")
        if self.max_samples < self.min_samples:
            raise ValueError("'max_samples' must be >= 'min_samples'")
        named = {d: name for name, spec in self.inputs.items() for d in spec.dim_names}
        for dim, name in named.items():
            if dim not in self.dims:
                raise ValueError(
                    f"input {name!r}: shape names dimension {dim!r}, which 'dims' does not "
                    f"give sizes; add dims: {{{dim}: [16, 64, 256]}} (the sizes to sweep) or "
                    "write a number in the shape"
                )
        unused = sorted(set(self.dims) - set(named))
        if unused:
            raise ValueError(
                f"dims {unused} are named in no input's shape; write the name in the shape of "
                "the input it sizes (e.g. shape: [1, seq, 16]) or remove it"
            )
        points = math.prod(len(set(sizes)) for sizes in self.dims.values())
        if points > 64:
            raise ValueError(
                f"'dims' makes {points} combinations of sizes, more than the 64 a run measures; "
                "sweep fewer sizes"
            )
        largest = self.largest_dims
        for name, spec in self.inputs.items():
            row = math.prod(spec.sample_shape_at(largest)) * ITEMSIZE[spec.dtype]
            rows = 1 if spec.source == "fixed" else max(POOL_ROWS, 16 * max(self.batch_sizes))
            if row * rows > MAX_INPUT_BYTES:
                raise ValueError(
                    f"input {name!r}: shape {spec.shape}"
                    + (f" at dims {largest}" if spec.dim_names else "")
                    + f" ({spec.dtype}) needs "
                    f"{row * rows / 2**30:.3g} GiB of input data ({rows} rows of {row} bytes), "
                    f"more than the {MAX_INPUT_BYTES // 2**30} GiB a run holds; use a smaller "
                    "shape or smaller batch_sizes"
                )
        return self

    def evidence_digest(self) -> str:
        """Digest of what a run feeds and times (`EVIDENCE_FIELDS`); a cell measured under
        another is stale (``workload_changed``). Settings the current verdict re-applies (the
        soak's tolerance and floor, what outputs are) or that only change how long sampling
        goes on are left out, and so are fields at their defaults, so that a field added later
        does not make every earlier cell stale."""
        doc = self.model_dump(mode="json", include=set(EVIDENCE_FIELDS), exclude_defaults=True)
        raw = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
        return "sha256:" + hashlib.sha256(raw).hexdigest()


EVIDENCE_FIELDS = (
    "inputs",
    "batch_sizes",
    "concurrency",
    "dims",
    "parity_samples",
    "confidence",
    "postprocess",
    "pipeline",
)
"""The workload fields a cell's evidence depends on: the inputs fed (shapes, data, seeds), the
configs timed, the rows parity compares, the confidence of the p99 bounds and what is timed
around the model."""
