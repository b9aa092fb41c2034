"""Telemetry ingest and queries on a real DuckDB file: bulk, idempotent, bad lines reported by
number without losing the good ones, and the fast path agreeing with the model line for line."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import matrix.telemetry.blocks as tb
import matrix.telemetry.checks as checks
import matrix.telemetry.ingest as mt
from matrix.errors import MatrixError
from matrix.store import Store
from matrix.telemetry.ingest import TelemetryFileError, ingest_telemetry
from matrix.telemetry.queries import (
    latency_tails,
    revisions_by_class,
    rollout_reported,
    telemetry_profile,
)
from schemas.telemetry import TelemetryEvent

NOW = datetime(2025, 6, 2, tzinfo=UTC)
DAY = (NOW - timedelta(days=1), NOW)
DIGEST = "sha256:" + "a" * 64
OTHER = "sha256:" + "b" * 64


def event(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "format": "qualify-telemetry/1",
        "time": "2025-06-01T12:00:00.123Z",
        "source": "session",
        "host_id": "h1",
        "host_class": "x86",
        "model_digest": DIGEST,
        "runtime_revision": "1.32.0",
        "runtime_package": "onnxruntime",
        "providers": ["CPUExecutionProvider"],
        "placement": "actual",
        "nodes_per_provider": {"CPUExecutionProvider": 3},
        "fallback_nodes": 0,
        "latency_ms": 1.5,
        "manifest_version": 2,
        "decision": "candidate",
    }
    base.update(changes)
    return {k: v for k, v in base.items() if v is not _DROP}


_DROP = object()


def line(**changes: Any) -> str:
    return json.dumps(event(**changes))


def write(path: Path, lines: list[str], *, end: str = "\n") -> Path:
    path.write_text("\n".join(lines) + end)
    return path


def count(store: Store) -> int:
    return int(store.connection.execute("SELECT count(*) FROM telemetry").fetchall()[0][0])


def test_events_land_with_their_line_numbers_and_types(store: Store, tmp_path: Path) -> None:
    path = write(
        tmp_path / "t.jsonl",
        [
            line(),
            line(host_id="h2", time="2025-06-01T13:00:00+01:00", latency_ms=3),
            line(
                host_id="h3", placement="registered", nodes_per_provider=None, fallback_nodes=None
            ),
        ],
    )
    report = ingest_telemetry(store, [path], now=NOW)
    [done] = report.files
    assert (done.status, done.events, done.bad_lines, done.lines) == ("ingested", 3, 0, 3)
    rows = store.connection.execute(
        "SELECT host_id, line, time, nodes_per_provider, latency_ms FROM telemetry ORDER BY line"
    ).fetchall()
    assert [r[:2] for r in rows] == [("h1", 1), ("h2", 2), ("h3", 3)]
    assert rows[1][2] == datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
    assert rows[0][3] == {"CPUExecutionProvider": 3} and rows[2][3] is None
    assert rows[1][4] == 3.0


def test_reingesting_the_same_file_writes_nothing(store: Store, tmp_path: Path) -> None:
    path = write(tmp_path / "t.jsonl", [line(host_id=f"h{i}") for i in range(50)])
    first = ingest_telemetry(store, [path], now=NOW).files[0]
    again = ingest_telemetry(store, [path, path], now=NOW).files
    assert first.status == "ingested"
    assert [f.status for f in again] == ["present", "present"]
    assert all(f.events == 0 for f in again)
    assert count(store) == 50


def test_a_copy_of_an_ingested_file_is_recognised_by_its_content(
    store: Store, tmp_path: Path
) -> None:
    path = write(tmp_path / "a.jsonl", [line()])
    copy = tmp_path / "b.jsonl"
    copy.write_bytes(path.read_bytes())
    ingest_telemetry(store, [path], now=NOW)
    assert ingest_telemetry(store, [copy], now=NOW).files[0].status == "present"
    assert count(store) == 1


def test_a_grown_file_is_read_from_where_the_last_ingest_stopped(
    store: Store, tmp_path: Path
) -> None:
    path = write(tmp_path / "t.jsonl", [line(host_id="a"), line(host_id="b")])
    ingest_telemetry(store, [path], now=NOW)
    with path.open("a") as handle:
        handle.write(line(host_id="c") + "\n" + "{broken\n")
    grown = ingest_telemetry(store, [path], now=NOW).files[0]
    assert (grown.first_line, grown.lines, grown.events) == (3, 2, 1)
    assert [b.line for b in grown.bad] == [4]
    hosts = store.connection.execute("SELECT host_id, line FROM telemetry ORDER BY line").fetchall()
    assert hosts == [("a", 1), ("b", 2), ("c", 3)]


def test_an_unterminated_last_line_waits_for_the_next_ingest(store: Store, tmp_path: Path) -> None:
    whole = line(host_id="late")
    path = write(tmp_path / "t.jsonl", [line(), whole[:30]], end="")
    first = ingest_telemetry(store, [path], now=NOW).files[0]
    assert (first.events, first.bad_lines, first.pending_bytes) == (1, 0, 30)
    with path.open("a") as handle:
        handle.write(whole[30:] + "\n")
    second = ingest_telemetry(store, [path], now=NOW).files[0]
    assert (second.first_line, second.events, second.bad_lines) == (2, 1, 0)
    assert count(store) == 2


def test_bad_lines_are_reported_by_number_and_the_good_ones_kept(
    store: Store, tmp_path: Path
) -> None:
    path = write(
        tmp_path / "t.jsonl",
        [
            line(host_id="ok1"),
            "not json at all",
            "",
            line(latency_ms=-1),
            line(surprise=1),
            line(model_digest="sha256:nothex"),
            line(time="2025-06-01T12:00:00"),
            line(host_id="ok2"),
            line(nodes_per_provider={"CPUExecutionProvider": None}),
            line(fallback_nodes="3"),
        ],
    )
    done = ingest_telemetry(store, [path], now=NOW).files[0]
    assert done.events == 2
    found = {b.line: b.message for b in done.bad}
    assert sorted(found) == [2, 4, 5, 6, 7, 9, 10]
    assert "latency_ms" in found[4]
    assert "surprise" in found[5]
    assert "model_digest" in found[6]
    assert "time" in found[7]
    assert "nodes_per_provider" in found[9]
    assert "fallback_nodes" in found[10]
    assert done.bad_lines == 7
    hosts = store.connection.execute("SELECT host_id, line FROM telemetry ORDER BY line").fetchall()
    assert hosts == [("ok1", 1), ("ok2", 8)]


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.lists(
        st.tuples(
            st.dictionaries(
                st.sampled_from(["CPUExecutionProvider", "OpenVINOExecutionProvider", "A b"]),
                st.none() | st.integers(0, 50),
                min_size=1,
            ),
            st.booleans(),  # another field null on the line too
            st.sampled_from([(",", ":"), (", ", ": "), (",", " :\t")]),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_a_null_node_count_is_a_bad_line_among_mixed_providers_however_spelled(
    tmp_path_factory: pytest.TempPathFactory, rows: list[tuple[dict[str, int | None], bool, Any]]
) -> None:
    # Arrow reads a null count as an absent key; the fast path must send exactly the lines that
    # hold one to the model, which refuses them, whatever the spacing and other nulls.
    work = tmp_path_factory.mktemp("nulls")
    lines = [
        json.dumps(
            event(nodes_per_provider=counts, rollout=None if other_null else "r1"),
            separators=separators,
        )
        for counts, other_null, separators in rows
    ]
    path = write(work / "t.jsonl", lines)
    with Store.open(work / "m.duckdb") as store:
        done = ingest_telemetry(store, [path], now=NOW).files[0]
    expected_bad = [i + 1 for i, (counts, _, _) in enumerate(rows) if None in counts.values()]
    assert [b.line for b in done.bad] == expected_bad
    assert done.events == len(rows) - len(expected_bad)


def test_suspect_rows_in_a_parsable_block_keep_their_line_numbers(
    store: Store, tmp_path: Path
) -> None:
    # Every line parses for Arrow; only the vectorised rules flag some, past blank lines.
    path = write(
        tmp_path / "t.jsonl",
        [line(), "", "   ", line(host_id="x"), line(latency_ms=-2), line(source="cron"), line()],
    )
    done = ingest_telemetry(store, [path], now=NOW).files[0]
    assert [b.line for b in done.bad] == [5, 6]
    lines = store.connection.execute("SELECT line FROM telemetry ORDER BY line").fetchall()
    assert [r[0] for r in lines] == [1, 4, 7]


def test_a_missing_file_is_named(store: Store, tmp_path: Path) -> None:
    with pytest.raises(TelemetryFileError, match=r"nope\.jsonl"):
        ingest_telemetry(store, [tmp_path / "nope.jsonl"], now=NOW)


def test_a_read_only_matrix_refuses_an_ingest(db_path: Path, tmp_path: Path) -> None:
    Store.open(db_path).close()
    path = write(tmp_path / "t.jsonl", [line()])
    with Store.open(db_path, read_only=True) as ro, pytest.raises(MatrixError, match="read-only"):
        ingest_telemetry(ro, [path], now=NOW)


MUTATIONS: list[dict[str, Any]] = [
    {},
    {"latency_ms": None},
    {"latency_ms": _DROP},
    {"latency_ms": 0},
    {"latency_ms": -0.5},
    {"latency_ms": "3"},
    {"latency_ms": True},
    {"fallback_nodes": 2.0},
    {"fallback_nodes": -1},
    {"manifest_version": 0},
    {"manifest_version": 7},
    {"model_digest": None},
    {"model_digest": "sha256:" + "A" * 64},
    {"host_id": ""},
    {"host_id": None},
    {"host_class": 5},
    {"providers": []},
    {"providers": [None]},
    {"providers": "CPUExecutionProvider"},
    {"placement": "guessed"},
    {"decision": "maybe"},
    {"decision": None},
    {"time": "2025-06-01T12:00:00+02:00"},
    {"time": "2025-06-01 12:00:00Z"},
    {"time": "2025-02-30T12:00:00Z"},
    {"time": 1717243200},
    {"format": "qualify-telemetry/2"},
    {"nodes_per_provider": {"A": 1, "B": 2}},
    {"nodes_per_provider": {"A": -1}},
    {"nodes_per_provider": {"A": "1"}},
    {"nodes_per_provider": {}},
    {"extra": None},
    {"runtime_revision": _DROP},
    {"host_id": "h" * 256},
    {"host_id": "h" * 257},
    {"host_id": "é" * 257},
    {"host_class": "c" * 300},
    {"runtime_revision": "1" * 257},
    {"runtime_package": "p" * 257},
    {"runtime_package": "onnxruntime-gpu"},
    {"providers": ["P" * 257]},
    {"providers": [f"P{i}" for i in range(33)]},
    {"providers": [f"P{i}" for i in range(32)]},
    {"nodes_per_provider": {"N" * 257: 1}},
    {"nodes_per_provider": {f"N{i}": 1 for i in range(33)}},
    {"rollout": "x86-20261204T000000Z", "cohort": "canary"},
    {"rollout": "x86-20261204T000000Z", "cohort": "rest"},
    {"rollout": "x86-20261204T000000Z", "cohort": "sideways"},
    {"rollout": "", "cohort": "canary"},
    {"rollout": "r" * 257},
    {"rollout": 7},
    {"cohort": "canary"},
    {"cohort": None, "rollout": None},
    {"runtime_package": ""},
    {"providers": [""]},
    {"nodes_per_provider": {"": 1}},
    {"nodes_per_provider": {"CPUExecutionProvider": 3, "a}": None}},
    {"settings": "s" * 5000},
]


def _model_accepts(raw: str) -> bool:
    try:
        TelemetryEvent.model_validate_json(raw)
    except ValidationError:
        return False
    return True


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    picks=st.lists(st.integers(0, len(MUTATIONS) - 1), min_size=1, max_size=40),
    block=st.sampled_from([300, 2000, 1 << 20]),
)
def test_the_fast_path_keeps_exactly_the_lines_the_model_accepts(
    picks: list[int], block: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    folder = tmp_path_factory.mktemp("agree")
    lines = [line(**{"host_id": f"h{i}", **MUTATIONS[p]}) for i, p in enumerate(picks)]
    path = write(folder / "t.jsonl", lines)
    original = mt.BLOCK_BYTES
    mt.BLOCK_BYTES = block
    try:
        with Store.open(folder / "m.duckdb") as store:
            done = ingest_telemetry(store, [path], now=NOW).files[0]
            kept = [
                r[0]
                for r in store.connection.execute(
                    "SELECT line FROM telemetry ORDER BY line"
                ).fetchall()
            ]
    finally:
        mt.BLOCK_BYTES = original
    accepted = [i + 1 for i, raw in enumerate(lines) if _model_accepts(raw)]
    assert kept == accepted
    assert sorted(b.line for b in done.bad) == sorted(set(range(1, len(lines) + 1)) - set(accepted))


# Byte-level damage a file can carry that no field mutation writes: control bytes, a byte-order
# mark, invalid or overlong UTF-8, surrogates, escapes, stray brackets and quotes.
_BYTES = [
    b"\r",
    b"\x00",
    b"\xef\xbb\xbf",
    b"\t",
    b"\\u0000",
    b"\xff",
    b"\xc3",
    b"}",
    b"{",
    b",",
    b'"',
    b"\\",
    b"\xe2\x80\xa8",
    b"\x0b",
    b"\\ud800",
    b"\xed\xa0\x80",
    b"\x7f",
    b"\xc0\xaf",
]
_NUMBERS = [b"1e400", b"-0", b"1E2", b"123456789012345678901234567890", b"NaN", b"Infinity", b"2.0"]
_WHOLE = [b"[]", b"null", b'"s"', b"{}", b'{"a":1} {"b":2}', b"   ", b"\r", b"\x0c", b"1"]


def _damaged(raw: bytes, how: int, where: int, what: int) -> bytes:
    if how == 0:
        return raw
    if how == 1:
        at = where % (len(raw) + 1)
        return raw[:at] + _BYTES[what % len(_BYTES)] + raw[at:]
    if how == 2:
        return raw[:-1] + b',"host_id":"dup"}'  # a duplicate key
    if how == 3:
        return raw.replace(b'"host_id"', b'"host\\u005fid"')  # an escaped key
    if how == 4:
        number = _NUMBERS[what % len(_NUMBERS)]
        return raw.replace(b'"latency_ms": 1.5', b'"latency_ms": ' + number).replace(
            b'"manifest_version": 2', b'"manifest_version": ' + number
        )
    return _WHOLE[what % len(_WHOLE)]


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    damage=st.lists(
        st.tuples(
            st.integers(0, len(MUTATIONS) - 1),
            st.sampled_from([0, 0, 0, 1, 2, 3, 4, 5]),
            st.integers(0, 10_000),
            st.integers(0, 100),
        ),
        min_size=1,
        max_size=30,
    ),
    crlf=st.booleans(),
    bom=st.booleans(),
    block=st.sampled_from([256, 1024, 1 << 20]),
)
def test_the_fast_path_reads_damaged_bytes_exactly_as_the_line_by_line_path(
    damage: list[tuple[int, int, int, int]],
    crlf: bool,
    bom: bool,
    block: int,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines = [
        _damaged(line(**{"host_id": f"h{i}", **MUTATIONS[m]}).encode(), how, where, what)
        for i, (m, how, where, what) in enumerate(damage)
    ]
    data = (b"\xef\xbb\xbf" if bom else b"") + b"".join(
        raw + (b"\r\n" if crlf else b"\n") for raw in lines
    )
    monkeypatch.setattr(mt, "BLOCK_BYTES", block)

    def ingested(slow: bool) -> tuple[Any, ...]:
        folder = tmp_path_factory.mktemp("slow" if slow else "fast")
        path = folder / "t.jsonl"
        path.write_bytes(data)
        with monkeypatch.context() as patch:
            if slow:
                patch.setattr(tb, "_fast", lambda *_: False)
            with Store.open(folder / "m.duckdb") as db:
                done = ingest_telemetry(db, [path], now=NOW).files[0]
                rows = db.connection.execute(
                    "SELECT * EXCLUDE (file_sha256) FROM telemetry ORDER BY line"
                ).fetchall()
        return done.events, sorted((b.line, b.message) for b in done.bad), rows

    fast = ingested(slow=False)
    assert fast == ingested(slow=True)
    assert fast[0] + len(fast[1]) <= len(lines)


def test_the_profile_groups_events_and_counts_hosts(store: Store, tmp_path: Path) -> None:
    path = write(
        tmp_path / "t.jsonl",
        [
            line(host_id="h1"),
            line(host_id="h2"),
            line(host_id="h2", latency_ms=None),
            line(host_id="h3", model_digest=OTHER, runtime_revision="1.33.0"),
            line(host_id="h4", host_class="arm", time="2025-05-01T00:00:00Z"),  # outside
        ],
    )
    ingest_telemetry(store, [path], now=NOW)
    profile = telemetry_profile(store, start=DAY[0], end=DAY[1])
    assert profile.class_events == {"x86": 4}
    assert profile.class_hosts == {"x86": 3}
    main, other = profile.rows
    assert (main.model_digest, main.events, main.hosts, main.latency_samples) == (DIGEST, 3, 2, 2)
    assert main.example_hosts == ("h1", "h2")
    assert main.manifest_versions == (2,)
    assert (other.model_digest, other.runtime_revision) == (OTHER, "1.33.0")
    assert revisions_by_class(store, start=DAY[0], end=DAY[1]) == {
        "x86": {"1.32.0": 2, "1.33.0": 1}
    }


def test_a_rollouts_canary_is_told_from_the_rest_by_what_its_hosts_report(
    store: Store, tmp_path: Path
) -> None:
    rid = "x86-20250601T000000Z"
    path = write(
        tmp_path / "t.jsonl",
        [
            line(host_id="c1", rollout=rid, cohort="canary", latency_ms=9.0),
            line(host_id="c2", rollout=rid, cohort="canary", model_digest=OTHER, latency_ms=8.0),
            line(host_id="r1", rollout=rid, cohort="rest", latency_ms=1.0),
            line(host_id="old", latency_ms=2.0),  # a host too old to say: one of the rest
            line(host_id="x", rollout="another", cohort="canary", latency_ms=3.0),
        ],
    )
    ingest_telemetry(store, [path], now=NOW)
    canary = telemetry_profile(store, start=DAY[0], end=DAY[1], cohort=(rid, "canary"))
    rest = telemetry_profile(store, start=DAY[0], end=DAY[1], cohort=(rid, "rest"))
    assert canary.class_hosts == {"x86": 2} and rest.class_hosts == {"x86": 3}
    assert {r.model_digest for r in canary.rows} == {DIGEST, OTHER}
    wanted = {("x86", DIGEST): 5}
    assert latency_tails(store, start=DAY[0], end=DAY[1], wanted=wanted, cohort=(rid, "canary"))[
        ("x86", DIGEST)
    ].tolist() == [9.0]
    assert latency_tails(store, start=DAY[0], end=DAY[1], wanted=wanted, cohort=(rid, "rest"))[
        ("x86", DIGEST)
    ].tolist() == [3.0, 2.0, 1.0]
    assert rollout_reported(store, rid, start=DAY[0], end=DAY[1])
    assert not rollout_reported(store, "nope", start=DAY[0], end=DAY[1])
    with pytest.raises(ValueError, match="canary"):
        telemetry_profile(store, start=DAY[0], end=DAY[1], cohort=(rid, "sideways"))


def test_latency_tails_are_the_largest_values_largest_first(store: Store, tmp_path: Path) -> None:
    values = [float(v) for v in range(1, 101)]
    path = write(tmp_path / "t.jsonl", [line(latency_ms=v) for v in values])
    ingest_telemetry(store, [path], now=NOW)
    tails = latency_tails(store, start=DAY[0], end=DAY[1], wanted={("x86", DIGEST): 3})
    assert tails[("x86", DIGEST)].tolist() == [100.0, 99.0, 98.0]
    assert latency_tails(store, start=DAY[0], end=DAY[1], wanted={("arm", DIGEST): 3}) == {}


def test_ingest_holds_a_few_blocks_of_events_in_memory_not_the_whole_file(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow as pa

    lines = [line(host_id=f"host-{i:06d}-" + "x" * 200) for i in range(4000)]
    path = write(tmp_path / "t.jsonl", lines)
    monkeypatch.setattr(mt, "BLOCK_BYTES", 64 << 10)  # ~200 lines a block, ~20 blocks
    held: list[int] = []
    parse = mt.parse_block

    def parse_and_measure(data: bytes, first_line: int) -> Any:
        held.append(pa.total_allocated_bytes())
        return parse(data, first_line)

    monkeypatch.setattr(mt, "parse_block", parse_and_measure)
    [done] = ingest_telemetry(store, [path], now=NOW).files
    assert done.events == 4000 and len(held) >= 15
    block_bytes = path.stat().st_size / len(held)
    # Before the fix every inserted block stayed alive until COMMIT: growth of ~ the file size
    # (20 blocks). Now: the block DuckDB stores (and the one it finishes), the next one parsed
    # waiting for it, and the one the parsing thread holds until it is taken.
    assert max(held) - held[0] < 5 * block_bytes, held
    assert count(store) == 4000


# -- hostile lines -------------------------------------------------------------------------------


def test_integers_too_large_for_a_column_are_bad_lines_not_a_lost_file(
    store: Store, tmp_path: Path
) -> None:
    raw = [
        line(host_id="ok1"),
        line(manifest_version=10**30),
        line(fallback_nodes=2**63),
        line(nodes_per_provider={"CPUExecutionProvider": 2**64}),
        line(latency_ms=10**400),
        line(host_id="ok2"),
    ]
    path = write(tmp_path / "t.jsonl", raw)
    done = ingest_telemetry(store, [path], now=NOW).files[0]
    assert (done.events, sorted(b.line for b in done.bad)) == (2, [2, 3, 4, 5])
    hosts = store.connection.execute("SELECT host_id FROM telemetry ORDER BY line").fetchall()
    assert hosts == [("ok1",), ("ok2",)]
    assert ingest_telemetry(store, [path], now=NOW).files[0].events == 0  # and it stays done


def test_an_overlong_line_is_skipped_unread_and_the_rest_kept(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Small limits so that one line spans several blocks, as a 200 MB line would in real ones.
    monkeypatch.setattr(mt, "BLOCK_BYTES", 4096)
    monkeypatch.setattr(checks, "MAX_LINE_BYTES", 1024)
    huge = line(host_id="x" * 20_000)
    inside = line(host_id="y" * 2_000)  # longer than the limit, shorter than a block
    path = write(
        tmp_path / "t.jsonl",
        [line(host_id="a"), huge, line(host_id="b"), inside, line(host_id="c")],
    )
    done = ingest_telemetry(store, [path], now=NOW).files[0]
    assert done.events == 3
    assert [(b.line, "longer than" in b.message) for b in done.bad] == [(2, True), (4, True)]
    lines = store.connection.execute("SELECT host_id, line FROM telemetry ORDER BY line").fetchall()
    assert lines == [("a", 1), ("b", 3), ("c", 5)]


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: ",".join(m)[:40] or "valid")
def test_each_mutation_beside_a_valid_line_gets_the_models_verdict(
    mutation: dict[str, Any], store: Store, tmp_path: Path
) -> None:
    lines = [line(host_id="before"), line(**{"host_id": "x", **mutation}), line(host_id="after")]
    path = write(tmp_path / "t.jsonl", lines)
    done = ingest_telemetry(store, [path], now=NOW).files[0]
    kept = [
        r[0]
        for r in store.connection.execute("SELECT line FROM telemetry ORDER BY line").fetchall()
    ]
    assert kept == [i + 1 for i, raw in enumerate(lines) if _model_accepts(raw)]
    assert all(len(b.message) <= 400 for b in done.bad)


def test_settings_are_stored_as_sent_and_malformed_ones_are_bad_lines(
    store: Store, tmp_path: Path
) -> None:
    good = "execution_mode=sequential;graph_optimization_level=all;inter_op_threads=0;intra_op_threads=2"
    path = write(
        tmp_path / "t.jsonl",
        [
            line(settings=good),
            line(settings="intra_op_threads=2"),  # lacks the core keys
            line(),
            line(settings=""),
            line(settings=good.replace("=2", "=4")),
        ],
    )
    done = ingest_telemetry(store, [path], now=NOW).files[0]
    found = {b.line: b.message for b in done.bad}
    assert sorted(found) == [2, 4]
    assert all("settings" in message for message in found.values())
    rows = store.connection.execute("SELECT line, settings FROM telemetry ORDER BY line").fetchall()
    assert rows == [(1, good), (3, None), (5, good.replace("=2", "=4"))]


# -- lines a lenient parser would coerce -----------------------------------------------------

_VALID = line(host_id="raw")
_HOSTILE: list[bytes] = [
    _VALID[:-1].encode() + b",}",  # trailing comma
    _VALID.replace(
        '"providers": ["CPUExecutionProvider"]', '"providers": ["CPUExecutionProvider",]'
    ).encode(),
    _VALID[:-1].encode() + b', "host_id": "last"}',  # a repeated key: the model keeps the last
    _VALID[:-1].encode() + b', "nodes_per_provider": {"A": 1, "A": 2}}',
    _VALID.replace('"latency_ms": 1.5', '"latency_ms": NaN').encode(),
    _VALID.replace('"latency_ms": 1.5', '"latency_ms": Infinity').encode(),
    _VALID.replace('"latency_ms": 1.5', '"latency_ms": 1e400').encode(),
    _VALID.replace('"fallback_nodes": 0', '"fallback_nodes": "12"').encode(),
    _VALID.replace('"fallback_nodes": 0', '"fallback_nodes": 2.5').encode(),
    _VALID.replace('"fallback_nodes": 0', '"fallback_nodes": 1e2').encode(),
    _VALID.replace('"fallback_nodes": 0', '"fallback_nodes": true').encode(),
    _VALID.replace('"manifest_version": 2', '"manifest_version": 99999999999999999999999').encode(),
    _VALID.replace('"host_class": "x86"', '"host_class": 5').encode(),
    _VALID.replace('"host_class": "x86"', '"host_class": {"a": 1}').encode(),
    _VALID.replace('"host_class": "x86"', '"host_class": "x\\ud800"').encode(),  # lone surrogate
    _VALID.replace('"host_class": "x86"', '"host_class": "x\\u0000y"').encode(),
    _VALID.replace('"host_class": "x86"', '"host_class": "x\\u00e9"').encode(),
    _VALID.replace('"host_class": "x86"', '"host_class": "x\ty"').encode(),  # raw control char
    _VALID.replace('"host_class": "x86"', '"host_class": "x').encode() + b"\xff\xfe" + b'"',
    _VALID.replace(
        '"nodes_per_provider": {"CPUExecutionProvider": 3}', '"nodes_per_provider": {"A": null}'
    ).encode(),
    _VALID.replace(
        '"nodes_per_provider": {"CPUExecutionProvider": 3}', '"nodes_per_provider": []'
    ).encode(),
    _VALID.replace(
        '"nodes_per_provider": {"CPUExecutionProvider": 3}', '"nodes_per_provider": "A"'
    ).encode(),
    _VALID.replace('"providers": ["CPUExecutionProvider"]', '"providers": [1]').encode(),
    _VALID.replace(
        '"providers": ["CPUExecutionProvider"]', '"providers": "CPUExecutionProvider"'
    ).encode(),
    b"[" * 5000 + b"]" * 5000,  # deeply nested
    b'{"a": ' * 3000 + b"1" + b"}" * 3000,
    b"null",
    b"[1, 2]",
    b'"just a string"',
    b"\xef\xbb\xbf" + _VALID.encode(),  # a byte-order mark
    bytes(range(256)).replace(b"\n", b""),  # binary garbage
    b"\x00" * 100,
    _VALID.encode() + b" " + _VALID.encode(),  # two events on one line
]


def _model_row(raw: bytes) -> dict[str, Any] | None:
    try:
        event = TelemetryEvent.model_validate_json(raw)
    except ValidationError:
        return None
    return event.model_dump(exclude={"format"})


@pytest.mark.parametrize("raw", _HOSTILE, ids=range(len(_HOSTILE)))
def test_a_hostile_line_gets_the_models_verdict_and_the_models_values(
    raw: bytes, store: Store, tmp_path: Path
) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(
        line(host_id="before").encode()
        + b"\n"
        + raw
        + b"\n"
        + line(host_id="after").encode()
        + b"\n"
    )
    done = ingest_telemetry(store, [path], now=NOW).files[0]
    expected = _model_row(raw)
    assert (done.events, done.bad_lines) == ((3, 0) if expected else (2, 1))
    if expected is None:
        assert [b.line for b in done.bad] == [2]
        return
    stored = store.connection.execute(
        "SELECT host_id, host_class, providers, nodes_per_provider, fallback_nodes, latency_ms, "
        "manifest_version FROM telemetry WHERE line = 2"
    ).fetchall()
    assert stored == [
        (
            expected["host_id"],
            expected["host_class"],
            expected["providers"],
            expected["nodes_per_provider"],
            expected["fallback_nodes"],
            expected["latency_ms"],
            expected["manifest_version"],
        )
    ]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    cuts=st.lists(
        st.tuples(st.integers(0, 400), st.binary(min_size=0, max_size=6)), min_size=1, max_size=4
    )
)
def test_mangled_lines_never_land_unless_the_model_accepts_them(
    cuts: list[tuple[int, bytes]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    folder = tmp_path_factory.mktemp("mangled")
    lines: list[bytes] = []
    for i, (at, junk) in enumerate(cuts):
        raw = line(host_id=f"h{i}").encode()
        at = min(at, len(raw))
        lines.append((raw[:at] + junk + raw[at + len(junk) :]).replace(b"\n", b" "))
    path = folder / "t.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    with Store.open(folder / "m.duckdb") as store:
        done = ingest_telemetry(store, [path], now=NOW).files[0]
        kept = store.connection.execute(
            "SELECT line, host_id, latency_ms FROM telemetry ORDER BY line"
        ).fetchall()
    accepted = []
    for number, raw in enumerate(lines, start=1):
        row = _model_row(raw)
        if row is not None:
            accepted.append((number, row["host_id"], row["latency_ms"]))
        elif raw.strip():
            assert number in {b.line for b in done.bad}
    assert kept == accepted


# -- what the fast path costs and how it reads ---------------------------------------------------


def test_a_clean_file_is_ingested_without_pandas_or_pydantic(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = write(tmp_path / "t.jsonl", [line(host_id=f"h{i}") for i in range(100)])
    code = (
        "import sys\n"
        "from datetime import UTC, datetime\n"
        "from matrix.store import Store\n"
        "from matrix.telemetry.ingest import ingest_telemetry\n"
        "with Store.open(sys.argv[1]) as store:\n"
        "    done = ingest_telemetry(store, [sys.argv[2]], now=datetime.now(UTC))\n"
        "assert done.events == 100, done\n"
        "heavy = ('pandas', 'pydantic', 'schemas.telemetry')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "m.duckdb"), str(path)],
        capture_output=True,
        text=True,
        cwd=root,
        check=True,
    )
    assert out.stdout.strip() == "[]", out.stderr


def test_null_counts_are_found_on_the_right_lines_past_blank_ones(
    store: Store, tmp_path: Path
) -> None:
    lines: list[str] = []
    nulls: list[int] = []
    for i in range(300):
        if i % 7 == 3:
            lines.append("")
        elif i % 5 == 1:
            lines.append(line(host_id=f"n{i}", nodes_per_provider={"A": 1, "B": None}))
            nulls.append(i + 1)
        else:
            lines.append(line(host_id=f"g{i}", nodes_per_provider={"A": 1}))
    path = write(tmp_path / "t.jsonl", lines)
    done = ingest_telemetry(store, [path], now=NOW).files[0]
    assert sorted(b.line for b in done.bad) == nulls
    assert all("nodes_per_provider" in b.message for b in done.bad)
    assert done.events == sum(1 for raw in lines if raw) - len(nulls)


def test_a_key_with_a_brace_and_a_null_count_is_still_refused(store: Store, tmp_path: Path) -> None:
    path = write(
        tmp_path / "t.jsonl",
        [
            line(nodes_per_provider={"CPUExecutionProvider": 3, "a}": 1}),
            line(nodes_per_provider={"CPUExecutionProvider": 3, "a}": None}),
            line(),
        ],
    )
    done = ingest_telemetry(store, [path], now=NOW).files[0]
    assert (done.events, [b.line for b in done.bad]) == (2, [2])


def _many_small_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """200 events read in ~20 blocks of 4 KiB: room for something to happen mid-file."""
    monkeypatch.setattr(mt, "BLOCK_BYTES", 4096)
    return write(tmp_path / "t.jsonl", [line(host_id=f"h{i}") for i in range(200)])


@pytest.mark.parametrize("after", ["_plan", "_last_line_end"])
def test_a_file_truncated_while_read_is_an_error_and_writes_nothing(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, after: str
) -> None:
    # Truncated once hashed (the reader finds it shorter), or once its last line was found and
    # before it is hashed (the hash finds it shorter): an error either way, and nothing written.
    path = _many_small_blocks(tmp_path, monkeypatch)
    real = getattr(mt, after)

    def then_truncate(where: Path, *args: Any, **kwargs: Any) -> Any:
        found = real(where, *args, **kwargs)
        with where.open("r+b") as handle:
            handle.truncate(where.stat().st_size // 2)
        return found

    monkeypatch.setattr(mt, after, then_truncate)
    with pytest.raises(TelemetryFileError, match=r"shrank|changed while it was read"):
        ingest_telemetry(store, [path], now=NOW)
    assert count(store) == 0
    files = store.connection.execute("SELECT count(*) FROM telemetry_files").fetchall()
    assert files == [(0,)]


def test_a_failure_while_parsing_rolls_the_file_back(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _many_small_blocks(tmp_path, monkeypatch)
    parse = mt.parse_block
    calls: list[int] = []

    def fail_on_the_third(data: bytes, first_line: int) -> Any:
        calls.append(first_line)
        if len(calls) == 3:
            raise RuntimeError("disk on fire")
        return parse(data, first_line)

    monkeypatch.setattr(mt, "parse_block", fail_on_the_third)
    with pytest.raises(RuntimeError, match="disk on fire"):
        ingest_telemetry(store, [path], now=NOW)
    assert count(store) == 0
    assert not _parse_threads()  # the thread that parsed ahead was stopped and waited for
    monkeypatch.setattr(mt, "parse_block", parse)
    assert ingest_telemetry(store, [path], now=NOW).files[0].events == 200


def test_node_counts_are_stored_with_sorted_keys_whichever_path_read_them(
    store: Store, tmp_path: Path
) -> None:
    # The same counts in two orders, read by the fast path (a clean file) and by the model (a
    # file whose bad line sends its block line by line): four MAPs with the same key order.
    counts = [
        {"CUDAExecutionProvider": 7, "CPUExecutionProvider": 3},
        {"CPUExecutionProvider": 3, "CUDAExecutionProvider": 7},
    ]
    clean = write(tmp_path / "clean.jsonl", [line(nodes_per_provider=c) for c in counts])
    mixed = write(
        tmp_path / "mixed.jsonl", [*(line(host_id="m", nodes_per_provider=c) for c in counts), "{"]
    )
    report = ingest_telemetry(store, [clean, mixed], now=NOW)
    assert [(f.events, f.bad_lines) for f in report.files] == [(2, 0), (2, 1)]
    keys = store.connection.execute(
        "SELECT map_keys(nodes_per_provider) FROM telemetry ORDER BY host_id, line"
    ).fetchall()
    assert keys == [(["CPUExecutionProvider", "CUDAExecutionProvider"],)] * 4


def _parse_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "qualify-telemetry-parse"]


def test_blocks_are_parsed_one_ahead_of_the_consumer_and_no_further() -> None:
    made: list[int] = []

    def items() -> Any:
        for i in range(100):
            made.append(i)
            yield i

    with mt._ahead(items()) as ahead:
        taken = [next(ahead), next(ahead)]
        deadline = datetime.now(UTC) + timedelta(seconds=5)
        while len(made) < 4 and datetime.now(UTC) < deadline:
            threading.Event().wait(0.01)
    # Two taken, one waiting in the slot, one made and held while the slot is full: the
    # producer stops there, and leaving the block stops it for good.
    assert taken == [0, 1]
    assert len(made) == 4
    assert not _parse_threads()


def test_an_error_making_the_next_block_is_raised_as_itself_in_the_consumer() -> None:
    class Broken(Exception):
        pass

    def items() -> Any:
        yield 1
        raise Broken("the disk went away")

    with mt._ahead(items()) as ahead:
        assert next(ahead) == 1
        with pytest.raises(Broken, match="the disk went away"):
            next(ahead)
    assert not _parse_threads()


def test_a_consumer_failing_mid_file_stops_the_parse_and_keeps_nothing(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # DuckDB (the consumer) fails while the next blocks wait parsed: the transaction rolls back
    # and the thread parsing ahead stops before the file is closed under it.
    path = _many_small_blocks(tmp_path, monkeypatch)
    batches = mt._batches

    def fail_on_the_second(tables: Any, tally: Any) -> Any:
        for i, batch in enumerate(batches(tables, tally)):
            if i == 1:
                raise KeyboardInterrupt
            yield batch

    monkeypatch.setattr(mt, "_batches", fail_on_the_second)
    with pytest.raises(KeyboardInterrupt):
        ingest_telemetry(store, [path], now=NOW)
    assert count(store) == 0
    assert store.connection.execute("SELECT count(*) FROM telemetry_files").fetchall() == [(0,)]
    assert not _parse_threads()


def test_an_unterminated_overlong_last_line_waits_and_is_reported_once(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mt, "BLOCK_BYTES", 4096)
    monkeypatch.setattr(checks, "MAX_LINE_BYTES", 1024)
    path = write(tmp_path / "t.jsonl", [line(host_id="a"), "x" * 20_000], end="")
    first = ingest_telemetry(store, [path], now=NOW).files[0]
    assert (first.events, first.bad_lines, first.pending_bytes) == (1, 0, 20_000)
    with path.open("a") as handle:
        handle.write("y\n" + line(host_id="b") + "\n")
    second = ingest_telemetry(store, [path], now=NOW).files[0]
    assert (second.first_line, second.events, [b.line for b in second.bad]) == (2, 1, [2])


# -- the fast path's own shortcuts: each must land exactly what the model would -----------------


def test_node_counts_land_as_maps_with_null_and_empty_ones_kept(
    store: Store, tmp_path: Path
) -> None:
    kinds: list[dict[str, int] | None] = [{"A": 1}, {"A": 1, "B": 2}, {}, None, {"B": 2}]
    path = write(
        tmp_path / "t.jsonl",
        [line(host_id=f"h{i}", nodes_per_provider=kinds[i % 5]) for i in range(50)],
    )
    assert ingest_telemetry(store, [path], now=NOW).files[0].events == 50
    stored = store.connection.execute(
        "SELECT nodes_per_provider, typeof(nodes_per_provider) FROM telemetry ORDER BY line"
    ).fetchall()
    assert [r[0] for r in stored] == [kinds[i % 5] for i in range(50)]
    assert {r[1] for r in stored} == {"MAP(VARCHAR, BIGINT)"}


def test_optional_fields_a_block_lacks_or_sends_only_as_null_land_as_nulls(
    store: Store, tmp_path: Path
) -> None:
    optional = ("model_digest", "runtime_package", "nodes_per_provider", "fallback_nodes")
    optional += ("latency_ms", "manifest_version", "decision", "rollout", "cohort", "settings")
    lacking = [line(host_id=f"a{i}", **dict.fromkeys(optional, _DROP)) for i in range(5)]
    nulls = [line(host_id=f"n{i}", **dict.fromkeys(optional)) for i in range(5)]
    path = write(tmp_path / "t.jsonl", lacking + nulls)
    assert ingest_telemetry(store, [path], now=NOW).files[0].events == 10
    stored = store.connection.execute(
        f"SELECT {', '.join(optional)} FROM telemetry ORDER BY line"
    ).fetchall()
    assert stored == [(None,) * len(optional)] * 10


def test_integral_latencies_land_as_the_floats_the_model_reads(
    store: Store, tmp_path: Path
) -> None:
    exact = 2**53
    files = [
        # All integral: read as int64, widened exactly.
        write(tmp_path / "ints.jsonl", [line(host_id=f"i{i}", latency_ms=i) for i in range(5)]),
        # Past 2**53 the widening is not exact: the model reads the line.
        write(tmp_path / "past.jsonl", [line(host_id="past", latency_ms=exact + 1)]),
        # Past int64 pyarrow reads a double itself.
        write(tmp_path / "huge.jsonl", [line(host_id="huge", latency_ms=10**20)]),
    ]
    done = ingest_telemetry(store, files, now=NOW)
    assert [(f.events, f.bad_lines) for f in done.files] == [(5, 0), (1, 0), (1, 0)]
    stored = store.connection.execute(
        "SELECT host_id, latency_ms, typeof(latency_ms) FROM telemetry ORDER BY host_id"
    ).fetchall()
    expected = {f"i{i}": float(i) for i in range(5)}
    expected |= {"past": float(exact + 1), "huge": 1e20}
    assert {r[0]: r[1] for r in stored} == expected
    assert {r[2] for r in stored} == {"DOUBLE"}


def test_text_that_looks_like_a_timestamp_is_stored_as_sent(store: Store, tmp_path: Path) -> None:
    # pyarrow infers a timestamp from a column of such strings; they are text to the model.
    path = write(
        tmp_path / "t.jsonl",
        [line(host_id=f"h{i}", rollout="2025-06-01T12:00:00Z", cohort="rest") for i in range(5)],
    )
    assert ingest_telemetry(store, [path], now=NOW).files[0].events == 5
    stored = store.connection.execute("SELECT DISTINCT rollout FROM telemetry").fetchall()
    assert stored == [("2025-06-01T12:00:00Z",)]


@pytest.mark.parametrize(
    ("start", "bad"),
    [("null\n", 1), ("\n  \nnull\n", 3), (" null\n", 1), ("null\n\n", 1)],
)
def test_a_block_that_opens_with_a_null_is_a_bad_line_not_a_crash(
    start: str, bad: int, store: Store, tmp_path: Path
) -> None:
    # pyarrow.json 26 crashes the process on input whose first value is null.
    path = tmp_path / "t.jsonl"
    path.write_text(start + line(host_id="after") + "\n")
    done = ingest_telemetry(store, [path], now=NOW).files[0]
    assert (done.events, [b.line for b in done.bad]) == (1, [bad])
    assert "object" in done.bad[0].message
    assert store.connection.execute("SELECT host_id FROM telemetry").fetchall() == [("after",)]


@pytest.mark.parametrize("blank", ["", "   ", "\t\r"])
def test_a_blank_line_and_a_line_of_two_events_do_not_shift_line_numbers(
    blank: str, store: Store, tmp_path: Path
) -> None:
    # As many rows as lines, but not one per line: the model reads the line of two events.
    two = line(host_id="b1") + " " + line(host_id="b2")
    path = write(tmp_path / "t.jsonl", [line(host_id="a"), blank, two, line(host_id="c")])
    done = ingest_telemetry(store, [path], now=NOW).files[0]
    assert (done.events, [b.line for b in done.bad]) == (2, [3])
    assert "trailing characters" in done.bad[0].message
    stored = store.connection.execute("SELECT host_id, line FROM telemetry ORDER BY line")
    assert stored.fetchall() == [("a", 1), ("c", 4)]


def test_lines_indented_by_whitespace_keep_their_line_numbers(store: Store, tmp_path: Path) -> None:
    path = write(tmp_path / "t.jsonl", ["  " + line(host_id="a"), line(host_id="b"), "\t" + line()])
    done = ingest_telemetry(store, [path], now=NOW).files[0]
    assert (done.events, done.bad_lines) == (3, 0)
    stored = store.connection.execute("SELECT host_id, line FROM telemetry ORDER BY line")
    assert stored.fetchall() == [("a", 1), ("b", 2), ("h1", 3)]
