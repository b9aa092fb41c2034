"""Building and writing release manifests.

Owns turning the policy's decisions into the ``signed`` part of a manifest (plain JSON: integers,
strings, booleans; see ``manifest.envelope``), splitting it into one document per host class (as
TUF's hashed bins split targets, so a host of a large fleet reads only its own), and writing both
atomically. Does not own the decision (``manifest.policy``), keys and signatures
(``manifest.signing``), reading a manifest back (``manifest.load``), comparing two
(``manifest.diff``), showing one to people (``manifest.show``) nor the host side
(``manifest.resolve``). No clock: ``created`` and ``expires`` are arguments.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from json.encoder import encode_basestring as _q
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from manifest import envelope
from manifest._batch import paused_gc
from manifest.encoded import EncodedEntries, EntryText
from manifest.envelope import canonical_text
from manifest.errors import BuildError, CanonicalError
from manifest.signing import sign_document
from schemas.atomic import write_atomic
from schemas.manifest import ArtifactRef, ClassDecision, Evidence, Manifest, PreviousManifest
from schemas.project import HostClass, MatchRules, Project, ProviderSpec, RuntimeSpec

__all__ = [
    "build_manifest",
    "next_version",
    "per_class_documents",
    "sign_document",
    "write_manifest",
    "write_per_class",
]


def next_version(previous: Manifest | PreviousManifest | None) -> int:
    """The version of the next manifest: one above the previous one, 1 for the first."""
    return 1 if previous is None else previous.signed.version + 1


class _Locations:
    """Where the previous manifest says each artifact it points at is: digest -> location,
    indexed on the first lookup (most builds never look), the first entry naming a digest (in
    the manifest's order; an entry's artifact before its rollback) winning."""

    def __init__(self, previous: Manifest | PreviousManifest | None) -> None:
        self._previous = previous
        self._known: dict[str, dict[str, Any]] | None = None

    def get(self, digest: str) -> dict[str, Any] | None:
        if self._known is None:
            self._known = {}
            entries = self._previous.signed.entries.values() if self._previous else ()
            for entry in entries:
                for item in (entry.artifact, entry.rollback):
                    if item is not None and item.digest not in self._known:
                        self._known[item.digest] = {
                            "name": item.name,
                            "digest": item.digest,
                            "length": item.length,
                            "uri": item.uri,
                        }
        found = self._known.get(digest)
        return None if found is None else dict(found)


def _artifact(
    digest: str,
    artifacts: Mapping[str, ArtifactRef],
    previous: _Locations,
    host_class: str,
    role: str,
) -> dict[str, Any]:
    ref = artifacts.get(digest)
    if ref is not None:
        return {"name": ref.name, "digest": digest, "length": ref.length, "uri": ref.uri}
    # A rollback may be an artifact the project no longer lists: the previous manifest knows it.
    found = previous.get(digest)
    if found is not None:
        return found
    raise BuildError(
        f"class '{host_class}': the {role} artifact {digest} has no location; add it to "
        "'artifacts' (digest -> name, uri, length) from the artifact store"
    )


def build_manifest(
    project: Project,
    decisions: Iterable[ClassDecision],
    *,
    release: str,
    version: int,
    created: datetime,
    expires: datetime,
    snapshot: str,
    artifacts: Mapping[str, ArtifactRef],
    previous: Manifest | PreviousManifest | None = None,
    encoded: bool = False,
) -> dict[str, Any]:
    """The ``signed`` part of a manifest.

    Args:
        project: the project file (match rules, runtime and provider requirements per class).
        decisions: ``manifest.policy.decide``'s output, one per class; or
            ``decide_each``'s, each entry then written as soon as its class is decided.
        release: release name.
        version: this manifest's version; must be above ``previous``'s.
        created: when it is generated (aware datetime; seconds kept).
        expires: from when hosts refuse it; must be after ``created``.
        snapshot: the matrix snapshot the decisions were read from.
        artifacts: digest -> where hosts fetch it.
        previous: the previous manifest (version check, locations of old rollback artifacts).
        encoded: hold ``entries`` as an `EncodedEntries`, each entry's canonical bytes as they
            were written (what generating a release signs, writes and splits without encoding the
            entries again), rather than as parsed JSON objects.

    Returns:
        The ``signed`` mapping: canonical-JSON content with no floats, ready for
        ``sign_document``.

    Raises:
        BuildError: a version not above the previous one, ``expires`` not after ``created``, a
            decision for a class the project lacks, or an artifact without a location.
    """
    if not release:
        raise BuildError("release: the release name must not be empty; pass --release NAME")
    if version < 1:
        raise BuildError(f"version: must be >= 1, found {version}")
    if previous is not None and version <= previous.signed.version:
        raise BuildError(
            f"version: {version} must be > {previous.signed.version}, the previous manifest's "
            f"(release {previous.signed.release!r}); a lower version is never generated"
        )
    created_s, expires_s = envelope.format_time(created), envelope.format_time(expires)
    if expires_s <= created_s:
        raise BuildError(f"expires: {expires_s} must be after created {created_s}")

    with paused_gc():
        written = _entries(project, decisions, artifacts, previous)
        entries = written if encoded else dict(written)
    return {
        "type": envelope.MANIFEST_TYPE,
        "format": envelope.FORMAT,
        "release": release,
        "version": version,
        "created": created_s,
        "expires": expires_s,
        "model": project.model,
        "snapshot": snapshot,
        "policy": project.policy.model_dump(mode="json"),
        "entries": entries,
    }


def _entries(
    project: Project,
    decisions: Iterable[ClassDecision],
    artifacts: Mapping[str, ArtifactRef],
    previous: Manifest | PreviousManifest | None,
) -> EncodedEntries:
    """Every decision's entry as its canonical bytes, in the decisions' order."""
    items: dict[str, EntryText] = {}
    write = _EntryWriter(artifacts, _Locations(previous))
    for d in decisions:
        cls = project.host_classes.get(d.host_class)
        if cls is None:
            raise BuildError(
                f"decision for class '{d.host_class}', which the project file does not define"
            )
        if d.host_class in items:
            raise BuildError(f"two decisions for class '{d.host_class}'")
        items[d.host_class] = EntryText((write.entry(d, cls).encode(), d.host_class, d.decision))
    return EncodedEntries(items)


class _EntryWriter:
    """Each class's entry as canonical JSON text, written straight from its decision: the one
    place that lays an entry out.

    Building a dict per class and encoding it (a walk for floats, then ``json.dumps`` with
    sorted keys) cost twice what writing the text does: here the members are written in sorted
    order, strings escaped by ``json.dumps``'s own escaper and integers checked to be integers,
    so the text is what ``envelope.encode_canonical`` makes of that dict
    (``tests/manifest/test_properties.py`` and ``test_encoded.py`` hold every entry of random
    fleets, hostile strings included, equal to the generic encoding of the decision's
    ``model_dump``). Artifacts and runtime and provider settings,
    which classes share, are encoded once each."""

    def __init__(self, artifacts: Mapping[str, ArtifactRef], previous: _Locations) -> None:
        self._artifacts = artifacts
        self._previous = previous
        self._located: dict[str, tuple[str, str]] = {}
        self._specs: dict[tuple[type, bytes], str] = {}  # settings -> their text

    def _artifact(self, digest: str, host_class: str, role: str) -> tuple[str, str]:
        """An artifact object's members before ``proven_to_load``, and its ``uri`` member."""
        found = self._located.get(digest)
        if found is None:
            where = _artifact(digest, self._artifacts, self._previous, host_class, role)
            uri = where.pop("uri")
            found = self._located[digest] = (
                canonical_text(where)[1:-1],
                canonical_text({"uri": uri})[1:-1],
            )
        return found

    def _spec(self, spec: MatchRules | RuntimeSpec | ProviderSpec) -> str:
        """The canonical text of the settings' dump as an entry holds it (match rules less
        their defaults, runtime and provider less their nulls), once per distinct settings:
        classes share them (those of one hardware share its match rules, of one runtime build
        its runtime), and a serialiser's JSON of the whole model is a cheaper key than the dump
        is to encode."""
        serializer = type(spec).__pydantic_serializer__
        key = (type(spec), serializer.to_json(spec))
        text = self._specs.get(key)
        if text is None:
            dump = (
                serializer.to_python(spec, mode="json", exclude_defaults=True)
                if type(spec) is MatchRules
                else serializer.to_python(spec, mode="json", exclude_none=True)
            )
            text = self._specs[key] = canonical_text(dump)
        return text

    def entry(self, d: ClassDecision, cls: HostClass) -> str:
        """The entry of ``d``'s class (``cls``: its settings in the project file now)."""
        key = cls.key
        artifact = "null"
        if d.artifact_digest is not None:
            head, uri = self._artifact(d.artifact_digest, d.host_class, d.decision)
            artifact = f"{{{head},{uri}}}"
        rollback = "null"
        if d.rollback_digest is not None:
            head, uri = self._artifact(d.rollback_digest, d.host_class, "rollback")
            # null: the same requirements as the entry's (most classes; keeps entries small)
            same_runtime = _same(d.rollback_runtime, cls.runtime)
            same_provider = _same(d.rollback_provider, cls.provider)
            rollback = (
                f'{{{head},"proven_to_load":{_bool(d.rollback_proven)},"provider":'
                f"{'null' if same_provider else self._spec(d.rollback_provider)},"
                f'"runtime":{"null" if same_runtime else self._spec(d.rollback_runtime)},{uri}}}'
            )
        evidence = "null" if d.evidence is None else _evidence_text(d.evidence)
        reasons = ",".join(
            [f'{{"code":{_q(r.code)},"message":{_q(r.message)}}}' for r in d.reasons]
        )
        return (
            f'{{"artifact":{artifact},"decision":{_q(d.decision)},"evidence":{evidence},'
            f'"host_class":{_q(d.host_class)},"key":{{"hardware":{_q(key.hardware)},'
            f'"provider":{_q(key.provider)},"runtime":{_q(key.runtime)}}},'
            f'"match":{self._spec(cls.match)},'
            f'"provider":{self._spec(cls.provider)},"reasons":[{reasons}],'
            f'"rollback":{rollback},"run_ids":[{",".join(map(_q, d.run_ids))}],'
            f'"runtime":{self._spec(cls.runtime)},"summary":{_q(d.summary)}}}'
        )


