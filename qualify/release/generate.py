"""Release manifests from the matrix: the composition of policy, build, signing and storage.

Owns the order of ``qualify manifest generate`` and ``publish``: read the latest evidence and the
previous manifest from the matrix, decide per class (``manifest.policy``), build the document
(``manifest.build``) and record it as a *draft* (a reserved version nothing treats as current);
then, on publish, sign it (``manifest.signing``), write it and the per-class documents
atomically, and mark it published, the one step hosts and readers see. Decisions and signatures
live in ``manifest``; SQL lives in ``matrix``; this module only wires them, with the clock as a
parameter.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from manifest._batch import paused_gc
from manifest.build import build_manifest, next_version, write_manifest
from manifest.envelope import encode_canonical, encode_envelope, format_time
from manifest.load import load_manifest, load_previous, validate_entry
from manifest.policy import decide, decide_each
from manifest.signing import check_publishable, sign_encoded
from matrix.publications import steering
from matrix.store import Store
from qualify.artifacts import ArtifactStore, digest_file
from qualify.errors import QualifyError
from qualify.project.load import LoadedProject
from qualify.release.coverage import (
    CoverageItem,
    ReleaseGate,
    coverage,
    release_gate,
    with_fleet_gaps,
)
from qualify.release.current import read_now
from qualify.release.publishing import Publication, PublishOptions
from qualify.release.publishing import publish as publish_version
from schemas.cell import Cell, latest
from schemas.manifest import ArtifactRef, Manifest, PreviousManifest

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

__all__ = [
    "FLEET_LOSS_CODES",
    "MAX_VALIDITY",
    "Draft",
    "GeneratedManifest",
    "ReleaseCheck",
    "artifact_refs",
    "draft_manifest",
    "fleet_losses",
    "generate_manifest",
    "latest_published",
    "load_published",
    "parse_duration",
    "previous_document",
    "previous_manifest",
    "publish_manifest",
    "read_draft",
    "release_check",
]

_DURATION = re.compile(r"\s*([0-9]{1,9})\s*([smhdw])\s*")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}

MAX_VALIDITY = timedelta(days=366)
"""Longest ``--expires`` a manifest may have: hosts refuse documents valid for longer than
their policy (``resolve-artifact --max-validity-days``, 400 by default), and a year is already
long for a signed release to stay trusted without a refresh."""


def parse_duration(
    text: str, *, what: str = "duration", most: timedelta = timedelta(days=3650)
) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``2w`` or ``45s`` as a timedelta, at most ``most``.

    Raises:
        QualifyError: anything else, naming ``what`` (the option) and the fix.
    """
    m = _DURATION.fullmatch(text)
    if not m or int(m.group(1)) <= 0:
        raise QualifyError(
            f"{what} {text[:40]!r}: expected a positive number and a unit (s, m, h, d, w), e.g. 30d"
        )
    try:
        span = timedelta(**{_UNITS[m.group(2)]: int(m.group(1))})
    except OverflowError:
        span = timedelta.max
    if span > most:
        raise QualifyError(
            f"{what} {text!r} is longer than the {most.days} days allowed; use at most {most.days}d"
        )
    return span


@dataclass(frozen=True)
class GeneratedManifest:
    """What ``generate_manifest`` wrote."""

    document: dict[str, Any]
    """``{"signed": ..., "signatures": [...]}``; ``signed["entries"]`` is an
    ``EncodedEntries`` (each entry read as its JSON object on first access; ``canonical`` is
    the document's bytes)."""
    canonical: bytes
    """The bytes written (and recorded)."""
    path: Path
    per_class_dir: Path | None
    signed: bool
    kept: dict[str, str] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)
    """Classes the manifest published before had and this one has not (`Draft.dropped`)."""
    validated: Manifest | None = field(default=None, repr=False)
    """The document's model, when it was validated whole before publishing (a draft read from
    the matrix); None when it was built here from validated parts."""

    @property
    def manifest(self) -> Manifest:
        """The written document as its model (read back from ``canonical`` when first asked:
        validating 10,000 entries costs about as much as signing them, and generation checks
        the bytes as hosts will instead, ``signing.check_publishable``)."""
        return self.validated if self.validated is not None else self._read_back

    @functools.cached_property
    def _read_back(self) -> Manifest:
        return load_manifest(self.canonical, source=str(self.path))


