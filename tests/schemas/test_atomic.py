"""The shared atomic write: whole new file or the old one, never a half, never a stray temp."""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas.atomic import write_atomic


def test_replaces_the_file_with_the_requested_mode(tmp_path: Path) -> None:
    target = tmp_path / "doc.json"
    target.write_text("old")
    write_atomic(target, "new ✓", mode=0o600)
    assert target.read_text(encoding="utf-8") == "new ✓"
    assert target.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["doc.json"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "doc.json"
    target.write_text("old")

    def no_space(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("schemas.atomic.os.replace", no_space)
    with pytest.raises(OSError, match="No space"):
        write_atomic(target, b"new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["doc.json"]


def test_missing_folder_is_an_error_not_a_created_tree(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_atomic(tmp_path / "nope" / "doc.json", b"x")
    assert not (tmp_path / "nope").exists()
