"""One product's life, told as a platform team lives it: two models (``tiny`` and ``digits``)
served by the same hosts, each with its own project file and matrix, over several releases.

The story: release 1 of both; a rollout of tiny's candidate halted for want of telemetry and
aborted while one host sleeps through a version and another lags; digits' budget tightened in
its project file (once to a value the evidence still meets, once below it); digits' candidate
re-exported in place (same path, new bytes) and measured again; a publish of each model killed
with SIGKILL (one after its commit point, one before). After every step it asks what a team
asks: ``qualify matrix show``, ``qualify matrix stale``, the release gate, ``qualify manifest
generate``, what ``resolve-artifact`` serves the hosts (one state directory per host, both
models in it) and what ``qualify telemetry check`` says of the events those hosts wrote (one
telemetry file for both models, ingested into both matrices).

Runs go through the scripted-worker seam (``tests/qualify/scripted.py``) on real tiny models, real
DuckDB files, real Ed25519 keys, the real CLI and the real ``resolve-artifact``.
"""

from __future__ import annotations

import io
import json
import re
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
import pytest
from click.testing import CliRunner

from manifest import lookup, resolve
from qualify.cli import cli
from qualify.project.load import load_project
from qualify.run import RunOptions, qualify_run
from tests.qualify.lab import Lab, killed_at
from tests.qualify.projects import write_project
from tests.qualify.scripted import CPU, Script, ScriptedWorkers, digest_of

pytestmark = pytest.mark.slow

CLASS = "here-cpu"
BASELINE = "identity_mlp"
CANDIDATE = "classifier"
FALLBACK = Script(placement={CPU: 7, "CUDAExecutionProvider": 3})
"""A candidate that falls back off the class's expected provider: it fails the class."""
HOSTS = [f"h{i:02d}" for i in range(24)]


def _one_class(project: Path, model: str) -> None:
    """The project of `tests.qualify.projects` with only the class this host is of (the others
    have no hosts, whose telemetry would be ``no_data``), under model line ``model``."""
    text = project.read_text()
    text = text[: text.index("  lost-gpu:")].replace("model: tiny", f"model: {model}")
    project.write_text(text)