def previous_manifest(db: Store) -> Manifest | None:
    """The newest manifest published from the matrix, if any."""
    latest = db.latest_manifest()
    if latest is None:
        return None
    return load_manifest(latest[1].encode(), source=f"matrix manifest v{latest[0]}")


def artifact_refs(
    loaded: LoadedProject, store: ArtifactStore, base_uri: str | None
) -> tuple[dict[str, str], dict[str, ArtifactRef]]:
    """The project's artifacts: label -> digest (of the files now), and digest -> where hosts
    fetch it (the spec's ``uri``, else ``base_uri``, else the store's ``file://`` path)."""
    digests: dict[str, str] = {}
    refs: dict[str, ArtifactRef] = {}
    specs = [loaded.project.artifacts.baseline, *loaded.project.artifacts.candidates]
    for spec in specs:
        path = loaded.resolve(spec.path)
        digest = digest_file(path)
        digests[spec.label] = digest
        hexname = f"sha256/{digest.removeprefix('sha256:')}.onnx"
        if spec.uri:
            uri = spec.uri
        elif base_uri:
            uri = base_uri.rstrip("/") + "/" + hexname
        else:
            uri = store.path_of(digest).resolve().as_uri()
        refs[digest] = ArtifactRef(name=spec.label, uri=uri, length=path.stat().st_size)
    return digests, refs


@dataclass(frozen=True)
class Draft:
    """What ``draft_manifest`` wrote: an unsigned document that no host or reader takes as
    current until `publish_manifest` signs it."""

    version: int
    signed: dict[str, Any]
    kept: dict[str, str]
    """Classes whose published entry was carried over unchanged, and why (a rollout in progress,
    a hold or a pin): a draft never undoes what a person is steering by hand."""
    path: Path | None
    dropped: dict[str, str] = field(default_factory=dict)
    """Classes the published manifest has and this one has not, as the project file no longer
    lists them, each with what the published one gave it: their hosts will find no entry."""


def _dropped(previous: PreviousManifest | None, entries: Mapping[str, Any]) -> dict[str, str]:
    """`Draft.dropped`: class name -> ``in v7 it was held`` (or ``... ran int8``)."""
    if previous is None:
        return {}
    version = previous.signed.version
    return {
        name: f"in v{version} it "
        + ("was held" if e.artifact is None else f"ran {e.artifact.name}")
        for name, e in previous.signed.entries.items()
        if name not in entries
    }


def _kept_classes(db: Store, previous: PreviousManifest | None) -> dict[str, str]:
    """Classes whose published entry a new draft keeps, and why: a rollout in progress (or
    halted), and what a person steers (a hold, a pin, an aborted rollout), each in force until
    ``qualify rollout clear`` or a new ``rollout start``."""
    if previous is None:
        return {}
    kept: dict[str, str] = {}
    last: dict[str, dict[str, Any]] = {}
    for row in db.rollout_log():
        last[str(row["rollout_id"])] = row
    for name, entry in previous.signed.entries.items():
        if entry.rollout is None:
            continue
        r = entry.rollout
        halted = last.get(r.id)
        if halted is not None and halted["action"] == "halt":
            kept[name] = (
                f"rollout {r.id} halted at {r.percent}% ({halted['why']}); advance it again "
                "or abort it"
            )
        else:
            kept[name] = f"rollout {r.id} in progress at {r.percent}%"
    for name, row in steering(db).items():
        if name not in previous.signed.entries:
            continue
        what = {
            "hold": "held",
            "pin": f"pinned to {row['artifact']}",
            "abort": f"rollout {row['rollout_id']} aborted",
        }[str(row["action"])]
        kept[name] = (
            f"{what} by {row['actor']} in v{row['version']}: {row['why']} (until qualify rollout "
            f"clear {name}" + (" or a new rollout start)" if row["action"] == "abort" else ")")
        )
    return kept


