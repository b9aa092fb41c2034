"""The pure function ``build_report``: the inputs, normalised once, through every section.

Owns the order of the work (the classes, then each section of ``reports.sections.SECTIONS``,
then the header and glossary), not what any section says. No I/O and no clock: the CLI reads
the matrix and verifies the signature; ``now`` is a parameter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from manifest.policy import artifact_digests
from manifest.verdict import Judge
from reports.charts import SamplesSource, samples_reader
from reports.formatting import utc_minute
from reports.header import glossary, manifest_header, matrix_header, matrix_line, notes
from reports.inputs import Classes, Inputs
from reports.sections import SECTIONS
from reports.sections.classes import build_classes
from reports.sections.matrix import columns
from reports.view import Header, ReportView, SectionView, SignatureStatus
from schemas.cell import Cell, RunRecord
from schemas.lineage import Lineage
from schemas.manifest import Manifest, ManifestSigned
from schemas.output import ManifestVersion
from schemas.project import Project
from schemas.tune import TuneRecord

__all__ = ["build_report"]


def _signed(doc: Manifest | ManifestSigned | None) -> ManifestSigned | None:
    if doc is None:
        return None
    return doc.signed if isinstance(doc, Manifest) else doc


def _status(given: SignatureStatus | str | None) -> SignatureStatus | None:
    return SignatureStatus.parse(given) if isinstance(given, str) else given


def _header(inputs: Inputs, classes: Classes) -> Header:
    cell_line, verdicts = matrix_line(classes.views, classes.heat)
    generated = utc_minute(inputs.now)
    if inputs.current is None:
        return matrix_header(
            inputs.project, inputs.snapshot, cell_line, verdicts, generated, inputs.tool_version
        )
    status = inputs.status or SignatureStatus("unsigned", "no signature status given")
    header = manifest_header(
        inputs.project,
        inputs.current,
        status,
        inputs.snapshot,
        cell_line,
        generated,
        inputs.tool_version,
    )
    if inputs.manifest_source is None:
        return header
    return replace(
        header, manifest_text=f"{header.manifest_text}; read from {inputs.manifest_source}"
    )


def _page(inputs: Inputs) -> ReportView:
    classes = build_classes(inputs)
    sections = []
    for section in SECTIONS:
        shown = section.build(inputs, classes)
        if shown is not None:
            sections.append(SectionView(section.name, section.template, shown))
    diff = next((s.view for s in sections if s.name == "diff"), None)
    return ReportView(
        header=_header(inputs, classes),
        artifacts=tuple(inputs.columns),
        heatmap=classes.heat,
        classes=classes.views,
        notes=notes(classes.orphans, inputs.columns),
        glossary=glossary(classes.views, diff),
        sections=tuple(sections),
    )


def build_report(
    project: Project,
    cells: Sequence[Cell],
    runs: Mapping[str, RunRecord],
    samples: SamplesSource | None,
    *,
    now: datetime,
    tool_version: str,
    snapshot: str | None = None,
    manifest: Manifest | ManifestSigned | None = None,
    signature_status: SignatureStatus | str | None = None,
    manifest_source: str | None = None,
    previous: Manifest | ManifestSigned | None = None,
    rollouts: Sequence[Mapping[str, Any]] = (),
    releases: Sequence[ManifestVersion] = (),
    tunes: Sequence[TuneRecord] = (),
    lineage: Mapping[str, Lineage] | None = None,
    steering: Mapping[str, Mapping[str, Any]] | None = None,
    digests: Mapping[str, str] | None = None,
) -> ReportView:
    """Build the report's view model. Pure: no I/O, no clock.

    Args:
        project, cells, runs: The project file, the cells decisions rest on
            (``Store.decision_cells()``) and the run records by run id.
        samples: Raw latencies, ``(run_id, digest) -> {LatencyConfig: ns}``
            (``Store.samples_by_config``) or a mapping with those keys; None draws no charts.
        now, tool_version, snapshot: When, by which qualify and from which matrix snapshot
            (``Store.snapshot_id()``, None if unknown) the report is made.
        manifest: The current manifest (or its signed part); None for a matrix-only report.
        signature_status: The caller's verification of ``manifest``: ``SignatureStatus`` or
            its text (``verified``, ``unsigned``, ``expired: <when>``, ``invalid: <why>``).
        manifest_source: Where ``manifest`` was read from, said in the header.
        previous, rollouts, tunes, lineage, steering: Add the diff, the rollout history (with
            the classes a person steers), the latest tunes and the lineage table.
        releases: Every manifest version the matrix records (``Store.manifest_history()``):
            the manifest history, who published each and why.
        digests: Artifact label -> the digest of its file now: a project artifact's column
            shows the cell of those bytes (else of the digest last measured under the name).

    Raises:
        ValueError: ``signature_status`` text is not one of its forms.
    """
    inputs = Inputs(
        project=project,
        cells=cells,
        runs=runs,
        samples=samples_reader(samples),
        now=now,
        tool_version=tool_version,
        snapshot=snapshot,
        current=_signed(manifest),
        previous=_signed(previous),
        manifest_source=manifest_source,
        status=_status(signature_status),
        rollouts=rollouts,
        releases=releases,
        tunes=tunes,
        lineage=lineage or {},
        steering=steering or {},
        judge=Judge(project, {**artifact_digests(project, cells), **(digests or {})}),
        columns=columns(project, cells),
    )
    return _page(inputs)
