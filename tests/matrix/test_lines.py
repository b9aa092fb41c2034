"""One matrix holds exactly one model line: the first run stamps it, every record, read and
decision of another line is refused by name, an older matrix is stamped from its records, and
one whose records already mix lines is refused until it is split."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pytest

from matrix.bundle import write_bundle
from matrix.errors import MatrixError, ModelLineError
from matrix.ingest import ingest_bundles
from matrix.migrations import MIGRATIONS
from matrix.store import Store
from schemas.cell import RunBundle
from tests.matrix.factories import make_bundle, make_samples, older_matrix

FIXED = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


def of_line(run_id: str, model: str) -> RunBundle:
    bundle = make_bundle(run_id)
    return bundle.model_copy(update={"run": bundle.run.model_copy(update={"model": model})})


def runs_in(path: Path) -> list[str]:
    with Store.open(path, read_only=True) as store:
        return [run.run_id for run in store.runs()]


def test_the_first_run_stamps_the_matrix_and_a_run_of_another_line_is_refused_whole(
    store: Store, db_path: Path
) -> None:
    assert store.model_line() is None
    first = of_line("r1", "ocr-rec")
    assert store.write_run(first, make_samples(first))
    assert store.model_line() == "ocr-rec"
    other = of_line("r2", "digits")
    with pytest.raises(ModelLineError) as caught:
        store.write_run(other, make_samples(other))
    message = str(caught.value)
    assert "'ocr-rec'" in message and "'digits'" in message and str(db_path) in message
    assert "--db" in message and "qualify-digits.duckdb" in message
    assert caught.value.exit_code == 2
    assert [run.run_id for run in store.runs()] == ["r1"]
    assert store.cells(run_id="r2") == []


def test_opening_for_another_line_is_refused_read_only_too(db_path: Path) -> None:
    with Store.open(db_path, model="ocr-rec") as store:  # a new matrix becomes the line's
        assert store.model_line() == "ocr-rec"
    for read_only in (True, False):
        with pytest.raises(ModelLineError, match=r"holds model line 'ocr-rec'.*'digits'"):
            Store.open(db_path, read_only=read_only, model="digits")
    with Store.open(db_path, read_only=True, model="ocr-rec") as store:
        assert store.model_line() == "ocr-rec"


def test_a_read_only_open_of_an_empty_matrix_stamps_nothing(db_path: Path) -> None:
    Store.open(db_path).close()
    with Store.open(db_path, read_only=True, model="ocr-rec") as store:
        assert store.model_line() is None


def test_ingesting_a_bundle_of_another_line_writes_nothing_of_any_bundle(
    tmp_path: Path, db_path: Path
) -> None:
    paths = []
    for run_id, model in (("r1", "ocr-rec"), ("r2", "digits"), ("r3", "ocr-rec")):
        bundle = of_line(run_id, model)
        paths.append(write_bundle(bundle, make_samples(bundle), tmp_path / "bundles"))
    with Store.open(db_path) as store, pytest.raises(ModelLineError) as caught:
        ingest_bundles(store, paths)
    message = str(caught.value)
    assert str(paths[1]) in message and "'digits'" in message and "'ocr-rec'" in message
    assert "nothing was ingested" in message
    assert runs_in(db_path) == []
    with Store.open(db_path) as store:
        report = ingest_bundles(store, [paths[0], paths[2]])
        assert [b.status for b in report.bundles] == ["ingested", "ingested"]
        with pytest.raises(ModelLineError, match="holds 'ocr-rec'"):
            ingest_bundles(store, [paths[1]])
    assert runs_in(db_path) == ["r1", "r3"]


def _version_12_matrix(path: Path, bundles: list[RunBundle]) -> None:
    """A matrix as the qualify before the stamp left it, with these runs in it."""
    older_matrix(path, [m for m in MIGRATIONS if m.version <= 12]).close()
    # Its rows as the old writer made them: the store's own insert, without the stamp's check.
    conn = duckdb.connect(str(path))
    try:
        store = Store(conn, path=str(path), read_only=False, clock=lambda: FIXED)
        for bundle in bundles:
            _write_unchecked(store, bundle)
    finally:
        conn.close()


def _write_unchecked(store: Store, bundle: RunBundle) -> None:
    from matrix import rows as module

    conn = store.connection
    rows = [("runs", module.run_row(bundle, 0, FIXED))]
    rows += [("cells", module.cell_row(c)) for c in bundle.cells]
    for table, whole in rows:
        # Only the columns the old schema has: columns added since were not the old writer's.
        have = {
            name
            for (name,) in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = ?", [table]
            ).fetchall()
        }
        row = {k: v for k, v in whole.items() if k in have}
        names = ", ".join(f'"{c}"' for c in row)
        marks = ", ".join("?" for _ in row)
        conn.execute(f"INSERT INTO {table} ({names}) VALUES ({marks})", list(row.values()))


def test_an_older_matrix_is_stamped_with_the_line_its_runs_name(db_path: Path) -> None:
    _version_12_matrix(db_path, [of_line("r1", "ocr-rec"), of_line("r2", "ocr-rec")])
    with Store.open(db_path, clock=lambda: FIXED) as store:
        assert store.model_line() == "ocr-rec"
    with pytest.raises(ModelLineError, match="holds model line 'ocr-rec'"):
        Store.open(db_path, model="digits")


def test_an_older_matrix_that_mixes_lines_is_refused_until_split(
    db_path: Path, tmp_path: Path
) -> None:
    _version_12_matrix(
        db_path,
        [of_line("r1", "ocr-rec"), of_line("r2", "digits"), of_line("r3", "ocr-rec")],
    )
    with pytest.raises(ModelLineError) as caught:
        Store.open(db_path, model="ocr-rec")
    message = str(caught.value)
    assert "mixes model lines 'digits' (1 runs), 'ocr-rec' (2 runs)" in message
    assert f"qualify matrix split --db {db_path} --model digits --out" in message
    assert "--model ocr-rec --out" in message

    ocr, digits = tmp_path / "ocr.duckdb", tmp_path / "digits.duckdb"
    copied = Store.split_model_line(db_path, "ocr-rec", ocr, clock=lambda: FIXED)
    assert copied["runs"] == 2 and copied["cells"] == 4
    Store.split_model_line(db_path, "digits", digits, clock=lambda: FIXED)
    with Store.open(ocr, model="ocr-rec") as store:
        assert [r.run_id for r in store.runs()] == ["r1", "r3"]
    with Store.open(digits, read_only=True, model="digits") as store:
        assert [r.run_id for r in store.runs()] == ["r2"]
        assert {c.run_id for c in store.cells()} == {"r2"}
    with pytest.raises(ModelLineError):  # the source is untouched, and still refused
        Store.open(db_path, model="digits")
    with pytest.raises(MatrixError, match="exists already"):
        Store.split_model_line(db_path, "digits", digits)
    with pytest.raises(MatrixError, match="no run or manifest of model line 'speech'"):
        Store.split_model_line(db_path, "speech", tmp_path / "speech.duckdb")
    assert not (tmp_path / "speech.duckdb").exists()
