"""``resolve-artifact`` on a host: exit codes, lookup, compatibility, last-known-good, and one test
per attack in the style of python-tuf's client tests (each refused, the last-known-good kept)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from manifest import envelope, hostruntime, hoststate, lookup, resolve
from manifest.build import per_class_documents
from manifest.errors import ExpiredError
from manifest.signing import public_raw, sign_document
from schemas.manifest import Manifest
from schemas.settings import qualified_settings
from tests.manifest.factories import (
    GOLDEN,
    Fleet,
    class_spec,
    digest_of,
    fixed_key,
    make_project,
    scenario,
    signed_manifest,
)

ROOT = Path(__file__).resolve().parents[2]
PUB = GOLDEN / "test.pub"
NOW = datetime.now(UTC).replace(microsecond=0)
LINE = hoststate.line_name("ocr-rec", envelope.key_id(public_raw(fixed_key().public_key())))
"""The scenario's model line under the test key: its folder in a state directory."""
HEAVY = ("pydantic", "duckdb", "pandas", "pyarrow", "onnxruntime", "jinja2", "click", "numpy")


def fresh(fleet: Fleet | None = None, *, version: int = 2, **kw: Any) -> dict[str, Any]:
    """A manifest of the scenario signed now, valid for 30 days."""
    kw.setdefault("created", NOW - timedelta(hours=1))
    return signed_manifest(fleet or scenario(), kw.pop("key", fixed_key()), version=version, **kw)


def dump(doc: dict[str, Any], path: Path) -> Path:
    path.write_bytes(envelope.encode_canonical(doc))
    return path


@dataclass
class Host:
    """One host: a state directory, the trusted key, and a way to run resolve-artifact."""

    tmp: Path
    capsys: pytest.CaptureFixture[str]

    @property
    def state(self) -> Path:
        return self.tmp / "state"

    @property
    def line(self) -> Path:
        """Where the state keeps the scenario's model line under the trusted key."""
        return self.state / LINE

    def run(self, manifest: Path, *args: str, state: bool = True) -> tuple[int, str, str]:
        argv = [
            "--manifest",
            str(manifest),
            "--pubkey",
            str(PUB),
            "--runtime",
            "onnxruntime==1.32.0",
            "--providers",
            "CPUExecutionProvider",
            *args,
        ]
        argv += ["--state-dir", str(self.state)] if state else ["--no-state"]
        code = resolve.main(argv)
        out = self.capsys.readouterr()
        return code, out.out, out.err

    def lkg(self) -> bytes:
        return (self.line / hoststate.LKG_FILE).read_bytes()

    def accepted_version(self) -> int:
        return int(json.loads((self.line / hoststate.STATE_FILE).read_bytes())["version"])


@pytest.fixture
def host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Host:
    for var in ("QUALIFY_PUBKEY", "QUALIFY_STATE_DIR", "QUALIFY_RUNTIME", "QUALIFY_PROVIDERS"):
        monkeypatch.delenv(var, raising=False)
    return Host(tmp_path, capsys)


@pytest.fixture
def trusted(host: Host) -> bytes:
    """A host that already accepted a good manifest (version 2) as its last-known-good."""
    path = dump(fresh(), host.tmp / "good.json")
    code, out, _ = host.run(path, "--host-class", "x86-vnni")
    assert (code, out.strip()) == (0, "https://models.example/rec-int8.onnx")
    return path.read_bytes()


# -- exit codes -------------------------------------------------------------------------------


def test_resolved_class_prints_its_artifact_uri(host: Host) -> None:
    path = dump(fresh(), host.tmp / "m.json")
    assert host.run(path, "--host-class", "x86-vnni")[:2] == (
        0,
        "https://models.example/rec-int8.onnx\n",
    )


