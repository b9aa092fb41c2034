"""Editing the published manifest as python-tuf's ``Repository.edit()`` does: `edit_manifest`
yields the current version's typed entries; a clean exit publishes the edit as the next version,
signed, in one transaction (``qualify.release.publishing``); an exception or `ManifestEdit.discard`
publishes nothing. Does not own what an edit changes (``qualify.rollout``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from manifest import envelope
from manifest.load import load_editable, load_manifest
from manifest.signing import sign_encoded
from matrix.store import Store
from qualify.errors import QualifyError
from qualify.project.problems import class_choices
from qualify.release.generate import latest_published
from qualify.release.publishing import Publication, PublishOptions, log_row, publish
from schemas.manifest import Manifest, ManifestEntry

__all__ = ["ManifestEdit", "edit_manifest", "entry_wire"]


@dataclass
class ManifestEdit:
    """The newest published manifest, being edited: replace an entry of `entries` (a
    ``ManifestEntry``, changed with ``model_copy``) and `record` what the rollout log says."""

    manifest: Manifest
    """The version as published (never changed: the edit's starting point)."""
    entries: dict[str, ManifestEntry]
    """The entries the next version holds, by class."""
    options: PublishOptions
    log: list[dict[str, Any]] = field(default_factory=list)
    """Rollout-log rows (`publishing.log_row`'s arguments but the version) published with it."""
    version: int = 0
    """The version published, once the edit closed cleanly (0 until then)."""
    discarded: bool = False

    def entry(self, host_class: str) -> ManifestEntry:
        """``host_class``'s entry as the edit holds it.

        Raises:
            QualifyError: the manifest has no such class (the message lists them).
        """
        found = self.entries.get(host_class)
        if found is None:
            fix = class_choices(host_class, self.entries, "the manifest's")
            raise QualifyError(f"the current manifest has no class {host_class!r}. Fix: {fix}")
        return found

    def record(
        self,
        rollout_id: str,
        host_class: str,
        action: str,
        *,
        step: int,
        percent: int,
        artifact: str,
        why: str,
    ) -> None:
        """Publish a rollout-log row with the version: ``options.who`` did ``action`` at
        ``options.now``, for ``why``."""
        self.log.append(
            {
                "rollout_id": rollout_id,
                "host_class": host_class,
                "action": action,
                "step": step,
                "percent": percent,
                "artifact": artifact,
                "actor": self.options.who,
                "why": why,
                "at": self.options.now,
            }
        )

    def discard(self) -> None:
        """Close without publishing anything (an edit that found nothing to publish)."""
        self.discarded = True


@contextmanager
def edit_manifest(db: Store, options: PublishOptions) -> Iterator[ManifestEdit]:
    """The newest manifest published from ``db``, to edit; on a clean exit (unless discarded)
    the next version: the edited entries, a version above every one the matrix holds,
    ``created`` at ``options.now``, signed with ``options.key_path``, read back as the model
    (what is published must load) and published with its log rows as one transaction.

    Raises:
        QualifyError: nothing is published from this matrix; or as ``publishing.publish``.
        MalformedError: the published manifest (or the edit) does not validate.
        KeyFileError: the key cannot be read.
    """
    version, document = latest_published(db)
    manifest, signed = load_editable(document.encode(), source=f"matrix manifest v{version}")
    edit = ManifestEdit(manifest, dict(manifest.signed.entries), options)
    yield edit
    if not edit.discarded:
        edit.version = _publish(db, edit, signed)


def _publish(db: Store, edit: ManifestEdit, published: dict[str, Any]) -> int:
    """``edit`` as the next version, signed and published with its rollout-log rows, so that
    the version is current exactly when the log records it."""
    options = edit.options
    key = options.signing_key()
    if key is None:  # hosts refuse an unsigned version: an edit would take the class off them
        raise QualifyError("a manifest edit (a rollout step, a hold, a pin) is signed: pass --key")
    version = max(edit.manifest.signed.version + 1, db.highest_manifest_version() + 1)
    signed = {
        **published,
        "entries": _entries(edit, published["entries"]),
        "version": version,
        "created": envelope.format_time(options.now),
        "expires": envelope.format_time(options.now + options.expires_in),
    }
    document, canonical = sign_encoded(signed, key)
    load_manifest(canonical, source=str(options.out))  # what is published must load
    rows = tuple(log_row(version=version, **row) for row in edit.log)
    what = f"rollout {rows[0]['action']} {rows[0]['host_class']}" if rows else "manifest edit"
    publish(
        db,
        Publication(
            version=version,
            release=str(signed["release"]),
            document=document,
            canonical=canonical,
            key=key,
            out=options.out,
            created=options.now,
            expires=options.now + options.expires_in,
            what=what,
            per_class_dir=options.per_class_dir,
            log=rows,
            who=options.who,
            # what the rollout log says of the step (a step's evidence with the person's why)
            why=str(rows[0]["why"]) if rows else options.why,
        ),
    )
    return version


def _entries(edit: ManifestEdit, published: dict[str, Any]) -> dict[str, Any]:
    """The next version's entries on the wire: an entry the edit left as it was keeps its
    published form; in one it changed, so does every field it left as it was (a manifest
    written by an older qualify keeps the bytes of what nobody edited)."""
    before = edit.manifest.signed.entries
    entries: dict[str, Any] = {}
    for name, entry in edit.entries.items():
        old = before.get(name)
        if old is None:
            entries[name] = entry_wire(entry)
        elif entry is old or entry == old:
            entries[name] = published[name]
        else:
            fresh = entry_wire(entry)
            wire = dict(published[name])
            for key in ManifestEntry.model_fields:
                if getattr(entry, key) != getattr(old, key):
                    wire.pop(key, None)
                    if key in fresh:
                        wire[key] = fresh[key]
            entries[name] = wire
    return entries


def entry_wire(entry: ManifestEntry) -> dict[str, Any]:
    """``entry`` as the generator lays one out (``manifest.build``): match rules less their
    defaults, runtime and provider settings less their nulls (a rollback's too), no
    ``rollout`` member when there is none."""
    wire: dict[str, Any] = entry.model_dump(
        mode="json", exclude={"match", "runtime", "provider", "rollback", "rollout"}
    )
    wire["match"] = entry.match.model_dump(mode="json", exclude_defaults=True)
    wire["runtime"] = _settings(entry.runtime)
    wire["provider"] = _settings(entry.provider)
    wire["rollback"] = None
    if entry.rollback is not None:
        rollback = entry.rollback
        wire["rollback"] = {
            **rollback.model_dump(mode="json", exclude={"runtime", "provider"}),
            "runtime": _settings(rollback.runtime),
            "provider": _settings(rollback.provider),
        }
    if entry.rollout is not None:
        wire["rollout"] = entry.rollout.model_dump(mode="json")
    return wire


def _settings(spec: BaseModel | None) -> dict[str, Any] | None:
    return None if spec is None else spec.model_dump(mode="json", exclude_none=True)
