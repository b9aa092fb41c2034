"""Loading the project file: every mistake gets a message with file, line, field, found and fix."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML

from qualify.errors import ProjectError
from qualify.project.load import (
    PROJECT_FILENAME,
    LoadedProject,
    dump_project,
    load_project,
    parse_project,
    write_project,
)
from schemas.base import NAME_RE
from schemas.generate import SCHEMA_DIR
from schemas.project import (
    Artifacts,
    ArtifactSpec,
    Budgets,
    HostClass,
    HostClassKey,
    InputSpec,
    Project,
    RuntimeSpec,
    Workload,
)
from tests.models import passthrough
from tests.qualify.projects import run_qualify

VALID = """\
model: ocr-rec
artifacts:
  baseline: {path: models/rec-fp32.onnx}
  candidates:
    - {path: models/rec-int8.onnx, precision: int8, derived_from: baseline}
workload:
  inputs:
    x: {shape: [1, 3, 8, 8], dtype: float32, source: recorded, file: data/x.npy}
  batch_sizes: [1]
  concurrency: [1, 2]
parity: {int8: {max_abs: 0.05, cosine_min: 0.99, top1_agreement_min: 0.98}}
policy: {unknown_class: hold, allow_emulated: false}
host_classes:
  arm-r5:
    key: {hardware: arm-r5, runtime: ort-r8, provider: cpu-int8}
    match: {arch: aarch64, cpu_flags: [asimddp]}
    runtime: {package: onnxruntime, version: "1.31.*"}
    provider: {execution_providers: [CPUExecutionProvider], intra_op_threads: 2}
    budgets: {p99_ms: 82, peak_rss_mb: 512, cold_init_ms: 1500}
  x86-avx2:
    key: {hardware: x86-avx2, runtime: ort-r8, provider: cpu}
    budgets:
      p99_ms: 40
