"""Run bundles on disk: atomic write, exact read-back, and errors that name the file and field."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from matrix.bundle import RUN_JSON, SAMPLES_PARQUET, read_bundle, write_bundle
from matrix.errors import BundleError
from schemas.cell import RunBundle
from tests.matrix.factories import make_bundle, make_samples


@pytest.fixture
def written(tmp_path: Path) -> Path:
    bundle = make_bundle("run-1", candidates=("int8", "fp16"))
    return write_bundle(bundle, make_samples(bundle), tmp_path / "bundles")


def test_a_written_bundle_reads_back_identical(tmp_path: Path) -> None:
    bundle = make_bundle("run-1", candidates=("int8", "fp16"), samples=11)
    samples = make_samples(bundle)

    path = write_bundle(bundle, samples, tmp_path / "bundles")

    assert path == tmp_path / "bundles" / "run-1"
    assert sorted(p.name for p in path.iterdir()) == [RUN_JSON, SAMPLES_PARQUET]
    assert [p.name for p in path.parent.iterdir()] == ["run-1"]  # no staging dir left behind
    assert (path / RUN_JSON).read_text() == bundle.model_dump_json(indent=2) + "\n"
    for given in (path, path / RUN_JSON):
        again, again_samples = read_bundle(given)
        assert again == bundle
        assert again_samples.equals(samples)


def test_a_run_id_is_written_once(written: Path) -> None:
    bundle, samples = read_bundle(written)
    with pytest.raises(BundleError, match="already exists"):
        write_bundle(bundle, samples, written.parent)


def test_a_run_id_that_cannot_be_a_directory_is_refused(tmp_path: Path) -> None:
    bundle = make_bundle("../escape")
    with pytest.raises(BundleError, match="cannot name a bundle directory"):
        write_bundle(bundle, make_samples(bundle), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_an_inconsistent_bundle_is_not_written(tmp_path: Path) -> None:
    bundle = make_bundle("run-1")
    samples = make_samples(bundle).drop_columns(["latency_ns"])
    with pytest.raises(BundleError, match="missing"):
        write_bundle(bundle, samples, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_missing_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="no such directory") as caught:
        read_bundle(tmp_path / "run-404")
    assert caught.value.path == tmp_path / "run-404"


def test_missing_run_json_is_named(written: Path) -> None:
    (written / RUN_JSON).unlink()
    with pytest.raises(BundleError, match=r"run\.json: not found") as caught:
        read_bundle(written)
    assert str(written / RUN_JSON) in str(caught.value)


def test_invalid_json_gives_line_and_column(written: Path) -> None:
    (written / RUN_JSON).write_text('{\n  "format": "qualify-run-bundle/1",\n  "run": ,\n}')
    with pytest.raises(BundleError, match=r"invalid JSON at line 3 column 10") as caught:
        read_bundle(written)
    assert str(written / RUN_JSON) in str(caught.value)


def test_another_format_version_is_refused_by_name(written: Path) -> None:
    document = json.loads((written / RUN_JSON).read_text())
    document["format"] = "qualify-run-bundle/2"
    (written / RUN_JSON).write_text(json.dumps(document))
    with pytest.raises(
        BundleError, match=r"has format 'qualify-run-bundle/2'.*reads 'qualify-run-bundle/1'"
    ):
        read_bundle(written)


def test_a_schema_violation_names_the_field_path(written: Path) -> None:
    document = json.loads((written / RUN_JSON).read_text())
    document["cells"][1]["verdict"] = "maybe"
    del document["run"]["model"]
    (written / RUN_JSON).write_text(json.dumps(document))
    with pytest.raises(BundleError) as caught:
        read_bundle(written)
    message = str(caught.value)
    assert "2 invalid field(s)" in message
    assert "run.model: Field required" in message
    assert "cells.1.verdict: Input should be 'pass', 'fail', 'insufficient' or 'error'" in message


def test_a_missing_samples_file_is_named(written: Path) -> None:
    (written / SAMPLES_PARQUET).unlink()
    with pytest.raises(BundleError, match=r"samples\.parquet: not found") as caught:
        read_bundle(written)
    assert caught.value.path == written / SAMPLES_PARQUET


def test_a_truncated_samples_file_is_named(written: Path) -> None:
    data = (written / SAMPLES_PARQUET).read_bytes()
    (written / SAMPLES_PARQUET).write_bytes(data[: len(data) // 2])
    with pytest.raises(BundleError, match="not a readable Parquet file") as caught:
        read_bundle(written)
    assert str(written / SAMPLES_PARQUET) in str(caught.value)


def test_samples_with_a_wrong_column_name_the_file_and_column(written: Path) -> None:
    table = pq.read_table(written / SAMPLES_PARQUET).rename_columns(
        ["artifact_digest", "batch_size", "concurrency", "dims", "sequence", "latency_ns"]
    )
    pq.write_table(table, written / SAMPLES_PARQUET)
    with pytest.raises(
        BundleError, match=r"samples.parquet: columns must be exactly .* missing \['seq'\]"
    ):
        read_bundle(written)


def test_an_empty_samples_table_is_a_valid_bundle(tmp_path: Path) -> None:
    bundle = make_bundle("run-1", samples=0)
    empty = make_samples(bundle)
    assert empty.num_rows == 0
    path = write_bundle(bundle, empty, tmp_path)
    again, samples = read_bundle(path)
    assert isinstance(again, RunBundle)
    assert samples.num_rows == 0
    assert samples.schema.equals(empty.schema)
    assert isinstance(samples, pa.Table)