def test_json_answer_has_the_documented_keys(host: Host) -> None:
    path = dump(fresh(), host.tmp / "m.json")
    code, out, _ = host.run(path, "--host-class", "x86-vnni", "--json")
    answer = json.loads(out)
    assert code == 0
    assert {"host_class", "decision", "artifact", "rollback", "manifest_version", "reasons"} <= set(
        answer
    )
    assert answer["artifact"] == {
        "digest": digest_of("rec-int8"),
        "uri": "https://models.example/rec-int8.onnx",
    }
    assert answer["rollback"]["digest"] == digest_of("rec-fp32")
    assert (answer["decision"], answer["manifest_version"], answer["source"]) == (
        "candidate",
        2,
        "manifest",
    )
    entry = fresh()["signed"]["entries"]["x86-vnni"]
    assert answer["settings"] == qualified_settings(entry["provider"])
    assert answer["settings"]["graph_optimization_level"] == entry["provider"].get(
        "graph_optimization_level", "all"
    )


def test_held_class_exits_3_and_prints_no_artifact(host: Host) -> None:
    path = dump(fresh(), host.tmp / "m.json")
    code, out, err = host.run(path, "--host-class", "arm-new")
    assert (code, out) == (lookup.EXIT_HOLD, "")
    assert "on hold" in err
    _, out, _ = host.run(path, "--host-class", "arm-new", "--json")
    assert json.loads(out)["settings"] is None


def test_unknown_class_exits_2(host: Host) -> None:
    path = dump(fresh(), host.tmp / "m.json")
    code, _, err = host.run(path, "--host-class", "sparc-t5")
    assert code == lookup.EXIT_UNKNOWN
    assert "'sparc-t5' is not in manifest version 2" in err and "did you mean" not in err
    code, _, err = host.run(path, "--host-class", "x86_vnni")  # a host's typo
    assert code == lookup.EXIT_UNKNOWN
    assert "did you mean 'x86-vnni'?); check --host-class" in err


def test_missing_trusted_key_is_a_usage_error(host: Host) -> None:
    path = dump(fresh(), host.tmp / "m.json")
    assert resolve.main(["--manifest", str(path), "--host-class", "x86-vnni"]) == 2
    assert "pass --pubkey" in host.capsys.readouterr().err


def test_unreadable_manifest_without_last_known_good_fails_closed(host: Host) -> None:
    code, out, err = host.run(host.tmp / "missing.json", "--host-class", "x86-vnni")
    assert (code, out) == (lookup.EXIT_VERIFY, "")
    assert "failing closed" in err


def test_host_whose_runtime_cannot_run_entry_or_rollback_exits_5(host: Host) -> None:
    path = dump(fresh(), host.tmp / "m.json")
    code, out, err = host.run(path, "--host-class", "gpu-a10")
    assert (code, out) == (lookup.EXIT_INCOMPATIBLE, "")
    assert "runtime package is onnxruntime, needs onnxruntime-gpu" in err
    assert "CUDAExecutionProvider is not available" in err


def test_host_on_the_previous_runtime_gets_the_rollback(host: Host) -> None:
    key = fixed_key()
    fleet = Fleet(make_project({"x86": class_spec(1, version="1.31.*")}))
    fleet.qualify("x86")
    first = Manifest.model_validate(fresh(fleet, version=1, key=key))
    fleet.project = make_project({"x86": class_spec(1, version="1.32.*")})
    fleet.qualify("x86", rollback_digest=digest_of("rec-int8"))
    second = fresh(fleet, version=2, key=key, previous=first)
    path = dump(second, host.tmp / "m.json")
    # A host still on 1.31 cannot take 1.32's entry, but its rollback (the baseline: never the
    # entry's own artifact) was approved under 1.31.
    code, out, err = (
        resolve.main(
            [
                "--manifest",
                str(path),
                "--pubkey",
                str(PUB),
                "--host-class",
                "x86",
                "--json",
                "--runtime",
                "onnxruntime==1.31.4",
                "--providers",
                "CPUExecutionProvider",
            ]
        ),
        *host.capsys.readouterr(),
    )
    answer = json.loads(out)
    assert (code, answer["served"]) == (0, "rollback")
    assert answer["artifact"]["digest"] == answer["rollback"]["digest"] == digest_of("rec-fp32")
    assert "onnxruntime version is 1.31.4, needs 1.32.*" in err
    assert {"runtime_incompatible", "served_rollback"} <= {r["code"] for r in answer["reasons"]}


