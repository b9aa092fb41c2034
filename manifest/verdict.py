"""The current verdict: what a stored cell says under the project file as it is today.

Owns the one rule every command that shows or uses a verdict as current applies (``matrix show``,
``matrix stale``, the release gate, the report, ``manifest generate``, ``rollout start``): the
cell's stored evidence re-judged against today's budgets, tolerances and gate settings, or
``stale`` with the reason where the evidence cannot answer. `Judge.verdict` is that rule for one
cell; `Judge.standing` is the cell a class x artifact of the project rests on (`pick`) and its
current verdict; `standings` is every class x artifact. Pure: no disk, clock or database (the
caller hashes the artifact files and reads the matrix).

More: docs/internals.md, ``manifest.verdict``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from operator import attrgetter
from typing import Literal, NamedTuple

from pydantic_core import to_json

from manifest.gates import Check, class_checks, judge_with
from schemas.base import Role
from schemas.cell import Cell, OutputParity, Reason, latest
from schemas.project import HostClass, HostClassKey, OutputTolerance, Project, TaskTolerance
from schemas.rules import task_failures, tolerance_failures
from schemas.tolerance import applicable, resolve_tolerance

__all__ = [
    "STALE_CODES",
    "CurrentVerdict",
    "Judge",
    "Now",
    "OutputNow",
    "Pick",
    "Standing",
    "pick",
    "standings",
]

Now = Literal["pass", "fail", "insufficient", "error", "stale"]
"""A cell's verdict under today's project: a runner's verdict, or ``stale``."""

STALE_CODES: dict[str, str] = {
    "stale": "settings changed",
    "workload_changed": "workload changed",
    "artifact_changed": "artifact re-exported",
    "parity_reference_mismatch": "parity against another baseline",
    "budget_changed": "budget changed",
    "not_in_project": "not in the project file",
}
"""The reason codes that make a verdict ``stale``, each in a few words (their meanings:
``schemas.reasons``)."""

_Key = tuple[str, str, str]
_key_of: Callable[[HostClassKey], _Key] = attrgetter("hardware", "runtime", "provider")
"""``HostClassKey.as_tuple`` in C: asked for every cell judged."""

_NO_PARITY = ("parity",)
"""The gates `Judge` does not apply when it re-judges the parity itself."""


class _Class(NamedTuple):
    """What judging a cell of one class needs of the class, made once per class per `Judge`."""

    host_class: HostClass
    checks: tuple[Check, ...]
    """The gates the class turns on but parity (``manifest.gates.class_checks``): parity is
    re-judged here for a candidate, and off on a baseline's cell."""


class OutputNow(NamedTuple):
    """One output's parity under the project's tolerances now."""

    name: str
    limits: OutputTolerance
    """The limits applied (built-in default, family entry, per output: field by field)."""
    failures: tuple[str, ...]
    """``max_abs 0.5 > 0.05``-style phrases, one per limit it fails; empty when it passes."""
    task: TaskTolerance | None = None
    """The task-level tolerance applied (``parity.post``), if the project sets one for it."""


class CurrentVerdict(NamedTuple):
    """One cell's verdict under today's project, with why.

    (Named tuples, here and for `Standing`: made once per class x artifact of a fleet, and a
    frozen dataclass's ``__init__`` costs a few times as much.)"""

    verdict: Now
    reasons: tuple[Reason, ...]
    """Failures first, then what could not be decided; for ``stale``, why it is stale."""
    parity: tuple[OutputNow, ...] = ()
    """Each output's parity under the tolerances now (a candidate's cell with parity and not
    stale; else empty)."""

    @property
    def stale(self) -> bool:
        return self.verdict == "stale"

    @property
    def codes(self) -> list[str]:
        return [reason.code for reason in self.reasons]


class Pick(NamedTuple):
    """The cell a key's artifact rests on, and whether it was measured under other settings."""

    cell: Cell
    other_settings: bool


def pick(cells: Iterable[Cell], digest: str, settings: str) -> Pick | None:
    """The cell of ``digest`` among one key's ``cells`` that decisions rest on: the latest one
    measured under ``settings`` (the class's settings digest now), else the latest of any.

    Args:
        cells: Cells of one key (the matrix's `decision_cells` of it, or all of them).
        digest: The artifact's digest.
        settings: The class's settings digest now.
    """
    mine = [c for c in cells if c.artifact_digest == digest]
    if len(mine) == 1:  # one cell of the digest on the key (a fleet's usual case): no ordering
        return Pick(mine[0], other_settings=mine[0].settings_digest != settings)
    fresh = latest(c for c in mine if c.settings_digest == settings)
    if fresh is not None:
        return Pick(fresh, other_settings=False)
    old = latest(mine)
    return None if old is None else Pick(old, other_settings=True)