def _decide_and_build(
    loaded: LoadedProject,
    db: Store,
    *,
    release: str,
    now: datetime,
    expires_in: timedelta,
    artifact_base_uri: str | None,
    store_dir: Path | None,
) -> tuple[dict[str, Any], dict[str, str], dict[str, str]]:
    """The ``signed`` part a draft records, the kept classes and the dropped ones (`Draft`);
    nothing is recorded or written. Each class's entry is written as soon as its batch of
    classes is decided (``decide_each``), and its decision is not kept: the entry holds all of
    it, and a fleet's decisions kept until the end were as many objects again to hold and
    free."""
    previous, published, source = _read_previous(db)
    store = ArtifactStore(store_dir or Path(db.path).resolve().parent / "artifacts")
    digests, refs = artifact_refs(loaded, store, artifact_base_uri)
    # What the policy needs of the matrix, not its whole history (`Store.decision_cells`).
    runs = {r.run_id: r for r in db.decision_runs()}
    decisions = decide_each(
        loaded.project, db.decision_cells_by_key(), runs, previous=previous, digests=digests
    )
    signed = build_manifest(
        loaded.project,
        decisions,
        release=release,
        version=max(next_version(previous), db.highest_manifest_version() + 1),
        created=now,
        expires=now + expires_in,
        snapshot=db.snapshot_id(),
        artifacts=refs,
        previous=previous,
        encoded=True,
    )
    kept = _kept_classes(db, previous)
    if kept:
        # Carried over verbatim from the matrix, so validated whole first.
        entries = published["entries"]
        mine = signed["entries"]
        for name in kept:
            if name in mine:
                mine[name] = validate_entry(entries[name], name=name, source=source)
    return signed, kept, _dropped(previous, signed["entries"])


def _read_previous(db: Store) -> tuple[PreviousManifest | None, dict[str, Any], str]:
    """What generating reads of the newest published manifest (``load.load_previous``), its
    parsed ``signed`` part (empty without one) and its name for messages."""
    latest = db.latest_manifest()
    if latest is None:
        return None, {}, "matrix"
    source = f"matrix manifest v{latest[0]}"
    previous, signed = load_previous(latest[1].encode(), source=source)
    return previous, signed, source


def draft_manifest(
    loaded: LoadedProject,
    db: Store,
    *,
    release: str,
    out: Path | None,
    now: datetime,
    expires_in: timedelta,
    artifact_base_uri: str | None = None,
    store_dir: Path | None = None,
) -> Draft:
    """Decide every class from the matrix and record the result as a draft (``out``: also
    write it there, unsigned, for review and ``manifest diff``).

    Classes the current manifest is rolling out, and classes a person holds or pins, keep their
    published entry. The draft's version is reserved: above every version recorded, so a
    generate that died before it wrote its file never has its number reused.

    Raises:
        QualifyError, ManifestError, MatrixError: with messages naming the file and the fix.
    """
    # No cycles are made here; a collection mid-way would walk every cell of the matrix.
    with paused_gc():
        signed, kept, dropped = _decide_and_build(
            loaded,
            db,
            release=release,
            now=now,
            expires_in=expires_in,
            artifact_base_uri=artifact_base_uri,
            store_dir=store_dir,
        )
        canonical = encode_envelope([], encode_canonical(signed))
        # what is drafted must pass a host's checks (it lacks only the signature)
        check_publishable(canonical, signed, None, now=now, source=str(out or "draft"))
        db.save_manifest(
            signed["version"], release, now, now + expires_in, canonical.decode(), encoded=True
        )
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            write_manifest(canonical, out)
    return Draft(signed["version"], signed, kept, out, dropped)


def previous_document(db: Store) -> str:
    """The newest published manifest's document JSON.

    Raises:
        QualifyError: nothing is published from this matrix.
    """
    return latest_published(db)[1]


