"""Benchmark: qualify's latency harness against MLPerf LoadGen SingleStream, same model and inputs.

Owns one comparison and its markdown section. The judged cases are a small image CNN, fp32 and
static int8 (``bench/_cnn.py``, built from code at the start: about 0.8 and 0.45 ms per image on
one core), the regime qualify's latency numbers are for. The demo's digits MLP (about 20 us) is
measured and reported too, but not judged: there, LoadGen's own per-query work is a large share
of what LoadGen times (see 'Where a difference comes from' in the output). Each round measures
every case twice, each side in its own fresh subprocess:

- **qualify**: the real code path. A worker job (the fields of ``qualify.measure.job.WorkerJob``) goes to
  ``qualify.measure.runner.run_worker``, which spawns ``python -m qualify.measure.worker``; the raw samples come
  back from the job's ``samples_path`` (``.npz`` key ``b{batch}_c1``) and are summarised with
  ``qualify.measure.stats.percentiles``. ``min_samples = max_samples = N`` (a multiple of 64, the worker's
  look interval), a huge budget and time cap make the worker time exactly N queries.
- **LoadGen**: ``python bench/harness_vs_loadgen.py --loadgen-child JOB`` builds the session with
  the worker's own ``qualify.measure.session.create`` (so the session options cannot drift),
  feeds the same 16 feeds the worker cycles through (built by ``qualify.measure.feeds.batch`` from
  the same input pool, which ``qualify.measure.workload.build_pool`` makes as a run would), and runs ``mlperf_loadgen``
  SingleStream / PerformanceOnly with ``min_query_count = max_query_count = N``. The SUT runs the
  session synchronously inside ``issue_queries``, applies the worker's post-processing and calls
  ``QuerySamplesComplete``. LoadGen's p50/p99 are read from ``mlperf_log_detail.txt``
  (``result_50.00_percentile_latency_ns``, ``result_99.00_percentile_latency_ns``: LoadGen sorts
  its per-sample issue-to-complete latencies and reports ``sorted[floor(n * q)]``; per-query
  latencies are only in the trace, which we leave off because tracing costs time per query).

To explain a gap, the LoadGen child also measures two things qualify's harness would call the
same: ``run`` + post-processing timed with ``perf_counter_ns`` inside the SUT ('inside SUT'), and,
after LoadGen finishes, a plain back-to-back loop over the same session ('hot loop', the worker's
timed region without LoadGen around it). LoadGen's mean minus the inside-SUT mean is LoadGen's own
per-query dispatch cost; inside SUT versus hot loop is what running inside LoadGen does to the
inference itself. Comparing the 20 us MLP with the sub-millisecond CNN shows whether the gap is a
fixed cost per query (then it shrinks in relative terms as inference gets slower) or
proportional to latency (a bias of the harness).

Sides alternate within each round and the order flips every round (q, L, then L, q, ...), so slow
drift of a shared machine favours neither. Reported: per side the median over rounds of p50 and
p99, the spread over rounds, and the ratio qualify / LoadGen against the +-3% target.

It changes no qualify code and judges nothing but that ratio. Run alone,
``python bench/harness_vs_loadgen.py`` prints the markdown section on stdout (progress on stderr);
``bench/run_all.py`` collects it into ``docs/benchmarks.md``. The LoadGen child imports
onnxruntime: it has to, and it reuses the measuring child's helpers (``qualify.measure.session``,
``qualify.measure.feeds``) so both sides build the same session.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

# Runnable as `python bench/NAME.py` from a checkout that is not installed.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from bench import _cnn
from qualify.demo.assets import FP32_MODEL, INPUTS, INT8_MODEL, NAMES, asset_path
from qualify.measure.job import ProviderJob, WorkerJob
from qualify.measure.runner import run_worker
from qualify.measure.stats import p99_bounds, percentiles
from qualify.measure.workload import build_pool
from schemas.project import InputSpec, Workload

__all__ = [
    "CASES",
    "CONFIDENCE",
    "DEFAULT_QUERIES",
    "DEFAULT_ROUNDS",
    "TARGET",
    "BenchError",
    "Case",
    "CaseSummary",
    "Measurement",
    "main",
    "median_interval",
    "queries_for",
    "render_markdown",
    "run_benchmark",
    "summarise",
]

REPO = Path(__file__).resolve().parent.parent

TARGET = 0.03
"""The issue's target: qualify's p50 and p99 within +-3% of LoadGen's."""
DEFAULT_ROUNDS = 25
"""Interleaved rounds. Many short rounds rather than a few long ones: on a shared machine the
speed of the same loop drifts between modes over seconds (measured here: 1,000-inference blocks
of one process at 323 and at 454 us), so each round pairs the two sides close in time and the
verdict rests on the median of the per-round ratios, with a distribution-free interval."""
DEFAULT_QUERIES = 4096
"""Timed queries per side per round for the digits cases (the CNN cases take a quarter: 1,024,
still above the 662 that a p99 needs); a multiple of 64."""
CONFIDENCE = 0.95
"""Two-sided confidence of the interval reported for each median ratio."""
LOOK_EVERY = 64
"""The worker checks its stop rule every 64 samples, so N must be a multiple of it."""
FEED_ROWS = 16
"""The worker cycles through 16 feeds; LoadGen's QSL holds the same 16."""
WARMUP = 200
PARITY_ROWS = 16
POSTPROCESS = "argmax"
CHILD_TIMEOUT_S = 300.0
LOADGEN_MIN_DURATION_MS = 0
"""The query count alone ends a run (min = max = N): a duration floor would mark a fast model's
short run INVALID without changing one measured latency."""