@dataclass
class Team(Lab):
    """One model's project, matrix and published files (`Lab`'s), its key shared with the other
    model's team, driven through the CLI."""

    model: str
    key: Path
    scripts: dict[str, Script] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)
    """The artifact name each digest measured had (``name@2`` for a file's second bytes)."""

    def file(self, name: str) -> Path:
        return self.root / "models" / f"{name}.onnx"

    def args(self, *args: str) -> list[str]:
        """``args`` with this team's project, matrix, key and files where the command takes
        them (as the team's shell scripts would pass them)."""
        command = tuple(args[:2])
        extra = ["--db", str(self.db)]
        if command in {
            ("matrix", "show"),
            ("matrix", "stale"),
            ("matrix", "gate"),
            ("manifest", "generate"),
            ("rollout", "start"),
            ("rollout", "abort"),
            ("rollout", "advance"),
        }:
            extra += ["--project", str(self.project)]
        publishing = command[0] == "rollout" and command[1] in {"start", "abort", "advance"}
        if publishing or "--publish" in args:
            extra += ["--key", str(self.key), "--per-class", str(self.per_class)]
            extra += [] if "--out" in args else ["--out", str(self.manifest)]
        return [*args, *extra]

    def run(self, **scripts: Script) -> None:
        """``qualify run --host-class here-cpu``, each artifact behaving as its script says."""
        for name, script in scripts.items():
            digest = digest_of(self.file(name))
            self.scripts[digest] = script
            earlier = sum(n.split("@")[0] == name for n in self.names.values())
            self.names.setdefault(digest, f"{name}@{earlier + 1}" if earlier else name)
        outcome = qualify_run(
            load_project(self.project),
            CLASS,
            RunOptions(db_path=self.db, measure_alone=False),
            workers=ScriptedWorkers(dict(self.scripts)).seam(),
        )
        assert outcome.written

    # -- what the commands say --------------------------------------------------------------

    def shown(self) -> dict[str, str]:
        """``matrix show --format json``: artifact -> its verdict on here-cpu now."""
        rows = json.loads(self.cli("matrix", "show", "--format", "json"))
        return {r["artifact_name"]: r["verdict"] for r in rows if r["host_class"] == CLASS}

    def stale(self) -> list[tuple[str, str]]:
        found = json.loads(self.cli("matrix", "stale", "--json"))["stale"]
        return [(i["artifact_name"], i["reason"]) for i in found]

    def gate(self) -> tuple[int, str]:
        result = CliRunner().invoke(cli, self.args("matrix", "gate"), catch_exceptions=False)
        return result.exit_code, result.output

    def generate(self, release: str, *, publish: bool = False) -> tuple[str, str | None, str]:
        """``manifest generate``: a draft (beside the published file), or published; here-cpu's
        decision, artifact and what the command said."""
        out = self.manifest if publish else self.root / f"{release}.draft.json"
        args = ["manifest", "generate", "--release", release, "--out", str(out)]
        said = self.cli(*args, *(["--publish"] if publish else []))
        entry = json.loads(out.read_text())["signed"]["entries"][CLASS]
        return entry["decision"], (entry["artifact"] or {}).get("name"), said

    def version(self) -> int:
        """The version of the published manifest file."""
        return int(json.loads(self.manifest.read_bytes())["signed"]["version"])

    def edit(self, old: str, new: str) -> None:
        """Edit the project file as a person would."""
        text = self.project.read_text()
        assert old in text
        self.project.write_text(text.replace(old, new, 1))

    def entry(self) -> dict[str, Any]:
        """here-cpu's entry in the published manifest file."""
        found: dict[str, Any] = json.loads(self.manifest.read_bytes())["signed"]["entries"][CLASS]
        return found

    def telemetry(self, events: Path) -> dict[str, Any]:
        """Ingest the fleet's telemetry file, then ``telemetry check --json``: its answer, with
        the exit code under ``"exit"``."""
        self.cli("telemetry", "ingest", str(events))
        result = CliRunner().invoke(
            cli, self.args("telemetry", "check", "--json"), catch_exceptions=False
        )
        assert result.exit_code in (0, 1), result.output
        found: dict[str, Any] = json.loads(result.output)
        found["exit"] = result.exit_code
        return found

    def killed_at(self, instant: str, *args: str) -> None:
        """Run ``qualify ARGS`` in a real process and SIGKILL it at the named instant of its
        publication (``qualify.release.publishing.PAUSE_ENV``)."""
        killed_at(instant, self.args(*args), cwd=self.root)


def alerts(check: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(a["host_class"], a["kind"], a["severity"]) for a in check["alerts"]]


def lagging(check: dict[str, Any]) -> list[tuple[int, int, int, bool]]:
    [state] = [s for s in check["classes"] if s["host_class"] == CLASS]
    return [
        (g["version"], g["newer_version"], g["hosts"], g["past_deadline"]) for g in state["lagging"]
    ]


