"""Telemetry over a product's life: which manifest an event is judged against, and hosts that lag.

Owns the time rule of ``qualify telemetry check`` (pure: no clock, no database): each event
judged against the version it reports (or the one published at its time), a host's state as its
latest event, and lagging hosts. Does not read events (``matrix.telemetry.scope``) or raise the
alerts (``qualify.telemetry.check``). The rule in full: docs/internals.md,
``qualify.telemetry.timeline``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from manifest.envelope import parse_time
from manifest.lookup import cohort_point
from matrix.telemetry.scope import Attribution, HostState, Versions
from schemas.cell import Cell
from schemas.manifest import Manifest, ManifestEntry
from schemas.telemetry import Alert, LaggingHosts

__all__ = [
    "ClassHosts",
    "Release",
    "Releases",
    "assignment",
    "digest_alert",
    "judge_hosts",
    "lagging_alert",
    "serving_digests",
]

_EXAMPLES = 5


@dataclass(frozen=True)
class Release:
    """One published manifest version and when hosts could first pick it up (its ``created``)."""

    version: int
    published: datetime
    manifest: Manifest


@dataclass(frozen=True)
class Releases:
    """The published manifests of one model line a check judges against.

    Attributes:
        items: Ascending by version, at least one; the last is the current manifest.
    """

    items: tuple[Release, ...]
    _by_version: dict[int, Release] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.items:
            raise ValueError("a check needs at least one manifest")
        versions = [r.version for r in self.items]
        if versions != sorted(set(versions)):
            raise ValueError(f"releases must ascend by version without repeats: {versions}")
        # A lookup per host and per profile row: by version, not by a walk of the list.
        object.__setattr__(self, "_by_version", {r.version: r for r in self.items})

    @classmethod
    def single(cls, manifest: Manifest) -> Releases:
        """Only ``manifest``: every event is judged against it (a rollout's cohort view)."""
        published = parse_time(manifest.signed.created)
        return cls((Release(manifest.signed.version, published, manifest),))

    @property
    def current(self) -> Manifest:
        """The newest version: what hosts should be running now."""
        return self.items[-1].manifest

    @property
    def versions(self) -> Versions:
        """The versions and their times, as the queries take them."""
        return Versions(tuple((r.version, r.published) for r in self.items))

    def release(self, version: int | None) -> Release | None:
        """The release of ``version``, if it is one of these."""
        return self._by_version.get(version) if version is not None else None

    def entry(self, version: int | None, host_class: str) -> ManifestEntry | None:
        """The class's entry in ``version`` (None or not one of these: the current one's); a
        class that version does not have falls back to the current entry too (it was added
        since). None when the current manifest does not have it either."""
        found = self.release(version)
        if found is not None and host_class in found.manifest.signed.entries:
            return found.manifest.signed.entries[host_class]
        return self.current.signed.entries.get(host_class)

    def attribution(self, cells: Iterable[Cell]) -> Attribution:
        """Which events are this line's: its name, and every digest its manifests and cells
        know (see ``matrix.telemetry.scope.Attribution``)."""
        digests: set[str] = {c.artifact_digest for c in cells}
        for item in self.items:
            for entry in item.manifest.signed.entries.values():
                digests.update(serving_digests(entry))
                if entry.rollback is not None:
                    digests.add(entry.rollback.digest)
        return Attribution(self.current.signed.model, tuple(sorted(digests)))


def serving_digests(entry: ManifestEntry) -> set[str]:
    """The digests an entry gives its hosts: the artifact and a rollout's artifact (on hold,
    none)."""
    found = set()
    if entry.artifact is not None:
        found.add(entry.artifact.digest)
    if entry.rollout is not None:
        found.add(entry.rollout.artifact.digest)
    return found


def assignment(entry: ManifestEntry | None, host_id: str) -> str | None:
    """The digest ``entry`` gives one host: the rollout's artifact when the host is in its
    cohort, else the entry's artifact; None on hold (its hosts keep what they run)."""
    if entry is None or entry.decision == "hold" or entry.artifact is None:
        return None
    rollout = entry.rollout
    if rollout is not None and cohort_point(rollout.id, host_id) < rollout.percent:
        return rollout.artifact.digest
    return entry.artifact.digest


@dataclass
class ClassHosts:
    """One class's hosts, each judged by its latest event.

    Attributes:
        hosts: Hosts whose latest event is of this class.
        unexpected: Hosts running a digest their version neither assigns nor rolls back to.
        rollback: Hosts running their version's rollback instead of its artifact.
        lagging: Hosts behind a newer assignment, per (version, newer version).
    """

    hosts: int = 0
    unexpected: list[HostState] = field(default_factory=list)
    rollback: list[HostState] = field(default_factory=list)
    lagging: list[LaggingHosts] = field(default_factory=list)


def _lag(releases: Releases, state: HostState) -> tuple[int, datetime] | None:
    """(newer version, when it was published) when the host lags, else None."""
    current = releases.items[-1].version
    if state.version is None or state.version >= current:
        return None
    now_gives = assignment(releases.entry(current, state.host_class), state.host_id)
    then_gave = assignment(releases.entry(state.version, state.host_class), state.host_id)
    if now_gives is None or now_gives == then_gave:
        return None
    for item in releases.items:
        if item.version <= state.version:
            continue
        if assignment(releases.entry(item.version, state.host_class), state.host_id) != then_gave:
            return item.version, item.published
    return None  # unreachable: the current version differs


def _digest_verdict(releases: Releases, state: HostState) -> str:
    """'ok', 'rollback' or 'unexpected' for a host that runs a digest."""
    entry = releases.entry(state.version, state.host_class)
    if entry is None or state.digest is None:
        return "ok"
    allowed = serving_digests(entry)
    rollback = entry.rollback.digest if entry.rollback is not None else None
    if entry.artifact is None and rollback is not None:
        allowed.add(rollback)  # on hold, a host back on the rollback keeps what it should
    if state.digest in allowed:
        return "ok"
    return "rollback" if state.digest == rollback else "unexpected"


def _lagging_groups(
    found: Mapping[tuple[int, int, datetime], list[str]], now: datetime, deadline: timedelta
) -> list[LaggingHosts]:
    return [
        LaggingHosts(
            version=version,
            hosts=len(hosts),
            example_hosts=sorted(hosts)[:_EXAMPLES],
            newer_version=newer,
            since=since,
            past_deadline=now - since > deadline,
        )
        for (version, newer, since), hosts in sorted(found.items())
    ]


def judge_hosts(
    releases: Releases,
    states: Sequence[HostState],
    *,
    now: datetime,
    deadline: timedelta,
) -> dict[str, ClassHosts]:
    """Every host by its latest event: what it runs under its own version, and whether it lags.

    Args:
        releases: The published manifests the events are judged against.
        states: Each host's latest event (``matrix.telemetry.scope.host_states``).
        now: The check's reference time.
        deadline: How long a host may lag behind a newer assignment before it is a warning.

    Returns:
        Per class (of the hosts' latest events): its hosts' verdicts.
    """
    classes: dict[str, ClassHosts] = defaultdict(ClassHosts)
    lagging: dict[str, dict[tuple[int, int, datetime], list[str]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for state in states:
        mine = classes[state.host_class]
        mine.hosts += 1
        verdict = _digest_verdict(releases, state)
        if verdict == "unexpected":
            mine.unexpected.append(state)
        elif verdict == "rollback":
            mine.rollback.append(state)
        lag = _lag(releases, state)
        if lag is not None and state.version is not None:
            lagging[state.host_class][(state.version, *lag)].append(state.host_id)
    for name, found in lagging.items():
        classes[name].lagging = _lagging_groups(found, now, deadline)
    return dict(classes)


# -- the alerts of host states ---------------------------------------------------------------


def _names(releases: Releases) -> dict[str, str]:
    """digest -> artifact name, over every release (the newest name wins)."""
    short: dict[str, str] = {}
    for item in releases.items:
        for entry in item.manifest.signed.entries.values():
            arts = [entry.artifact, entry.rollback]
            if entry.rollout is not None:
                arts.append(entry.rollout.artifact)
            for art in arts:
                if art is not None:
                    short[art.digest] = art.name
    return short


def _versions_text(versions: Iterable[int | None]) -> str:
    known = sorted({v for v in versions if v is not None})
    return ", ".join(f"v{v}" for v in known) or "none"


def _seen(
    found: Sequence[HostState], digest: str, name: str | None, rollback: bool
) -> dict[str, object]:
    return {
        "digest": digest,
        "name": name,
        "is_rollback": rollback,
        "hosts": len(found),
        "example_hosts": sorted(s.host_id for s in found)[:_EXAMPLES],
        "versions": sorted({s.version for s in found if s.version is not None}),
        "first_seen": min(s.time for s in found).isoformat(),
        "last_seen": max(s.time for s in found).isoformat(),
    }


def digest_alert(
    name: str, releases: Releases, hosts: ClassHosts, current: ManifestEntry
) -> Alert | None:
    """``unexpected_digest`` for the class's hosts whose latest event runs a digest their own
    version does not give them: critical, or a warning when every one of them runs its
    version's rollback. Each host is counted once."""
    wrong = [*hosts.unexpected, *hosts.rollback]
    if not wrong:
        return None
    short = _names(releases)
    by_digest: dict[tuple[str, bool], list[HostState]] = defaultdict(list)
    for state in hosts.unexpected:
        by_digest[(str(state.digest), False)].append(state)
    for state in hosts.rollback:
        by_digest[(str(state.digest), True)].append(state)
    seen = [
        _seen(found, digest, short.get(digest), rollback)
        for (digest, rollback), found in sorted(by_digest.items())
    ]
    only_rollback = not hosts.unexpected
    assigned = current.artifact.digest if current.artifact is not None else None
    wanted = {
        f"v{s.version}": _wanted(releases.entry(s.version, name), short)
        for s in wrong
        if s.version is not None
    }
    names = ", ".join(f"{item['name'] or str(item['digest'])[:19]}" for item in seen)
    said = "; ".join(f"{v} assigns {w}" for v, w in sorted(wanted.items())) or (
        f"the manifest assigns {_wanted(current, short)}"
    )
    if only_rollback:
        action = (
            "These hosts were served the rollback: resolve-artifact found that their runtime or "
            "providers cannot run the entry's artifact. Fix the host image, or re-qualify the "
            f"class on it (qualify run --host-class {name})."
        )
    else:
        action = (
            "Find what deployed that model; re-run resolve-artifact on the hosts (it answers "
            f"{_wanted(current, short)}), or hold the class in the next manifest."
        )
    return Alert(
        host_class=name,
        kind="unexpected_digest",
        severity="warning" if only_rollback else "critical",
        message=f"{len(wrong)} host(s) of {name} run {names}; the manifest version their "
        f"latest event reports ({_versions_text(s.version for s in wrong)}) gives them "
        f"something else: {said}",
        evidence={
            "assigned": assigned,
            "rollback": current.rollback.digest if current.rollback is not None else None,
            "seen": seen,
        },
        suggested_action=action,
    )


def _wanted(entry: ManifestEntry | None, short: Mapping[str, str]) -> str:
    if entry is None or entry.artifact is None:
        return "nothing new (the class is on hold)"
    text = f"{entry.artifact.name} ({entry.artifact.digest})"
    if entry.rollout is not None:
        art = entry.rollout.artifact
        text += f", its {entry.rollout.percent}% cohort {short.get(art.digest, art.name)}"
    return text


def _ago(delta: timedelta) -> str:
    hours = delta.total_seconds() / 3600
    return f"{hours:.1f} h" if hours < 48 else f"{hours / 24:.1f} d"


def lagging_alert(
    name: str, hosts: ClassHosts, *, now: datetime, deadline: str
) -> tuple[Alert | None, list[str]]:
    """The class's lagging hosts: a ``lagging`` warning for those past the deadline, and one
    note per group still within it (reported, not alerted)."""
    notes = [
        f"{g.hosts} host(s) still on v{g.version}: v{g.newer_version} changed what they run "
        f"{_ago(now - g.since)} ago, within the {deadline} propagation deadline"
        for g in hosts.lagging
        if not g.past_deadline
    ]
    late = [g for g in hosts.lagging if g.past_deadline]
    if not late:
        return None, notes
    count = sum(g.hosts for g in late)
    oldest = min(g.since for g in late)
    groups = "; ".join(
        f"{g.hosts} on v{g.version} (v{g.newer_version} published {_ago(now - g.since)} ago)"
        for g in late
    )
    alert = Alert(
        host_class=name,
        kind="lagging",
        severity="warning",
        message=f"{count} host(s) of {name} still run what an older manifest gave them, past "
        f"the {deadline} propagation deadline: {groups}",
        evidence={
            "hosts": count,
            "since": oldest.isoformat(),
            "deadline": deadline,
            "groups": [g.model_dump(mode="json") for g in late],
        },
        suggested_action="Check that these hosts run resolve-artifact (at service start, or on "
        "a timer) and can fetch the newest manifest: `resolve-artifact --json` on one of them "
        "says which version it holds and why; a host that cannot verify the new version keeps "
        "its last-known-good.",
    )
    return alert, notes
