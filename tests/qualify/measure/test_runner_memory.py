"""Peak memory of a child is the child's, not its parent's (Linux folds the pre-exec image in)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from qualify.measure.runner import child_peak_rss_mb

ROOT = Path(__file__).resolve().parents[3]


def test_the_childs_own_high_water_mark_wins_over_wait4() -> None:
    # wait4 also counts the warm-init session the worker creates only to time a second load.
    assert child_peak_rss_mb(600_000, 200_000, 90_000) == (90_000 / 1024, "vmhwm")
    assert child_peak_rss_mb(200_000, 200_000, 90_000) == (90_000 / 1024, "vmhwm")


def test_without_the_childs_report_wait4_above_the_parents_peak_is_the_childs() -> None:
    assert child_peak_rss_mb(600_000, 200_000, None) == (600_000 / 1024, "wait4")


def test_nothing_trustworthy_is_reported_as_not_measured() -> None:
    assert child_peak_rss_mb(200_000, 200_000, None) == (None, None)


def _worker_in_a_big_parent(tmp_path: Path) -> list[object]:
    """A parent holding ~400 MB runs a real worker on a small model."""
    from tests.models import build

    model = build("identity_mlp", tmp_path)
    code = f"""
import json, numpy as np
from pathlib import Path
from qualify.measure.runner import run_worker
ballast = np.ones(50_000_000)  # 400 MB resident in the parent
model = Path({str(model)!r})
from tests.qualify.jobs import make_job
job = make_job(Path({str(tmp_path)!r}), model)
out = run_worker(job, Path({str(tmp_path / "w")!r}), timeout_s=120)
print(json.dumps([out.error_code, out.peak_rss_mb, out.peak_rss_source,
                  list(out.result.imported_at_peak), float(ballast[0])]))
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    found: list[object] = json.loads(done.stdout)
    return found


def test_a_big_parent_does_not_inflate_a_small_childs_peak(tmp_path: Path) -> None:
    error, peak, source, _, _ = _worker_in_a_big_parent(tmp_path)
    assert error is None
    assert source == "vmhwm"
    assert 20 < peak < 300, peak


def test_the_child_reads_its_peak_with_only_numpy_and_onnxruntime_loaded(tmp_path: Path) -> None:
    error, _, _, imported, _ = _worker_in_a_big_parent(tmp_path)
    assert error is None
    assert isinstance(imported, list)
    # Our own light packages may be there; pydantic, pandas, pyarrow, duckdb and the like not.
    assert set(imported) - {"qualify", "schemas"} <= {"numpy", "onnxruntime"}, imported
    assert {"numpy", "onnxruntime"} <= set(imported)


def test_the_runner_caches_the_bytecode_of_every_module_the_child_imports(tmp_path: Path) -> None:
    # A child that compiles qualify's sources itself counts the compiler's memory in its peak.
    from qualify.measure.bytecode import CHILD_MODULES, _bytecode_current, cache_child_bytecode
    from tests.models import build
    from tests.qualify.jobs import make_job

    model = build("identity_mlp", tmp_path)
    job = make_job(tmp_path, model, mode="full", result_path=str(tmp_path / "result.json"))
    (tmp_path / "job.json").write_text(job.to_json(), encoding="utf-8")
    listing = tmp_path / "modules.txt"
    code = f"""
import atexit, runpy, sys
def own():
    names = sorted(m.__file__ for m in list(sys.modules.values())
                   if m.__name__.partition(".")[0] in ("qualify", "schemas"))
    open({str(listing)!r}, "w").write("\\n".join(names))
atexit.register(own)
sys.argv = ["qualify.measure.worker", {str(tmp_path / "job.json")!r}]
runpy.run_module("qualify.measure.worker", run_name="__main__")
"""
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True)
    assert json.loads((tmp_path / "result.json").read_text())["ok"] is True
    imported = {str(Path(f).resolve().relative_to(ROOT)) for f in listing.read_text().split()}
    assert imported <= set(CHILD_MODULES), imported - set(CHILD_MODULES)

    cache_child_bytecode.__wrapped__()  # compiles what is stale, once more
    assert cache_child_bytecode.__wrapped__() == 0  # ...after which nothing is
    import importlib.util

    for rel in CHILD_MODULES:
        source = ROOT / rel
        assert _bytecode_current(Path(importlib.util.cache_from_source(str(source))), source)
