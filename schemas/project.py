"""The project file (``qualify.yaml``): what a qualification run needs to know.

Owns the models of the project document and their cross-field rules (one baseline, unique
host-class keys, positive budgets). Does not read files: ``qualify.project.load`` loads YAML, resolves
paths and turns validation errors into messages that point at lines.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from schemas.base import NAME_RE, NAME_RULE, Document, Name, Precision
from schemas.emulation import CPU_MODELS, NATIVE, EmulatedCpu
from schemas.rules import batched_on, merge_tolerance, sample_at

__all__ = [
    "DEFAULT_TOLERANCES",
    "DIM_RE",
    "HOOK_RE",
    "ITEMSIZE",
    "KNOWN_PROVIDERS",
    "MAX_INPUT_BYTES",
    "MAX_MEMORY_LIMIT_MB",
    "POOL_ROWS",
    "ArtifactSpec",
    "Artifacts",
    "Budgets",
    "Emulation",
    "HostClass",
    "HostClassKey",
    "InputSpec",
    "MatchRules",
    "OpenLoop",
    "OutputSpec",
    "OutputTolerance",
    "Parity",
    "Pipeline",
    "Policy",
    "Project",
    "ProviderSpec",
    "RuntimeSpec",
    "TaskTolerance",
    "Tolerance",
    "Workload",
    "open_loop_seconds",
    "outlasting_timeout",
]

KNOWN_PROVIDERS: frozenset[str] = frozenset(
    {
        # onnxruntime.get_all_providers() of 1.32, plus names of builds it does not list.
        "ACLExecutionProvider",
        "ArmNNExecutionProvider",
        "AzureExecutionProvider",
        "CANNExecutionProvider",
        "CPUExecutionProvider",
        "CUDAExecutionProvider",
        "CoreMLExecutionProvider",
        "DmlExecutionProvider",
        "DnnlExecutionProvider",
        "JsExecutionProvider",
        "MIGraphXExecutionProvider",
        "NnapiExecutionProvider",
        "NvTensorRTRTXExecutionProvider",
        "OpenVINOExecutionProvider",
        "QNNExecutionProvider",
        "ROCMExecutionProvider",
        "RknpuExecutionProvider",
        "SNPEExecutionProvider",
        "TensorrtExecutionProvider",
        "VSINPUExecutionProvider",
        "VitisAIExecutionProvider",
        "WebGpuExecutionProvider",
        "WebNNExecutionProvider",
        "XnnpackExecutionProvider",
    }
)
"""Execution-provider names onnxruntime knows; any other name is a spelling mistake that
onnxruntime would only warn about before running everything on the CPU."""


class _ProjectDocument(Document):
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


class ArtifactSpec(_ProjectDocument):
    """One ONNX file the run qualifies."""

    path: str = Field(description="Path of the .onnx file, relative to the project file.")
    name: Name | None = Field(
        default=None,
        description="Short label for tables and reports; defaults to the file stem. Letters, "
        "digits, '.', '_', '+', '-'.",
    )
    precision: Precision = Field(
        default="fp32",
        description="Precision family; selects the parity tolerances (fp32, fp16, int8, pruned).",
    )
    derived_from: str | None = Field(
        default=None,
        description="Lineage: 'baseline' or the name of the artifact this one was derived from.",
    )
    how: str | None = Field(
        default=None,
        description="Lineage: how it was derived, e.g. 'quantize_dynamic per-channel'.",
    )
    uri: str | None = Field(
        default=None,
        description="Where hosts fetch this artifact; defaults to the content-addressed store path.",
    )

    @property
    def label(self) -> str:
        """The display name: ``name`` or the file stem."""
        if self.name:
            return self.name
        stem = self.path.rsplit("/", 1)[-1]
        return stem[:-5] if stem.endswith(".onnx") else stem

    @model_validator(mode="after")
    def _label_is_a_name(self) -> ArtifactSpec:
        if self.name is None and not NAME_RE.fullmatch(self.label):
            raise ValueError(
                f"the file stem {self.label[:80]!r} is not a name ({NAME_RULE}); set 'name'"
            )
        return self


class Artifacts(_ProjectDocument):
    """The baseline and its candidates."""

    baseline: ArtifactSpec = Field(
        description="The approved artifact every class may fall back to."
    )
    candidates: list[ArtifactSpec] = Field(
        default_factory=list, description="Optimised artifacts to qualify against the baseline."
    )

    @model_validator(mode="after")
    def _unique_labels(self) -> Artifacts:
        labels = [self.baseline.label, *(c.label for c in self.candidates)]
        dupes = sorted({x for x in labels if labels.count(x) > 1})
        if dupes:
            raise ValueError(
                f"artifact names must be unique, found {dupes} more than once; set 'name' on one"
            )
        return self


class InputSpec(_ProjectDocument):
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


class Pipeline(_ProjectDocument):
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


class OpenLoop(_ProjectDocument):
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


class OutputSpec(_ProjectDocument):
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


class Workload(_ProjectDocument):
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


_INHERITED = (
    " Left out: inherited (per output from its family's entry, a family's from the built-in "
    "default); null: not checked."
)


class OutputTolerance(_ProjectDocument):
    """Parity tolerances for one output. A limit left out is inherited field by field (an
    output's from its family's entry, a family's from the built-in defaults); a limit set to
    null is not checked (`schemas.rules.merge_tolerance`)."""

    max_abs: float | None = Field(
        default=None, ge=0, description="Largest allowed |a-b|." + _INHERITED
    )
    mean_abs: float | None = Field(
        default=None, ge=0, description="Largest allowed mean |a-b|." + _INHERITED
    )
    max_rel: float | None = Field(
        default=None, ge=0, description="Largest allowed |a-b| / max(|a|, eps)." + _INHERITED
    )
    cosine_min: float | None = Field(
        default=None,
        ge=-1,
        le=1,
        description="Smallest allowed cosine similarity per sample." + _INHERITED,
    )
    top1_agreement_min: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Smallest allowed share of positions whose arg-max over the last axis agrees "
        "(class-score outputs of rank 2 or more: per row, or per step of a sequence)." + _INHERITED,
    )


class Tolerance(OutputTolerance):
    """Parity tolerances of one precision family, overridable per output."""

    outputs: dict[str, OutputTolerance] = Field(
        default_factory=dict,
        description="Per-output overrides, by output name: each limit given here replaces the "
        "family's for that output alone (null turns it off there); the others are the family's.",
    )


class TaskTolerance(_ProjectDocument):
    """Task-level parity of one answer of the workload's post hook: what a user of the service
    sees, compared as a task is scored (tensor parity can pass a detector that lost every box)."""

    exact_match_min: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Smallest share of samples whose answer (a string, integers: the whole "
        "answer to one sample) equals the baseline's exactly.",
    )
    box_f1_min: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Smallest F1 of the candidate's boxes against the baseline's over all "
        "samples. Each sample's answer is an array of boxes [K, 4 or more]: columns x1, y1, x2, "
        "y2 (then anything, e.g. score and class); a candidate box matches one baseline box of "
        "IoU at least iou, one to one, the best overlaps first.",
    )
    iou: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Intersection over union at which two boxes match, for box_f1_min.",
    )


class Parity(_ProjectDocument):
    """Parity tolerances: tensor tolerances per precision family, task-level ones per answer."""

    fp32: Tolerance | None = Field(
        default=None,
        description="fp32 candidates; unset: the default fp32 tolerance; a limit left out "
        "keeps the default's, null turns it off.",
    )
    fp16: Tolerance | None = Field(
        default=None,
        description="fp16 candidates; unset: the default fp16 tolerance; a limit left out "
        "keeps the default's, null turns it off.",
    )
    int8: Tolerance | None = Field(
        default=None,
        description="int8 candidates; unset: the default int8 tolerance; a limit left out "
        "keeps the default's, null turns it off.",
    )
    pruned: Tolerance | None = Field(
        default=None,
        description="pruned candidates; unset: the default pruned tolerance; a limit left out "
        "keeps the default's, null turns it off.",
    )
    post: dict[str, TaskTolerance] = Field(
        default_factory=dict,
        description="Task-level tolerances of what workload.pipeline.post answers, for every "
        "candidate: by the answer's key ({text: {exact_match_min: 0.95}} for a post hook that "
        "answers {text: ...}); 'post' for a hook that answers one value. Shown first where set.",
    )

    def families(self) -> dict[str, Tolerance]:
        """The precision families the file sets, by name."""
        return {
            name: tol
            for name in ("fp32", "fp16", "int8", "pruned")
            if (tol := getattr(self, name)) is not None
        }

    def task(self, output: str) -> TaskTolerance | None:
        """The task-level tolerance of a parity output (``post`` or ``post.<key>``), if any."""
        if output == "post":
            return self.post.get("post")
        if output.startswith("post."):
            return self.post.get(output[len("post.") :])
        return None


DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "fp32": Tolerance(max_abs=1e-4, cosine_min=0.99999, top1_agreement_min=1.0),
    "fp16": Tolerance(max_abs=1e-2, cosine_min=0.999, top1_agreement_min=0.99),
    "int8": Tolerance(max_abs=0.05, cosine_min=0.99, top1_agreement_min=0.98),
    "pruned": Tolerance(max_abs=0.1, cosine_min=0.98, top1_agreement_min=0.97),
}


class Policy(_ProjectDocument):
    """Fleet-wide decision policy."""

    unknown_class: Literal["baseline", "hold"] = Field(
        default="hold", description="What a class with no evidence gets."
    )
    allow_emulated: bool | Literal["parity"] = Field(
        default=False,
        description="Which emulated evidence may qualify a candidate. false: none (neither a "
        "cell measured on a host outside the class nor parity computed on an emulated CPU); "
        "'parity': parity computed under QEMU on a CPU of the class's own ISA counts as the "
        "class's, while latency, memory and init must still come from a host of the class; "
        "true: any (also figures measured on a host outside the class, and numerics of another "
        "ISA).",
    )
    failing_baseline: Literal["hold", "baseline"] = Field(
        default="hold",
        description="What a class gets when no candidate qualifies and the baseline fails the "
        "class's own gates too (e.g. it lost its accelerator and runs on the CPU over budget): "
        "'hold' keeps what its hosts run; 'baseline' ships the baseline anyway.",
    )
    busy_host: Literal["allow", "refuse"] = Field(
        default="allow",
        description="Evidence from a run flagged host_busy (its load average exceeded the usable "
        "cores while measuring): 'allow' uses it (the interleaved rounds shared the load "
        "fairly), 'refuse' does not let such a run qualify a candidate.",
    )
    choose: Literal["lowest_p99_upper"] = Field(
        default="lowest_p99_upper",
        description="How to choose among several passing candidates.",
    )

    @property
    def emulated_hosts_qualify(self) -> bool:
        """Whether a cell measured on a host outside its class may qualify (``true`` only)."""
        return self.allow_emulated is True

    @property
    def emulated_numerics_qualify(self) -> bool:
        """Whether parity computed on an emulated CPU of the class's ISA may qualify
        (``true`` or ``'parity'``)."""
        return self.allow_emulated is not False


class HostClassKey(_ProjectDocument):
    """The key of a host class: (hardware, runtime, provider) labels."""

    hardware: Name = Field(description="Hardware label, e.g. 'arm-r5'.")
    runtime: Name = Field(description="Runtime label, e.g. 'ort-r8'.")
    provider: Name = Field(description="Provider label, e.g. 'cpu-int8'.")

    def as_tuple(self) -> tuple[str, str, str]:
        """The key as a tuple, for lookups."""
        return (self.hardware, self.runtime, self.provider)


IsaFeature = Literal[
    "amx", "asimddp", "avx2", "avx512_vnni", "avx512f", "avx_vnni", "f16c", "fp16", "i8mm", "sve"
]


class MatchRules(_ProjectDocument):
    """Rules a host must satisfy to belong to the class."""

    arch: str | None = Field(default=None, description="Machine architecture, e.g. x86_64.")
    cpu_flags: list[str] = Field(
        default_factory=list,
        description="CPU flags that must all be present (both spellings are accepted: "
        "avx512_vnni / avx512vnni).",
    )
    isa: list[IsaFeature] = Field(
        default_factory=list,
        description="ISA features (normalised names) the hosts must have, those that change "
        "int8/fp16 numerics: avx2, avx512f, avx512_vnni, avx_vnni, amx, f16c (x86); asimddp, "
        "i8mm, sve, fp16 (ARM). A cell measured on a host without them is marked 'numerics from "
        "another ISA'.",
    )
    cpu_model: str | None = Field(
        default=None, description="Substring the CPU model name must contain."
    )
    min_cores: int | None = Field(default=None, gt=0, description="Fewest usable cores.")
    min_memory_mb: int | None = Field(default=None, gt=0, description="Least total memory.")
    accelerator: str | None = Field(
        default=None,
        description="An execution provider that must be available on the host, e.g. "
        "CUDAExecutionProvider.",
    )


class RuntimeSpec(_ProjectDocument):
    """The runtime identity a class stands for."""

    package: str = Field(
        default="onnxruntime", description="Distribution name, e.g. onnxruntime-gpu."
    )
    version: str = Field(default="*", description="Version pattern, e.g. '1.31.*'.")
    build_info: str | None = Field(
        default=None, description="Substring the runtime's build info must contain."
    )


OptionValue = str | bool | int | float
"""A provider option or session config value, as YAML writes it."""

_OWN_SESSION_KEYS = {
    "session.disable_cpu_ep_fallback": "use 'strict_fallback: true' instead",
    "session.record_ep_graph_assignment_info": "qualify records placement on every run",
}


MAX_MEMORY_LIMIT_MB = 16 * 2**20
"""The largest ``budgets.memory_limit_mb``: 16 TiB of address space, beyond any host's memory
(a larger number would reach the measuring child only to fail in ``setrlimit``)."""

MAX_CPU = 8191
"""The highest CPU number a class may name (Linux's default NR_CPUS ceiling)."""


class ProviderSpec(_ProjectDocument):
    """Execution providers and session options of a class."""

    execution_providers: list[str] = Field(
        default=["CPUExecutionProvider"], min_length=1, description="Requested providers, in order."
    )
    provider_options: dict[str, dict[str, OptionValue]] = Field(
        default_factory=dict,
        description="Options per provider name, e.g. {CUDAExecutionProvider: {device_id: 0}}; "
        "values are JSON scalars, handed to onnxruntime as strings (true/false as 1/0).",
    )
    session_config: dict[str, OptionValue] = Field(
        default_factory=dict,
        description="onnxruntime session config entries (SessionOptions.add_session_config_entry),"
        " e.g. {session.x64quantprecision: 1, session.intra_op.allow_spinning: 0}; they change "
        "numbers and speed, so they count in the settings digest like every provider setting.",
    )
    expected: str = Field(
        default="",
        description="The provider that must actually execute the nodes; others count as "
        "fallback. Defaults to the first requested provider, so a class that asks for CUDA is "
        "judged on CUDA, never silently on the CPU it falls back to.",
    )
    fallback_allowance: int = Field(
        default=0, ge=0, description="Nodes allowed off the expected provider."
    )
    intra_op_threads: int | None = Field(default=None, ge=0, description="intra_op_num_threads.")
    inter_op_threads: int | None = Field(default=None, ge=0, description="inter_op_num_threads.")
    graph_optimization_level: Literal["disable", "basic", "extended", "all"] = Field(
        default="all", description="Graph optimisation level."
    )
    execution_mode: Literal["sequential", "parallel"] | None = Field(
        default=None,
        description="onnxruntime's execution mode: 'parallel' runs independent branches of the "
        "graph at once on inter_op_threads; unset: onnxruntime's default, sequential.",
    )
    strict_fallback: bool = Field(
        default=False,
        description="Set session.disable_cpu_ep_fallback: session creation fails instead of "
        "silently falling back to the CPU.",
    )
    cpu_affinity: list[Annotated[int, Field(ge=0, le=MAX_CPU)]] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_CPU + 1,
        description="CPUs the serving process runs on (as taskset -c), applied in the measuring "
        "process before the session is created; unset: wherever the OS puts it. onnxruntime's "
        "own per-thread pinning is session_config 'session.intra_op_thread_affinities'.",
    )
    numa_node: int | None = Field(
        default=None,
        ge=0,
        le=1023,
        description="Run on this NUMA node's CPUs (intersected with cpu_affinity when both).",
    )

    @model_validator(mode="after")
    def _known_providers(self) -> ProviderSpec:
        for name in [*self.execution_providers, *self.provider_options]:
            if name not in KNOWN_PROVIDERS:
                close = difflib.get_close_matches(name, sorted(KNOWN_PROVIDERS), n=1)
                hint = f"did you mean {close[0]!r}?" if close else "see onnxruntime's provider list"
                raise ValueError(f"unknown execution provider {name!r}; {hint}")
        for key in self.session_config:
            if not key or any(c.isspace() for c in key):
                raise ValueError(f"session_config key {key!r} must be a non-empty word")
            if key in _OWN_SESSION_KEYS:
                raise ValueError(
                    f"session_config {key!r} is set by qualify itself; {_OWN_SESSION_KEYS[key]}"
                )
        if not self.expected:
            object.__setattr__(self, "expected", self.execution_providers[0])
        elif self.expected not in self.execution_providers:
            raise ValueError(
                f"expected provider {self.expected!r} is not among the requested "
                f"execution_providers {self.execution_providers}; add it there or change 'expected'"
            )
        return self


class Budgets(_ProjectDocument):
    """Limits a candidate must meet on the class."""

    p99_ms: float = Field(
        gt=0, description="p99 latency budget; the p99 upper bound must be <= it."
    )
    peak_rss_mb: float | None = Field(
        default=None, gt=0, description="Peak resident memory budget."
    )
    cold_init_ms: float | None = Field(
        default=None, gt=0, description="Cold init budget: session creation plus first inference."
    )
    min_throughput: float | None = Field(
        default=None,
        gt=0,
        description="Fewest samples per second (inferences x batch size) the artifact must "
        "serve at its best latency config, from the separate throughput pass; unset: not gated.",
    )
    min_rate_rps: float | None = Field(
        default=None,
        gt=0,
        description="Fewest requests per second the artifact must sustain with its p99 within "
        "p99_ms under Poisson arrivals (workload.open_loop); unset: not gated.",
    )
    energy_mj: float | None = Field(
        default=None,
        gt=0,
        description="Energy budget per inference at the gate config, millijoules, from the "
        "host's counters (powercap RAPL package and DRAM); unset: not gated.",
    )
    max_slowdown: float = Field(
        default=1.0,
        gt=0,
        description="Largest candidate/baseline latency ratio allowed at p50 and at p99, from "
        "the paired rounds of the interleaved A/B: a candidate fails when the lower confidence "
        "bound of the ratio is above it (1.0: it must not be measurably slower than the "
        "baseline; 1.1 tolerates 10%).",
    )
    timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="Wall-clock limit of one artifact's subprocess, counting only the time spent "
        "waiting on it (its own rounds of the interleaved A/B, not the others').",
    )
    memory_limit_mb: int = Field(
        default=8192,
        gt=0,
        le=MAX_MEMORY_LIMIT_MB,
        description="Address-space limit of one artifact's subprocess (RLIMIT_AS); exceeding it "
        "is an 'out_of_memory' error. At most 16 TiB (16777216), more than any host gives.",
    )


