"""Building and writing manifests: the signed part, per-class documents, atomic publishing."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import jsonschema
import pytest

from manifest import envelope
from manifest.build import (
    build_manifest,
    next_version,
    per_class_documents,
    write_manifest,
)
from manifest.errors import BuildError, CanonicalError
from manifest.perclass import MARKER, write_per_class
from manifest.signing import verify
from schemas import manifest as schema
from schemas.manifest import ClassDocument, Manifest
from tests.manifest.factories import (
    CLOCK,
    Fleet,
    artifact_refs,
    class_spec,
    fixed_key,
    make_project,
    scenario,
    signed_manifest,
)


def test_envelope_and_schema_agree_on_format_and_types() -> None:
    assert envelope.FORMAT == schema.MANIFEST_FORMAT
    assert envelope.MANIFEST_TYPE == schema.MANIFEST_TYPE
    assert envelope.CLASS_TYPE == schema.CLASS_DOCUMENT_TYPE


def test_manifest_validates_against_its_published_json_schema() -> None:
    doc = signed_manifest(scenario(), fixed_key())
    jsonschema.validate(doc, Manifest.model_json_schema())
    one = ClassDocument.model_json_schema()
    for signed in per_class_documents(doc).values():
        jsonschema.validate({"signed": signed, "signatures": doc["signatures"]}, one)


def test_every_reason_code_used_is_documented() -> None:
    from schemas.cell import REASON_CODES

    doc = signed_manifest(scenario(), fixed_key())
    used = {r["code"] for e in doc["signed"]["entries"].values() for r in e["reasons"]}
    assert used <= set(schema.DECISION_REASON_CODES) | set(REASON_CODES)


def test_entry_carries_what_resolve_needs() -> None:
    doc = signed_manifest(scenario(), fixed_key())
    entry = doc["signed"]["entries"]["x86-vnni"]
    assert entry["match"]["cpu_flags"] == ["avx512_vnni"]
    assert entry["runtime"]["version"] == "1.32.*"
    assert entry["provider"]["expected"] == "CPUExecutionProvider"
    assert entry["artifact"]["uri"].endswith("rec-int8.onnx")
    assert entry["rollback"]["proven_to_load"] is True
    assert entry["evidence"]["p99_upper_us"] == 42000
    assert entry["evidence"]["parity"]["outputs"]["y"]["cosine_min"] == "9.990000e-01"


def test_version_must_be_above_the_previous_manifest() -> None:
    fleet = scenario()
    first = Manifest.model_validate(signed_manifest(fleet, fixed_key(), version=4))
    assert next_version(first) == 5
    assert next_version(None) == 1
    with pytest.raises(BuildError, match="4 must be > 4"):
        signed_manifest(fleet, fixed_key(), version=4, previous=first)
    with pytest.raises(BuildError, match="3 must be > 4"):
        signed_manifest(fleet, fixed_key(), version=3, previous=first)


def test_expiry_must_follow_creation() -> None:
    with pytest.raises(BuildError, match="must be after created"):
        signed_manifest(scenario(), fixed_key(), expires=CLOCK)


def test_artifact_without_a_location_names_the_digest_and_the_fix() -> None:
    fleet = scenario()
    refs = artifact_refs(fleet.project)
    refs.pop(next(iter(refs)))
    with pytest.raises(BuildError, match="has no location; add it to 'artifacts'"):
        build_manifest(
            fleet.project,
            list(fleet.decide().values()),
            release="r",
            version=1,
            created=CLOCK,
            expires=CLOCK + timedelta(days=1),
            snapshot="s",
            artifacts=refs,
        )


def test_a_float_provider_setting_is_refused_by_its_path() -> None:
    # A YAML session config value may be a float; the signed content holds none.
    spec = class_spec(1)
    spec["provider"]["session_config"] = {"session.intra_op.allow_spinning": 0, "x.ratio": 0.5}
    fleet = Fleet(make_project({"x86": spec, "arm": class_spec(2)}))
    with pytest.raises(CanonicalError, match=r"^\$\.provider\.session_config\.x\.ratio: 0\.5 is"):
        signed_manifest(fleet, fixed_key())


def test_write_manifest_is_atomic_and_canonical(tmp_path: Path) -> None:
    doc = signed_manifest(scenario(), fixed_key())
    path = tmp_path / "manifest.json"
    path.write_text("old")
    write_manifest(doc, path)
    assert path.read_bytes() == envelope.encode_canonical(doc)
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]
    with pytest.raises(BuildError, match="no such directory"):
        write_manifest(doc, tmp_path / "nowhere" / "m.json")


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_per_class_documents_are_signed_named_and_published_as_one_set(tmp_path: Path) -> None:
    key = fixed_key()
    doc = signed_manifest(scenario(), key)
    classes = tmp_path / "classes"
    written = write_per_class(doc, key, classes)
    assert _names(classes) == [MARKER, "current", "v1"]
    assert (classes / "current").read_text() == "v1\n"
    assert _names(classes / "v1") == sorted(f"{n}.json" for n in doc["signed"]["entries"])
    one_raw = written["gpu-a10"].read_bytes()
    verify(one_raw, key.public_key())
    one = json.loads(one_raw)
    assert one["signed"]["host_class"] == "gpu-a10"
    assert one["signed"]["entry"] == doc["signed"]["entries"]["gpu-a10"]
    assert one["signed"]["version"] == doc["signed"]["version"]


def test_publishing_keeps_the_set_before_and_retires_older_sets_and_classes(
    tmp_path: Path,
) -> None:
    key = fixed_key()
    classes = tmp_path / "classes"
    write_per_class(signed_manifest(scenario(), key, version=1), key, classes)
    write_per_class(signed_manifest(scenario(), key, version=2), key, classes)
    smaller = Fleet(make_project({"x86-vnni": class_spec(1)}))
    smaller.qualify("x86-vnni")
    write_per_class(signed_manifest(smaller, key, version=3), key, classes)
    assert _names(classes) == [
        MARKER,
        "current",
        "v2",
        "v3",
    ]  # v2 for hosts that just read the pointer
    assert _names(classes / "v3") == ["x86-vnni.json"]  # a retired class has no document


def test_a_kill_mid_publish_leaves_the_published_set_and_the_next_publish_cleans_up(
    tmp_path: Path,
) -> None:
    key = fixed_key()
    classes = tmp_path / "classes"
    write_per_class(signed_manifest(scenario(), key, version=1), key, classes)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    # What a writer killed mid-way leaves: its temporary set, and the old layout's temp files.
    leftover = classes / f".v2.p{dead.pid}.abc.tmp"
    leftover.mkdir()
    (leftover / "x86-vnni.json").write_bytes(b"half")
    assert (classes / "current").read_text() == "v1\n"  # readers still see the whole v1 set
    write_per_class(signed_manifest(scenario(), key, version=2), key, classes)
    assert _names(classes) == [MARKER, "current", "v1", "v2"]


def test_a_published_version_is_never_rewritten(tmp_path: Path) -> None:
    key = fixed_key()
    classes = tmp_path / "classes"
    write_per_class(signed_manifest(scenario(), key, version=1), key, classes)
    with pytest.raises(BuildError, match="already published"):
        write_per_class(signed_manifest(scenario(), key, version=1), key, classes)
    assert _names(classes) == [MARKER, "current", "v1"]


def test_an_entrys_evidence_is_the_evidence_models_json_dump() -> None:
    fleet = scenario()
    fleet.qualify("arm-new", emulated=True)  # isa, emulation and parity vary across classes
    decisions = list(fleet.decide().values())
    assert sum(d.evidence is not None and d.evidence.parity is not None for d in decisions) >= 1
    signed = build_manifest(
        fleet.project,
        decisions,
        release="r1",
        version=1,
        created=CLOCK,
        expires=CLOCK + timedelta(days=30),
        snapshot="s",
        artifacts=artifact_refs(fleet.project),
    )
    for d in decisions:
        want = None if d.evidence is None else d.evidence.model_dump(mode="json")
        assert signed["entries"][d.host_class]["evidence"] == want


def _loose_types(annotation: object, path: str, seen: set[type]) -> list[str]:
    """Where a float (or an untyped value) can sit in a value of ``annotation``."""
    import typing

    from pydantic import BaseModel

    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _loose_types(typing.get_args(annotation)[0], path, seen)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if annotation in seen:
            return []
        seen.add(annotation)
        return [
            found
            for name, field in annotation.model_fields.items()
            for found in _loose_types(field.annotation, f"{path}.{name}", seen)
        ]
    if origin is typing.Literal:
        return []
    if origin is not None:
        return [f for a in typing.get_args(annotation) for f in _loose_types(a, path, seen)]
    return [path] if annotation in (float, typing.Any, object) else []


def test_only_provider_settings_can_put_a_float_in_an_entry() -> None:
    # The builder encodes every other member of an entry without looking for floats
    # (encoded.plain_canonical): a float field added to one of these models must fail here,
    # not slip a float into signed content.
    from pydantic import BaseModel

    from schemas.manifest import ArtifactRef, ClassDecision
    from schemas.project import HostClass

    plain: dict[str, type[BaseModel]] = {
        **{n: ClassDecision for n in ("host_class", "decision", "evidence", "reasons")},
        **{n: ClassDecision for n in ("summary", "run_ids", "rollback_runtime")},
        **{n: HostClass for n in ("key", "runtime", "match")},
    }
    loose = [
        found
        for name, model in plain.items()
        for found in _loose_types(model.model_fields[name].annotation, name, set())
    ]
    loose += _loose_types(ArtifactRef, "artifact", set())
    assert loose == []
    # The walk finds what the provider settings may hold: it is not blind.
    provider = _loose_types(HostClass.model_fields["provider"].annotation, "provider", set())
    assert "provider.session_config" in provider