class Standing(NamedTuple):
    """One class x artifact of the project today: the cell it rests on and its current verdict."""

    host_class: str
    label: str
    role: Role
    digest: str | None
    """The artifact's digest now (its file's bytes); None when unknown."""
    cell: Cell | None
    """The cell of ``digest`` on the class's key it rests on (`pick`); None: never run."""
    current: CurrentVerdict | None
    """``cell``'s current verdict; None with no cell."""
    replaced: Cell | None = None
    """With no cell: the latest cell on the key of this label's earlier bytes (the file was
    re-exported since), else None."""


class Judge:
    """Current verdicts under one project, and the artifacts' digests now.

    Made once per command (or per decision of a fleet): the settings digest of each class and
    the tolerance of each (precision, output) are computed once and reused.
    """

    def __init__(
        self,
        project: Project,
        digests: Mapping[str, str],
        *,
        current_settings: Mapping[str, str] | None = None,
    ) -> None:
        """
        Args:
            project: The project file as it is now.
            digests: Artifact label -> the digest of its file now. A label missing here has no
                known bytes: no cell counts as that artifact's.
            current_settings: Class name -> the settings digest to treat as current, overriding
                ``HostClass.settings_digest()`` (``manifest.policy.decide``'s override).
        """
        self.project = project
        self.digests = dict(digests)
        self.labels: dict[str, str] = {}
        specs = [project.artifacts.baseline, *project.artifacts.candidates]
        self.roles: dict[str, Role] = {}
        for index, spec in enumerate(specs):
            digest = self.digests.get(spec.label)
            self.roles[spec.label] = "baseline" if index == 0 else "candidate"
            if digest is not None:
                self.labels.setdefault(digest, spec.label)
        self.baseline_digest = self.digests.get(project.artifacts.baseline.label)
        self.classes: dict[_Key, str] = {
            _key_of(cls.key): name for name, cls in project.host_classes.items()
        }
        self._keys: dict[str, _Key] = {name: key for key, name in self.classes.items()}
        self._classes: dict[str, _Class] = {}
        self._overrides = dict(current_settings or {})
        self._settings: dict[str, str] = {}
        self._settings_by_json: dict[tuple[bytes, bytes], str] = {}
        self._limits: dict[tuple[str, str], OutputTolerance] = {}
        self._found: dict[tuple[object, ...], OutputNow] = {}
        wl = project.workload
        self.workload = wl.evidence_digest()
        self._soak = (wl.soak_tolerance, wl.soak_floor)
        # Outputs the project says are not class scores today (a state fed back, or kind set):
        # top-1 agreement measured on them by an older run is not held against them.
        self._not_scores = {str(i.state_from) for i in wl.inputs.values() if i.state_from}
        self._not_scores |= {n for n, o in wl.outputs.items() if o.kind in ("state", "values")}

    # -- what "today" is ------------------------------------------------------------------

    def settings(self, name: str) -> str:
        """The settings digest of class ``name`` now (the override, else the class's own)."""
        found = self._settings.get(name)
        if found is None:
            found = self._overrides.get(name) or self._settings_of(self.project.host_classes[name])
            self._settings[name] = found
        return found

    def _settings_of(self, cls: HostClass) -> str:
        # A fleet's classes share a few runtime builds and provider setups: their digests are
        # computed once per distinct settings (a function of those field values alone).
        # The key is their JSON (one value, one text: 1, true and 1.0 apart), written by
        # pydantic-core without model_dump_json's keyword handling.
        key = (to_json(cls.runtime), to_json(cls.provider))
        digest = self._settings_by_json.get(key)
        if digest is None:
            digest = self._settings_by_json[key] = cls.settings_digest()
        return digest

    def limits(self, precision: str, output: str) -> OutputTolerance:
        """The parity limits of one output of a ``precision`` artifact under the project now."""
        found = self._limits.get((precision, output))
        if found is None:
            found = resolve_tolerance(self.project.tolerance(precision), output)
            if output in self._not_scores:
                found = applicable(found, ["top1_agreement"])
            self._limits[(precision, output)] = found
        return found

    # -- one cell ---------------------------------------------------------------------------

    def verdict(self, cell: Cell, *, name: str | None = None) -> CurrentVerdict:
        """The cell's verdict under the project now (the module docstring's rule).

        Args:
            cell: A stored cell.
            name: The class whose key the cell is on, when the caller knows it.
        """
        key = _key_of(cell.key)
        name = name if name is not None else self.classes.get(key)
        if name is None or self._keys.get(name) != key:
            return _stale(
                "not_in_project",
                f"no class of the project has the key ({', '.join(key)}) "
                f"{cell.artifact_name} was measured on",
            )
        label = self.labels.get(cell.artifact_digest)
        if label is None:
            return self._unknown_bytes(cell)
        if cell.settings_digest != self.settings(name):
            return _stale(
                "stale",
                f"{label} was measured on {name} in run {cell.run_id} under runtime or provider "
                f"settings {cell.settings_digest[:19]}, and the class's are now different",
            )
        if cell.workload_digest is not None and cell.workload_digest != self.workload:
            return _stale(
                "workload_changed",
                f"{label} was measured on {name} in run {cell.run_id} under workload "
                f"{cell.workload_digest[:19]}, and the project's workload now feeds or times "
                "something else (inputs, batch sizes, concurrency, dims, parity samples, "
                "confidence or pipeline)",
            )
        if cell.error is not None:
            return CurrentVerdict("error", tuple(cell.reasons) or _no_cause(cell))
        return self._rejudged(cell, self._class(name), self.roles[label])

    def _class(self, name: str) -> _Class:
        found = self._classes.get(name)
        if found is None:
            cls = self.project.host_classes[name]
            found = self._classes[name] = _Class(cls, class_checks(cls, skip=_NO_PARITY))
        return found

    def _unknown_bytes(self, cell: Cell) -> CurrentVerdict:
        now = self.digests.get(cell.artifact_name)
        if now is not None:
            return _stale(
                "artifact_changed",
                f"{cell.artifact_name} is now {now[:19]}, run {cell.run_id} measured its earlier "
                f"bytes {cell.artifact_digest[:19]}",
            )
        return _stale(
            "not_in_project",
            f"no artifact of the project is {cell.artifact_name} ({cell.artifact_digest[:19]})",
        )

    def _rejudged(self, cell: Cell, of: _Class, role: Role) -> CurrentVerdict:
        outputs: tuple[OutputNow, ...] = ()
        fails: list[Reason] = []
        cls, checks = of
        parity = cell.parity
        if role == "candidate" and parity is not None:
            if self.baseline_digest is not None and parity.reference_digest != self.baseline_digest:
                return _stale(
                    "parity_reference_mismatch",
                    f"parity was measured against {parity.reference_digest[:19]}, not the "
                    f"baseline {self.baseline_digest[:19]} of the project now",
                )
            outputs = tuple([self._output(cell.precision, o) for o in parity.outputs])
            failures = [f"{o.name} {f}" for o in outputs for f in o.failures]
            if failures:
                fails.append(
                    Reason(
                        code="parity_failed",
                        message=f"parity fails the current {cell.precision} tolerance: "
                        + "; ".join(failures),
                    )
                )
        elif cell.role == "candidate":  # its parity gate applies (off on a baseline's cell)
            checks = class_checks(cls)
        if cell.open_loop is not None:  # the rate search's budget is all it asks of the cell
            budget = _rate_budget_changed(cell, cls)
            if budget is not None:
                return CurrentVerdict("stale", (budget,))
        soak = cell.soak
        if soak is not None and soak is not (now := soak.under(*self._soak)):
            # The soak's windows are the evidence: drift is decided again under the project's
            # soak_tolerance and soak_floor now (the budget is the class's now in any case).
            cell = cell.model_copy(update={"soak": now})
        verdict, reasons = judge_with(cell, cls, checks)
        if fails:  # the parity's failure first, then the gates' (failures before the undecided)
            return CurrentVerdict("fail", (*fails, *reasons), outputs)
        return CurrentVerdict(verdict, tuple(reasons), outputs)  # type: ignore[arg-type]

    def _output(self, precision: str, out: OutputParity) -> OutputNow:
        """One output's parity under the limits now, remembered per distinct measured values
        (values holding a zero are not: 0.0 == -0.0 as a key, and the sign would show in a
        phrase)."""
        values = (out.max_abs, out.mean_abs, out.max_rel, out.cosine_min, out.top1_agreement)
        tasks = (out.exact_match, out.box_f1, out.iou)
        key = (precision, out.name, values, tasks, frozenset(out.skipped))
        found = self._found.get(key)
        if found is None:
            # The metrics that did not apply to this output (``skipped``) are not held against
            # it; the task-level failures (``parity.post``) come first.
            limits = applicable(self.limits(precision, out.name), out.skipped)
            task = self.project.parity.task(out.name)
            failures = (
                *task_failures(out.exact_match, out.box_f1, out.iou, task),
                *tolerance_failures(_measured(out), limits),
            )
            found = OutputNow(out.name, limits, tuple(failures), task)
            if 0.0 not in values:
                self._found[key] = found
        return found

    def _failures(self, precision: str, out: OutputParity) -> tuple[str, ...]:
        """``<output> <phrase>`` for each limit the output fails now."""
        return tuple(f"{out.name} {f}" for f in self._output(precision, out).failures)

    # -- a class x artifact -----------------------------------------------------------------

    def standing(self, name: str, label: str, key_cells: Sequence[Cell]) -> Standing:
        """What class ``name`` x artifact ``label`` rests on today (`pick` over the cells of
        the class's key) and its current verdict."""
        role = self.roles[label]
        digest = self.digests.get(label)
        chosen = pick(key_cells, digest, self.settings(name)) if digest is not None else None
        if chosen is None:
            earlier = latest(
                c for c in key_cells if c.artifact_name == label and c.artifact_digest != digest
            )
            return Standing(name, label, role, digest, None, None, earlier)
        cell = chosen.cell
        return Standing(name, label, role, digest, cell, self.verdict(cell, name=name))


