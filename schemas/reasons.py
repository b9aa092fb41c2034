"""Every reason code qualify writes, each with one meaning, owned once.

A cell's reasons (the runner's gates, `manifest.gates`) and a manifest entry's reasons (the
decision policy, `manifest.policy`) share one vocabulary: a code the policy repeats from the
gates means the same in both, and the README, the report's glossary and the JSON Schemas all
read their wording from here. `schemas.cell.REASON_CODES` and
`schemas.manifest.DECISION_REASON_CODES` are the two views of this table.
"""

from __future__ import annotations

__all__ = ["CELL_CODES", "DECISION_CODES", "REASONS", "RUN_ERROR_CODES"]

REASONS: dict[str, str] = {
    # Gates on a measured cell (manifest.gates), repeated by the policy where they apply.
    "parity_failed": "outputs differ from the baseline beyond the tolerance",
    "p99_over_budget": "the p99 lower confidence bound is above the class's budget",
    "p99_insufficient": "the samples do not decide p99 against the budget (no upper bound "
    "within it, no lower bound above it)",
    "provider_fallback": "more nodes ran off the expected provider than the class allows",
    "expected_provider_missing": "the expected provider executed no node",
    "peak_rss_over_budget": "peak resident memory above the class's budget",
    "cold_init_over_budget": "cold init above the class's budget",
    "peak_rss_missing": "peak memory was not measured although the class has a budget",
    "cold_init_missing": "cold init was not measured although the class has a budget",
    "throughput_below_budget": "the most samples per second any latency config served is below "
    "budgets.min_throughput",
    "throughput_missing": "throughput was not measured although the class has a budget",
    "rate_below_budget": "the highest request rate whose p99 met budgets.p99_ms under Poisson "
    "arrivals is below budgets.min_rate_rps",
    "rate_missing": "the open-loop rate search did not run (workload.open_loop unset) or found "
    "no rate, although the class has budgets.min_rate_rps",
    "energy_over_budget": "energy per inference above the class's budgets.energy_mj",
    "energy_missing": "energy was not measured (no readable counters) although the class has "
    "a budget",
    "sustained_drift": "under sustained load the last window's p99 is above the first's "
    "beyond workload.soak_tolerance, with confidence, by at least workload.soak_floor of the p99 "
    "budget (throttling, leaks, a slowing hook)",
    "soak_insufficient": "a soak window had too few samples to bound its p99, so drift "
    "cannot be judged",
    "slower_than_baseline": "the candidate is measurably slower than the baseline at p50 or p99 "
    "(the lower bound of the paired ratio is above max_slowdown)",
    "baseline_failed": "the baseline could not run on this class, so a candidate's parity "
    "cannot be judged (and the class is held)",
    "emulation_failed": "the parity pass on the class's emulated CPU (qualify run --emulate) "
    "failed for the candidate or the baseline, so parity on the class's ISA cannot be judged",
    # How a subprocess ended (qualify.measure.runner).
    "digest_mismatch": "the artifact's bytes do not match its digest",
    "load_failed": "the runtime refused the model (unsupported opset or op, bad graph)",
    "run_failed": "inference raised an error",
    "hook_failed": "a workload.pipeline hook (pre or post) could not be imported or raised; the "
    "message names the hook and the line",
    "timeout": "the subprocess exceeded its wall-clock limit",
    "out_of_memory": "the subprocess exceeded its memory limit",
    "crashed": "the subprocess died without a result",
    # How a class's run on a fleet host ended without a result (qualify.fleet.cluster).
    "node_lost": "the fleet host measuring the class left the cluster (died or was stopped) "
    "before its run came back",
    "fleet_timeout": "the class's run on a fleet host measured past qualify fleet run's time "
    "limit (--timeout), or the run's deadline (--deadline) passed while it measured",
    "host_failed": "qualify failed on the fleet host before the class's run came back (the "
    "message says what it raised)",
    "bundle_unreadable": "the class's run came back from its fleet host in a form this qualify "
    "cannot read (a host running another qualify version, or damaged on the way)",
    # The decision policy (manifest.policy).
    "candidate_passed": "the candidate passed every gate on this class's exact key",
    "candidate_not_chosen": "the candidate passed, but another one has a lower p99 upper bound",
    "no_candidates": "the project lists no candidate artifact",
    "no_candidate_cell": "the candidate was never measured on this class's key",
    "no_evidence": "the class has no measurement at all: the policy for unknown classes applies",
    "stale": "the class's runtime or provider settings changed since the cell was measured",
    "artifact_changed": "the artifact's file now has other bytes (another digest) than the cell "
    "measured under its name: the cell is stale and the new bytes were never run",
    "workload_changed": "the project's workload feeds or times something else (inputs, batch "
    "sizes, concurrency, dims, parity samples, confidence, pipeline) than the cell was measured "
    "under: the cell is stale",
    "not_in_project": "the cell's key or artifact is not in the project file now: nothing it "
    "measured is judged as today's",
    "budget_changed": "a gate's evidence was gathered against a budget it cannot be re-judged "
    "under (the open-loop rate search, after budgets.p99_ms changed): the cell is stale",
    "emulated": "measured on a host that does not match the class, and the policy forbids it",
    "emulated_numerics": "its parity was computed on an emulated CPU (QEMU), and the policy "
    "does not accept emulated numerics (policy.allow_emulated false)",
    "host_busy": "the run's host was busier than its cores while measuring, and the policy "
    "refuses such evidence (policy.busy_host 'refuse')",
    "verdict_not_pass": "the cell's verdict is not 'pass' and it records no other reason (a "
    "cell that could not run, without its cause; earlier versions also wrote it for the "
    "runner's verdict, which is now judged again under the project file)",
    "parity_missing": "no parity result against the baseline",
    "parity_reference_mismatch": "parity was measured against another baseline than the "
    "project's now: the candidate's cell is stale",
    "placement_missing": "actual node placement was not recorded",
    "run_missing": "the run record the cell belongs to was not supplied",
    "rollback_unchecked": "the run did not check that the class's rollback artifact loads",
    "rollback_failed": "the class's rollback artifact did not load under this runtime",
    "baseline_chosen": "the class gets the approved baseline",
    "baseline_fails_gates": "no candidate qualified and the baseline fails the class's own gates "
    "too (policy.failing_baseline 'hold'): the class is held",
    "baseline_unmeasured": "the baseline has no current measurement on this class",
    "hold": "the class is held: hosts keep what they run and deploy nothing new",
    "held": "a person held the class (qualify rollout hold): its hosts keep what they run, and "
    "releases keep the hold until it is cleared",
    "pinned": "a person pinned the class to this artifact (qualify rollout pin): releases keep "
    "it until the pin is cleared",
    "rolled_back": "a rollout was aborted: every host of the class runs what the rest of it ran "
    "(a held class: its rollback package), and releases keep it so until the class is cleared "
    "or a new rollout starts",
    "rollout_in_progress": "a staged rollout of a candidate that qualified is in progress: the "
    "hosts of its cohort run it, the rest of the class what the entry names until it completes",
    "rollout_completed": "a staged rollout reached every host of the class: it runs the "
    "rollout's artifact, and the one it replaced is its rollback",
    "no_rollback": "the class runs the baseline and was assigned no other artifact proven to load "
    "on its current runtime: it has nothing further to go back to",
}
"""Code -> meaning, for every reason qualify writes anywhere."""

