"""``resolve-artifact`` under attack: hostile manifests, state files and arguments.

Each test is one attack in the style of python-tuf's client tests; the property tests at the
end mutate genuine documents and state at random. The invariants: no exception escapes, the
exit code is a documented one, an answer only ever comes from what the verified document says
for this class, the rollback floor never goes down, and the last-known-good is replaced only by
a document that verified and resolved for this host.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from manifest import envelope, hostruntime, hoststate, lookup
from manifest.errors import ForkError, MalformedError, ValidityError, VerificationError
from manifest.load import load_manifest
from manifest.perclass import write_per_class
from manifest.signing import public_raw, sign_document
from tests.manifest.factories import GOLDEN, fixed_key, scenario, signed_manifest
from tests.manifest.test_resolve import Host as BaseHost

PUB = GOLDEN / "test.pub"
NOW = datetime.now(UTC).replace(microsecond=0)
CPU = hostruntime.HostRuntime("onnxruntime", "1.32.0", frozenset({"CPUExecutionProvider"}), "test")
DOCUMENTED = {0, 2, 3, 4, 5, 6}
TRUSTED = public_raw(fixed_key().public_key())


def signed_doc(version: int = 2, **kw: Any) -> dict[str, Any]:
    kw.setdefault("created", NOW - timedelta(hours=1))
    return signed_manifest(scenario(), fixed_key(), version=version, **kw)


def resign(signed: dict[str, Any]) -> bytes:
    return envelope.encode_canonical(sign_document(signed, fixed_key()))


def canonical(version: int = 2, **kw: Any) -> bytes:
    return envelope.encode_canonical(signed_doc(version, **kw))


GOOD = canonical()
GOOD_V3 = canonical(3)


class Host(BaseHost):
    """`test_resolve.Host`, also taking the manifest's bytes, and reading the state back."""

    def run(self, manifest: Path | bytes, *args: str, state: bool = True) -> tuple[int, str, str]:
        if isinstance(manifest, bytes):
            path = self.tmp / "m.json"
            path.write_bytes(manifest)
            manifest = path
        return super().run(manifest, *args, state=state)

    def lkg(self) -> bytes | None:  # type: ignore[override]  # None: nothing kept
        path = self.line / hoststate.LKG_FILE
        return path.read_bytes() if path.exists() else None

    def record(self) -> hoststate.Accepted:
        return hoststate.parse_state((self.line / hoststate.STATE_FILE).read_bytes())


