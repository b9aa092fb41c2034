"""What the read commands print with ``--json``: one model per command's document, each published
as ``schemas/<name>.schema.json`` (``schemas.generate``). Commands whose document is already a
published model print that (``telemetry check``: ``TelemetryCheck``, ``tune``: ``TuneRecord``,
``manifest show``: ``Manifest``). Owns the shapes only: the commands fill them
(``qualify.cli``), and ``matrix show`` writes its document with the standard library (it loads no
pydantic) to this very shape, which a test holds it to."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from schemas.base import Digest, Document, Precision, Role, Verdict
from schemas.cell import LoggedWarning, Numerics, OffProviderNode, Reason, RollbackCheck
from schemas.emulation import PreparedRuntime
from schemas.manifest import ClassChange
from schemas.project import HostClassKey
from schemas.telemetry import StaleItem

__all__ = [
    "BadLine",
    "BundlesIngested",
    "CellSummary",
    "ClassCoverage",
    "ClassEmulation",
    "ClassGate",
    "ClassHosts",
    "EmulatorsShow",
    "ExportedFiles",
    "FleetGap",
    "FleetStatusShown",
    "IngestedBundle",
    "IngestedFile",
    "Interrupted",
    "ManifestDiffShown",
    "ManifestHistory",
    "ManifestVerified",
    "ManifestVersion",
    "MatrixGateShown",
    "MatrixRow",
    "MatrixShown",
    "MatrixStale",
    "QemuFound",
    "RolloutAction",
    "RolloutInProgress",
    "RolloutLog",
    "RolloutStatusShown",
    "RunSummary",
    "RunWarnings",
    "RuntimeFound",
    "Steered",
    "TelemetryIngested",
]

CurrentVerdict = Literal["pass", "fail", "insufficient", "error", "stale"]


class MatrixRow(Document):
    """One cell of ``matrix show``: the latest on a key for an artifact (without a project file),
    or the one a class x artifact rests on now (with one)."""

    hardware: str = Field(description="The key's hardware.")
    runtime: str = Field(description="The key's runtime.")
    provider: str = Field(description="The key's provider.")
    host_class: str = Field(description="The class measured (with a project file: shown for).")
    artifact_digest: Digest = Field(description="The artifact's bytes.")
    artifact_name: str = Field(description="Its label.")
    role: Role = Field(description="baseline or candidate.")
    precision: Precision | None = Field(description="Its precision, as the project file says.")
    run_id: str = Field(description="The run that measured it.")
    verdict: CurrentVerdict = Field(
        description="As measured; with a project file, under the file now (stale where the "
        "stored evidence cannot say)."
    )
    reason_codes: list[str] = Field(description="The verdict's reason codes.")
    measured_verdict: Verdict | None = Field(
        default=None, description="The runner's verdict (with a project file only)."
    )
    parity_passed: bool | None = Field(description="Parity passed; null when not computed.")
    p50_ms: float | None = Field(description="Median latency at the gate config (ms).")
    p90_ms: float | None = Field(description="90th percentile latency (ms).")
    p99_ms: float | None = Field(description="99th percentile latency (ms).")
    p99_lower_ms: float | None = Field(description="Lower confidence bound of the p99 (ms).")
    p99_upper_ms: float | None = Field(description="Upper confidence bound of the p99 (ms).")
    p99_decision: str | None = Field(description="How the p99 bound judged against the budget.")
    samples: int | None = Field(description="Latency samples at the gate config.")
    throughput_ips: float | None = Field(description="Inferences per second at the gate config.")
    gate_batch_size: int | None = Field(description="The gate config's batch size.")
    gate_concurrency: int | None = Field(description="The gate config's concurrency.")
    expected_provider: str | None = Field(description="The provider the class expects.")
    fallback_nodes: int | None = Field(description="Nodes that ran off the expected provider.")
    off_provider_nodes: list[OffProviderNode] | None = Field(
        default=None,
        description="The first nodes (name, op type, domain, provider) that ran off the "
        "expected provider, at most 20; null where the cell did not record them.",
    )
    total_nodes: int | None = Field(description="Nodes of the graph.")
    peak_rss_mb: float | None = Field(description="Peak resident memory (MB).")
    cold_init_ms: float | None = Field(description="First session creation (ms).")
    warm_init_ms: float | None = Field(description="Session creation, warm (ms).")
    emulated: bool = Field(description="Measured on a host that did not match the class.")
    isa_mismatch: list[str] | None = Field(
        description="How the measuring host's ISA differs from the class's."
    )
    numerics: str | None = Field(description="native, emulated or other_isa.")
    numerics_cpu: str | None = Field(description="The emulated CPU parity ran on, if any.")
    measured_at: datetime = Field(description="When it was measured (UTC).")
    settings_digest: str = Field(description="Digest of the class's settings it ran under.")
    runtime_version: str | None = Field(description="The onnxruntime version it ran under.")
    p99_budget_ms: float | None = Field(description="The class's p99 budget now (project only).")


class ClassCoverage(Document):
    """One class x artifact of the project: the verdict it has now, or why it has none."""

    host_class: str = Field(description="Host class name.")
    artifact: str = Field(description="Artifact label.")
    role: Role = Field(description="baseline or candidate.")
    verdict: CurrentVerdict | None = Field(description="The verdict now; null without a cell.")
    reasons: list[str] = Field(description="The verdict's reasons, 'code: sentence' each.")
    gap: Literal["never_run", "stale", "unserved", "fleet_gap"] | None = Field(
        description="Why there is no current cell; null when there is one."
    )
    note: str = Field(description="The gap in words (full text); empty without a gap.")


class RunWarnings(Document):
    """What the runtime warned while one latest cell was measured."""

    host_class: str = Field(description="Host class name.")
    artifact_name: str = Field(description="Artifact label.")
    warnings: list[LoggedWarning] = Field(description="Every distinct warning, most said first.")


class FleetGap(Document):
    """A class the fleet's latest attempt ended without a measurement (after its latest cell)."""

    host_class: str = Field(description="Host class name.")
    reason: str = Field(description="The reason code (unserved, node_lost, fleet_timeout, ...).")
    detail: str = Field(description="The sentence the fleet run gave.")


