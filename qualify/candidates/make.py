"""``qualify candidates``: make the variants of the baseline, keep their lineage, add them.

Owns the order: calibration data from the workload's recorded inputs, the converters
(`qualify.candidates.convert`), the artifact store (each variant by digest), the lineage rows in the
matrix (parent digest, tool and version, every parameter, the calibration data's digest) and
the project file (each variant becomes a candidate, comments kept: `qualify.project.edit`).
A variant a converter cannot make is reported and the others go on; nothing is added for it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from matrix.store import Store
from qualify.artifacts import ArtifactStore, digest_file
from qualify.candidates.convert import (
    CALIBRATED,
    VARIANTS,
    ConversionError,
    calibration_digest,
    make_variants,
)
from qualify.errors import ProjectError
from qualify.measure.workload import build_pool
from qualify.project.edit import add_candidates
from qualify.project.load import LoadedProject
from schemas.lineage import Lineage

__all__ = ["CandidatesOutcome", "make_candidates"]

EventSink = Callable[[str], None]


@dataclass
class CandidatesOutcome:
    """What ``qualify candidates`` made and what it could not."""

    made: list[Lineage] = field(default_factory=list)
    paths: dict[str, Path] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    same: dict[str, str] = field(default_factory=dict)
    """Variants whose bytes an artifact of the project already has: variant -> that artifact."""
    skipped: dict[str, str] = field(default_factory=dict)
    """Variants the workload does not allow (static int8 without recorded inputs) -> why, and
    how to allow them."""
    how: dict[str, str] = field(default_factory=dict)
    """Each made variant's one-line summary, its ``how:`` in the project file."""

    @property
    def exit_code(self) -> int:
        """0 when a variant was made (or was already there), 1 when none was: each asked for
        failed or was skipped."""
        return 0 if self.made or self.same else 1


def _known_digests(loaded: LoadedProject, store: ArtifactStore) -> dict[str, str]:
    """Digest -> label of the project's artifacts whose files exist."""
    artifacts = loaded.project.artifacts
    found: dict[str, str] = {}
    for spec in [artifacts.baseline, *artifacts.candidates]:
        path = loaded.resolve(spec.path)
        if path.is_file():
            found.setdefault(digest_file(path), spec.label)
    return found


_CALIBRATION_ROWS = 256


def _feed_limits(loaded: LoadedProject) -> tuple[float, int]:
    """The wall-clock and memory limits of the calibration feed's child: the most generous any
    class gives its measuring children (the same hook runs there, on the same rows)."""
    budgets = [cls.budgets for cls in loaded.project.host_classes.values()]
    return max(b.timeout_s for b in budgets), max(b.memory_limit_mb for b in budgets)


def _calibration(loaded: LoadedProject) -> dict[str, np.ndarray] | None:
    """The model's feed for the workload's recorded rows (through ``pipeline.pre`` when there
    is one, one row at a time as serving would, in a supervised child: `_fed`), when at least
    one input is recorded: static quantization calibrates on real samples, never on generated
    ones. None otherwise.

    Raises:
        ProjectError: the ``pre`` hook failed, hung, ran out of memory or returned what
            calibration cannot use (its file and line named where it raised).
    """
    wl = loaded.project.workload
    if not any(spec.source == "recorded" for spec in wl.inputs.values()):
        return None
    pool = build_pool(wl, loaded.resolve)
    rows = min(_CALIBRATION_ROWS, min(len(v) for v in pool.values()))
    if wl.pipeline is None or wl.pipeline.pre is None:
        return {k: v[:rows] for k, v in pool.items()}
    return _fed(loaded, wl.pipeline.pre, {k: v[:rows] for k, v in pool.items()}, rows)


def _fed(
    loaded: LoadedProject, hook: str, pool: dict[str, np.ndarray], rows: int
) -> dict[str, np.ndarray]:
    """``pool`` through the ``pre`` hook, in a fresh ``python -m qualify.measure.worker --feed`` with
    the classes' timeout and memory limit; nothing it starts outlives it."""
    from qualify.measure.job import FeedJob
    from qualify.measure.runner import run_worker

    timeout_s, memory_mb = _feed_limits(loaded)
    with tempfile.TemporaryDirectory(prefix="qualify-feed-") as tmp:
        work = Path(tmp)
        np.savez(work / "rows.npz", allow_pickle=False, **pool)
        job = FeedJob(
            inputs_path=str(work / "rows.npz"),
            rows=rows,
            pre_hook=hook,
            hook_root=str(loaded.root),
            outputs_path=str(work / "feed.npz"),
            memory_limit_mb=memory_mb,
            result_path=None,
            parent_pid=None,
        )
        outcome = run_worker(job, work / "child", timeout_s=timeout_s)
        if outcome.error_code is not None:
            raise ProjectError(
                f"{loaded.path}: workload.pipeline.pre {hook}: calibration could not feed the "
                f"recorded rows through it ({outcome.error_code}: {outcome.error_message}); "
                "nothing was made. Fix the hook (budgets.timeout_s and memory_limit_mb bound it)"
            )
        with np.load(work / "feed.npz", allow_pickle=False) as fed:
            return {k: fed[k] for k in fed.files}