class Emulation(_ProjectDocument):
    """How ``qualify run --emulate`` computes this class's numerics (parity outputs)."""

    cpu: EmulatedCpu | Literal["native"] = Field(
        description="The QEMU CPU model whose kernels compute the parity outputs: Nehalem, "
        "SandyBridge, Haswell (x86_64); cortex-a72, neoverse-n1 (aarch64); or 'native' to "
        "compute them on the measuring host's own CPU. Without an emulation section the model "
        "comes from the match rules (README: Numerics of hosts you do not have)."
    )


class HostClass(_ProjectDocument):
    """A named cohort of hosts."""

    key: HostClassKey = Field(description="The (hardware, runtime, provider) key.")
    match: MatchRules = Field(default_factory=MatchRules, description="Host match rules.")
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec, description="Runtime identity.")
    provider: ProviderSpec = Field(
        default_factory=ProviderSpec, description="Providers and options."
    )
    budgets: Budgets = Field(description="Budgets a candidate must meet.")
    emulation: Emulation | None = Field(
        default=None,
        description="The emulated CPU for --emulate's parity, overriding the one the match "
        "rules give; not part of the settings digest (a cell records what computed its "
        "numerics).",
    )

    @model_validator(mode="after")
    def _emulated_cpu_of_its_arch(self) -> HostClass:
        cpu = self.emulation.cpu if self.emulation is not None else NATIVE
        model = CPU_MODELS.get(cpu)
        arch = self.match.arch
        if model is not None and arch is not None and model.arch != arch:
            raise PydanticCustomError(
                "emulated_cpu_arch",
                "emulation.cpu {cpu} is an {model_arch} CPU, but the class's match.arch is "
                "{arch}; name one of: {known}, or 'native'",
                {
                    "cpu": cpu,
                    "model_arch": model.arch,
                    "arch": arch,
                    "known": ", ".join(m.name for m in CPU_MODELS.values() if m.arch == arch)
                    or "none",
                },
            )
        return self

    @model_validator(mode="after")
    def _strict_fallback_falls_back_nowhere(self) -> HostClass:
        """``strict_fallback`` with a provider to fall back to is a class no cell can measure:
        onnxruntime refuses a session that lists the CPU provider with CPU fallback disabled
        ("Conflicting session configuration"), and a provider after the expected one is a
        fallback the class says it forbids. Refused here, where the project loads, not as an
        error in every cell."""
        provider = self.provider
        if not provider.strict_fallback:
            return self
        providers = provider.execution_providers
        after = providers[providers.index(provider.expected) + 1 :]
        listed = [
            *after,
            *(["CPUExecutionProvider"] if "CPUExecutionProvider" in providers else []),
        ]
        if listed:
            raise PydanticCustomError(
                "strict_fallback_with_fallback",
                "provider.strict_fallback is true, but execution_providers {providers} lists "
                "{listed} to fall back to (onnxruntime refuses a session that lists "
                "CPUExecutionProvider with CPU fallback disabled, and a provider after the "
                "expected {expected} is a fallback): list only {expected} (nodes it cannot take "
                "then fail loudly), or set strict_fallback: false (fallback nodes then count "
                "against fallback_allowance)",
                {
                    "providers": list(providers),
                    "listed": ", ".join(dict.fromkeys(listed)),
                    "expected": provider.expected,
                },
            )
        return self

    def settings_digest(self) -> str:
        """Digest of the runtime and provider settings; a cell measured under another is stale.

        Placement on cores and the execution mode count once set; unset, they are left out, so
        that the digests of classes written before they existed do not change."""
        optional = {"cpu_affinity", "numa_node", "execution_mode"}
        unset = {f for f in optional if getattr(self.provider, f) is None}
        doc = {
            "runtime": self.runtime.model_dump(),
            "provider": self.provider.model_dump(exclude=unset),
        }
        raw = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
        return "sha256:" + hashlib.sha256(raw).hexdigest()


