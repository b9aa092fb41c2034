"""A run's numerics: each cell's parity and the record of how its outputs were computed.

Owns, for one `qualify.run.qualify_run`, the parity passes on the class's emulated CPU when the
plan (`qualify.measure.emulators.plan_numerics`) asks for them, and per artifact the parity against the
baseline on the outputs the plan says are the class's (the emulated ones, else the measuring
host's own), with the host's own figures kept beside emulated ones for comparison. Does not
decide the plan, launch QEMU, read the saved outputs or compare them (`qualify.measure.emulators`; the
run hands over how to load and compare, `qualify.measure.parity`'s).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qualify.measure.emulators import NumericsPlan, emulated_passes
from qualify.measure.job import WorkerJob
from qualify.measure.runner import WorkerOutcome
from schemas.cell import Numerics, ParityResult, Reason

__all__ = ["CellNumerics", "Compare", "Outputs", "RunNumerics"]

Outputs = dict[str, Any]
"""A child's saved outputs, by name: samples per output (`qualify.measure.parity.unpack`)."""
Compare = Callable[[Outputs, Outputs], ParityResult]
"""A candidate's parity: (the baseline's outputs, its own) -> the result."""


@dataclass(frozen=True)
class CellNumerics:
    """One cell's parity, the reasons it could not be judged, its record and what to say."""

    parity: ParityResult | None
    reasons: list[Reason]
    numerics: Numerics
    said: str | None


def _why(outcome: WorkerOutcome | None) -> str:
    if outcome is None:
        return "not run (the artifact failed natively)"
    return f"{outcome.error_code}: {outcome.error_message}"


class RunNumerics:
    """Parity of every artifact of a run, on the outputs its numerics plan names."""

    def __init__(self, plan: NumericsPlan, *, load: Callable[[Path], Outputs | None]) -> None:
        """``load``: a child's saved outputs from their file, None when there is none."""
        self.plan = plan
        self._load = load
        self._passes: list[WorkerOutcome | None] | None = None
        self._folders: list[Path] = []
        self._native: Outputs | None = None
        self._native_error: str | None = None
        self._emulated: Outputs | None = None
        self._emulated_error: str | None = None

    def run_passes(
        self,
        jobs: Sequence[tuple[WorkerJob, Path] | None],
        *,
        timeout_s: float,
        parallel: int,
        run: Callable[..., WorkerOutcome],
        on_event: Callable[[str], None],
    ) -> None:
        """Each artifact's parity pass on the emulated CPU (none when the plan is native).

        Args:
            jobs: per artifact (baseline first), its ``parity`` job and folder; None for one
                that failed natively.
        """
        launch = self.plan.launch
        if launch is None:
            return
        count = sum(1 for j in jobs if j)
        on_event(f"parity on emulated {self.plan.cpu}: {count} artifacts, {parallel} at a time")
        self._folders = [job[1] if job else Path() for job in jobs]
        started = time.monotonic()
        self._passes = emulated_passes(
            launch, jobs, timeout_s=timeout_s, parallel=parallel, run=run
        )
        spent = time.monotonic() - started
        on_event(f"parity on emulated {self.plan.cpu}: done in {spent:.1f} s")

    def _emulated_outputs(self, index: int) -> tuple[Outputs | None, str | None]:
        assert self._passes is not None
        outcome = self._passes[index]
        if outcome is None or outcome.error_code is not None:
            return None, _why(outcome)
        found = self._load(self._folders[index] / "outputs.npz")
        return (found, None) if found is not None else (None, "it wrote no outputs")

    def baseline(self, outcome: WorkerOutcome, outputs_path: Path) -> Numerics:
        """Take the baseline's outputs (the reference of every candidate's parity)."""
        if outcome.error_code is None:
            self._native = self._load(outputs_path)
        if self._native is None:
            self._native_error = outcome.error_message or "it wrote no outputs"
        if self._passes is None:
            return self.plan.numerics()
        self._emulated, self._emulated_error = self._emulated_outputs(0)
        failed = (
            None if self._emulated_error is None else f"its pass failed: {self._emulated_error}"
        )
        return self.plan.numerics(note=failed)

    def candidate(
        self, index: int, outputs_path: Path, compare: Compare, label: str
    ) -> CellNumerics:
        """A measured candidate's parity against the baseline, on the plan's outputs."""
        if self._native is None:  # the baseline failed natively: nothing to compare with
            return CellNumerics(None, [self._baseline_failed()], self.plan.numerics(), None)
        native = _compared_with(compare, self._native, self._load(outputs_path))
        if self._passes is None:
            if native is not None:
                return CellNumerics(native, [], self.plan.numerics(), None)
            return CellNumerics(None, [self._baseline_failed()], self.plan.numerics(), None)
        mine, error = self._emulated_outputs(index)
        emulated = _compared_with(compare, self._emulated, mine)
        here = (
            None
            if native is None
            else {o.name: o.max_abs for o in native.outputs if o.max_abs is not None}
        )
        if emulated is None:
            which = "the baseline's" if self._emulated_error else "its"
            why = self._emulated_error or error
            reason = Reason(
                code="emulation_failed",
                message=f"{which} parity pass on emulated {self.plan.cpu} failed ({why}), so "
                "parity on the class's ISA is not known",
            )
            record = self.plan.numerics(note=f"parity pass failed: {why}", native_max_abs=here)
            return CellNumerics(None, [reason], record, f"{label}: {reason.message}")
        return CellNumerics(
            emulated,
            [],
            self.plan.numerics(native_max_abs=here),
            _compared(label, self.plan, emulated, here),
        )

    def _baseline_failed(self) -> Reason:
        return Reason(
            code="baseline_failed",
            message=f"the baseline could not be run ({self._native_error}), so parity could "
            "not be judged",
        )


def _compared_with(
    compare: Compare, reference: Outputs | None, outputs: Outputs | None
) -> ParityResult | None:
    if reference is None or outputs is None:
        return None
    return compare(reference, outputs)


def _compared(
    label: str, plan: NumericsPlan, emulated: ParityResult, here: dict[str, float] | None
) -> str:
    """``int8: parity on emulated neoverse-n1: max abs scores 0.0284 (this host: 0.0284)``."""
    parts = []
    for out in emulated.outputs:
        text = f"{out.name} {out.max_abs:.3g}" if out.max_abs is not None else f"{out.name} ?"
        if here is not None and out.name in here:
            text += f" (this host: {here[out.name]:.3g})"
        parts.append(text)
    return f"{label}: parity on emulated {plan.cpu}: max abs " + ", ".join(parts)
