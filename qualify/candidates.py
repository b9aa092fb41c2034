"""``qualify candidates``: make the variants of the baseline, keep their lineage, add them.

Owns the order: calibration data from the workload's recorded inputs, the converters
(`qualify.convert`), the artifact store (each variant by digest), the lineage rows in the
matrix (parent digest, tool and version, every parameter, the calibration data's digest) and
the project file (each variant becomes a candidate, comments kept: `qualify.project_edit`).
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
from qualify.convert import VARIANTS, ConversionError, calibration_digest, make_variants
from qualify.errors import ProjectError
from qualify.project import LoadedProject
from qualify.project_edit import add_candidates
from qualify.workload import build_pool
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
    """``pool`` through the ``pre`` hook, in a fresh ``python -m qualify.worker --feed`` with
    the classes' timeout and memory limit; nothing it starts outlives it."""
    from qualify.job import FeedJob
    from qualify.runner import run_worker

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
    """Make each variant of the baseline, store it with its lineage, add it as a candidate.

    Args:
        loaded: The project file.
        db_path: The matrix (lineage rows) and, beside it, the artifact store.
        out_dir: Where the variant files go; default ``<project folder>/models/candidates``.
        which: Variants to make (`qualify.convert.VARIANTS`); default all.
        prune_ratio: Share of hidden units the pruned variant removes.
        write: Add the variants to the project file's candidates.
        on_event: Receives one line per variant.
        now: The clock.

    Raises:
        ValueError: an unknown variant name.
        ProjectError: the project file could not be edited (it is then unchanged).
    """
    names = list(which) if which else list(VARIANTS)
    baseline = loaded.project.artifacts.baseline
    source = loaded.resolve(baseline.path)
    store = ArtifactStore(db_path.resolve().parent / "artifacts")
    parent, _ = store.add(source)
    target = out_dir or loaded.root / "models" / "candidates"
    calibration = _calibration(loaded)
    calib = calibration_digest(calibration) if calibration is not None else None
    known = _known_digests(loaded, store)
    outcome = CandidatesOutcome()
    for name in names:
        try:
            [variant] = make_variants(
                source, target, calibration, which=[name], prune_ratio=prune_ratio
            )
        except ConversionError as exc:
            outcome.failed[name] = str(exc)
            on_event(f"{name}: not made: {exc}")
            continue
        digest, _ = store.add(variant.path)
        twin = known.get(digest)
        if twin is not None and twin != variant.name:
            outcome.same[variant.name] = twin
            on_event(
                f"{variant.name}: the same bytes as artifact {twin!r} ({digest[:19]}); not added"
            )
            continue
        static = name.startswith("int8-qdq")
        outcome.made.append(
            Lineage(
                artifact_digest=digest,
                name=variant.name,
                precision=variant.precision,  # type: ignore[arg-type]
                parent_digest=parent,
                parent_name=baseline.label,
                tool=variant.tool,
                tool_version=variant.tool_version,
                params=variant.params,
                calibration_digest=calib if static else None,
                note=variant.note,
                created_at=now(),
            )
        )
        outcome.paths[variant.name] = variant.path
        on_event(f"{variant.name}: {variant.path.name} ({digest[:19]}), {variant.precision}")
    if outcome.made:
        with Store.open(db_path, model=loaded.project.model) as db:
            db.record_lineage(outcome.made)
    if write and outcome.made:
        add_candidates(
            loaded.path,
            [
                {
                    "path": os.path.relpath(outcome.paths[item.name], loaded.root),
                    "name": item.name,
                    "precision": item.precision,
                    "derived_from": baseline.label,
                    "how": _how_of(item),
                }
                for item in outcome.made
            ],
        )
    return outcome


def _how_of(item: Lineage) -> str:
    shown = {k: v for k, v in item.params.items() if not isinstance(v, list | dict)}
    text = ", ".join(f"{k}={v}" for k, v in shown.items())
    return f"{item.tool} {item.tool_version} ({text})" + (f"; {item.note}" if item.note else "")
