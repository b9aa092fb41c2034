"""From a real run to a signed manifest, a second release, a diff and a report, through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from qualify.cli import cli
from tests.qualify.projects import run_qualify, write_project


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A matrix with one real run of a passing and a parity-breaking candidate on here-cpu."""
    tmp = tmp_path_factory.mktemp("release")
    write_project(tmp, ["identity_mlp_perturbed"])
    done = run_qualify("run", "--host-class", "here-cpu", "--json", cwd=tmp)
    assert done.returncode == 0, done.stderr
    assert invoke("keygen", "rel", "--dir", str(tmp)).exit_code == 0
    return tmp


def own_copy(matrix: Path, tmp_path: Path) -> Path:
    """The module's matrix (project, key, DuckDB file) copied, for a test that publishes into it
    or breaks it: the others keep theirs."""
    import shutil

    tmp = tmp_path / "m"
    shutil.copytree(matrix, tmp)
    return tmp


def generate(tmp: Path, out: str, *extra: str) -> Result:
    """``manifest generate``, published at once when given a key or --unsigned."""
    publish = ["--publish"] if {"--key", "--unsigned"} & set(extra) else []
    return invoke(
        "manifest",
        "generate",
        *publish,
        "--release",
        "r1",
        "--out",
        str(tmp / out),
        "--project",
        str(tmp / "qualify.yaml"),
        "--db",
        str(tmp / "qualify.duckdb"),
        *extra,
    )


def test_keygen_writes_a_private_key_only_its_owner_can_read(matrix: Path) -> None:
    assert (matrix / "rel.key").stat().st_mode & 0o777 == 0o600
    assert (matrix / "rel.pub").read_text().startswith("-----BEGIN PUBLIC KEY-----")
    again = CliRunner().invoke(cli, ["keygen", "rel", "--dir", str(matrix)])
    assert again.exit_code == 2 and "exist" in again.output


def test_publishing_refuses_to_sign_without_a_key_unless_told(matrix: Path) -> None:
    db = ["--db", str(matrix / "qualify.duckdb")]
    result = CliRunner().invoke(cli, ["manifest", "generate", "--publish", "--release", "x", *db])
    assert result.exit_code == 2 and "--key" in result.output
    result = CliRunner().invoke(cli, ["manifest", "publish", *db])
    assert result.exit_code == 2 and "--key" in result.output


def test_a_draft_is_signed_only_when_a_key_is_given_to_publish(matrix: Path) -> None:
    result = generate(matrix, "d.json", "--per-class", str(matrix / "d.d"))
    assert result.exit_code == 2 and "publish" in result.output
    assert not (matrix / "d.json").exists()


def _published_version(matrix: Path) -> int | None:
    from matrix.store import Store

    with Store.open(matrix / "qualify.duckdb", read_only=True) as db:
        latest = db.latest_manifest()
    return None if latest is None else latest[0]


def test_a_draft_is_current_only_once_published_and_then_exactly_as_reviewed(
    matrix: Path,
) -> None:
    before = _published_version(matrix)
    drafted = generate(matrix, "draft.json")
    assert drafted.exit_code == 0, drafted.output
    assert "not published" in drafted.output and "manifest publish" in drafted.output
    draft = json.loads((matrix / "draft.json").read_text())
    assert draft["signatures"] == []  # hosts refuse it
    assert _published_version(matrix) == before  # readers do not see it
    shown = invoke("manifest", "show", str(matrix / "draft.json"))
    assert shown.exit_code == 0 and "here-cpu" in shown.output
    key = ["--key", str(matrix / "rel.key"), "--db", str(matrix / "qualify.duckdb")]
    out = ["--out", str(matrix / "published.json")]
    done = invoke("manifest", "publish", str(matrix / "draft.json"), *key, *out)
    assert done.exit_code == 0, done.output
    published = json.loads((matrix / "published.json").read_text())
    assert published["signed"]["version"] == draft["signed"]["version"]
    assert published["signed"]["entries"] == draft["signed"]["entries"]
    assert _published_version(matrix) == draft["signed"]["version"]
    ok = invoke(
        "manifest", "verify", str(matrix / "published.json"), "--pubkey", str(matrix / "rel.pub")
    )
    assert ok.exit_code == 0, ok.output
    diff = invoke("manifest", "diff", str(matrix / "draft.json"), str(matrix / "published.json"))
    assert diff.exit_code == 0
    again = invoke("manifest", "publish", str(matrix / "draft.json"), *key, *out)
    assert again.exit_code == 2 and "published already" in again.output