@dataclass(frozen=True)
class Case:
    """One model and batch size measured by both sides."""

    label: str
    model_file: str
    """A demo asset name, or a file ``bench/_cnn.py`` builds in the work directory."""
    input_name: str
    input: InputSpec
    """How the model's one input is fed, exactly as a project file would say it."""
    batch: int
    queries_divisor: int
    """Queries = the batch-1 query count divided by this (a slower case needs fewer)."""
    target: bool
    """True: judged against +-3%. False: measured and explained, not judged."""


_IMAGES = InputSpec(shape=[1, *_cnn.IMAGE], dtype="float32", source="generated", seed=0)
_DIGITS = InputSpec(shape=[1, 64], dtype="float32", source="recorded", file=INPUTS)

CASES: tuple[Case, ...] = (
    Case("cnn fp32", "bench-cnn-fp32.onnx", _cnn.INPUT_NAME, _IMAGES, 1, 4, True),
    Case("cnn int8", "bench-cnn-int8.onnx", _cnn.INPUT_NAME, _IMAGES, 1, 4, True),
    Case("digits fp32", FP32_MODEL, "pixels", _DIGITS, 1, 1, False),
    Case("digits int8", INT8_MODEL, "pixels", _DIGITS, 1, 1, False),
)
"""The bench CNN at batch 1 (judged), then the demo's digits MLP at batch 1 (reported)."""


class BenchError(Exception):
    """A side of the benchmark could not be measured; the message says which and why."""


@dataclass(frozen=True)
class Measurement:
    """One side of one round for one case. Latencies in microseconds."""

    case: str
    side: str
    """``qualify`` or ``loadgen``."""
    round: int
    n: int
    p50_us: float
    p99_us: float
    mean_us: float
    inner_p50_us: float | None = None
    """LoadGen side only: ``run`` + post-processing timed inside the SUT."""
    inner_p99_us: float | None = None
    inner_mean_us: float | None = None
    hot_p50_us: float | None = None
    """LoadGen side only: a plain back-to-back loop in the same process after LoadGen."""
    hot_p99_us: float | None = None
    loadavg_before: float = 0.0
    loadavg_after: float = 0.0
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class CaseSummary:
    """One case's per-round values (microseconds) and the ratios of their medians."""

    case: Case
    n: int
    q_p50: list[float]
    q_p99: list[float]
    lg_p50: list[float]
    lg_p99: list[float]
    in_p50: list[float]
    in_p99: list[float]
    hot_p50: list[float]
    hot_p99: list[float]
    dispatch_us: list[float]
    """Per round: LoadGen's mean latency minus the inside-SUT mean (LoadGen's own cost)."""

    @property
    def ratio_p50(self) -> float:
        """Median over rounds of the round's qualify p50 / LoadGen p50."""
        return _paired(self.q_p50, self.lg_p50)

    @property
    def ratio_p99(self) -> float:
        """Median over rounds of the round's qualify p99 / LoadGen p99."""
        return _paired(self.q_p99, self.lg_p99)


def _med(values: list[float]) -> float:
    return float(statistics.median(values))


def _rounds(a: list[float], b: list[float]) -> zip[tuple[float, float]]:
    """The two sides' values round by round; an error if a round lacks one side."""
    if len(a) != len(b):
        raise BenchError(f"unpaired rounds: {len(a)} against {len(b)}")
    return zip(a, b, strict=True)


def _ratios(num: list[float], den: list[float]) -> list[float]:
    return [a / b for a, b in _rounds(num, den)]