@pytest.fixture
def host(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Host:
    h = Host(tmp_path, capsys)
    assert h.run(GOOD, "--host-class", "x86-vnni")[0] == 0  # trusts version 2
    return h


def served_from_lkg(result: tuple[int, str, str]) -> bool:
    code, out, err = result
    return (
        code == 0
        and out.strip() == "https://models.example/rec-int8.onnx"
        and ("using the last-known-good manifest, version 2" in err)
    )


# -- crashes become refusals ----------------------------------------------------------------


@pytest.mark.parametrize(
    "attack",
    [
        b'{"signatures":' + b"[" * 100_000 + b"]" * 100_000 + b',"signed":{}}',
        b"[" * 100_000 + b"]" * 100_000,
        b'{"signatures":[],"signed":' + b'{"a":' * 100_000 + b"1" + b"}" * 100_000 + b"}",
        json.dumps(json.loads(GOOD), indent=1).replace('"2025.06"', '"\\ud800"').encode(),
        GOOD.replace(b'"release":"2025.06"', b'"release":"\\ud800"'),
        GOOD.replace(b'"version":2', b'"version":1e400'),
        GOOD.replace(b'"version":2', b'"version":Infinity'),
        GOOD.replace(b'"version":2', b'"version":' + b"9" * 5000),
        b"\xff\xfe" + GOOD,
        GOOD[: len(GOOD) // 2],
        b"",
        b"\x00" * 4096,
        b'{"signatures":[{"keyid":"' + b"a" * 64 + b'","sig":"zz"}],"signed":{}}',
    ],
    ids=[
        "signatures-nested-100k",
        "array-nested-100k",
        "signed-nested-100k",
        "reindented-lone-surrogate",
        "canonical-lone-surrogate",
        "version-1e400",
        "version-infinity",
        "version-5000-digits",
        "bom",
        "truncated",
        "empty",
        "nul-bytes",
        "non-hex-signature",
    ],
)
def test_hostile_manifest_is_refused_and_the_last_known_good_served(
    host: Host, attack: bytes
) -> None:
    assert served_from_lkg(host.run(attack, "--host-class", "x86-vnni"))
    assert host.lkg() == GOOD and host.record().version == 2
    code, out, err = host.run(attack, "--host-class", "x86-vnni", "--no-state")
    assert (code, out) == (lookup.EXIT_VERIFY, "")
    assert "Traceback" not in err and "failing closed" in err


def test_many_bogus_signatures_are_refused_before_any_is_checked(host: Host) -> None:
    sigs = [{"keyid": f"{i:064x}", "sig": "00" * 64} for i in range(200_000)]
    doc = json.loads(GOOD)
    attack = envelope.encode_envelope(sigs, envelope.encode_canonical(doc["signed"]))
    code, _, err = host.run(attack, "--host-class", "x86-vnni")
    assert code == 0 and "16 signatures" in err


@pytest.mark.parametrize("keep", [14, 100, len(GOOD) // 2, GOOD.rindex(b'"')])
def test_truncated_manifest_is_refused_as_truncated(keep: int) -> None:
    # A copy or download cut off: after the signatures' key, inside them, halfway, in the last
    # string (the hosts' most common broken file, named as such rather than as an edited one).
    cut = GOOD[:keep].rstrip(b"}")
    with pytest.raises(MalformedError, match=rf"truncated: its {len(cut):,} bytes end before"):
        envelope.check_envelope(cut, TRUSTED)
    with pytest.raises(MalformedError, match="truncated"):
        load_manifest(cut)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=len(GOOD) - 1))
def test_no_prefix_of_a_genuine_manifest_is_accepted(keep: int) -> None:
    with pytest.raises(VerificationError):  # malformed, truncated, or its signature fails
        envelope.check_envelope(GOOD[:keep], TRUSTED)


def test_re_indented_genuine_manifest_is_refused_unparsed() -> None:
    reindented = json.dumps(json.loads(GOOD), indent=2).encode()
    with pytest.raises(MalformedError, match="canonical layout"):
        envelope.check_envelope(reindented, TRUSTED)
    with pytest.raises(MalformedError, match="canonical layout"):
        load_manifest(reindented)


@pytest.mark.parametrize(
    "state",
    [
        b'{"version":Infinity}',
        b'{"version":1e400}',
        b'{"version":-1}',
        b'{"version":"7"}',
        b'{"version":true}',
        b'{"version":' + b"9" * 30 + b"}",
        b"[" * 50_000,
        b"\xff" * 100,
        b"",
        b'{"version":2}' + b" " * 10_000,
    ],
)
def test_hostile_state_file_never_crashes_and_the_floor_holds(host: Host, state: bytes) -> None:
    (host.line / hoststate.STATE_FILE).write_bytes(state)
    older = canonical(1)
    code, _, err = host.run(older, "--host-class", "x86-vnni")
    assert code == 0 and "lower than version 2" in err  # the floor came from the last-known-good
    assert host.record().version == 2  # and the state was repaired to it


# -- the rollback floor ---------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["delete", "truncate", "replace-lower"])
def test_damaging_state_json_does_not_let_an_older_manifest_in(host: Host, damage: str) -> None:
    path = host.line / hoststate.STATE_FILE
    if damage == "delete":
        path.unlink()
    elif damage == "truncate":
        path.write_bytes(path.read_bytes()[:5])
    else:
        path.write_bytes(b'{"version":1}')
    code, _, err = host.run(canonical(1), "--host-class", "x86-vnni")
    assert code == 0 and "version 1 is lower than version 2" in err
    assert host.lkg() == GOOD


def test_deleting_the_last_known_good_does_not_lower_the_floor(host: Host) -> None:
    (host.line / hoststate.LKG_FILE).unlink()
    code, _, err = host.run(canonical(1), "--host-class", "x86-vnni")
    assert code == lookup.EXIT_VERIFY and "version 1 is lower than version 2" in err
    assert host.lkg() is None and host.record().version == 2


def test_a_forged_last_known_good_cannot_raise_the_floor(host: Host) -> None:
    forged = json.loads(GOOD)
    forged["signed"]["version"] = 999
    (host.line / hoststate.LKG_FILE).write_bytes(envelope.encode_canonical(forged))
    code, _, err = host.run(GOOD_V3, "--host-class", "x86-vnni")
    assert code == 0 and "last-known-good manifest is unusable" in err
    assert host.lkg() == GOOD_V3 and host.record().version == 3


def test_same_version_with_other_bytes_is_refused_as_a_fork(host: Host) -> None:
    doc = json.loads(GOOD)
    doc["signed"]["release"] = "2025.06-fork"
    fork = resign(doc["signed"])
    result = host.run(fork, "--host-class", "x86-vnni")
    assert served_from_lkg(result) and "two releases under one version" in result[2]
    outcome = lookup.resolve(
        fork,
        public_raw=TRUSTED,
        now=envelope.format_time(NOW),
        host=CPU,
        host_class="x86-vnni",
        last_known_good=GOOD,
    )
    assert outcome.accepted is None
    assert any(ForkError.code in m for m in outcome.messages) or any(
        "two releases under one version" in m for m in outcome.messages
    )


def test_the_same_document_again_is_not_a_fork_and_writes_nothing(host: Host) -> None:
    before = (host.line / hoststate.STATE_FILE).stat().st_mtime_ns
    assert host.run(GOOD, "--host-class", "x86-vnni")[0] == 0
    assert (host.line / hoststate.STATE_FILE).stat().st_mtime_ns == before


def test_an_unchanged_start_hashes_nothing(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    # The state names the accepted document by its signature too: the same signature by the
    # same key is the same signed bytes, so their digest is the one the state keeps.
    record = host.record()
    assert record.signature is not None and record.digest is not None
    hash_small = envelope.sha256_hex

    def no_document_hashing(data: bytes | memoryview) -> str:
        # the key id (32 bytes) and the manifest's path (which line it was read as) only
        assert bytes(data[:1]) != b"{", "a start with nothing new hashed the document"
        return hash_small(data)

    monkeypatch.setattr(envelope, "sha256_hex", no_document_hashing)
    before = (host.line / hoststate.STATE_FILE).stat().st_mtime_ns
    assert host.run(GOOD, "--host-class", "x86-vnni")[0] == 0
    assert (host.line / hoststate.STATE_FILE).stat().st_mtime_ns == before
    assert host.record() == record


def test_a_state_kept_before_signatures_gains_one_once(host: Host) -> None:
    record = host.record()
    older = record._replace(signature=None)
    (host.line / hoststate.STATE_FILE).write_bytes(hoststate.encode_state(older))
    assert host.run(GOOD, "--host-class", "x86-vnni")[0] == 0
    assert host.record() == record  # the digest computed again, the signature added
    before = (host.line / hoststate.STATE_FILE).stat().st_mtime_ns
    assert host.run(GOOD, "--host-class", "x86-vnni")[0] == 0
    assert (host.line / hoststate.STATE_FILE).stat().st_mtime_ns == before


def test_a_state_naming_another_signature_is_not_taken_for_this_document(host: Host) -> None:
    doc = json.loads(GOOD)
    doc["signed"]["release"] = "2025.06-fork"
    fork = resign(doc["signed"])  # version 2 again, other bytes, its own signature
    record = host.record()
    assert "two releases under one version" in host.run(fork, "--host-class", "x86-vnni")[2]
    assert host.record() == record and host.lkg() == GOOD


def test_a_last_known_good_of_the_same_size_is_compared_not_assumed(host: Host) -> None:
    damaged = GOOD.replace(b'"release":"2025.06"', b'"release":"2025.07"')
    assert len(damaged) == len(GOOD) and damaged != GOOD
    (host.line / hoststate.LKG_FILE).write_bytes(damaged)
    code, _, err = host.run(GOOD, "--host-class", "x86-vnni")
    assert code == 0 and "last-known-good manifest is unusable" in err
    assert host.lkg() == GOOD


def test_a_bounded_read_gives_the_bytes_and_an_equal_copy_itself(tmp_path: Path) -> None:
    path = tmp_path / "f"
    for size in (0, 1, 70_000, 200_000):
        data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
        path.write_bytes(data)
        assert hoststate.read_bounded(str(path), 10**6) == data
        assert hoststate.read_bounded(str(path), 100) == data[:101]
        same = bytes(bytearray(data))
        assert hoststate.read_bounded(str(path), 10**6, same_as=same) is same
        if size:
            other = data[:-1] + b"?"
            assert hoststate.read_bounded(str(path), 10**6, same_as=other) == data


# -- what becomes the last-known-good ------------------------------------------------------


def test_a_manifest_matching_none_of_this_hosts_classes_is_not_kept() -> None:
    from manifest.hostmatch import HostFacts

    riscv = HostFacts("riscv64", None, frozenset(), 4, 8192)
    outcome = lookup.resolve(
        GOOD_V3,
        public_raw=TRUSTED,
        now=envelope.format_time(NOW),
        host=CPU,
        facts=lambda: riscv,
        last_known_good=GOOD,
    )
    assert outcome.code == lookup.EXIT_UNKNOWN
    assert (outcome.accepted, outcome.record) == (None, None)
    assert outcome.floor is not None and outcome.floor.version == 2


def test_an_unknown_class_does_not_replace_the_last_known_good(host: Host) -> None:
    code, _, err = host.run(GOOD_V3, "--host-class", "nope")
    assert code == lookup.EXIT_UNKNOWN and "not in manifest version 3" in err
    assert host.lkg() == GOOD and host.record().version == 2


# -- freshness and what hosts may fetch -----------------------------------------------------


def test_an_impossible_expiry_is_refused() -> None:
    doc = signed_doc()
    doc["signed"]["expires"] = "9999-99-99T99:99:99Z"
    with pytest.raises(MalformedError, match="not a valid time"):
        envelope.check_signed(doc["signed"], now=envelope.format_time(NOW))
    for bad in ("2026-01-01T00:00:00Z\n", "٢٠٢٦-01-01T00:00:00Z", 20260101):
        doc["signed"]["expires"] = bad
        with pytest.raises(MalformedError):
            envelope.check_signed(doc["signed"], now=envelope.format_time(NOW))


def test_a_manifest_valid_for_decades_is_refused(host: Host) -> None:
    far = canonical(3, expires=NOW + timedelta(days=3650))
    code, _, err = host.run(far, "--host-class", "x86-vnni")
    assert code == 0 and "more than the 400 days this host accepts" in err
    with pytest.raises(ValidityError):
        envelope.check_signed(
            json.loads(far)["signed"], now=envelope.format_time(NOW), max_validity_s=400 * 86400
        )


@pytest.mark.parametrize(
    ("uri", "allowed"),
    [
        ("javascript:alert(1)", False),
        ("http://models.example/x.onnx", False),
        ("/plain/path.onnx", False),
        ("https://models.example/x y.onnx", False),
        ("https://models.example/x\n.onnx", False),
        ("s3://bucket/x.onnx", True),
        ("file:///srv/models/x.onnx", True),
    ],
)
def test_artifact_uris_must_use_an_allowed_scheme(host: Host, uri: str, allowed: bool) -> None:
    doc = signed_doc(3)
    doc["signed"]["entries"]["x86-vnni"]["artifact"]["uri"] = uri
    code, out, err = host.run(resign(doc["signed"]), "--host-class", "x86-vnni")
    if allowed:
        assert (code, out.strip()) == (0, uri)
    else:
        assert served_from_lkg((code, out, err)) and "uri" in err
        assert "\n.onnx" not in err  # a control character never reaches the terminal raw


def test_http_can_be_allowed_explicitly(host: Host) -> None:
    doc = signed_doc(3)
    doc["signed"]["entries"]["x86-vnni"]["artifact"]["uri"] = "http://lab/x.onnx"
    raw = resign(doc["signed"])
    code, out, _ = host.run(raw, "--host-class", "x86-vnni", "--uri-schemes", "https,http")
    assert (code, out.strip()) == (0, "http://lab/x.onnx")


# -- per-class sets -------------------------------------------------------------------------


def test_a_published_per_class_set_resolves_through_its_pointer(host: Host) -> None:
    directory = host.tmp / "classes"
    write_per_class(signed_doc(3), fixed_key(), directory)
    code, out, _ = host.run(directory, "--host-class", "x86-vnni", "--json")
    assert (code, json.loads(out)["manifest_version"]) == (0, 3)
    (directory / envelope.CURRENT_POINTER).write_text("../../etc\n")
    code, _, err = host.run(directory, "--host-class", "x86-vnni")
    assert code == 0 and "not v<version>" in err and "last-known-good" in err


# -- arguments ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["--max-bytes", "-5"],
        ["--max-bytes", "lots"],
        ["--grace-days", "nan"],
        ["--grace-days", "-1"],
        ["--max-validity-days", "inf"],
        ["--uri-schemes", ","],
        ["--bogus"],
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(host: Host, args: list[str]) -> None:
    code, out, err = host.run(GOOD, "--host-class", "x86-vnni", *args)
    assert (code, out) == (lookup.EXIT_USAGE, "")
    assert err.count("\n") == 1 and err.startswith("resolve-artifact: error: ")


def test_a_fifo_or_device_is_refused_without_blocking(host: Host) -> None:
    import os

    fifo = host.tmp / "pipe"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero")):
        # --model: a path this host never read the line from says no line of its own
        result = host.run(path, "--host-class", "x86-vnni", "--model", "ocr-rec")
        assert served_from_lkg(result) and "not a regular file" in result[2]


# -- one class read from a verified manifest without parsing the others ---------------------

# Names a lookup by bytes could confuse: prefixes of each other, quotes, backslashes, escapes,
# control and non-ASCII characters, brackets, JSON structure, the empty name.
AWKWARD = [
    "x86",
    "x86-vnni-2",
    'zü"rich/1\n',
    "ends\\",
    '\\"',
    'q"',
    "\\\\",
    "ctl\x01\x1f\x7f",
    "\u2028\u2029",
    "😀",
    '"entries":{',
    "entries",
    "[br]{ace}",
    ":,",
    "",
]


def one_class(full: dict[str, Any], name: str) -> dict[str, Any] | None:
    """What `envelope.parse_signed_entry` may answer besides ``full`` itself."""
    entries = full.get("entries")
    if not isinstance(entries, dict) or name not in entries:
        return None
    return {**full, "entries": {name: entries[name]}}


def expected_one(full: dict[str, Any], name: str) -> dict[str, Any]:
    """What `envelope.parse_signed_entry` answers for ``name``: its entry alone, else all."""
    return one_class(full, name) or full


def awkward_manifest() -> dict[str, Any]:
    """The scenario with an entry for every awkward name, each name also used as a key nested
    in other entries (provider options), as a string value elsewhere, and in the policy."""
    signed: dict[str, Any] = signed_doc(3)["signed"]
    entries = signed["entries"]
    template = entries["x86-vnni"]
    for name in AWKWARD:
        entries[name] = {**template, "host_class": name, "summary": f"{name} qualified"}
    entries["arm-old"]["provider"] = {
        **entries["arm-old"]["provider"],
        "provider_options": {name: {"x86-vnni": name} for name in [*AWKWARD, "x86-vnni"]},
    }
    entries["gpu-a10"]["reasons"] = [{"code": n, "message": f'"{n}":{{'} for n in AWKWARD]
    return signed


def test_one_class_is_read_exactly_as_the_full_parse_reads_it() -> None:
    signed = awkward_manifest()
    data = envelope.encode_canonical(signed)
    full = envelope.parse_signed(data)
    for name in [*full["entries"], "nope", "x86-vnn", "x86-vnni-", "arch", "provider_options"]:
        assert envelope.parse_signed_entry(data, name) == expected_one(full, name), name


def test_resolving_every_awkward_class_gives_the_full_parse_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    raw = resign(awkward_manifest())
    names = [*json.loads(raw)["signed"]["entries"], "nope"]

    def outcomes() -> list[lookup.Outcome]:
        return [
            lookup.resolve(
                raw,
                public_raw=TRUSTED,
                now=envelope.format_time(NOW),
                host=CPU,
                host_class=name,
                last_known_good=GOOD,
            )
            for name in names
        ]

    fast = outcomes()

    def whole(data: bytes, name: str, source: str = "m", **span: int) -> dict[str, Any]:
        return envelope.parse_signed(data[span.get("start", 0) : span.get("end")], source)

    monkeypatch.setattr(envelope, "parse_signed_entry", whole)  # the full parse only
    assert fast == outcomes()
    assert [o.code for o in fast].count(0) >= len(AWKWARD)


@pytest.mark.parametrize(
    "text",
    [
        '{"entries":{"a":{"v":1},"a":{"v":2}},"version":1}',  # duplicate keys: the last wins
        '{"entries":{"a":{"v":1}},"entries":{"a":{"v":2}}}',
        '{"entries":{"a":1,"b":{"a":{"v":2}}},"version":1}',
        '{"entries":{"\\u0061":{"v":1},"a":{"v":2}},"v":1}',  # a key spelled two ways
        '{"entries":{"a":{"v":1},"\\u0061":{"v":2}},"v":1}',
        '{"entries":{"a\\/":{"v":1},"a/":{"v":2}},"v":1}',
        '{"entries": {"a": {"v": 1}}, "version": 1}',
        '{"entries":{"a":{"v":"}"},"b":{"v":"{"}},"z":1}',
        '{"entries":{"x":{"s":"\\"a\\":"},"a":{"v":2}},"z":1}',
        '{"entries":{"x":{"a":{"v":1}}},"policy":{"a":{"v":3}}}',
        '{"entries":{},"tail":{"a":{"v":3}}}',
        '{"a":{"entries":{"a":{"v":1}}},"entries":{"a":{"v":2}}}',
        '{"h":"\\"entries\\":{","entries":{"a":{"v":2}}}',
        '{"entries":{"a":{"v":[1,{"a":2}]},"b":[{"a":3}]},"t":[]}',
        '{"entries":{"a":{"v":1}},"t":"\\\\"}',
        '{"entries":{"a":{"v":"\\\\"},"b":"\\\\\\""},"t":0}',
        '{"entries":{"a":{"v":NaN}}}',
        '{"entries":{"a":{"v":1}},"x":1e400}',
        '{"entries":{"a":{"v":1}}',
        '{"entries":{"a":{"v":1}}}}',
    ],
)
def test_signed_bytes_written_otherwise_are_read_as_the_full_parse_reads_them(text: str) -> None:
    data = text.encode()
    try:
        full = envelope.parse_signed(data)
    except MalformedError:
        with pytest.raises(MalformedError):
            envelope.parse_signed_entry(data, "a")
        return
    assert envelope.parse_signed_entry(data, "a") == expected_one(full, "a")


def test_the_signed_part_is_read_where_it_lies_in_the_file() -> None:
    raw = GOOD_V3 + b"\n"
    (
        _,
        start,
        end,
    ) = envelope._split_span(raw, "m")
    signed = envelope.parse_signed(raw[start:end])
    got = envelope.parse_signed_entry(raw, "gpu-a10", start=start, end=end)
    assert got == one_class(signed, "gpu-a10")
    assert envelope.split_envelope(raw)[1] == raw[start:end]


json_text = st.text(
    st.characters(exclude_categories=["Cs"]) | st.sampled_from('"\\{}[]:,\x00\n'), max_size=6
)
json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | json_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(json_text, inner, max_size=3),
    max_leaves=12,
)
NAMES = ["a", "a\\", 'a"', "é", "entries", "", "[", "{}"]
class_name = st.sampled_from(NAMES) | json_text


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    entries=st.dictionaries(
        class_name,
        st.dictionaries(class_name, json_value, max_size=3) | json_value,
        max_size=5,
    ),
    around=st.dictionaries(
        st.sampled_from(["created", "expires", "policy", "release", "type", "version", "zz"]),
        json_value | st.dictionaries(class_name, json_value, max_size=2),
        max_size=4,
    ),
    asked=class_name,
)
def test_one_class_equals_the_full_parse_for_any_canonical_document(
    entries: dict[str, Any], around: dict[str, Any], asked: str
) -> None:
    signed = {**around, "entries": entries}
    data = envelope.encode_canonical(signed)
    full = envelope.parse_signed(data)
    for name in {asked, *entries, *NAMES}:
        assert envelope.parse_signed_entry(data, name) == expected_one(full, name)


# -- properties over mutated documents and state --------------------------------------------


def truth(raw: bytes, cls: str) -> dict[str, Any] | None:
    """What the full parse of a verified document says for ``cls`` (None: not verifiable)."""
    try:
        signed = envelope.check_envelope(raw, TRUSTED)
    except VerificationError:
        return None
    entry = signed.get("entries", {}).get(cls)
    return entry if isinstance(entry, dict) else None


mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, len(GOOD_V3) - 1), st.integers(0, 255)),
    st.tuples(st.just("cut"), st.integers(0, len(GOOD_V3)), st.just(0)),
    st.tuples(
        st.just("insert"),
        st.integers(0, len(GOOD_V3)),
        st.sampled_from(
            [b"[", b"{", b'"\\ud800"', b"1e400", b"\n", b" ", b'"x86-vnni":{"artifact":', b"\x00"]
        ),
    ),
)


