"""Energy per inference from the host's powercap counters, against a fake sysfs tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from qualify import energy
from qualify.project import load_project
from qualify.run import RunOptions, qualify_run
from tests.qualify.projects import write_project
from tests.qualify.scripted import Script, ScriptedWorkers, digest_of

MAX_RANGE = 262_143_328_850


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
