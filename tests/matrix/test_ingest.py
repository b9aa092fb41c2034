"""Ingesting bundles: idempotent by run id; a bad bundle is refused by path and writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from matrix.bundle import RUN_JSON, write_bundle
from matrix.errors import BundleError
from matrix.ingest import ingest_bundles
from matrix.store import Store
from tests.matrix.factories import make_bundle, make_samples


def _bundle_dir(directory: Path, run_id: str) -> Path:
    bundle = make_bundle(run_id, samples=6)
    return write_bundle(bundle, make_samples(bundle), directory)


def test_ingesting_the_same_bundle_twice_writes_it_once(store: Store, tmp_path: Path) -> None:
    path = _bundle_dir(tmp_path, "run-1")

    first = ingest_bundles(store, [path])
    second = ingest_bundles(store, [path / RUN_JSON])

    assert [(b.run_id, b.status, b.cells, b.samples) for b in first.bundles] == [
        ("run-1", "ingested", 2, 24)
    ]
    assert [(b.path, b.status) for b in second.bundles] == [(path, "present")]
    assert second.ingested == [] and len(second.present) == 1
    assert [run.run_id for run in store.runs()] == ["run-1"]
    assert len(store.cells()) == 2


def test_bundles_from_many_hosts_feed_one_matrix(store: Store, tmp_path: Path) -> None:
    paths = [_bundle_dir(tmp_path / f"host-{i}", f"run-{i}") for i in range(3)]

    report = ingest_bundles(store, paths)

    assert [b.status for b in report.bundles] == ["ingested"] * 3
    assert sorted(run.run_id for run in store.runs()) == ["run-0", "run-1", "run-2"]


def test_a_corrupt_bundle_is_refused_by_path_and_writes_nothing(
    store: Store, tmp_path: Path
) -> None:
    good = _bundle_dir(tmp_path, "run-good")
    bad = _bundle_dir(tmp_path, "run-bad")
    document = json.loads((bad / RUN_JSON).read_text())
    document["cells"][0]["artifact_digest"] = "md5:abc"
    (bad / RUN_JSON).write_text(json.dumps(document))
    snapshot = store.snapshot_id()

    with pytest.raises(BundleError) as caught:
        ingest_bundles(store, [bad, good])

    assert str(bad / RUN_JSON) in str(caught.value)
    assert "cells.0.artifact_digest" in str(caught.value)
    assert store.run("run-bad") is None
    assert store.snapshot_id() == snapshot


def test_bundles_before_a_bad_one_stay_ingested_whole(store: Store, tmp_path: Path) -> None:
    good = _bundle_dir(tmp_path, "run-good")
    missing = tmp_path / "run-missing"

    with pytest.raises(BundleError, match="run-missing"):
        ingest_bundles(store, [good, missing])

    assert [run.run_id for run in store.runs()] == ["run-good"]
    assert len(store.cells(run_id="run-good")) == 2
