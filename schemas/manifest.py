"""Release manifests: per-class decisions, the signed manifest, per-class documents and diffs.

Owns the models only. ``manifest.policy`` makes ``ClassDecision``s, ``manifest.build`` turns them
into the ``signed`` part of a ``Manifest`` (and one ``ClassDocument`` per class), and
``manifest.resolve`` reads the same JSON on hosts with the standard library alone, so nothing
here may be needed to *read* a manifest.

The signed content holds no float (see ``manifest.envelope``): durations are integer
microseconds (``*_us``), memory integer kibibytes (``*_kb``), measured ratios strings rendered
with ``format(x, ".6e")``, times ``YYYY-MM-DDTHH:MM:SSZ`` strings.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.base import Digest, Document, Role, Verdict
from schemas.cell import Reason
from schemas.project import HostClassKey, MatchRules, Policy, ProviderSpec, RuntimeSpec
from schemas.reasons import DECISION_CODES, REASONS

__all__ = [
    "CLASS_DOCUMENT_TYPE",
    "DECISION_REASON_CODES",
    "MANIFEST_FORMAT",
    "MANIFEST_TYPE",
    "ArtifactRef",
    "ChangeSide",
    "ClassChange",
    "ClassDecision",
    "ClassDocument",
    "ClassDocumentSigned",
    "Decision",
    "EmulatedNumerics",
    "Evidence",
    "Manifest",
    "ManifestArtifact",
    "ManifestEntry",
    "ManifestSigned",
    "OutputParitySummary",
    "ParitySummary",
    "PreviousEntry",
    "PreviousManifest",
    "PreviousSigned",
    "Rollback",
    "Rollout",
    "Signature",
]

MANIFEST_FORMAT = "qualify-manifest/1"
MANIFEST_TYPE = "qualify-manifest"
CLASS_DOCUMENT_TYPE = "qualify-class-manifest"

Decision = Literal["candidate", "baseline", "hold"]

_TIME_PATTERN = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$"
_HEX64 = r"^[0-9a-f]{64}$"


def _is_none(value: object) -> bool:
    return value is None


DECISION_REASON_CODES: dict[str, str] = {code: REASONS[code] for code in DECISION_CODES}
"""Reason codes of a decision. Several can apply; ``message`` gives the evidence."""


class ArtifactRef(Document):
    """Where hosts fetch one artifact: what ``manifest.build`` needs to know per digest."""

    name: str = Field(description="Artifact label from the project file.")
    uri: str = Field(description="Where hosts fetch the artifact's bytes.")
    length: int = Field(ge=0, description="Size of the artifact in bytes.")


class OutputParitySummary(Document):
    """Parity of one output, summarised for the manifest (numbers as fixed strings)."""

    passed: bool = Field(description="Whether every tolerance held for this output.")
    max_abs: str | None = Field(
        description="Largest |a-b|, rendered with format(x, '.6e'); null if not comparable."
    )
    cosine_min: str | None = Field(
        description="Smallest per-sample cosine similarity, '.6e'; null if not comparable."
    )
    top1_agreement: str | None = Field(
        description="Share of samples whose arg-max agrees, '.6e'; null if not class scores."
    )


class ParitySummary(Document):
    """Parity of a candidate against the baseline, summarised for the manifest (the policy has
    checked it was measured against this release's baseline)."""

    passed: bool = Field(description="Whether every output passed.")
    samples: int = Field(description="Input rows compared.")
    outputs: dict[str, OutputParitySummary] = Field(description="Per output, by name.")


class EmulatedNumerics(Document):
    """Parity computed under QEMU on an emulated CPU of the class's own ISA."""

    cpu: str = Field(description="The emulated CPU model (QEMU's name), e.g. neoverse-n1.")
    arch: str = Field(description="Its architecture, e.g. aarch64.")
    qemu: str = Field(description="The QEMU version that emulated it.")


class Evidence(Document):
    """The cell a decision rests on, in integers and strings only."""

    run_id: str = Field(description="The run the cell belongs to.")
    artifact_digest: Digest = Field(description="The artifact measured.")
    artifact_name: str = Field(description="Its label.")
    role: Role = Field(description="baseline or candidate.")
    verdict: Verdict = Field(
        description="The cell's verdict under the project file the manifest was generated from: "
        "its stored evidence judged again against the budgets and tolerances then "
        "(manifest.verdict)."
    )
    measured_at: str = Field(pattern=_TIME_PATTERN, description="When it was measured (UTC).")
    emulated: bool = Field(description="Measured on a host that does not match the class.")
    isa_mismatch: list[str] = Field(
        default_factory=list,
        description="Numerics from another ISA: how the measuring host's ISA differs from the "
        "class's (empty: the same).",
    )
    emulated_numerics: EmulatedNumerics | None = Field(
        default=None,
        # Absent rather than null: manifests of natively measured evidence keep the bytes they
        # had before the field existed (the builder writes the same, `manifest.build`).
        exclude_if=_is_none,
        description="Present when the parity was computed under QEMU on an emulated CPU of the "
        "class's ISA (numerics of this ISA, emulated); absent when computed on the measuring "
        "host's own CPU (then isa_mismatch says whether its ISA was the class's).",
    )
    p99_us: int | None = Field(
        description="p99 point estimate of the gating latency config, integer microseconds."
    )
    p99_upper_us: int | None = Field(
        description="Its upper confidence bound, integer microseconds; null if not claimed."
    )
    p99_budget_us: int = Field(description="The class's current p99 budget, microseconds.")
    batch_size: int | None = Field(description="Batch size of the gating latency config.")
    concurrency: int | None = Field(description="Concurrency of the gating latency config.")
    samples: int | None = Field(description="Timed samples of the gating latency config.")
    fallback_nodes: int | None = Field(
        description="Nodes off the class's expected provider; null if placement is unknown."
    )
    peak_rss_kb: int | None = Field(description="Peak RSS of the subprocess, KiB.")
    cold_init_us: int | None = Field(description="Cold init, microseconds.")
    parity: ParitySummary | None = Field(description="Parity summary; null for the baseline.")


class ClassDecision(Document):
    """What one host class gets in a release, and why (the policy's output)."""

    host_class: str = Field(description="Host class name.")
    key: HostClassKey = Field(description="(hardware, runtime, provider).")
    decision: Decision = Field(description="candidate, baseline or hold.")
    artifact_digest: Digest | None = Field(description="The artifact the class runs; null on hold.")
    artifact_name: str | None = Field(description="Its label; null on hold.")
    rollback_digest: Digest | None = Field(
        description="The most recent artifact the class was assigned before, other than its own, "
        "proven to load on its current runtime; the baseline when there is none; null when the "
        "class runs the baseline and has nothing further to go back to (reason no_rollback), or "
        "the baseline's digest is unknown."
    )
    rollback_name: str | None = Field(description="The rollback artifact's label.")
    rollback_proven: bool = Field(
        description="Whether a current, non-stale run showed the rollback artifact loads under "
        "the class's current runtime."
    )
    rollback_runtime: RuntimeSpec = Field(
        description="The runtime the rollback was approved under (the class's own at first)."
    )
    rollback_provider: ProviderSpec = Field(
        description="The provider settings the rollback was approved under."
    )
    evidence: Evidence | None = Field(
        description="The cell the decision rests on; null when there is none."
    )
    reasons: list[Reason] = Field(
        description="Reason codes with evidence; see DECISION_REASON_CODES."
    )
    summary: str = Field(description="One sentence a person can act on.")
    run_ids: list[str] = Field(description="Every run the decision looked at, sorted.")


class ManifestArtifact(Document):
    """An artifact a manifest points at."""

    name: str = Field(description="Artifact label.")
    digest: Digest = Field(description="sha256 of its bytes; hosts check it before loading.")
    length: int = Field(ge=0, description="Size in bytes.")
    uri: str = Field(description="Where hosts fetch it.")


class Rollback(ManifestArtifact):
    """The artifact a class returns to, and the runtime it is known to work under."""

    proven_to_load: bool = Field(
        description="Whether a current run showed it loads under the class's current runtime."
    )
    runtime: RuntimeSpec | None = Field(
        description="Runtime it was approved under; null: the same as the entry's."
    )
    provider: ProviderSpec | None = Field(
        description="Provider settings it was approved under; null: the same as the entry's."
    )

    @classmethod
    def ran(cls, artifact: ManifestArtifact) -> Rollback:
        """``artifact`` as the rollback of the hosts that ran it: proven to load there, under the
        entry's own runtime and provider."""
        return cls(
            name=artifact.name,
            digest=artifact.digest,
            length=artifact.length,
            uri=artifact.uri,
            proven_to_load=True,
            runtime=None,
            provider=None,
        )


class Rollout(Document):
    """A staged rollout of one class: a cohort of its hosts runs ``artifact``, the rest run the
    entry's artifact. Which hosts are in the cohort is a stable hash of the rollout id and the
    host id (``manifest.lookup.cohort_point``), so a host stays in as ``percent`` grows."""

    id: str = Field(
        min_length=1, max_length=128, description="The rollout's id; it seeds the cohort hash."
    )
    artifact: ManifestArtifact = Field(description="What the cohort runs.")
    percent: int = Field(
        ge=0, le=100, description="Share of the class's hosts in the cohort, whole percent."
    )
    step: int = Field(ge=1, description="Which step of 'steps' this is (1-based).")
    steps: list[Annotated[int, Field(gt=0, le=100)]] = Field(
        min_length=1, description="Every step's percentage, increasing, the last 100."
    )


class ManifestEntry(Document):
    """One host class in a manifest: everything ``resolve-artifact`` needs, and the evidence."""

    host_class: str = Field(description="Host class name (equal to its key in 'entries').")
    key: HostClassKey = Field(description="(hardware, runtime, provider).")
    match: MatchRules = Field(
        description="Rules a host must satisfy to be of this class; unset rules are left out."
    )
    decision: Decision = Field(description="candidate, baseline or hold.")
    artifact: ManifestArtifact | None = Field(description="What the class runs; null on hold.")
    runtime: RuntimeSpec = Field(description="Runtime a host needs to run 'artifact'.")
    provider: ProviderSpec = Field(description="Providers a host needs; 'expected' must be there.")
    rollback: Rollback | None = Field(
        description="Where the class goes back to: the most recent artifact it was assigned "
        "before, other than its own, proven to load on its current runtime, else the baseline; "
        "null on the baseline when there is nothing further to go back to."
    )
    evidence: Evidence | None = Field(description="The cell the decision rests on.")
    reasons: list[Reason] = Field(description="Reason codes with evidence.")
    summary: str = Field(description="One sentence: the decision and why.")
    run_ids: list[str] = Field(description="Runs the decision rests on, sorted.")
    rollout: Rollout | None = Field(
        default=None,
        description="A staged rollout in progress: its cohort runs the rollout's artifact, the "
        "other hosts 'artifact'; absent when none.",
    )


class ManifestSigned(Document):
    """The signed part of a manifest: canonical JSON of this is what the signature covers."""

    type: Literal["qualify-manifest"] = Field(description="Document type; keeps kinds apart.")
    format: Literal["qualify-manifest/1"] = Field(description="Format version of this content.")
    release: str = Field(min_length=1, description="Release name.")
    version: int = Field(ge=1, description="Monotonic: one above the previous manifest.")
    created: str = Field(pattern=_TIME_PATTERN, description="When it was generated (UTC).")
    expires: str = Field(pattern=_TIME_PATTERN, description="Hosts refuse it from this time on.")
    model: str = Field(description="Model name from the project file.")
    snapshot: str = Field(description="The matrix snapshot the decisions were read from.")
    policy: Policy = Field(description="The decision policy used.")
    entries: dict[str, ManifestEntry] = Field(description="One entry per host class, by name.")


class Signature(Document):
    """One Ed25519 signature over the canonical bytes of ``signed``."""

    keyid: str = Field(pattern=_HEX64, description="hex sha256 of the raw public key bytes.")
    sig: str = Field(pattern=r"^[0-9a-f]{128}$", description="hex of the 64-byte signature.")


class Manifest(Document):
    """A signed release manifest, shaped like TUF metadata."""

    signed: ManifestSigned = Field(description="The signed content.")
    signatures: list[Signature] = Field(description="Signatures over canonical 'signed'.")


class _PublishedView(BaseModel):
    """Base of the read views of a published manifest: the fields a reader takes are validated
    with the document's own models; the other fields are ignored, not validated."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class PreviousEntry(_PublishedView):
    """What generating the next manifest reads of one published entry: where the class rolls
    back to and under what, where its artifacts are, and a rollout in progress."""

    artifact: ManifestArtifact | None = Field(description="What the class runs; null on hold.")
    runtime: RuntimeSpec = Field(description="Runtime a host needs to run 'artifact'.")
    provider: ProviderSpec = Field(description="Providers a host needs.")
    rollback: Rollback | None = Field(description="Where the class goes back to.")
    rollout: Rollout | None = Field(default=None, description="A staged rollout in progress.")


class PreviousSigned(_PublishedView):
    """What generating the next manifest reads of a published ``signed`` part."""

    type: Literal["qualify-manifest"] = Field(description="Document type.")
    format: Literal["qualify-manifest/1"] = Field(description="Format version of this content.")
    release: str = Field(min_length=1, description="Release name.")
    version: int = Field(ge=1, description="Monotonic: the next one is above it.")
    entries: dict[str, PreviousEntry] = Field(description="One entry per host class, by name.")


class PreviousManifest(_PublishedView):
    """The published manifest as generating the next one reads it (``manifest.load.
    load_previous``): a fleet's entries validated in full only to read four fields of each
    was most of a second at 10,000 classes."""

    signed: PreviousSigned = Field(description="The signed content.")


class ClassDocumentSigned(Document):
    """The signed part of a per-class document: one entry of a manifest, signed on its own."""

    type: Literal["qualify-class-manifest"] = Field(description="Document type.")
    format: Literal["qualify-manifest/1"] = Field(description="Format version.")
    release: str = Field(min_length=1, description="Release name.")
    version: int = Field(ge=1, description="The manifest's version.")
    created: str = Field(pattern=_TIME_PATTERN, description="When it was generated (UTC).")
    expires: str = Field(pattern=_TIME_PATTERN, description="Hosts refuse it from this time on.")
    model: str = Field(description="Model name.")
    snapshot: str = Field(description="The matrix snapshot.")
    policy: Policy = Field(description="The decision policy used.")
    host_class: str = Field(description="The class this document is for; hosts check it.")
    entry: ManifestEntry = Field(description="The class's entry.")


class ClassDocument(Document):
    """A signed per-class document: what one host of a large fleet reads."""

    signed: ClassDocumentSigned = Field(description="The signed content.")
    signatures: list[Signature] = Field(description="Signatures over canonical 'signed'.")


class ChangeSide(Document):
    """A class's pointer on one side of a diff."""

    decision: Decision = Field(description="candidate, baseline or hold.")
    artifact_name: str | None = Field(description="Artifact label; null on hold.")
    artifact_digest: Digest | None = Field(description="Artifact digest; null on hold.")
    rollback_digest: Digest | None = Field(description="Rollback digest.")


class ClassChange(Document):
    """What changes for one class between two manifests, and why."""

    host_class: str = Field(description="Host class name.")
    change: Literal["added", "removed", "changed"] = Field(description="Kind of change.")
    before: ChangeSide | None = Field(description="In the older manifest; null if added.")
    after: ChangeSide | None = Field(description="In the newer manifest; null if removed.")
    fields: list[str] = Field(description="Which parts changed: decision, artifact, rollback, ...")
    reasons: list[Reason] = Field(description="The newer manifest's reasons for the class.")
    summary: str = Field(description="One sentence: from what to what, and why.")
