"""The manifest edit API (``qualify.release.edit``): a clean edit is the next version, signed and
published with its rollout-log rows; an edit that raises, or is discarded, publishes nothing; and
what an edit writes is laid out as the generator lays it out, the entries and fields it did not
touch keeping their published bytes. Real DuckDB matrices, real Ed25519 keys."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from manifest.load import load_manifest
from manifest.signing import load_public_key, verify
from matrix.store import Store
from qualify.errors import QualifyError
from qualify.release.edit import edit_manifest, entry_wire
from qualify.release.publishing import PublishOptions
from qualify.rollout import SAID_MOST, Note
from schemas.cell import Reason
from tests.manifest.factories import GOLDEN
from tests.qualify.telemetry_story import FP32, INT8, NOW, Pointer, Story

GOLDEN_MANIFESTS = sorted(p.name for p in GOLDEN.glob("*.json"))


def _matrix(tmp_path: Path) -> Path:
    """A matrix whose v2 gives x86 int8 (arm fp32 from v1)."""
    story = Story()
    story.publish(NOW - timedelta(days=1), x86=Pointer(FP32, rollback=None))
    story.publish(NOW - timedelta(hours=1), x86=Pointer(INT8))
    return story.matrix(tmp_path)


def _options(tmp_path: Path, **changed: object) -> PublishOptions:
    return PublishOptions(
        key_path=GOLDEN / "test.key",
        out=tmp_path / "manifest.json",
        now=NOW,
        expires_in=timedelta(days=30),
        why="incident 42",
        who="ops",
        **changed,  # type: ignore[arg-type]
    )


def _published(db_path: Path) -> tuple[int, dict[str, object]]:
    with Store.open(db_path, read_only=True) as db:
        latest = db.latest_manifest()
    assert latest is not None
    return latest[0], json.loads(latest[1])["signed"]


def test_a_clean_edit_is_the_next_version_signed_published_and_logged(tmp_path: Path) -> None:
    db_path = _matrix(tmp_path)
    before_version, before = _published(db_path)
    options = _options(tmp_path)
    with Store.open(db_path) as db, edit_manifest(db, options) as edit:
        entry = edit.entry("x86")
        edit.entries["x86"] = entry.model_copy(update={"summary": "edited by a test"})
        edit.record("x86-hold", "x86", "hold", step=0, percent=0, artifact="", why="a test")
    assert edit.version == before_version + 1
    raw = options.out.read_bytes()
    verify(raw, load_public_key(GOLDEN / "test.pub"), now=NOW, source="edited")
    published = load_manifest(raw)
    assert published.signed.version == edit.version
    assert published.signed.created == "2025-06-02T12:00:00Z"
    assert published.signed.expires == "2025-07-02T12:00:00Z"
    version, after = _published(db_path)
    assert version == edit.version
    entries_before, entries_after = before["entries"], after["entries"]
    assert isinstance(entries_before, dict) and isinstance(entries_after, dict)
    assert entries_after["arm"] == entries_before["arm"]  # untouched: its published form
    # in the entry it edited, only the field it changed; the rest keeps its published form
    # (this matrix holds a full dump, "rollout": null included, not the generator's layout)
    assert entries_after["x86"] == {**entries_before["x86"], "summary": "edited by a test"}
    with Store.open(db_path, read_only=True) as db:
        [row] = db.rollout_log()
    assert (row["action"], row["version"], row["actor"], row["why"]) == (
        "hold",
        edit.version,
        "ops",
        "a test",
    )


def test_an_edit_that_raises_publishes_nothing(tmp_path: Path) -> None:
    db_path = _matrix(tmp_path)
    before = _published(db_path)
    options = _options(tmp_path)
    with (
        Store.open(db_path) as db,
        pytest.raises(QualifyError, match="no class 'gpu'"),
        edit_manifest(db, options) as edit,
    ):
        edit.entries["x86"] = edit.entry("x86").model_copy(update={"summary": "half done"})
        edit.record("x86-hold", "x86", "hold", step=0, percent=0, artifact="", why="a test")
        edit.entry("gpu")
    assert _published(db_path) == before
    assert not options.out.exists()
    with Store.open(db_path, read_only=True) as db:
        assert db.rollout_log() == []
        assert db.highest_manifest_version() == before[0]


def test_a_discarded_edit_publishes_nothing(tmp_path: Path) -> None:
    db_path = _matrix(tmp_path)
    before = _published(db_path)
    with Store.open(db_path) as db, edit_manifest(db, _options(tmp_path)) as edit:
        edit.entries["x86"] = edit.entry("x86").model_copy(update={"summary": "never"})
        edit.discard()
    assert edit.version == 0
    assert _published(db_path) == before
    assert not (tmp_path / "manifest.json").exists()


def test_nothing_published_is_a_clear_error(tmp_path: Path) -> None:
    db_path = tmp_path / "empty.duckdb"
    with (
        Store.open(db_path) as db,
        pytest.raises(QualifyError, match="no manifest has been"),
        edit_manifest(db, _options(tmp_path)),
    ):
        pass


@pytest.mark.parametrize("name", GOLDEN_MANIFESTS)
def test_an_entry_is_written_as_the_generator_writes_it(name: str) -> None:
    """Every entry of the generator's goldens (holds, rollbacks under other settings,
    evidence with and without emulated numerics) written from its model is the published
    entry: an edit's changed fields are laid out as a generation would lay them out."""
    raw = (GOLDEN / name).read_bytes()
    published = json.loads(raw)["signed"]["entries"]
    manifest = load_manifest(raw, source=name)
    for host_class, entry in manifest.signed.entries.items():
        assert entry_wire(entry) == published[host_class], host_class


def test_a_note_bounds_what_a_person_said_in_one_place() -> None:
    why = "w" * 5000
    note = Note("held", f"held by ops: {why}", f"x86 is held ({why})")
    assert len(note.message) == len(note.summary) == SAID_MOST
    assert note.message.startswith("held by ops: www") and note.summary.startswith("x86 is held")
    story = Story()
    entry = story.base().signed.entries["x86"]
    also = [Reason(code="candidate_passed", message="m" * 900)]
    noted = note.on(entry, also=also, decision="hold")
    assert [r.code for r in noted.reasons] == ["held", "candidate_passed"]
    assert noted.reasons[1].message == "m" * 900  # not a person's words: not cut
    assert noted.decision == "hold" and noted.summary == note.summary