def make_candidates(
    loaded: LoadedProject,
    *,
    db_path: Path,
    out_dir: Path | None = None,
    which: Sequence[str] | None = None,
    prune_ratio: float = 0.25,
    write: bool = True,
    on_event: EventSink = lambda _msg: None,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> CandidatesOutcome:
    """Make each variant of the baseline the workload allows, store it with its lineage, add
    it as a candidate.

    Static int8 (`qualify.candidates.convert.CALIBRATED`) calibrates on recorded inputs: a workload
    without any (``qualify init`` writes generated ones) skips it, saying how to record them,
    and makes the others.

    Args:
        loaded: The project file.
        db_path: The matrix (lineage rows) and, beside it, the artifact store.
        out_dir: Where the variant files go; default ``<project folder>/models/candidates``.
        which: Variants to make (`qualify.candidates.convert.VARIANTS`); default all.
        prune_ratio: Share of hidden units the pruned variant removes.
        write: Add the variants to the project file's candidates.
        on_event: Receives one line per variant made or found to be a copy; what was not made
            is in the outcome's ``failed`` and ``skipped`` only.
        now: The clock.

    Raises:
        ValueError: an unknown variant name.
        ProjectError: the project file could not be edited (it is then unchanged).
    """
    names = list(which) if which else list(VARIANTS)
    source = loaded.resolve(loaded.project.artifacts.baseline.path)
    store = ArtifactStore(db_path.resolve().parent / "artifacts")
    calibration = _calibration(loaded)
    outcome = CandidatesOutcome()
    if calibration is None:
        hint = _record_inputs_hint(loaded)
        outcome.skipped = {name: hint for name in names if name in CALIBRATED}
    made = _Making(
        loaded=loaded,
        source=source,
        parent=store.add(source)[0],
        store=store,
        target=out_dir or loaded.root / "models" / "candidates",
        calibration=calibration,
        known=_known_digests(loaded, store),
        on_event=on_event,
        now=now,
    )
    for name in names:
        if name not in outcome.skipped:
            made.one(name, prune_ratio, outcome)
    if outcome.made:
        with Store.open(db_path, model=loaded.project.model) as db:
            db.record_lineage(outcome.made)
    if write and outcome.made:
        _add_to_project(loaded, outcome)
    return outcome


@dataclass(frozen=True)
class _Making:
    """What making each variant of one call shares."""

    loaded: LoadedProject
    source: Path
    parent: str
    store: ArtifactStore
    target: Path
    calibration: dict[str, np.ndarray] | None
    known: dict[str, str]
    on_event: EventSink
    now: Callable[[], datetime]

    def one(self, name: str, prune_ratio: float, outcome: CandidatesOutcome) -> None:
        """Make variant ``name`` into ``outcome``: made, the same as an artifact, or failed."""
        try:
            [variant] = make_variants(
                self.source, self.target, self.calibration, which=[name], prune_ratio=prune_ratio
            )
        except ConversionError as exc:
            outcome.failed[name] = str(exc)
            return
        digest, _ = self.store.add(variant.path)
        twin = self.known.get(digest)
        if twin is not None and twin != variant.name:
            outcome.same[variant.name] = twin
            self.on_event(
                f"{variant.name}: the same bytes as artifact {twin!r} ({digest[:19]}); not added"
            )
            return
        calibration = self.calibration if name in CALIBRATED else None
        outcome.made.append(
            Lineage(
                artifact_digest=digest,
                name=variant.name,
                precision=variant.precision,  # type: ignore[arg-type]
                parent_digest=self.parent,
                parent_name=self.loaded.project.artifacts.baseline.label,
                tool=variant.tool,
                tool_version=variant.tool_version,
                params=variant.params,
                calibration_digest=(
                    calibration_digest(calibration) if calibration is not None else None
                ),
                note=variant.note,
                created_at=self.now(),
            )
        )
        outcome.paths[variant.name] = variant.path
        outcome.how[variant.name] = variant.summary
        self.on_event(f"{variant.name}: {variant.path.name} ({digest[:19]}), {variant.summary}")


def _record_inputs_hint(loaded: LoadedProject) -> str:
    """Why static int8 is skipped, and how to record inputs, naming the workload's first."""
    first = next(iter(loaded.project.workload.inputs), "NAME")
    return (
        "static int8 calibrates on real inputs and the workload's are generated. To make it, "
        f"save real samples of each input with numpy.save (samples along the first axis) and "
        f"point {loaded.path.name} at them, e.g. workload.inputs.{first}: "
        f"{{source: recorded, file: data/{first}.npy}}; then run qualify candidates again"
    )


def _add_to_project(loaded: LoadedProject, outcome: CandidatesOutcome) -> None:
    """Each made variant as a candidate of the project file, its ``how:`` one line (every
    parameter is in the matrix's lineage)."""
    baseline = loaded.project.artifacts.baseline.label
    add_candidates(
        loaded.path,
        [
            {
                "path": os.path.relpath(outcome.paths[item.name], loaded.root),
                "name": item.name,
                "precision": item.precision,
                "derived_from": baseline,
                "how": outcome.how[item.name],
            }
            for item in outcome.made
        ],
    )