def _no_cause(cell: Cell) -> tuple[Reason, ...]:
    """The reason of an error cell that records none (its process's cause is all there is)."""
    return (
        Reason(
            code="verdict_not_pass",
            message=f"run {cell.run_id} could not measure it: {cell.error or 'no detail'}",
        ),
    )


def _stale(code: str, message: str) -> CurrentVerdict:
    return CurrentVerdict("stale", (Reason(code=code, message=message),))


def _measured(out: OutputParity) -> OutputTolerance:
    """The measured values of one output as limits (the tightest that would pass)."""
    values = (out.max_abs, out.mean_abs, out.max_rel, out.cosine_min, out.top1_agreement)
    kept = out.min_passing
    if (
        values
        == (kept.max_abs, kept.mean_abs, kept.max_rel, kept.cosine_min, kept.top1_agreement_min)
        and 0.0 not in values
    ):
        # The runner records the measured values as min_passing (qualify.measure.parity): the same
        # model, without validating a copy per cell. (A zero is rebuilt: 0.0 == -0.0, and the
        # sign would show in a message.)
        return kept
    return OutputTolerance(
        max_abs=out.max_abs,
        mean_abs=out.mean_abs,
        max_rel=out.max_rel,
        cosine_min=out.cosine_min,
        top1_agreement_min=out.top1_agreement,
    )