class MatrixShown(Document):
    """``qualify matrix show --json``."""

    basis: Literal["project", "measured"] = Field(
        description="project: each class x artifact under the project file now; measured: the "
        "latest cell per key and artifact as measured (no project file)."
    )
    rows: list[MatrixRow] = Field(description="The cells shown.")
    coverage: list[ClassCoverage] | None = Field(
        description="Every class x artifact of the project; null without a project file."
    )
    summary: str | None = Field(description="The coverage line; null without a project file.")
    warnings: list[RunWarnings] = Field(description="Runtime warnings of the cells shown.")
    fleet_gaps: list[FleetGap] = Field(description="Classes the fleet last left unmeasured.")
    not_shown: int = Field(
        description="Cells measured on keys no class of the project has (not shown)."
    )


class MatrixStale(Document):
    """``qualify matrix stale --json``."""

    stale: list[StaleItem] = Field(description="Each class or cell to re-run, and why.")


class ClassGate(Document):
    """One class in scope of the release gate."""

    host_class: str = Field(description="Host class name.")
    decision: str | None = Field(description="The decision the matrix supports now.")
    artifact: str | None = Field(description="Its artifact's label; null on hold.")
    current_decision: str | None = Field(
        description="The class's decision in the manifest compared with; null without one."
    )
    current_artifact: str | None = Field(description="Its artifact's label there.")
    problem: str | None = Field(description="Why it blocks the release; null when it does not.")


class MatrixGateShown(Document):
    """``qualify matrix gate --json``."""

    can_proceed: bool = Field(description="No class in scope blocks the release.")
    against: str | None = Field(
        description="The manifest compared with ('manifest v7 (ocr-2)'); null: none, so a "
        "regression from what hosts run cannot be seen."
    )
    classes: list[ClassGate] = Field(description="Each class in scope, in the project's order.")
    coverage: list[ClassCoverage] = Field(description="Every class x artifact in scope.")


class ExportedFiles(Document):
    """``qualify matrix export --json``."""

    files: list[str] = Field(description="The Parquet files written, one per table or view.")


class IngestedBundle(Document):
    """What ``matrix ingest`` did with one bundle."""

    path: str = Field(description="The bundle directory.")
    run_id: str = Field(description="Its run id.")
    status: Literal["ingested", "present"] = Field(
        description="ingested: written now; present: already in the matrix, nothing written."
    )
    cells: int = Field(description="Cells in the bundle.")
    samples: int = Field(description="Raw latency samples in the bundle.")


class BundlesIngested(Document):
    """``qualify matrix ingest --json``."""

    bundles: list[IngestedBundle] = Field(description="One per path, in the order given.")


class BadLine(Document):
    """A telemetry line that is not a valid event (skipped)."""

    line: int = Field(description="1-based line number in the file.")
    message: str = Field(description="What is wrong: the field and the rule.")
    text: str = Field(description="The start of the line (at most 120 characters).")


class IngestedFile(Document):
    """What ``telemetry ingest`` did with one file."""

    path: str = Field(description="The file.")
    sha256: str = Field(description="Digest of the bytes ingested so far (to its last newline).")
    status: Literal["ingested", "present"] = Field(
        description="ingested: events written now (for a grown file, its new lines); present: "
        "these bytes were ingested before, nothing written."
    )
    first_line: int = Field(description="First line read by this ingest (1-based).")
    lines: int = Field(description="Lines read by this ingest (blank ones included).")
    events: int = Field(description="Events written.")
    bad_lines: int = Field(description="Lines skipped as invalid (all of them).")
    bad: list[BadLine] = Field(description="The first bad lines, in file order.")
    pending_bytes: int = Field(description="Bytes after the last newline, left for next time.")


