"""``qualify rollout``: a staged rollout published as a new signed version, the hosts of the
class placed in or out of its cohort by their ids, and an abort that sends every host back to
the rollback package at a higher version, which no host can be made to undo."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import pytest
from click.testing import CliRunner

from manifest import lookup, resolve
from qualify.cli import cli
from qualify.project.load import load_project
from qualify.rollout import parse_steps
from qualify.run import RunOptions, qualify_run
from tests.models import padded_mlp
from tests.qualify.projects import loosen_slowdown, write_project


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("5,25", "last step must be 100"),
        ("25,5,100", "larger than"),
        ("a,b", "whole percent"),
        ("0,100", "larger than"),
    ],
)
def test_bad_steps_are_refused_saying_what_is_wanted(text: str, said: str) -> None:
    from qualify.errors import QualifyError

    with pytest.raises(QualifyError, match=said):
        parse_steps(text)
    assert parse_steps("5, 25,100") == [5, 25, 100]


def _project(tmp_path: Path) -> Path:
    """The small project; a twin may lose a noisy A/B, which is not what these tests are about,
    so the slowdown gate is loosened (`loosen_slowdown`)."""
    project = write_project(tmp_path, [])
    loosen_slowdown(project)
    return project


def _cli(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def _released_then_requalified(tmp_path: Path) -> tuple[Path, list[str], list[str]]:
    """A release that gives here-cpu the baseline (v1), then a candidate that qualifies after
    it: the baseline's graph in other bytes. Returns the matrix and the CLI's project/db and
    key/out arguments.

    The candidate must pass a timed A/B and its p99 budget: the tests that use this run with
    the quiet ones (``make test`` runs them alone), as two of them failed, 2 runs in 4, beside
    make test's other worker ("no candidate qualified")."""
    project = _project(tmp_path)
    db = tmp_path / "m.duckdb"
    qualify_run(load_project(project), "here-cpu", RunOptions(db_path=db))
    _cli("keygen", "k", "--dir", str(tmp_path))
    common = ["--project", str(project), "--db", str(db)]
    key = ["--key", str(tmp_path / "k.key"), "--out", str(tmp_path / "manifest.json")]
    _cli("manifest", "generate", "--publish", "--release", "r1", *key, *common)
    padded_mlp(tmp_path / "models", 0, name="respun")
    project.write_text(
        project.read_text().replace(
            "  candidates:\n    []",
            "  candidates:\n    - {path: models/respun.onnx, precision: fp32}",
        )
    )
    requalified = qualify_run(load_project(project), "here-cpu", RunOptions(db_path=db))
    respun = next(c for c in requalified.bundle.cells if c.artifact_name == "respun")
    assert respun.verdict == "pass", [(r.code, r.message) for r in respun.reasons]
    return db, common, key


@pytest.mark.slow
@pytest.mark.quiet  # its candidate must pass a timed A/B (`_released_then_requalified`)
def test_a_rollout_reaches_its_cohort_and_an_abort_sends_every_host_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db, common, _ = _released_then_requalified(tmp_path)
    manifest = tmp_path / "manifest.json"

    said = _cli(
        "rollout",
        "start",
        "here-cpu",
        "--steps",
        "30,100",
        "--why",
        "canary",
        "--key",
        str(tmp_path / "k.key"),
        "--out",
        str(manifest),
        *common,
    )
    assert "started at 30%" in said and "(v2)" in said
    assert "at 30% (step 1 of 2" in _cli("rollout", "status", "--db", str(db))

    served = {}
    for k in range(60):
        host = f"host-{k}"
        assert (
            resolve.main(
                [
                    "--manifest",
                    str(manifest),
                    "--pubkey",
                    str(tmp_path / "k.pub"),
                    "--host-class",
                    "here-cpu",
                    "--runtime",
                    "onnxruntime==1.32.0",
                    "--providers",
                    "CPUExecutionProvider",
                    "--host-id",
                    host,
                    "--no-state",
                    "--json",
                    "--uri-schemes",
                    "file",
                ]
            )
            == 0
        ), capsys.readouterr().err
        answer = json.loads(capsys.readouterr().out)
        served[host] = (answer["served"], answer["artifact"]["digest"], answer["cohort"]["member"])
    members = [h for h, (how, _, member) in served.items() if member]
    assert 5 <= len(members) <= 35  # about 30% of 60
    assert all(served[h][0] == "rollout" for h in members)
    assert len({served[h][1] for h in members}) == 1
    assert all(how == "artifact" for how, _, member in served.values() if not member)

    # A canary host that accepted v2 keeps its floor; the abort is v3, the rollback package.
    state = tmp_path / "state"
    canary = members[0]
    args = [
        "--manifest",
        str(manifest),
        "--pubkey",
        str(tmp_path / "k.pub"),
        "--host-class",
        "here-cpu",
        "--runtime",
        "onnxruntime==1.32.0",
        "--providers",
        "CPUExecutionProvider",
        "--host-id",
        canary,
        "--state-dir",
        str(state),
        "--json",
        "--uri-schemes",
        "file",
    ]
    assert resolve.main(args) == 0
    capsys.readouterr()
    v2 = manifest.read_bytes()
    said = _cli(
        "rollout",
        "abort",
        "here-cpu",
        "--why",
        "fallback in the canary",
        "--key",
        str(tmp_path / "k.key"),
        "--out",
        str(manifest),
        *common,
    )
    assert "(v3)" in said
    assert resolve.main(args) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["manifest_version"] == 3 and answer["cohort"] is None
    # v1 gave the baseline, which has nothing further to go back to: the abort keeps it
    assert answer["decision"] == "baseline" and answer["rollback"] is None
    old = tmp_path / "old.json"
    old.write_bytes(v2)
    resolve.main([*args[:1], str(old), *args[2:]])  # v2 again, e.g. replayed by an attacker
    replayed = capsys.readouterr()
    answer = json.loads(replayed.out)
    assert "refused" in replayed.err and answer["source"] == "last-known-good"
    assert answer["manifest_version"] == 3  # the floor holds: still the rollback package
    log = _cli("rollout", "log", "--db", str(db))
    assert "start v2 step 1 30%" in log and "abort v3" in log and "fallback in the canary" in log
    assert "[OS user " in log  # the claimed name, and the account beside it


