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

from manifest import envelope, resolve
from manifest.build import write_per_class
from manifest.errors import ForkError, MalformedError, ValidityError, VerificationError
from manifest.load import load_manifest
from manifest.signing import public_raw, sign_document
from tests.manifest.factories import GOLDEN, fixed_key, scenario, signed_manifest
from tests.manifest.test_resolve import Host as BaseHost

PUB = GOLDEN / "test.pub"
NOW = datetime.now(UTC).replace(microsecond=0)
CPU = resolve.HostRuntime("onnxruntime", "1.32.0", frozenset({"CPUExecutionProvider"}), "test")
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
        path = self.state / resolve.LKG_FILE
        return path.read_bytes() if path.exists() else None

    def record(self) -> resolve.Accepted:
        return resolve.parse_state((self.state / resolve.STATE_FILE).read_bytes())


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
    assert (code, out) == (resolve.EXIT_VERIFY, "")
    assert "Traceback" not in err and "failing closed" in err


def test_many_bogus_signatures_are_refused_before_any_is_checked(host: Host) -> None:
    sigs = [{"keyid": f"{i:064x}", "sig": "00" * 64} for i in range(200_000)]
    doc = json.loads(GOOD)
    attack = envelope.encode_envelope(sigs, envelope.encode_canonical(doc["signed"]))
    code, _, err = host.run(attack, "--host-class", "x86-vnni")
    assert code == 0 and "16 signatures" in err


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
    (host.state / resolve.STATE_FILE).write_bytes(state)
    older = canonical(1)
    code, _, err = host.run(older, "--host-class", "x86-vnni")
    assert code == 0 and "lower than version 2" in err  # the floor came from the last-known-good
    assert host.record().version == 2  # and the state was repaired to it


# -- the rollback floor ---------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["delete", "truncate", "replace-lower"])
def test_damaging_state_json_does_not_let_an_older_manifest_in(host: Host, damage: str) -> None:
    path = host.state / resolve.STATE_FILE
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
    (host.state / resolve.LKG_FILE).unlink()
    code, _, err = host.run(canonical(1), "--host-class", "x86-vnni")
    assert code == resolve.EXIT_VERIFY and "version 1 is lower than version 2" in err
    assert host.lkg() is None and host.record().version == 2


def test_a_forged_last_known_good_cannot_raise_the_floor(host: Host) -> None:
    forged = json.loads(GOOD)
    forged["signed"]["version"] = 999
    (host.state / resolve.LKG_FILE).write_bytes(envelope.encode_canonical(forged))
    code, _, err = host.run(GOOD_V3, "--host-class", "x86-vnni")
    assert code == 0 and "last-known-good manifest is unusable" in err
    assert host.lkg() == GOOD_V3 and host.record().version == 3


def test_same_version_with_other_bytes_is_refused_as_a_fork(host: Host) -> None:
    doc = json.loads(GOOD)
    doc["signed"]["release"] = "2025.06-fork"
    fork = resign(doc["signed"])
    result = host.run(fork, "--host-class", "x86-vnni")
    assert served_from_lkg(result) and "two releases under one version" in result[2]
    outcome = resolve.resolve(
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
    before = (host.state / resolve.STATE_FILE).stat().st_mtime_ns
    assert host.run(GOOD, "--host-class", "x86-vnni")[0] == 0
    assert (host.state / resolve.STATE_FILE).stat().st_mtime_ns == before


# -- what becomes the last-known-good ------------------------------------------------------


def test_a_manifest_matching_none_of_this_hosts_classes_is_not_kept() -> None:
    from manifest.hostmatch import HostFacts

    riscv = HostFacts("riscv64", None, frozenset(), 4, 8192)
    outcome = resolve.resolve(
        GOOD_V3,
        public_raw=TRUSTED,
        now=envelope.format_time(NOW),
        host=CPU,
        facts=lambda: riscv,
        last_known_good=GOOD,
    )
    assert outcome.code == resolve.EXIT_UNKNOWN
    assert (outcome.accepted, outcome.record) == (None, None)
    assert outcome.floor is not None and outcome.floor.version == 2


def test_an_unknown_class_does_not_replace_the_last_known_good(host: Host) -> None:
    code, _, err = host.run(GOOD_V3, "--host-class", "nope")
    assert code == resolve.EXIT_UNKNOWN and "not in manifest version 3" in err
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
    assert (code, out) == (resolve.EXIT_USAGE, "")
    assert err.count("\n") == 1 and err.startswith("resolve-artifact: error: ")


def test_a_fifo_or_device_is_refused_without_blocking(host: Host) -> None:
    import os

    fifo = host.tmp / "pipe"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero")):
        result = host.run(path, "--host-class", "x86-vnni")
        assert served_from_lkg(result) and "not a regular file" in result[2]


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
    outcome = resolve.resolve(
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
        record = resolve.parse_state(state)
    except ValueError:
        return
    assert 1 <= record.version <= envelope.MAX_VERSION