@dataclass
class Fleet:
    """The hosts of here-cpu: each serves both models, with one resolve-artifact state directory
    for both, and appends its telemetry to one file per step."""

    root: Path
    step: int = 0

    @property
    def events(self) -> Path:
        return self.root / "telemetry" / f"step-{self.step}.jsonl"

    def next_step(self) -> Path:
        """A new telemetry file for the hosts' next resolves; returns it."""
        self.step += 1
        self.events.parent.mkdir(parents=True, exist_ok=True)
        self.events.touch()
        return self.events

    def resolve(self, host: str, team: Team, *, source: Path | None = None) -> tuple[int, Any, str]:
        """``resolve-artifact`` on ``host`` for ``team``'s model: exit code, its JSON answer
        (None when it printed none) and what it said on stderr."""
        argv = [
            "--manifest", str(source or team.per_class), "--pubkey", str(team.key.with_suffix(".pub")),
            "--model", team.model, "--host-class", CLASS, "--host-id", host,
            "--runtime", "onnxruntime==1.32.0", "--providers", CPU, "--uri-schemes", "file",
            "--state-dir", str(self.root / "hosts" / host), "--emit-telemetry", str(self.events),
            "--json",
        ]  # fmt: skip
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            code = resolve.main(argv)
        return code, json.loads(out.getvalue()) if out.getvalue().strip() else None, err.getvalue()

    def serve(self, team: Team, hosts: list[str]) -> dict[str, tuple[int, int, str | None]]:
        """Each host resolves ``team``'s model: host -> (exit code, version, artifact name)."""
        found = {}
        for host in hosts:
            code, answer, err = self.resolve(host, team)
            assert answer is not None, (host, code, err)
            artifact = answer["artifact"]
            name = team.names.get(artifact["digest"], artifact["digest"]) if artifact else None
            found[host] = (code, answer["manifest_version"], name)
        return found


@pytest.fixture
def story(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Team, Team, Fleet]:
    for var in ("QUALIFY_PUBKEY", "QUALIFY_STATE_DIR", "QUALIFY_MODEL", "QUALIFY_PROVIDERS"):
        monkeypatch.delenv(var, raising=False)
    keys = CliRunner().invoke(cli, ["keygen", "release", "--dir", str(tmp_path)])
    assert keys.exit_code == 0, keys.output
    key = tmp_path / "release.key"  # one platform team signs both models
    teams = []
    for model in ("tiny", "digits"):
        write_project(tmp_path / model, [CANDIDATE])
        _one_class(tmp_path / model / "qualify.yaml", model)
        teams.append(Team(tmp_path / model, model, key))
    return teams[0], teams[1], Fleet(tmp_path / "fleet")