def latest_published(db: Store) -> tuple[int, str]:
    """The newest published manifest's version and document JSON.

    Raises:
        QualifyError: nothing is published from this matrix.
    """
    latest = db.latest_manifest()
    if latest is None:
        raise QualifyError(
            "no manifest has been published from this matrix: run qualify manifest generate, "
            "then qualify manifest publish"
        )
    return latest


def read_draft(db: Store, draft_path: Path | None) -> tuple[int, dict[str, Any]]:
    """The draft to publish: the one at ``draft_path``, which must be exactly what the matrix
    recorded under its version (so an edited file is refused), else the matrix's newest.

    Raises:
        QualifyError: no draft, a file that is not a draft of this matrix, or one edited since.
    """
    if draft_path is None:
        latest = db.latest_draft()
        if latest is None:
            raise QualifyError(
                "no draft to publish in this matrix (every recorded version is published or older "
                "than a published one): run qualify manifest generate first"
            )
        return latest[0], json.loads(latest[1])["signed"]
    from manifest.load import parse_manifest, read_manifest_file

    _, signed = parse_manifest(read_manifest_file(draft_path), source=str(draft_path))
    version = signed.get("version")
    recorded = db.manifest(version) if isinstance(version, int) else None
    if recorded is None or not isinstance(version, int):
        raise QualifyError(
            f"{draft_path}: version {version!r} is not a draft recorded in this matrix; "
            "publish drafts generated from it (qualify manifest generate)"
        )
    # Published first: publishing stamps ``created`` and ``expires``, so the recorded document
    # differs from its draft whenever a second went by, and "edited?" would be the wrong answer.
    state = db.manifest_state(version)
    if state == "published":
        raise QualifyError(f"{draft_path}: version {version} is published already")
    if state == "discarded":
        raise QualifyError(
            f"{draft_path}: version {version} was discarded (a publish of it failed or was "
            "interrupted before its file was written); generate a new draft"
        )
    if encode_canonical(json.loads(recorded)["signed"]) != encode_canonical(signed):
        raise QualifyError(
            f"{draft_path}: differs from draft v{version} as the matrix recorded it (edited after "
            "generate?); generate a new draft rather than editing one"
        )
    return version, signed


def publish_manifest(
    db: Store, publish: PublishOptions, *, draft_path: Path | None = None
) -> GeneratedManifest:
    """Sign a draft (`read_draft`) and make it the current manifest: written to
    ``publish.out`` (and one document per class to ``publish.per_class_dir``), then marked
    published, the only step hosts and readers see. ``created`` and ``expires`` are stamped
    ``publish.now``; the entries are the draft's.

    Raises:
        QualifyError, ManifestError, MatrixError: no draft, an edited or stale one (a newer
            version was published after it), a bad key.
    """
    key = publish.signing_key()
    version, signed = read_draft(db, draft_path)
    signed = {
        **signed,
        "created": format_time(publish.now),
        "expires": format_time(publish.now + publish.expires_in),
    }
    with paused_gc():
        previous = _read_previous(db)[0]  # the one it replaces (a later one refused the draft)
        published = _sign_and_publish(db, version, signed, key, publish, from_matrix=True)
    return dataclasses.replace(published, dropped=_dropped(previous, signed["entries"]))


