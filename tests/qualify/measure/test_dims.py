"""Swept dimensions (``workload.dims``): named sizes in input shapes, each combination a latency
config, the pool built at the largest sizes and cut per config."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from qualify.errors import ProjectError
from qualify.measure.workload import build_pool
from qualify.project.load import load_project
from qualify.run import RunOptions, qualify_run
from schemas.cell import LatencyConfig, dims_text
from schemas.project import InputSpec, Workload


def _workload(**extra: object) -> Workload:
    inputs = {
        "tokens": {"shape": [1, "seq", 8], "source": "generated", "seed": 3},
        "mask": {"shape": [1, "seq"], "dtype": "int64", "source": "generated", "high": 2},
    }
    return Workload.model_validate({"inputs": inputs, "dims": {"seq": [16, 64, 32]}, **extra})


def test_every_combination_of_sizes_is_a_point_in_the_order_written() -> None:
    wl = Workload.model_validate(
        {
            "inputs": {"x": {"shape": [1, "h", "w"], "source": "generated"}},
            "dims": {"h": [8, 4], "w": [2, 2, 3]},
        }
    )
    assert wl.dim_points == [
        {"h": 8, "w": 2},
        {"h": 8, "w": 3},
        {"h": 4, "w": 2},
        {"h": 4, "w": 3},
    ]
    assert wl.largest_dims == {"h": 8, "w": 3}
    assert dims_text({"w": 3, "h": 8}) == "h=8,w=3"
    config = LatencyConfig(2, 1, "h=8,w=3")
    assert config.sizes == {"h": 8, "w": 3}
    assert config.label == "batch 2, concurrency 1, h 8, w 3"
    assert LatencyConfig(1, 1).label == "batch 1, concurrency 1"


@pytest.mark.parametrize(
    ("doc", "said"),
    [
        ({"inputs": {"x": {"shape": [1, "seq"], "source": "generated"}}}, "does not give sizes"),
        (
            {"inputs": {"x": {"shape": [1, 4], "source": "generated"}}, "dims": {"seq": [4]}},
            "named in no input's shape",
        ),
        (
            {
                "inputs": {"x": {"shape": [1, "a", "b", "c"], "source": "generated"}},
                "dims": {k: list(range(1, 6)) for k in "abc"},
            },
            "125 combinations",
        ),
        (
            {"inputs": {"x": {"shape": [1, "9x"], "source": "generated"}}, "dims": {"9x": [4]}},
            "not a dimension name",
        ),
        (
            {"inputs": {"x": {"shape": [1, "seq"], "source": "generated"}}, "dims": {"seq": []}},
            "at least 1 item",
        ),
        (
            {"inputs": {"x": {"shape": [1, "seq"], "source": "generated"}}, "dims": {"seq": [0]}},
            "greater than 0",
        ),
        (
            {
                "inputs": {"x": {"shape": [1, "seq", 4096], "source": "generated"}},
                "dims": {"seq": [16, 2**20]},
            },
            "GiB of input data",
        ),
    ],
    ids=["undeclared", "unused", "too-many", "bad-name", "no-sizes", "zero", "too-big"],
)
def test_a_bad_sweep_is_refused_saying_what_to_write(doc: dict[str, object], said: str) -> None:
    with pytest.raises(ValidationError, match=said):
        Workload.model_validate(doc)


def test_a_huge_sweep_is_refused_without_building_its_combinations() -> None:
    doc = {
        "inputs": {"x": {"shape": [1, *(f"d{k}" for k in range(12))], "source": "generated"}},
        "dims": {f"d{k}": list(range(1, 65)) for k in range(12)},
    }
    with pytest.raises(ValidationError, match="combinations"):
        Workload.model_validate(doc)


def test_the_pool_holds_generated_samples_at_the_largest_size(tmp_path: Path) -> None:
    pool = build_pool(_workload(), lambda p: tmp_path / p)
    assert pool["tokens"].shape == (256, 64, 8)
    assert pool["mask"].shape == (256, 64)
    assert set(np.unique(pool["mask"])) <= {0, 1}


def test_a_recorded_file_longer_than_the_largest_size_gives_its_leading_part(
    tmp_path: Path,
) -> None:
    recorded = np.arange(5 * 100 * 8, dtype=np.float32).reshape(5, 100, 8)
    np.save(tmp_path / "tokens.npy", recorded)
    wl = _workload()
    inputs = dict(wl.inputs)
    inputs["tokens"] = InputSpec(shape=[1, "seq", 8], source="recorded", file="tokens.npy")
    pool = build_pool(wl.model_copy(update={"inputs": inputs}), lambda p: tmp_path / p)
    assert pool["tokens"].shape == (5, 64, 8)
    assert np.array_equal(pool["tokens"], recorded[:, :64, :])


def test_a_recorded_file_shorter_than_the_largest_size_is_refused_by_name(
    tmp_path: Path,
) -> None:
    np.save(tmp_path / "tokens.npy", np.zeros((5, 40, 8), np.float32))
    wl = _workload()
    inputs = dict(wl.inputs)
    inputs["tokens"] = InputSpec(shape=[1, "seq", 8], source="recorded", file="tokens.npy")
    with pytest.raises(ProjectError) as caught:
        build_pool(wl.model_copy(update={"inputs": inputs}), lambda p: tmp_path / p)
    message = str(caught.value)
    assert "tokens.npy" in message and "workload.inputs.tokens.file" in message
    assert "'>=64'" in message and "[5, 40, 8]" in message


_SEEN_HOOK = """
from pathlib import Path

