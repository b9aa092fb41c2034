"""Publishing is a transaction (``qualify.release.publishing``): a publishing command killed with SIGKILL
at every named instant, or failing, leaves the matrix's record and the published files in
agreement, and the next command completes or discards what was interrupted and says which.
And ``--per-class DIR`` deletes only what qualify wrote there, refusing a directory holding
anything else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from manifest import perclass
from manifest.errors import BuildError
from manifest.perclass import MARKER
from matrix.store import Store
from tests.qualify.lab import Lab, make_lab

INSTANTS = ("recorded", "staged", "written", "pointed")
COMMITTED = {"written", "pointed"}  # the manifest file hosts read already holds the version


def _per_class(lab: Lab) -> list[str]:
    return ["--per-class", str(lab.per_class)]


def _prepare(lab: Lab, command: str) -> list[str]:
    """What ``command`` needs before it runs, and its arguments."""
    if command == "manifest publish":
        draft = lab.root / "manifest.draft.json"
        lab.cli("manifest", "generate", "--release", "r2", "--out", str(draft))
        return ["manifest", "publish", str(draft), *_per_class(lab)]
    if command == "manifest generate --publish":
        return ["manifest", "generate", "--publish", "--release", "r2", *_per_class(lab)]
    if command == "rollout start":
        return ["rollout", "start", "here-cpu", "--steps", "30,100", *_per_class(lab)]
    if command == "rollout abort":
        lab.cli("rollout", "start", "here-cpu", "--steps", "30,100", *_per_class(lab))
        return ["rollout", "abort", "here-cpu", "--why", "canary", *_per_class(lab)]
    if command == "rollout hold":
        return ["rollout", "hold", "here-cpu", "--why", "incident 42", *_per_class(lab)]
    assert command == "rollout pin"
    pin = ["rollout", "pin", "here-cpu", "--artifact", "identity_mlp", "--why", "audit"]
    return [*pin, *_per_class(lab)]


def assert_record_and_files_agree(lab: Lab) -> int:
    """The invariant: what hosts can read is what the matrix records as current, and every
    version the per-class directory holds was published; returns the current version."""
    current = lab.published()
    assert current is not None
    version, signed = current
    assert json.loads(lab.manifest.read_bytes())["signed"] == signed
    assert (lab.per_class / "current").read_text() == f"v{version}\n"
    with Store.open(lab.db, read_only=True) as db:
        for folder in lab.per_class.glob("v*"):
            assert db.manifest_state(int(folder.name[1:])) == "published", folder
        assert db.latest_draft() is None or db.latest_draft()[0] > version  # type: ignore[index]
    return version


@pytest.mark.slow
@pytest.mark.parametrize("instant", INSTANTS)
@pytest.mark.parametrize(
    "command",
    [
        "manifest publish",
        "manifest generate --publish",
        "rollout start",
        "rollout abort",
        "rollout hold",
        "rollout pin",
    ],
)
def test_a_publishing_command_killed_at_any_instant_is_completed_or_discarded_next(
    tmp_path: Path, command: str, instant: str
) -> None:
    lab = make_lab(tmp_path / "lab")
    args = _prepare(lab, command)
    before = assert_record_and_files_agree(lab)
    log_before = lab.log()
    with Store.open(lab.db, read_only=True) as db:
        reserved = db.highest_manifest_version() + (0 if command == "manifest publish" else 1)

    lab.killed_at(instant, *args)
    status = lab.cli("rollout", "status")
    assert f"v{reserved} ({command}" in status
    assert "was interrupted" in status
    said = lab.cli("manifest", "generate", "--release", "routine")  # the next command

    version = assert_record_and_files_agree(lab)
    if instant in COMMITTED:
        assert f"recovered: completed the interrupted publication of manifest v{reserved}" in said
        assert version == reserved
        if command.startswith("rollout"):
            assert lab.log()[-1] == (command.split()[1], reserved)
    else:
        assert f"recovered: discarded the interrupted publication of manifest v{reserved}" in said
        assert version == before and lab.log() == log_before
        with Store.open(lab.db, read_only=True) as db:
            state = db.manifest_state(reserved)
        assert state == ("draft" if command == "manifest publish" else "discarded")
        assert not (lab.per_class / f"v{reserved}").exists()
    assert "was interrupted" not in lab.cli("rollout", "status")
    # and the story goes on: the next publish works and agrees too
    lab.cli("manifest", "publish", *_per_class(lab))
    assert assert_record_and_files_agree(lab) > version


def test_a_rollout_step_that_cannot_write_its_file_publishes_nothing_and_ships_nothing_later(
    tmp_path: Path,
) -> None:
    lab = make_lab(tmp_path / "lab")
    failed = lab.cli("rollout", "start", "here-cpu", "--out", "/proc/nope/manifest.json", code=2)
    assert "nothing was published" in failed and "discarded" in failed
    assert lab.log() == []
    current = lab.published()
    assert current is not None and current[1]["entries"]["here-cpu"].get("rollout") is None
    # the next routine publish has no draft to ship: the rollout's signed version is not one
    assert "no draft to publish" in lab.cli("manifest", "publish", code=2)
    said = lab.cli("rollout", "start", "here-cpu", "--steps", "30,100")
    assert "started at 30%" in said
    assert lab.log()[-1][0] == "start" and lab.log()[-1][1] == lab.published()[0]  # type: ignore[index]


def test_a_draft_whose_publish_failed_stays_a_draft(tmp_path: Path) -> None:
    lab = make_lab(tmp_path / "lab")
    draft = lab.root / "d.json"
    lab.cli("manifest", "generate", "--release", "r2", "--out", str(draft))
    failed = lab.cli("manifest", "publish", str(draft), "--out", "/proc/nope/m.json", code=2)
    assert "its draft is a draft again" in failed
    assert "version 2 is published" not in lab.cli("manifest", "publish", str(draft))
    assert lab.published() is not None and lab.published()[0] == 2  # type: ignore[index]


# -- --per-class DIR is qualify's own -------------------------------------------------------


def test_a_per_class_directory_holding_the_users_files_is_refused_and_nothing_deleted(
    tmp_path: Path,
) -> None:
    lab = make_lab(tmp_path / "lab")
    before = sorted(p.name for p in lab.root.iterdir())
    version = lab.published()[0]  # type: ignore[index]
    # The README's trap: the per-class documents into the folder the manifest itself is in.
    refused = lab.cli(
        "rollout", "hold", "here-cpu", "--why", "x", "--per-class", str(lab.root), code=2
    )
    refused += lab.cli(
        "manifest", "generate", "--publish", "--release", "r2", "--per-class", str(lab.root),
        code=2,
    )  # fmt: skip
    assert "holds files qualify did not write there" in refused
    assert "manifest.json" in refused
    assert sorted(p.name for p in lab.root.iterdir()) == before
    assert lab.published()[0] == version  # type: ignore[index]
    assert_record_and_files_agree(lab)


def test_a_per_class_directory_keeps_the_users_file_dropped_into_it_later(tmp_path: Path) -> None:
    lab = make_lab(tmp_path / "lab")
    (lab.per_class / "notes.txt").write_text("mine")
    refused = lab.cli("rollout", "hold", "here-cpu", "--why", "x", *_per_class(lab), code=2)
    assert "notes.txt" in refused
    assert (lab.per_class / "notes.txt").read_text() == "mine"
    (lab.per_class / "notes.txt").unlink()
    lab.cli("rollout", "hold", "here-cpu", "--why", "x", *_per_class(lab))
    assert assert_record_and_files_agree(lab) == 2


def test_a_per_class_directory_of_an_earlier_release_is_adopted_and_only_its_sets_retired(
    tmp_path: Path,
) -> None:
    lab = make_lab(tmp_path / "lab")
    (lab.per_class / MARKER).unlink()  # as an earlier qualify left it: current and v1/
    lab.cli("rollout", "hold", "here-cpu", "--why", "x", *_per_class(lab))
    lab.cli("rollout", "clear", "here-cpu", "--why", "x")
    lab.cli("manifest", "generate", "--publish", "--release", "r3", *_per_class(lab))
    assert sorted(p.name for p in lab.per_class.iterdir()) == [MARKER, "current", "v2", "v3"]
    assert_record_and_files_agree(lab)


def test_a_version_not_written_to_the_per_class_directory_beside_it_says_hosts_stay_behind(
    tmp_path: Path,
) -> None:
    lab = make_lab(tmp_path / "lab")  # release 1, with per-class documents in manifest.d
    said = lab.cli("rollout", "hold", "here-cpu", "--why", "x")  # v2: the manifest file only
    assert (
        f"warning: {lab.per_class} holds tiny's per-class documents at v1, and v2 was not "
        "written there: hosts that read it stay on v1 until it expires; publish with "
        f"--per-class {lab.per_class}"
    ) in said
    lab.cli("rollout", "clear", "here-cpu", "--why", "x")
    again = lab.cli("manifest", "generate", "--publish", "--release", "r3")
    assert "at v1, and v3 was not written there" in again
    caught_up = lab.cli("manifest", "generate", "--publish", "--release", "r4", *_per_class(lab))
    assert "warning" not in caught_up
    # Another model line's directory beside it is not this release's to keep up.
    marker = json.loads((lab.per_class / MARKER).read_text())
    (lab.per_class / MARKER).write_text(json.dumps({**marker, "model": "another"}))
    assert "warning" not in lab.cli("rollout", "hold", "here-cpu", "--why", "x")


def test_one_per_class_directory_serves_one_model_line(tmp_path: Path) -> None:
    lab = make_lab(tmp_path / "lab")
    marker = json.loads((lab.per_class / MARKER).read_text())
    (lab.per_class / MARKER).write_text(json.dumps({**marker, "model": "another"}))
    refused = lab.cli("rollout", "hold", "here-cpu", "--why", "x", *_per_class(lab), code=2)
    assert "serves model line 'another', not 'tiny'" in refused


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.one_of(
        st.binary(max_size=300),
        st.just(b"[" * 100_000),
        st.fixed_dictionaries(
            {},
            optional={
                "format": st.sampled_from(["qualify-per-class/1", "x"]) | st.integers(),
                "model": st.sampled_from(["tiny", "other"]) | st.integers() | st.none(),
                "sets": st.lists(st.sampled_from(["v1", "v2", "..", "v", "/etc"]) | st.integers())
                | st.text(max_size=5),
            },
        ).map(lambda d: json.dumps(d).encode()),
    )
)
def test_any_marker_is_read_as_qualifys_or_refused_with_a_message(
    tmp_path: Path, data: bytes
) -> None:
    directory = tmp_path / "d"
    directory.mkdir(exist_ok=True)
    (directory / MARKER).write_bytes(data)
    try:
        owned = perclass.claim(directory, "tiny")
    except BuildError as exc:
        assert str(directory) in str(exc)
        return
    assert owned.model == "tiny"
    assert all(s.startswith("v") and s[1:].isdigit() for s in owned.sets)
