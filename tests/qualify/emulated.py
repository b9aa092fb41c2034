"""Stand-ins for the pieces ``--emulate`` finds on a machine: QEMU, and a runtime prepared for
another architecture, made small and offline (the real ones are exercised by
``test_emulated_isa.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from qualify.measure.emulators import Emulators
from qualify.measure.sysroot import tree_digest
from schemas.emulation import CPU_MODELS, PreparedRuntime

FAKE_QEMU = "/opt/fake/qemu-{arch}-static"


def fake_runtime(folder: Path, version: str = "1.32.0", arch: str = "aarch64") -> Path:
    """A runtime folder with the shape `qualify.measure.sysroot.prepare_runtime` leaves and a valid
    ``runtime.json`` (its pieces are a few bytes each: nothing here can run)."""
    path = folder / f"{arch}-onnxruntime-{version}"
    python = path / "root" / "usr" / "bin" / "python3.11"
    python.parent.mkdir(parents=True)
    python.write_bytes(b"\x7fELF not really")
    python.chmod(0o755)
    for package in ("onnxruntime", "numpy"):
        (path / "site" / package).mkdir(parents=True)
        (path / "site" / package / "__init__.py").write_text(f"__version__ = '{version}'\n")
    for model in CPU_MODELS.values():
        if model.arch == arch:
            prefix = path / "cpu" / model.name
            (prefix / "proc").mkdir(parents=True)
            (prefix / "usr").symlink_to(Path("..") / ".." / "root" / "usr")
            (prefix / "proc" / "cpuinfo").write_text(model.cpuinfo)
    doc = PreparedRuntime(
        format="qualify-emulator-runtime/1",
        arch=arch,
        python="3.11",
        onnxruntime=version,
        numpy="2.4.6",
        debian_suite="bookworm",
        pieces=[],
        tree_sha256=tree_digest(path),
        prepared_at="2026-01-01T00:00:00Z",
        qualify_version="test",
    )
    (path / "runtime.json").write_text(doc.model_dump_json())
    return path


@dataclass
class FakeQemu:
    """QEMU "found" for the architectures listed, version 7.2.22, on an x86_64 host."""

    arches: tuple[str, ...] = ("x86_64", "aarch64")
    asked: list[str] = field(default_factory=list)

    def find(self, arch: str) -> str | None:
        self.asked.append(arch)
        return FAKE_QEMU.format(arch=arch) if arch in self.arches else None

    def emulators(self, *runtime_dirs: Path) -> Emulators:
        return Emulators(
            find_qemu=self.find,
            version=lambda _qemu: "7.2.22",
            runtime_dirs=tuple(runtime_dirs),
            host_arch="x86_64",
        )
