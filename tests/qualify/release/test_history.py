"""Who published each manifest version and why (``manifest publish --who --why``, a rollout
step's actor and reason), recorded with the version in the transaction that makes it current,
and shown by ``qualify manifest history``; a version published before the matrix recorded them
says "not recorded", never a made-up name."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from matrix import publications
from matrix.store import Store
from qualify.release.publishing import WHO_MOST, WHY_MOST
from qualify.rollout import actor
from tests.matrix.factories import before, older_matrix
from tests.qualify.lab import Lab, make_lab

FIXED = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


def _history(lab: Lab) -> list[str]:
    return lab.cli("manifest", "history").splitlines()


def _recorded(lab: Lab) -> list[tuple[int, str, str | None, str | None]]:
    with Store.open(lab.db, read_only=True) as db:
        return [
            (v.version, v.state, v.published_by, v.publish_reason) for v in db.manifest_history()
        ]


def test_a_publish_records_who_and_why_and_the_next_releases_keep_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOGNAME", "ci-runner")  # getpass reads it first: the default --who
    lab = make_lab(tmp_path / "lab")  # release 1, published without --who/--why
    lab.cli("manifest", "generate", "--release", "r2")
    lab.cli("manifest", "publish", "--who", "alice", "--why", "CHG-7: the candidate qualified")
    lab.cli("manifest", "generate", "--publish", "--release", "r3", "--who", "bob")
    lab.cli("rollout", "hold", "here-cpu", "--why", "incident 42")

    assert _recorded(lab) == [
        (1, "published", "ci-runner", ""),
        (2, "published", "alice", "CHG-7: the candidate qualified"),
        (3, "published", "bob", ""),
        (4, "published", actor(), "incident 42"),  # a hold records its actor and reason
    ]
    lines = _history(lab)
    assert lines[0].startswith("v1  r1  published ") and lines[0].endswith(
        " by ci-runner: none given"
    )
    assert lines[1].endswith(" by alice: CHG-7: the candidate qualified")
    assert lines[2].endswith(" by bob: none given")
    assert lines[3].endswith(f" by {actor()}: incident 42")


def test_a_draft_and_a_discarded_publication_say_so_and_name_nobody(tmp_path: Path) -> None:
    lab = make_lab(tmp_path / "lab")
    failed = lab.cli(
        "manifest", "generate", "--publish", "--release", "r2", "--who", "carol",
        "--out", "/proc/nope/manifest.json", code=2,
    )  # fmt: skip
    assert "nothing was published" in failed
    lab.cli("manifest", "generate", "--release", "r3")
    assert [(v, s, by) for v, s, by, _ in _recorded(lab)][1:] == [
        (2, "discarded", None),
        (3, "draft", None),
    ]
    lines = _history(lab)
    assert "discarded" in lines[1] and "carol" not in lines[1]
    assert lines[2].endswith("a draft, not published")


@pytest.fixture(scope="module")
def drafted(tmp_path_factory: pytest.TempPathFactory) -> Lab:
    """Release 1 published and release 2 drafted: what a bad --who/--why must leave as it is."""
    lab = make_lab(tmp_path_factory.mktemp("bad") / "lab")
    lab.cli("manifest", "generate", "--release", "r2")
    return lab


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("--who", "", "--who is empty"),
        ("--who", "   ", "--who is empty"),
        ("--who", "alice\nv9  r9  published by root", "control character (\\x0a)"),
        ("--who", "x" * (WHO_MOST + 1), f"over the {WHO_MOST:,} recorded"),
        ("--why", "\x1b[31mred", "control character (\\x1b)"),
        ("--why", "y" * (WHY_MOST + 1), f"over the {WHY_MOST:,} recorded"),
    ],
)
@pytest.mark.parametrize("command", ["manifest publish", "manifest generate --publish"])
def test_a_bad_who_or_why_is_refused_and_nothing_is_written(
    drafted: Lab, command: str, option: str, value: str, said: str
) -> None:
    before = (
        drafted.manifest.read_bytes(),
        _recorded(drafted),
        sorted(drafted.per_class.iterdir()),
    )
    args = ["manifest", "publish"] if command == "manifest publish" else [
        "manifest", "generate", "--publish", "--release", "r9",
    ]  # fmt: skip
    out = drafted.cli(*args, option, value, code=2)
    assert out.startswith(f"error: {option} ") and said in out
    assert "pass " in out  # the fix
    after = (drafted.manifest.read_bytes(), _recorded(drafted), sorted(drafted.per_class.iterdir()))
    assert after == before


def test_the_os_user_name_is_checked_as_who_when_no_who_is_given(
    drafted: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _recorded(drafted)
    monkeypatch.setenv("LOGNAME", "mallory\x1b]0;pwned\x07")
    out = drafted.cli("manifest", "publish", code=2)
    assert "the OS user name (the default of --who) holds a control character" in out
    assert "pass --who NAME" in out
    assert _recorded(drafted) == before


def test_a_draft_takes_no_who_or_why(drafted: Lab) -> None:
    out = drafted.cli("manifest", "generate", "--release", "r9", "--why", "because", code=2)
    assert "a draft is not published" in out and "qualify manifest publish" in out


def _old_matrix(path: Path) -> None:
    """A matrix as the qualify before the record wrote it: every migration before it, and
    version 1 published."""
    conn = older_matrix(path, before("manifests.published_by"))
    conn.execute(
        "INSERT INTO manifests (version, release, created, expires, document, stored_at, "
        "published_at) VALUES (1, 'old', ?, ?, ?, ?, ?)",
        [FIXED, FIXED, json.dumps({"signed": {"model": "m"}}), FIXED, FIXED],
    )
    conn.close()


def test_a_version_published_before_the_record_reads_as_not_recorded(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from qualify.cli import cli

    db = tmp_path / "qualify.duckdb"
    _old_matrix(db)
    before = db.read_bytes()
    shown = CliRunner().invoke(cli, ["manifest", "history", "--db", str(db)])
    assert shown.exit_code == 0, shown.output
    assert shown.output.startswith("v1  old  published 2025-01-02 03:04:05Z by not recorded: ")
    assert shown.output.rstrip().endswith(": not recorded")
    assert db.read_bytes() == before  # read through a copy: the file is left to its qualify
    listed = CliRunner().invoke(cli, ["manifest", "history", "--db", str(db), "--json"])
    (version,) = json.loads(listed.output)["versions"]
    assert (version["published_by"], version["publish_reason"]) == (None, None)
    with Store.open(db) as store:  # migrated in place: still not recorded, nothing invented
        (migrated,) = store.manifest_history()
    assert (migrated.published_by, migrated.publish_reason) == (None, None)


def test_an_intent_an_older_qualify_recorded_completes_as_not_recorded(tmp_path: Path) -> None:
    with Store.open(tmp_path / "m.duckdb") as db:
        intent = {"what": "manifest publish", "log": []}  # no published_by: recorded before it
        publications.begin(
            db, 1, release="r", created=FIXED, expires=FIXED, document_json="{}",
            intent=intent, draft=False,
        )  # fmt: skip
        publications.finish(db, 1)
        (version,) = db.manifest_history()
    assert (version.state, version.published_by, version.publish_reason) == (
        "published",
        None,
        None,
    )


@pytest.mark.slow
@pytest.mark.parametrize("instant", ["recorded", "written"])
def test_a_publish_killed_at_any_instant_records_who_exactly_when_the_version_is_current(
    tmp_path: Path, instant: str
) -> None:
    lab = make_lab(tmp_path / "lab")
    lab.cli("manifest", "generate", "--release", "r2")
    lab.killed_at(instant, "manifest", "publish", "--who", "dana", "--why", "CHG-9")
    # killed: the version is being published, and nobody is recorded as its publisher yet
    assert _recorded(lab)[1] == (2, "publishing", None, None)
    said = lab.cli("manifest", "generate", "--release", "r3")  # the next command recovers
    if instant == "written":  # hosts may have read it: completed, with its record
        assert "completed the interrupted publication of manifest v2" in said
        assert _recorded(lab)[1] == (2, "published", "dana", "CHG-9")
    else:  # never reached a host: a draft again, published by nobody
        assert "discarded the interrupted publication of manifest v2" in said
        assert _recorded(lab)[1] == (2, "draft", None, None)


def test_last_shows_the_newest_versions_and_says_how_many_it_leaves_out(tmp_path: Path) -> None:
    lab = make_lab(tmp_path / "lab")  # release 1, published
    lab.cli("manifest", "generate", "--publish", "--release", "r2")
    lab.cli("manifest", "generate", "--release", "r3")  # a draft

    lines = lab.cli("manifest", "history", "--last", "2").splitlines()
    assert lines[0] == "(1 earlier version not shown: drop --last to see all)"
    assert lines[1].startswith("v2  r2  published ")
    assert lines[2].startswith("v3  r3  created ") and lines[2].endswith("a draft, not published")
    assert len(lines) == 3

    doc = json.loads(lab.cli("manifest", "history", "--last", "1", "--json"))
    assert [v["version"] for v in doc["versions"]] == [3]
    assert doc["earlier"] == 2
    everything = json.loads(lab.cli("manifest", "history", "--json"))
    assert [v["version"] for v in everything["versions"]] == [1, 2, 3]
    assert everything["earlier"] == 0

    assert lab.cli("manifest", "history", "--last", "9") == lab.cli("manifest", "history")
    refused = lab.cli("manifest", "history", "--last", "0", code=2)
    assert "--last" in refused and "0" in refused


def test_a_draft_a_later_publication_passed_says_it_can_no_longer_be_published(
    tmp_path: Path,
) -> None:
    lab = make_lab(tmp_path / "lab")  # release 1, published
    lab.cli("manifest", "generate", "--release", "r2")  # v2, a draft...
    kept = (lab.root / "manifest.draft.json").read_bytes()
    lab.cli("manifest", "generate", "--publish", "--release", "r3")  # ...passed by v3
    lines = _history(lab)
    assert lines[1].startswith("v2  r2  created ") and lines[1].endswith(
        "a draft, never published: v3 was published since (publish refuses it; generate a new one)"
    )
    # What the line says is what publishing it does.
    (lab.root / "old.draft.json").write_bytes(kept)
    refused = lab.cli("manifest", "publish", str(lab.root / "old.draft.json"), code=2)
    assert "draft version 2 is older than published version 3" in refused