"""


def write_tree(root: Path, text: str = VALID, *, files: bool = True) -> Path:
    """A project folder: the YAML plus two real one-node models and a recorded input."""
    root.mkdir(parents=True, exist_ok=True)
    if files:
        (root / "models").mkdir(exist_ok=True)
        (root / "data").mkdir(exist_ok=True)
        passthrough(root / "models" / "rec-fp32.onnx", ["N", 3, 8, 8])
        passthrough(root / "models" / "rec-int8.onnx", ["N", 3, 8, 8])
        np.save(root / "data" / "x.npy", np.zeros((4, 3, 8, 8), dtype=np.float32))
    path = root / PROJECT_FILENAME
    path.write_text(text, encoding="utf-8")
    return path


def load_error(path: Path) -> str:
    with pytest.raises(ProjectError) as caught:
        load_project(path)
    return str(caught.value)


def line_of(text: str, needle: str, nth: int = 1) -> int:
    """1-based number of the nth line containing needle."""
    hits = [i for i, line in enumerate(text.splitlines(), start=1) if needle in line]
    return hits[nth - 1]


def column_of(text: str, needle: str, nth: int = 1) -> int:
    """1-based column where needle starts on the nth line containing it."""
    line = text.splitlines()[line_of(text, needle, nth) - 1]
    return line.index(needle) + 1


# --- a valid project ------------------------------------------------------------------------


def test_valid_project_loads_with_absolute_path_and_root(tmp_path: Path) -> None:
    path = write_tree(tmp_path / "proj")
    loaded = load_project(path)
    assert isinstance(loaded, LoadedProject)
    assert loaded.path == path
    assert loaded.root == tmp_path / "proj"
    assert loaded.project.model == "ocr-rec"
    assert list(loaded.project.host_classes) == ["arm-r5", "x86-avx2"]
    assert loaded.project.host_classes["x86-avx2"].budgets.p99_ms == 40


def test_paths_resolve_against_the_project_file_not_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_tree(tmp_path / "proj")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    loaded = load_project(Path("..") / "proj" / PROJECT_FILENAME)
    baseline = loaded.resolve(loaded.project.artifacts.baseline.path)
    assert baseline == tmp_path / "proj" / "models" / "rec-fp32.onnx"
    assert baseline.is_absolute() and baseline.is_file()
    assert loaded.root.is_absolute()


def test_absolute_artifact_path_is_allowed_and_kept(tmp_path: Path) -> None:
    shared = tmp_path / "shared" / "base.onnx"
    passthrough(shared, ["N", 3, 8, 8])
    text = VALID.replace("path: models/rec-fp32.onnx", f"path: {shared}")
    loaded = load_project(write_tree(tmp_path / "proj", text))
    assert loaded.resolve(loaded.project.artifacts.baseline.path) == shared


def test_yaml_merge_keys_may_share_settings_between_classes(tmp_path: Path) -> None:
    text = VALID.replace(
        "    budgets: {p99_ms: 82, peak_rss_mb: 512, cold_init_ms: 1500}",
        "    budgets: &budgets {p99_ms: 82, peak_rss_mb: 512, cold_init_ms: 1500}",
    ).replace(
        "    budgets:\n      p99_ms: 40\n", "    budgets:\n      <<: *budgets\n      p99_ms: 40\n"
    )
    loaded = load_project(write_tree(tmp_path, text))
    budgets = loaded.project.host_classes["x86-avx2"].budgets
    assert (budgets.p99_ms, budgets.peak_rss_mb) == (40, 512)


def test_class_named_like_a_yaml_boolean_stays_a_name(tmp_path: Path) -> None:
    text = VALID.replace("  x86-avx2:\n", "  on:\n")
    loaded = load_project(write_tree(tmp_path, text))
    assert "on" in loaded.project.host_classes


# --- the file itself --------------------------------------------------------------------------


def test_missing_project_file_says_how_to_create_one(tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / PROJECT_FILENAME
    message = load_error(path)
    assert str(path) in message
    assert "not found" in message
    assert "qualify demo --workdir" in message


def test_folder_instead_of_file_points_at_the_file_inside(tmp_path: Path) -> None:
    message = load_error(tmp_path)
    assert str(tmp_path) in message
    assert "folder" in message and PROJECT_FILENAME in message


def test_empty_file_is_refused(tmp_path: Path) -> None:
    path = write_tree(tmp_path, "# nothing here\n")
    message = load_error(path)
    assert str(path) in message and "empty" in message and "qualify demo" in message


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    text = VALID.replace("  batch_sizes: [1]\n", "  batch_sizes: [1\n")
    path = write_tree(tmp_path, text)
    message = load_error(path)
    assert f"{path}:" in message
    assert "not valid YAML" in message
    # The parser notices the unclosed list on the next line.
    reported = int(message.split(f"{path}:", 1)[1].split(":", 1)[0])
    assert reported in (line_of(text, "batch_sizes"), line_of(text, "batch_sizes") + 1)
    assert "Fix:" in message


def test_tab_indentation_gets_a_spaces_hint(tmp_path: Path) -> None:
    text = VALID.replace("  batch_sizes: [1]\n", "\tbatch_sizes: [1]\n")
    path = write_tree(tmp_path, text)
    message = load_error(path)
    assert f"{path}:{line_of(text, 'batch_sizes')}:1: not valid YAML" in message
    assert "Fix: indent with spaces, not tabs." in message


def test_top_level_list_is_refused_with_the_expected_keys(tmp_path: Path) -> None:
    path = write_tree(tmp_path, "- model: x\n- artifacts: {}\n")
    message = load_error(path)
    assert f"{path}:1:1:" in message
    assert "top level must be a mapping" in message
    assert "model, artifacts, workload" in message
    assert "found a list" in message


# --- validation errors --------------------------------------------------------------------------


def test_unknown_key_lists_the_allowed_keys(tmp_path: Path) -> None:
    text = VALID.replace("  batch_sizes: [1]\n", "  batch_sizes: [1]\n  colour: red\n")
    path = write_tree(tmp_path, text)
    message = load_error(path)
    assert f"{path}:{line_of(text, 'colour')}:3: workload.colour: unknown key 'colour'" in message
    assert "Expected one of: aa_control, batch_sizes, concurrency, confidence, dims, inputs," in (
        message
    )


def test_misspelt_key_suggests_the_nearest_field(tmp_path: Path) -> None:
    text = VALID.replace("  concurrency: [1, 2]", "  concurency: [1, 2]")
    message = load_error(write_tree(tmp_path, text))
    assert "workload.concurency: unknown key 'concurency'" in message
    assert "Fix: rename it to 'concurrency'." in message


def test_wrong_type_names_expected_and_found(tmp_path: Path) -> None:
    text = VALID.replace("  concurrency: [1, 2]", "  concurrency: [1, 2]\n  warmup: many")
    path = write_tree(tmp_path, text)
    message = load_error(path)
    line, col = line_of(text, "warmup"), column_of(text, "many")
    assert f"{path}:{line}:{col}: workload.warmup: must be an integer, found 'many'." in message
    assert "Fix: write an integer, e.g. warmup: 2." in message


def test_unquoted_version_number_gets_a_quoting_hint(tmp_path: Path) -> None:
    text = VALID.replace('version: "1.31.*"', "version: 1.31")
    message = load_error(write_tree(tmp_path, text))
    assert "host_classes.arm-r5.runtime.version: must be a string, found 1.31." in message
    assert 'Fix: quote it: version: "1.31".' in message


def test_missing_baseline_says_what_to_add(tmp_path: Path) -> None:
    text = VALID.replace("  baseline: {path: models/rec-fp32.onnx}\n", "")
    path = write_tree(tmp_path, text)
    message = load_error(path)
    # Points at the artifacts mapping that lacks it (its first remaining key).
    line = line_of(text, "candidates:")
    assert f"{path}:{line}:3: artifacts.baseline: required field is missing." in message
    assert "Fix: add 'baseline: {path: models/model.onnx}' under artifacts." in message


def test_missing_input_shape_says_what_to_add(tmp_path: Path) -> None:
    text = VALID.replace("    x: {shape: [1, 3, 8, 8], dtype", "    x: {dtype")
    message = load_error(write_tree(tmp_path, text))
    assert "workload.inputs.x.shape: required field is missing." in message
    assert "Fix: add 'shape: [1, 3, 224, 224]' under workload.inputs.x." in message


def test_budget_not_above_zero_names_line_column_field_and_value(tmp_path: Path) -> None:
    text = VALID.replace("      p99_ms: 40", "      p99_ms: -5")
    path = write_tree(tmp_path, text)
    message = load_error(path)
    line, col = line_of(text, "p99_ms: -5"), column_of(text, "-5")
    assert message == (
        f"{path}:{line}:{col}: host_classes.x86-avx2.budgets.p99_ms: must be greater than 0, "
        "found -5. Fix: set a positive budget in milliseconds."
    )


def test_zero_memory_budget_says_megabytes(tmp_path: Path) -> None:
    text = VALID.replace("peak_rss_mb: 512", "peak_rss_mb: 0")
    message = load_error(write_tree(tmp_path, text))
    assert "host_classes.arm-r5.budgets.peak_rss_mb: must be greater than 0, found 0." in message
    assert "set a positive budget in megabytes" in message


def test_empty_host_classes_is_refused(tmp_path: Path) -> None:
    head = VALID.split("host_classes:")[0]
    text = head + "host_classes: {}\n"
    path = write_tree(tmp_path, text)
    message = load_error(path)
    line = line_of(text, "host_classes")
    assert f"{path}:{line}:15: host_classes: must have at least 1 item, found an empty mapping" in (
        message
    )
    assert "define at least one host class" in message


def test_host_classes_left_blank_says_it_needs_a_value(tmp_path: Path) -> None:
    text = VALID.split("host_classes:")[0] + "host_classes:\n"
    message = load_error(write_tree(tmp_path, text))
    assert "host_classes: must be a mapping, found nothing (null)." in message


def test_unknown_precision_family_points_at_the_key(tmp_path: Path) -> None:
    text = VALID.replace("parity: {int8:", "parity: {int4:")
    path = write_tree(tmp_path, text)
    message = load_error(path)
    line, col = line_of(text, "int4"), column_of(text, "int4")
    assert f"{path}:{line}:{col}: parity.int4: unknown key 'int4'" in message
    assert "Expected one of: fp16, fp32, int8, post, pruned. Fix: rename it to 'int8'." in message


def test_model_rule_message_is_kept_at_its_place(tmp_path: Path) -> None:
    text = VALID.replace(", file: data/x.npy}", "}")
    path = write_tree(tmp_path, text)
    message = load_error(path)
    line = line_of(text, "    x: {shape")
    assert f"{path}:{line}:8: workload.inputs.x: a recorded input needs 'file'" in message


def test_duplicate_host_class_key_points_at_the_second_class(tmp_path: Path) -> None:
    text = VALID.replace(
        "key: {hardware: x86-avx2, runtime: ort-r8, provider: cpu}",
        "key: {hardware: arm-r5, runtime: ort-r8, provider: cpu-int8}",
    )
    path = write_tree(tmp_path, text)
    message = load_error(path)
    second_key_line = line_of(text, "key: {hardware: arm-r5", nth=2)
    first_line = line_of(text, "arm-r5:")
    assert f"{path}:{second_key_line}:10: host_classes.x86-avx2.key:" in message
    assert "[arm-r5, ort-r8, cpu-int8]" in message
    assert f"as host class 'arm-r5' (line {first_line})" in message
    assert "Fix:" in message


def test_duplicate_yaml_key_is_refused_instead_of_silently_kept(tmp_path: Path) -> None:
    text = VALID.replace("      p99_ms: 40\n", "      p99_ms: 40\n      p99_ms: 400\n")
    path = write_tree(tmp_path, text)
    message = load_error(path)
    line = line_of(text, "p99_ms: 400")
    assert f"{path}:{line}:7: host_classes.x86-avx2.budgets.p99_ms: duplicate key 'p99_ms'" in (
        message
    )
    assert f"first at line {line - 1}" in message


def test_duplicate_host_class_name_is_refused(tmp_path: Path) -> None:
    text = VALID.replace("  x86-avx2:\n", "  arm-r5:\n")
    message = load_error(write_tree(tmp_path, text))
    assert "host_classes.arm-r5: duplicate key 'arm-r5'" in message


def test_every_problem_is_reported_one_line_each(tmp_path: Path) -> None:
    text = (
        VALID.replace("      p99_ms: 40", "      p99_ms: -5")
        .replace("  concurrency: [1, 2]", "  concurrency: [1, 2]\n  colour: red")
        .replace("model: ocr-rec\n", "model: ocr-rec\nmodel: again\n")
    )
    path = write_tree(tmp_path, text)
    lines = load_error(path).splitlines()
    assert lines[0] == f"{path}: 3 problems:"
    assert [line.split(": ", 2)[1] for line in lines[1:]] == [
        "model",
        "workload.colour",
        "host_classes.x86-avx2.budgets.p99_ms",
    ]
    assert all(line.startswith(f"{path}:") for line in lines)


# --- files named by the project ---------------------------------------------------------------


def test_missing_candidate_file_names_the_absolute_path(tmp_path: Path) -> None:
    path = write_tree(tmp_path)
    (tmp_path / "models" / "rec-int8.onnx").unlink()
    message = load_error(path)
    line, col = line_of(VALID, "rec-int8.onnx"), column_of(VALID, "models/rec-int8.onnx")
    missing = tmp_path / "models" / "rec-int8.onnx"
    assert (
        f"{path}:{line}:{col}: artifacts.candidates[0].path: file not found: {missing}." in message
    )
    assert f"relative paths are resolved against {tmp_path}" in message


def test_missing_baseline_file_is_refused(tmp_path: Path) -> None:
    path = write_tree(tmp_path)
    (tmp_path / "models" / "rec-fp32.onnx").unlink()
    message = load_error(path)
    assert f"artifacts.baseline.path: file not found: {tmp_path / 'models' / 'rec-fp32.onnx'}" in (
        message
    )


def test_missing_recorded_input_file_is_refused(tmp_path: Path) -> None:
    path = write_tree(tmp_path)
    (tmp_path / "data" / "x.npy").unlink()
    message = load_error(path)
    line, col = line_of(VALID, "data/x.npy"), column_of(VALID, "data/x.npy")
    assert (
        f"{path}:{line}:{col}: workload.inputs.x.file: file not found: "
        f"{tmp_path / 'data' / 'x.npy'}." in message
    )


def test_recorded_input_that_is_not_npy_is_refused(tmp_path: Path) -> None:
    path = write_tree(tmp_path)
    (tmp_path / "data" / "x.npy").write_text("a,b\n1,2\n")
    message = load_error(path)
    assert "workload.inputs.x.file: not a .npy file" in message
    assert "numpy.save" in message


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files regardless of permissions")
def test_unreadable_artifact_is_refused(tmp_path: Path) -> None:
    path = write_tree(tmp_path)
    artifact = tmp_path / "models" / "rec-fp32.onnx"
    artifact.chmod(0)
    try:
        message = load_error(path)
    finally:
        artifact.chmod(0o644)
    assert "artifacts.baseline.path: cannot read" in message


def test_all_missing_files_are_reported_together(tmp_path: Path) -> None:
    path = write_tree(tmp_path, files=False)
    lines = load_error(path).splitlines()
    assert lines[0] == f"{path}: 3 problems:"
    assert sum("file not found" in line for line in lines) == 3


# --- the published JSON Schema ----------------------------------------------------------------


def project_schema() -> dict[str, object]:
    schema: dict[str, object] = json.loads(
        (SCHEMA_DIR / "project.schema.json").read_text(encoding="utf-8")
    )
    return schema


def test_published_schema_accepts_a_valid_project_file() -> None:
    validator = jsonschema.Draft202012Validator(project_schema())
    assert list(validator.iter_errors(YAML(typ="safe", pure=True).load(VALID))) == []


def test_published_schema_rejects_an_unknown_key() -> None:
    data = YAML(typ="safe", pure=True).load(VALID)
    data["workload"]["colour"] = "red"
    errors = list(jsonschema.Draft202012Validator(project_schema()).iter_errors(data))
    assert len(errors) == 1
    assert "colour" in errors[0].message
    assert list(errors[0].absolute_path) == ["workload"]


# --- writing --------------------------------------------------------------------------------


def test_dump_keeps_the_readable_key_order_and_round_trips(tmp_path: Path) -> None:
    project = load_project(write_tree(tmp_path)).project
    text = dump_project(project)
    top = [line.split(":")[0] for line in text.splitlines() if line and not line[0].isspace()]
    assert top == ["model", "artifacts", "workload", "parity", "policy", "host_classes"]
    assert parse_project(text) == project
    assert parse_project(dump_project(project, include_defaults=True)) == project


def test_write_project_replaces_the_file_atomically(tmp_path: Path) -> None:
    path = write_tree(tmp_path)
    project = load_project(path).project
    changed = project.model_copy(update={"model": "ocr-rec-v2"})
    write_project(changed, path)
    assert load_project(path).project == changed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "models", PROJECT_FILENAME]


def test_write_project_into_a_missing_folder_fails_and_leaves_nothing(tmp_path: Path) -> None:
    project = load_project(write_tree(tmp_path)).project
    with pytest.raises(FileNotFoundError):
        write_project(project, tmp_path / "absent" / PROJECT_FILENAME)
    assert not (tmp_path / "absent").exists()


texts = st.text(alphabet=st.characters(exclude_categories=["Cs"]), min_size=1, max_size=24)
names = st.from_regex(NAME_RE, fullmatch=True)


@settings(max_examples=60, deadline=None)
@given(model=names, class_name=names, hardware=names, version=texts)
def test_any_names_survive_a_dump_and_parse(
    model: str, class_name: str, hardware: str, version: str
) -> None:
    project = Project(
        model=model,
        artifacts=Artifacts(baseline=ArtifactSpec(path="models/m.onnx")),
        workload=Workload(inputs={"x": InputSpec(shape=[1, 4], source="generated")}),
        host_classes={
            class_name: HostClass(
                key=HostClassKey(hardware=hardware, runtime="ort", provider="cpu"),
                runtime=RuntimeSpec(version=version),
                budgets=Budgets(p99_ms=12.5),
            )
        },
    )
    assert parse_project(dump_project(project)) == project


# --- providers: no silent fallback by default -----------------------------------------------


def test_class_requesting_cuda_without_expected_is_judged_on_cuda(tmp_path: Path) -> None:
    text = VALID.replace(
        "provider: {execution_providers: [CPUExecutionProvider], intra_op_threads: 2}",
        "provider: {execution_providers: [CUDAExecutionProvider, CPUExecutionProvider]}",
    )
    provider = load_project(write_tree(tmp_path, text)).project.host_classes["arm-r5"].provider
    assert provider.expected == "CUDAExecutionProvider"


def test_misspelt_provider_is_a_load_error_with_a_suggestion(tmp_path: Path) -> None:
    text = VALID.replace("[CPUExecutionProvider]", "[CPUExecutionprovider]")
    message = load_error(write_tree(tmp_path, text))
    assert f":{line_of(text, 'CPUExecutionprovider')}:" in message
    assert "host_classes.arm-r5.provider" in message
    assert "unknown execution provider 'CPUExecutionprovider'" in message
    assert "did you mean 'CPUExecutionProvider'?" in message


def test_expected_provider_must_be_one_of_the_requested(tmp_path: Path) -> None:
    text = VALID.replace(
        "intra_op_threads: 2}", "intra_op_threads: 2, expected: CUDAExecutionProvider}"
    )
    message = load_error(write_tree(tmp_path, text))
    assert "expected provider 'CUDAExecutionProvider' is not among the requested" in message


def test_session_config_and_scalar_provider_options_load_and_count_in_the_digest(
    tmp_path: Path,
) -> None:
    plain = load_project(write_tree(tmp_path / "a")).project.host_classes["arm-r5"]
    text = VALID.replace(
        "intra_op_threads: 2}",
        "intra_op_threads: 2, session_config: {session.x64quantprecision: 1, "
        "session.intra_op.allow_spinning: false}, "
        "provider_options: {CPUExecutionProvider: {arena_extend_strategy: kSameAsRequested}}}",
    )
    tuned = load_project(write_tree(tmp_path / "b", text)).project.host_classes["arm-r5"]
    assert tuned.provider.session_config == {
        "session.x64quantprecision": 1,
        "session.intra_op.allow_spinning": False,
    }
    assert tuned.settings_digest() != plain.settings_digest()


def test_session_config_keys_qualify_sets_itself_are_refused(tmp_path: Path) -> None:
    text = VALID.replace(
        "intra_op_threads: 2}",
        "intra_op_threads: 2, session_config: {session.disable_cpu_ep_fallback: 1}}",
    )
    message = load_error(write_tree(tmp_path, text))
    assert "'session.disable_cpu_ep_fallback' is set by qualify itself" in message
    assert "strict_fallback: true" in message


def test_strict_fallback_with_a_fallback_provider_listed_is_refused_at_load(
    tmp_path: Path,
) -> None:
    # onnxruntime refuses such a session ("Conflicting session configuration"): every cell
    # would be an error. Refused where the project loads, naming the file, field and fix.
    text = VALID.replace(
        "provider: {execution_providers: [CPUExecutionProvider], intra_op_threads: 2}",
        "provider: {execution_providers: [CUDAExecutionProvider, CPUExecutionProvider], "
        "strict_fallback: true}",
    )
    path = write_tree(tmp_path, text)
    message = load_error(path)
    assert str(path) in message and "host_classes.arm-r5" in message
    assert "strict_fallback is true" in message
    assert "lists CPUExecutionProvider to fall back to" in message
    assert "list only CUDAExecutionProvider" in message and "strict_fallback: false" in message
    proc = run_qualify("run", "--host-class", "arm-r5", "--project", str(path), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "strict_fallback" in proc.stderr and "Traceback" not in proc.stderr


def test_strict_fallback_with_only_the_expected_provider_loads(tmp_path: Path) -> None:
    text = VALID.replace(
        "provider: {execution_providers: [CPUExecutionProvider], intra_op_threads: 2}",
        "provider: {execution_providers: [CUDAExecutionProvider], strict_fallback: true}",
    )
    loaded = load_project(write_tree(tmp_path, text))
    assert loaded.project.host_classes["arm-r5"].provider.strict_fallback


def test_strict_fallback_on_the_cpu_provider_itself_is_refused(tmp_path: Path) -> None:
    # The CPU provider listed at all conflicts with CPU fallback disabled, even alone.
    text = VALID.replace("intra_op_threads: 2}", "intra_op_threads: 2, strict_fallback: true}")
    message = load_error(write_tree(tmp_path, text))
    assert "lists CPUExecutionProvider to fall back to" in message


# --- the workload against the model's own graph ---------------------------------------------


def test_an_input_name_the_model_does_not_have_lists_its_real_inputs(tmp_path: Path) -> None:
    text = VALID.replace("    x: {shape:", "    images: {shape:")
    message = load_error(write_tree(tmp_path, text))
    line, col = line_of(text, "images:"), column_of(text, "images:")
    assert (
        f":{line}:{col}: workload.inputs.images: rec-fp32 (and rec-int8) has no input named 'images'"
        in message
    )
    assert "has no input named 'images'; its inputs are: x float32 [N, 3, 8, 8]" in message
    assert "needs input x float32 [N, 3, 8, 8]" in message  # no rename: 'images' is far from 'x'
    assert "rename" not in message


def test_a_misspelt_input_name_gets_did_you_mean(tmp_path: Path) -> None:
    text = VALID.replace("    x: {shape:", "    x_: {shape:")
    message = load_error(write_tree(tmp_path, text))
    assert "Fix: rename it to 'x'" in message


def test_a_dtype_the_model_does_not_take_names_the_right_one(tmp_path: Path) -> None:
    path = write_tree(tmp_path)
    passthrough(tmp_path / "models" / "rec-fp32.onnx", ["N", 3, 8, 8], elem_type=7)  # int64
    passthrough(tmp_path / "models" / "rec-int8.onnx", ["N", 3, 8, 8], elem_type=7)
    message = load_error(path)
    line = line_of(VALID, "x: {shape:")
    assert f":{line}:" in message
    assert (
        "workload.inputs.x.dtype: is float32, but input 'x' of rec-fp32 (and rec-int8) takes int64"
        in message
    )
    assert "Fix: set dtype: int64." in message


def test_a_rank_mismatch_is_a_load_error_with_the_model_shape(tmp_path: Path) -> None:
    text = VALID.replace("shape: [1, 3, 8, 8]", "shape: [1, 192]")
    message = load_error(write_tree(tmp_path, text))
    assert (
        "workload.inputs.x.shape: [1, 192] has rank 2, but input 'x' of rec-fp32 (and rec-int8) is"
        in message
    )
    assert "x float32 [N, 3, 8, 8] (rank 4)" in message


def test_a_static_dimension_mismatch_proposes_the_model_shape(tmp_path: Path) -> None:
    text = VALID.replace("shape: [1, 3, 8, 8]", "shape: [1, 3, 8, 9]")
    message = load_error(write_tree(tmp_path, text))
    assert (
        "workload.inputs.x.shape: dimension 3 is 9, but input 'x' of rec-fp32 (and rec-int8)"
        in message
    )
    assert "Fix: set shape: [1, 3, 8, 8]." in message


def test_a_fixed_batch_axis_refuses_other_batch_sizes(tmp_path: Path) -> None:
    path = write_tree(tmp_path, VALID.replace("batch_sizes: [1]", "batch_sizes: [1, 4]"))
    passthrough(tmp_path / "models" / "rec-fp32.onnx", [1, 3, 8, 8])
    message = load_error(path)
    assert "workload.batch_sizes: batch size(s) [4] cannot run" in message
    assert "a fixed batch axis of 1" in message
    assert "Fix: use batch_sizes: [1], or export the model with a dynamic batch axis." in message


def test_a_candidate_whose_inputs_differ_from_the_baseline_is_refused(tmp_path: Path) -> None:
    path = write_tree(tmp_path)
    passthrough(tmp_path / "models" / "rec-int8.onnx", ["N", 3, 8, 8], input_name="input")
    message = load_error(path)
    assert "rec-int8 has no input named 'x'; its inputs are: input float32" in message
    assert "rec-fp32" not in message


def test_empty_and_text_files_are_not_onnx_models(tmp_path: Path) -> None:
    path = write_tree(tmp_path)
    (tmp_path / "models" / "rec-fp32.onnx").write_bytes(b"")
    (tmp_path / "models" / "rec-int8.onnx").write_text("<html>404 Not Found</html>\n")
    message = load_error(path)
    assert "artifacts.baseline.path:" in message and "artifacts.candidates[0].path:" in message
    assert message.count("not an ONNX model") == 2


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=256))
def test_random_bytes_as_a_model_never_crash_the_loader(tmp_path_factory, data: bytes) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("fuzz")
    path = write_tree(root)
    (root / "models" / "rec-int8.onnx").write_bytes(data)
    with pytest.raises(ProjectError, match=r"artifacts\.candidates\[0\]\.path"):
        load_project(path)


def test_derived_from_must_name_an_artifact(tmp_path: Path) -> None:
    text = VALID.replace("derived_from: baseline", "derived_from: rec-fp23")
    message = load_error(write_tree(tmp_path, text))
    line = line_of(text, "derived_from")
    assert f":{line}:" in message
    assert "artifacts.candidates[0].derived_from: 'rec-fp23' names no artifact" in message
    assert "did you mean 'rec-fp32'?" in message


def test_derived_from_itself_is_refused(tmp_path: Path) -> None:
    text = VALID.replace("derived_from: baseline", "derived_from: rec-int8")
    assert "names the artifact itself" in load_error(write_tree(tmp_path, text))


def test_a_tolerance_for_an_output_the_model_lacks_is_refused(tmp_path: Path) -> None:
    text = VALID.replace(
        "parity: {int8: {max_abs: 0.05, cosine_min: 0.99, top1_agreement_min: 0.98}}",
        "parity: {int8: {max_abs: 0.05, outputs: {logits: {max_abs: 0.1}}}}",
    )
    message = load_error(write_tree(tmp_path, text))
    assert "parity.int8.outputs.logits: the baseline has no output named 'logits'" in message
    assert "its outputs are: y float32 [N, 3, 8, 8]" in message


def test_top1_agreement_on_an_output_it_cannot_apply_to_is_refused(tmp_path: Path) -> None:
    text = VALID.replace(
        "parity: {int8: {max_abs: 0.05, cosine_min: 0.99, top1_agreement_min: 0.98}}",
        "parity: {int8: {max_abs: 0.05, outputs: {y: {top1_agreement_min: 0.98}}}}",
    ).replace("shape: [1, 3, 8, 8]", "shape: [1, 3, 8, 1]")
    path = write_tree(tmp_path, text)
    passthrough(tmp_path / "models" / "rec-fp32.onnx", ["N", 3, 8, 1])
    passthrough(tmp_path / "models" / "rec-int8.onnx", ["N", 3, 8, 1])
    np.save(tmp_path / "data" / "x.npy", np.zeros((4, 3, 8, 1), dtype=np.float32))
    message = load_error(path)
    assert "parity.int8.outputs.y.top1_agreement_min: cannot apply to output y float32" in message
    assert "its last axis has one element" in message


def test_family_top1_agreement_that_fits_no_output_is_refused(tmp_path: Path) -> None:
    text = VALID.replace("shape: [1, 3, 8, 8]", "shape: [4]").replace(
        "source: recorded, file: data/x.npy", "source: fixed, value: 1"
    )
    path = write_tree(tmp_path, text)
    passthrough(tmp_path / "models" / "rec-fp32.onnx", [4])
    passthrough(tmp_path / "models" / "rec-int8.onnx", [4])
    message = load_error(path)
    assert "parity.int8.top1_agreement_min: cannot apply to any output of the baseline" in message
    assert "rank 1" in message


def test_an_output_described_in_the_workload_must_be_one_the_model_has(tmp_path: Path) -> None:
    text = VALID.replace(
        "  batch_sizes: [1]\n",
        "  outputs: {yy: {batch_axis: 1, kind: scores}}\n  batch_sizes: [1]\n",
    )
    message = load_error(write_tree(tmp_path, text))
    assert "workload.outputs.yy: the baseline has no output named 'yy'" in message
    assert "rename it to 'y'" in message
    good = VALID.replace(
        "  batch_sizes: [1]\n", "  outputs: {y: {kind: values}}\n  batch_sizes: [1]\n"
    )
    loaded = load_project(write_tree(tmp_path / "good", good))
    assert loaded.project.workload.outputs["y"].kind == "values"


def test_task_level_tolerances_need_a_post_hook_that_answers(tmp_path: Path) -> None:
    text = VALID.replace(
        "parity: {int8: {max_abs: 0.05, cosine_min: 0.99, top1_agreement_min: 0.98}}",
        "parity:\n  int8: {max_abs: 0.05}\n  post: {text: {exact_match_min: 0.95}}",
    )
    message = load_error(write_tree(tmp_path, text))
    assert "parity.post sets tolerances of the post hook's answers" in message
    assert "workload.pipeline.post is not set" in message


def test_a_task_tolerance_out_of_range_names_its_field(tmp_path: Path) -> None:
    text = VALID.replace(
        "parity: {int8: {max_abs: 0.05, cosine_min: 0.99, top1_agreement_min: 0.98}}",
        "parity: {post: {boxes: {box_f1_min: 0.9, iou: 1.5}}}",
    )
    message = load_error(write_tree(tmp_path, text))
    assert "parity.post.boxes.iou" in message
