"""Migrations: recorded in schema_migrations, applied once, and a newer database is refused."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pytest

from matrix.errors import MatrixError, SchemaVersionError
from matrix.migrations import LATEST_VERSION, MIGRATIONS
from matrix.store import Store
from tests.matrix.factories import before, older_matrix

FIXED = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_opening_a_new_file_records_every_migration(db_path: Path) -> None:
    with Store.open(db_path, clock=lambda: FIXED) as store:
        applied = store.migrations()
        assert [(m.version, m.name) for m in applied] == [(m.version, m.name) for m in MIGRATIONS]
        assert all(m.applied_at == FIXED for m in applied)
        assert store.schema_version == LATEST_VERSION


def test_reopening_applies_nothing_twice(db_path: Path) -> None:
    with Store.open(db_path, clock=lambda: FIXED):
        pass
    later = datetime(2026, 1, 1, tzinfo=UTC)
    with Store.open(db_path, clock=lambda: later) as store:
        applied = store.migrations()
    assert len(applied) == len(MIGRATIONS)
    assert {m.applied_at for m in applied} == {FIXED}


def test_a_database_from_a_newer_qualify_is_refused_with_both_versions(db_path: Path) -> None:
    Store.open(db_path).close()
    conn = duckdb.connect(str(db_path))
    conn.execute(
        "INSERT INTO schema_migrations VALUES (?, 'from the future', now())", [LATEST_VERSION + 1]
    )
    conn.close()
    with pytest.raises(SchemaVersionError) as caught:
        Store.open(db_path)
    message = str(caught.value)
    assert str(db_path) in message
    assert f"version {LATEST_VERSION + 1}" in message
    assert "upgrade qualify" in message


def test_read_only_open_of_an_unmigrated_file_says_how_to_migrate(db_path: Path) -> None:
    duckdb.connect(str(db_path)).close()
    with pytest.raises(SchemaVersionError, match="open it once read-write"):
        Store.open(db_path, read_only=True)


def test_read_only_open_of_a_missing_file_names_it(db_path: Path) -> None:
    with pytest.raises(MatrixError, match=f"no matrix at {db_path}"):
        Store.open(db_path, read_only=True)


def test_a_version_4_matrix_keeps_its_latency_and_samples_as_sweeping_no_dims(
    db_path: Path,
) -> None:
    conn = older_matrix(db_path, MIGRATIONS[:4])
    conn.execute(
        "INSERT INTO latency VALUES ('r1', 'sha256:a', 1, 2, true, 700, 1, 1, 2, 3, 1, 1.5, 2.5, "
        "0.99, 'pass', 'decided', 1.0, NULL)"
    )
    conn.execute("INSERT INTO samples VALUES ('r1', 'sha256:a', 1, 2, 0, 1000)")
    conn.close()

    with Store.open(db_path, clock=lambda: FIXED) as store:
        assert store.schema_version == LATEST_VERSION
        assert store.samples("r1", "sha256:a").to_pylist() == [
            {"batch_size": 1, "concurrency": 2, "dims": "", "seq": 0, "latency_ns": 1000}
        ]
    conn = duckdb.connect(str(db_path))
    try:
        assert conn.execute("SELECT dims, p99_ms FROM latency").fetchall() == [("", 2.0)]
        # The new key: the same (run, artifact, batch, concurrency) at another size is a new row.
        conn.execute(
            "INSERT INTO latency SELECT * REPLACE ('seq=64' AS dims) FROM latency WHERE dims = ''"
        )
        with pytest.raises(duckdb.ConstraintException):
            conn.execute("INSERT INTO latency SELECT * FROM latency WHERE dims = ''")
    finally:
        conn.close()


def test_an_upgrade_that_fails_part_way_leaves_the_version_the_file_had(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from matrix import migrations

    conn = duckdb.connect(str(db_path))
    migrations.apply_migrations(conn, source=str(db_path), now=lambda: FIXED)
    broken = (
        migrations.Migration(
            version=LATEST_VERSION + 1, name="adds a table", statements=("CREATE TABLE t1 (a INT)",)
        ),
        migrations.Migration(
            version=LATEST_VERSION + 2, name="fails", statements=("SELECT * FROM no_such_table",)
        ),
    )
    monkeypatch.setattr(migrations, "MIGRATIONS", (*MIGRATIONS, *broken))
    with pytest.raises(duckdb.Error):
        migrations.apply_migrations(conn, source=str(db_path), now=lambda: FIXED)
    # Nothing of the upgrade stayed: not the first new migration, not its table.
    assert migrations.current_version(conn) == LATEST_VERSION
    found = conn.execute("SELECT table_name FROM information_schema.tables").fetchall()
    tables = {row[0] for row in found}
    assert "t1" not in tables
    conn.close()


def test_a_copy_of_an_older_matrix_is_migrated_in_memory_and_the_file_left_alone(
    db_path: Path,
) -> None:
    conn = older_matrix(db_path, MIGRATIONS[:4])
    conn.execute("INSERT INTO samples VALUES ('r1', 'sha256:a', 1, 2, 0, 1000)")
    conn.close()
    before = db_path.read_bytes()
    with Store.open_copy(db_path, clock=lambda: FIXED) as copy:
        assert copy.read_only and copy.path == str(db_path)
        assert copy.schema_version == LATEST_VERSION
        assert copy.samples("r1", "sha256:a").to_pylist() == [
            {"batch_size": 1, "concurrency": 2, "dims": "", "seq": 0, "latency_ns": 1000}
        ]
        with pytest.raises(MatrixError, match="opened read-only"):
            copy.save_manifest(1, "r", FIXED, FIXED, "{}")
    assert db_path.read_bytes() == before


def test_a_copy_of_a_newer_matrix_is_refused_before_anything_is_copied(db_path: Path) -> None:
    Store.open(db_path).close()
    conn = duckdb.connect(str(db_path))
    conn.execute("INSERT INTO schema_migrations VALUES (?, 'next', now())", [LATEST_VERSION + 1])
    conn.close()
    with pytest.raises(SchemaVersionError, match="upgrade qualify") as caught:
        Store.open_copy(db_path)
    assert caught.value.found == LATEST_VERSION + 1 and not caught.value.older


@pytest.mark.parametrize("content", [None, b"not a database at all, only words\n" * 4])
def test_a_copy_of_a_missing_or_foreign_file_is_refused_by_name(
    db_path: Path, content: bytes | None
) -> None:
    if content is not None:
        db_path.write_bytes(content)
    with pytest.raises(MatrixError, match=str(db_path)):
        Store.open_copy(db_path)


def test_cells_from_before_numerics_were_recorded_read_as_native_or_another_isas(
    db_path: Path,
) -> None:
    conn = older_matrix(db_path, before("cells.numerics"))
    for digest, mismatch, cell in (
        ("sha256:a", [], "{}"),
        ("sha256:b", ["arch x86_64, class aarch64"], "{}"),
        ("sha256:c", [], '{"numerics": {"source": "emulated", "cpu": "Haswell"}}'),
    ):
        conn.execute(
            "INSERT INTO cells (run_id, artifact_digest, host_class, hardware, runtime, provider, "
            "artifact_name, role, precision, verdict, reason_codes, reasons, emulated, "
            "measured_at, settings_digest, cell, isa_mismatch) VALUES ('r1', ?, 'c', 'h', 'r', "
            "'p', ?, 'candidate', 'int8', 'pass', [], '[]', false, ?, 's', ?, ?)",
            [digest, digest[-1], FIXED, cell, mismatch],
        )
    conn.close()
    with Store.open(db_path) as store:
        rows = {r["artifact_name"]: (r["numerics"], r["numerics_cpu"]) for r in store.matrix_rows()}
    assert rows == {"a": ("native", None), "b": ("other_isa", None), "c": ("emulated", "Haswell")}


def test_cells_from_before_off_provider_nodes_were_named_read_as_not_named(
    db_path: Path,
) -> None:
    conn = older_matrix(db_path, before("cells.off_provider_nodes"))
    named = '{"name": "relu", "op_type": "Relu", "domain": "", "provider": "CPUExecutionProvider"}'
    for digest, cell in (
        ("sha256:a", "{}"),  # recorded before nodes were named
        ("sha256:b", '{"placement": {"off_provider_nodes": [' + named + "]}}"),
    ):
        conn.execute(
            "INSERT INTO cells (run_id, artifact_digest, host_class, hardware, runtime, provider, "
            "artifact_name, role, precision, verdict, reason_codes, reasons, emulated, "
            "measured_at, settings_digest, cell, isa_mismatch) VALUES ('r1', ?, 'c', 'h', 'r', "
            "'p', ?, 'candidate', 'int8', 'pass', [], '[]', false, ?, 's', ?, [])",
            [digest, digest[-1], FIXED, cell],
        )
    conn.close()
    with Store.open(db_path) as store:
        rows = {r["artifact_name"]: r["off_provider_nodes"] for r in store.matrix_rows()}
    assert rows == {
        "a": None,
        "b": [
            {"name": "relu", "op_type": "Relu", "domain": "", "provider": "CPUExecutionProvider"}
        ],
    }
