"""How ``--emulate`` computes a class's numerics on this host: the plan (emulated CPU, QEMU,
prepared runtime, or why not), and the runtimes prepared for another architecture."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qualify.measure.emulators import (
    Emulators,
    class_cpu,
    plan_numerics,
    prepare_for_class,
    status_lines,
)
from qualify.measure.fingerprint import isa_mismatch, take_fingerprint
from qualify.measure.sysroot import SysrootError, find_runtime, prepare_runtime, verify_runtime
from schemas.host import Fingerprint
from schemas.project import (
    Budgets,
    Emulation,
    HostClass,
    HostClassKey,
    MatchRules,
    RuntimeSpec,
)
from tests.qualify.emulated import FakeQemu, fake_runtime
from tests.qualify.measure.test_fingerprint import PROBE, X86_CPUINFO, fake_proc

AVX512 = [
    "sse4_1",
    "sse4_2",
    "ssse3",
    "popcnt",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512_vnni",
]
HASWELL = ["sse4_1", "sse4_2", "ssse3", "popcnt", "avx", "avx2", "fma", "f16c", "bmi2"]


def host(tmp_path: Path, flags: list[str], arch: str = "x86_64") -> Fingerprint:
    """A fingerprint of an ``arch`` host with these CPU flags and onnxruntime 1.32.0."""
    fp = take_fingerprint(lambda: dict(PROBE, version="1.32.0"), fake_proc(tmp_path, X86_CPUINFO))
    return fp.model_copy(update={"arch": arch, "cpu_flags": sorted(flags), "isa": None})


def klass(emulation: str | None = None, version: str = "1.32.*", **match: object) -> HostClass:
    return HostClass(
        key=HostClassKey(hardware="hw", runtime="rt", provider="pv"),
        match=MatchRules(**match),  # type: ignore[arg-type]
        runtime=RuntimeSpec(version=version),
        budgets=Budgets(p99_ms=50),
        emulation=Emulation(cpu=emulation) if emulation else None,  # type: ignore[arg-type]
    )


ARM = {"arch": "aarch64", "cpu_flags": ["asimddp"]}


def test_without_emulate_numerics_are_this_hosts_and_say_when_another_isas(
    tmp_path: Path,
) -> None:
    qemu = FakeQemu()
    plan = plan_numerics(
        host(tmp_path, AVX512), klass(**ARM), "arm-r5", False, qemu.emulators(), tmp_path
    )
    assert (plan.source, plan.launch, plan.note) == ("other_isa", None, None)
    assert plan.isa_mismatch == ["arch x86_64, class aarch64", "no asimddp"]
    assert qemu.asked == []  # nothing is looked for unless --emulate asks


def test_an_arm_class_is_emulated_on_a_neoverse_n1_with_its_prepared_runtime(
    tmp_path: Path,
) -> None:
    runtime = fake_runtime(tmp_path / "emulators")
    emulators = FakeQemu().emulators(tmp_path / "elsewhere", tmp_path / "emulators")
    plan = plan_numerics(host(tmp_path, AVX512), klass(**ARM), "arm-r5", True, emulators, tmp_path)
    assert (plan.source, plan.arch, plan.cpu, plan.qemu) == (
        "emulated",
        "aarch64",
        "neoverse-n1",
        "7.2.22",
    )
    assert plan.runtime_version == "1.32.0" and plan.isa_mismatch == [] and plan.note is None
    assert plan.launch is not None
    assert plan.launch.argv == (
        "/opt/fake/qemu-aarch64-static",
        "-cpu",
        "neoverse-n1",
        "-L",
        str(runtime / "cpu" / "neoverse-n1"),
        str(runtime / "root" / "usr" / "bin" / "python3.11"),
        "-m",
        "qualify.measure.worker",
    )
    env = plan.launch.env
    assert env["PYTHONHOME"] == "/usr" and str(runtime / "site") in str(env["PYTHONPATH"])
    assert env["LD_LIBRARY_PATH"] is None  # the host's libraries are not the guest's
    record = plan.numerics(native_max_abs={"y": 0.5})
    assert record.label == "emulated neoverse-n1 (QEMU 7.2.22)" and record.native_max_abs == {
        "y": 0.5
    }


@pytest.mark.parametrize(
    ("qemu", "prepared", "said"),
    [
        ((), True, "apt-get install qemu-user-static"),
        (("aarch64",), False, "Fix: qualify emulators prepare --class arm-r5"),
    ],
)
def test_an_arm_class_without_qemu_or_a_runtime_says_why_and_keeps_another_isas_numerics(
    tmp_path: Path, qemu: tuple[str, ...], prepared: bool, said: str
) -> None:
    if prepared:
        fake_runtime(tmp_path / "emulators")
    emulators = FakeQemu(qemu).emulators(tmp_path / "emulators")
    plan = plan_numerics(host(tmp_path, AVX512), klass(**ARM), "arm-r5", True, emulators, tmp_path)
    assert (plan.source, plan.launch) == ("other_isa", None)
    assert plan.note is not None and said in plan.note
    assert said in plan.line and plan.line.startswith("numerics from another ISA: arch x86_64")


def test_a_runtime_of_another_onnxruntime_is_not_the_classs_and_this_hosts_version_is_preferred(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "emulators"
    fake_runtime(folder, "1.31.0")
    assert find_runtime([folder], "aarch64", RuntimeSpec(version="1.32.*"), "1.32.0") is None
    fake_runtime(folder, "1.32.1")
    fake_runtime(folder, "1.32.0")
    found = find_runtime([folder], "aarch64", RuntimeSpec(version="1.32.*"), "1.32.0")
    assert found is not None and found[1].onnxruntime == "1.32.0"
    newest = find_runtime([folder], "aarch64", RuntimeSpec(version="1.32.*"), "1.31.9")
    assert newest is not None and newest[1].onnxruntime == "1.32.1"
    assert find_runtime([folder], "aarch64", RuntimeSpec(package="onnxruntime-gpu"), None) is None


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (
            lambda rt: (rt / "site" / "numpy" / "__init__.py").write_text("tampered"),
            "changed since",
        ),
        (lambda rt: (rt / "root" / "usr" / "bin" / "python3.11").unlink(), "lacks root/usr/bin"),
        (lambda rt: (rt / "cpu" / "neoverse-n1" / "proc" / "cpuinfo").unlink(), "changed since"),
        (lambda rt: (rt / "runtime.json").write_text("{"), r"runtime\.json: not a runtime"),
    ],
)
def test_a_runtime_changed_or_cut_short_since_it_was_prepared_is_refused_with_the_fix(
    tmp_path: Path, change: object, said: str
) -> None:
    runtime = fake_runtime(tmp_path / "emulators")
    change(runtime)  # type: ignore[operator]
    emulators = FakeQemu().emulators(tmp_path / "emulators")
    with pytest.raises(SysrootError, match=said) as caught:
        plan_numerics(host(tmp_path, AVX512), klass(**ARM), "arm-r5", True, emulators, tmp_path)
    assert "qualify emulators prepare" in str(caught.value)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.binary(max_size=400))
def test_a_hostile_runtime_json_is_refused_by_name_never_a_traceback(
    tmp_path_factory: pytest.TempPathFactory, raw: bytes
) -> None:
    folder = tmp_path_factory.mktemp("emulators")
    runtime = fake_runtime(folder)
    (runtime / "runtime.json").write_bytes(raw)
    with pytest.raises(SysrootError, match=r"runtime\.json: not a runtime qualify prepared"):
        find_runtime([folder], "aarch64", RuntimeSpec(version="1.32.*"), None)


def test_an_avx2_class_on_an_avx512_host_is_emulated_on_haswell_with_this_interpreter(
    tmp_path: Path,
) -> None:
    avx2 = klass(arch="x86_64", cpu_flags=["avx2", "fma"])
    plan = plan_numerics(
        host(tmp_path, AVX512), avx2, "x86-v3", True, FakeQemu().emulators(), tmp_path
    )
    assert (plan.source, plan.cpu, plan.runtime_version) == ("emulated", "Haswell", "1.32.0")
    assert plan.launch is not None and plan.launch.env == {}
    assert plan.launch.argv == (
        "/opt/fake/qemu-x86_64-static",
        "-cpu",
        "Haswell",
        sys.executable,
        "-m",
        "qualify.measure.worker",
    )
    # A host that presents exactly Haswell's kernels computes the class's numbers itself.
    same = plan_numerics(
        host(tmp_path, HASWELL), avx2, "x86-v3", True, FakeQemu().emulators(), tmp_path
    )
    assert (same.source, same.launch, same.note) == ("native", None, None)


def test_a_class_no_emulated_cpu_stands_for_says_why_and_is_another_isas_only_off_the_class(
    tmp_path: Path,
) -> None:
    v4 = klass(arch="x86_64", cpu_flags=["avx512f", "avx512_vnni"])
    here = plan_numerics(
        host(tmp_path, AVX512), v4, "x86-v4", True, FakeQemu().emulators(), tmp_path
    )
    assert here.source == "native" and here.isa_mismatch == []
    assert here.note is not None and "no emulated CPU has avx512_vnni, avx512f" in here.note
    avx2_host = plan_numerics(
        host(tmp_path, HASWELL), v4, "x86-v4", True, FakeQemu().emulators(), tmp_path
    )
    assert avx2_host.source == "other_isa"
    assert avx2_host.note is not None and "QEMU's TCG does not implement them" in avx2_host.note
    gpu = klass(arch="x86_64", accelerator="CUDAExecutionProvider")
    assert class_cpu(gpu) == (
        None,
        "the class computes on CUDAExecutionProvider; QEMU emulates CPUs only",
    )


def test_emulation_cpu_in_the_project_overrides_the_table_and_native_turns_it_off(
    tmp_path: Path,
) -> None:
    fp = host(tmp_path, AVX512)
    nehalem = klass(emulation="Nehalem", arch="x86_64", cpu_flags=["avx2"])
    plan = plan_numerics(fp, nehalem, "c", True, FakeQemu().emulators(), tmp_path)
    assert (plan.source, plan.cpu) == ("emulated", "Nehalem")
    off = plan_numerics(
        fp, klass(emulation="native", **ARM), "c", True, FakeQemu().emulators(), tmp_path
    )
    assert (off.source, off.note) == ("other_isa", "emulation.cpu is native")


def test_an_arm_class_on_another_arm_host_gets_the_emulated_cpus_own_cpuinfo(
    tmp_path: Path,
) -> None:
    # A Neoverse-V1 host: its cpuinfo names i8mm and sve, which QEMU's neoverse-n1 lacks, and
    # onnxruntime would run them (SIGILL); the prefix shows it the N1's cpuinfo instead.
    fp = host(tmp_path, ["asimd", "asimddp", "asimdhp", "fphp", "i8mm", "sve"], arch="aarch64")
    qemu = FakeQemu()
    emulators = Emulators(find_qemu=qemu.find, version=lambda _q: "7.2.22", host_arch="aarch64")
    plan = plan_numerics(fp, klass(**ARM), "arm-n1", True, emulators, tmp_path)
    assert plan.launch is not None and plan.source == "emulated"
    assert plan.launch.argv[:5] == (
        "/opt/fake/qemu-aarch64-static",
        "-cpu",
        "neoverse-n1",
        "-L",
        str(tmp_path / "cpu-neoverse-n1"),
    )
    cpuinfo = (tmp_path / "cpu-neoverse-n1" / "proc" / "cpuinfo").read_text()
    assert "CPU part\t: 0xd0c" in cpuinfo and "asimddp" in cpuinfo and "i8mm" not in cpuinfo
    assert isa_mismatch(fp, klass(**ARM)) == []


# -- preparing --------------------------------------------------------------------------------


class FakeRegistries:
    """What apt-get, pip and dpkg-deb would do, offline: tiny files with the right names."""

    def __init__(self, fail_at: str | None = None) -> None:
        self.fail_at = fail_at
        self.commands: list[list[str]] = []

    def __call__(self, cmd: list[str], cwd: Path) -> None:
        self.commands.append(cmd)
        step = cmd[-1] if cmd[0] == "apt-get" and cmd[-1] == "update" else cmd[0]
        if step == self.fail_at or (self.fail_at == "download" and "download" in cmd):
            raise SysrootError(f"{step} failed (scripted)")
        if cmd[0] == "apt-get" and "download" in cmd:
            for name in cmd[cmd.index("download") + 1 :]:
                (cwd / f"{name}_1.0-1_arm64.deb").write_bytes(name.encode())
        elif cmd[0] == sys.executable:  # pip download
            dest = Path(next(a for a in cmd if a.startswith("--dest=")).split("=", 1)[1])
            for spec in cmd[-2:]:
                name, version = spec.split("==")
                with zipfile.ZipFile(dest / f"{name}-{version}-cp311-cp311-x.whl", "w") as w:
                    w.writestr(f"{name}/__init__.py", f"__version__ = '{version}'\n")
        elif cmd[0] == "dpkg-deb":
            deb, root = Path(cmd[2]), Path(cmd[3])
            if deb.name.startswith("python3.11-minimal"):
                python = root / "usr" / "bin" / "python3.11"
                python.parent.mkdir(parents=True, exist_ok=True)
                python.write_bytes(b"python")
                python.chmod(0o755)
            (root / "usr" / "share" / "doc" / deb.stem).mkdir(parents=True, exist_ok=True)


def test_a_prepared_runtime_records_every_piece_and_verifies_until_it_changes(
    tmp_path: Path,
) -> None:
    keyring = tmp_path / "debian.gpg"
    keyring.write_bytes(b"key")
    registries = FakeRegistries()
    path = prepare_runtime(
        "aarch64", "1.32.0", "2.4.6", tmp_path / "emulators", keyring=keyring, run=registries
    )
    assert path == tmp_path / "emulators" / "aarch64-onnxruntime-1.32.0"
    assert sorted(p.name for p in path.iterdir()) == ["cpu", "root", "runtime.json", "site"]
    found = find_runtime([tmp_path / "emulators"], "aarch64", RuntimeSpec(version="1.32.*"), None)
    assert found is not None
    doc = found[1]
    assert (doc.onnxruntime, doc.numpy, doc.python, doc.debian_suite) == (
        "1.32.0",
        "2.4.6",
        "3.11",
        "bookworm",
    )
    assert {(p.source, p.name) for p in doc.pieces} >= {
        ("debian", "libc6"),
        ("pypi", "onnxruntime"),
    }
    assert all(len(p.sha256) == 64 for p in doc.pieces)
    assert not (path / "root" / "usr" / "share" / "doc").exists()  # not needed, not kept
    assert (path / "cpu" / "neoverse-n1" / "usr").resolve() == (path / "root" / "usr").resolve()
    verify_runtime(path, doc, "fix")
    # apt ran on its own state: the machine's sources, lists and status are not touched.
    update = registries.commands[0]
    assert update[0] == "apt-get" and update[-1] == "update"
    assert any(o.startswith("-oDir::State::status=") and str(tmp_path) in o for o in update)
    assert "-oAPT::Architecture=arm64" in update
    (path / "site" / "onnxruntime" / "__init__.py").write_text("changed")
    with pytest.raises(SysrootError, match="changed since it was prepared"):
        verify_runtime(path, doc, "fix")


@pytest.mark.parametrize("fail_at", ["update", "download", sys.executable, "dpkg-deb"])
def test_a_prepare_that_fails_midway_leaves_no_runtime_and_the_old_one_intact(
    tmp_path: Path, fail_at: str
) -> None:
    keyring = tmp_path / "debian.gpg"
    keyring.write_bytes(b"key")
    folder = tmp_path / "emulators"
    before = fake_runtime(folder, "1.32.0")
    with pytest.raises(SysrootError, match="failed"):
        prepare_runtime(
            "aarch64",
            "1.32.0",
            "2.4.6",
            folder,
            keyring=keyring,
            run=FakeRegistries(fail_at),
            force=True,
        )
    assert sorted(p.name for p in folder.iterdir()) == [before.name]
    assert find_runtime([folder], "aarch64", RuntimeSpec(version="1.32.*"), None) is not None


def test_preparing_needs_debians_keyring_and_a_known_architecture(tmp_path: Path) -> None:
    with pytest.raises(SysrootError, match="apt-get install debian-archive-keyring"):
        prepare_runtime(
            "aarch64",
            "1.32.0",
            "2.4.6",
            tmp_path,
            keyring=tmp_path / "no.gpg",
            run=FakeRegistries(),
        )
    with pytest.raises(SysrootError, match="only for aarch64"):
        prepare_runtime("riscv64", "1.32.0", "2.4.6", tmp_path, run=FakeRegistries())


def test_a_wheel_whose_member_leaves_the_folder_is_refused(tmp_path: Path) -> None:
    keyring = tmp_path / "debian.gpg"
    keyring.write_bytes(b"key")
    registries = FakeRegistries()

    def evil(cmd: list[str], cwd: Path) -> None:
        registries(cmd, cwd)
        if cmd[0] == sys.executable:
            dest = Path(next(a for a in cmd if a.startswith("--dest=")).split("=", 1)[1])
            with zipfile.ZipFile(dest / "evil-1-cp311-cp311-x.whl", "w") as w:
                w.writestr("../../escaped.py", "x = 1\n")

    with pytest.raises(SysrootError, match="leaves the folder"):
        prepare_runtime("aarch64", "1.32.0", "2.4.6", tmp_path / "e", keyring=keyring, run=evil)
    assert not (tmp_path / "escaped.py").exists()


def test_prepare_for_a_class_pins_its_onnxruntime_and_needs_nothing_for_this_architecture(
    tmp_path: Path,
) -> None:
    asked: list[tuple[object, ...]] = []

    def prepare(arch: str, version: str, numpy: str, into: Path, **_: object) -> Path:
        asked.append((arch, version, numpy, into))
        return into / "made"

    def run(cls: HostClass, host_version: str = "1.32.0", given: str | None = None) -> Path | None:
        return prepare_for_class(
            cls,
            tmp_path,
            host_version=host_version,
            numpy_version="2.4.6",
            onnxruntime=given,
            host_arch="x86_64",
            prepare=prepare,
        )

    assert run(klass(**ARM)) == tmp_path / "made"
    assert asked[-1] == ("aarch64", "1.32.0", "2.4.6", tmp_path)
    assert run(klass(version="1.31.2", **ARM), host_version="1.32.0") == tmp_path / "made"
    assert asked[-1][1] == "1.31.2"  # the class names one version: that one
    with pytest.raises(SysrootError, match="pass --onnxruntime"):
        run(klass(version="1.31.*", **ARM), host_version="1.32.0")
    with pytest.raises(SysrootError, match=r"is not the class's runtime\.version"):
        run(klass(**ARM), given="1.30.0")
    assert run(klass(arch="x86_64", cpu_flags=["avx2"])) is None  # QEMU runs this Python
    assert run(klass(arch="x86_64", accelerator="CUDAExecutionProvider")) is None
    assert len(asked) == 2


def test_emulators_show_lists_qemu_runtimes_and_what_each_class_uses(tmp_path: Path) -> None:
    fake_runtime(tmp_path / "emulators")
    classes = {
        "arm-r5": klass(**ARM),
        "x86-v3": klass(arch="x86_64", cpu_flags=["avx2", "fma"]),
        "x86-v4": klass(arch="x86_64", cpu_flags=["avx512_vnni"]),
        "arm-v9": klass(arch="aarch64", cpu_flags=["i8mm"]),
    }
    lines = status_lines(classes, FakeQemu(("x86_64",)).emulators(tmp_path / "emulators"))
    text = "\n".join(lines)
    assert "qemu aarch64: not found" in text and "qemu x86_64: /opt/fake/qemu-x86_64-static" in text
    assert "aarch64-onnxruntime-1.32.0: Python 3.11 (Debian bookworm), onnxruntime 1.32.0" in text
    assert "arm-r5: neoverse-n1, Armv8.2-A with the dot product (asimddp)" in text
    assert "(verified)" in text
    assert "x86-v3: Haswell, x86-64-v3 (AVX2, FMA)" in text and "this host's Python" in text
    assert "x86-v4: no emulated CPU (no emulated CPU has avx512_vnni" in text
    assert "arm-v9: no emulated CPU (no emulated CPU has i8mm" in text


def test_preparing_again_downloads_nothing_unless_forced_or_the_runtime_changed(
    tmp_path: Path,
) -> None:
    keyring = tmp_path / "debian.gpg"
    keyring.write_bytes(b"key")
    folder = tmp_path / "emulators"
    prepare_runtime("aarch64", "1.32.0", "2.4.6", folder, keyring=keyring, run=FakeRegistries())
    again = FakeRegistries()
    path = prepare_runtime("aarch64", "1.32.0", "2.4.6", folder, keyring=keyring, run=again)
    assert again.commands == []
    (path / "site" / "numpy" / "__init__.py").write_text("changed")
    prepare_runtime("aarch64", "1.32.0", "2.4.6", folder, keyring=keyring, run=again)
    assert again.commands  # a runtime that no longer verifies is made again
    forced = FakeRegistries()
    prepare_runtime("aarch64", "1.32.0", "2.4.6", folder, keyring=keyring, run=forced, force=True)
    assert forced.commands