def _same(a: RuntimeSpec | ProviderSpec, b: RuntimeSpec | ProviderSpec) -> bool:
    """``a == b``, cheaply where it is cheap: the same object (a rollback that carries the
    class's own settings), else equal field dicts of one type (pydantic's ``__eq__`` starts
    there too, after type, extra and private checks these frozen, extra-free models pass; a
    rollback read from the previous manifest is a twin object), else pydantic's own answer."""
    return a is b or (type(a) is type(b) and a.__dict__ == b.__dict__) or a == b


def _evidence_text(e: Evidence) -> str:
    """``encode_canonical(e.model_dump(mode="json"))``, decoded, from the fields: every field
    of an `Evidence` is a JSON value already (its ratios are strings); written in sorted
    order."""
    parity = e.parity
    if parity is None:
        parity_text = "null"
    else:
        outputs = ",".join(
            [
                f'{_q(name)}:{{"cosine_min":{_str(o.cosine_min)},"max_abs":{_str(o.max_abs)},'
                f'"passed":{_bool(o.passed)},"top1_agreement":{_str(o.top1_agreement)}}}'
                for name, o in sorted(parity.outputs.items())
            ]
        )
        parity_text = (
            f'{{"outputs":{{{outputs}}},"passed":{_bool(parity.passed)},'
            f'"samples":{_int(parity.samples)}}}'
        )
    # The integer fields in one pass (a call each was a tenth of writing an entry).
    batch, cold, concurrency, fallback, budget, upper, p99, rss, samples = [
        "null" if v is None else int.__repr__(v) if type(v) is int else _int(v)
        for v in (
            e.batch_size,
            e.cold_init_us,
            e.concurrency,
            e.fallback_nodes,
            e.p99_budget_us,
            e.p99_upper_us,
            e.p99_us,
            e.peak_rss_kb,
            e.samples,
        )
    ]
    return (
        f'{{"artifact_digest":{_q(e.artifact_digest)},"artifact_name":{_q(e.artifact_name)},'
        f'"batch_size":{batch},"cold_init_us":{cold},"concurrency":{concurrency},'
        f'"emulated":{_bool(e.emulated)},{_emulated_numerics(e)}"fallback_nodes":{fallback},'
        f'"isa_mismatch":[{",".join(map(_q, e.isa_mismatch))}],'
        f'"measured_at":{_q(e.measured_at)},"p99_budget_us":{budget},"p99_upper_us":{upper},'
        f'"p99_us":{p99},"parity":{parity_text},"peak_rss_kb":{rss},"role":{_q(e.role)},'
        f'"run_id":{_q(e.run_id)},"samples":{samples},"verdict":{_q(e.verdict)}}}'
    )


