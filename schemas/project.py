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
from typing import Annotated, Literal

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from schemas.base import NAME_RE, NAME_RULE, Name, Precision
from schemas.emulation import CPU_MODELS, NATIVE, EmulatedCpu
from schemas.tolerance import OutputTolerance, TaskTolerance, Tolerance, merge_tolerance
from schemas.workload import (
    DIM_RE,
    HOOK_RE,
    ITEMSIZE,
    MAX_INPUT_BYTES,
    POOL_ROWS,
    InputSpec,
    OpenLoop,
    OutputSpec,
    Pipeline,
    ProjectPart,
    Workload,
)

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


class ArtifactSpec(ProjectPart):
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


class Artifacts(ProjectPart):
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


class Parity(ProjectPart):
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


class Policy(ProjectPart):
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


class HostClassKey(ProjectPart):
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


class MatchRules(ProjectPart):
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


class RuntimeSpec(ProjectPart):
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


class ProviderSpec(ProjectPart):
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


class Budgets(ProjectPart):
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


class Emulation(ProjectPart):
    """How ``qualify run --emulate`` computes this class's numerics (parity outputs)."""

    cpu: EmulatedCpu | Literal["native"] = Field(
        description="The QEMU CPU model whose kernels compute the parity outputs: Nehalem, "
        "SandyBridge, Haswell (x86_64); cortex-a72, neoverse-n1 (aarch64); or 'native' to "
        "compute them on the measuring host's own CPU. Without an emulation section the model "
        "comes from the match rules (docs/platforms.md)."
    )


class HostClass(ProjectPart):
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


class Project(ProjectPart):
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
        overrides (`schemas.tolerance.merge_tolerance`, `schemas.tolerance.resolve_tolerance`)."""
        default = DEFAULT_TOLERANCES[precision]
        found = self.parity.families().get(precision)
        return merge_tolerance(default, found) if found is not None else default
