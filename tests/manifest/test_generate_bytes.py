"""Golden bytes of generated manifests: a mixed fleet decided, built and signed end to end.

``test_golden.py`` pins the format on four classes. This file pins what generation *computes*
on a fleet that reaches every branch the generation path has: candidates (one of two chosen by
its p99 bound), the baseline (CPU fallback, over budget, a rollback that did not load, parity
against another baseline), holds (baseline error, baseline failing the class's gates, nothing
measured, only stale or only emulated evidence), provider and session settings, and a second
release whose rollbacks come from the first (another runtime, an artifact the project no longer
lists) under the other unknown-class policy. It is generated twice: through the pure
``decide`` + ``build_manifest`` + ``sign_encoded`` path, and through
``qualify.release.generate.generate_manifest`` on a DuckDB matrix (artifact files hashed, a class held by
a person kept). Fixed clock, fixed test key: the bytes must not change when generation is made
faster. To rewrite them deliberately::

    QUALIFY_UPDATE_GOLDEN=1 .venv/bin/pytest tests/manifest/test_generate_bytes.py
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from manifest.build import build_manifest
from manifest.load import load_manifest
from manifest.signing import sign_encoded
from schemas.project import Project
from tests.manifest.factories import (
    CLOCK,
    GOLDEN,
    Fleet,
    artifact_refs,
    class_spec,
    digest_of,
    fixed_key,
    make_project,
)

UPDATE = os.environ.get("QUALIFY_UPDATE_GOLDEN") == "1"
CANDIDATES = ("rec-int8", "rec-int8b")
KEY_FILE = GOLDEN / "test.key"


def _classes(*, second: bool) -> dict[str, dict[str, Any]]:
    """Thirteen classes; ``second``: the project file of the next release (one class moved to
    another runtime version, so its evidence is stale and its rollback runs another runtime)."""
    threads = class_spec(2, match={"arch": "x86_64", "isa": ["avx2"], "min_cores": 4})
    threads["provider"] |= {
        "intra_op_threads": 2,
        "inter_op_threads": 1,
        "session_config": {"session.intra_op.allow_spinning": 0},
        "graph_optimization_level": "extended",
        "execution_mode": "sequential",
        "cpu_affinity": [0, 1],
    }
    gpu = class_spec(
        3,
        expected="CUDAExecutionProvider",
        package="onnxruntime-gpu",
        match={"arch": "x86_64", "accelerator": "CUDAExecutionProvider", "min_memory_mb": 16384},
    )
    gpu["provider"] |= {
        # strict_fallback lists nothing to fall back to (a project with both is refused)
        "execution_providers": ["CUDAExecutionProvider"],
        "provider_options": {"CUDAExecutionProvider": {"device_id": 0, "use_tf32": False}},
        "strict_fallback": True,
    }
    gpu["runtime"]["build_info"] = "cuda-12"
    moved = class_spec(13, version="1.33.*" if second else "1.32.*", fallback_allowance=2)
    return {
        "a-cand": class_spec(1, match={"arch": "x86_64", "cpu_flags": ["avx512_vnni"]}),
        "b-two": threads,
        "c-gpu-fallback": gpu,
        "d-over-budget": class_spec(4, peak_rss_mb=None, cold_init_ms=None),
        "e-rollback-failed": class_spec(5),
        "f-parity-elsewhere": class_spec(6, match={"arch": "aarch64", "cpu_model": "Neoverse"}),
        "g-base-error": class_spec(7),
        "h-base-fails": class_spec(8, p99_ms=50.0),
        "i-unmeasured": class_spec(9, match={"arch": "riscv64"}),
        "j-stale": class_spec(10),
        "k-emulated": class_spec(11),
        "l-other-key": class_spec(12),
        "m-moved": moved,
    }


def _project(*, second: bool) -> Project:
    return make_project(
        _classes(second=second),
        # The second release no longer lists rec-int8b: rollbacks to it come from the first.
        candidates=CANDIDATES[:1] if second else CANDIDATES,
        unknown_class="baseline" if second else "hold",
    )


def _fleet(project: Project) -> Fleet:
    """The evidence: runs on every class but ``i-unmeasured``."""
    fleet = Fleet(project)
    fleet.qualify("a-cand")
    fleet.qualify("b-two", p99_upper_ms=44.0)
    fleet.qualify("b-two", candidate="rec-int8b", p99_upper_ms=41.0)
    fleet.qualify("c-gpu-fallback", fallback_nodes=7, expected_nodes=3)
    fleet.qualify("d-over-budget", p99_ms=90.0, p99_upper_ms=95.0, p99_lower_ms=85.0)
    fleet.qualify("e-rollback-failed", rollback_loaded=False)
    fleet.qualify("f-parity-elsewhere", parity_reference=digest_of("rec-fp16"))
    fleet.qualify("g-base-error", baseline_verdict="error", verdict="fail", parity_passed=False)
    fleet.qualify("h-base-fails", verdict="fail", parity_passed=False)
    fleet.qualify("j-stale", settings_digest="sha256:" + "0" * 64)
    fleet.qualify("k-emulated", emulated=True)
    fleet.qualify("l-other-key", key_of="a-cand")
    fleet.qualify("m-moved", candidate="rec-int8b", p99_upper_ms=30.0)
    return fleet


def _pure() -> dict[str, bytes]:
    """Both releases through decide, build_manifest and sign_encoded."""
    key = fixed_key()
    files: dict[str, bytes] = {}
    previous = None
    fleet = _fleet(_project(second=False))
    for version, second in ((1, False), (2, True)):
        fleet.project = _project(second=second)
        created = CLOCK + timedelta(days=version - 1)
        signed = build_manifest(
            fleet.project,
            list(fleet.decide(previous=previous).values()),
            release=f"2025.06.{version}",
            version=version,
            created=created,
            expires=created + timedelta(days=30),
            snapshot=f"snapshot-{version:04d}",
            artifacts=artifact_refs(fleet.project),
            previous=previous,
        )
        _, raw = sign_encoded(signed, key)
        files[f"generated-v{version}.json"] = raw
        previous = load_manifest(raw, source=f"v{version}")
    return files


def _through_the_matrix(tmp: Path) -> dict[str, bytes]:
    """Both releases through ``generate_manifest`` on a DuckDB matrix, as ``qualify manifest
    generate --publish`` runs it; before the second, a person holds ``a-cand``."""
    from matrix.samples import empty_samples
    from matrix.store import Store
    from qualify.project.load import LoadedProject
    from qualify.release.generate import generate_manifest
    from qualify.release.publishing import PublishOptions
    from schemas.cell import RunBundle

    models = tmp / "models"
    models.mkdir()
    for label in ("rec-fp32", *CANDIDATES):
        # The fleet's digests are sha256 of the label: files of those bytes hash to them.
        (models / f"{label}.onnx").write_bytes(label.encode())
    fleet = _fleet(_project(second=False))
    files: dict[str, bytes] = {}
    with Store.open(tmp / "m.duckdb", clock=lambda: CLOCK) as db:
        for run_id, run in fleet.runs.items():
            cells = [c for c in fleet.cells if c.run_id == run_id]
            db.write_run(RunBundle(run=run, cells=cells), empty_samples())
        for version, second in ((1, False), (2, True)):
            if second:
                db.record_rollout(
                    "hold-1", "a-cand", "hold", 1, 0, 0, "", "ops", "incident 42", CLOCK
                )
            loaded = LoadedProject(
                path=tmp / "qualify.yaml", root=tmp, project=_project(second=second)
            )
            out = tmp / f"v{version}.json"
            generate_manifest(
                loaded,
                db,
                PublishOptions(
                    key_path=KEY_FILE,
                    out=out,
                    now=CLOCK + timedelta(days=version - 1),
                    expires_in=timedelta(days=30),
                ),
                release=f"2025.06.{version}",
                artifact_base_uri="https://models.example/store",
            )
            files[f"generated-matrix-v{version}.json"] = out.read_bytes()
    return files


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    return {**_pure(), **_through_the_matrix(tmp_path_factory.mktemp("generate"))}


NAMES = [
    "generated-v1.json",
    "generated-v2.json",
    "generated-matrix-v1.json",
    "generated-matrix-v2.json",
]


@pytest.mark.parametrize("name", NAMES)
def test_generated_manifest_bytes_match_the_golden_file(
    generated: dict[str, bytes], name: str
) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.write_bytes(generated[name])
    assert path.exists(), f"{path} is missing; run with QUALIFY_UPDATE_GOLDEN=1 to write it"
    assert generated[name] == path.read_bytes(), (
        f"{name} drifted from the golden file; generation must keep the bytes. If the format "
        "changed on purpose, rerun with QUALIFY_UPDATE_GOLDEN=1 and review the diff"
    )


def test_the_golden_fleet_reaches_every_kind_of_decision() -> None:
    by_version = {
        n: load_manifest((GOLDEN / n).read_bytes(), source=n).signed.entries for n in NAMES
    }
    first = {c: e.decision for c, e in by_version["generated-v1.json"].items()}
    assert first == {
        "a-cand": "candidate",
        "b-two": "candidate",
        "c-gpu-fallback": "baseline",
        "d-over-budget": "baseline",
        "e-rollback-failed": "baseline",
        "f-parity-elsewhere": "baseline",
        "g-base-error": "hold",
        "h-base-fails": "hold",
        "i-unmeasured": "hold",
        "j-stale": "hold",
        "k-emulated": "hold",
        "l-other-key": "hold",
        "m-moved": "candidate",
    }
    second = by_version["generated-v2.json"]
    assert second["i-unmeasured"].decision == "baseline"  # the other unknown-class policy
    moved = second["m-moved"]
    # On the baseline after a runtime move, and rec-int8b, which it ran before, was not shown to
    # load on the new runtime: nothing further to go back to.
    assert moved.decision == "baseline" and moved.rollback is None
    assert "no_rollback" in {r.code for r in moved.reasons}
    assert second["b-two"].rollback is not None and second["b-two"].rollback.name == "rec-int8b"
    kept = by_version["generated-matrix-v2.json"]["a-cand"]
    assert kept == by_version["generated-matrix-v1.json"]["a-cand"]  # held by a person
