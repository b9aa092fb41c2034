"""Sustained load: windows, the host's heat, and a drift verdict that noise cannot trigger."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from manifest.gates import judge
from manifest.verdict import Judge
from qualify.measure.soak import WINDOWS, host_heat, soak
from qualify.project.load import load_project
from qualify.run import RunOptions, qualify_run
from schemas.cell import LatencyConfig
from tests.manifest.factories import Fleet, class_spec, digest_of, make_project, tight_soak
from tests.qualify.projects import write_project


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Slowing:
    """A worker whose inferences take ``before_s``, then ``after_s`` once ``at_s`` has passed."""

    def __init__(self, clock: Clock, before_s: float, after_s: float, at_s: float) -> None:
        self.clock, self.before_s, self.after_s, self.at_s = clock, before_s, after_s, at_s
        self.alive = True
        self.pid = 1
        self.rng = np.random.default_rng(0)

    def round(self, cmd: dict[str, Any]) -> dict[str, Any]:
        latency = self.after_s if self.clock.now >= self.at_s else self.before_s
        n = max(1, int(float(cmd["time_s"]) / latency))
        samples = latency * (1 + 0.05 * self.rng.random(n))
        self.clock.now += float(samples.sum())
        return {"samples_ns": (samples * 1e9).astype(np.int64).tolist()}


def _soak(after_s: float) -> Any:
    clock = Clock()
    worker = Slowing(clock, before_s=0.002, after_s=after_s, at_s=30.0)
    (found,) = soak(
        [worker],  # type: ignore[list-item]  # a scripted stand-in for a served worker
        LatencyConfig(1, 1),
        60.0,
        confidence=0.99,
        tolerance=0.2,
        max_samples=100_000,
        clock=clock,
        heat=lambda: (2400.0, 55.0),
    )
    return found


def test_a_model_that_slows_halfway_through_a_soak_has_drifted() -> None:
    found = _soak(after_s=0.004)
    assert found is not None and len(found.windows) == WINDOWS
    assert found.drifted is True
    assert found.windows[-1].p99_ms > 1.8 * found.windows[0].p99_ms
    assert all(w.cpu_mhz == 2400.0 and w.temp_c == 55.0 for w in found.windows)


def test_a_steady_model_has_not_drifted() -> None:
    found = _soak(after_s=0.002)
    assert found is not None and found.drifted is False


def soaked(first_ms: float, last_ms: float, *, budget_ms: float, floor: float = 0.1) -> Any:
    """A candidate cell of a class with p99 budget ``budget_ms`` whose soak's p99 went from
    ``first_ms`` to ``last_ms`` (tight bounds: the relative test calls it a drift), and the
    class."""
    project = make_project({"c": class_spec(0, p99_ms=budget_ms)})
    fleet = Fleet(project)
    fleet.qualify("c", p99_ms=budget_ms / 4, p99_upper_ms=budget_ms / 2, p99_lower_ms=0.0)
    soak = tight_soak(
        [first_ms, first_ms, last_ms, last_ms, last_ms], tolerance=0.2, floor=floor, drifted=True
    )
    return fleet.cells[-1].model_copy(update={"soak": soak}), project.host_classes["c"]


def test_a_drift_too_small_to_matter_against_the_budget_does_not_hold_the_class() -> None:
    # The noise: 0.02 to 0.06 ms against a 5 ms budget, beyond the 20% tolerance.
    verdict, reasons = judge(*soaked(0.02, 0.06, budget_ms=5.0))
    assert (verdict, [r.code for r in reasons]) == ("pass", [])


def test_a_real_drift_against_a_tight_budget_still_fails() -> None:
    # 2 ms of sleep appearing against a 1 ms budget.
    verdict, reasons = judge(*soaked(0.05, 2.05, budget_ms=1.0))
    assert verdict == "fail"
    [reason] = [r for r in reasons if r.code == "sustained_drift"]
    assert "at least 10% of the 1 ms budget" in reason.message


def test_a_floor_of_zero_counts_every_drift_beyond_the_tolerance() -> None:
    verdict, reasons = judge(*soaked(0.02, 0.06, budget_ms=5.0, floor=0.0))
    assert verdict == "fail" and [r.code for r in reasons] == ["sustained_drift"]


def _judged_now(cell: Any, budget_ms: float, **workload: float) -> tuple[str, list[str]]:
    """The cell's current verdict (``manifest.verdict.Judge``) under a project whose class has
    p99 budget ``budget_ms`` and whose workload sets ``workload`` (soak_tolerance, soak_floor)."""
    project = make_project({"c": class_spec(0, p99_ms=budget_ms)})
    project = project.model_copy(update={"workload": project.workload.model_copy(update=workload)})
    labels = [project.artifacts.baseline.label, *(c.label for c in project.artifacts.candidates)]
    found = Judge(project, {label: digest_of(label) for label in labels}).verdict(cell)
    return found.verdict, found.codes


def test_a_soak_is_judged_again_under_the_soak_tolerance_and_floor_of_the_project_now() -> None:
    # 0.05 ms to 0.3 ms against a 1 ms budget: beyond 20%, and 0.24 ms is over 10% of 1 ms.
    cell, _ = soaked(0.05, 0.3, budget_ms=1.0)
    assert _judged_now(cell, 1.0) == ("fail", ["sustained_drift"])
    # A tolerance loosened past the drift (x7 allowed, x5.8 measured): no drift.
    assert _judged_now(cell, 1.0, soak_tolerance=6.0) == ("pass", [])
    # A floor raised to half the budget: 0.24 ms does not matter against it.
    assert _judged_now(cell, 1.0, soak_floor=0.5) == ("pass", [])
    # And the other way: a soak that passed with its own floor fails under a floor of 0.
    quiet, _ = soaked(0.02, 0.06, budget_ms=5.0)
    assert _judged_now(quiet, 5.0) == ("pass", [])
    assert _judged_now(quiet, 5.0, soak_floor=0.0) == ("fail", ["sustained_drift"])


def test_a_drift_too_small_for_the_old_budget_fails_under_a_tightened_one() -> None:
    cell, _ = soaked(0.02, 0.06, budget_ms=5.0)
    # 0.2 ms now: 10% of it is 0.02 ms, and the soak added about 0.04 ms.
    verdict, codes = _judged_now(cell, 0.2)
    assert verdict == "fail" and "sustained_drift" in codes


def test_host_heat_reads_frequency_and_the_hottest_zone_or_says_nothing(tmp_path: Path) -> None:
    for cpu, khz in (("cpu0", "2000000"), ("cpu1", "3000000")):
        folder = tmp_path / "cpu" / cpu / "cpufreq"
        folder.mkdir(parents=True)
        (folder / "scaling_cur_freq").write_text(khz + "\n")
    for zone, milli in (("thermal_zone0", "45000"), ("thermal_zone1", "71500"), ("x", "1")):
        (tmp_path / "thermal" / zone).mkdir(parents=True)
        (tmp_path / "thermal" / zone / "temp").write_text(milli + "\n")
    assert host_heat(tmp_path / "thermal", tmp_path / "cpu") == (2500.0, 71.5)
    assert host_heat(tmp_path / "none", tmp_path / "none") == (None, None)


HOOKS = textwrap.dedent(
    """\
    import time

    START = []
    CALLS = [0]


    def steady(feed):
        # A service whose requests take 2 ms: what it does dwarfs the machine's noise (the
        # model alone takes ~0.05 ms, whose p99 a shared machine moves by more than 20%).
        time.sleep(0.002)
        return feed


    def tires(feed):
        # The service tires after a while (a heap that fills, pauses that grow): once 8 s have
        # passed since its first request, every 20th request pauses for 100 ms. The p99 goes
        # from ~0.05 ms to 100 ms (2,000 times), where a neighbour's noise moves a p99 by a
        # few ms; pauses, not a slower request, keep each window's samples in the hundreds.
        if not START:
            START.append(time.monotonic())
        CALLS[0] += 1
        if time.monotonic() - START[0] > 8 and CALLS[0] % 20 == 0:
            time.sleep(0.1)
        return feed
    """
)

SOAK_TOLERANCE = 9.0
"""The tests' ``workload.soak_tolerance``: a drift is the last window's p99 above ten times the
first's (with confidence). The steady service's wake-ups moved its p99 from 2.2 to 3.7 ms on CI,
and beside a CPU hog here to 13.7 ms with a lower bound of 7.8 ms: under the 22 ms the first
window's ~2.2 ms makes the limit (a neighbour starting halfway through leaves it quiet). The
tiring service's p99 rises from ~0.05 ms to 100 ms."""