def open_loop_seconds(spec: OpenLoop, p99_budget_ms: float) -> float:
    """The least time an open-loop search keeps one artifact's subprocess busy: every probe
    lasts ``probe_s``, and never less than 50 p99 budgets (``qualify.measure.openloop.arrivals``)."""
    return spec.probes * max(spec.probe_s, 50 * p99_budget_ms / 1000.0)


def outlasting_timeout(
    workload: Workload,
    host_class: HostClass,
    *,
    soak_s: float | None = None,
    open_loop: OpenLoop | None = None,
) -> str | None:
    """Why a class's subprocesses would be killed mid-measurement, with the fields to change;
    None when they would not: a soak or an open-loop search that alone takes longer than
    ``budgets.timeout_s`` loses both artifacts' whole measurements to timeouts.

    Args:
        soak_s, open_loop: what the run does, when not the workload's (``--soak``,
            ``--open-loop``).
    """
    timeout = host_class.budgets.timeout_s
    soak = soak_s if soak_s is not None else workload.soak_s
    if soak is not None and soak >= timeout:
        return (
            f"workload.soak_s ({soak:g} s) is not shorter than budgets.timeout_s "
            f"({timeout:g} s), which bounds each artifact's subprocess: every artifact would be "
            f"killed mid-soak. Raise budgets.timeout_s above the soak plus the measurement "
            f"(e.g. {math.ceil(soak + 300)}), or soak less"
        )
    spec = open_loop if open_loop is not None else workload.open_loop
    if spec is not None:
        needs = open_loop_seconds(spec, host_class.budgets.p99_ms)
        if needs >= timeout:
            return (
                f"workload.open_loop ({spec.probes} probes of at least "
                f"{needs / spec.probes:g} s each: probe_s, or 50 budgets.p99_ms) takes "
                f"{needs:g} s, not less than budgets.timeout_s ({timeout:g} s): every "
                "artifact would be killed mid-search. Raise budgets.timeout_s (e.g. "
                f"{math.ceil(needs + 300)}), or lower open_loop.probes or probe_s"
            )
    return None