def _events(
    path: Path,
    digest: str,
    nodes: dict[str, int],
    latency_ms: float,
    hosts: list[str],
    side: tuple[str, str] | None = None,
) -> None:
    from datetime import UTC, datetime

    now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    lines = []
    for i in range(700):
        lines.append(
            json.dumps(
                {
                    "format": "qualify-telemetry/1",
                    "time": now,
                    "source": "session",
                    "host_id": hosts[i % len(hosts)],
                    "host_class": "here-cpu",
                    "model_digest": digest,
                    "runtime_revision": "1.32.0",
                    "providers": sorted(nodes),
                    "placement": "actual",
                    "nodes_per_provider": nodes,
                    "fallback_nodes": sum(
                        c for p, c in nodes.items() if p != "CPUExecutionProvider"
                    ),
                    "latency_ms": latency_ms,
                    "manifest_version": 2,
                    **({"rollout": side[0], "cohort": side[1]} if side else {}),
                }
            )
        )
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.slow
@pytest.mark.quiet  # its candidate must pass a timed A/B (`_released_then_requalified`)
def test_a_step_advances_on_healthy_cohort_telemetry_and_halts_on_a_fallback(
    tmp_path: Path,
) -> None:
    db, common, key = _released_then_requalified(tmp_path)
    _cli("rollout", "start", "here-cpu", "--steps", "30,100", *key, *common)

    halted = CliRunner().invoke(cli, ["rollout", "advance", "here-cpu", *key, "--db", str(db)])
    assert halted.exit_code == 1 and "halted: no_data" in halted.output

    new, old, members, rest = _rollout_sides(db)
    healthy = new.nodes
    # Healthy: both sides report the candidate's qualified p50. The two qualified p50s are both
    # measured, and the loosened slowdown gate lets the twin qualify slower by noise alone
    # (CI once measured 0.0112 against 0.00766 ms), which the cohort check rightly halts on.
    _events(tmp_path / "ok.jsonl", new.digest, healthy, new.p50_ms, members)
    _events(tmp_path / "rest.jsonl", old.digest, old.nodes, new.p50_ms, rest)
    _cli(
        "telemetry",
        "ingest",
        str(tmp_path / "ok.jsonl"),
        str(tmp_path / "rest.jsonl"),
        "--db",
        str(db),
    )
    said = _cli("rollout", "advance", "here-cpu", *key, "--db", str(db))
    assert "advanced to 100% (step 2 of 2) (v3)" in said and "cohort: 1400 events" in said

    broken = {**healthy, "AzureExecutionProvider": 2}
    _events(tmp_path / "bad.jsonl", new.digest, broken, new.p50_ms, members)
    _cli("telemetry", "ingest", str(tmp_path / "bad.jsonl"), "--db", str(db))
    halted = CliRunner().invoke(cli, ["rollout", "advance", "here-cpu", *key, "--db", str(db)])
    assert halted.exit_code == 1, halted.output
    assert (
        "halted: fallback_appeared" in halted.output or "halted: provider_changed" in halted.output
    )
    _cli("rollout", "abort", "here-cpu", "--why", "fallback in the canary", *key, *common)
    log = _cli("rollout", "log", "--db", str(db))
    assert [line.split()[4] for line in log.splitlines()] == [
        "start",
        "halt",
        "advance",
        "halt",
        "abort",
    ]
    report = tmp_path / "report.html"
    _cli("report", "--out", str(report), *common)
    page = report.read_text()
    assert "Rollout history" in page
    history = page[
        page.index('id="rollouts"') : page.index("</section>", page.index('id="rollouts"'))
    ]
    assert [a for a in ("start", "halt", "advance", "abort") if f">{a}</td>" in history] == [
        "start",
        "halt",
        "advance",
        "abort",
    ]
    assert "cohort: 1400 events" in history and "fallback_appeared" in history