# -- lookup -----------------------------------------------------------------------------------


def test_class_is_detected_with_the_match_rules(host: Host) -> None:
    fleet = Fleet(
        make_project(
            {
                "here": class_spec(1, match={"arch": platform.machine()}),
                "elsewhere": class_spec(2, match={"arch": "sparc64"}),
            }
        )
    )
    fleet.qualify("here")
    path = dump(fresh(fleet), host.tmp / "m.json")
    code, out, _ = host.run(path, "--json")
    assert (code, json.loads(out)["host_class"]) == (0, "here")


def test_host_matching_several_classes_must_name_one(host: Host) -> None:
    fleet = Fleet(
        make_project(
            {
                "a": class_spec(1, match={"arch": platform.machine()}),
                "b": class_spec(2, match={"min_cores": 1}),
            }
        )
    )
    path = dump(fresh(fleet), host.tmp / "m.json")
    code, _, err = host.run(path)
    assert code == lookup.EXIT_UNKNOWN
    assert "several classes (a, b)" in err


def test_per_class_document_is_looked_up_by_class_name(host: Host) -> None:
    directory = host.tmp / "classes"
    directory.mkdir()
    doc = fresh()
    for name, signed in per_class_documents(doc).items():
        dump(sign_document(signed, fixed_key()), directory / envelope.class_filename(name))
    code, out, _ = host.run(directory, "--host-class", "x86-vnni", "--json")
    assert (code, json.loads(out)["artifact"]["digest"]) == (0, digest_of("rec-int8"))
    assert host.run(directory)[0] == lookup.EXIT_USAGE  # a directory needs --host-class


def test_verify_file_accepts_the_artifact_whose_digest_matches(host: Host) -> None:
    artifact = host.tmp / "model.onnx"
    artifact.write_bytes(b"onnx bytes")
    fleet = scenario()
    doc = fresh(fleet)
    entry = doc["signed"]["entries"]["x86-vnni"]
    entry["artifact"]["digest"] = envelope_digest(artifact)
    path = dump(sign_document(doc["signed"], fixed_key()), host.tmp / "m.json")
    assert host.run(path, "--host-class", "x86-vnni", "--verify-file", str(artifact))[0] == 0


def envelope_digest(path: Path) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


# -- state ------------------------------------------------------------------------------------


def test_accepted_manifest_becomes_the_last_known_good(host: Host, trusted: bytes) -> None:
    assert host.lkg() == trusted
    assert host.accepted_version() == 2
    newer = dump(fresh(version=3), host.tmp / "newer.json")
    assert host.run(newer, "--host-class", "x86-vnni")[0] == 0
    assert (host.lkg(), host.accepted_version()) == (newer.read_bytes(), 3)


def test_expired_last_known_good_is_served_with_exit_6_within_its_grace(host: Host) -> None:
    doc = fresh(created=NOW - timedelta(days=2), expires=NOW + timedelta(seconds=2))
    raw = envelope.encode_canonical(doc)
    later = envelope.format_time(NOW + timedelta(days=1))
    outcome = lookup.resolve(
        b"garbage",
        public_raw=public_raw(fixed_key().public_key()),
        now=later,
        host=hostruntime.HostRuntime(
            "onnxruntime", "1.32.0", frozenset({"CPUExecutionProvider"}), "t"
        ),
        host_class="x86-vnni",
        accepted_version=2,
        last_known_good=raw,
    )
    assert outcome.code == lookup.EXIT_STALE and outcome.answer is not None
    assert outcome.answer["source"] == "last-known-good"
    assert outcome.answer["artifact"]["uri"] == "https://models.example/rec-int8.onnx"
    assert any("expired" in m and "grace" in m for m in outcome.messages)
    assert "stale_last_known_good" in {r["code"] for r in outcome.answer["reasons"]}