_seen = set()


def seen(feed):
    shape = tuple(feed["tokens"].shape), tuple(feed["mask"].shape)
    if shape not in _seen:
        _seen.add(shape)
        with open(Path(__file__).with_name("shapes.txt"), "a") as out:
            out.write(repr(shape) + "\\n")
    return feed
"""


@pytest.mark.slow
def test_each_swept_config_feeds_the_model_at_its_own_size(tmp_path: Path) -> None:
    from tests.qualify.project.test_init import _init, _sequence_model

    _sequence_model(tmp_path / "models")
    assert _init(tmp_path, str(tmp_path / "models" / "encoder.onnx"))[0] == 0
    project = tmp_path / "qualify.yaml"
    text = project.read_text().replace("seq: [16, 64, 256]", "seq: [4, 32]")
    text = text.replace("workload:\n", "workload:\n  pipeline: {pre: 'prep:seen'}\n", 1)
    text = text.replace("  batch_sizes: [1]", "  batch_sizes: [1, 3]")
    project.write_text(text + "")
    (tmp_path / "prep.py").write_text(_SEEN_HOOK)

    outcome = qualify_run(load_project(project), "this-host", RunOptions(db_path=tmp_path / "m"))

    (cell,) = outcome.bundle.cells
    assert cell.verdict == "pass", cell.reasons
    assert [(r.batch_size, r.dims) for r in cell.latency] == [
        (1, {"seq": 4}),
        (3, {"seq": 4}),
        (1, {"seq": 32}),
        (3, {"seq": 32}),
    ]
    fed = set((tmp_path / "shapes.txt").read_text().split("\n")) - {""}
    # Cold init and parity at the largest size, one row; then each config at its own.
    assert fed == {repr(((b, s, 8), (b, s))) for b, s in [(1, 32), (1, 4), (3, 4), (3, 32)]}


def test_an_input_fed_whole_is_cut_to_each_size_and_stays_contiguous(tmp_path: Path) -> None:
    from qualify.measure.feeds import at_dims, batch
    from tests.models import build
    from tests.qualify.jobs import make_job

    wl = Workload.model_validate(
        {
            "inputs": {
                "x": {"shape": [1, "seq", 4], "source": "generated"},
                "table": {"shape": [3, "seq"], "source": "generated", "batch_axis": None},
                "rate": {"shape": [], "source": "fixed", "value": 2, "batch_axis": None},
            },
            "dims": {"seq": [2, 5]},
        }
    )
    pool = build_pool(wl, lambda p: tmp_path / p)
    job = make_job(tmp_path, build("identity_mlp", tmp_path), workload=wl)
    feed = batch(at_dims(pool, job, {"seq": 2}), job, 0, 3)
    assert feed["x"].shape == (3, 2, 4)
    assert feed["table"].shape == (3, 2) and feed["table"].flags.c_contiguous
    assert feed["rate"].shape == ()  # a scalar stays rank 0
    assert np.array_equal(feed["table"], pool["table"][0][:, :2])