@pytest.mark.slow
@pytest.mark.quiet  # its candidate must pass a timed A/B (`_released_then_requalified`)
def test_a_cohort_slower_than_the_rest_halts_unless_the_tolerance_allows_the_slowdown(
    tmp_path: Path,
) -> None:
    db, common, key = _released_then_requalified(tmp_path)
    _cli("rollout", "start", "here-cpu", "--steps", "30,100", *key, *common)
    new, old, members, rest = _rollout_sides(db)
    # The cohort at 1.5 times the rest's latency, which is the candidate's qualified p50: over the
    # rest's p99 by more than the default 20%, within the qualified bound times 2.
    _events(tmp_path / "cohort.jsonl", new.digest, new.nodes, 1.5 * new.p50_ms, members)
    _events(tmp_path / "rest.jsonl", old.digest, old.nodes, new.p50_ms, rest)
    files = [str(tmp_path / "cohort.jsonl"), str(tmp_path / "rest.jsonl")]
    _cli("telemetry", "ingest", *files, "--db", str(db))
    args = ["rollout", "advance", "here-cpu", *key, "--db", str(db)]

    halted = CliRunner().invoke(cli, args)
    assert halted.exit_code == 1, halted.output
    assert "halted: slower than the rest" in halted.output

    refused = CliRunner().invoke(cli, [*args, "--tolerance", "-1"])
    assert refused.exit_code == 2 and "--tolerance -1.0" in refused.output

    said = _cli(*args, "--tolerance", "1.0")
    assert "advanced to 100% (step 2 of 2)" in said, said


class _Side(NamedTuple):
    """What a host of one side of the rollout reports: its artifact, placement and latency."""

    digest: str
    nodes: dict[str, int]
    p50_ms: float


def _rollout_sides(db: Path) -> tuple[_Side, _Side, list[str], list[str]]:
    """The respun candidate's and the baseline's qualified sides, and which of 200 hosts are in
    the 30% cohort of the rollout in progress and which are the rest."""
    from matrix.store import Store

    with Store.open(db, read_only=True) as store:
        cells = {c.artifact_name: c for c in store.latest_cells()}
    new, old = cells["respun"], cells["identity_mlp"]
    assert new.placement is not None and old.placement is not None
    members = [f"h{k}" for k in range(200) if lookup.cohort_point(_rollout_id(db), f"h{k}") < 30]
    return (
        _Side(new.artifact_digest, new.placement.nodes_per_provider, new.latency[0].p50_ms),
        _Side(old.artifact_digest, old.placement.nodes_per_provider, old.latency[0].p50_ms),
        members,
        [f"h{k}" for k in range(200) if f"h{k}" not in members],
    )


def _rollout_id(db: Path) -> str:
    from matrix.store import Store

    with Store.open(db, read_only=True) as store:
        return str(store.rollout_log()[0]["rollout_id"])


def _entry(manifest: Path) -> dict[str, object]:
    entry: dict[str, object] = json.loads(manifest.read_text())["signed"]["entries"]["here-cpu"]
    return entry


