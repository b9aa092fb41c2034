"""The demo's folder is one story: a second demo over it is refused unless --force, which
deletes only what a demo wrote there, and never a folder that is not a demo's."""

from __future__ import annotations

from pathlib import Path

import pytest

from qualify.demo.story import MARKER, prepare_workdir
from qualify.errors import QualifyError
from tests.qualify.projects import run_qualify


def earlier_demo(where: Path) -> Path:
    """A folder as a demo leaves it (a few of its files and folders)."""
    prepare_workdir(where)
    (where / "models").mkdir()
    (where / "models" / "digits-mlp-fp32.onnx").write_bytes(b"model")
    (where / "telemetry.jsonl").write_text("{}\n")
    (where / "manifest.json").write_text("{}")
    (where / "hosts" / "x86-v4").mkdir(parents=True)
    return where


def test_a_new_or_empty_folder_is_marked_as_the_demos(tmp_path: Path) -> None:
    assert prepare_workdir(tmp_path / "new") == []
    (tmp_path / "empty").mkdir()
    assert prepare_workdir(tmp_path / "empty") == []
    assert (tmp_path / "new" / MARKER).is_file() and (tmp_path / "empty" / MARKER).is_file()


def test_a_demo_over_an_earlier_one_is_refused_without_force(tmp_path: Path) -> None:
    work = earlier_demo(tmp_path / "demo")
    with pytest.raises(QualifyError, match=r"not empty .* Pass --force"):
        prepare_workdir(work)
    assert (work / "telemetry.jsonl").is_file()


def test_force_deletes_the_earlier_demo_and_starts_clean(tmp_path: Path) -> None:
    work = earlier_demo(tmp_path / "demo")
    deleted = prepare_workdir(work, force=True)
    assert deleted == sorted([MARKER, "hosts", "manifest.json", "models", "telemetry.jsonl"])
    assert sorted(p.name for p in work.iterdir()) == [MARKER]


def test_force_refuses_a_demo_folder_holding_other_files_and_deletes_nothing(
    tmp_path: Path,
) -> None:
    work = earlier_demo(tmp_path / "demo")
    (work / "notes.txt").write_text("mine")
    with pytest.raises(QualifyError, match=r"files a demo does not write \(notes.txt\)"):
        prepare_workdir(work, force=True)
    assert (work / "notes.txt").read_text() == "mine" and (work / "telemetry.jsonl").is_file()


def test_force_refuses_a_folder_no_demo_marked(tmp_path: Path) -> None:
    # A user's own project looks like a demo (qualify.yaml, models, a matrix): never cleaned.
    work = tmp_path / "project"
    (work / "models").mkdir(parents=True)
    (work / "qualify.yaml").write_text("model: mine\n")
    (work / "qualify.duckdb").write_bytes(b"")
    with pytest.raises(QualifyError, match=f"{MARKER} is missing"):
        prepare_workdir(work, force=True)
    assert (work / "qualify.yaml").read_text() == "model: mine\n"


def test_force_removes_a_link_in_the_demo_not_what_it_points_at(tmp_path: Path) -> None:
    work = earlier_demo(tmp_path / "demo")
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    (work / "data").symlink_to(outside)
    prepare_workdir(work, force=True)
    assert not (work / "data").exists() and (outside / "keep.txt").read_text() == "keep"


def test_the_demo_command_refuses_a_non_empty_folder_with_exit_2_and_the_fix(
    tmp_path: Path,
) -> None:
    work = earlier_demo(tmp_path / "demo")
    proc = run_qualify("demo", "--workdir", str(work), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "--force" in proc.stderr and "Traceback" not in proc.stderr
    assert (work / "telemetry.jsonl").is_file()
    shown = run_qualify("demo", "--help", cwd=tmp_path)
    assert "--force" in shown.stdout and "holding other files, is refused" in shown.stdout
