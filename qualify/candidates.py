"""``qualify candidates``: make the variants of the baseline, keep their lineage, add them.

Owns the order: calibration data from the workload's recorded inputs, the converters
(`qualify.convert`), the artifact store (each variant by digest), the lineage rows in the
matrix (parent digest, tool and version, every parameter, the calibration data's digest) and
the project file (each variant becomes a candidate, comments kept: `qualify.project_edit`).
A variant a converter cannot make is reported and the others go on; nothing is added for it.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

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


def _pre_hook(loaded: LoadedProject) -> Callable[[Any], Any] | None:
    """The workload's ``pipeline.pre`` hook, imported from the project's folder."""
    pipeline = loaded.project.workload.pipeline
    if pipeline is None or pipeline.pre is None:
        return None
    module_name, _, name = pipeline.pre.partition(":")
    root = str(loaded.root)
    added = root not in sys.path
    if added:
        sys.path.insert(0, root)
    try:
        fn = getattr(importlib.import_module(module_name), name)
    except Exception as exc:
        raise ProjectError(
            f"{loaded.path}: workload.pipeline.pre {pipeline.pre} could not be imported "
            f"({type(exc).__name__}: {str(exc)[:200]}); calibration needs the model's feed"
        ) from exc
    finally:
        if added:
            sys.path.remove(root)
    return fn  # type: ignore[no-any-return]


def _calibration(loaded: LoadedProject) -> dict[str, np.ndarray] | None:
    """The model's feed for the workload's recorded rows (through ``pipeline.pre`` when there
    is one, one row at a time as serving would), when at least one input is recorded: static
    quantization calibrates on real samples, never on generated ones. None otherwise."""
    wl = loaded.project.workload
    if not any(spec.source == "recorded" for spec in wl.inputs.values()):
        return None
    pool = build_pool(wl, loaded.resolve)
    rows = min(_CALIBRATION_ROWS, min(len(v) for v in pool.values()))
    pre = _pre_hook(loaded)
    if pre is None:
        return {k: v[:rows] for k, v in pool.items()}
    feeds = [pre({k: v[i : i + 1] for k, v in pool.items()}) for i in range(rows)]
    try:
        return {k: np.concatenate([np.asarray(f[k]) for f in feeds]) for k in feeds[0]}
    except (TypeError, KeyError, ValueError) as exc:
        raise ProjectError(
            f"{loaded.path}: workload.pipeline.pre must return {{input name: array}} with one "
            f"row per row it was given; calibration could not use it ({exc})"
        ) from exc


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
        with Store.open(db_path) as db:
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