def test_expired_last_known_good_past_its_grace_fails_closed() -> None:
    doc = fresh(created=NOW - timedelta(days=20), expires=NOW - timedelta(days=8))
    outcome = lookup.resolve(
        b"garbage",
        public_raw=public_raw(fixed_key().public_key()),
        now=envelope.format_time(NOW),
        host=hostruntime.HostRuntime(
            "onnxruntime", "1.32.0", frozenset({"CPUExecutionProvider"}), "t"
        ),
        host_class="x86-vnni",
        last_known_good=envelope.encode_canonical(doc),
        grace_s=7 * 86400,
    )
    assert (outcome.code, outcome.answer) == (lookup.EXIT_VERIFY, None)
    assert any("longer ago than the 7-day grace" in m for m in outcome.messages)


def test_manifest_expiring_exactly_now_is_expired() -> None:
    doc = fresh()
    with pytest.raises(ExpiredError):
        envelope.check_signed(doc["signed"], now=doc["signed"]["expires"])


# -- attacks: each refused, the last-known-good kept -------------------------------------------


def assert_refused_and_lkg_kept(
    host: Host, trusted: bytes, attack: Path, why: str, *args: str
) -> None:
    code, out, err = host.run(attack, "--host-class", "x86-vnni", "--json", *args)
    assert code == 0, err
    assert json.loads(out)["source"] == "last-known-good"
    assert why in err
    assert "using the last-known-good manifest, version 2" in err
    assert host.lkg() == trusted
    assert host.accepted_version() == 2
    # And a host with no last-known-good fails closed.
    code, out, err = host.run(attack, "--host-class", "x86-vnni", *args, state=False)
    assert (code, out) == (lookup.EXIT_VERIFY, "")
    assert why in err


def test_attack_byte_changed_in_signed_part_is_refused(host: Host, trusted: bytes) -> None:
    raw = bytearray(trusted)
    at = raw.index(b'"release":"2025.06"') + len(b'"release":"2025.0')
    raw[at : at + 1] = b"7"
    attack = host.tmp / "good.json"
    attack.write_bytes(bytes(raw))
    assert_refused_and_lkg_kept(host, trusted, attack, "does not match the signed content")


def test_attack_reformatted_and_changed_document_is_refused(host: Host, trusted: bytes) -> None:
    doc = json.loads(trusted)
    doc["signed"]["entries"]["x86-vnni"]["artifact"]["uri"] = "https://evil.example/x.onnx"
    attack = host.tmp / "good.json"
    attack.write_text(json.dumps(doc, indent=2))  # not the canonical layout: refused unparsed
    assert_refused_and_lkg_kept(host, trusted, attack, "not in the canonical layout")


def test_attack_signature_by_an_unknown_key_is_refused(host: Host, trusted: bytes) -> None:
    attack = dump(fresh(version=3, key=Ed25519PrivateKey.generate()), host.tmp / "good.json")
    assert_refused_and_lkg_kept(host, trusted, attack, "no signature by the trusted key")


def test_attack_replayed_older_version_is_refused(host: Host, trusted: bytes) -> None:
    attack = dump(fresh(version=1), host.tmp / "good.json")
    code, _, err = host.run(attack, "--host-class", "x86-vnni")
    assert code == 0
    assert "version 1 is lower than version 2 this host already accepted" in err
    assert host.lkg() == trusted and host.accepted_version() == 2


def test_attack_expired_manifest_is_refused(host: Host, trusted: bytes) -> None:
    attack = dump(
        fresh(version=3, created=NOW - timedelta(days=60), expires=NOW - timedelta(days=30)),
        host.tmp / "good.json",
    )
    assert_refused_and_lkg_kept(host, trusted, attack, "expired at")


def test_attack_class_document_moved_to_another_name_is_refused(host: Host) -> None:
    directory = host.tmp / "classes"
    directory.mkdir()
    docs = {n: sign_document(s, fixed_key()) for n, s in per_class_documents(fresh()).items()}
    for name, doc in docs.items():
        dump(doc, directory / envelope.class_filename(name))
    assert host.run(directory, "--host-class", "x86-vnni")[0] == 0
    trusted = host.lkg()
    # gpu-a10's (valid, signed) document is put where x86-vnni's belongs.
    dump(docs["gpu-a10"], directory / "x86-vnni.json")
    assert_refused_and_lkg_kept(host, trusted, directory, "for class 'gpu-a10', not 'x86-vnni'")