class TelemetryIngested(Document):
    """``qualify telemetry ingest --json``."""

    files: list[IngestedFile] = Field(description="One per path, in the order given.")


class CellSummary(Document):
    """One artifact's cell in ``qualify run --json``."""

    artifact_digest: Digest = Field(description="The artifact's bytes.")
    artifact_name: str = Field(description="Its label.")
    role: Role = Field(description="baseline or candidate.")
    verdict: Verdict = Field(description="The runner's verdict.")
    reasons: list[Reason] = Field(description="Why, each a code and a full sentence.")
    p50_ms: float | None = Field(description="Median latency at the gate config (ms).")
    p99_ms: float | None = Field(description="99th percentile latency (ms).")
    p99_upper_ms: float | None = Field(description="Upper confidence bound of the p99 (ms).")
    inference_p50_ms: float | None = Field(description="Median of the inference stage (ms).")
    inference_p99_ms: float | None = Field(description="p99 of the inference stage (ms).")
    stage_share: dict[str, float] | None = Field(description="Share of time per stage.")
    energy_mj: float | None = Field(description="Millijoules per inference; null: no counters.")
    energy_missing: str | None = Field(description="Why energy is missing, if it is.")
    samples: int | None = Field(description="Latency samples at the gate config.")
    nodes_per_provider: dict[str, int] | None = Field(description="Nodes per provider.")
    fallback_nodes: int | None = Field(description="Nodes that ran off the expected provider.")
    kernel_ms_per_provider: dict[str, float] | None = Field(
        description="Kernel time per provider (ms), from the profiler."
    )
    peak_rss_mb: float | None = Field(description="Peak resident memory (MB).")
    cold_init_ms: float | None = Field(description="First session creation (ms).")
    parity_passed: bool | None = Field(description="Parity passed; null when not computed.")
    warnings: list[LoggedWarning] = Field(description="What the runtime warned while measuring.")
    numerics: Numerics | None = Field(description="How the parity outputs were computed.")


class RunSummary(Document):
    """``qualify run --json``."""

    run_id: str = Field(description="The run's id.")
    host_class: str = Field(description="The class qualified.")
    key: HostClassKey = Field(description="Its key.")
    emulated: bool = Field(description="The host did not match the class (--emulate).")
    mismatches: list[str] = Field(description="Match rules the host failed.")
    rollback: RollbackCheck | None = Field(description="The rollback check; null if not run.")
    cells: list[CellSummary] = Field(description="One per artifact.")


class ManifestVerified(Document):
    """``qualify manifest verify --json`` (a manifest that fails says so on stderr, exit 2)."""

    path: str = Field(description="The file checked.")
    valid: Literal[True] = Field(description="Signature, format and expiry all hold.")
    release: str = Field(description="The release name.")
    version: int = Field(description="The manifest version.")
    classes: int = Field(description="How many host classes it decides.")
    expires: str = Field(description="When it expires, as the manifest says (RFC 3339, UTC).")


class ManifestDiffShown(Document):
    """``qualify manifest diff --json``."""

    old: str = Field(description="The older manifest's file.")
    new: str = Field(description="The newer manifest's file.")
    changes: list[ClassChange] = Field(description="One per class that changes; sorted by class.")


ManifestState = Literal["draft", "publishing", "published", "discarded"]


class ManifestVersion(Document):
    """One manifest version the matrix records, and who published it and why."""

    version: int = Field(description="The manifest version.")
    release: str = Field(description="The release name.")
    state: ManifestState = Field(
        description="draft: recorded, not published; publishing: a publication of it began and "
        "was neither completed nor discarded yet; published: hosts may read it; discarded: a "
        "publication of it failed or was interrupted before its file was written (never reused)."
    )
    created: datetime = Field(description="When it was created or, once published, signed (UTC).")
    published_at: datetime | None = Field(
        description="When the matrix recorded it published (UTC); null unless published."
    )
    published_by: str | None = Field(
        description="Who published it, as they said it ('manifest publish --who', by default the "
        "OS user name; a rollout step's actor). Null: not recorded (not published, or published "
        "before the matrix recorded who)."
    )
    publish_reason: str | None = Field(
        description="Why it was published, as given (--why; empty: none given). Null: not "
        "recorded (not published, or published before the matrix recorded why)."
    )


class ManifestHistory(Document):
    """``qualify manifest history --json``."""

    versions: list[ManifestVersion] = Field(
        description="Every version recorded, oldest first (with --last, the newest N of them)."
    )
    earlier: int = Field(
        default=0, ge=0, description="Versions older than those listed, left out by --last."
    )