def _paired(num: list[float], den: list[float]) -> float:
    """The median of the per-round ratios (each round's two sides ran seconds apart)."""
    return _med(_ratios(num, den))


def _paired_diff(a: list[float], b: list[float]) -> float:
    """The median of the per-round differences a - b."""
    return _med([x - y for x, y in _rounds(a, b)])


def median_interval(values: list[float]) -> tuple[float | None, float | None]:
    """Distribution-free `CONFIDENCE` interval of the median of ``values``.

    Two one-sided order-statistic bounds from ``qualify.measure.stats.p99_bounds`` at q = 0.5, each at
    (1 + CONFIDENCE) / 2; None on a side where there are too few values (fewer than 6 rounds
    give no 95% interval at all).
    """
    return p99_bounds(values, confidence=(1.0 + CONFIDENCE) / 2.0, q=0.5)


# ----------------------------------------------------------------------------- parent side


def _sha256(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def _provider() -> ProviderJob:
    return ProviderJob(
        execution_providers=("CPUExecutionProvider",),
        expected="CPUExecutionProvider",
        provider_options={},
        session_config={},
        graph_optimization_level="all",
        execution_mode=None,
        intra_op_threads=1,
        inter_op_threads=None,
        strict_fallback=False,
        cpus=None,
    )


def _artifact(case: Case, workdir: Path) -> Path:
    """A demo asset from the installed package, or a model `_cnn.build` wrote under workdir."""
    if case.model_file in NAMES:
        return asset_path(case.model_file)
    return workdir / "models" / case.model_file


def _inputs_npz(case: Case, workdir: Path) -> Path:
    """The pool file the worker reads, built as ``qualify run`` builds it from a workload."""
    path = workdir / f"inputs-{case.input_name}.npz"
    if not path.exists():
        pool = build_pool(Workload(inputs={case.input_name: case.input}), asset_path)
        np.savez(path, allow_pickle=False, **pool)
    return path


def _job(case: Case, work: Path, workdir: Path, queries: int) -> WorkerJob:
    """A worker job (`qualify.measure.job`), fixed to exactly ``queries`` samples."""
    artifact = _artifact(case, workdir)
    return WorkerJob(
        mode="full",
        artifact_path=str(artifact),
        expected_digest=_sha256(artifact),
        provider=_provider(),
        memory_limit_mb=None,
        inputs_path=str(_inputs_npz(case, workdir)),
        inputs={case.input_name: case.input.model_dump()},
        outputs_path=str(work / "outputs.npz"),
        samples_path=str(work / "samples.npz"),
        parity_rows=PARITY_ROWS,
        configs=((case.batch, 1),),
        warmup=WARMUP,
        # look_schedule(N, N) == (N,): a single look at N samples. The budget is far above any
        # latency here, so that look decides 'pass' and the loop stops at exactly N.
        min_samples=queries,
        max_samples=queries,
        time_cap_s=600.0,
        throughput_s=0.1,
        confidence=0.99,
        budget_p99_ms=10_000.0,
        postprocess=POSTPROCESS,
        pre_hook=None,
        post_hook=None,
        hook_root=str(workdir),
        profile_runs=0,
        result_path=None,
        parent_pid=None,
        reply_fd=None,
        command_fd=None,
    )


def _loadavg() -> float:
    return os.getloadavg()[0]


def _measure_qualify(case: Case, work: Path, workdir: Path, queries: int, rnd: int) -> Measurement:
    job = _job(case, work, workdir, queries)
    before = _loadavg()
    outcome = run_worker(job, work, timeout_s=CHILD_TIMEOUT_S)
    after = _loadavg()
    if outcome.error_code:
        raise BenchError(
            f"qualify worker for {case.label}: {outcome.error_code}: {outcome.error_message}"
        )
    with np.load(job.samples_path) as npz:
        raw = npz[f"b{case.batch}_c1"].astype(np.float64) / 1e3  # ns -> us
    pct = percentiles(raw)
    cfg = outcome.result.configs[0]
    notes = [] if raw.size == queries else [f"timed {raw.size} queries, not {queries}"]
    if cfg["stopped"] not in ("decided", "max_samples"):
        notes.append(f"worker stopped by {cfg['stopped']}")
    return Measurement(
        case=case.label,
        side="qualify",
        round=rnd,
        n=int(raw.size),
        p50_us=pct.p50,
        p99_us=pct.p99,
        mean_us=pct.mean,
        loadavg_before=before,
        loadavg_after=after,
        wall_s=outcome.wall_s,
        notes=notes,
    )


def _measure_loadgen(case: Case, work: Path, workdir: Path, queries: int, rnd: int) -> Measurement:
    work.mkdir(parents=True, exist_ok=True)
    job = {
        "job": asdict(_job(case, work, workdir, queries)),
        "batch": case.batch,
        "queries": queries,
        "outdir": str(work / "loadgen"),
        "result_path": str(work / "lg.json"),
    }
    job_path = work / "lg-job.json"
    job_path.write_text(json.dumps(job), encoding="utf-8")
    env = dict(os.environ)
    extra = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + extra if extra else "")
    env.setdefault("PYTHONHASHSEED", "0")
    before = _loadavg()
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--loadgen-child", str(job_path)],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        env=env,
        check=False,
    )
    wall = time.monotonic() - started
    after = _loadavg()
    result_path = Path(job["result_path"])
    if proc.returncode != 0 or not result_path.exists():
        raise BenchError(
            f"LoadGen child for {case.label} exited {proc.returncode}: "
            f"{proc.stderr.strip()[-1500:]}"
        )
    doc = json.loads(result_path.read_text(encoding="utf-8"))
    with np.load(doc["timings_path"]) as npz:
        inner = percentiles(npz["inner_ns"].astype(np.float64) / 1e3)
        hot = percentiles(npz["hot_ns"].astype(np.float64) / 1e3)
    notes = []
    if doc["query_count"] != queries:
        notes.append(f"LoadGen ran {doc['query_count']} queries, not {queries}")
    if doc["validity"] != "VALID":
        notes.append(f"LoadGen result {doc['validity']}: {doc['invalid_reason']}".strip())
    return Measurement(
        case=case.label,
        side="loadgen",
        round=rnd,
        n=int(doc["query_count"]),
        p50_us=doc["p50_ns"] / 1e3,
        p99_us=doc["p99_ns"] / 1e3,
        mean_us=doc["mean_ns"] / 1e3,
        inner_p50_us=inner.p50,
        inner_p99_us=inner.p99,
        inner_mean_us=inner.mean,
        hot_p50_us=hot.p50,
        hot_p99_us=hot.p99,
        loadavg_before=before,
        loadavg_after=after,
        wall_s=wall,
        notes=notes,
    )