def _sign_and_publish(
    db: Store,
    version: int,
    signed: dict[str, Any],
    key: Ed25519PrivateKey | None,
    publish: PublishOptions,
    *,
    draft_release: str | None = None,
    from_matrix: bool = False,
) -> GeneratedManifest:
    """Sign ``signed`` (encoded once), check it as a host will, and publish it as one
    transaction (``qualify.release.publishing``: recorded, written to ``publish.out`` and per
    class, made current). ``draft_release``: the version is not drafted yet (a generate that
    drafts and publishes in one step): reserve it with the signed document itself, so the 17 MB
    of a 10,000-class document are stored once. ``from_matrix``: ``signed`` was read from the
    matrix or a file (a draft), not built here, so it is validated whole first."""
    out = publish.out
    if key is not None:
        document, canonical = sign_encoded(signed, key)
    else:
        document = {"signed": signed, "signatures": []}
        canonical = encode_envelope([], encode_canonical(signed))
    # what is published must load, and pass a host's checks
    validated = load_manifest(canonical, source=str(out)) if from_matrix else None
    check_publishable(canonical, signed, key, now=publish.now, source=str(out))
    publish_version(
        db,
        Publication(
            version=version,
            release=str(signed["release"]),
            document=document,
            canonical=canonical,
            key=key,
            out=out,
            created=publish.now,
            expires=publish.now + publish.expires_in,
            what="manifest generate --publish" if draft_release is not None else "manifest publish",
            per_class_dir=publish.per_class_dir,
            draft=draft_release is None,
            who=publish.who,
            why=publish.why,
        ),
    )
    return GeneratedManifest(
        document=document,
        canonical=canonical,
        path=out,
        per_class_dir=publish.per_class_dir,
        signed=key is not None,
        validated=validated,
    )


def generate_manifest(
    loaded: LoadedProject,
    db: Store,
    publish: PublishOptions,
    *,
    release: str,
    artifact_base_uri: str | None = None,
    store_dir: Path | None = None,
) -> GeneratedManifest:
    """Draft (`draft_manifest`) and publish (`publish_manifest`) in one step: what
    ``qualify manifest generate --publish`` does.

    Args:
        loaded: the project file (classes, budgets and policy in force now).
        db: the matrix, opened for writing (the manifest is recorded there).
        publish: how to publish it: the key (``None``: unsigned, which the CLI asks to be said
            with ``--unsigned``), the file hosts read, the clock (``created``), the validity
            and an optional per-class directory (which needs a key).
        release: release name.
        artifact_base_uri: base URL hosts fetch artifacts from (``BASE/sha256/<hex>.onnx``);
            defaults to ``file://`` URIs of the artifact store beside the matrix.
        store_dir: the artifact store (defaults to ``artifacts/`` beside the matrix).

    Raises:
        QualifyError, ManifestError, MatrixError: with messages naming the file and the fix.
    """
    # A bad key fails before a version is reserved.
    key = publish.signing_key()
    # Nothing here makes reference cycles, and every cell of the matrix is alive throughout:
    # automatic collections walked them all, again and again, for nothing (a third of the
    # time at 10,000 classes). Reference counting still frees everything.
    with paused_gc():
        signed, kept, dropped = _decide_and_build(
            loaded,
            db,
            release=release,
            now=publish.now,
            expires_in=publish.expires_in,
            artifact_base_uri=artifact_base_uri,
            store_dir=store_dir,
        )
        # What draft_manifest and then publish_manifest would record and write, without
        # reading the draft back from the matrix (it is the document in hand: publish stamps
        # the same ``created`` and ``expires``), encoding it twice or storing it twice.
        published = _sign_and_publish(
            db, signed["version"], signed, key, publish, draft_release=release
        )
    return dataclasses.replace(published, kept=kept, dropped=dropped)


@dataclass(frozen=True)
class ReleaseCheck:
    """What CI is told: coverage of the classes in scope and the release gate."""

    items: list[CoverageItem]
    gate: ReleaseGate
    against: str | None = None
    """The manifest the gate compared with ("manifest v7 (ocr-2)"); None: there was none."""