@pytest.mark.quiet  # its candidate must pass a timed A/B (`_released_then_requalified`)
def test_a_release_keeps_a_class_in_rollout_held_or_pinned_until_it_is_cleared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db, common, key = _released_then_requalified(tmp_path)
    manifest = tmp_path / "manifest.json"
    release = ["manifest", "generate", "--publish", "--release", "r2", *key, *common]
    _cli("rollout", "start", "here-cpu", "--steps", "10,100", *key, *common)
    assert "[kept: rollout here-cpu-" in _cli(*release)  # not jumped to 100% by a release
    assert _entry(manifest).get("rollout") is not None

    per_class = ["--per-class", str(tmp_path / "manifest.d")]
    with monkeypatch.context() as patch:  # as if the fleet were past what hosts read whole
        patch.setattr("manifest.envelope.MAX_BYTES", 2000)
        said = _cli(
            "rollout", "hold", "here-cpu", "--why", "incident 42", *key, *per_class, "--db", str(db)
        )
    assert "held (rollout here-cpu-" in said and "stopped at 10%" in said
    assert "resolve-artifact reads by default: serve hosts the per-class documents written" in said
    held = _entry(manifest)
    assert held["decision"] == "hold" and held.get("rollout") is None
    assert [r["code"] for r in held["reasons"]] == ["held"]  # type: ignore[attr-defined]
    assert "held by" in _cli("rollout", "status", "--db", str(db))
    version = json.loads(manifest.read_text())["signed"]["version"]
    assert (tmp_path / "manifest.d" / "current").read_text() == f"v{version}\n"
    document = json.loads((tmp_path / "manifest.d" / f"v{version}" / "here-cpu.json").read_text())
    assert document["signed"]["entry"]["decision"] == "hold"
    refused = CliRunner().invoke(cli, ["rollout", "start", "here-cpu", *key, *common])
    assert refused.exit_code == 2 and "rollout clear here-cpu" in refused.output
    assert "[kept: held by" in _cli(*release)
    assert _entry(manifest)["decision"] == "hold"

    _cli("rollout", "clear", "here-cpu", "--why", "resolved", "--db", str(db))
    _cli(*release)
    assert _entry(manifest)["decision"] == "candidate"  # the matrix decides it again

    baseline = _entry(manifest)["rollback"]["name"]  # type: ignore[index]
    wrong = CliRunner().invoke(
        cli, ["rollout", "pin", "here-cpu", "--artifact", "nope", "--why", "x", *key, *common]
    )
    assert wrong.exit_code == 2 and "not 'nope'" in wrong.output
    said = _cli(
        "rollout", "pin", "here-cpu", "--artifact", str(baseline), "--why", "audit", *key, *common
    )
    assert f"pinned to {baseline}" in said
    assert _cli(*release).count(f"[kept: pinned to {baseline} by") == 1
    pinned = _entry(manifest)
    assert pinned["decision"] == "baseline" and pinned["artifact"]["name"] == baseline  # type: ignore[index]
    log = _cli("rollout", "log", "--db", str(db))
    assert [line.split()[4] for line in log.splitlines()] == ["start", "hold", "clear", "pin"]
    cleared = CliRunner().invoke(
        cli, ["rollout", "clear", "here-cpu", "--why", "x", "--db", str(db)]
    )
    assert cleared.exit_code == 0
    again = CliRunner().invoke(cli, ["rollout", "clear", "here-cpu", "--why", "x", "--db", str(db)])
    assert again.exit_code == 2 and "neither held nor pinned" in again.output


@pytest.mark.slow
@pytest.mark.quiet  # its candidate must pass a timed A/B (`_released_then_requalified`)
def test_hosts_that_say_they_are_in_the_canary_are_judged_as_the_canary(tmp_path: Path) -> None:
    db, common, key = _released_then_requalified(tmp_path)
    _cli("rollout", "start", "here-cpu", "--steps", "30,100", *key, *common)
    rid = _rollout_id(db)
    _, old, members, _ = _rollout_sides(db)
    # The canary's hosts say they are in it, yet run the current artifact: not switched.
    stuck = tmp_path / "stuck.jsonl"
    _events(stuck, old.digest, old.nodes, old.p50_ms, members, (rid, "canary"))
    _cli("telemetry", "ingest", str(stuck), "--db", str(db))
    halted = CliRunner().invoke(cli, ["rollout", "advance", "here-cpu", *key, "--db", str(db)])
    assert halted.exit_code == 1 and "halted: canary_not_switched" in halted.output, halted.output


def test_who_ran_a_rollout_is_recorded_as_a_claim_with_the_os_user_beside_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import os
    import pwd

    from qualify.rollout import actor

    account = pwd.getpwuid(os.geteuid()).pw_name
    for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        monkeypatch.setenv(name, "the-release-manager")
    # $USER is whatever the environment says: the account that really ran it stands beside it.
    assert actor() == f"the-release-manager [OS user {account}]"
    for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        monkeypatch.delenv(name)
    assert actor().endswith(f"[OS user {account}]")
