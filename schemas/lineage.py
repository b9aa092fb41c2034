"""Lineage of a candidate qualify made: its parent, the converter, every parameter.

Owns the model only; ``qualify.candidates.make`` makes it, ``matrix.store`` keeps it in the
``lineage`` table and the report shows it beside the candidate.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import Field

from schemas.base import Digest, Document, Precision

__all__ = ["Lineage"]


class Lineage(Document):
    """How one artifact was derived."""

    artifact_digest: Digest = Field(description="The artifact made.")
    name: str = Field(description="Its label in the project file.")
    precision: Precision = Field(description="Its precision family.")
    parent_digest: Digest = Field(description="The artifact it was made from.")
    parent_name: str = Field(description="That artifact's label.")
    tool: str = Field(description="The converter, e.g. onnxruntime.quantization.quantize_static.")
    tool_version: str = Field(description="The converter package's version.")
    params: dict[str, Any] = Field(description="Every parameter the converter was given.")
    calibration_digest: Digest | None = Field(
        description="sha256 of the calibration data (static quantization); null without one."
    )
    note: str | None = Field(description="A caveat, e.g. 'not fine-tuned'.")
    created_at: datetime = Field(description="When it was made (UTC).")
