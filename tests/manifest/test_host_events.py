"""What a deployed host writes: events from a real onnxruntime session and from a real
resolve-artifact, valid against the published schema, appended one line each, sampled and light to
import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jsonschema
import onnxruntime as ort
import pytest

from manifest import envelope, lookup, resolve
from manifest.host_events import (
    PLACEMENT_OPTION,
    append_event,
    event_from_resolution,
    format_time,
    placement_of,
    record_session,
    session_settings,
)
from schemas.generate import SCHEMA_DIR
from schemas.settings import decode_settings, qualified_settings, settings_differences
from schemas.telemetry import TelemetryEvent
from tests.manifest.factories import GOLDEN, digest_of, fixed_key, scenario, signed_manifest
from tests.models import build

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((SCHEMA_DIR / "telemetry-event.schema.json").read_text())
DIGEST = digest_of("rec-int8")
WHEN = datetime(2025, 6, 1, 12, 0, 0, 250000, tzinfo=UTC)


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def valid(event: dict[str, Any]) -> TelemetryEvent:
    """Valid against both the published JSON Schema and the model."""
    jsonschema.validate(event, SCHEMA)
    return TelemetryEvent.model_validate_json(json.dumps(event))


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build("identity_mlp", tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def recording_session(model: Path) -> Iterator[ort.InferenceSession]:
    options = ort.SessionOptions()
    options.add_session_config_entry(PLACEMENT_OPTION, "1")
    yield ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])


def record(session: Any, path: Path, **kw: Any) -> dict[str, Any] | None:
    args: dict[str, Any] = {
        "path": path,
        "host_class": "x86-vnni",
        "model_digest": DIGEST,
        "manifest_version": 3,
        "expected_provider": "CPUExecutionProvider",
        "latency_ms": 1.25,
        "sample_rate": 1.0,
        "host": "web-01",
        "when": WHEN,
    }
    args.update(kw)
    return record_session(session, **args)


def test_a_real_session_records_the_providers_that_received_nodes(
    recording_session: ort.InferenceSession, tmp_path: Path
) -> None:
    out = tmp_path / "t.jsonl"
    event = record(recording_session, out)
    assert event is not None
    [written] = lines(out)
    assert written == event
    parsed = valid(written)
    assert parsed.placement == "actual"
    assert parsed.providers == ["CPUExecutionProvider"]
    assert parsed.nodes_per_provider is not None
    assert parsed.nodes_per_provider["CPUExecutionProvider"] >= 1
    assert parsed.fallback_nodes == 0
    assert parsed.runtime_revision == ort.__version__
    assert written["time"] == "2025-06-01T12:00:00.250Z"


def test_nodes_off_the_expected_provider_count_as_fallback(
    recording_session: ort.InferenceSession, tmp_path: Path
) -> None:
    event = record(
        recording_session, tmp_path / "t.jsonl", expected_provider="CUDAExecutionProvider"
    )
    assert event is not None
    nodes = placement_of(recording_session)
    assert nodes is not None
    assert event["fallback_nodes"] == sum(nodes.values()) > 0


def test_a_session_without_the_assignment_option_says_placement_is_unknown(
    model: Path, tmp_path: Path
) -> None:
    plain = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    event = record(plain, tmp_path / "t.jsonl")
    assert event is not None
    parsed = valid(event)
    assert parsed.placement == "registered"
    assert parsed.providers == plain.get_providers()
    assert parsed.nodes_per_provider is None
    assert parsed.fallback_nodes is None


def test_an_unsampled_call_writes_nothing(
    recording_session: ort.InferenceSession, tmp_path: Path
) -> None:
    out = tmp_path / "t.jsonl"
    assert record(recording_session, out, sample_rate=0.01, rng=lambda: 0.5) is None
    assert not out.exists()
    assert record(recording_session, out, sample_rate=0.01, rng=lambda: 0.001) is not None
    assert len(lines(out)) == 1


@pytest.mark.parametrize(
    ("kw", "match"),
    [({"sample_rate": 1.5}, "sample_rate"), ({"latency_ms": float("nan")}, "latency_ms")],
)
def test_bad_arguments_are_refused_before_anything_is_written(
    recording_session: ort.InferenceSession, tmp_path: Path, kw: dict[str, Any], match: str
) -> None:
    out = tmp_path / "t.jsonl"
    with pytest.raises(ValueError, match=match):
        record(recording_session, out, **kw)
    assert not out.exists()


def test_append_event_adds_one_complete_line_per_event(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    event = event_from_resolution(
        {"host_class": "a", "decision": "baseline", "artifact": {"digest": DIGEST}},
        runtime_package="onnxruntime",
        runtime_version="1.32.0",
        when=format_time(WHEN),
        host="h",
    )
    for _ in range(3):
        append_event(out, event)
    raw = out.read_bytes()
    assert raw.count(b"\n") == 3 and raw.endswith(b"\n")
    assert all(valid(e) for e in lines(out))


def test_events_say_which_side_of_a_rollout_the_host_is_on(tmp_path: Path) -> None:
    def answer(cohort: object) -> dict[str, object]:
        return {
            "host_class": "a",
            "decision": "candidate",
            "artifact": {"digest": DIGEST},
            "cohort": cohort,
        }

    def sides(cohort: object) -> tuple[object, object]:
        event = event_from_resolution(
            answer(cohort),
            runtime_package=None,
            runtime_version="1.32.0",
            when=format_time(WHEN),
            host="h",
        )
        assert valid(event)
        return event["rollout"], event["cohort"]

    rollout = {"rollout": "a-1", "step": 1, "percent": 5}
    assert sides({**rollout, "member": True}) == ("a-1", "canary")
    assert sides({**rollout, "member": False}) == ("a-1", "rest")
    assert sides(None) == (None, None)
    assert sides({"rollout": 5, "member": True}) == (None, None)  # not an id: not claimed


def test_naive_times_are_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        format_time(datetime(2025, 6, 1))


@pytest.fixture
def signed(tmp_path: Path) -> Path:
    now = datetime.now(UTC).replace(microsecond=0)
    doc = signed_manifest(scenario(), fixed_key(), version=4, created=now - timedelta(hours=1))
    path = tmp_path / "manifest.json"
    path.write_bytes(envelope.encode_canonical(doc))
    return path


def resolve_with_telemetry(manifest: Path, out: Path, host_class: str) -> int:
    return resolve.main(
        [
            "--manifest",
            str(manifest),
            "--pubkey",
            str(GOLDEN / "test.pub"),
            "--host-class",
            host_class,
            "--runtime",
            "onnxruntime==1.32.0",
            "--providers",
            "CPUExecutionProvider",
            "--emit-telemetry",
            str(out),
            "--host-id",
            "web-07",
        ]
    )


def test_resolve_artifact_emit_telemetry_appends_the_decision_it_made(
    signed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "telemetry.jsonl"
    assert resolve_with_telemetry(signed, out, "x86-vnni") == lookup.EXIT_RESOLVED
    assert resolve_with_telemetry(signed, out, "arm-old") == lookup.EXIT_HOLD
    served, held = (valid(e) for e in lines(out))
    assert served.source == "resolve" and served.placement == "requested"
    assert (served.host_class, served.host_id) == ("x86-vnni", "web-07")
    assert served.model_digest == DIGEST
    assert served.decision == "candidate"
    assert served.manifest_version == 4
    assert served.runtime_revision == "1.32.0"
    assert served.providers == ["CPUExecutionProvider"]
    assert served.latency_ms is None and served.fallback_nodes is None
    assert (held.decision, held.model_digest, held.providers) == ("hold", None, [])
    # Each event names the manifest's model line: one host may serve several into one file.
    assert served.model == held.model == "ocr-rec"
    capsys.readouterr()


def test_a_sessions_event_names_its_model_line_when_told(tmp_path: Path) -> None:
    class Session:
        def get_providers(self) -> list[str]:
            return ["CPUExecutionProvider"]

    out = tmp_path / "t.jsonl"
    for model in ("speech", None):
        record_session(
            Session(),
            path=out,
            host_class="a",
            model_digest=DIGEST,
            manifest_version=3,
            expected_provider="CPUExecutionProvider",
            sample_rate=1.0,
            host="h",
            when=WHEN,
            model=model,
        )
    named, unnamed = (valid(e) for e in lines(out))
    assert (named.model, unnamed.model) == ("speech", None)


def test_a_telemetry_file_that_cannot_be_written_never_changes_the_exit_code(
    signed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = resolve_with_telemetry(signed, tmp_path / "missing-dir" / "t.jsonl", "x86-vnni")
    assert code == lookup.EXIT_RESOLVED
    assert "cannot append telemetry" in capsys.readouterr().err


def _not_a_file(kind: str, tmp_path: Path) -> Path:
    path = tmp_path / "telemetry.jsonl"
    if kind == "/dev/null":
        return Path("/dev/null")
    if kind == "folder":
        path.mkdir()
    else:
        os.mkfifo(path)
    return path


@pytest.mark.parametrize(
    "kind", ["fifo without a reader", "fifo with a reader", "/dev/null", "folder"]
)
@pytest.mark.parametrize("how", ["--emit-telemetry", "QUALIFY_TELEMETRY"])
def test_telemetry_to_what_is_not_a_regular_file_never_blocks_the_service_start(
    signed: Path, tmp_path: Path, kind: str, how: str
) -> None:
    path = _not_a_file(kind, tmp_path)
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK) if kind == "fifo with a reader" else None
    args = [
        "--manifest",
        str(signed),
        "--pubkey",
        str(GOLDEN / "test.pub"),
        "--host-class",
        "x86-vnni",
        "--runtime",
        "onnxruntime==1.32.0",
        "--providers",
        "CPUExecutionProvider",
        "--no-state",
    ]
    env = dict(os.environ)
    if how == "--emit-telemetry":
        args += ["--emit-telemetry", str(path)]
    else:
        env["QUALIFY_TELEMETRY"] = str(path)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "manifest.resolve", *args],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
            timeout=60,  # a blocking open would hang here for ever
        )
        if reader is not None:
            assert os.read(reader, 4096) == b""  # not one byte went into the pipe
    finally:
        if reader is not None:
            os.close(reader)
    assert done.returncode == lookup.EXIT_RESOLVED, done.stderr
    assert f"warning: cannot append telemetry to {path}" in done.stderr
    assert "not a regular file" in done.stderr or "No such device" in done.stderr


def test_the_host_side_helper_imports_nothing_heavy() -> None:
    code = (
        "import sys, manifest.host_events\n"
        "heavy = [m for m in ('pydantic', 'duckdb', 'pandas', 'pyarrow', 'onnxruntime', "
        "'jinja2', 'click', 'numpy') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert out.stdout.strip() == ""


def test_a_session_reports_the_settings_it_really_runs_with(model: Path, tmp_path: Path) -> None:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.custom.knob", "7")
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    qualified = qualified_settings(
        {"intra_op_threads": 1, "session_config": {"session.custom.knob": 7}}
    )
    event = record(session, tmp_path / "t.jsonl", settings=qualified)
    assert event is not None
    parsed = valid(event)
    assert parsed.settings is not None
    assert decode_settings(parsed.settings) == {
        "config:session.custom.knob": "7",  # read because the qualified settings name it
        "config:session.intra_op.allow_spinning": "0",  # watched: read although not named
        "execution_mode": "parallel",
        "graph_optimization_level": "basic",
        "inter_op_threads": "0",
        "intra_op_threads": "1",
    }
    assert settings_differences(qualified, decode_settings(parsed.settings)) == [
        "config:session.intra_op.allow_spinning 0, qualified unset",
        "execution_mode parallel, qualified sequential",
        "graph_optimization_level basic, qualified all",
    ]


def test_a_default_session_matches_a_class_that_sets_nothing(model: Path, tmp_path: Path) -> None:
    plain = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    observed = session_settings(plain, qualified_settings({}))
    assert observed == qualified_settings({})


def test_a_session_that_cannot_report_settings_leaves_them_out(tmp_path: Path) -> None:
    class Bare:
        def get_providers(self) -> list[str]:
            return ["CPUExecutionProvider"]

    event = record(Bare(), tmp_path / "t.jsonl")
    assert event is not None
    assert "settings" not in event
    assert valid(event).settings is None
