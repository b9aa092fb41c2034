"""The documented table from a class's match rules to the emulated CPU of its ISA, and the
project fields that override it or let emulated numerics qualify."""

from __future__ import annotations

import typing
from typing import Any

import pytest
from pydantic import ValidationError

from schemas.emulation import CPU_MODELS, KERNEL_FLAGS, EmulatedCpu, cpu_for, kernel_flags
from schemas.project import HostClass, Policy


@pytest.mark.parametrize(
    ("rules", "cpu"),
    [
        ({"arch": "x86_64", "cpu_flags": ["sse4_2"]}, "Nehalem"),
        ({"arch": "x86_64", "cpu_flags": ["avx"]}, "SandyBridge"),
        ({"arch": "x86_64", "cpu_flags": ["avx2", "fma"]}, "Haswell"),
        ({"arch": "x86_64", "isa": ["avx2"]}, "Haswell"),
        ({"arch": "x86_64", "isa": ["f16c"], "cpu_flags": ["bmi2"]}, "Haswell"),
        ({"arch": "aarch64"}, "cortex-a72"),
        ({"arch": "aarch64", "cpu_flags": ["asimddp"]}, "neoverse-n1"),
        ({"arch": "aarch64", "isa": ["fp16"]}, "neoverse-n1"),
    ],
)
def test_a_class_gets_the_lowest_emulated_cpu_with_every_feature_it_requires(
    rules: dict[str, Any], cpu: str
) -> None:
    assert cpu_for(rules)[0] == cpu
    assert kernel_flags(CPU_MODELS[cpu].arch, rules.get("cpu_flags", [])) <= CPU_MODELS[cpu].flags


@pytest.mark.parametrize(
    ("rules", "why"),
    [
        ({"arch": "x86_64", "cpu_flags": ["avx512f", "avx512_vnni"]}, "QEMU's TCG does not"),
        ({"arch": "x86_64", "cpu_flags": ["avxvnni"]}, "avx_vnni"),
        ({"arch": "x86_64", "isa": ["amx"]}, "amx"),
        ({"arch": "aarch64", "isa": ["i8mm"]}, "wrong int8 numbers"),
        ({"arch": "aarch64", "cpu_flags": ["sve"]}, "sve"),
        ({"arch": "x86_64"}, "set emulation.cpu"),
        ({"arch": "x86_64", "accelerator": "CUDAExecutionProvider"}, "QEMU emulates CPUs only"),
        ({"cpu_flags": ["avx2"]}, "no architecture"),
        ({"arch": "riscv64"}, "emulated CPUs exist for x86_64 and aarch64"),
    ],
)
def test_a_class_no_emulated_cpu_can_stand_for_gets_none_and_why(
    rules: dict[str, Any], why: str
) -> None:
    cpu, said = cpu_for(rules)
    assert cpu is None and why in said


def test_every_named_cpu_is_in_the_table_with_flags_of_its_architecture() -> None:
    assert set(typing.get_args(EmulatedCpu)) == set(CPU_MODELS)
    for name, model in CPU_MODELS.items():
        assert model.name == name and model.flags <= KERNEL_FLAGS[model.arch]
        # ARM CPUs are shown with their own cpuinfo (onnxruntime reads features there).
        assert bool(model.cpuinfo) == (model.arch == "aarch64")
        if model.cpuinfo:
            features = next(
                line for line in model.cpuinfo.splitlines() if line.startswith("Features")
            )
            assert kernel_flags(model.arch, features.split(":")[1].split()) == model.flags


def _class(**fields: Any) -> HostClass:
    return HostClass.model_validate(
        {"key": {"hardware": "h", "runtime": "r", "provider": "p"}, "budgets": {"p99_ms": 5}}
        | fields
    )


def test_emulation_cpu_must_be_known_and_of_the_classs_architecture() -> None:
    assert _class(match={"arch": "aarch64"}, emulation={"cpu": "cortex-a72"}).emulation
    assert _class(match={"arch": "x86_64"}, emulation={"cpu": "native"}).emulation
    with pytest.raises(ValidationError, match=r"neoverse-n1 is an aarch64 CPU.*Nehalem"):
        _class(match={"arch": "x86_64"}, emulation={"cpu": "neoverse-n1"})
    with pytest.raises(ValidationError, match=r"emulation\.cpu"):
        _class(match={"arch": "x86_64"}, emulation={"cpu": "Skylake-Server"})
    # Not part of the settings digest: a cell records what computed its numerics.
    assert (
        _class(match={"arch": "aarch64"}, emulation={"cpu": "cortex-a72"}).settings_digest()
        == _class(match={"arch": "aarch64"}).settings_digest()
    )


@pytest.mark.parametrize(
    ("value", "hosts", "numerics"),
    [(False, False, False), ("parity", False, True), (True, True, True)],
)
def test_allow_emulated_reads_false_parity_or_true(
    value: bool | str, hosts: bool, numerics: bool
) -> None:
    policy = Policy.model_validate({"allow_emulated": value})
    assert (policy.emulated_hosts_qualify, policy.emulated_numerics_qualify) == (hosts, numerics)
    with pytest.raises(ValidationError):
        Policy.model_validate({"allow_emulated": "latency"})
