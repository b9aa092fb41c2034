"""Entries held as their canonical text: read as JSON objects, encoded without encoding again,
and the builder's text canonical and read back as what was decided, whatever the strings hold."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from manifest import envelope
from manifest.build import build_manifest
from manifest.encoded import EncodedEntries, EntryText, holds_float, plain_canonical
from manifest.errors import CanonicalError, MalformedError
from manifest.signing import check_publishable, sign_encoded
from schemas.cell import Reason
from schemas.manifest import (
    ClassDecision,
    Evidence,
    ManifestEntry,
    OutputParitySummary,
    ParitySummary,
)
from schemas.project import Project
from tests.manifest.factories import CLOCK, artifact_refs, fixed_key, scenario


def _build(project: Project, decisions: list[ClassDecision], encoded: bool) -> dict[str, Any]:
    return build_manifest(
        project,
        decisions,
        release="r",
        version=1,
        created=CLOCK,
        expires=CLOCK + timedelta(days=30),
        snapshot="s",
        artifacts=artifact_refs(project),
        encoded=encoded,
    )


def _built(encoded: bool) -> dict[str, Any]:
    fleet = scenario()
    fleet.qualify("arm-new", emulated=True)
    return _build(fleet.project, list(fleet.decide().values()), encoded)


def test_encoded_entries_read_as_the_objects_they_encode() -> None:
    encoded, plain = _built(True), _built(False)
    entries = encoded["entries"]
    assert isinstance(entries, EncodedEntries)
    assert list(entries) == list(plain["entries"])  # the project's order
    assert dict(entries) == plain["entries"]
    assert envelope.encode_canonical(encoded) == envelope.encode_canonical(plain)


def test_a_change_to_an_entry_read_from_text_is_what_gets_encoded() -> None:
    encoded, plain = _built(True), _built(False)
    name = next(iter(encoded["entries"]))
    encoded["entries"][name]["summary"] = "changed after building"
    plain["entries"][name]["summary"] = "changed after building"
    assert envelope.encode_canonical(encoded) == envelope.encode_canonical(plain)
    # set, replaced and removed entries too
    encoded["entries"]["zz-new"] = {"host_class": "zz-new", "note": '\u00e9\n"q"'}
    plain["entries"]["zz-new"] = {"host_class": "zz-new", "note": '\u00e9\n"q"'}
    del encoded["entries"][name], plain["entries"][name]
    assert envelope.encode_canonical(encoded) == envelope.encode_canonical(plain)
    assert name not in encoded["entries"] and len(encoded["entries"]) == len(plain["entries"])


def test_a_float_set_into_encoded_entries_is_refused_by_its_path() -> None:
    encoded = _built(True)
    name = next(iter(encoded["entries"]))
    encoded["entries"][name]["evidence"] = {"p99_us": 41.5}
    with pytest.raises(CanonicalError, match=rf"\$\.entries\.{name}\.evidence\.p99_us: 41.5"):
        envelope.encode_canonical(encoded)
    encoded["entries"][name] = {1: "x"}
    with pytest.raises(CanonicalError, match="key 1 is not a string"):
        envelope.encode_canonical(encoded)


def test_a_non_string_class_name_is_refused() -> None:
    entries = EncodedEntries({"a": EntryText((b"{}", "a", "hold"))})
    entries[2] = {}  # type: ignore[index]
    with pytest.raises(CanonicalError, match=r"\$\.entries: key 2 is not a string"):
        envelope.encode_canonical({"entries": entries})


def test_publishing_checks_every_entry_held_as_text_without_parsing_it() -> None:
    key = fixed_key()
    signed = _built(True)
    entries = signed["entries"]
    check_publishable(sign_encoded(signed, key)[1], signed, key, now=CLOCK)
    assert all(type(item) is EntryText for item in entries._items.values())  # none parsed
    name = next(iter(entries))
    entries._items[name] = EntryText((entries._items[name].data, name, "maybe"))
    with pytest.raises(MalformedError, match=f"signed.entries.{name}: not the entry"):
        check_publishable(sign_encoded(signed, key)[1], signed, key, now=CLOCK)
    entries[name] = {"host_class": "someone-else", "decision": "hold"}
    with pytest.raises(MalformedError, match=f"signed.entries.{name}: not the entry"):
        check_publishable(sign_encoded(signed, key)[1], signed, key, now=CLOCK)


# Any text a reason, a summary or a cell's names may carry: quotes, backslashes, every control
# character, non-ASCII, line and paragraph separators (JSON allows them raw; so does json.dumps).
hostile = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",))
    | st.sampled_from('"\\\b\f\n\r\t\x00\x1f\x7f\u2028\u2029'),
    max_size=40,
)
maybe_int = st.none() | st.integers(min_value=-(2**70), max_value=2**70)


@st.composite
def evidence(draw: st.DrawFn) -> Evidence:
    outputs = draw(
        st.dictionaries(
            hostile,
            st.builds(
                lambda passed, a, b, c: OutputParitySummary.model_validate(
                    {"passed": passed, "max_abs": a, "cosine_min": b, "top1_agreement": c}
                ),
                st.booleans(),
                st.none() | hostile,
                st.none() | hostile,
                st.none() | hostile,
            ),
            max_size=4,
        )
    )
    parity = draw(
        st.none()
        | st.builds(
            lambda passed, samples: ParitySummary.model_validate(
                {"passed": passed, "samples": samples, "outputs": outputs}
            ),
            st.booleans(),
            st.integers(min_value=0, max_value=2**40),
        )
    )
    return Evidence.model_validate(
        {
            "run_id": draw(hostile),
            "artifact_digest": "sha256:" + "ab" * 32,
            "artifact_name": draw(hostile),
            "role": draw(st.sampled_from(("baseline", "candidate"))),
            "verdict": draw(st.sampled_from(("pass", "fail", "insufficient", "error"))),
            "measured_at": "2025-06-01T10:00:00Z",
            "emulated": draw(st.booleans()),
            "isa_mismatch": draw(st.lists(hostile, max_size=3)),
            "emulated_numerics": draw(
                st.none()
                | st.fixed_dictionaries({"cpu": hostile, "arch": hostile, "qemu": hostile})
            ),
            "p99_us": draw(maybe_int),
            "p99_upper_us": draw(maybe_int),
            "p99_budget_us": draw(st.integers(min_value=0, max_value=2**40)),
            "batch_size": draw(maybe_int),
            "concurrency": draw(maybe_int),
            "samples": draw(maybe_int),
            "fallback_nodes": draw(maybe_int),
            "peak_rss_kb": draw(maybe_int),
            "cold_init_us": draw(maybe_int),
            "parity": parity,
        }
    )


def _entry_bytes(signed: dict[str, Any], name: str) -> bytes:
    return b"".join(signed["entries"].encoded(name).canonical_parts())


@settings(max_examples=60, deadline=None)
@given(evidence())
def test_an_entry_with_any_evidence_reads_back_as_that_evidence(e: Evidence) -> None:
    fleet = scenario()
    decisions = [
        ClassDecision.model_validate({**dict(d), "evidence": e}) for d in fleet.decide().values()
    ]
    signed = _build(fleet.project, decisions, encoded=True)
    for d in decisions:
        data = _entry_bytes(signed, d.host_class)
        parsed = json.loads(data)
        assert envelope.encode_canonical(parsed) == data  # canonical as written
        entry = ManifestEntry.model_validate(parsed)  # what a reader of the manifest accepts
        assert entry.evidence == e
        assert (entry.host_class, entry.decision, entry.summary) == (
            d.host_class,
            d.decision,
            d.summary,
        )
        assert entry.reasons == list(d.reasons)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(hostile, hostile), min_size=1, max_size=4), hostile)
def test_an_entry_with_hostile_reasons_and_summary_reads_back_as_written(
    reasons: list[tuple[str, str]], summary: str
) -> None:
    fleet = scenario()
    decisions = []
    for d in fleet.decide().values():
        fields = dict(d.__dict__)
        # Codes outside the table, which validation refuses: the encoder carries any string.
        fields["reasons"] = [
            Reason.model_construct(code=f"x{code}", message=m) for code, m in reasons
        ]
        fields["summary"] = summary
        decisions.append(ClassDecision.model_validate(fields))
    signed = _build(fleet.project, decisions, encoded=True)
    for d in decisions:
        data = _entry_bytes(signed, d.host_class)
        parsed = json.loads(data)
        assert envelope.encode_canonical(parsed) == data
        assert parsed["reasons"] == [{"code": f"x{c}", "message": m} for c, m in reasons]
        assert parsed["summary"] == summary
        assert signed["entries"][d.host_class] == parsed


def test_encoded_values_splice_anywhere_as_their_plain_twins_encode() -> None:
    value = {
        "z": {},
        "a": envelope.RawJSON(b'{"x":1}'),
        "l": [1, {"k": envelope.RawJSON('"é"'.encode()), "e": []}, "é"],
        "n": None,
    }
    twin = {"z": {}, "a": {"x": 1}, "l": [1, {"k": "\u00e9", "e": []}, "é"], "n": None}
    assert envelope.encode_canonical(value) == envelope.encode_canonical(twin)
    assert envelope.encode_canonical({"e": EncodedEntries({})}) == b'{"e":{}}'


# What a model's JSON dump holds: dicts with string keys, lists, strings, integers of any size,
# booleans and nulls.
plain = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | hostile,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(hostile, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(plain)
def test_a_plain_value_encodes_without_the_walk_as_the_canonical_encoder_encodes_it(
    value: Any,
) -> None:
    assert plain_canonical(value) == envelope.encode_canonical(value)
    assert not holds_float(value)


@settings(max_examples=100, deadline=None)
@given(plain, st.floats(allow_nan=False), st.data())
def test_a_float_anywhere_in_a_dump_is_found(
    value: Any, number: float, data: st.DataObject
) -> None:
    # Put the float at a random place: the value itself, or inside a list or a dict of it.
    holder = value
    while isinstance(holder, list | dict) and holder and data.draw(st.booleans()):
        key = data.draw(
            st.sampled_from(sorted(holder) if isinstance(holder, dict) else range(len(holder)))
        )
        if not isinstance(holder[key], list | dict):
            break
        holder = holder[key]
    if isinstance(holder, list):
        holder.append(number)
    elif isinstance(holder, dict):
        holder["float"] = number
    else:
        value = [value, {"x": number}]
    assert holds_float(value)
