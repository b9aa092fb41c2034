"""The host's ISA summary and match rules that require ISA features (manifest.hostmatch)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from manifest.hostmatch import (
    ISA_FEATURES,
    HostFacts,
    isa_summary,
    match_failures,
    required_isa,
)

EPYC_FLAGS = ["fpu", "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "sha_ni"]
XEON_FLAGS = [*EPYC_FLAGS, "avx512_vnni", "amx_tile", "amx_int8", "avx_vnni"]
GRAVITON_FEATURES = ["fp", "asimd", "asimdhp", "fphp", "asimddp", "i8mm", "sve", "sve2"]


def facts(arch: str, flags: list[str]) -> HostFacts:
    return HostFacts(
        arch=arch,
        cpu_model=None,
        cpu_flags=frozenset(flags),
        cores=2,
        memory_mb=None,
        providers=frozenset(),
    )


def test_x86_isa_summary_keeps_only_what_changes_numerics_under_one_name() -> None:
    assert isa_summary("x86_64", EPYC_FLAGS) == ["avx2", "avx512f", "f16c"]
    assert isa_summary("x86_64", XEON_FLAGS) == [
        "amx",
        "avx2",
        "avx512_vnni",
        "avx512f",
        "avx_vnni",
        "f16c",
    ]
    assert isa_summary("x86_64", ["avx512vnni"]) == ["avx512_vnni"]  # the other spelling


def test_arm_isa_summary_names_dot_product_int8_matmul_sve_and_fp16() -> None:
    assert isa_summary("aarch64", GRAVITON_FEATURES) == ["asimddp", "fp16", "i8mm", "sve"]
    assert isa_summary("aarch64", XEON_FLAGS) == []  # x86 flags mean nothing on ARM
    assert isa_summary("riscv64", XEON_FLAGS) == []


def test_a_match_rule_can_require_isa_features() -> None:
    rules = {"arch": "x86_64", "isa": ["avx512_vnni"]}
    assert match_failures(facts("x86_64", XEON_FLAGS), rules) == []
    assert match_failures(facts("x86_64", EPYC_FLAGS), rules) == ["isa: host lacks avx512_vnni"]


def test_required_isa_joins_isa_and_required_cpu_flags() -> None:
    rules = {"arch": "x86_64", "cpu_flags": ["avx512f", "avx512vnni", "sse4_2"], "isa": ["amx"]}
    assert required_isa(rules) == ["amx", "avx512_vnni", "avx512f"]
    assert required_isa({"arch": "aarch64", "cpu_flags": ["asimddp"]}) == ["asimddp"]
    assert required_isa({}) == []


@given(st.lists(st.text(max_size=12), max_size=30), st.sampled_from(["x86_64", "aarch64", "?"]))
def test_isa_summary_of_any_flags_is_sorted_known_names(flags: list[str], arch: str) -> None:
    summary = isa_summary(arch, flags)
    assert summary == sorted(set(summary))
    assert set(summary) <= set(ISA_FEATURES)
