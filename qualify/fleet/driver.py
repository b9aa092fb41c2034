"""The driver's loop of ``qualify fleet run``: every class ends, as cells or as a gap with its
reason, written to the matrix the moment it is known.

Owns placing each class on a host that may take it, watching the cluster, retrying once after a
refusal, and ending each class: done (its bundle stored), error cells (``node_lost``,
``fleet_timeout``, ``host_failed``, ``bundle_unreadable``: the host is known) or a gap (no host
measured it). It does not measure (`qualify.fleet.host` does).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from qualify import __version__
from qualify.fleet.cluster import (
    CLASS_RESOURCE,
    HOST_RESOURCE,
    NODE_ID_LABEL,
    ClassRun,
    FleetError,
    FleetOptions,
    FleetOutcome,
    _relative,
    disagreement,
    expected_labels,
)
from qualify.fleet.host import REPLY_FORMAT, Tracker, qualify_here
from qualify.project.load import LoadedProject
from schemas.cell import Cell, Reason, RunBundle, RunRecord
from schemas.host import Fingerprint

__all__ = ["Driver", "FleetFailed", "can_take", "error_bundle", "unmeasured"]

_TRACKER_WAIT_S = 30.0
"""Most seconds to wait for the tracker (on the driver's own node) to answer."""


class FleetFailed(FleetError):
    """The driver failed mid-run; every class not back was recorded as ``driver_failed``
    (``results``: how each class that ended had ended)."""

    exit_code = 1

    def __init__(self, message: str, results: Mapping[str, ClassRun] | None = None) -> None:
        super().__init__(message)
        self.results = dict(results or {})


def unmeasured(scope: Sequence[str], failure: Exception) -> dict[str, str]:
    """The classes of ``scope`` a failed fleet run did not measure, with why: those it had
    ended as gaps (a `FleetFailed` says which), and every class it had not ended."""
    ended = failure.results if isinstance(failure, FleetFailed) else {}
    gaps = {}
    for name in scope:
        run = ended.get(name)
        if run is None:
            gaps[name] = f"driver_failed: not measured: {failure}"
        elif run.state == "gap":
            gaps[name] = f"{run.reason}: {run.message}"
    return gaps


def can_take(node: Mapping[str, Any], name: str, selector: Mapping[str, str]) -> bool:
    """Whether the live ``node`` (a ``ray.nodes()`` entry) can take class ``name``'s task: it
    advertises the class and a host slot, and its labels satisfy ``selector`` (``value`` or
    ``!value``, as Ray's label selectors)."""
    if not node.get("Alive"):
        return False
    resources = node.get("Resources") or {}
    if CLASS_RESOURCE + name not in resources or HOST_RESOURCE not in resources:
        return False
    labels = dict(node.get("Labels") or {})
    labels.setdefault(NODE_ID_LABEL, str(node.get("NodeID", "")))
    for key, wanted in selector.items():
        have = labels.get(key)
        if wanted.startswith("!") and have == wanted[1:]:
            return False
        if not wanted.startswith("!") and have != wanted:
            return False
    return True


def _where(placed: Mapping[str, Any]) -> str:
    """The host a task said it landed on: ``name (node 0123456789ab)``."""
    return f"{placed['hostname']} (node {str(placed['node'])[:12]})"


def _host(node: Mapping[str, Any]) -> str:
    labels = node.get("Labels") or {}
    name = labels.get("qualify/host") or node.get("NodeManagerHostname") or "?"
    return f"{name} (node {str(node.get('NodeID', '?'))[:12]})"


@dataclass
class _Class:
    """One class's life in the run."""

    name: str
    tag: str = ""
    ref: Any = None
    selector: dict[str, str] = field(default_factory=dict)
    tries: int = 0
    hosts: set[str] = field(default_factory=set)
    """Hosts that could take it at some look (for the message when they are gone)."""
    waiting_since: float | None = None
    """Since when no live host can take it, or the node it landed on is gone."""
    placed: dict[str, Any] | None = None
    measuring_since: float | None = None
    refusals: list[str] = field(default_factory=list)


class Driver:
    """One fleet run over a connected Ray (see the module docstring)."""

    def __init__(
        self,
        ray: Any,
        loaded: LoadedProject,
        files: dict[str, Path],
        options: FleetOptions,
        on_event: Callable[[str], None],
        stop: Callable[[], bool],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ray = ray
        self.loaded = loaded
        self.files = files
        self.options = options
        self.say = on_event
        self.stop = stop
        self.clock = clock
        self.expected = expected_labels(loaded)
        self.open: dict[str, _Class] = {}
        self.results: dict[str, ClassRun] = {}
        self.digests: list[str] = []

    # --- the loop -------------------------------------------------------------------------

    def run(self, wanted: Sequence[str]) -> FleetOutcome:
        """Every class in ``wanted`` to its end; the outcome in that order.

        Raises:
            FleetFailed: the driver failed mid-run (classes not back recorded first).
        """
        try:
            self._prepare()
            start = self.clock()
            nodes = self._nodes()
            for name in wanted:
                self.open[name] = _Class(name)
                self._submit(self.open[name], nodes)
            while self.open:
                self._look(start)
        except BaseException as exc:
            why = str(exc) if isinstance(exc, FleetError) else f"{type(exc).__name__}: {exc}"
            self._abandon("driver_failed", f"the driver failed: {why}")
            raise FleetFailed(f"fleet run failed: {why}", self.results) from exc
        return FleetOutcome([self.results[name] for name in wanted])

    def _prepare(self) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from matrix.store import Store

        model = self.loaded.project.model
        with Store.open(
            self.options.db_path, model=model
        ):  # it exists from now on, whatever happens
            pass
        here = self.ray.get_runtime_context().get_node_id()
        strategy = NodeAffinitySchedulingStrategy(here, soft=False)
        self.tracker = (
            self.ray.remote(num_cpus=0)(Tracker).options(scheduling_strategy=strategy).remote()
        )
        self.task = self.ray.remote(num_cpus=0, max_retries=0)(qualify_here)
        shipped = {rel: self._put(rel, path) for rel, path in self.files.items()}
        specs = [self.loaded.project.artifacts.baseline, *self.loaded.project.artifacts.candidates]
        self.digests = [shipped[_relative(self.loaded, s.path, "artifact")][0] for s in specs]
        self.shipment = {
            "project": self.loaded.path.name,
            "files": shipped,
            "version": __version__,
        }

    def _put(self, rel: str, path: Path) -> tuple[str, Any]:
        """One file into the object store (mapped, not read into this process) and its digest;
        the project file must still be the bytes that were validated."""
        import numpy as np

        h = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        if path == self.loaded.path and self.loaded.sha256 not in (None, h.hexdigest()):
            raise FleetError(f"{path}: changed since it was read; run fleet run again")
        size = path.stat().st_size
        data = np.memmap(path, dtype=np.uint8, mode="r") if size else b""
        return "sha256:" + h.hexdigest(), self.ray.put(np.asarray(data) if size else data)

    def _nodes(self) -> list[dict[str, Any]]:
        return [dict(n) for n in self.ray.nodes() if n.get("Alive")]

    def _look(self, start: float) -> None:
        refs = [c.ref for c in self.open.values()]
        ready, _ = self.ray.wait(
            refs, num_returns=len(refs), timeout=self.options.poll_s, fetch_local=False
        )
        seen = self._seen()
        nodes = self._nodes()
        now = self.clock()
        done = set(ready)
        for c in list(self.open.values()):
            self._note_progress(c, seen, now)
            if c.ref in done:
                self._collect(c)
            elif not self._past_timeout(c, now):
                self._watch(c, nodes, now)
        deadline = self.options.deadline_s
        if deadline is not None and now - start > deadline and self.open:
            for c in list(self.open.values()):
                self._past_deadline(c, deadline)
        if self.stop() and self.open:
            self._abandon("driver_stopped", "the driver was stopped (SIGTERM or Ctrl-C)")

    def _seen(self) -> dict[str, Any]:
        from ray import exceptions as rex

        try:
            return dict(self.ray.get(self.tracker.seen.remote(), timeout=_TRACKER_WAIT_S))
        except rex.GetTimeoutError as exc:
            raise FleetFailed(
                f"the tracker on the driver's node did not answer within {_TRACKER_WAIT_S:g} s"
            ) from exc

    def _note_progress(self, c: _Class, seen: Mapping[str, Any], now: float) -> None:
        placed = seen["placed"].get(c.tag)
        if placed is not None and c.placed is None:
            c.placed = placed
            self.say(
                f"{c.name}: on {placed['hostname']} (node {placed['node'][:12]}), waiting for "
                "its host lock or machine"
            )
        if c.tag in seen["measuring"] and c.measuring_since is None:
            c.measuring_since = now
            self.say(f"{c.name}: measuring on {c.placed['hostname'] if c.placed else '?'}")

    # --- sending ---------------------------------------------------------------------------

    def _submit(self, c: _Class, nodes: list[dict[str, Any]], exclude: str | None = None) -> None:
        """Send ``c`` to a host that may take it, or end it as a gap at once when none can."""
        c.tries += 1
        c.tag = f"{c.name}#{c.tries}"
        c.selector = dict(self.expected)
        if exclude is not None:
            c.selector[NODE_ID_LABEL] = "!" + exclude
        c.placed = None
        c.measuring_since = None
        c.waiting_since = None
        takers = [n for n in nodes if can_take(n, c.name, c.selector)]
        if not takers:
            reason, why = self._why_none(c, nodes)
            c.ref = None
            self._gap(c, reason, why)
            return
        c.hosts.update(_host(n) for n in takers)
        resources = {CLASS_RESOURCE + c.name: 1.0, HOST_RESOURCE: 1.0}
        c.ref = self.task.options(resources=resources, label_selector=c.selector).remote(
            self.shipment, c.name, c.tag, self.tracker
        )
        self.say(f"{c.name}: scheduled" + (" again, on another host" if exclude else ""))

    def _why_none(self, c: _Class, nodes: list[dict[str, Any]]) -> tuple[str, str]:
        """Why no live host can take ``c`` now: the gap's reason code and sentence."""
        advertising = [n for n in nodes if CLASS_RESOURCE + c.name in (n.get("Resources") or {})]
        disagreeing = [
            f"{_host(n)} {why}"
            for n in advertising
            if (why := disagreement(n.get("Labels") or {}, self.expected)) is not None
        ]
        if c.refusals:
            tried = "; ".join(c.refusals)
            rest = f"; {'; '.join(disagreeing)}" if disagreeing else ""
            return (
                "host_mismatch",
                f"refused at run time by {tried}, and no other host may take it{rest}",
            )
        if disagreeing:
            return "host_mismatch", "every host that advertises it disagrees: " + "; ".join(
                disagreeing
            )
        if c.hosts:
            gone = ", ".join(sorted(c.hosts))
            return "node_lost", f"its hosts ({gone}) left the cluster before it was measured"
        return "unserved", f"no live host advertises {CLASS_RESOURCE}{c.name}"

    # --- watching --------------------------------------------------------------------------

    def _watch(self, c: _Class, nodes: list[dict[str, Any]], now: float) -> None:
        """End ``c`` once no live host has been able to take it (or the node it landed on has
        been gone) for ``host_wait_s``."""
        alive = {str(n.get("NodeID")) for n in nodes}
        if c.placed is not None:
            ok = c.placed["node"] in alive
        else:
            takers = [n for n in nodes if can_take(n, c.name, c.selector)]
            c.hosts.update(_host(n) for n in takers)
            ok = bool(takers)
        if ok:
            c.waiting_since = None
            return
        if c.waiting_since is None:
            c.waiting_since = now
            return
        if now - c.waiting_since < self.options.host_wait_s:
            return
        self._cancel(c)
        if c.placed is not None:
            self._cells(
                c, "node_lost", f"{_where(c.placed)} left the cluster before the run came back"
            )
        else:
            reason, why = self._why_none(c, nodes)
            self._gap(c, reason, why + f" (waited {self.options.host_wait_s:g} s)")

    def _past_timeout(self, c: _Class, now: float) -> bool:
        limit = self.options.timeout_s
        if c.measuring_since is None or now - c.measuring_since <= limit:
            return False
        self._cancel(c)
        where = _where(c.placed) if c.placed else "its host"
        self._cells(
            c, "fleet_timeout", f"the run on {where} measured past fleet run's {limit:g} s limit"
        )
        return True

    def _past_deadline(self, c: _Class, deadline: float) -> None:
        self._cancel(c)
        said = f"the run's {deadline:g} s deadline (--deadline) passed"
        if c.measuring_since is not None:
            where = _where(c.placed) if c.placed else "its host"
            self._cells(c, "fleet_timeout", f"{said} while it measured on {where}")
        elif c.placed is not None:
            self._gap(c, "fleet_timeout", f"{said} before {_where(c.placed)} started measuring")
        else:
            self._gap(c, "fleet_timeout", f"{said} while it waited for a host")

    def _cancel(self, c: _Class) -> None:
        with contextlib.suppress(Exception):  # already finished or gone: nothing to stop
            self.ray.cancel(c.ref, force=True)

    def _abandon(self, reason: str, why: str) -> None:
        """End every open class as a gap (the driver stops or failed), best effort."""
        for c in list(self.open.values()):
            self._cancel(c)
            try:
                self._gap(c, reason, why)
            except Exception:  # the matrix itself may be what failed; the class stays open
                self.results[c.name] = ClassRun(c.name, "gap", why, reason=reason)
                self.open.pop(c.name, None)

    # --- collecting ------------------------------------------------------------------------

    def _collect(self, c: _Class) -> None:
        """A finished task: its bundle stored, or its failure as error cells or a gap."""
        from ray import exceptions as rex

        try:
            reply = self.ray.get(c.ref, timeout=_TRACKER_WAIT_S)
        except rex.RayTaskError as exc:  # qualify itself failed there
            cause = exc.cause if getattr(exc, "cause", None) is not None else exc
            self._cells(c, "host_failed", f"failed on its host: {type(cause).__name__}: {cause}")
            return
        except (rex.RayError, OSError) as exc:
            where = _where(c.placed) if c.placed else "its host"
            self._cells(
                c, "node_lost", f"{where} was lost before the run came back ({type(exc).__name__})"
            )
            return
        if not isinstance(reply, dict) or reply.get("format") != REPLY_FORMAT:
            self._cells(
                c, "bundle_unreadable", "its host answered in a form this qualify cannot read"
            )
            return
        if reply.get("refused"):
            node = str(reply.get("node"))
            c.refusals.append(
                f"{reply.get('hostname')} (node {node[:12]}): "
                + "; ".join(map(str, reply["refused"]))[:600]
            )
            self.say(f"{c.name}: refused by {c.refusals[-1]}")
            self.ray.get(self.tracker.release.remote(c.tag))
            if c.tries < 2:
                self._submit(c, self._nodes(), exclude=node)  # the cluster as it is now
            else:
                self._gap(c, "host_mismatch", "refused at run time by " + "; ".join(c.refusals))
            return
        self._arrived(c, reply)

    def _arrived(self, c: _Class, reply: Mapping[str, Any]) -> None:
        from pydantic import ValidationError

        from matrix.errors import BundleError

        try:
            bundle = RunBundle.model_validate_json(reply["bundle"])
            if bundle.run.host_class != c.name or bundle.run.model != self.loaded.project.model:
                raise ValueError(
                    f"it is a run of {bundle.run.host_class!r} of {bundle.run.model!r}"
                )
            samples = _read_samples(reply.get("samples"))
        except (ValidationError, ValueError, KeyError, TypeError, OSError) as exc:
            first = str(exc).strip().splitlines()
            detail = " ".join(first[:3])[:400]
            host = reply.get("hostname", "its host")
            self._cells(c, "bundle_unreadable", f"the run on {host} came back unreadable: {detail}")
            return
        host = f"{reply.get('hostname')} (node {str(reply.get('node'))[:12]})"
        verdicts = ", ".join(f"{cell.artifact_name} {cell.verdict}" for cell in bundle.cells)
        try:
            self._store(bundle, samples)
        except BundleError as exc:  # well-formed, but not a run this matrix can accept
            self._cells(c, "bundle_unreadable", f"the run on {host} was refused: {exc}"[:600])
            return
        self._end(
            c, ClassRun(c.name, "done", f"done on {host}: {verdicts}", host=host, bundle=bundle)
        )

    # --- ending ----------------------------------------------------------------------------

    def _end(self, c: _Class, run: ClassRun) -> None:
        self.results[c.name] = run
        self.open.pop(c.name, None)
        if c.ref is not None:  # it may hold its machine
            with contextlib.suppress(
                Exception
            ):  # the tracker is gone with the run: nothing to free
                self.ray.get(self.tracker.release.remote(c.tag), timeout=_TRACKER_WAIT_S)
        shown = run.message if run.state == "done" else f"{run.state} ({run.reason}): {run.message}"
        self.say(f"{c.name}: {shown}")

    def _cells(self, c: _Class, code: str, message: str) -> None:
        """Error cells for ``c`` when its host is known (it said where it landed), else a gap."""
        if c.placed is None:
            self._gap(c, code, message)
            return
        bundle = error_bundle(self.loaded, c.name, c.placed, code, message, self.digests)
        self._store(bundle, None)
        host = _where(c.placed)
        self._end(c, ClassRun(c.name, "error", message, host=host, bundle=bundle, reason=code))

    def _gap(self, c: _Class, reason: str, why: str) -> None:
        from matrix.store import Store
        from qualify.measure.hostlock import lock_wait_message

        key = self.loaded.project.host_classes[c.name].key
        with Store.open(
            self.options.db_path, on_wait=lock_wait_message(), model=self.loaded.project.model
        ) as db:
            db.note_fleet_gaps([(c.name, key, reason, why)])
        self._end(c, ClassRun(c.name, "gap", why, reason=reason))

    def _store(self, bundle: RunBundle, samples: Any) -> None:
        from matrix.bundle import write_bundle
        from matrix.samples import empty_samples
        from matrix.store import Store
        from qualify.measure.hostlock import lock_wait_message

        table = samples if samples is not None else empty_samples()
        options = self.options
        write_bundle(
            bundle, table, options.bundle_dir or options.db_path.resolve().parent / "bundles"
        )
        with Store.open(
            options.db_path, on_wait=lock_wait_message(), model=self.loaded.project.model
        ) as db:
            db.write_run(bundle, table)


def _read_samples(data: Any) -> Any:
    if data is None:
        return None
    if not isinstance(data, bytes):
        raise TypeError(f"samples are {type(data).__name__}, not Parquet bytes")
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(io.BytesIO(data))
    except pa.ArrowException as exc:
        raise ValueError(f"samples: {exc}") from exc


def error_bundle(
    loaded: LoadedProject,
    class_name: str,
    placed: Mapping[str, Any],
    code: str,
    message: str,
    digests: Sequence[str],
    now: datetime | None = None,
) -> RunBundle:
    """Error cells, one per artifact, for a class whose host was lost, ran out of time, failed
    or answered unreadably; the run started when the host said where the task landed."""
    from qualify.run import new_run_id

    now = now or datetime.now(UTC)
    host_class = loaded.project.host_classes[class_name]
    fp = Fingerprint.model_validate_json(placed["fingerprint"])
    run_id = new_run_id(class_name, now)
    cells = _error_cells(
        loaded, class_name, run_id, fp, placed, Reason(code=code, message=message), digests, now
    )
    load = list(os.getloadavg())
    run = RunRecord(
        run_id=run_id,
        host_class=class_name,
        key=host_class.key,
        model=loaded.project.model,
        started_at=min(now, datetime.fromtimestamp(float(placed["at"]), UTC)),
        finished_at=now,
        emulated=False,
        settings_digest=host_class.settings_digest(),
        fingerprint=fp,
        load_avg_before=load,
        load_avg_after=load,
        rollback=None,
    )
    return RunBundle(run=run, cells=cells)


def _error_cells(
    loaded: LoadedProject,
    class_name: str,
    run_id: str,
    fp: Fingerprint,
    placed: Mapping[str, Any],
    reason: Reason,
    digests: Sequence[str],
    now: datetime,
) -> list[Cell]:
    from qualify.measure.cells import Artifact, CellSite, cell_of

    host_class = loaded.project.host_classes[class_name]
    site = CellSite(
        run_id=run_id,
        host_class=class_name,
        key=host_class.key,
        settings_digest=host_class.settings_digest(),
        fingerprint=fp,
        fleet_node=f"{placed['node']} ({placed['hostname']})",
        workload_digest=loaded.project.workload.evidence_digest(),
    )
    specs = [loaded.project.artifacts.baseline, *loaded.project.artifacts.candidates]
    return [
        cell_of(
            site,
            Artifact(digest, spec.label, "baseline" if index == 0 else "candidate", spec.precision),
            reason,
            now,
        )
        for index, (spec, digest) in enumerate(zip(specs, digests, strict=True))
    ]
