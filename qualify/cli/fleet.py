"""``qualify fleet``: join hosts to a Ray cluster and qualify every class on its own hosts
(`qualify.fleet`)."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from qualify.cli.ci import GATE_EXIT, _ci_options, _ci_outputs
from qualify.cli.errors import _fail
from qualify.cli.options import F, _db_option, _project_option
from qualify.cli.output import echo_json, json_option, quiet_option
from qualify.errors import QualifyError

if TYPE_CHECKING:
    from qualify.fleet.cluster import FleetOptions, FleetStatus
    from schemas.output import FleetStatusShown

__all__ = ["fleet_group", "status_document"]


@click.group("fleet")
def fleet_group() -> None:
    """Qualify every class on real hosts of that class, through Ray (pip install qualify[fleet])."""


def _connect_timeout_option(f: F) -> F:
    return click.option(
        "--connect-timeout",
        "connect_timeout",
        default="10s",
        show_default=True,
        metavar="DURATION",
        help="Most time to wait for the head's address to answer before giving up (exit 2).",
    )(f)


def _seconds(text: str, option: str, most: str = "7d") -> float:
    from datetime import timedelta

    from qualify.release.generate import parse_duration

    limit = timedelta(days=int(most[:-1]))
    return parse_duration(text, what=option, most=limit).total_seconds()


@fleet_group.command("join")
@click.option("--address", required=True, help="The Ray cluster's head, HOST:PORT.")
@_project_option
@click.option("--node-ip", "node_ip", help="The address this host is reached at (default: Ray's).")
@_connect_timeout_option
def fleet_join(address: str, project_path: Path, node_ip: str | None, connect_timeout: str) -> None:
    """Join this host to the cluster as the project's classes it matches, until stopped.

    Fingerprints the host, advertises one Ray resource per matching class
    (qualify/class/NAME), and as node labels its fingerprint, its qualify version, the digest
    of the project file and its machine (host name and boot id), then runs `ray start --block`:
    the node leaves when this command is stopped. A fleet run sends a class only to hosts whose
    version and project digest equal its own: rejoin after editing the project file.
    """
    from qualify.fleet.cluster import (
        is_loopback,
        join_argv,
        node_offer,
        parse_address,
        probe_address,
        read_boot_id,
    )
    from qualify.measure.fingerprint import take_fingerprint
    from qualify.measure.runner import probe_runtime
    from qualify.project.load import load_project

    host, _ = parse_address(address)
    if is_loopback(host):
        _fail(
            f"--address {address}: Ray's 'ray start' rewrites a loopback head address to this "
            "machine's interface address, where a head bound to loopback does not listen. Fix: "
            "start the head on an address the hosts reach (ray start --head --node-ip-address "
            "ADDR) and join ADDR:PORT"
        )
    probe_address(address, _seconds(connect_timeout, "--connect-timeout"))
    loaded = load_project(project_path)
    offer = node_offer(loaded, take_fingerprint(probe_runtime), boot_id=read_boot_id())
    for name, failures in offer.unmatched.items():
        click.echo(f"not {name}: " + "; ".join(failures))
    if not offer.classes:
        _fail(f"this host matches none of the classes of {loaded.path}; nothing to offer", 1)
    click.echo("offering: " + ", ".join(offer.classes))
    argv = join_argv(address, offer, node_ip=node_ip)
    if not Path(argv[0]).is_file():
        _fail("the fleet commands need Ray: pip install 'qualify[fleet]' (or pip install ray)")
    sys.stdout.flush()
    os.execv(argv[0], argv)


@fleet_group.command("status")
@click.option("--address", required=True, help="The Ray cluster's head, HOST:PORT.")
@_project_option
@_connect_timeout_option
@json_option("fleet-status")
def fleet_status_cmd(address: str, project_path: Path, connect_timeout: str, as_json: bool) -> None:
    """Per class, the live hosts that can serve it, the hosts that advertise it but disagree
    with this project file or qualify version (and why), and nodes that share a machine.

    Exit status: 0 when every class has a host that may take it, 1 when some class has none,
    2 for a bad address, one that does not answer, or a project error.
    """
    from qualify.fleet.cluster import fleet_status, read_nodes
    from qualify.project.load import load_project

    loaded = load_project(project_path)
    nodes = read_nodes(address, timeout_s=_seconds(connect_timeout, "--connect-timeout"))
    status = fleet_status(loaded, nodes)
    if as_json:
        echo_json(status_document(status))
        sys.exit(1 if status.unserved else 0)
    for name, hosts in status.hosts.items():
        click.echo(f"{name}: " + (", ".join(hosts) if hosts else "no host (unserved)"))
        for line in status.mismatched.get(name, []):
            click.echo(f"  not used: {line}")
    for group in status.shared:
        click.echo("one machine, measured one at a time: " + ", ".join(group))
    if status.unknown:
        click.echo("advertised but not in the project: " + ", ".join(status.unknown))
    sys.exit(1 if status.unserved else 0)


def _fleet_options(
    db_path: Path,
    address: str | None,
    timeout: str,
    deadline: str,
    host_wait: str,
    connect_timeout: str,
) -> FleetOptions:
    """The fleet run's options, each duration refused by name when it is bad."""
    from qualify.fleet.cluster import FleetOptions

    return FleetOptions(
        db_path=db_path,
        address=address,
        timeout_s=_seconds(timeout, "--timeout"),
        deadline_s=_seconds(deadline, "--deadline", most="30d"),
        host_wait_s=_seconds(host_wait, "--host-wait", most="1d"),
        connect_timeout_s=_seconds(connect_timeout, "--connect-timeout", most="1d"),
    )