def test_two_models_on_the_same_hosts_over_several_releases_get_one_answer_everywhere(
    story: tuple[Team, Team, Fleet],
) -> None:
    tiny, digits, fleet = story

    # -- Release 1 of both models ----------------------------------------------------------
    # tiny's candidate falls back off the CPU provider: here-cpu gets the baseline.
    tiny.run(**{BASELINE: Script(), CANDIDATE: FALLBACK})
    assert tiny.shown() == {BASELINE: "pass", CANDIDATE: "fail"}
    assert tiny.stale() == []
    code, said = tiny.gate()
    assert code == 0, said
    assert tiny.generate("tiny-1", publish=True)[:2] == ("baseline", BASELINE)
    # digits' candidate qualifies: here-cpu gets it.
    digits.run(**{BASELINE: Script(latency_s=0.004), CANDIDATE: Script()})
    assert digits.shown() == {BASELINE: "pass", CANDIDATE: "pass"}
    assert digits.stale() == []
    assert digits.gate()[0] == 0
    assert digits.generate("digits-1", publish=True)[:2] == ("candidate", CANDIDATE)
    # Every host serves both, one state directory each: neither model's floor refuses the other.
    fleet.next_step()
    assert set(fleet.serve(tiny, HOSTS).values()) == {(0, 1, BASELINE)}
    assert set(fleet.serve(digits, HOSTS).values()) == {(0, 1, CANDIDATE)}
    for team, other in ((tiny, digits), (digits, tiny)):
        check = team.telemetry(fleet.events)
        assert (check["exit"], alerts(check), lagging(check)) == (0, [], []), check
        assert check["versions"] == [1] and check["events"] == len(HOSTS)
        assert [(s["model"], s["hosts"]) for s in check["skipped"]] == [(other.model, len(HOSTS))]

    # -- tiny, release 2: a rollout halted, then aborted -----------------------------------
    tiny.run(**{CANDIDATE: Script()})  # the candidate's fallback is fixed
    assert tiny.shown() == {BASELINE: "pass", CANDIDATE: "pass"}
    assert tiny.stale() == []
    assert tiny.gate()[0] == 0
    assert tiny.generate("tiny-2-draft")[:2] == ("candidate", CANDIDATE)
    said = tiny.cli("rollout", "start", CLASS, "--steps", "30,100")
    rollout, v_start = tiny.entry()["rollout"], tiny.version()
    assert f"{CANDIDATE} started at 30% (v{v_start})" in said
    # The entry says why the rest stay on the baseline now, not why release 1 chose it.
    assert [r["code"] for r in tiny.entry()["reasons"]][:2] == [
        "rollout_in_progress",
        "candidate_passed",
    ]
    canary = [h for h in HOSTS if lookup.cohort_point(rollout["id"], h) < rollout["percent"]]
    rest = [h for h in HOSTS if h not in canary]
    assert len(canary) > 1 and len(rest) > 1
    asleep, laggard = rest[-1], canary[-1]  # one host sleeps through v2, one through v3
    fleet.next_step()
    served = fleet.serve(tiny, [h for h in HOSTS if h != asleep])
    assert {served[h] for h in canary} == {(0, v_start, CANDIDATE)}
    assert {served[h] for h in rest if h != asleep} == {(0, v_start, BASELINE)}
    said = tiny.cli("rollout", "advance", CLASS, code=1)  # before the canary's telemetry is in
    assert "halted: no_data" in said
    # A routine release keeps the halted rollout, and says why in its own words.
    decision, artifact, said = tiny.generate("tiny-2-draft-2")
    assert (decision, artifact) == ("baseline", BASELINE)
    assert "halted at 30% (no_data" in said and "no candidate qualified" not in said, said
    assert "HALTED (no_data" in tiny.cli("rollout", "status")
    assert tiny.shown() == {BASELINE: "pass", CANDIDATE: "pass"} and tiny.stale() == []
    assert tiny.gate()[0] == 0
    check = tiny.telemetry(fleet.events)
    # The canary runs the rollout's artifact its version assigns it; the host asleep on v1 runs
    # what v{v_start} would give it too: nothing to alert on, nobody lagging.
    assert (check["exit"], alerts(check), lagging(check)) == (0, [], []), check
    assert check["versions"] == [1, v_start]

    said = tiny.cli("rollout", "abort", CLASS, "--why", "provider change in the canary")
    v_abort = tiny.version()
    assert f"every host goes back to {BASELINE}" in said
    fleet.next_step()
    served = fleet.serve(tiny, [h for h in HOSTS if h != laggard])
    # The host that slept through v{v_start} takes v{v_abort} straight from v1.
    assert set(served.values()) == {(0, v_abort, BASELINE)}
    check = tiny.telemetry(fleet.events)
    # The laggard still runs the canary's artifact under v{v_start}: lagging (within the
    # propagation deadline, so reported, not alerted), never an unexpected digest.
    assert (check["exit"], alerts(check)) == (0, []), check
    assert lagging(check) == [(v_start, v_abort, 1, False)]
    decision, artifact, said = tiny.generate("tiny-3-draft")
    assert (decision, artifact) == ("baseline", BASELINE)
    assert "aborted by" in said and "until qualify rollout clear here-cpu" in said
    assert tiny.shown() == {BASELINE: "pass", CANDIDATE: "pass"} and tiny.stale() == []
    assert tiny.gate()[0] == 0

    # -- digits: the budget tightened in its project file ----------------------------------
    digits.edit("p99_ms: 50", "p99_ms: 5")  # still above what both measured (2 and 4 ms)
    assert digits.shown() == {BASELINE: "pass", CANDIDATE: "pass"} and digits.stale() == []
    assert digits.gate()[0] == 0
    assert digits.generate("digits-2-draft")[:2] == ("candidate", CANDIDATE)
    digits.edit("p99_ms: 5", "p99_ms: 0.5")  # below both: the evidence answers, a fail
    shown = digits.cli("matrix", "show")
    assert digits.shown() == {BASELINE: "fail", CANDIDATE: "fail"}, shown
    assert "/0.500 ms" in shown and "pass p99" not in shown
    assert digits.stale() == []
    code, said = digits.gate()
    assert code == 3 and "supports only hold" in said, said
    assert digits.generate("digits-2-draft-2")[:2] == ("hold", None)
    # Nothing was published: the hosts keep serving v1, and their telemetry is as qualified.
    fleet.next_step()
    assert set(fleet.serve(digits, HOSTS).values()) == {(0, 1, CANDIDATE)}
    check = digits.telemetry(fleet.events)
    assert (check["exit"], alerts(check), lagging(check)) == (0, [], []), check
    digits.edit("p99_ms: 0.5", "p99_ms: 5")

    # -- digits: the candidate re-exported in place (same path, new bytes) ------------------
    model = onnx.load(digits.file(CANDIDATE))
    model.doc_string = "re-exported with another exporter"
    onnx.save(model, digits.file(CANDIDATE))
    shown = digits.cli("matrix", "show")
    assert re.search(
        rf"gap: {CLASS} x {CANDIDATE}: never run on this class's key as its file is now", shown
    ), shown
    assert digits.shown() == {BASELINE: "pass"}
    assert digits.stale() == [(CANDIDATE, "artifact_changed")]
    code, said = digits.gate()
    assert code == 3 and "regressed" in said and f"candidate {CANDIDATE}" in said, said
    assert digits.generate("digits-2-draft-3")[:2] == ("baseline", BASELINE)
    fleet.next_step()  # the hosts still run the bytes v1 names: nothing is wrong there
    assert set(fleet.serve(digits, HOSTS).values()) == {(0, 1, CANDIDATE)}
    check = digits.telemetry(fleet.events)
    assert (check["exit"], alerts(check), lagging(check)) == (0, [], []), check

    digits.run(**{CANDIDATE: Script()})  # release 2 measures the new bytes
    assert digits.shown() == {BASELINE: "pass", CANDIDATE: "pass"} and digits.stale() == []
    assert digits.gate()[0] == 0
    assert digits.generate("digits-2", publish=True)[:2] == ("candidate", CANDIDATE)
    v2 = digits.version()
    # Its rollback is what the class ran before: v1's bytes of the candidate, which hosts ran.
    assert digits.names[digits.entry()["rollback"]["digest"]] == CANDIDATE
    fleet.next_step()
    early = HOSTS[: len(HOSTS) // 2]
    assert set(fleet.serve(digits, early).values()) == {(0, v2, f"{CANDIDATE}@2")}
    check = digits.telemetry(fleet.events)
    # Half the hosts still run v1's bytes: lagging, reported, never an unexpected digest.
    assert (check["exit"], alerts(check)) == (0, []), check
    assert lagging(check) == [(1, v2, len(HOSTS) - len(early), False)]
    # and tiny's line is untouched by all of it
    assert set(fleet.serve(tiny, HOSTS).values()) == {(0, v_abort, BASELINE)}

    # -- tiny, release 3: the abort cleared, a publish killed after its commit point ---------
    said = tiny.cli("rollout", "clear", CLASS, "--why", "driver fixed")
    assert "cleared" in said
    assert tiny.gate()[0] == 0
    v_new = v_abort + 2  # v_abort + 1 is the draft tiny-3-draft reserved
    tiny.killed_at("written", "manifest", "generate", "--release", "tiny-3", "--publish")
    # The manifest file is written (a host reading it takes v_new); the per-class pointer hosts
    # read has not moved; the matrix knows a publication was interrupted.
    assert tiny.version() == v_new and tiny.entry()["decision"] == "candidate"
    assert (tiny.per_class / "current").read_text() == f"v{v_abort}\n"
    assert "was interrupted" in tiny.cli("rollout", "status")
    fleet.next_step()
    assert set(fleet.serve(tiny, HOSTS[1:]).values()) == {(0, v_abort, BASELINE)}
    code, answer, err = fleet.resolve(HOSTS[0], tiny, source=tiny.manifest)
    assert (code, answer["manifest_version"]) == (0, v_new), err
    assert tiny.names[answer["artifact"]["digest"]] == CANDIDATE
    assert tiny.shown() == {BASELINE: "pass", CANDIDATE: "pass"} and tiny.stale() == []
    check = tiny.telemetry(fleet.events)
    # The host that read the file runs what v_new gives it: judged against v_new (hosts may
    # run it; the next command completes it), and the rest are behind it, not wrong.
    assert (check["exit"], alerts(check)) == (0, []), check
    assert check["manifest_version"] == v_new
    assert lagging(check) == [(v_abort, v_new, len(HOSTS) - 1, False)]
    # The next command completes the interrupted publication and says so.
    decision, artifact, said = tiny.generate("tiny-4-draft")
    assert f"recovered: completed the interrupted publication of manifest v{v_new}" in said
    assert (decision, artifact) == ("candidate", CANDIDATE)
    assert "was interrupted" not in tiny.cli("rollout", "status")
    assert (tiny.per_class / "current").read_text() == f"v{v_new}\n"
    fleet.next_step()
    assert set(fleet.serve(tiny, HOSTS).values()) == {(0, v_new, CANDIDATE)}
    assert tiny.entry()["rollback"]["name"] == BASELINE
    check = tiny.telemetry(fleet.events)
    assert (check["exit"], alerts(check), lagging(check)) == (0, [], []), check
    assert tiny.gate()[0] == 0

    # -- tiny: the workload changed in its project file -------------------------------------
    tiny.edit("concurrency: [1, 2]", "concurrency: [1, 2, 4]")
    assert tiny.shown() == {BASELINE: "stale", CANDIDATE: "stale"}
    assert sorted(tiny.stale()) == [(CANDIDATE, "workload_changed"), (BASELINE, "workload_changed")]
    code, said = tiny.gate()  # no evidence under this workload: nothing to release on
    assert code == 3 and "supports only hold" in said, said
    decision, artifact, said = tiny.generate("tiny-4-draft-2")
    assert (decision, artifact) == ("hold", None) and "workload_changed" in said, said
    fleet.next_step()  # nothing was published: the hosts run v_new, as telemetry says
    assert set(fleet.serve(tiny, HOSTS).values()) == {(0, v_new, CANDIDATE)}
    check = tiny.telemetry(fleet.events)
    assert (check["exit"], alerts(check), lagging(check)) == (0, [], []), check
    tiny.run(**{BASELINE: Script(), CANDIDATE: Script()})  # measured under the new workload
    assert tiny.shown() == {BASELINE: "pass", CANDIDATE: "pass"} and tiny.stale() == []
    assert tiny.gate()[0] == 0
    assert tiny.generate("tiny-4-draft-3")[:2] == ("candidate", CANDIDATE)

    # -- digits, release 3: a publish killed before its commit point ------------------------
    digits.killed_at("staged", "manifest", "generate", "--release", "digits-3", "--publish")
    assert digits.version() == v2  # nothing a host reads changed
    assert (digits.per_class / "current").read_text() == f"v{v2}\n"
    assert "was interrupted" in digits.cli("rollout", "status")
    assert digits.shown() == {BASELINE: "pass", CANDIDATE: "pass"} and digits.stale() == []
    assert digits.gate()[0] == 0
    decision, artifact, said = digits.generate("digits-3-draft")
    found = re.search(r"recovered: discarded the interrupted publication of manifest v(\d+)", said)
    assert found is not None and int(found[1]) > v2, said
    assert (decision, artifact) == ("candidate", CANDIDATE)
    assert "was interrupted" not in digits.cli("rollout", "status")
    assert not (digits.per_class / f"v{found[1]}").exists()  # its staged set is gone
    fleet.next_step()
    assert set(fleet.serve(digits, HOSTS).values()) == {(0, v2, f"{CANDIDATE}@2")}
    check = digits.telemetry(fleet.events)
    assert (check["exit"], alerts(check), lagging(check)) == (0, [], []), check
