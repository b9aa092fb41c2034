"""The store: one-transaction idempotent writes, the matrix view, queries, export, manifests."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from matrix.errors import BundleError, ManifestVersionError, MatrixError
from matrix.export import EXPORTED
from matrix.samples import empty_samples
from matrix.store import MEMORY, Store
from schemas.cell import LatencyConfig, RunBundle
from schemas.project import HostClassKey
from tests.matrix.factories import (
    EPOCH,
    KEY,
    digest_of,
    make_bundle,
    make_cell,
    make_samples,
    older_matrix,
)

OTHER_KEY = HostClassKey(hardware="arm-r5", runtime="ort-r8", provider="cpu-int8")


def row_counts(path: Path, run_id: str) -> dict[str, int]:
    """Rows of a run per table, read through a separate connection to the same file."""
    conn = duckdb.connect(str(path))
    try:
        return {
            table: conn.execute(
                f"SELECT count(*) FROM {table} WHERE run_id = ?", [run_id]
            ).fetchall()[0][0]
            for table in ("runs", "cells", "latency", "samples")
        }
    finally:
        conn.close()


class FailingBeforeCommit(Store):
    """A store whose write transaction fails after every insert, just before COMMIT."""

    def _before_commit(self, run_id: str) -> None:
        raise RuntimeError(f"disk on fire while writing {run_id}")


def test_write_run_lands_every_row_of_the_run(store: Store, db_path: Path) -> None:
    bundle = make_bundle("run-a", candidates=("int8", "fp16"), samples=9)
    samples = make_samples(bundle)

    assert store.write_run(bundle, samples) is True

    assert row_counts(db_path, "run-a") == {
        "runs": 1,
        "cells": 3,
        "latency": 6,
        "samples": samples.num_rows,
    }
    assert store.run("run-a") == bundle.run
    assert store.cells(run_id="run-a") == sorted(
        bundle.cells, key=lambda c: (c.measured_at, c.role, c.artifact_name)
    )


def test_writing_the_same_run_twice_writes_once(store: Store, db_path: Path) -> None:
    bundle = make_bundle("run-a")
    samples = make_samples(bundle)
    assert store.write_run(bundle, samples) is True
    before = row_counts(db_path, "run-a")

    assert store.write_run(bundle, samples) is False

    assert row_counts(db_path, "run-a") == before
    assert [run.run_id for run in store.runs()] == ["run-a"]


def test_a_write_that_fails_inside_the_transaction_leaves_nothing(db_path: Path) -> None:
    bundle = make_bundle("run-a", samples=50)
    with FailingBeforeCommit.open(db_path) as failing, pytest.raises(RuntimeError, match="fire"):
        failing.write_run(bundle, make_samples(bundle))

    assert row_counts(db_path, "run-a") == {"runs": 0, "cells": 0, "latency": 0, "samples": 0}
    with Store.open(db_path) as store:
        assert store.write_run(bundle, make_samples(bundle)) is True
        assert store.has_run("run-a")


def test_cells_round_trip_exactly_through_their_json(store: Store) -> None:
    cells = [
        make_cell(run_id="run-a", name="baseline", role="baseline", precision="fp32"),
        make_cell(run_id="run-a", name="int8", verdict="fail", fallback_nodes=3),
        make_cell(run_id="run-a", name="corrupt", verdict="error"),
        make_cell(run_id="run-a", name="pruned", precision="pruned", verdict="insufficient"),
    ]
    bundle = RunBundle(run=make_bundle("run-a").run, cells=cells)
    store.write_run(bundle, make_samples(bundle))

    stored = {cell.artifact_digest: cell for cell in store.latest_cells()}

    assert stored == {cell.artifact_digest: cell for cell in cells}
    errored = stored[digest_of("corrupt")]
    assert errored.placement is None and errored.latency == [] and errored.gate_latency is None


def test_matrix_view_keeps_the_latest_cell_per_key_and_digest(store: Store) -> None:
    old = make_bundle("run-1", candidates=("int8", "fp16"), measured_at=EPOCH)
    new = make_bundle("run-2", candidates=("int8",), measured_at=EPOCH + timedelta(hours=1))
    other = make_bundle("run-3", key=OTHER_KEY, host_class="arm-small", measured_at=EPOCH)
    for bundle in (new, old, other):  # insertion order must not matter
        store.write_run(bundle, make_samples(bundle))

    rows = store.matrix_rows()

    latest = {(r["hardware"], r["artifact_name"]): r["run_id"] for r in rows}
    assert latest == {
        ("x86-avx512", "baseline"): "run-2",
        ("x86-avx512", "int8"): "run-2",
        ("x86-avx512", "fp16"): "run-1",
        ("arm-r5", "baseline"): "run-3",
        ("arm-r5", "int8"): "run-3",
    }
    assert [r["hardware"] for r in rows] == ["arm-r5"] * 2 + ["x86-avx512"] * 3
    assert rows[0]["role"] == "baseline"
    required = {
        "hardware", "runtime", "provider", "host_class", "artifact_digest", "artifact_name",
        "role", "run_id", "verdict", "parity_passed", "p50_ms", "p99_ms", "p99_upper_ms",
        "samples", "expected_provider", "fallback_nodes", "peak_rss_mb", "cold_init_ms",
        "emulated", "measured_at", "settings_digest",
    }  # fmt: skip
    assert required <= set(rows[0])


def test_matrix_view_reports_the_gate_latency_config(store: Store) -> None:
    bundle = make_bundle("run-1", p99_ms=20.0)
    store.write_run(bundle, make_samples(bundle))

    row = next(r for r in store.matrix_rows() if r["artifact_name"] == "int8")
    gate = next(c for c in bundle.cells if c.artifact_name == "int8").gate_latency

    assert gate is not None
    assert (row["gate_batch_size"], row["gate_concurrency"]) == (gate.batch_size, gate.concurrency)
    assert (row["p50_ms"], row["p99_ms"], row["p99_upper_ms"], row["samples"]) == (
        gate.p50_ms,
        gate.p99_ms,
        gate.p99_upper_ms,
        gate.samples,
    )


def test_equal_measured_at_is_broken_by_the_larger_run_id(store: Store) -> None:
    for run_id in ("run-b", "run-a"):
        bundle = make_bundle(run_id, measured_at=EPOCH)
        store.write_run(bundle, make_samples(bundle))

    assert {r["run_id"] for r in store.matrix_rows()} == {"run-b"}


def test_latest_cells_filters_by_host_class(store: Store) -> None:
    for bundle in (
        make_bundle("run-1"),
        make_bundle("run-2", key=OTHER_KEY, host_class="arm-small"),
    ):
        store.write_run(bundle, make_samples(bundle))

    arm = store.latest_cells(host_class="arm-small")

    assert {cell.run_id for cell in arm} == {"run-2"}
    assert len(store.latest_cells()) == 4
    assert store.latest_cells(host_class="nope") == []


@settings(max_examples=20, deadline=None)
@given(
    runs=st.lists(
        st.tuples(
            st.sampled_from([KEY, OTHER_KEY]),
            st.integers(min_value=0, max_value=5),
            st.sets(st.sampled_from(["int8", "fp16", "pruned"]), max_size=3),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_latest_cells_is_the_newest_cell_of_every_key_and_digest(
    runs: list[tuple[HostClassKey, int, set[str]]],
) -> None:
    bundles = [
        make_bundle(
            f"run-{index}",
            key=key,
            candidates=tuple(sorted(names)),
            measured_at=EPOCH + timedelta(minutes=minute),
            samples=1,
        )
        for index, (key, minute, names) in enumerate(runs)
    ]
    newest: dict[tuple[tuple[str, str, str], str], tuple[datetime, str]] = {}
    for bundle in bundles:
        for cell in bundle.cells:
            slot = (cell.key.as_tuple(), cell.artifact_digest)
            rank = (cell.measured_at, cell.run_id)
            if slot not in newest or rank > newest[slot]:
                newest[slot] = rank

    with Store.open(MEMORY) as store:
        for bundle in bundles:
            store.write_run(bundle, empty_samples())
        latest = store.latest_cells()

    assert {(c.key.as_tuple(), c.artifact_digest): (c.measured_at, c.run_id) for c in latest} == (
        newest
    )


def test_samples_come_back_in_order_grouped_by_config(store: Store) -> None:
    bundle = make_bundle("run-1", samples=5)
    samples = make_samples(bundle, seed=7)
    shuffled = samples.take(pa.array(np.random.default_rng(1).permutation(samples.num_rows)))
    store.write_run(bundle, shuffled)
    digest = digest_of("int8")

    table = store.samples("run-1", digest)
    grouped = store.samples_by_config("run-1", digest)

    mine = samples.filter(pc.equal(samples["artifact_digest"], digest))
    assert table.column_names == ["batch_size", "concurrency", "dims", "seq", "latency_ns"]
    assert table["latency_ns"].to_pylist() == mine["latency_ns"].to_pylist()
    assert sorted(grouped) == [LatencyConfig(1, 1), LatencyConfig(1, 2)]
    assert grouped[LatencyConfig(1, 2)].tolist() == mine["latency_ns"].to_pylist()[5:]
    assert store.samples_by_config("run-1", digest_of("unknown")) == {}


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda t: t.drop_columns(["seq"]), r"missing \['seq'\]"),
        (lambda t: t.append_column("extra", t["seq"]), r"unexpected \['extra'\]"),
        (
            lambda t: t.set_column(5, "latency_ns", pc.cast(t["latency_ns"], pa.float64())),
            "'latency_ns' has type double",
        ),
        (
            lambda t: t.set_column(1, "batch_size", pa.array([None] * t.num_rows, type=pa.int32())),
            "'batch_size' has .* null",
        ),
        (
            lambda t: t.set_column(0, "artifact_digest", pa.array([digest_of("x")] * t.num_rows)),
            "no cell in the run",
        ),
        (
            lambda t: t.set_column(3, "dims", pa.array([None] * t.num_rows, type=pa.string())),
            "'dims' has .* null",
        ),
    ],
    ids=["missing", "extra", "float-latency", "nulls", "orphan-digest", "null-dims"],
)
def test_bad_samples_are_refused_and_nothing_is_written(
    store: Store, mutate: Callable[[pa.Table], pa.Table], expected: str
) -> None:
    bundle = make_bundle("run-1")
    bad = mutate(make_samples(bundle))

    with pytest.raises(BundleError, match=expected):
        store.write_run(bundle, bad)

    assert store.runs() == []


def test_narrower_integer_samples_are_accepted(store: Store) -> None:
    bundle = make_bundle("run-1", samples=3)
    samples = make_samples(bundle)
    wide = samples.set_column(2, "concurrency", pc.cast(samples["concurrency"], pa.int64()))

    assert store.write_run(bundle, wide) is True


def test_samples_from_before_swept_dims_are_stored_as_sweeping_none(store: Store) -> None:
    bundle = make_bundle("run-1", samples=3)
    old = make_samples(bundle).drop_columns(["dims"])

    assert store.write_run(bundle, old) is True
    grouped = store.samples_by_config("run-1", digest_of("int8"))
    assert sorted(grouped) == [LatencyConfig(1, 1), LatencyConfig(1, 2)]


def test_samples_of_configs_that_differ_only_in_dims_stay_apart(store: Store) -> None:
    bundle = make_bundle("run-1", samples=3)
    cells = []
    for cell in bundle.cells:
        swept = [
            r.model_copy(update={"dims": {"seq": size}})
            for r in cell.latency[:1]
            for size in (16, 64)
        ]
        cells.append(cell.model_copy(update={"latency": swept}))
    bundle = bundle.model_copy(update={"cells": cells})

    assert store.write_run(bundle, make_samples(bundle)) is True
    grouped = store.samples_by_config("run-1", digest_of("int8"))
    assert sorted(grouped) == [LatencyConfig(1, 1, "seq=16"), LatencyConfig(1, 1, "seq=64")]
    assert [len(v) for v in grouped.values()] == [3, 3]


def test_a_cell_from_another_run_is_refused(store: Store) -> None:
    bundle = make_bundle("run-1")
    stray = make_cell(run_id="run-9", name="stray")
    mixed = RunBundle(run=bundle.run, cells=[*bundle.cells, stray])

    with pytest.raises(BundleError, match=r"cells\.2 \(stray\): run_id 'run-9'"):
        store.write_run(mixed, make_samples(bundle))

    assert store.runs() == []


def test_export_parquet_writes_one_readable_file_per_table(store: Store, tmp_path: Path) -> None:
    bundle = make_bundle("run-1")
    samples = make_samples(bundle)
    store.write_run(bundle, samples)
    out = tmp_path / "export"

    paths = store.export_parquet(out)

    assert [p.name for p in paths] == [f"{name}.parquet" for name in EXPORTED]
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in paths)  # no temp left
    assert pq.read_table(out / "samples.parquet").num_rows == samples.num_rows
    assert pq.read_table(out / "cells.parquet").num_rows == 2
    assert pq.read_table(out / "matrix.parquet")["run_id"].to_pylist() == ["run-1", "run-1"]

    again = store.export_parquet(out, tables=["runs"])  # overwrites in place
    assert pq.read_table(again[0])["run_id"].to_pylist() == ["run-1"]
    with pytest.raises(MatrixError, match="cannot export"):
        store.export_parquet(out, tables=["runs; DROP TABLE runs"])


def test_snapshot_id_depends_only_on_the_runs_present(tmp_path: Path) -> None:
    bundles = [make_bundle(f"run-{i}") for i in range(3)]
    with Store.open(tmp_path / "a.duckdb") as a, Store.open(tmp_path / "b.duckdb") as b:
        empty = a.snapshot_id()
        for bundle in bundles:
            a.write_run(bundle, empty_samples())
        for bundle in reversed(bundles):
            b.write_run(bundle, empty_samples())

        assert a.snapshot_id() == b.snapshot_id() != empty
        assert a.snapshot_id().startswith("sha256:")
        a.write_run(make_bundle("run-9"), empty_samples())
        assert a.snapshot_id() != b.snapshot_id()


def test_a_document_the_encoder_made_is_stored_as_given_without_parsing_it_again(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from manifest.envelope import encode_canonical, encode_envelope

    text = encode_envelope([], encode_canonical({"version": 1, "entries": {"c": "é"}})).decode()
    parsed: list[str] = []
    monkeypatch.setattr("matrix.store.json.loads", lambda doc: parsed.append(doc))
    store.save_manifest(1, "r", EPOCH, EPOCH + timedelta(days=1), text, encoded=True)
    assert parsed == []  # 17 MB for 10,000 classes: the encoder's output is JSON already
    assert store.manifest(1) == text
    store.save_manifest(2, "r", EPOCH, EPOCH + timedelta(days=1), text)
    assert parsed == [text]  # text from anywhere else is parsed first


def test_manifests_are_stored_and_versions_only_go_up(store: Store) -> None:
    expires = EPOCH + timedelta(days=30)
    assert store.latest_manifest() is None
    store.save_manifest(3, "2025.03", EPOCH, expires, '{"version": 3}')
    store.save_manifest(4, "2025.03.1", EPOCH, expires, '{"version": 4}')

    with pytest.raises(ManifestVersionError, match=r"version 2 must be greater than .* 4"):
        store.save_manifest(2, "old", EPOCH, expires, '{"version": 2}')
    with pytest.raises(ManifestVersionError, match="use version 5 or higher"):
        store.save_manifest(4, "again", EPOCH, expires, '{"version": 4}')
    with pytest.raises(MatrixError, match="not valid JSON"):
        store.save_manifest(5, "broken", EPOCH, expires, "{nope")

    assert store.latest_manifest() is None  # reserved, not published: no reader sees them
    assert store.highest_manifest_version() == 4
    store.mark_published(3)
    assert store.latest_manifest() == (3, '{"version": 3}')
    store.mark_published(4)
    assert store.latest_manifest() == (4, '{"version": 4}')
    assert store.manifest(3) == '{"version": 3}'
    assert store.manifest(2) is None
    with pytest.raises(MatrixError, match="never recorded"):
        store.mark_published(7)


def test_a_matrix_from_before_publication_was_recorded_sees_its_manifests_published(
    db_path: Path,
) -> None:

    from matrix.migrations import MIGRATIONS

    # the schema as the release before publication left it
    conn = older_matrix(db_path, MIGRATIONS[:3])
    conn.execute("INSERT INTO manifests VALUES (1, 'r', now(), now(), '{\"version\": 1}', now())")
    conn.close()
    with Store.open(db_path) as store:
        assert store.latest_manifest() == (1, '{"version": 1}')


def test_a_read_only_store_refuses_writes(db_path: Path) -> None:
    Store.open(db_path).close()
    with Store.open(db_path, read_only=True) as store:
        assert store.runs() == []
        with pytest.raises(MatrixError, match="opened read-only"):
            store.write_run(make_bundle("run-1"), empty_samples())


@pytest.mark.parametrize("read_only", [True, False])
@pytest.mark.parametrize("content", [b"\xff\xfe\x00garbage", b"{}\n" * 100, bytes(range(256)) * 40])
def test_a_file_that_is_not_a_duckdb_database_is_refused_by_name_and_left_alone(
    tmp_path: Path, content: bytes, read_only: bool
) -> None:
    path = tmp_path / "notes.duckdb"
    path.write_bytes(content)
    with pytest.raises(MatrixError, match="is not a qualify matrix") as caught:
        Store.open(path, read_only=read_only, wait_s=0)
    assert str(path) in str(caught.value)
    assert path.read_bytes() == content


def test_a_pipe_given_as_the_matrix_is_refused_without_blocking(tmp_path: Path) -> None:
    import os

    path = tmp_path / "pipe"
    os.mkfifo(path)
    with pytest.raises(MatrixError, match="not a regular file"):
        Store.open(path)


def test_an_unserved_class_stays_unserved_until_its_key_is_measured_after(
    db_path: Path,
) -> None:
    from tests.matrix.factories import EPOCH, KEY

    now = [EPOCH - timedelta(days=1)]
    with Store.open(db_path, clock=lambda: now[0]) as store:
        store.note_unserved([("x86-fast", KEY)], "no host advertised the class")
        assert store.unserved() == {"x86-fast"}
        store.write_run(*_bundle_and_samples())  # measured at EPOCH: after the note
        assert store.unserved() == set()
        now[0] = EPOCH + timedelta(days=1)
        store.note_unserved([("x86-fast", KEY)], "no host advertised the class")
        assert store.unserved() == {"x86-fast"}  # a later fleet run found none again


def _bundle_and_samples() -> tuple[RunBundle, pa.Table]:
    bundle = make_bundle("run-1")
    return bundle, make_samples(bundle)


def test_connections_draw_no_progress_bar_into_a_commands_output(db_path: Path) -> None:
    # DuckDB draws one on stdout for any statement over two seconds (a large file's INSERT).
    for read_only in (False, True):
        with Store.open(db_path, read_only=read_only) as store:
            setting = store.connection.execute(
                "SELECT current_setting('enable_progress_bar')"
            ).fetchall()
            assert setting == [(False,)]