def test_attack_oversized_file_is_refused(host: Host, trusted: bytes) -> None:
    attack = host.tmp / "good.json"
    attack.write_bytes(trusted + b" " * 4096)
    limit = str(len(trusted) + 1024)
    assert_refused_and_lkg_kept(host, trusted, attack, "-byte limit", "--max-bytes", limit)


def test_attack_artifact_whose_digest_does_not_match_is_refused(host: Host, trusted: bytes) -> None:
    artifact = host.tmp / "model.onnx"
    artifact.write_bytes(b"tampered weights")
    code, out, err = host.run(
        host.tmp / "good.json", "--host-class", "x86-vnni", "--verify-file", str(artifact)
    )
    assert (code, out) == (lookup.EXIT_VERIFY, "")
    assert "do not load it" in err
    assert host.lkg() == trusted


# -- runtime detection ------------------------------------------------------------------------


def test_runtime_is_read_from_the_installed_distribution(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "onnxruntime_gpu-1.31.2.dist-info").mkdir(parents=True)
    (site / "onnxruntime_extensions-0.9.dist-info").mkdir()
    capi = site / "onnxruntime" / "capi"
    capi.mkdir(parents=True)
    (capi / "libonnxruntime_providers_cuda.so").touch()
    (capi / "libonnxruntime_providers_shared.so").touch()
    found = hostruntime.detect_runtime(search_path=[str(tmp_path / "nothing"), str(site)])
    assert (found.package, found.version) == ("onnxruntime-gpu", "1.31.2")
    assert found.providers == {"CPUExecutionProvider", "CUDAExecutionProvider"}
    over = hostruntime.detect_runtime(
        runtime="onnxruntime==1.20.0", providers="A,B", search_path=[]
    )
    assert (over.package, over.version) == ("onnxruntime", "1.20.0")
    assert over.providers == {"A", "B"}


def test_requirements_use_version_patterns() -> None:
    host = hostruntime.HostRuntime(
        "onnxruntime", "1.32.1", frozenset({"CPUExecutionProvider"}), "t"
    )
    ok = {"package": "onnxruntime", "version": "1.32.*"}
    cpu = {"expected": "CPUExecutionProvider"}
    assert hostruntime.requirement_failures(host, ok, cpu) == []
    assert hostruntime.requirement_failures(host, {**ok, "version": "1.31.*"}, cpu) == [
        "onnxruntime version is 1.32.1, needs 1.31.*"
    ]
    none = hostruntime.HostRuntime(None, None, frozenset(), "t")
    assert "no onnxruntime distribution found" in hostruntime.requirement_failures(none, ok, cpu)[0]


# -- the real process -------------------------------------------------------------------------


def run_process(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "manifest.resolve", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        check=False,
        timeout=60,
    )


def test_exit_codes_of_the_real_process(tmp_path: Path) -> None:
    path = dump(fresh(), tmp_path / "m.json")
    common = [
        "--manifest",
        str(path),
        "--pubkey",
        str(PUB),
        "--runtime",
        "onnxruntime==1.32.0",
        "--providers",
        "CPUExecutionProvider",
    ]
    got = {
        cls: run_process(*common, "--host-class", cls).returncode
        for cls in ("x86-vnni", "arm-new", "nope", "gpu-a10")
    }
    assert got == {"x86-vnni": 0, "arm-new": 3, "nope": 2, "gpu-a10": 5}
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    path.write_text("{}")  # the file the service reads, damaged
    refused = run_process("--manifest", str(path), "--pubkey", str(PUB), "--host-class", "x86-vnni")
    assert refused.returncode == 0  # the default state directory kept the last-known-good
    assert "using the last-known-good manifest, version 2" in refused.stderr
    kept = Path(os.environ["XDG_STATE_HOME"]) / "qualify" / "resolve" / LINE / hoststate.LKG_FILE
    assert kept.read_bytes() == envelope.encode_canonical(fresh())
    alone = run_process(
        "--manifest", str(bad), "--pubkey", str(PUB), "--host-class", "x86-vnni", "--no-state"
    )
    assert alone.returncode == 4
    usage = run_process("--manifest", str(path), "--bogus")
    assert usage.returncode == 2
    assert usage.stderr.count("\n") == 1 and "unrecognized arguments: --bogus" in usage.stderr


