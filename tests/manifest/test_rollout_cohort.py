"""Staged rollouts on the host: a stable cohort per host id, which only grows with the step,
and ``resolve-artifact`` serving the rollout's artifact to the cohort and the entry's to the
rest."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from manifest import envelope, hostruntime, lookup, resolve
from manifest.signing import public_raw, sign_document
from tests.manifest.factories import digest_of, fixed_key
from tests.manifest.test_resolve import NOW, fresh

ids = st.text(min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(rollout=ids, host=ids, low=st.integers(0, 100), high=st.integers(0, 100))
def test_a_host_in_the_cohort_stays_in_as_the_percentage_grows(
    rollout: str, host: str, low: int, high: int
) -> None:
    low, high = sorted((low, high))
    point = lookup.cohort_point(rollout, host)
    assert 0 <= point < 100
    assert point == lookup.cohort_point(rollout, host)  # stable across restarts
    if point < low:
        assert point < high


@settings(max_examples=25, deadline=None)
@given(rollout=ids, percent=st.sampled_from([1, 5, 25, 50, 90]))
def test_the_share_in_the_cohort_is_within_binomial_bounds_of_the_step(
    rollout: str, percent: int
) -> None:
    n = 4000
    inside = sum(lookup.cohort_point(rollout, f"host-{k:05d}") < percent for k in range(n))
    p = percent / 100
    sigma = math.sqrt(n * p * (1 - p))
    assert abs(inside - n * p) <= 5 * sigma  # a false alarm once in ~3.5 million


def _staged(share: int, **rollout: Any) -> bytes:
    doc = fresh()
    signed = json.loads(json.dumps(doc["signed"]))
    entry = signed["entries"]["gpu-a10"]
    entry["rollout"] = {
        "id": "gpu-a10-r1",
        "artifact": {
            "name": "rec-int8",
            "digest": digest_of("rec-int8"),
            "length": 1008,
            "uri": "https://models.example/rec-int8.onnx",
        },
        "percent": share,
        "step": 1,
        "steps": [share, 100],
        **rollout,
    }
    return envelope.encode_canonical(sign_document(signed, fixed_key()))


def _answer(raw: bytes, host_id: str | None) -> lookup.Outcome:
    return lookup.resolve(
        raw,
        public_raw=public_raw(fixed_key().public_key()),
        now=envelope.format_time(NOW),
        host=hostruntime.HostRuntime(
            "onnxruntime-gpu", "1.32.0", frozenset({"CUDAExecutionProvider"}), "t"
        ),
        host_class="gpu-a10",
        host_id=host_id,
    )


def test_the_cohort_gets_the_rollouts_artifact_and_the_rest_the_entrys() -> None:
    raw = _staged(25)
    served: dict[str, int] = {"rollout": 0, "artifact": 0}
    for k in range(400):
        outcome = _answer(raw, f"gpu-host-{k}")
        assert outcome.code == lookup.EXIT_RESOLVED and outcome.answer is not None
        answer = outcome.answer
        member = lookup.cohort_point("gpu-a10-r1", f"gpu-host-{k}") < 25
        assert answer["cohort"] == {
            "rollout": "gpu-a10-r1",
            "step": 1,
            "percent": 25,
            "member": member,
        }
        assert answer["served"] == ("rollout" if member else "artifact")
        expected = digest_of("rec-int8") if member else digest_of("rec-fp32")
        assert answer["artifact"]["digest"] == expected
        served[answer["served"]] += 1
    assert 60 < served["rollout"] < 140  # about a quarter of 400


def test_a_host_without_an_id_stays_with_the_rest() -> None:
    outcome = _answer(_staged(100), None)
    assert outcome.answer is not None and outcome.answer["served"] == "artifact"
    assert outcome.answer["cohort"]["member"] is False


@pytest.mark.parametrize(
    "bad",
    [{"percent": 150}, {"percent": True}, {"id": ""}, {"step": 0}, {"artifact": "x"}],
    ids=["over-100", "bool", "empty-id", "step-0", "artifact-not-object"],
)
def test_a_malformed_rollout_is_refused_not_guessed(bad: dict[str, Any]) -> None:
    outcome = _answer(_staged(100, **bad), "any-host")
    assert outcome.code == lookup.EXIT_VERIFY, outcome.messages


def test_the_cli_places_a_host_by_its_host_id(tmp_path: Path, capsys: Any) -> None:
    manifest = tmp_path / "m.json"
    manifest.write_bytes(_staged(50))
    inside = next(f"h{k}" for k in range(1000) if lookup.cohort_point("gpu-a10-r1", f"h{k}") < 50)
    base = [
        "--manifest",
        str(manifest),
        "--pubkey",
        str(Path(__file__).parent / "golden" / "test.pub"),
        "--runtime",
        "onnxruntime-gpu==1.32.0",
        "--providers",
        "CUDAExecutionProvider",
        "--host-class",
        "gpu-a10",
        "--no-state",
        "--json",
    ]
    assert resolve.main([*base, "--host-id", inside]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["served"] == "rollout" and answer["cohort"]["member"] is True