class Project(_ProjectDocument):
    """The whole project file."""

    model: Name = Field(description="Model name, e.g. 'ocr-rec'.")
    artifacts: Artifacts = Field(description="Baseline and candidates.")
    workload: Workload = Field(description="Inputs and the latency protocol.")
    parity: Parity = Field(
        default_factory=Parity,
        description="Parity tolerances per precision family, merged field by field over the "
        "built-in defaults ("
        + "; ".join(
            f"{family}: "
            + ", ".join(
                f"{name} {value:g}"
                for name, value in tolerance.model_dump(exclude={"outputs"}).items()
                if value is not None
            )
            for family, tolerance in DEFAULT_TOLERANCES.items()
        )
        + "): a family left out, or a limit left out of a family's entry, keeps the default; "
        "a limit set to null is not checked. parity.post sets task-level tolerances of the post "
        "hook's answers.",
    )
    policy: Policy = Field(default_factory=Policy, description="Fleet decision policy.")
    host_classes: dict[Name, HostClass] = Field(
        min_length=1,
        description="Host classes by name (letters, digits, '.', '_', '+', '-'; e.g. 'arm-r5').",
    )

    @model_validator(mode="after")
    def _unique_keys(self) -> Project:
        seen: dict[tuple[str, str, str], str] = {}
        for name, cls in self.host_classes.items():
            key = cls.key.as_tuple()
            if key in seen:
                raise PydanticCustomError(
                    "duplicate_host_class_key",
                    "host classes '{first}' and '{second}' have the same key {key}; "
                    "every class needs its own (hardware, runtime, provider)",
                    {"first": seen[key], "second": name, "key": list(key)},
                )
            seen[key] = name
        for name, cls in self.host_classes.items():
            why = outlasting_timeout(self.workload, cls)
            if why is not None:
                raise ValueError(f"host class {name!r}: {why}")
        return self

    @model_validator(mode="after")
    def _post_needs_a_hook(self) -> Project:
        pipeline = self.workload.pipeline
        if self.parity.post and (pipeline is None or pipeline.post is None):
            raise ValueError(
                "parity.post sets tolerances of the post hook's answers, but "
                "workload.pipeline.post is not set; add the hook that answers them or remove "
                "parity.post"
            )
        return self

    def tolerance(self, precision: str) -> Tolerance:
        """The tolerance of a precision family: the built-in default, with each limit the
        project's family entry sets (null included) in its place, and the entry's per-output
        overrides (`schemas.rules.merge_tolerance`, `schemas.rules.resolve_tolerance`)."""
        default = DEFAULT_TOLERANCES[precision]
        found = self.parity.families().get(precision)
        return merge_tolerance(default, found) if found is not None else default
