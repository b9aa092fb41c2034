"""Fingerprints and class membership: the same rules for `qualify run` and for hosts."""

from __future__ import annotations

from pathlib import Path

import pytest

from manifest.hostmatch import HostFacts, match_failures, read_host_facts
from qualify.measure.fingerprint import class_mismatches, take_fingerprint
from schemas.project import Budgets, HostClass, HostClassKey, MatchRules, RuntimeSpec

ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer\t: 0x41

processor\t: 1
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
"""
X86_CPUINFO = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz
flags\t\t: fpu sse sse2 avx avx2 fma avx512f avx512vnni
"""
MEMINFO = "MemTotal:       16384000 kB\nMemFree:        1000 kB\n"

PROBE = {
    "package": "onnxruntime",
    "version": "1.31.1",
    "build_info": "ORT Build Info: git-branch=rel-1.31.1",
    "available_providers": ["CPUExecutionProvider"],
    "ep_devices": [{"ep_name": "CPUExecutionProvider", "device_type": "CPU"}],
}


def fake_proc(tmp_path: Path, cpuinfo: str) -> Path:
    (tmp_path / "cpuinfo").write_text(cpuinfo)
    (tmp_path / "meminfo").write_text(MEMINFO)
    return tmp_path


def facts(**overrides: object) -> HostFacts:
    base: dict[str, object] = {
        "arch": "x86_64",
        "cpu_model": "Intel Xeon",
        "cpu_flags": frozenset({"avx2", "avx512_vnni"}),
        "cores": 8,
        "memory_mb": 16000,
        "providers": frozenset({"CPUExecutionProvider"}),
    }
    base.update(overrides)
    return HostFacts(**base)  # type: ignore[arg-type]


def test_arm_features_line_is_read_as_cpu_flags(tmp_path: Path) -> None:
    got = read_host_facts(fake_proc(tmp_path, ARM_CPUINFO))
    assert "asimddp" in got.cpu_flags
    assert got.memory_mb == 16000


def test_x86_model_and_flags_are_read(tmp_path: Path) -> None:
    got = read_host_facts(fake_proc(tmp_path, X86_CPUINFO))
    assert got.cpu_model and "Xeon" in got.cpu_model
    assert {"avx2", "avx512vnni"} <= got.cpu_flags


def test_missing_procfs_gives_unknowns_not_guesses(tmp_path: Path) -> None:
    got = read_host_facts(tmp_path / "absent")
    assert got.cpu_model is None and got.memory_mb is None and not got.cpu_flags


@pytest.mark.parametrize(
    ("have", "want"),
    [("avx512_vnni", "avx512vnni"), ("avx512vnni", "avx512_vnni"), ("AVX2", "avx2")],
)
def test_cpu_flag_matches_in_either_spelling(have: str, want: str) -> None:
    assert match_failures(facts(cpu_flags=frozenset({have})), {"cpu_flags": [want]}) == []


def test_each_failed_rule_is_named() -> None:
    rules = {
        "arch": "aarch64",
        "cpu_flags": ["asimddp"],
        "cpu_model": "Graviton",
        "min_cores": 64,
        "min_memory_mb": 64000,
        "accelerator": "CUDAExecutionProvider",
    }
    failures = match_failures(facts(), rules)
    assert [f.split(":")[0] for f in failures] == [
        "arch",
        "cpu_flags",
        "cpu_model",
        "min_cores",
        "min_memory_mb",
        "accelerator",
    ]


def test_unset_rules_match_any_host() -> None:
    assert match_failures(facts(), {}) == []
    assert match_failures(facts(), MatchRules().model_dump()) == []


def test_fingerprint_carries_the_probed_runtime(tmp_path: Path) -> None:
    fp = take_fingerprint(lambda: PROBE, fake_proc(tmp_path, X86_CPUINFO))
    assert fp.runtime.version == "1.31.1"
    assert fp.runtime.ep_devices[0].ep_name == "CPUExecutionProvider"
    assert "avx2" in fp.cpu_flags


def test_runtime_identity_is_part_of_the_class(tmp_path: Path) -> None:
    fp = take_fingerprint(lambda: PROBE, fake_proc(tmp_path, X86_CPUINFO))

    def cls(**runtime: str) -> HostClass:
        return HostClass(
            key=HostClassKey(hardware="h", runtime="r", provider="p"),
            runtime=RuntimeSpec(**runtime),
            budgets=Budgets(p99_ms=1),
        )

    assert class_mismatches(fp, cls(version="1.31.*")) == []
    assert class_mismatches(fp, cls(version="1.32.*")) == [
        "runtime.version: host has onnxruntime 1.31.1, class needs 1.32.*"
    ]
    assert class_mismatches(fp, cls(package="onnxruntime-gpu"))[0].startswith("runtime.package")
    assert class_mismatches(fp, cls(build_info="rel-1.31")) == []
    assert class_mismatches(fp, cls(build_info="cuda"))[0].startswith("runtime.build_info")