def test_the_command_flushes_everything_it_says_before_it_ends(tmp_path: Path) -> None:
    # Run as the command, resolve-artifact ends its process without the interpreter's
    # teardown: what it printed must all have been written first.
    path = dump(fresh(), tmp_path / "m.json")
    args = ["--manifest", str(path), "--pubkey", str(PUB), "--no-state", "--json"]
    host = ["--runtime", "onnxruntime==1.32.0", "--providers", "CPUExecutionProvider"]
    done = run_process(*args, *host, "--host-class", "x86-vnni")
    assert done.returncode == 0 and json.loads(done.stdout)["host_class"] == "x86-vnni"
    held = run_process(*args, *host, "--host-class", "arm-new")
    assert held.returncode == 3 and "is on hold" in held.stderr
    assert json.loads(held.stdout)["decision"] == "hold"
    helped = run_process("--help")
    assert helped.returncode == 0 and helped.stdout.startswith("usage: resolve-artifact")
    assert helped.stdout.rstrip().endswith("https,s3,gs,az,oci,file)")  # all of it, flushed


def test_resolve_process_imports_nothing_heavy(tmp_path: Path) -> None:
    path = dump(fresh(), tmp_path / "m.json")
    code = (
        "import json, sys\n"
        "from manifest.resolve import main\n"
        f"rc = main(['--manifest', {str(path)!r}, '--pubkey', {str(PUB)!r},"
        " '--host-class', 'x86-vnni'])\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(json.dumps({'rc': rc, 'heavy': heavy, 'crypto': 'cryptography' in sys.modules}),"
        " file=sys.stderr)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    report = json.loads(out.stderr.strip().splitlines()[-1])
    assert report == {"rc": 0, "heavy": [], "crypto": True}


def test_class_names_with_quotes_and_unicode_resolve(host: Host) -> None:
    # A project file refuses such a name; a signed manifest may still carry one (an older
    # generator, another tool), and the host must look it up exactly.
    name = 'zü"rich/1\n'
    doc = fresh()
    entries = doc["signed"]["entries"]
    entries[name] = {**entries.pop("x86-vnni"), "host_class": name}
    path = dump(sign_document(doc["signed"], fixed_key()), host.tmp / "m.json")
    code, out, err = host.run(path, "--host-class", name, "--json")
    assert (code, json.loads(out)["host_class"]) == (0, name), err


@pytest.mark.parametrize("arrived", ["pointer only", "empty folder", "truncated document"])
def test_a_per_class_set_synced_out_of_order_serves_the_last_known_good(
    host: Host, arrived: str
) -> None:
    # rsync or a CDN may deliver the new `current` pointer before (all of) the set it names.
    from manifest.perclass import write_per_class

    directory = host.tmp / "classes"
    write_per_class(fresh(version=2), fixed_key(), directory)
    assert host.run(directory, "--host-class", "x86-vnni")[0] == lookup.EXIT_RESOLVED
    kept = host.lkg()
    (directory / envelope.CURRENT_POINTER).write_text("v3\n")
    if arrived != "pointer only":
        (directory / "v3").mkdir()
    if arrived == "truncated document":
        whole = (directory / "v2" / envelope.class_filename("x86-vnni")).read_bytes()
        (directory / "v3" / envelope.class_filename("x86-vnni")).write_bytes(whole[:100])
    code, out, err = host.run(directory, "--host-class", "x86-vnni")
    assert code == lookup.EXIT_RESOLVED, err
    assert out.strip() == "https://models.example/rec-int8.onnx"
    assert "using the last-known-good manifest, version 2" in err
    assert host.lkg() == kept and host.accepted_version() == 2