def _rate_budget_changed(cell: Cell, cls: HostClass) -> Reason | None:
    """Why the rate gate cannot be re-judged, or None when it can.

    The open-loop search finds the highest rate whose p99 meets ``budgets.p99_ms``: a rate found
    under another p99 budget still answers where the change cannot alter the outcome (a rate
    that met a tighter budget meets a looser one; one that missed a looser budget misses a
    tighter one), and nowhere else.
    """
    wanted = cls.budgets.min_rate_rps
    found = cell.open_loop
    if wanted is None or found is None or found.budget_ms == cls.budgets.p99_ms:
        return None
    rate = found.max_rate_rps
    looser = cls.budgets.p99_ms > found.budget_ms
    if rate is not None and (rate >= wanted) == looser:
        return None
    return Reason(
        code="budget_changed",
        message=f"the open-loop rate search ran against p99 {found.budget_ms:g} ms; the budget "
        f"is now {cls.budgets.p99_ms:g} ms, which the rates it probed cannot answer for "
        f"min_rate_rps {wanted:g}: re-run",
    )


def standings(judge_: Judge, by_key: Mapping[_Key, Sequence[Cell]]) -> list[Standing]:
    """Every class x artifact of the project (classes in file order, the baseline first), each
    with the cell it rests on and its current verdict.

    Args:
        judge_: The project's `Judge` (its digests are the artifacts' now).
        by_key: Cells by (hardware, runtime, provider): ``Store.decision_cells_by_key``.
    """
    project = judge_.project
    labels = [project.artifacts.baseline.label, *(c.label for c in project.artifacts.candidates)]
    found: list[Standing] = []
    for name, cls in project.host_classes.items():
        key_cells = by_key.get(cls.key.as_tuple(), ())
        found.extend(judge_.standing(name, label, key_cells) for label in labels)
    return found
