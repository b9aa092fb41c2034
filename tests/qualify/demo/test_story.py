"""The demo, end to end, as a newcomer runs it: real model, real runs, signed manifest, report.

One ``qualify demo`` in a fresh directory, then the checks a person would make: three classes
get the int8 candidate, the class that lost its accelerator path does not, every host class
resolves, the report opens in a real browser with every class and chart, and the other commands
work from the demo directory with their defaults.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import PREPARED_EMULATORS, need_emulator
from tests.qualify.projects import run_qualify
from tests.reports.htmltree import parse
from tests.reports.test_browser import _run

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    work = tmp_path_factory.mktemp("demo") / "demo"
    # The aarch64 runtime this machine's user prepared (CI prepares one): arm-r5's parity is
    # computed on an emulated Neoverse-N1 with it.
    env = dict(os.environ, QUALIFY_EMULATORS=str(PREPARED_EMULATORS))
    proc = run_qualify("demo", "--workdir", str(work), cwd=work.parent, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return work, proc.stdout


def test_demo_writes_everything_it_promises(demo: tuple[Path, str]) -> None:
    work, _ = demo
    for name in (
        "qualify.yaml",
        "qualify.duckdb",
        "manifest.json",
        "release.key",
        "release.pub",
        "report.html",
    ):
        assert (work / name).is_file(), name
    assert len(list((work / "bundles").iterdir())) == 4
    version = json.loads((work / "manifest.json").read_text())["signed"]["version"]
    assert (work / "manifest.d" / "current").read_text() == f"v{version}\n"  # the rollouts' too
    assert len(list((work / "manifest.d" / f"v{version}").iterdir())) == 4
    assert oct((work / "release.key").stat().st_mode & 0o777) == "0o600"


def test_three_classes_get_the_candidate_and_the_lost_gpu_class_does_not(
    demo: tuple[Path, str],
) -> None:
    work, out = demo
    # What the release decided (the draft it published as v1), before the rollouts.
    signed = json.loads((work / "manifest.draft.json").read_text())["signed"]
    assert signed["version"] == 1
    decisions = {name: e["decision"] for name, e in signed["entries"].items()}
    assert decisions == {
        "arm-r5": "candidate",
        "x86-v4": "candidate",
        "x86-v3-1t": "candidate",
        "gpu-t4": "hold",
    }
    gpu = signed["entries"]["gpu-t4"]
    assert "provider_fallback" in {r["code"] for r in gpu["reasons"]}
    assert signed["policy"]["allow_emulated"] is True
    for name, kind in decisions.items():
        if kind == "hold":
            assert f"  {name}: exit 3: hold: its hosts keep what they run" in out
        else:
            assert f"  {name}: exit 0: runs " in out


def test_the_demo_computes_arm_and_avx2_numerics_on_emulated_cpus_beside_this_hosts(
    demo: tuple[Path, str],
) -> None:
    _, out = demo
    section = out[out.index("== numerics:") : out.index("== qualify manifest generate")]
    lines = {line.split(":")[0].strip(): line for line in section.splitlines()[1:] if line}
    assert set(lines) == {"arm-r5", "x86-v4", "x86-v3-1t", "gpu-t4"}
    assert "on this host's CPU, not on the class's CUDAExecutionProvider" in lines["gpu-t4"]
    if shutil.which("qemu-x86_64-static") is None or shutil.which("qemu-aarch64-static") is None:
        need_emulator("qemu-user-static is not installed")
    avx2 = lines["x86-v3-1t"]  # an AVX2-only host computes the class's kernels itself
    assert "on an emulated Haswell (x86_64, QEMU " in avx2 or "whose ISA is the class's" in avx2
    if "on an emulated Haswell" in avx2:
        assert "; this host natively: " in avx2
    if "on an emulated neoverse-n1 (aarch64, QEMU " not in lines["arm-r5"]:
        need_emulator(f"arm-r5 was not emulated: {lines['arm-r5']}")
    assert "; this host natively: " in lines["arm-r5"]


def test_commands_work_from_the_demo_directory_with_defaults(demo: tuple[Path, str]) -> None:
    work, _ = demo
    shown = run_qualify("matrix", "show", "--format", "json", cwd=work)
    assert shown.returncode == 0, shown.stderr
    assert len(json.loads(shown.stdout)) == 8
    verified = run_qualify(
        "manifest", "verify", "manifest.json", "--pubkey", "release.pub", cwd=work
    )
    assert verified.returncode == 0 and "OK" in verified.stdout
    history = run_qualify("manifest", "history", cwd=work)
    assert history.returncode == 0, history.stderr
    assert history.stdout.startswith("v1  digits-demo  published ")
    assert " by demo: the demo's first release" in history.stdout.splitlines()[0]
    refused = run_qualify("run", "--host-class", "arm-r5", cwd=work)
    if os.uname().machine != "aarch64":
        assert refused.returncode == 2 and "--emulate" in refused.stderr


def test_telemetry_check_alerts_on_exactly_the_two_injected_problems(
    demo: tuple[Path, str],
) -> None:
    work, out = demo
    watched = out[out.index("== qualify telemetry check") : out.index("== rollouts:")]
    assert set(re.findall(r"\[critical\] ([\w-]+): (\w+):", watched)) == {
        ("x86-v4", "provider_changed"),
        ("x86-v4", "fallback_appeared"),
        ("x86-v3-1t", "p99_regression"),
    }
    checked = run_qualify("telemetry", "check", "--json", cwd=work)
    assert checked.returncode == 1, checked.stderr  # the day's problems are still in the window
    stale = run_qualify("matrix", "stale", "--json", cwd=work)
    assert stale.returncode == 0 and json.loads(stale.stdout) == {"stale": []}


def test_a_check_after_the_demo_raises_exactly_the_alerts_its_story_injected(
    demo: tuple[Path, str],
) -> None:
    """After three releases' worth of rollouts, hosts on older versions (the rest of a
    25% cohort under v5, a completed rollout's hosts still on its 100% step, the aborted
    canary's hosts) are judged against the version they report: no unexpected digest, no
    lagging warning, only what the story injected."""
    work, out = demo
    provider_class, p99_class = re.findall(
        r"injected: ([\w-]+)'s provider changed after a driver update, ([\w-]+)'s p99", out
    )[0]
    injected = {
        (provider_class, "provider_changed"),  # the day's driver update
        (provider_class, "fallback_appeared"),
        (p99_class, "p99_regression"),  # the day's regression
    }
    if "(skipped: the rollout demo" not in out:  # the aborted rollout's canary fault
        injected |= {(p99_class, "provider_changed"), (p99_class, "fallback_appeared")}
    checked = run_qualify("telemetry", "check", "--json", cwd=work)
    assert checked.returncode == 1, checked.stderr
    doc = json.loads(checked.stdout)
    raised = [(a["host_class"], a["kind"], a["severity"]) for a in doc["alerts"]]
    assert sorted(raised) == sorted((c, k, "critical") for c, k in injected)
    assert doc["skipped"] == []
    assert all(not g["past_deadline"] for c in doc["classes"] for g in c["lagging"])


def test_force_over_a_finished_demo_deletes_everything_it_wrote_and_nothing_else(
    demo: tuple[Path, str], tmp_path: Path
) -> None:
    import shutil

    from qualify.demo.story import MARKER, prepare_workdir

    work, _ = demo
    copy = tmp_path / "demo"
    shutil.copytree(work, copy, symlinks=True)
    again = run_qualify("demo", "--workdir", str(copy), cwd=tmp_path)
    assert again.returncode == 2 and "--force" in again.stderr
    assert prepare_workdir(copy, force=True)  # every entry is one a demo writes
    assert [p.name for p in copy.iterdir()] == [MARKER]


def test_one_rollout_reaches_every_host_and_one_aborts_to_the_rollback_at_a_higher_version(
    demo: tuple[Path, str],
) -> None:
    work, out = demo
    story = out[out.index("== rollouts:") :]
    assert "x86-v4: completed: every host runs int8" in story
    assert "halted: provider_changed" in story
    assert "x86-v3-1t: rollout x86-v3-1t-" in story and "every host goes back to fp32" in story
    signed = json.loads((work / "manifest.json").read_text())["signed"]
    healthy, aborted = signed["entries"]["x86-v4"], signed["entries"]["x86-v3-1t"]
    assert healthy["artifact"]["name"] == "int8" and "rollout" not in healthy
    assert aborted["artifact"]["name"] == "fp32" and "rollout" not in aborted
    assert [r["code"] for r in aborted["reasons"]] == ["rolled_back"]
    # The canary host ran int8 at the start's version, then fp32 at the abort's, higher one,
    # and refused the start's version replayed to it.
    canary = re.findall(r"exit 0, manifest v(\d+), runs (\w+) ", story)
    assert len(canary) == 3, story
    (v_start, first), (v_abort, after), (v_kept, kept) = canary
    assert (first, after, kept) == ("int8", "fp32", "fp32")
    assert int(v_abort) > int(v_start) and v_kept == v_abort == str(signed["version"])
    log = run_qualify("rollout", "log", cwd=work)
    actions = [line.split()[4] for line in log.stdout.splitlines()]
    assert actions == [
        "pin",
        "clear",
        "pin",
        "clear",
        "start",
        "start",
        "advance",
        "complete",
        "halt",
        "abort",
    ]


def test_demo_report_opens_in_a_real_browser_with_every_class_and_chart(
    demo: tuple[Path, str], tmp_path: Path
) -> None:
    work, _ = demo
    done = _run(
        [
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=5000",
            "--dump-dom",
            (work / "report.html").as_uri() + "?charts=all",
        ],
        tmp_path / "profile",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console
    dom = parse(done.stdout)
    sections = dom.find_all("section", "cls")
    assert len(sections) == 4
    charts = dom.find_all("div", "chart")
    assert len(charts) == 4
    assert all(c.find_all("canvas") for c in charts)
    shot = tmp_path / "demo-report.png"
    taken = _run(
        [
            f"--screenshot={shot}",
            "--window-size=1280,2400",
            "--virtual-time-budget=5000",
            (work / "report.html").as_uri(),
        ],
        tmp_path / "profile2",
    )
    assert taken.returncode == 0 and shot.stat().st_size > 50_000
