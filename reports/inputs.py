"""What one report is built from, normalised once, and the shape of a page section.

Owns ``Inputs`` (everything ``build_report`` was given, with the manifests unwrapped, the
samples made one reader and the current verdicts' judge made) and ``Section``, the entry a page
section registers in ``reports.sections.SECTIONS``. Builds nothing itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from manifest.verdict import Judge
from reports.charts import Samples
from reports.view import ArtifactColumn, ClassView, HeatRow, SignatureStatus
from schemas.cell import Cell, RunRecord
from schemas.lineage import Lineage
from schemas.manifest import ManifestSigned
from schemas.output import ManifestVersion
from schemas.project import Project
from schemas.tune import TuneRecord

__all__ = ["Classes", "Inputs", "Section"]


@dataclass(frozen=True)
class Inputs:
    """What the page is built from (see ``build_report`` for each argument)."""

    project: Project
    cells: Sequence[Cell]
    runs: Mapping[str, RunRecord]
    samples: Callable[[str, str], Samples]
    now: datetime
    tool_version: str
    snapshot: str | None
    current: ManifestSigned | None
    previous: ManifestSigned | None
    manifest_source: str | None
    status: SignatureStatus | None
    rollouts: Sequence[Mapping[str, Any]]
    releases: Sequence[ManifestVersion]
    tunes: Sequence[TuneRecord]
    lineage: Mapping[str, Lineage]
    steering: Mapping[str, Mapping[str, Any]]
    judge: Judge
    columns: Sequence[ArtifactColumn]


@dataclass(frozen=True)
class Classes:
    """Every class's section and heat-map row in page order, and the cells no class has."""

    views: tuple[ClassView, ...]
    heat: tuple[HeatRow, ...]
    orphans: int


@dataclass(frozen=True)
class Section:
    """One section of the page, as ``reports.sections.SECTIONS`` registers it.

    ``build`` returns what its template (``templates/<template>``, reading it as ``section``)
    shows, or None to leave the section off the page.
    """

    name: str
    template: str
    build: Callable[[Inputs, Classes], object | None]