def _emulated_numerics(e: Evidence) -> str:
    """The ``emulated_numerics`` member and its comma, or nothing: it is absent, not null, for
    evidence computed natively (as `schemas.manifest.Evidence` dumps it)."""
    n = e.emulated_numerics
    if n is None:
        return ""
    return f'"emulated_numerics":{{"arch":{_q(n.arch)},"cpu":{_q(n.cpu)},"qemu":{_q(n.qemu)}}},'


def _int(value: int | None) -> str:
    """An integer's JSON, or null; anything else (a float above all) is refused."""
    if value is None:
        return "null"
    if type(value) is not int:
        raise CanonicalError(
            f"{value!r} is not an integer; canonical JSON here holds integers and strings only"
        )
    return int.__repr__(value)


def _str(value: str | None) -> str:
    return "null" if value is None else _q(value)


def _bool(value: bool) -> str:
    if value is True:
        return "true"
    if value is False:
        return "false"
    raise CanonicalError(f"{value!r} is not a boolean")


def _signed_part(doc: Mapping[str, Any]) -> Mapping[str, Any]:
    inner = doc.get("signed")
    return inner if isinstance(inner, Mapping) else doc


def per_class_documents(signed: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Split a manifest into one ``signed`` part per host class.

    Each carries the manifest's release, version, times, model, snapshot and policy, the class
    name (hosts check it against the name they asked for) and the class's entry.

    Args:
        signed: a manifest's ``signed`` part (or the whole signed document).

    Returns:
        class name -> ``signed`` part of type ``qualify-class-manifest``.
    """
    signed = _signed_part(signed)
    common = {
        k: signed[k] for k in ("release", "version", "created", "expires", "model", "snapshot")
    }
    common["policy"] = signed["policy"]
    entries = signed["entries"]
    # An entry still held as its canonical bytes is not parsed to be encoded again.
    entry_of = entries.encoded if isinstance(entries, EncodedEntries) else entries.__getitem__
    return {
        name: {
            **common,
            "type": envelope.CLASS_TYPE,
            "format": envelope.FORMAT,
            "host_class": name,
            "entry": entry_of(name),
        }
        for name in entries
    }


def write_manifest(doc: Mapping[str, Any] | bytes, path: Path) -> None:
    """Write a signed (or unsigned) document atomically as canonical JSON.

    Args:
        doc: ``{"signed": ..., "signatures": [...]}``, or its canonical bytes as
            ``signing.sign_encoded`` returns them (written as they are, not encoded again).
        path: destination; its directory must exist.

    Raises:
        BuildError: the directory does not exist.
        CanonicalError: the document holds a float.
    """
    if not path.parent.is_dir():
        raise BuildError(f"{path.parent}: no such directory for the manifest; create it first")
    write_atomic(path, doc if isinstance(doc, bytes) else envelope.encode_canonical(doc))


def write_per_class(
    doc: Mapping[str, Any], key: Ed25519PrivateKey, directory: Path
) -> dict[str, Path]:
    """Publish one signed document per class, all at once, into ``directory``: the version's
    set staged (``manifest.perclass.stage``), then the pointer moved to it and older sets
    removed (``perclass.point``). Only what qualify wrote there is ever removed, and a
    directory holding anything else is refused (``perclass.claim``).

    Args:
        doc: the manifest (signed document or its ``signed`` part).
        key: the signing key.
        directory: created if missing.

    Returns:
        class name -> path written (inside ``v<version>/``).

    Raises:
        BuildError: a directory that is not qualify's, a class name that cannot be a file name,
            or this version already published there.
    """
    from manifest import perclass

    written = perclass.stage(doc, key, directory)
    perclass.point(directory, int(doc.get("signed", doc)["version"]))
    return written