SOAK_BUDGET_MS = 20
"""The class's p99 budget in these tests, all of which a drift must add (``soak_floor: 1.0``):
the tiring service adds five budgets; a steady one's noise adds less than half of one."""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("hook", "drifts"),
    [
        ("tires", True),
        # That a steady service shows no drift is a timing judgement: another test starting
        # halfway through its 12 s on a shared machine slows the last windows (it failed so
        # under make test's two workers, when the service was the bare model), so it runs
        # alone, with the quiet tests.
        pytest.param("steady", False, marks=pytest.mark.quiet),
    ],
)
def test_a_soak_flags_a_service_that_slows_down_and_not_a_steady_one(
    tmp_path: Path, hook: str, drifts: bool
) -> None:
    project = write_project(tmp_path, [])
    (tmp_path / "prep.py").write_text(HOOKS)
    text = project.read_text().replace(
        "workload:\n",
        f"workload:\n  pipeline: {{pre: 'prep:{hook}'}}\n  soak_tolerance: {SOAK_TOLERANCE}\n"
        "  soak_floor: 1.0\n",
        1,
    )
    text = text.replace("concurrency: [1, 2]", "concurrency: [1]")
    budget = f"budgets: {{p99_ms: {SOAK_BUDGET_MS}, "
    project.write_text(text.replace("budgets: {p99_ms: 50, ", budget, 1))
    outcome = qualify_run(
        load_project(project),
        "here-cpu",
        RunOptions(db_path=tmp_path / "m.duckdb", soak_s=12),
    )
    cell = outcome.bundle.cells[0]
    assert cell.soak is not None and len(cell.soak.windows) == WINDOWS
    assert cell.soak.drifted is drifts, cell.soak.windows
    codes = [r.code for r in judge(cell, load_project(project).project.host_classes["here-cpu"])[1]]
    assert ("sustained_drift" in codes) is drifts