def test_an_edited_or_overtaken_draft_is_refused(matrix: Path) -> None:
    assert generate(matrix, "old-draft.json").exit_code == 0
    edited = (matrix / "old-draft.json").read_text().replace('"baseline"', '"candidate"', 1)
    (matrix / "edited.json").write_text(edited)
    key = ["--key", str(matrix / "rel.key"), "--db", str(matrix / "qualify.duckdb")]
    out = ["--out", str(matrix / "p.json")]
    bad = invoke("manifest", "publish", str(matrix / "edited.json"), *key, *out)
    assert bad.exit_code == 2 and "edited" in bad.output, bad.output
    # Another version published after the draft: publishing the draft would undo it.
    assert generate(matrix, "newer.json", "--key", str(matrix / "rel.key")).exit_code == 0
    stale = invoke("manifest", "publish", str(matrix / "old-draft.json"), *key, *out)
    assert stale.exit_code == 2 and "generate a new draft" in stale.output, stale.output
    assert not (matrix / "p.json").exists()
    nothing = invoke("manifest", "publish", *key, *out)
    assert nothing.exit_code == 2 and "no draft" in nothing.output


def test_signed_manifest_decides_each_class_on_its_own_evidence(matrix: Path) -> None:
    result = generate(
        matrix, "m1.json", "--key", str(matrix / "rel.key"), "--per-class", str(matrix / "m1.d")
    )
    assert result.exit_code == 0, result.output
    signed = json.loads((matrix / "m1.json").read_text())["signed"]
    entries = signed["entries"]
    # The only candidate broke parity: here-cpu keeps the baseline, with the reason.
    assert entries["here-cpu"]["decision"] == "baseline"
    assert "parity_failed" in json.dumps(entries["here-cpu"]["reasons"])
    # No evidence at all for the other classes: the policy's unknown_class (hold by default).
    assert entries["elsewhere"]["decision"] == "hold"
    assert entries["lost-gpu"]["decision"] == "hold"
    version = signed["version"]  # 1 unless other tests of this module published first
    assert version == _published_version(matrix)
    assert (matrix / "m1.d" / "current").read_text() == f"v{version}\n"
    assert sorted(p.name for p in (matrix / "m1.d" / f"v{version}").iterdir()) == [
        "elsewhere.json",
        "here-cpu.json",
        "lost-gpu.json",
    ]
    ok = invoke("manifest", "verify", str(matrix / "m1.json"), "--pubkey", str(matrix / "rel.pub"))
    assert ok.exit_code == 0 and "OK" in ok.output


def test_tampered_manifest_fails_verification(matrix: Path, tmp_path: Path) -> None:
    generate(matrix, "m-t.json", "--key", str(matrix / "rel.key"))
    raw = (
        (matrix / "m-t.json").read_text().replace('"decision":"hold"', '"decision":"candidate"', 1)
    )
    (tmp_path / "forged.json").write_text(raw)
    bad = CliRunner().invoke(
        cli,
        ["manifest", "verify", str(tmp_path / "forged.json"), "--pubkey", str(matrix / "rel.pub")],
    )
    assert bad.exit_code == 2 and "signature" in bad.output.lower()


def test_each_release_gets_the_next_version_and_diff_says_what_changed(matrix: Path) -> None:
    first = generate(matrix, "v-a.json", "--key", str(matrix / "rel.key"))
    second = generate(matrix, "v-b.json", "--unsigned", "--expires", "2d")
    assert first.exit_code == 0 and second.exit_code == 0, second.output
    va = json.loads((matrix / "v-a.json").read_text())["signed"]["version"]
    vb = json.loads((matrix / "v-b.json").read_text())
    assert vb["signed"]["version"] == va + 1 and vb["signatures"] == []
    diff = invoke("manifest", "diff", str(matrix / "v-a.json"), str(matrix / "v-b.json"))
    assert diff.exit_code == 0 and diff.output.strip()
    shown = invoke("manifest", "show", str(matrix / "v-b.json"))
    assert "here-cpu" in shown.output and "baseline" in shown.output


def test_bad_expiry_is_a_usage_error(matrix: Path) -> None:
    result = CliRunner().invoke(
        cli,
        [
            "manifest",
            "generate",
            "--publish",
            "--release",
            "x",
            "--unsigned",
            "--expires",
            "soon",
            "--project",
            str(matrix / "qualify.yaml"),
            "--db",
            str(matrix / "qualify.duckdb"),
        ],
    )
    assert result.exit_code == 2 and "30d" in result.output


