"""What the matrix keeps beside runs and releases: fleet gaps, tunes, artifact lineage and the
project views a writer saw.

A part of `matrix.store.Store`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING

import duckdb

from matrix.connected import Connected
from matrix.errors import MatrixError
from matrix.migrations import first_row

if TYPE_CHECKING:
    from schemas.lineage import Lineage
    from schemas.project import HostClassKey
    from schemas.tune import TuneRecord

__all__ = ["Annotations"]


class Annotations(Connected):
    """Fleet gaps, tunes, lineage and project views (a part of `matrix.store.Store`)."""

    MAX_PROJECT_VIEWS = 64
    """Project views kept (the newest): one per project file version a writer saw."""

    def note_unserved(self, classes: Iterable[tuple[str, HostClassKey]], detail: str) -> None:
        """Record that a fleet run found no host for these (class name, key) pairs, now.

        Raises:
            MatrixError: the store was opened read-only.
        """
        self.note_fleet_gaps((name, key, "unserved", detail) for name, key in classes)

    def note_fleet_gaps(self, gaps: Iterable[tuple[str, HostClassKey, str, str]]) -> None:
        """Record, now, that a fleet run ended these classes without a measurement:
        (class name, key, reason code, sentence), e.g. ``unserved``, ``node_lost``,
        ``host_mismatch``. A gap stands until a cell of the key is measured after it.

        Raises:
            MatrixError: the store was opened read-only.
        """
        self._require_writable("record fleet gaps")
        rows = [
            (name, *key.as_tuple(), reason[:64], detail[:500], self._clock())
            for name, key, reason, detail in gaps
        ]
        if rows:
            self._conn.executemany("INSERT INTO fleet_gaps VALUES (?, ?, ?, ?, ?, ?, ?)", rows)

    def fleet_gaps(self) -> dict[str, tuple[str, str]]:
        """Per class whose latest fleet gap is newer than every cell of its key: that gap's
        (reason code, sentence)."""
        rows = self._conn.execute(
            "SELECT g.host_class, arg_max(g.reason, g.noted_at), arg_max(g.detail, g.noted_at) "
            "FROM fleet_gaps g GROUP BY g.host_class, g.hardware, g.runtime, g.provider "
            "HAVING max(g.noted_at) > coalesce(("
            "SELECT max(c.measured_at) FROM cells c WHERE c.hardware = g.hardware AND "
            "c.runtime = g.runtime AND c.provider = g.provider), TIMESTAMPTZ '1970-01-01')"
        ).fetchall()
        return {str(row[0]): (str(row[1]), str(row[2])) for row in rows}

    def unserved(self) -> set[str]:
        """Classes a fleet run last ended without a measurement (`fleet_gaps`): whose key has
        no cell measured since."""
        return set(self.fleet_gaps())

    def write_tune(self, record: TuneRecord) -> None:
        """Store one tune and its trials (replacing a tune of the same id).

        Raises:
            MatrixError: the store was opened read-only.
        """
        self._require_writable("record a tune")
        self._conn.execute("DELETE FROM tunes WHERE tune_id = ?", [record.tune_id])
        self._conn.execute(
            "INSERT INTO tunes VALUES (?, ?, ?, ?)",
            [record.tune_id, record.host_class, record.started_at, record.model_dump_json()],
        )

    def tunes(self, host_class: str | None = None) -> list[TuneRecord]:
        """Every stored tune, oldest first (one class's with ``host_class``)."""
        from schemas.tune import TuneRecord

        rows = self._conn.execute(
            "SELECT record FROM tunes WHERE $c IS NULL OR host_class = $c "
            "ORDER BY started_at, tune_id",
            {"c": host_class},
        ).fetchall()
        return [TuneRecord.model_validate_json(row[0]) for row in rows]

    def record_lineage(self, items: Iterable[Lineage]) -> None:
        """Store how artifacts were derived (replacing what was stored for the same digest).

        Raises:
            MatrixError: the store was opened read-only.
        """
        self._require_writable("record lineage")
        for item in items:
            self._conn.execute(
                "INSERT OR REPLACE INTO lineage VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    item.artifact_digest,
                    item.name,
                    item.precision,
                    item.parent_digest,
                    item.parent_name,
                    item.tool,
                    item.tool_version,
                    json.dumps(item.params, sort_keys=True),
                    item.calibration_digest,
                    item.note,
                    item.created_at,
                ],
            )

    def record_project_view(self, key: str, view: str) -> None:
        """Keep ``view`` (``qualify.project.view.ProjectView.to_json``) of the project file whose
        bytes ``key`` names, dropping the oldest beyond `MAX_PROJECT_VIEWS`.

        Raises:
            MatrixError: the store was opened read-only, or DuckDB refused the write.
        """
        self._require_writable("record a project view")
        try:
            self._conn.execute(
                "INSERT OR REPLACE INTO project_views VALUES (?, ?, ?)", [key, view, self._clock()]
            )
            self._conn.execute(
                "DELETE FROM project_views WHERE view_key NOT IN (SELECT view_key FROM "
                "project_views ORDER BY recorded_at DESC, view_key LIMIT ?)",
                [self.MAX_PROJECT_VIEWS],
            )
        except duckdb.Error as exc:
            raise MatrixError(f"{self.path}: cannot record the project view: {exc}") from exc

    def project_view(self, key: str) -> str | None:
        """The view recorded under ``key``, or None (the caller validates the file instead)."""
        try:
            row = first_row(
                self._conn.execute("SELECT view FROM project_views WHERE view_key = ?", [key])
            )
        except duckdb.Error:  # a damaged table is a miss, not a failure to show the matrix
            return None
        return str(row[0]) if row is not None else None

    def lineage(self) -> dict[str, Lineage]:
        """How each artifact qualify made was derived, by artifact digest."""
        from schemas.lineage import Lineage

        rows = self._conn.execute(
            "SELECT artifact_digest, name, precision, parent_digest, parent_name, tool, "
            "tool_version, params, calibration_digest, note, created_at FROM lineage "
            "ORDER BY created_at, name"
        ).fetchall()
        fields = (
            "artifact_digest",
            "name",
            "precision",
            "parent_digest",
            "parent_name",
            "tool",
            "tool_version",
            "params",
            "calibration_digest",
            "note",
            "created_at",
        )
        found = {}
        for row in rows:
            doc = dict(zip(fields, row, strict=True))
            doc["params"] = json.loads(doc["params"])
            found[doc["artifact_digest"]] = Lineage.model_validate(doc)
        return found