def _progress(quiet: bool) -> Callable[[str], None]:
    """Where the fleet run's progress goes: stderr, or nowhere with --quiet."""
    if quiet:
        return lambda message: None
    return lambda message: click.echo(f"fleet: {message}", err=True)


def status_document(status: FleetStatus) -> FleetStatusShown:
    """``fleet status --json`` of a `qualify.fleet.cluster.FleetStatus`."""
    from schemas.output import ClassHosts, FleetStatusShown

    return FleetStatusShown(
        classes=[
            ClassHosts(host_class=name, hosts=hosts, not_used=status.mismatched.get(name, []))
            for name, hosts in status.hosts.items()
        ],
        unserved=status.unserved,
        shared=status.shared,
        unknown=status.unknown,
    )


@fleet_group.command("run")
@click.option("--address", help="The Ray cluster's head, HOST:PORT; default: Ray on this host.")
@click.option("--classes", help="Comma-separated classes to qualify; default: every class.")
@click.option(
    "--timeout",
    "timeout",
    default="1h",
    show_default=True,
    metavar="DURATION",
    help="Most time one class may measure on its host, from the moment it starts measuring "
    "(waiting for a host, its host lock or a shared machine excluded).",
)
@click.option(
    "--deadline",
    "deadline",
    default="12h",
    show_default=True,
    metavar="DURATION",
    help="Most time the whole run may take; classes not back by then end as fleet_timeout.",
)
@click.option(
    "--host-wait",
    "host_wait",
    default="30s",
    show_default=True,
    metavar="DURATION",
    help="Most time a class waits once no live host can take it (its hosts left) before it "
    "ends as node_lost or unserved.",
)
@_connect_timeout_option
@_project_option
@_db_option
@_ci_options
@quiet_option
def fleet_run_cmd(
    address: str | None,
    classes: str | None,
    timeout: str,
    deadline: str,
    host_wait: str,
    connect_timeout: str,
    project_path: Path,
    db_path: Path,
    junit_xml: Path | None,
    summary_md: Path | None,
    gate: bool,
    published_manifest: Path | None,
    published_pubkey: Path | None,
    quiet: bool,
) -> None:
    """Qualify each class on a host of that class, in parallel across hosts, into this matrix.

    Every class ends as cells or as a gap with its reason (unserved, node_lost, host_mismatch,
    fleet_timeout, host_failed, driver_stopped, driver_failed), written to the matrix as soon
    as it is known; --junit-xml and --summary-md are written whatever happens once the project
    file loads, also when the driver fails or is stopped.

    Exit status: 0 when every class came back measured without an error cell, 1 when a class
    ended as a gap or with an error cell (or the driver failed or was stopped), 2 for a usage,
    address or project error, 3 with --gate when every class came back but the release cannot
    proceed.
    """
    from qualify.fleet.start import fleet_run
    from qualify.project.load import load_project
    from qualify.table import shorten

    options = _fleet_options(db_path, address, timeout, deadline, host_wait, connect_timeout)
    loaded = load_project(project_path)
    wanted = [c.strip() for c in classes.split(",") if c.strip()] if classes else None
    scope = [
        c
        for c in dict.fromkeys(wanted or loaded.project.host_classes)
        if c in loaded.project.host_classes
    ]
    ci = functools.partial(
        _ci_outputs,
        loaded,
        db_path,
        scope,
        junit=junit_xml,
        summary=summary_md,
        gate=gate,
        published=(published_manifest, published_pubkey),
    )
    try:
        # Ray prints the cluster's error reports (a dead raylet's last log lines) to stdout from
        # a thread of its own: they go to stderr with the run's progress, and stdout keeps the
        # one line per class.
        with contextlib.redirect_stdout(sys.stderr):
            outcome = fleet_run(
                loaded, options, classes=wanted, on_event=_progress(quiet), signals=True
            )
    except QualifyError as exc:
        from qualify.fleet.driver import unmeasured

        ci(gaps=unmeasured(scope, exc))
        raise
    for run in outcome.classes:  # one line per class: the message cut, the report has it whole
        shown = run.message if run.state == "done" else f"{run.state} ({run.reason}): {run.message}"
        click.echo(f"{run.host_class}: {shorten(shown, 240)}")
    blocked = ci(gaps=outcome.gaps)
    sys.exit(1 if not outcome.ok else GATE_EXIT if blocked else 0)
