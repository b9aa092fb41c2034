"""``Store.decision_cells`` and ``decision_runs``: deciding on the latest cell per (key, digest,
settings, emulated), and the runs those cells and the rollback checks need, equals deciding on
every cell and run of the matrix, whatever its history.

Generation reads only those cells (``qualify.release.generate``), so a matrix that keeps every run's cells,
release after release, costs a generation its groups, not its history. Random fleets of up to
three runs per class (stale settings, emulated runs, cells on another class's key, rollback
checks that failed) are written to a real DuckDB matrix and decided both ways.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given, settings

from manifest.errors import PolicyError
from manifest.policy import decide
from matrix.samples import empty_samples
from matrix.store import Store
from schemas.cell import Cell, RunBundle, RunRecord
from schemas.manifest import Manifest
from tests.manifest.factories import Fleet, digest_of, fixed_key, signed_manifest
from tests.manifest.test_properties import build_fleet, fleet_strategy


def _read_back(
    fleet: Fleet, path: Path
) -> tuple[list[Cell], list[Cell], dict[str, RunRecord], dict[str, RunRecord]]:
    """The fleet written to a matrix at ``path``, read back: every cell, the decision cells,
    every run and the decision runs (by id)."""
    with Store.open(path) as db:
        for run_id, run in fleet.runs.items():
            cells = [c for c in fleet.cells if c.run_id == run_id]
            db.write_run(RunBundle(run=run, cells=cells), empty_samples())
        return (
            db.cells(),
            db.decision_cells(),
            {r.run_id: r for r in db.runs()},
            {r.run_id: r for r in db.decision_runs()},
        )


def _digests(spec_fleet: Fleet) -> dict[str, str]:
    arts = spec_fleet.project.artifacts
    return {
        label: digest_of(label)
        for label in (arts.baseline.label, *(c.label for c in arts.candidates))
    }


@settings(max_examples=30, deadline=None)
@given(fleet_strategy)
def test_deciding_on_the_decision_cells_equals_deciding_on_every_cell(spec: dict[str, Any]) -> None:
    fleet = build_fleet(spec)
    with tempfile.TemporaryDirectory() as tmp:
        every, chosen, runs, needed = _read_back(fleet, Path(tmp) / "m.duckdb")
    assert {(c.run_id, c.artifact_digest) for c in chosen} <= {
        (c.run_id, c.artifact_digest) for c in every
    }
    assert set(needed) <= set(runs)
    digests = _digests(fleet)
    assert decide(fleet.project, chosen, needed, digests=digests) == decide(
        fleet.project, every, runs, digests=digests
    )


@settings(max_examples=30, deadline=None)
@given(fleet_strategy)
def test_the_decision_cells_grouped_by_key_decide_as_the_cells_do(spec: dict[str, Any]) -> None:
    fleet = build_fleet(spec)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.duckdb"
        _, chosen, _, needed = _read_back(fleet, path)
        with Store.open(path, read_only=True) as db:
            grouped = db.decision_cells_by_key()
    # each group is that key's decision cells, in decision_cells' order
    expected: dict[tuple[str, str, str], list[Cell]] = {}
    for cell in chosen:
        expected.setdefault(cell.key.as_tuple(), []).append(cell)
    assert grouped == expected
    for digests in (_digests(fleet), None):  # labels from the cells themselves too
        assert _outcome(fleet, grouped, needed, digests) == _outcome(fleet, chosen, needed, digests)


def _outcome(fleet: Fleet, cells: Any, runs: dict[str, RunRecord], digests: Any) -> Any:
    """The decisions, or the refusal when a class needs a baseline whose digest is unknown."""
    try:
        return decide(fleet.project, cells, runs, digests=digests)
    except PolicyError as exc:
        return str(exc)


def test_a_class_requalified_again_and_again_is_decided_on_its_latest_cells(
    tmp_path: Path,
) -> None:
    fleet = build_fleet(
        {
            "classes": [{"fallback_allowance": 0, "runs": []}],
            "unknown_class": "hold",
            "allow_emulated": False,
            "seed": 0,
        }
    )
    for _ in range(5):
        fleet.qualify("c0", candidate="a-int8")
    fleet.qualify(
        "c0", candidate="a-int8", emulated=True
    )  # the latest, but emulated: not the rollback's proof
    every, chosen, runs, needed = _read_back(fleet, tmp_path / "m.duckdb")
    assert len(every) == 12
    # Per digest: the latest of the five real runs, and the emulated one; their runs.
    assert sorted(c.run_id for c in chosen) == ["run-0005", "run-0005", "run-0006", "run-0006"]
    assert sorted(needed) == ["run-0005", "run-0006"]
    digests = _digests(fleet)
    found = decide(fleet.project, chosen, needed, digests=digests)
    assert found == decide(fleet.project, every, runs, digests=digests)
    # The latest cells are emulated, which this project refuses: held, with the rollback still
    # proven by the newest real run.
    assert (found[0].decision, found[0].rollback_proven) == ("hold", True)
    assert "emulated" in {r.code for r in found[0].reasons}


def test_a_rollback_check_newer_than_every_cell_of_its_artifact_is_kept(tmp_path: Path) -> None:
    spec = {"classes": [{"fallback_allowance": 0, "runs": []}]}
    fleet = build_fleet({**spec, "unknown_class": "hold", "allow_emulated": False, "seed": 0})
    fleet.qualify("c0", candidate="a-int8")  # v1 gives the class a-int8: its next rollback
    previous = Manifest.model_validate(signed_manifest(fleet, fixed_key()))
    given = previous.signed.entries["c0"].artifact
    assert given is not None and given.name == "a-int8"
    a_int8 = digest_of("a-int8")
    # A run of b-int8 that checked the rollback a-int8 and saw it fail to load, then a later
    # run of b-int8 that checked nothing: the failed check is the newest word on a-int8, in a
    # run none of whose cells is the latest of its group.
    fleet.qualify("c0", candidate="b-int8", rollback_digest=a_int8, rollback_loaded=False)
    fleet.qualify("c0", candidate="b-int8", rollback_loaded=None)
    every, chosen, runs, needed = _read_back(fleet, tmp_path / "m.duckdb")
    assert "run-0002" in needed and "run-0002" not in {c.run_id for c in chosen}
    digests = _digests(fleet)
    found = decide(fleet.project, chosen, needed, previous=previous, digests=digests)
    assert found == decide(fleet.project, every, runs, previous=previous, digests=digests)
    # a-int8's newest word is the failed check: not proven to load, so not the rollback
    assert found[0].rollback_digest != a_int8
    assert found[0].decision == "candidate" and found[0].rollback_proven


@settings(max_examples=20, deadline=None)
@given(fleet_strategy)
def test_the_decision_cells_hold_the_latest_cell_of_every_key_and_digest(
    spec: dict[str, Any],
) -> None:
    # `release_check` cites the reasons of the matrix's latest cells from the decision cells.
    fleet = build_fleet(spec)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.duckdb"
        _read_back(fleet, path)
        with Store.open(path, read_only=True) as db:
            latest = {(c.run_id, c.artifact_digest) for c in db.latest_cells()}
            chosen = {(c.run_id, c.artifact_digest) for c in db.decision_cells()}
    assert latest <= chosen