def release_check(
    loaded: LoadedProject,
    db: Store,
    *,
    scope: Sequence[str],
    unserved: Sequence[str] = (),
    current: Manifest | None = None,
    gaps: Mapping[str, str] | None = None,
) -> ReleaseCheck:
    """Coverage and the release gate for the classes in ``scope``, from the matrix as it is
    (``unserved`` adds to the classes the matrix knows a fleet run found no host for; ``gaps``
    to the classes it knows a fleet run ended without a measurement, with why).

    Every class is decided as ``manifest generate`` would now (nothing is written), on the same
    cells, current verdicts and artifact digests (the files' bytes now, ``qualify.release.current``),
    and compared with its entry in ``current`` (the published manifest a CI job fetched,
    `load_published`), else in the newest manifest the matrix published. A class whose latest
    evidence measured nothing (a fleet gap, or only a fleet run's ``node_lost``/
    ``fleet_timeout`` cells) has no measured decision, whatever the policy makes of it.

    Raises:
        ArtifactError: an artifact file cannot be read.
    """
    now = read_now(loaded, db)
    budgets = {name: c.budgets.p99_ms for name, c in loaded.project.host_classes.items()}
    wanted = set(scope)
    lost = {*unserved, *db.unserved()}
    items = [
        i for i in coverage(now.standings, budgets=budgets, unserved=lost) if i.host_class in wanted
    ]
    fleet = {name: f"{reason}: {why}" for name, (reason, why) in db.fleet_gaps().items()}
    fleet.update(gaps or {})
    items = with_fleet_gaps(items, fleet)
    previous = current if current is not None else previous_manifest(db)
    decisions = decide(loaded.project, now.by_key, now.runs, previous=previous, digests=now.digests)
    entries = previous.signed.entries if previous is not None else None
    unmeasured = fleet_losses(loaded, now.by_key, fleet)
    gate = release_gate(decisions, entries, scope=list(scope), unmeasured=unmeasured)
    against = (
        f"manifest v{previous.signed.version} ({previous.signed.release})"
        if previous is not None
        else None
    )
    return ReleaseCheck(items=items, gate=gate, against=against)


def load_published(
    path: Path, *, model: str, pubkey: Path | None = None, now: datetime | None = None
) -> Manifest:
    """The published manifest a gate compares with, read from a file a CI job fetched (or
    restored): its signature checked with ``pubkey`` when given, and its model line checked
    against the project's.

    Raises:
        QualifyError: the manifest is another model line's.
        ManifestError: not a manifest, or its signature does not verify (or it expired).
    """
    from manifest.load import read_manifest_file
    from manifest.signing import load_public_key, verify

    raw = read_manifest_file(path)
    if pubkey is not None:
        verify(raw, load_public_key(pubkey), now=now, source=str(path))
    found = load_manifest(raw, source=str(path))
    if found.signed.model != model:
        raise QualifyError(
            f"{path}: this manifest is model line {found.signed.model!r}, the project is "
            f"{model!r}; fetch {model}'s published manifest"
        )
    return found


FLEET_LOSS_CODES = frozenset({"node_lost", "fleet_timeout", "host_failed", "bundle_unreadable"})
"""Reasons of error cells that say a fleet run measured nothing (its host was lost, it ran out
of time, qualify failed there, its result was unreadable), not that the artifact failed."""


def fleet_losses(
    loaded: LoadedProject,
    by_key: Mapping[tuple[str, str, str], Sequence[Cell]],
    gaps: Mapping[str, str],
) -> dict[str, str]:
    """Per class of the project whose latest evidence measured nothing: a fleet gap newer than
    its cells (``gaps``), or a latest run whose every cell is an error for a fleet loss
    (`FLEET_LOSS_CODES`); why, in words. ``by_key``: the decision cells by class key."""
    losses: dict[str, str] = {}
    for name, host_class in loaded.project.host_classes.items():
        if name in gaps:
            losses[name] = f"the latest fleet run ended it without a measurement ({gaps[name]})"
            continue
        mine = by_key.get(host_class.key.as_tuple(), [])
        newest = latest(mine)
        if newest is None:
            continue
        run = [c for c in mine if c.run_id == newest.run_id]
        codes = {r.code for c in run for r in c.reasons}
        if all(c.verdict == "error" for c in run) and codes and codes <= FLEET_LOSS_CODES:
            losses[name] = (
                f"its latest run ({newest.run_id}) measured nothing: "
                + "; ".join(sorted({r.message for c in run for r in c.reasons}))[:300]
            )
    return losses