class RolloutAction(Document):
    """One rollout action (a published step, abort, hold, pin, clear or halted advance)."""

    acted_at: datetime = Field(description="When (UTC).")
    host_class: str = Field(description="Host class name.")
    rollout_id: str = Field(description="The rollout (or hold/pin) id.")
    action: str = Field(description="start, advance, complete, halt, abort, hold, pin, clear.")
    version: int = Field(description="The manifest version it published (or current at a halt).")
    step: int = Field(description="The step reached.")
    percent: int = Field(description="Percent of the class's hosts on the new artifact.")
    artifact: str = Field(description="The artifact rolled out, pinned or held.")
    actor: str = Field(description="Who.")
    why: str = Field(description="Why, as given (full text).")


class RolloutLog(Document):
    """``qualify rollout log --json``."""

    actions: list[RolloutAction] = Field(description="Every action, oldest first.")


class Interrupted(Document):
    """A publication a kill interrupted."""

    version: int = Field(description="The version it was publishing.")
    what: str = Field(description="What it was publishing.")


class Steered(Document):
    """A class held, pinned or whose rollout was aborted (in force until 'rollout clear')."""

    host_class: str = Field(description="Host class name.")
    action: Literal["hold", "pin", "abort"] = Field(description="What is in force.")
    artifact: str = Field(description="Pinned to (pin), or the rollout's artifact.")
    rollout_id: str = Field(description="The rollout (or hold/pin) id.")
    actor: str = Field(description="Who.")
    acted_at: datetime = Field(description="Since when (UTC).")
    version: int = Field(description="The version that published it.")
    why: str = Field(description="Why, as given (full text).")


class RolloutInProgress(Document):
    """A rollout in the current manifest."""

    host_class: str = Field(description="Host class name.")
    rollout_id: str = Field(description="The rollout's id.")
    artifact: str = Field(description="The new artifact's label.")
    percent: int = Field(description="Percent of the class's hosts on it.")
    step: int = Field(description="The step reached (1-based).")
    steps: list[int] = Field(description="The percent of every step.")
    halted: bool = Field(description="Its last advance was halted.")
    halted_why: str | None = Field(description="Why it halted (full text); null if not halted.")
    rest: str | None = Field(description="What the rest of the class runs; null on hold.")


class RolloutStatusShown(Document):
    """``qualify rollout status --json``."""

    manifest_version: int = Field(description="The current (newest published) version.")
    interrupted: list[Interrupted] = Field(description="Publications a kill interrupted.")
    steered: list[Steered] = Field(description="Holds, pins and aborts in force.")
    rollouts: list[RolloutInProgress] = Field(description="Rollouts in progress or halted.")


class QemuFound(Document):
    """QEMU user-mode for one architecture."""

    arch: str = Field(description="The architecture.")
    path: str | None = Field(description="The QEMU binary; null when not found.")
    version: str | None = Field(description="Its version; null when unknown or not found.")


class RuntimeFound(Document):
    """A prepared runtime for an emulated CPU."""

    folder: str = Field(description="The emulators folder it is in.")
    name: str = Field(description="Its folder's name.")
    runtime: PreparedRuntime = Field(description="What it holds, as recorded when prepared.")


class ClassEmulation(Document):
    """What ``--emulate`` has for one class."""

    host_class: str = Field(description="Host class name.")
    cpu: str | None = Field(description="The emulated CPU model; null when there is none.")
    level: str | None = Field(description="The CPU's ISA level; null without a CPU.")
    why: str = Field(description="Why this CPU (or why none).")
    runtime: str | None = Field(
        description="The verified runtime it would use; null when this host's Python is used "
        "or none is prepared."
    )
    ready: bool = Field(description="--emulate has what it needs here for the class.")
    fix: str | None = Field(description="What to run when it is not ready.")


class EmulatorsShow(Document):
    """``qualify emulators show --json``."""

    qemu: list[QemuFound] = Field(description="QEMU per architecture.")
    runtimes: list[RuntimeFound] = Field(description="Every prepared runtime found.")
    classes: list[ClassEmulation] = Field(description="Each class of the project.")


class ClassHosts(Document):
    """Which live hosts can serve one class."""

    host_class: str = Field(description="Host class name.")
    hosts: list[str] = Field(description="Hosts that advertise it and agree ('name (node id)').")
    not_used: list[str] = Field(description="Hosts that advertise it but disagree: 'host: why'.")


class FleetStatusShown(Document):
    """``qualify fleet status --json``."""

    classes: list[ClassHosts] = Field(description="Each class of the project, in file order.")
    unserved: list[str] = Field(description="Classes no live, agreeing host can serve.")
    shared: list[list[str]] = Field(description="Groups of nodes on one machine.")
    unknown: list[str] = Field(description="Classes advertised that the project does not have.")