def test_report_is_written_for_the_matrix_and_its_manifest(matrix: Path) -> None:
    out = matrix / "report.html"
    result = invoke(
        "report",
        "--out",
        str(out),
        "--pubkey",
        str(matrix / "rel.pub"),
        "--project",
        str(matrix / "qualify.yaml"),
        "--db",
        str(matrix / "qualify.duckdb"),
    )
    assert result.exit_code == 0, result.output
    html = out.read_text()
    for name in ("here-cpu", "elsewhere", "lost-gpu", "identity_mlp_perturbed"):
        assert name in html
    assert 'src="http' not in html and '<link rel="stylesheet" href="http' not in html


def test_a_generate_that_dies_before_writing_its_file_publishes_nothing(
    matrix: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import qualify.release.publishing as publishing
    from matrix.store import Store

    tmp = own_copy(matrix, tmp_path)
    with Store.open(tmp / "qualify.duckdb") as store:
        before = store.latest_manifest()
        reserved = store.highest_manifest_version() + 1

    def killed(*_: object) -> None:
        raise KeyboardInterrupt  # as a kill between recording the version and writing the file

    monkeypatch.setattr(publishing, "write_manifest", killed)
    assert generate(tmp, "dead.json", "--key", str(tmp / "rel.key")).exit_code != 0
    monkeypatch.undo()
    assert not (tmp / "dead.json").exists()
    with Store.open(tmp / "qualify.duckdb") as store:
        assert store.latest_manifest() == before  # report and telemetry check see nothing new
        assert store.highest_manifest_version() == reserved
    result = generate(tmp, "next.json", "--key", str(tmp / "rel.key"))
    assert result.exit_code == 0, result.output
    signed = json.loads((tmp / "next.json").read_text())["signed"]
    assert signed["version"] == reserved + 1  # the reserved version is never reused
    with Store.open(tmp / "qualify.duckdb") as store:
        latest = store.latest_manifest()
        assert latest is not None and latest[0] == reserved + 1


def test_a_published_generate_records_the_signed_document_once_and_checks_kept_entries(
    matrix: Path, tmp_path: Path
) -> None:
    from datetime import UTC, datetime

    from manifest.envelope import encode_canonical
    from matrix.store import Store

    tmp = own_copy(matrix, tmp_path)
    key = ["--key", str(tmp / "rel.key")]
    first = generate(tmp, "v1.json", *key)
    assert first.exit_code == 0, first.output
    with Store.open(tmp / "qualify.duckdb") as store:
        latest = store.latest_manifest()
        assert latest is not None and latest[1].encode() == (tmp / "v1.json").read_bytes()
        version = latest[0]
        assert store.highest_manifest_version() == version  # no separate draft row
        # The matrix is hostile input: the held class's published entry is carried into the
        # next manifest verbatim, so it is validated whole, fields nothing else reads included.
        doc = json.loads(latest[1])
        doc["signed"]["entries"]["here-cpu"]["evidence"]["p99_us"] = "fast"
        store.connection.execute(
            "UPDATE manifests SET document = ? WHERE version = ?",
            [encode_canonical(doc).decode(), version],
        )
        store.record_rollout(
            "hold-7", "here-cpu", "hold", version, 0, 0, "", "ops", "incident 7", datetime.now(UTC)
        )
    refused = generate(tmp, "v2.json", *key)
    assert refused.exit_code == 2, refused.output
    assert "signed.entries.here-cpu.evidence.p99_us" in refused.output
    assert not (tmp / "v2.json").exists()


def test_a_fleet_past_what_hosts_read_whole_still_publishes_release_after_release(
    matrix: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from manifest import envelope

    tmp = own_copy(matrix, tmp_path)
    # As a fleet of ~40,000 classes is: its whole manifest over what hosts read by default.
    monkeypatch.setattr(envelope, "MAX_BYTES", 2000)
    key = ["--key", str(tmp / "rel.key")]
    first = generate(tmp, "v1.json", *key)
    assert first.exit_code == 0, first.output
    assert "warning: " in first.output and "per-class documents (--per-class DIR)" in first.output
    assert "--max-bytes" in first.output
    second = generate(tmp, "v2.json", *key, "--per-class", str(tmp / "classes"))
    assert second.exit_code == 0, second.output  # the first read back from the matrix
    assert "per-class documents written above" in second.output
    v1 = json.loads((tmp / "v1.json").read_text())["signed"]["version"]
    assert json.loads((tmp / "v2.json").read_text())["signed"]["version"] == v1 + 1
    v1_path, v2_path = str(tmp / "v1.json"), str(tmp / "v2.json")
    for args in (
        ["manifest", "show", v2_path],
        ["manifest", "verify", v2_path, "--pubkey", str(tmp / "rel.pub")],
        ["manifest", "diff", v1_path, v2_path],
    ):
        done = invoke(*args)
        assert done.exit_code == 0, (args, done.output)


def test_a_manifest_qualify_could_not_read_back_is_not_published(
    matrix: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from manifest import envelope
    from matrix.store import Store

    tmp = own_copy(matrix, tmp_path)
    with Store.open(tmp / "qualify.duckdb") as store:
        before = (store.latest_manifest(), store.highest_manifest_version())
    monkeypatch.setattr(envelope, "MAX_MANIFEST_BYTES", 2000)
    for publish in (["--key", str(tmp / "rel.key")], []):  # publishing, and a draft
        refused = generate(tmp, "big.json", *publish)
        assert refused.exit_code != 0
        # Refused by the check of what is published, or before, reading back a previous
        # manifest (other tests of this module publish into the shared matrix): either way
        # nothing is recorded or written.
        assert "-byte limit" in refused.output
        assert not (tmp / "big.json").exists()
    with Store.open(tmp / "qualify.duckdb") as store:
        assert (store.latest_manifest(), store.highest_manifest_version()) == before


def test_a_draft_file_larger_than_a_manifest_is_refused_unread(
    matrix: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from manifest import envelope

    tmp = own_copy(matrix, tmp_path)
    assert generate(tmp, "draft.json").exit_code == 0
    before = _published_version(tmp)
    size = (tmp / "draft.json").stat().st_size
    monkeypatch.setattr(envelope, "MAX_MANIFEST_BYTES", size - 1)
    key = ["--key", str(tmp / "rel.key"), "--db", str(tmp / "qualify.duckdb")]
    out = ["--out", str(tmp / "p.json")]
    refused = invoke("manifest", "publish", str(tmp / "draft.json"), *key, *out)
    assert refused.exit_code == 2, refused.output
    assert f"draft.json: larger than the {size - 1}-byte limit of a manifest" in refused.output
    assert not (tmp / "p.json").exists() and _published_version(tmp) == before


def test_a_class_the_project_file_no_longer_lists_is_named_as_its_entry_goes(
    matrix: Path, tmp_path: Path
) -> None:
    tmp = own_copy(matrix, tmp_path)
    key = str(tmp / "rel.key")
    assert generate(tmp, "manifest.json", "--key", key).exit_code == 0
    entry = json.loads((tmp / "manifest.json").read_bytes())["signed"]["entries"]["elsewhere"]
    was = "was held" if entry["artifact"] is None else f"ran {entry['artifact']['name']}"
    version = json.loads((tmp / "manifest.json").read_bytes())["signed"]["version"]
    project = tmp / "qualify.yaml"
    text = project.read_text()
    project.write_text(text[: text.index("  elsewhere:")])  # the last class, retired

    drafted = generate(tmp, "manifest.draft.json")
    assert drafted.exit_code == 0, drafted.output
    said = f"warning: elsewhere has no entry here (in v{version} it {was}): the project file"
    assert said in drafted.stderr and "back in the project file and generate again" in (
        drafted.stderr
    )
    assert "here-cpu" not in drafted.stderr and "lost-gpu" not in drafted.stderr
    signed = json.loads((tmp / "manifest.draft.json").read_bytes())["signed"]
    assert set(signed["entries"]) == {"here-cpu", "lost-gpu"}

    published = invoke(
        "manifest", "publish", str(tmp / "manifest.draft.json"), "--key", key,
        "--out", str(tmp / "manifest.json"), "--db", str(tmp / "qualify.duckdb"),
    )  # fmt: skip
    assert published.exit_code == 0, published.output
    assert said in published.stderr and "and publish again" in published.stderr
    # The next release replaces one without the class: nothing more to say.
    again = generate(tmp, "next.json", "--key", key)
    assert again.exit_code == 0 and "has no entry" not in again.stderr