RUN_ERROR_CODES: tuple[str, ...] = (
    "digest_mismatch",
    "load_failed",
    "run_failed",
    "hook_failed",
    "timeout",
    "out_of_memory",
    "crashed",
    "node_lost",
    "fleet_timeout",
    "host_failed",
    "bundle_unreadable",
)
"""How a measuring process (or, on the fleet, its host) can end without a measurement: a
cell's, never a manifest's."""

CELL_CODES: tuple[str, ...] = (
    "parity_failed",
    "p99_over_budget",
    "p99_insufficient",
    "provider_fallback",
    "expected_provider_missing",
    "peak_rss_over_budget",
    "cold_init_over_budget",
    "peak_rss_missing",
    "cold_init_missing",
    "throughput_below_budget",
    "throughput_missing",
    "rate_below_budget",
    "rate_missing",
    "energy_over_budget",
    "energy_missing",
    "slower_than_baseline",
    "sustained_drift",
    "soak_insufficient",
    "baseline_failed",
    "emulation_failed",
    *RUN_ERROR_CODES,
)
"""Codes a cell's reasons may carry."""

DECISION_CODES: tuple[str, ...] = tuple(code for code in REASONS if code not in RUN_ERROR_CODES)
"""Codes a manifest entry's reasons may carry: the gates the policy re-applies and its own."""
