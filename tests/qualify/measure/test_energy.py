"""Energy per inference from the host's powercap counters, against a fake sysfs tree."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import pytest

from qualify.measure import energy
from qualify.project.load import load_project
from qualify.run import RunOptions, qualify_run
from tests.qualify.projects import write_project
from tests.qualify.scripted import Script, ScriptedWorkers, digest_of

MAX_RANGE = 262_143_328_850


def _has_nvml() -> bool:
    try:
        ctypes.CDLL(energy.NVML_LIBRARY)
    except OSError:
        return False
    return True


def _zone(root: Path, zone: str, name: str, uj: int, limit: int = MAX_RANGE) -> Path:
    folder = root / zone
    folder.mkdir(parents=True)
    (folder / "name").write_text(name + "\n")
    (folder / "energy_uj").write_text(f"{uj}\n")
    (folder / "max_energy_range_uj").write_text(f"{limit}\n")
    return folder


def test_package_and_dram_counters_are_found_and_core_is_left_out(tmp_path: Path) -> None:
    _zone(tmp_path, "intel-rapl:0", "package-0", 1_000)
    _zone(tmp_path, "intel-rapl:0:0", "core", 500)
    _zone(tmp_path, "intel-rapl:0:1", "dram", 200)
    _zone(tmp_path, "intel-rapl-mmio:0", "package-0", 7)  # another view of the same package
    (tmp_path / "intel-rapl").mkdir()  # the control type folder, not a zone
    domains, missing = energy.discover(tmp_path)
    assert missing is None
    assert [d.label for d in domains] == ["intel-rapl:0 (package-0)", "intel-rapl:0:1 (dram)"]


def test_joules_between_two_readings_count_across_a_wrap(tmp_path: Path) -> None:
    package = _zone(tmp_path, "intel-rapl:0", "package-0", MAX_RANGE - 1_000_000)
    domains, _ = energy.discover(tmp_path)
    before = energy.read(domains)
    (package / "energy_uj").write_text("2500000\n")  # wrapped past max_energy_range_uj
    spent = energy.energy_between(domains, before, energy.read(domains))
    assert spent.missing is None
    assert spent.joules == {"intel-rapl:0 (package-0)": pytest.approx(3.5)}


def test_no_counters_is_a_reason_not_a_number(tmp_path: Path) -> None:
    domains, missing = energy.discover(tmp_path / "absent")
    assert domains == [] and missing is not None and "does not exist" in missing
    spent = energy.energy_between(domains, None, None)
    assert spent.joules is None and spent.missing


def test_counters_readable_by_root_only_say_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _zone(tmp_path, "intel-rapl:0", "package-0", 1)

    def denied(path: Path) -> int:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(energy, "_read_int", denied)
    domains, missing = energy.discover(tmp_path)
    assert domains == [] and missing is not None and "root only" in missing


@pytest.mark.parametrize("content", ["", "x\n", "-5\n", "9" * 100, "1e9\n", "12 34\n"])
def test_a_garbled_counter_is_skipped_not_trusted(tmp_path: Path, content: str) -> None:
    package = _zone(tmp_path, "intel-rapl:0", "package-0", 1)
    (package / "energy_uj").write_text(content)
    domains, missing = energy.discover(tmp_path)
    assert domains == [] and missing is not None


def test_a_counter_garbled_between_two_readings_gives_no_figure(tmp_path: Path) -> None:
    package = _zone(tmp_path, "intel-rapl:0", "package-0", 1)
    domains, _ = energy.discover(tmp_path)
    before = energy.read(domains)
    (package / "energy_uj").write_text("oops\n")
    spent = energy.energy_between(domains, before, energy.read(domains))
    assert spent.joules is None and spent.missing


class FakeNvml:
    """libnvidia-ml.so.1 as ctypes sees it: C functions returning an NVML status, writing
    their results through pointers (``ctypes.byref``), for GPUs by index or UUID."""

    def __init__(self, gpus: dict[str, tuple[str, int]], *, energy_rc: int = 0) -> None:
        self.gpus = gpus  # index or UUID -> (model name, millijoules)
        self.energy_rc = energy_rc
        self.handles: list[str] = []

    def __call__(self, name: str) -> FakeNvml:
        assert name == energy.NVML_LIBRARY
        return self

    def nvmlInit_v2(self) -> int:
        return 0

    def _handle(self, key: str, ref: Any) -> int:
        if key not in self.gpus:
            return 2  # NVML_ERROR_INVALID_ARGUMENT
        self.handles.append(key)
        ref._obj.value = len(self.handles)
        return 0

    def nvmlDeviceGetHandleByIndex_v2(self, index: ctypes.c_uint, ref: Any) -> int:
        return self._handle(str(index.value), ref)

    def nvmlDeviceGetHandleByUUID(self, uuid: bytes, ref: Any) -> int:
        return self._handle(uuid.decode(), ref)

    def _gpu(self, handle: ctypes.c_void_p) -> tuple[str, int]:
        return self.gpus[self.handles[int(handle.value or 0) - 1]]

    def nvmlDeviceGetName(self, handle: ctypes.c_void_p, buf: Any, size: ctypes.c_uint) -> int:
        buf.value = self._gpu(handle)[0].encode()[: size.value - 1]
        return 0

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: ctypes.c_void_p, ref: Any) -> int:
        if self.energy_rc:
            return self.energy_rc
        ref._obj.value = self._gpu(handle)[1]
        return 0


def test_a_gpu_classs_energy_adds_its_nvml_counter_to_the_hosts(tmp_path: Path) -> None:
    _zone(tmp_path, "intel-rapl:0", "package-0", 1_000_000)
    fake = FakeNvml({"0": ("NVIDIA A10", 5_000), "1": ("NVIDIA H200", 90_000)})
    domains, missing = energy.discover(tmp_path, gpu=1, nvml=fake, environ={})
    assert missing is None
    assert [d.label for d in domains] == ["intel-rapl:0 (package-0)", "nvml:1 (NVIDIA H200)"]
    before = energy.read(domains)
    fake.gpus["1"] = ("NVIDIA H200", 92_500)  # +2.5 J, counted in millijoules
    spent = energy.energy_between(domains, before, energy.read(domains))
    assert spent.joules == {
        "intel-rapl:0 (package-0)": pytest.approx(0.0),
        "nvml:1 (NVIDIA H200)": pytest.approx(2.5),
    }


def test_cuda_visible_devices_picks_the_gpu_nvml_is_asked_for(tmp_path: Path) -> None:
    fake = FakeNvml({"3": ("by index", 1), "GPU-5f1e": ("by uuid", 2)})
    domains, _ = energy.gpu_domains(0, nvml=fake, environ={"CUDA_VISIBLE_DEVICES": "3,0"})
    assert [d.label for d in domains] == ["nvml:3 (by index)"]
    domains, _ = energy.gpu_domains(0, nvml=fake, environ={"CUDA_VISIBLE_DEVICES": "GPU-5f1e"})
    assert [d.label for d in domains] == ["nvml:GPU-5f1e (by uuid)"]
    domains, missing = energy.gpu_domains(2, nvml=fake, environ={"CUDA_VISIBLE_DEVICES": "3"})
    assert domains == [] and missing is not None and "not in CUDA_VISIBLE_DEVICES" in missing


def test_a_gpu_counter_that_goes_backwards_gives_no_figure(tmp_path: Path) -> None:
    fake = FakeNvml({"0": ("NVIDIA A10", 9_000)})
    domains, _ = energy.gpu_domains(0, nvml=fake, environ={})
    before = energy.read(domains)
    fake.gpus["0"] = ("NVIDIA A10", 10)  # the driver reloaded: the count restarted
    spent = energy.energy_between(domains, before, energy.read(domains))
    assert spent.joules is None and spent.missing and "went backwards" in spent.missing


@pytest.mark.parametrize(
    ("fake", "said"),
    [
        (None, "cannot be loaded"),
        (FakeNvml({"0": ("Tesla P4", 1)}, energy_rc=3), "has no energy counter"),
        (FakeNvml({"1": ("other", 1)}), "NVML has no GPU '0'"),
    ],
    ids=["no-driver", "pre-volta", "no-such-gpu"],
)
def test_a_gpu_class_without_a_readable_gpu_counter_has_no_figure_and_says_why(
    tmp_path: Path, fake: FakeNvml | None, said: str
) -> None:
    _zone(tmp_path, "intel-rapl:0", "package-0", 1)

    def missing_library(name: str) -> object:
        raise OSError(f"{name}: cannot open shared object file")

    loader = fake if fake is not None else missing_library
    domains, missing = energy.discover(tmp_path, gpu=0, nvml=loader, environ={})
    assert domains == [] and missing is not None and said in missing


@pytest.mark.skipif(not _has_nvml(), reason="no NVIDIA driver (libnvidia-ml.so.1) on this host")
def test_the_real_nvml_counter_reads_when_the_host_has_one() -> None:
    domains, missing = energy.gpu_domains(0)
    if missing is not None and "not supported" in missing:
        pytest.skip(missing)
    assert missing is None, missing
    first = energy.read(domains)
    assert first is not None and all(v >= 0 for v in first.values())


def _scripted(tmp_path: Path, energy_mj: float | None, budget: float | None) -> object:
    project = write_project(tmp_path, [])
    if budget is not None:
        text = project.read_text().replace(
            "peak_rss_mb: 1024}", f"peak_rss_mb: 1024, energy_mj: {budget}}}"
        )
        project.write_text(text)
    workers = ScriptedWorkers(
        {digest_of(tmp_path / "models" / "identity_mlp.onnx"): Script(energy_mj=energy_mj)}
    )
    outcome = qualify_run(
        load_project(project),
        "here-cpu",
        RunOptions(db_path=tmp_path / "m.duckdb", measure_alone=False),
        workers=workers.seam(),
    )
    return outcome.bundle.cells[0]


def test_energy_per_inference_is_the_rounds_joules_over_their_samples(tmp_path: Path) -> None:
    cell = _scripted(tmp_path, energy_mj=2.5, budget=None)
    gate = cell.gate_latency  # type: ignore[attr-defined]
    assert gate.energy_mj == pytest.approx(2.5)
    assert gate.energy_source == ["intel-rapl:0 (package-0)"] and gate.energy_missing is None


@pytest.mark.parametrize(
    ("measured", "budget", "verdict", "codes"),
    [
        (2.5, 10.0, "pass", []),
        (2.5, 1.0, "fail", ["energy_over_budget"]),
        (None, 1.0, "insufficient", ["energy_missing"]),
    ],
)
def test_an_energy_budget_is_a_gate(
    tmp_path: Path, measured: float | None, budget: float, verdict: str, codes: list[str]
) -> None:
    cell = _scripted(tmp_path, energy_mj=measured, budget=budget)
    assert (cell.verdict, [r.code for r in cell.reasons]) == (verdict, codes)  # type: ignore[attr-defined]


@pytest.mark.slow
def test_a_real_run_records_energy_or_says_why_not(tmp_path: Path) -> None:
    # This machine may or may not expose powercap: either a number with its counters, or null
    # with the reason, never both and never neither.
    project = write_project(tmp_path, [])
    outcome = qualify_run(
        load_project(project), "here-cpu", RunOptions(db_path=tmp_path / "m.duckdb")
    )
    for result in outcome.bundle.cells[0].latency:
        if result.energy_mj is None:
            assert result.energy_missing and not result.energy_source
        else:
            assert result.energy_mj > 0 and result.energy_source and not result.energy_missing


def test_a_real_run_of_a_gpu_class_counts_the_gpu_or_says_why_not(tmp_path: Path) -> None:
    # lost-gpu expects CUDA: its figure needs the GPU's NVML counter; where there is none (no
    # driver here), energy is null with that reason rather than the host's counters alone.
    project = write_project(tmp_path, [])
    outcome = qualify_run(
        load_project(project), "lost-gpu", RunOptions(db_path=tmp_path / "m.duckdb")
    )
    for result in outcome.bundle.cells[0].latency:
        if result.energy_mj is None:
            assert result.energy_missing and not result.energy_source
            if not _has_nvml():
                assert "NVML" in result.energy_missing
        else:
            assert result.energy_source and any(s.startswith("nvml:") for s in result.energy_source)
