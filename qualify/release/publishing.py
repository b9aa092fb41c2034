"""Publishing a manifest version as one transaction: after a failure or a kill at any instant,
the matrix's record and the published files agree (`publish`, and `recover`, which the next
command runs first), and `PublishOptions`, what every publishing command is told. Does not own
signing (``manifest.signing``), per-class files (``manifest.perclass``) or the SQL
(``matrix.publications``)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from manifest import perclass
from manifest.build import write_manifest
from manifest.errors import ManifestError
from manifest.signing import load_private_key
from matrix import publications
from matrix.store import Store
from qualify.errors import QualifyError
from qualify.text import first_control

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

__all__ = [
    "PAUSE_ENV",
    "WHO_MOST",
    "WHY_MOST",
    "Publication",
    "PublishOptions",
    "check_said",
    "committed",
    "log_row",
    "os_user",
    "publish",
    "recover",
]

PAUSE_ENV = "QUALIFY_TEST_PAUSE_AT"
"""A test seam, inert in normal runs: when this variable names one of `publish`'s instants
(``recorded``, ``staged``, ``written``, ``pointed``), a publishing command says
``qualify: paused at <instant>`` on stderr and sleeps there, so that a test can kill it with
SIGKILL at exactly that instant (``tests/qualify/release/test_publishing.py``)."""


WHO_MOST = 200
"""The most characters of who published a version the matrix records (as the rollout log's
``actor``): a name, not a story."""

WHY_MOST = 1000
"""The most characters of why a version was published the matrix records (as the rollout
log's ``why``)."""


def check_said(who: str | None, why: str, *, who_is: str = "--who") -> None:
    """Refuse a ``--who`` or ``--why`` the record would not hold as said: empty (who only), over
    `WHO_MOST` / `WHY_MOST` characters, or with a control character (a newline, an escape:
    text that could forge a line of ``manifest history`` or restyle a terminal).

    Args:
        who: who publishes; None: nobody is known (recorded as not recorded), nothing to check.
        why: why, empty when not given.
        who_is: what ``who`` came from, for messages (the OS user name where --who was not given).

    Raises:
        QualifyError: naming the option, what is wrong and the fix.
    """
    if who is not None and not who.strip():
        raise QualifyError(f"{who_is} is empty: pass --who NAME, who publishes")
    for option, text, most, fix in (
        (who_is, who or "", WHO_MOST, "--who NAME"),
        ("--why", why, WHY_MOST, "--why TEXT (a link to a ticket, say)"),
    ):
        if len(text) > most:
            raise QualifyError(
                f"{option} is {len(text):,} characters, over the {most:,} recorded: pass a "
                f"shorter {fix}"
            )
        found = first_control(text)
        if found is not None:
            raise QualifyError(
                f"{option} holds a control character ({found[1]}) at character {found[0] + 1}: "
                f"pass {fix} as one line of printable text"
            )


def os_user() -> str | None:
    """The OS user name, as ``getpass.getuser`` reads it (``$LOGNAME``, ``$USER``, ..., then
    the password database): who publishes unless ``--who`` says; None where there is none,
    so that the matrix says "not recorded" rather than a name made up."""
    import getpass

    try:
        return getpass.getuser() or None
    except (KeyError, OSError):
        return None


def _pause(instant: str) -> None:
    if os.environ.get(PAUSE_ENV) == instant:
        sys.stderr.write(f"qualify: paused at {instant}\n")
        sys.stderr.flush()
        time.sleep(600)


@dataclass(frozen=True, kw_only=True)
class PublishOptions:
    """How a command publishes, and who asks why: read once from the command line (or the
    demo's script) and handed to the action whole, by ``manifest generate --publish``,
    ``manifest publish`` and every ``qualify rollout`` step."""

    key_path: Path | None
    """The Ed25519 private key the version is signed with; ``None`` publishes it unsigned, which
    hosts refuse (``manifest`` commands ask for ``--unsigned``; a rollout step is always
    signed, `signing_key`)."""
    out: Path
    """The manifest file hosts read (each version replaces it atomically)."""
    now: datetime
    """The time of the action: the version's ``created``, the log's ``acted_at``."""
    expires_in: timedelta
    """How long the version is valid."""
    per_class_dir: Path | None = None
    """Also write the version as one signed document per class into this directory."""
    why: str = ""
    """Why, as the person said it (empty: no reason given). The matrix records it with the
    version (``publish_reason``, cut to `WHY_MOST`); a rollout step also in the rollout log.
    ``manifest publish --why`` is checked first (`check_said`)."""
    who: str = ""
    """Who: ``manifest publish --who`` (by default `os_user`), a rollout step's
    `qualify.rollout.actor`; recorded as ``why`` is (``published_by``, cut to `WHO_MOST`).
    Empty: not known, recorded as not recorded (null)."""

    def signing_key(self) -> Ed25519PrivateKey | None:
        """The key, loaded (a bad key fails before anything is reserved or written); ``None``
        for an unsigned publish.

        Raises:
            QualifyError: per-class documents asked for without a key (hosts verify each).
            ManifestError: the key file is not an Ed25519 private key.
        """
        if self.key_path is None:
            if self.per_class_dir is not None:
                raise QualifyError(
                    "per-class documents must be signed: pass --key or drop --per-class"
                )
            return None
        return load_private_key(self.key_path)


@dataclass(frozen=True)
class Publication:
    """One version to publish, and what publishing it records."""

    version: int
    release: str
    document: Mapping[str, Any]
    """The signed document (``{"signed", "signatures"}``): per-class documents are split from it."""
    canonical: bytes
    """Its bytes, as written and recorded."""
    key: Ed25519PrivateKey | None
    out: Path
    created: datetime
    expires: datetime
    what: str
    """What publishes it, for messages: ``manifest publish``, ``rollout start gpu-a10``."""
    per_class_dir: Path | None = None
    log: Sequence[Mapping[str, Any]] = field(default_factory=tuple)
    """Rollout-log rows (`log_row`) that become part of the record with the version."""
    draft: bool = False
    """Publishing the draft recorded under ``version`` (else the version is reserved now)."""
    who: str = ""
    """Who publishes it (`PublishOptions.who`; empty: not known, recorded as null)."""
    why: str = ""
    """Why (`PublishOptions.why`; empty: no reason given, recorded as given)."""


def log_row(
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
) -> dict[str, Any]:
    """A rollout-log row as a publication carries it (``matrix.publications.ROLLOUT_FIELDS``)."""
    return {
        "rollout_id": rollout_id,
        "host_class": host_class,
        "action": action,
        "version": version,
        "step": step,
        "percent": percent,
        "artifact": artifact,
        "actor": actor[:200],
        "why": why[:1000],
        "acted_at": at.isoformat(),
    }


def publish(db: Store, pub: Publication) -> None:
    """Publish ``pub`` in this order, each instant named (the kill tests stop the process at
    each one, `PAUSE_ENV`):

    1. ``recorded``: the matrix records the signed document and the publication's intent (where
       its files go, the rollout-log rows it publishes) in one transaction; nothing reads it as
       current.
    2. ``staged``: with a per-class directory, the version's set is written into ``DIR/v<N>/``;
       the pointer ``DIR/current`` does not move, so no host sees it.
    3. ``written``: the manifest file is replaced atomically. This is the commit point: from
       here a host may have read the new version, so it is completed, never taken back.
    4. ``pointed``: the per-class pointer moves to ``v<N>`` (older sets qualify wrote go).
    5. The matrix makes the version current and records who published it and why
       (``pub.who``, ``pub.why``) and its rollout-log rows, in one transaction.

    A failure before the commit point discards the publication there and then (the staged set
    removed; a version reserved for it is recorded as discarded and never reused, a draft is a
    draft again) and says that nothing was published; after it, the record is completed. A kill
    leaves a recorded intent that `recover` completes or discards. So there is never a signed
    version on disk that the matrix and its rollout log do not record, nor one recorded whose
    file never appeared.

    Raises:
        QualifyError: an interrupted publication is still recorded (`recover` first); or the
            publication failed before its file was written (nothing published, it was
            discarded), or after (it is published; the per-class documents are not).
        ManifestError, MatrixError: the version cannot be recorded.
    """
    left = publications.pending(db)
    if left:
        raise QualifyError(
            f"manifest v{left[0].version} ({left[0].intent.get('what', 'a publish')}) was "
            "interrupted; run any publishing command of the CLI to complete or discard it first"
        )
    if pub.per_class_dir is not None and pub.key is not None:
        # A directory that is not qualify's is refused before a version is reserved for it.
        perclass.claim(pub.per_class_dir, str(pub.document["signed"]["model"]))
    intent = {
        "what": pub.what,
        "out": str(pub.out.resolve()),
        "per_class_dir": str(pub.per_class_dir.resolve()) if pub.per_class_dir else None,
        "log": [dict(row) for row in pub.log],
        "created": pub.created.isoformat(),
        "expires": pub.expires.isoformat(),
        # Recorded with the version when it is made current (``publications.finish``), so a
        # kill at any instant leaves neither a current version without its record nor a
        # record of a version that never was current.
        "published_by": pub.who[:WHO_MOST] or None,
        "publish_reason": pub.why[:WHY_MOST],
    }
    publications.begin(
        db,
        pub.version,
        release=pub.release,
        created=pub.created,
        expires=pub.expires,
        document_json=pub.canonical.decode(),
        intent=intent,
        draft=pub.draft,
    )
    _pause("recorded")
    _write(db, pub)
    publications.finish(db, pub.version)


def _write(db: Store, pub: Publication) -> None:
    """The files, staged then committed; a failure discards (before the manifest file was
    replaced) or completes the record (after)."""
    per_class = pub.per_class_dir if pub.key is not None else None
    try:
        if per_class is not None and pub.key is not None:
            perclass.stage(pub.document, pub.key, per_class)
            _pause("staged")
        pub.out.parent.mkdir(parents=True, exist_ok=True)
        write_manifest(pub.canonical, pub.out)
    except BaseException as exc:
        if per_class is not None:
            perclass.discard(per_class, pub.version)
        publications.discard(db, pub.version)
        if isinstance(exc, OSError | ManifestError):
            what = f"{exc.strerror} ({exc.filename})" if isinstance(exc, OSError) else str(exc)
            raise QualifyError(
                f"{what}; nothing was published: version {pub.version} ({pub.what}) is "
                "discarded" + (" and its draft is a draft again" if pub.draft else "")
            ) from exc
        raise
    _pause("written")
    if per_class is None:
        return
    try:
        perclass.point(per_class, pub.version)
    except (OSError, ManifestError) as exc:
        publications.finish(db, pub.version)
        raise QualifyError(
            f"version {pub.version} is published in {pub.out}, but its per-class documents in "
            f"{per_class} could not be made current ({exc}); the next publish with --per-class "
            "writes them"
        ) from exc
    _pause("pointed")


def _holds(path: Path, data: bytes) -> bool:
    """Whether the file at ``path`` holds exactly ``data`` (read no further than it could)."""
    try:
        if path.stat().st_size != len(data):
            return False
        from schemas.atomic import read_bounded

        return read_bounded(path, len(data)) == data
    except OSError:
        return False


def committed(db: Store) -> list[tuple[int, str]]:
    """Interrupted publications past their commit point, oldest first: (version, document) of
    each whose manifest file holds exactly the recorded bytes, so that hosts may have read it
    and the next publishing command completes it (`recover`). Reads only: what a read command
    (``telemetry check``) judges hosts against before anyone completed it."""
    return [
        (left.version, left.document)
        for left in publications.pending(db)
        if _holds(Path(str(left.intent.get("out", ""))), left.document.encode())
    ]


def recover(db: Store) -> list[str]:
    """Complete or discard every publication a kill (or a crash) interrupted, and say which.

    One whose manifest file holds exactly the recorded bytes had reached its commit point (a
    host may have read it): its per-class set is made current where it was staged, and the
    matrix makes it current with its rollout-log rows. Any other never reached a host: its
    staged per-class set is removed and it is discarded (a draft is a draft again).

    Returns:
        One sentence per publication, for people; empty when nothing was interrupted.
    """
    said: list[str] = []
    for left in publications.pending(db):
        said.append(_recover_one(db, left))
    return said


def _recover_one(db: Store, left: publications.Pending) -> str:
    intent = left.intent
    version, what = left.version, intent.get("what", "a publish")
    out = Path(str(intent.get("out", "")))
    raw_dir = intent.get("per_class_dir")
    per_class = Path(raw_dir) if isinstance(raw_dir, str) else None
    if _holds(out, left.document.encode()):
        note = ""
        if per_class is not None:
            try:
                perclass.point(per_class, version)
            except (OSError, ManifestError) as exc:
                note = f"; its per-class documents were not made current ({exc})"
        publications.finish(db, version)
        logged = " with its rollout-log entry" if intent.get("log") else ""
        return (
            f"completed the interrupted publication of manifest v{version} ({what}): {out} "
            f"already held it, so hosts may have read it; it is current now{logged}{note}"
        )
    if per_class is not None:
        perclass.discard(per_class, version)
    publications.discard(db, version)
    again = "; its draft is a draft again" if intent.get("draft") else ""
    return (
        f"discarded the interrupted publication of manifest v{version} ({what}): {out} never "
        f"held it, so no host saw it{again}"
    )
