"""``qualify init``: a project file from the model's own inputs, which loads and runs as written."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from matrix.store import Store
from qualify.cli import cli
from qualify.project.load import load_project
from qualify.run import RunOptions, qualify_run
from tests.models import IR_VERSION, OPSET, build


def _sequence_model(folder: Path) -> Path:
    """``tokens`` float32 [N, seq, 8] and ``mask`` int64 [N, seq] -> ``pooled`` [N, 8]."""
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["tokens"], ["pooled"], axes=[1], keepdims=0),
            helper.make_node("Cast", ["mask"], ["mask_f"], to=TensorProto.FLOAT),
            helper.make_node("ReduceSum", ["mask_f"], ["count"], keepdims=0),
        ],
        "seq",
        [
            helper.make_tensor_value_info("tokens", TensorProto.FLOAT, ["N", "seq", 8]),
            helper.make_tensor_value_info("mask", TensorProto.INT64, ["N", "seq"]),
        ],
        [
            helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["N", 8]),
            helper.make_tensor_value_info("count", TensorProto.FLOAT, []),
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", min(OPSET, 13))], ir_version=IR_VERSION
    )
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "encoder.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def _init(tmp_path: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["init", *args, "--out", str(tmp_path / "qualify.yaml")])
    return result.exit_code, result.output


def test_init_writes_the_models_inputs_with_dynamic_axes_made_explicit(tmp_path: Path) -> None:
    model = _sequence_model(tmp_path / "models")
    code, said = _init(tmp_path, str(model))
    assert code == 0, said
    text = (tmp_path / "qualify.yaml").read_text()
    assert '"tokens": {shape: [1, "seq", 8], dtype: float32' in text
    assert '"mask": {shape: [1, "seq"], dtype: int64' in text
    assert "dims:\n    seq: [16, 64, 256]" in text
    assert "SET:" in text and "CHOOSE" in text
    project = load_project(tmp_path / "qualify.yaml").project
    assert project.artifacts.baseline.path == "models/encoder.onnx"
    assert list(project.host_classes) == ["this-host"]
    assert project.workload.dim_points == [{"seq": 16}, {"seq": 64}, {"seq": 256}]


def test_init_gives_an_unnamed_dynamic_axis_a_size_and_names_odd_symbols_safely(
    tmp_path: Path,
) -> None:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "odd",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", None, "len\n# x: 1"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", None, "len\n# x: 1"])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION
    )
    path = tmp_path / "odd.onnx"
    path.write_bytes(model.SerializeToString())
    code, said = _init(tmp_path, str(path))
    assert code == 0, said
    text = (tmp_path / "qualify.yaml").read_text()
    assert "axis 1 is dynamic (unnamed): 16 chosen" in text
    workload = load_project(tmp_path / "qualify.yaml").project.workload
    assert workload.inputs["x"].shape == [1, 16, "len_x_1"]
    assert workload.dims == {"len_x_1": [16, 64, 256]}


@pytest.mark.slow
def test_the_written_project_runs_as_written_at_every_swept_length(tmp_path: Path) -> None:
    model = _sequence_model(tmp_path / "models")
    assert _init(tmp_path, str(model))[0] == 0
    outcome = qualify_run(
        load_project(tmp_path / "qualify.yaml"),
        "this-host",
        RunOptions(db_path=tmp_path / "m.duckdb"),
    )
    (cell,) = outcome.bundle.cells
    assert cell.verdict == "pass", cell.reasons
    assert not outcome.bundle.run.emulated
    assert [r.dims for r in cell.latency] == [{"seq": 16}, {"seq": 64}, {"seq": 256}]
    assert all(r.samples >= 662 for r in cell.latency)
    with Store.open(tmp_path / "m.duckdb", read_only=True) as store:
        stored = store.samples_by_config(cell.run_id, cell.artifact_digest)
    assert sorted(stored) == sorted(r.config for r in cell.latency)
    assert [stored[r.config].size for r in cell.latency] == [r.samples for r in cell.latency]


def test_candidates_are_listed_with_a_precision_guessed_from_their_names(tmp_path: Path) -> None:
    base = build("identity_mlp", tmp_path / "m")
    other = build("identity_mlp_perturbed", tmp_path / "m")
    int8 = tmp_path / "m" / "mlp-int8.onnx"
    int8.write_bytes(other.read_bytes())
    code, said = _init(tmp_path, str(base), "--candidate", str(other), "--candidate", str(int8))
    assert code == 0, said
    project = load_project(tmp_path / "qualify.yaml").project
    assert [(c.label, c.precision) for c in project.artifacts.candidates] == [
        ("identity_mlp_perturbed", "fp32"),
        ("mlp-int8", "int8"),
    ]


def test_init_refuses_to_replace_a_project_and_refuses_a_file_that_is_not_onnx(
    tmp_path: Path,
) -> None:
    model = build("identity_mlp", tmp_path)
    (tmp_path / "qualify.yaml").write_text("model: mine\n")
    code, said = _init(tmp_path, str(model))
    assert code == 2 and "exists; pass --force" in said
    assert (tmp_path / "qualify.yaml").read_text() == "model: mine\n"
    junk = tmp_path / "notes.onnx"
    junk.write_text("not a model")
    code, said = _init(tmp_path, str(junk), "--force")
    assert code == 2 and "notes.onnx" in said and "Traceback" not in said
    assert (tmp_path / "qualify.yaml").read_text() == "model: mine\n"


def _odd_model(folder: Path, inputs: list[tuple[str, list[int | str]]]) -> Path:
    """A model whose inputs are ``inputs`` (name, shape), each summed into one output."""
    nodes = [
        helper.make_node("ReduceSum", [name], [f"s{k}"], keepdims=0)
        for k, (name, _) in enumerate(inputs)
    ]
    graph = helper.make_graph(
        nodes,
        "odd",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n, shape in inputs],
        [helper.make_tensor_value_info(f"s{k}", TensorProto.FLOAT, []) for k in range(len(inputs))],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", min(OPSET, 13))], ir_version=IR_VERSION
    )
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "odd.onnx"
    path.write_bytes(model.SerializeToString())
    return path


ODD_INPUTS: dict[str, list[tuple[str, list[int | str]]]] = {
    "a dimension of 2^40": [("x", ["N", 2**40])],
    "two inputs of one name": [("x", ["N", 4]), ("x", ["N", 8])],
    "a name of 10,000 characters": [("x" * 10_000, ["N", 4])],
}


@pytest.mark.parametrize("case", sorted(ODD_INPUTS))
@pytest.mark.parametrize("existing", [False, True])
def test_init_from_a_model_no_workload_can_describe_writes_nothing_and_keeps_the_old_file(
    tmp_path: Path, case: str, existing: bool
) -> None:
    model = _odd_model(tmp_path / "models", ODD_INPUTS[case])
    out = tmp_path / "qualify.yaml"
    if existing:  # a good project, written first: --force must not replace it with a bad one
        good = build("identity_mlp", tmp_path / "models")
        assert _init(tmp_path, str(good))[0] == 0
    before = out.read_bytes() if existing else None
    code, said = _init(tmp_path, str(model), *(["--force"] if existing else []))
    assert code == 2, said
    assert said.startswith(f"error: {model}: ") and said.count("\n") == 1 and len(said) < 1500
    assert "Traceback" not in said
    if existing:
        assert out.read_bytes() == before
        load_project(out)
    else:
        assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models", *(["qualify.yaml"] * existing)]
