"""Start a fleet run: the classes asked for checked, the cluster connected to (or one started on
this machine alone), the run handed to `qualify.fleet.driver.Driver`, and stopped on a signal.

Owns `fleet_run`, the entry of ``qualify fleet run``. Does not say what a host offers or how a
connection is bounded (``qualify.fleet.cluster``), nor schedule classes (the driver).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from qualify.errors import ProjectError
from qualify.fleet.cluster import (
    FleetOptions,
    FleetOutcome,
    check_shipment,
    connect,
    local_auth,
    node_offer,
    read_boot_id,
    shipment_files,
)
from qualify.fleet.driver import Driver
from qualify.project.load import LoadedProject
from qualify.project.problems import no_such_class
from schemas.host import Fingerprint

__all__ = ["fleet_run"]


def fleet_run(
    loaded: LoadedProject,
    options: FleetOptions,
    *,
    classes: Sequence[str] | None = None,
    on_event: Callable[[str], None] = lambda _msg: None,
    local_fingerprint: Callable[[], Fingerprint] | None = None,
    stop: Callable[[], bool] = lambda: False,
    signals: bool = False,
) -> FleetOutcome:
    """Qualify each requested class (default: all) on a host of that class, in parallel across
    hosts, and write what comes back to the matrix at ``options.db_path`` as it arrives.

    Every class ends as cells or as a gap with its reason, recorded in the matrix. Without
    ``options.address`` a cluster on this machine alone is started whose one node offers the
    classes this host matches (``local_fingerprint`` fingerprints it). ``stop`` is asked at
    every look: True ends the run at once, every class not back becoming ``driver_stopped``;
    with ``signals``, SIGTERM and SIGINT do the same (a second one stops at once), from the
    moment Ray is connected (``ray.init`` installs a SIGTERM handler of its own).

    Raises:
        ProjectError: an unknown class, or a file outside the project's folder.
        FleetAddressError: the address is malformed or does not answer.
        FleetError: Ray is missing, refused the connection, or the driver failed mid-run (the
            classes not back are recorded as ``driver_failed`` first).
    """
    known = loaded.project.host_classes
    wanted = list(dict.fromkeys(classes)) if classes else list(known)
    for name in wanted:
        if name not in known:
            raise ProjectError(no_such_class(loaded.path, name, known))
    if options.db_path.exists():  # a matrix of another model line is refused before any host runs
        from matrix.store import Store

        Store.open(options.db_path, model=loaded.project.model).close()
    files = shipment_files(loaded)
    check_shipment(loaded, files)
    if options.address is not None:
        ray = connect(options.address, timeout_s=options.connect_timeout_s)
        return _drive(ray, Driver, loaded, wanted, files, options, on_event, stop, signals)
    from qualify.measure.fingerprint import take_fingerprint
    from qualify.measure.runner import probe_runtime

    fp = local_fingerprint() if local_fingerprint else take_fingerprint(probe_runtime)
    offer = node_offer(loaded, fp, boot_id=read_boot_id())
    with local_auth():
        ray = connect(None, resources=offer.resources, labels=offer.labels)
        return _drive(ray, Driver, loaded, wanted, files, options, on_event, stop, signals)


def _drive(
    ray: Any,
    driver: Any,
    loaded: LoadedProject,
    wanted: list[str],
    files: dict[str, Path],
    options: FleetOptions,
    on_event: Callable[[str], None],
    stop: Callable[[], bool],
    signals: bool,
) -> FleetOutcome:
    try:
        with _stop_on_signals(on_event) if signals else nullcontext(lambda: False) as signalled:
            run = driver(ray, loaded, files, options, on_event, lambda: stop() or signalled())
            outcome: FleetOutcome = run.run(wanted)
        return outcome
    finally:
        ray.shutdown()


@contextmanager
def _stop_on_signals(on_event: Callable[[str], None]) -> Iterator[Callable[[], bool]]:
    """SIGTERM and SIGINT ask the run to stop (within a look, ``FleetOptions.poll_s``); a
    second one interrupts at once. Main thread only (elsewhere signals are not ours)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    asked: list[int] = []

    def handler(signum: int, _frame: Any) -> None:
        if asked:
            raise KeyboardInterrupt
        asked.append(signum)
        on_event("stopping: every class not back ends as driver_stopped")

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield lambda: bool(asked)
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
