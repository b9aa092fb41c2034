"""Publications in progress: the matrix's half of publishing a manifest as one transaction.

Owns the SQL of the publication journal (the ``manifests`` columns ``pending``,
``pending_document`` and ``discarded_at``; ``published_by`` and ``publish_reason``, which
`finish` sets) and of the classes a person steers (holds, pins and aborted rollouts, from the
``rollouts`` log). Does not own the files or the order of the steps
(``qualify.release.publishing``), nor signing.

More: docs/internals.md, ``matrix.publications``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import duckdb

from matrix.errors import ManifestVersionError, MatrixError
from matrix.migrations import first_row, rollback_quietly
from matrix.store import Store

__all__ = [
    "ROLLOUT_FIELDS",
    "STEERING",
    "Pending",
    "begin",
    "discard",
    "finish",
    "pending",
    "published_before",
    "steering",
]

ROLLOUT_FIELDS = (
    "rollout_id",
    "host_class",
    "action",
    "version",
    "step",
    "percent",
    "artifact",
    "actor",
    "why",
    "acted_at",
)
"""The columns of a ``rollouts`` row, in table order (``acted_at`` an ISO time in an intent)."""

STEERING = ("hold", "pin", "abort")
"""Rollout-log actions by which a person steers a class: each stays in force through later
releases until ``clear`` or a new ``start``."""


@dataclass(frozen=True)
class Pending:
    """A publication that began and neither finished nor was discarded."""

    version: int
    release: str
    document: str
    """The signed document as it is to be published."""
    intent: dict[str, Any]
    """What ``begin`` was told: at least ``draft`` (bool) and ``log`` (rollout rows)."""


def _writable(store: Store, what: str) -> None:
    if store.read_only:
        raise MatrixError(f"cannot {what}: the matrix {store.path} was opened read-only")


def begin(
    store: Store,
    version: int,
    *,
    release: str,
    created: datetime,
    expires: datetime,
    document_json: str,
    intent: Mapping[str, Any],
    draft: bool,
) -> None:
    """Record that ``version`` is being published, in one transaction; nothing reads it as
    current until `finish`.

    Args:
        draft: publish the draft recorded under ``version`` (its draft document is kept until
            `finish`, so a discarded publication leaves the draft as it was); else reserve
            ``version``, above every version recorded, for this document.
        intent: JSON-able; ``log`` lists the rollout rows `finish` records (`ROLLOUT_FIELDS`),
            ``published_by`` and ``publish_reason`` (strings, each optional) who publishes
            the version and why, which `finish` records with it.

    Raises:
        ManifestVersionError: the draft is published, discarded, being published, or older
            than a published version; or ``version`` is not above every recorded one.
        MatrixError: no such draft, or the store is read-only.
    """
    _writable(store, "publish a manifest")
    conn = store.connection
    text = json.dumps({**intent, "draft": draft}, sort_keys=True)
    conn.execute("BEGIN TRANSACTION")
    try:
        newest = first_row(
            conn.execute(
                "SELECT coalesce(max(version), 0) FROM manifests WHERE published_at IS NOT NULL"
            )
        )
        published = int(newest[0]) if newest is not None else 0
        if draft:
            _check_draft(conn, version, published)
            conn.execute(
                "UPDATE manifests SET pending_document = ?, pending = ? WHERE version = ?",
                [document_json, text, version],
            )
        else:
            row = first_row(conn.execute("SELECT max(version) FROM manifests"))
            if row is not None and row[0] is not None and version <= row[0]:
                raise ManifestVersionError(
                    f"new manifest version {version} must be greater than the latest stored "
                    f"version {row[0]}: use version {row[0] + 1} or higher"
                )
            conn.execute(
                "INSERT INTO manifests (version, release, created, expires, document, stored_at, "
                "pending) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [version, release, created, expires, document_json, store.now(), text],
            )
        conn.execute("COMMIT")
    except BaseException:
        rollback_quietly(conn)
        raise


def _check_draft(conn: duckdb.DuckDBPyConnection, version: int, published: int) -> None:
    row = first_row(
        conn.execute(
            "SELECT published_at IS NOT NULL, discarded_at IS NOT NULL, pending IS NOT NULL "
            "FROM manifests WHERE version = ?",
            [version],
        )
    )
    if row is None:
        raise MatrixError(f"manifest version {version} was never recorded")
    if row[0]:
        raise ManifestVersionError(f"manifest version {version} is published already")
    if row[1]:
        raise ManifestVersionError(f"manifest version {version} was discarded")
    if row[2]:
        raise ManifestVersionError(f"manifest version {version} is being published")
    if published > version:
        raise ManifestVersionError(
            f"draft version {version} is older than published version {published} (a rollout "
            "step or another publish came after it): generate a new draft"
        )


def _pending_row(conn: duckdb.DuckDBPyConnection, version: int) -> dict[str, Any]:
    row = first_row(conn.execute("SELECT pending FROM manifests WHERE version = ?", [version]))
    if row is None or row[0] is None:
        raise MatrixError(f"manifest version {version} is not being published")
    intent: dict[str, Any] = json.loads(row[0])
    return intent


def _said(intent: Mapping[str, Any], name: str) -> str | None:
    """A person's word the intent carries (``published_by``, ``publish_reason``); None where
    it carries none (an intent an older qualify recorded before a kill): not recorded."""
    value = intent.get(name)
    return value if isinstance(value, str) else None


def finish(store: Store, version: int) -> None:
    """Make ``version`` current, recording who published it and why (the intent's
    ``published_by`` and ``publish_reason``) and its rollout-log rows, in one transaction.

    Raises:
        MatrixError: ``version`` is not being published, or the store is read-only.
    """
    _writable(store, "publish a manifest")
    conn = store.connection
    conn.execute("BEGIN TRANSACTION")
    try:
        intent = _pending_row(conn, version)
        if intent.get("draft"):
            conn.execute(
                "UPDATE manifests SET document = pending_document, created = ?, expires = ? "
                "WHERE version = ?",
                [intent["created"], intent["expires"], version],
            )
        # Who published it and why, in the very transaction that makes it published: a
        # version is never current without its record, nor recorded as published by anyone
        # while it is not.
        conn.execute(
            "UPDATE manifests SET pending = NULL, pending_document = NULL, published_at = ?, "
            "published_by = ?, publish_reason = ? WHERE version = ?",
            [store.now(), _said(intent, "published_by"), _said(intent, "publish_reason"), version],
        )
        for row in intent.get("log", ()):
            conn.execute(
                f"INSERT INTO rollouts ({', '.join(ROLLOUT_FIELDS)}) VALUES "
                f"({', '.join('?' * len(ROLLOUT_FIELDS))})",
                [row[f] for f in ROLLOUT_FIELDS],
            )
        conn.execute("COMMIT")
    except BaseException:
        rollback_quietly(conn)
        raise


def discard(store: Store, version: int) -> None:
    """Drop a publication that never happened, in one transaction: a draft is a draft again;
    a version reserved for it stays recorded as discarded (never reused, never a draft).

    Raises:
        MatrixError: ``version`` is not being published, or the store is read-only.
    """
    _writable(store, "discard a publication")
    conn = store.connection
    conn.execute("BEGIN TRANSACTION")
    try:
        intent = _pending_row(conn, version)
        if intent.get("draft"):
            conn.execute(
                "UPDATE manifests SET pending = NULL, pending_document = NULL WHERE version = ?",
                [version],
            )
        else:
            conn.execute(
                "UPDATE manifests SET pending = NULL, discarded_at = ? WHERE version = ?",
                [store.now(), version],
            )
        conn.execute("COMMIT")
    except BaseException:
        rollback_quietly(conn)
        raise


def pending(store: Store) -> list[Pending]:
    """Every publication that began and neither finished nor was discarded, oldest first."""
    rows = store.connection.execute(
        "SELECT version, release, coalesce(pending_document, document), pending FROM manifests "
        "WHERE pending IS NOT NULL ORDER BY version"
    ).fetchall()
    return [Pending(int(v), str(r), str(d), json.loads(p)) for v, r, d, p in rows]


def steering(store: Store, actions: Sequence[str] = STEERING) -> dict[str, dict[str, Any]]:
    """Classes a person steers and has not released: class -> the rollout-log row of the
    latest of ``actions`` (default `STEERING`), where no ``clear`` or ``start`` came after it."""
    wanted = ", ".join(f"'{a}'" for a in {*actions, "clear", "start"} if a.isidentifier())
    result = store.connection.execute(
        f"SELECT * FROM rollouts WHERE action IN ({wanted}) "
        # A clear records the version it cleared: at the same instant it comes after.
        "QUALIFY row_number() OVER (PARTITION BY host_class ORDER BY acted_at DESC, "
        "version DESC, action IN ('clear', 'start') DESC) = 1"
    )
    names = [column[0] for column in result.description or ()]
    rows = [dict(zip(names, row, strict=True)) for row in result.fetchall()]
    return {str(r["host_class"]): r for r in rows if r["action"] in actions}


def published_before(store: Store, version: int) -> str | None:
    """The document of the newest version published before ``version``, or None."""
    row = first_row(
        store.connection.execute(
            "SELECT document FROM manifests WHERE published_at IS NOT NULL AND version < ? "
            "ORDER BY version DESC LIMIT 1",
            [version],
        )
    )
    return str(row[0]) if row is not None else None
