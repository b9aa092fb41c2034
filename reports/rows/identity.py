"""The digest row: which bytes each column measured."""

from __future__ import annotations

from reports.formatting import short_digest
from reports.rows.table import Table
from reports.view import CompareRow

__all__ = ["digest_row"]


def digest_row(table: Table) -> list[CompareRow]:
    return [table.row("digest", lambda c: (short_digest(c.artifact_digest), ""))]