def mutate(raw: bytes, how: tuple[str, int, Any]) -> bytes:
    kind, at, what = how
    if kind == "flip":
        return raw[:at] + bytes([what]) + raw[at + 1 :]
    if kind == "cut":
        return raw[:at]
    return raw[:at] + what + raw[at:]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    changes=st.lists(mutation, min_size=1, max_size=3),
    cls=st.sampled_from(["x86-vnni", "gpu-a10", "arm-new", "arm-old", "nope"]),
    floor=st.integers(0, 4),
)
def test_mutated_manifests_never_crash_never_lie_and_never_lower_the_floor(
    changes: list[tuple[str, int, Any]], cls: str, floor: int
) -> None:
    raw = GOOD_V3
    for how in changes:
        raw = mutate(raw, how)
    outcome = lookup.resolve(
        raw,
        public_raw=TRUSTED,
        now=envelope.format_time(NOW),
        host=CPU,
        host_class=cls,
        accepted_version=floor,
        last_known_good=GOOD,
    )
    assert outcome.code in DOCUMENTED
    if outcome.floor is not None:
        assert outcome.floor.version >= max(floor, 2)
    if outcome.answer is None:
        return
    said = truth(raw if outcome.answer["source"] == "manifest" else GOOD, cls)
    assert said is not None
    assert outcome.answer["decision"] == said["decision"]
    served = outcome.answer["artifact"]
    if served is not None:
        options = [said.get("artifact"), said.get("rollback")]
        assert served in [{"digest": o["digest"], "uri": o["uri"]} for o in options if o]
    if outcome.accepted is not None:
        assert outcome.accepted == raw and truth(raw, cls) is not None


@settings(max_examples=200, deadline=None)
@given(
    state=st.one_of(
        st.binary(max_size=200),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(
                    st.sampled_from(["version", "type", "host_class", "signed_sha256", "format"]),
                    inner,
                    max_size=5,
                )
            ),
            max_leaves=10,
        ).map(lambda v: json.dumps(v, allow_nan=True).encode()),
    )
)
def test_any_state_bytes_parse_or_raise_value_error(state: bytes) -> None:
    try:
        record = hoststate.parse_state(state)
    except ValueError:
        return
    assert 1 <= record.version <= envelope.MAX_VERSION