def _round_up(queries: int) -> int:
    return -(-queries // LOOK_EVERY) * LOOK_EVERY


def queries_for(case: Case, queries: int) -> int:
    """Timed queries per side per round for ``case``, a multiple of 64."""
    return _round_up(max(LOOK_EVERY, queries // case.queries_divisor))


def run_benchmark(
    *,
    workdir: Path,
    rounds: int = DEFAULT_ROUNDS,
    queries: int = DEFAULT_QUERIES,
    cases: tuple[Case, ...] = CASES,
    log: TextIO | None = None,
) -> list[Measurement]:
    """Run the interleaved rounds.

    Args:
        workdir: scratch directory for jobs, samples and LoadGen logs.
        rounds: rounds, >= 1; every case is measured by both sides in every round.
        queries: timed queries per side per round at batch 1 (see `queries_for`).
        cases: what to measure.
        log: a text stream for one progress line per measurement (None: silent).

    Returns:
        Every measurement, in the order taken.

    Raises:
        BenchError: a side could not be measured (the worker failed or LoadGen crashed).
        ValueError: rounds < 1 or queries < 64.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    if queries < LOOK_EVERY:
        raise ValueError(f"queries must be >= {LOOK_EVERY}, got {queries}")
    workdir.mkdir(parents=True, exist_ok=True)
    if any(c.model_file not in NAMES for c in cases):
        _cnn.build(workdir / "models")
    out: list[Measurement] = []
    for rnd in range(rounds):
        for c, case in enumerate(cases):
            n = queries_for(case, queries)
            sides = ("qualify", "loadgen") if (rnd + c) % 2 == 0 else ("loadgen", "qualify")
            for side in sides:
                work = workdir / f"r{rnd}-c{c}-{side}"
                measure = _measure_qualify if side == "qualify" else _measure_loadgen
                m = measure(case, work, workdir, n, rnd)
                out.append(m)
                if log is not None:
                    print(
                        f"round {rnd + 1}/{rounds} {case.label:11s} {side:7s} "
                        f"p50 {m.p50_us:8.2f} us  p99 {m.p99_us:8.2f} us  n={m.n}",
                        file=log,
                        flush=True,
                    )
    return out


def summarise(
    measurements: list[Measurement], cases: tuple[Case, ...] = CASES
) -> list[CaseSummary]:
    """Group measurements per case.

    Raises:
        BenchError: a case lacks one of the two sides.
    """
    summaries = []
    for case in cases:
        q = [m for m in measurements if m.case == case.label and m.side == "qualify"]
        lg = [m for m in measurements if m.case == case.label and m.side == "loadgen"]
        if not q or not lg:
            raise BenchError(
                f"{case.label}: need both sides, got {len(q)} qualify and {len(lg)} LoadGen"
            )
        summaries.append(
            CaseSummary(
                case=case,
                n=q[0].n,
                q_p50=[m.p50_us for m in q],
                q_p99=[m.p99_us for m in q],
                lg_p50=[m.p50_us for m in lg],
                lg_p99=[m.p99_us for m in lg],
                in_p50=[m.inner_p50_us for m in lg if m.inner_p50_us is not None],
                in_p99=[m.inner_p99_us for m in lg if m.inner_p99_us is not None],
                hot_p50=[m.hot_p50_us for m in lg if m.hot_p50_us is not None],
                hot_p99=[m.hot_p99_us for m in lg if m.hot_p99_us is not None],
                dispatch_us=[
                    m.mean_us - m.inner_mean_us for m in lg if m.inner_mean_us is not None
                ],
            )
        )
    return summaries


def _spread(values: list[float]) -> str:
    return f"{_med(values):.1f} ({min(values):.1f}..{max(values):.1f})"


def _within(ratio: float) -> bool:
    return abs(ratio - 1.0) <= TARGET


def _ratio_cell(ratio: float, judged: bool) -> str:
    text = f"{ratio:.3f} ({(ratio - 1.0) * 100:+.1f}%)"
    if judged:
        return f"{text} **{'PASS' if _within(ratio) else 'FAIL'}**"
    return f"{text} {'within' if _within(ratio) else 'outside'} +-{TARGET:.0%}"


def _interval(num: list[float], den: list[float]) -> str:
    low, high = median_interval(_ratios(num, den))
    if low is None or high is None:
        return "n/a (too few rounds)"
    return f"{low:.3f}..{high:.3f}"


def _round_ratios(num: list[float], den: list[float]) -> str:
    rs = _ratios(num, den)
    return f"{min(rs):.3f}..{max(rs):.3f}"


def render_markdown(
    measurements: list[Measurement],
    *,
    loadgen_version: str,
    rounds: int,
    queries: int,
    cases: tuple[Case, ...] = CASES,
) -> str:
    """The benchmark's markdown section (starts with a level-2 heading).

    Args:
        measurements: what `run_benchmark` returned.
        loadgen_version: the installed mlcommons-loadgen version, for the record.
        rounds: rounds run.
        queries: timed queries per side per round at batch 1, as run.
        cases: the cases run.

    Raises:
        BenchError: a case lacks one of the two sides.
    """
    sums = summarise(measurements, cases)
    targets = [s for s in sums if s.case.target]
    reported = [s for s in sums if not s.case.target]
    verdicts = [_within(r) for s in targets for r in (s.ratio_p50, s.ratio_p99)]
    overall = "PASS" if all(verdicts) else "FAIL"
    lines = [
        "## qualify's harness vs MLPerf LoadGen SingleStream",
        "",
        f"Command: `python bench/harness_vs_loadgen.py --rounds {rounds} --queries {queries}`.",
        "",
        "Per case, both sides time the same model with the same session options (CPU EP, "
        "`intra_op_num_threads=1`, graph optimisation `all`, built by "
        f"`qualify.measure.session.create` on both sides), the same inputs (the worker's {FEED_ROWS} feeds, from the pool "
        "`qualify.measure.workload.build_pool` makes), batch 1, concurrency 1 and post-processing "
        f"`{POSTPROCESS}`; {rounds} interleaved rounds with the order flipped every round, each "
        "side in a fresh subprocess. Judged: a small image CNN (`bench/_cnn.py`, built from code "
        "with a fixed seed: three 3x3 convolutions with 32/64/128 channels on 3x64x64 seeded "
        "images, and its static int8 QDQ quantization), "
        f"{queries_for(targets[0].case, queries) if targets else queries:,} timed queries per "
        "side per round. Reported, not judged: the demo's digits MLP (fp32 and dynamic int8, "
        f"recorded digits rows), {queries:,} queries per side per round: at about 20 us per "
        "inference, LoadGen's own per-query work is a large share of the interval LoadGen times "
        "(measured below). **qualify**: the real worker through "
        "`qualify.measure.runner.run_worker`, raw samples from its `samples.npz`, percentiles by "
        "`qualify.measure.stats.percentiles`. **LoadGen**: mlcommons-loadgen "
        f"{loadgen_version}, SingleStream, PerformanceOnly, `min_query_count = max_query_count`, "
        "p50/p99 as LoadGen reports them in `mlperf_log_detail.txt`. "
        f"Target: qualify / LoadGen within +-{TARGET:.0%} for p50 and p99.",
        "",
        f"**Result: {overall}** "
        + (
            "(every judged ratio is within the target)."
            if overall == "PASS"
            else "(at least one judged ratio is outside the target; see below for why)."
        ),
        "",
        "Latencies in microseconds: median over rounds (min..max over rounds). "
        "'qualify / LoadGen' is the median over rounds of each round's ratio (the two sides "
        f"of a round ran seconds apart), with its distribution-free {CONFIDENCE:.0%} interval "
        "(order statistics of the per-round ratios) and the per-round range.",
        "",
        f"| model | stat | qualify | LoadGen | qualify / LoadGen | {CONFIDENCE:.0%} interval "
        "| per-round ratios |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in sums:
        lines.append(
            f"| {s.case.label} | p50 | {_spread(s.q_p50)} | {_spread(s.lg_p50)} | "
            f"{_ratio_cell(s.ratio_p50, s.case.target)} | {_interval(s.q_p50, s.lg_p50)} | "
            f"{_round_ratios(s.q_p50, s.lg_p50)} |"
        )
        lines.append(
            f"| {s.case.label} | p99 | {_spread(s.q_p99)} | {_spread(s.lg_p99)} | "
            f"{_ratio_cell(s.ratio_p99, s.case.target)} | {_interval(s.q_p99, s.lg_p99)} | "
            f"{_round_ratios(s.q_p99, s.lg_p99)} |"
        )
    lines += [
        "",
        "### Where a difference comes from",
        "",
        "The two tools time different intervals. The worker wraps `perf_counter_ns` around "
        "`session.run` + post-processing, back to back. LoadGen times from its issue of a query "
        "to the SUT's `QuerySamplesComplete`: that adds LoadGen's query bookkeeping, the pybind11 "
        "call into Python, the SUT's loop, building the `QuerySampleResponse` and the call back "
        "into LoadGen; that work between inferences can also disturb the caches and branch "
        "predictors the next inference finds warm in a back-to-back loop (the likely reason for "
        "the inside-SUT slowdown below; not measured separately here). The LoadGen child therefore also records (a) 'inside SUT': "
        "`run` + post-processing timed in `issue_queries` exactly as the worker times it (the two "
        "clock reads fall inside LoadGen's interval), and (b) 'hot loop': the worker's timed "
        "region back to back on the same session in the same process after LoadGen finished. "
        "'LoadGen dispatch' is LoadGen's mean latency minus the inside-SUT mean, per query.",
        "",
        "| case | stat | qualify | hot loop (LoadGen's process) | inside LoadGen's SUT | "
        "LoadGen | LoadGen dispatch (mean) |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in sums:
        lines.append(
            f"| {s.case.label} | p50 | {_spread(s.q_p50)} | {_spread(s.hot_p50)} | "
            f"{_spread(s.in_p50)} | {_spread(s.lg_p50)} | {_spread(s.dispatch_us)} |"
        )
        lines.append(
            f"| {s.case.label} | p99 | {_spread(s.q_p99)} | {_spread(s.hot_p99)} | "
            f"{_spread(s.in_p99)} | {_spread(s.lg_p99)} | |"
        )
    lines += ["", "Medians of the per-round ratios:", ""]
    lines += [
        "| case | stat | qualify / hot loop | qualify / inside SUT | qualify / LoadGen |",
        "|---|---|---|---|---|",
    ]
    for s in sums:
        for stat, q, hot, inner, lg in (
            ("p50", s.q_p50, s.hot_p50, s.in_p50, s.lg_p50),
            ("p99", s.q_p99, s.hot_p99, s.in_p99, s.lg_p99),
        ):
            lines.append(
                f"| {s.case.label} | {stat} | {_ratio_cell(_paired(q, hot), False)} | "
                f"{_ratio_cell(_paired(q, inner), False)} | "
                f"{_ratio_cell(_paired(q, lg), s.case.target)} |"
            )
    lines.append("")
    for s in sums:
        gap = _paired_diff(s.lg_p50, s.q_p50)
        lines.append(
            f"- {s.case.label}: LoadGen's p50 is {gap:+.1f} us from qualify's "
            f"({gap / _med(s.lg_p50):+.1%} of LoadGen's p50). LoadGen's own dispatch: "
            f"{_med(s.dispatch_us):.1f} us per query on the mean, "
            f"{_paired_diff(s.lg_p50, s.in_p50):+.1f} us between the p50s. Running inside "
            f"LoadGen moves the inference p50 by {_paired_diff(s.in_p50, s.hot_p50):+.1f} us "
            "against the hot loop in the same process, and the hot loop differs from qualify's "
            f"worker by {_paired_diff(s.hot_p50, s.q_p50):+.1f} us (two fresh processes). "
            "At p99, LoadGen's own interval is "
            f"{_paired(s.lg_p99, s.in_p99) - 1.0:+.1%} from the inference it wraps (same "
            "process, same queries, so no machine drift between them). Each figure is a median "
            "of per-round differences or ratios."
        )
    if reported:
        lines += [
            "",
            "Why the digits cases are reported but not judged: LoadGen's dispatch above is a few "
            "microseconds per query whatever the model, and running inside LoadGen also slows "
            "the inference itself (LoadGen's threads share the two cores and the caches). At "
            "about 20 us per inference those fixed costs alone are several percent to tens of "
            "percent of what LoadGen times, and the process-to-process spread on a shared "
            "machine is larger than +-3% (see the per-round ratios), so no harness that times "
            "only the inference can agree with LoadGen within +-3% there. The same costs are "
            "about one percent of the CNN's sub-millisecond inference, which is why the target "
            "is judged on it. That the harness itself adds nothing is shown by the "
            "'qualify / hot loop' column: the worker against a plain loop in another process.",
        ]
    lines += [
        "",
        "These machines are shared and noisy: load from other jobs on the same two cores moves "
        "p99 far more than p50, hence the spread over rounds, the per-round ratios and the load "
        "averages below. Percentile definitions differ by at most one order statistic: qualify "
        "reports `sorted[ceil(n*q) - 1]`, LoadGen `sorted[floor(n*q)]` (the same sample for p99 "
        "at these n, adjacent samples for p50).",
        "",
        "<details><summary>Every measurement (load average = 1-minute load before / after)"
        "</summary>",
        "",
        "| round | case | side | n | p50 us | p99 us | load | notes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in measurements:
        lines.append(
            f"| {m.round + 1} | {m.case} | {m.side} | {m.n} | {m.p50_us:.1f} | {m.p99_us:.1f} | "
            f"{m.loadavg_before:.2f} / {m.loadavg_after:.2f} | {'; '.join(m.notes)} |"
        )
    lines += ["", "</details>", ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- LoadGen child


def _detail_results(path: Path) -> dict[str, Any]:
    """The ``result_*`` keys of LoadGen's ``mlperf_log_detail.txt`` (``:::MLLOG {json}`` lines)."""
    found: dict[str, Any] = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.startswith(":::MLLOG "):
            continue
        try:
            entry = json.loads(line[len(":::MLLOG ") :])
        except ValueError:
            continue
        key = str(entry.get("key", ""))
        if key.startswith("result_"):
            found[key] = entry.get("value")
    return found


def _loadgen_child(job_path: Path) -> int:
    """Run LoadGen SingleStream against the worker's session and feeds; write a JSON result."""
    import importlib

    import mlperf_loadgen as lg

    from qualify.measure.feeds import batch, postprocess
    from qualify.measure.session import create

    job = json.loads(job_path.read_text(encoding="utf-8"))
    worker_job = WorkerJob.from_json(json.dumps(job["job"]))
    ort = importlib.import_module("onnxruntime")
    model = Path(worker_job.artifact_path).read_bytes()
    session = create(ort, model, worker_job, record_placement=False)
    pool = dict(np.load(worker_job.inputs_path))
    b = int(job["batch"])
    feeds = [batch(pool, worker_job, k * b, b) for k in range(FEED_ROWS)]
    post = postprocess(worker_job.postprocess)
    # The worker's work before its timed loop: first run, parity rows, warm-up.
    for k in range(1 + worker_job.parity_rows + worker_job.warmup):
        post(session.run(None, feeds[k % FEED_ROWS]))

    queries = int(job["queries"])
    inner = np.zeros(queries, dtype=np.int64)
    count = 0
    clock = time.perf_counter_ns

    def issue_queries(samples: list[Any]) -> None:
        nonlocal count
        for s in samples:
            t0 = clock()
            post(session.run(None, feeds[s.index]))
            t1 = clock()
            if count < queries:
                inner[count] = t1 - t0
            count += 1
            lg.QuerySamplesComplete([lg.QuerySampleResponse(s.id, 0, 0)])

    def flush_queries() -> None:
        return None

    def load_samples(indices: list[int]) -> None:
        return None

    settings = lg.TestSettings()
    settings.scenario = lg.TestScenario.SingleStream
    settings.mode = lg.TestMode.PerformanceOnly
    settings.min_query_count = queries
    settings.max_query_count = queries
    settings.min_duration_ms = LOADGEN_MIN_DURATION_MS
    settings.performance_sample_count_override = FEED_ROWS
    # Sizes only LoadGen's pre-generated query list: SingleStream issues the next query as soon
    # as the previous one completes.
    settings.single_stream_expected_latency_ns = 20_000 * b

    outdir = Path(job["outdir"])
    outdir.mkdir(parents=True, exist_ok=True)
    log_settings = lg.LogSettings()
    log_settings.log_output.outdir = str(outdir)
    log_settings.log_output.copy_summary_to_stdout = False
    log_settings.enable_trace = False

    sut = lg.ConstructSUT(issue_queries, flush_queries)
    qsl = lg.ConstructQSL(FEED_ROWS, FEED_ROWS, load_samples, load_samples)
    try:
        lg.StartTestWithLogSettings(sut, qsl, settings, log_settings)
    finally:
        lg.DestroyQSL(qsl)
        lg.DestroySUT(sut)

    # The worker's timed region, back to back, on the same session in the same process.
    hot = np.zeros(queries, dtype=np.int64)
    for i in range(queries):
        feed = feeds[i % FEED_ROWS]
        t0 = clock()
        post(session.run(None, feed))
        hot[i] = clock() - t0

    res = _detail_results(outdir / "mlperf_log_detail.txt")
    timings_path = outdir.parent / "timings.npz"
    np.savez(timings_path, inner_ns=inner[: min(count, queries)], hot_ns=hot)
    doc = {
        "query_count": int(res["result_query_count"]),
        "p50_ns": float(res["result_50.00_percentile_latency_ns"]),
        "p99_ns": float(res["result_99.00_percentile_latency_ns"]),
        "mean_ns": float(res["result_mean_latency_ns"]),
        "validity": str(res.get("result_validity", "")),
        "invalid_reason": str(res.get("result_invalid_reason", "")),
        "timings_path": str(timings_path),
        "issued_to_sut": count,
    }
    tmp = Path(job["result_path"] + ".tmp")
    tmp.write_text(json.dumps(doc), encoding="utf-8")
    os.replace(tmp, job["result_path"])
    return 0


# ----------------------------------------------------------------------------- entry point


def _loadgen_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("mlcommons-loadgen")
    except metadata.PackageNotFoundError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its markdown section (``--loadgen-child`` is internal).

    Returns:
        0 when measured (whatever the verdict), 1 when it could not run.
    """
    parser = argparse.ArgumentParser(
        description="qualify's latency harness vs MLPerf LoadGen SingleStream; prints markdown."
    )
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="interleaved rounds")
    parser.add_argument(
        "--queries", type=int, default=DEFAULT_QUERIES, help="timed queries per side per round"
    )
    parser.add_argument(
        "--judged-only",
        action="store_true",
        help="skip the demo digits cases (measured and reported, not judged)",
    )
    parser.add_argument("--workdir", type=Path, default=None, help="keep scratch files here")
    parser.add_argument("--json", type=Path, default=None, help="also write every measurement")
    parser.add_argument("--loadgen-child", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.loadgen_child is not None:
        return _loadgen_child(args.loadgen_child)
    try:
        import mlperf_loadgen  # noqa: F401
    except ImportError:
        print(
            "## qualify's harness vs MLPerf LoadGen SingleStream\n\nNot run: `mlperf_loadgen` is "
            "not installed. Fix: `pip install -e '.[bench]'` (package mlcommons-loadgen).\n"
        )
        return 1
    queries = _round_up(args.queries)
    cases = tuple(c for c in CASES if c.target or not args.judged_only)
    with tempfile.TemporaryDirectory(prefix="bench-lg-") as tmp:
        try:
            ms = run_benchmark(
                workdir=args.workdir or Path(tmp),
                rounds=args.rounds,
                queries=queries,
                cases=cases,
                log=sys.stderr,
            )
        except (BenchError, ValueError, subprocess.TimeoutExpired) as exc:
            print(f"harness_vs_loadgen: {exc}", file=sys.stderr)
            return 1
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(m) for m in ms], indent=1), encoding="utf-8")
    print(
        render_markdown(
            ms,
            loadgen_version=_loadgen_version(),
            rounds=args.rounds,
            queries=queries,
            cases=cases,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
