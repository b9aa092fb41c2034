"""The matrix's record of releases: manifest versions (reserved, published, discarded), their
documents, and the rollout log with the holds and pins it implies.

A part of `matrix.store.Store`; publishing's steps that span files and rows are
``matrix.publications``'.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from matrix.connected import Connected
from matrix.errors import ManifestVersionError, MatrixError
from matrix.migrations import first_row, rollback_quietly

if TYPE_CHECKING:
    from schemas.output import ManifestVersion

__all__ = ["ReleaseRecords"]


def _utc(value: datetime) -> datetime:
    """A stored time as an aware UTC time (DuckDB hands back naive ones where it was naive)."""
    return value if value.tzinfo else value.replace(tzinfo=UTC)


class ReleaseRecords(Connected):
    """Manifest versions and the rollout log (a part of `matrix.store.Store`)."""

    def save_manifest(
        self,
        version: int,
        release: str,
        created: datetime,
        expires: datetime,
        document_json: str,
        *,
        encoded: bool = False,
    ) -> None:
        """Reserve a manifest version with its document; versions only go up.

        The manifest is not *published* until `mark_published` says its file was written:
        `latest_manifest` (what readers treat as current) skips it until then, so a crash
        between recording and writing leaves a reserved version, never a phantom current one.

        Args:
            version: The manifest's monotonic version (>= 1).
            release: Release name.
            created: When it was created (UTC; naive values are taken as UTC).
            expires: When it expires.
            document_json: The document as published (canonical JSON, signed or not).
            encoded: ``document_json`` is what ``manifest.envelope``'s encoders made of a
                document in memory, JSON by construction, so it is not parsed again to check
                (17 MB for 10,000 classes: 0.2 s of every generation). Text from anywhere else
                (a file, another process) is parsed first.

        Raises:
            ManifestVersionError: ``version`` is < 1 or not greater than the latest stored one.
            MatrixError: ``document_json`` is not JSON, or the store was opened read-only.
        """
        self._require_writable("save a manifest")
        if version < 1:
            raise ManifestVersionError(f"manifest version must be 1 or more, found {version}")
        try:
            if not encoded:
                json.loads(document_json)
        except json.JSONDecodeError as error:
            raise MatrixError(
                f"manifest version {version}: document is not valid JSON at line {error.lineno} "
                f"column {error.colno}: {error.msg}"
            ) from error
        conn = self._conn
        conn.execute("BEGIN TRANSACTION")
        try:
            row = first_row(conn.execute("SELECT max(version) FROM manifests"))
            latest = row[0] if row is not None else None
            if latest is not None and version <= latest:
                raise ManifestVersionError(
                    f"new manifest version {version} must be greater than the latest stored "
                    f"version {latest}: use version {latest + 1} or higher"
                )
            conn.execute(
                "INSERT INTO manifests (version, release, created, expires, document, stored_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [version, release, created, expires, document_json, self._clock()],
            )
            conn.execute("COMMIT")
        except BaseException:
            rollback_quietly(conn)
            raise

    def mark_published(self, version: int) -> None:
        """Record that manifest ``version``'s file was written where hosts read it.

        Raises:
            MatrixError: no such version, or the store was opened read-only.
        """
        self._require_writable("publish a manifest")
        conn = self._conn
        conn.execute("BEGIN TRANSACTION")
        try:
            row = first_row(
                conn.execute("SELECT count(*) FROM manifests WHERE version = ?", [version])
            )
            if row is None or not row[0]:
                raise MatrixError(f"manifest version {version} was never recorded")
            conn.execute(
                "UPDATE manifests SET published_at = ? WHERE version = ? AND published_at IS NULL",
                [self._clock(), version],
            )
            conn.execute("COMMIT")
        except BaseException:
            rollback_quietly(conn)
            raise

    def record_rollout(
        self,
        rollout_id: str,
        host_class: str,
        action: str,
        version: int,
        step: int,
        percent: int,
        artifact: str,
        actor: str,
        why: str,
        at: datetime,
    ) -> None:
        """Record one rollout action and the manifest version it published.

        Raises:
            MatrixError: the store was opened read-only.
        """
        self._require_writable("record a rollout")
        self._conn.execute(
            "INSERT INTO rollouts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                rollout_id,
                host_class,
                action,
                version,
                step,
                percent,
                artifact,
                actor[:200],
                why[:1000],
                at,
            ],
        )

    def rollout_log(self, host_class: str | None = None) -> list[dict[str, Any]]:
        """Every rollout action, oldest first (one class's with ``host_class``)."""
        where = "WHERE host_class = ?" if host_class is not None else ""
        result = self._conn.execute(
            f"SELECT * FROM rollouts {where} ORDER BY acted_at, version",
            [host_class] if host_class is not None else [],
        )
        names = [column[0] for column in result.description or ()]
        return [dict(zip(names, row, strict=True)) for row in result.fetchall()]

    def latest_manifest(self) -> tuple[int, str] | None:
        """The highest *published* manifest as (version, document JSON), or None."""
        row = first_row(
            self._conn.execute(
                "SELECT version, document FROM manifests WHERE published_at IS NOT NULL "
                "ORDER BY version DESC LIMIT 1"
            )
        )
        return (int(row[0]), str(row[1])) if row is not None else None

    def published_versions(self) -> list[tuple[int, datetime]]:
        """Every *published* manifest version with its ``created`` time (when it was signed for
        publishing: from then on hosts could pick it up), ascending by version. Documents are
        not read: a check loads only the versions its window needs (`manifest`)."""
        rows = self._conn.execute(
            "SELECT version, created FROM manifests WHERE published_at IS NOT NULL ORDER BY version"
        ).fetchall()
        return [(int(v), _utc(c)) for v, c in rows]

    def manifest_history(self) -> list[ManifestVersion]:
        """Every manifest version recorded, oldest first: its state, and who published it and
        why (null where the matrix does not know: not published, or published before it
        recorded them). Documents are not read."""
        # pydantic only here: a read command that opens the matrix for anything else (matrix
        # show) loads none.
        from schemas.output import ManifestVersion

        rows = self._conn.execute(
            "SELECT version, release, created, published_at, published_by, publish_reason, "
            "CASE WHEN published_at IS NOT NULL THEN 'published' "
            "WHEN discarded_at IS NOT NULL THEN 'discarded' "
            "WHEN pending IS NOT NULL THEN 'publishing' ELSE 'draft' END "
            "FROM manifests ORDER BY version"
        ).fetchall()
        return [
            ManifestVersion(
                version=int(version),
                release=str(release),
                state=state,
                created=_utc(created),
                published_at=None if published is None else _utc(published),
                published_by=by,
                publish_reason=reason,
            )
            for version, release, created, published, by, reason, state in rows
        ]

    def latest_draft(self) -> tuple[int, str] | None:
        """The newest *draft* as (version, document JSON): recorded, never published, and newer
        than every published version (an older one can no longer be published); or None."""
        row = first_row(
            self._conn.execute(
                "SELECT version, document FROM manifests WHERE published_at IS NULL AND "
                "discarded_at IS NULL AND pending IS NULL AND version > "
                "(SELECT coalesce(max(version), 0) FROM manifests WHERE published_at IS NOT NULL) "
                "ORDER BY version DESC LIMIT 1"
            )
        )
        return (int(row[0]), str(row[1])) if row is not None else None

    def manifest_state(self, version: int) -> str | None:
        """``draft``, ``publishing`` (a publication began and was neither finished nor
        discarded), ``published`` or ``discarded`` for a recorded version; None for one never
        recorded."""
        row = first_row(
            self._conn.execute(
                "SELECT published_at IS NOT NULL, discarded_at IS NOT NULL, pending IS NOT NULL "
                "FROM manifests WHERE version = ?",
                [version],
            )
        )
        if row is None:
            return None
        return (
            "published"
            if row[0]
            else "discarded"
            if row[1]
            else "publishing"
            if row[2]
            else "draft"
        )

    def class_holds(self) -> dict[str, dict[str, Any]]:
        """Classes a person holds or pins (``qualify rollout hold|pin``) and has not cleared:
        class -> that action's rollout-log row."""
        result = self._conn.execute(
            "SELECT * FROM rollouts WHERE action IN ('hold', 'pin', 'clear') "
            # A clear records the version it cleared: at the same instant it comes after.
            "QUALIFY row_number() OVER (PARTITION BY host_class ORDER BY acted_at DESC, "
            "version DESC, action = 'clear' DESC) = 1"
        )
        names = [column[0] for column in result.description or ()]
        rows = [dict(zip(names, row, strict=True)) for row in result.fetchall()]
        return {str(r["host_class"]): r for r in rows if r["action"] != "clear"}

    def highest_manifest_version(self) -> int:
        """The highest version recorded, published or only reserved (0 without any)."""
        row = first_row(self._conn.execute("SELECT coalesce(max(version), 0) FROM manifests"))
        return int(row[0]) if row is not None else 0

    def manifest(self, version: int) -> str | None:
        """The stored document of manifest ``version``, or None."""
        row = first_row(
            self._conn.execute("SELECT document FROM manifests WHERE version = ?", [version])
        )
        return str(row[0]) if row is not None else None
