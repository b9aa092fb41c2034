"""Benchmark: ``resolve-artifact`` start-to-exit against bare Python, and manifest generation.

Measures, in one run, interleaved with ``python -c pass`` of the same interpreter: the whole
``resolve-artifact`` process (signature included) from a wheel-style install (a fresh venv with
this project's wheel and cryptography copied in; nothing downloaded), on a 1,000-class manifest,
per-class documents and (no target) a whole 100,000-class manifest; and a floor script doing only
what any verifier must (read, ``json``, cryptography's public Ed25519, verify). Also times one
10,000-class generation. Targets (issue 36): <= 3.5x ``python -c pass`` for a per-class document,
<= 5x for a whole 1,000-class manifest. Prints markdown tables for docs/benchmarks.md.

Usage::

    .venv/bin/python bench/resolve.py [--repeat 30] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._synthetic import BASE, CAND, isa_flags, project_of, scripted_run  # noqa: E402
from manifest import envelope  # noqa: E402
from manifest.build import build_manifest, per_class_documents, write_manifest  # noqa: E402
from manifest.policy import decide  # noqa: E402
from manifest.signing import (  # noqa: E402
    generate_keypair,
    load_private_key,
    sign_document,
    sign_encoded,
)
from schemas.cell import (  # noqa: E402
    Cell,
    RunRecord,
)
from schemas.manifest import ArtifactRef  # noqa: E402
from schemas.project import Project  # noqa: E402

CLOCK = datetime.now(UTC).replace(microsecond=0)


def _fleet(n: int) -> tuple[Project, list[Cell], dict[str, RunRecord]]:
    """A project of ``n`` classes and one scripted run each (baseline + int8 candidate).

    Every third class falls back to the CPU, every fifth is over its p99 budget, every seventh
    was never measured: the decisions are mixed, as in a real fleet.
    """
    classes = {
        f"c{i:06d}": {
            "key": {"hardware": f"hw{i}", "runtime": "ort-r8", "provider": f"p{i}"},
            "match": {"arch": "x86_64", "cpu_flags": [f"flag{i % 17}"], "min_cores": 2},
            "runtime": {"package": "onnxruntime", "version": "1.32.*"},
            "provider": {"execution_providers": ["CPUExecutionProvider"]},
            "budgets": {"p99_ms": 80.0, "peak_rss_mb": 512.0, "cold_init_ms": 1500.0},
        }
        for i in range(n)
    }
    project = project_of(classes)
    cells: list[Cell] = []
    runs: dict[str, RunRecord] = {}
    for i, (name, cls) in enumerate(project.host_classes.items()):
        if i % 7 == 6:
            continue
        run, pair = scripted_run(
            name,
            cls,
            run_id=f"run-{i:06d}",
            when=CLOCK,
            upper_ms=95.0 if i % 5 == 4 else 41.0,
            fallback=4 if i % 3 == 2 else 0,
        )
        runs[run.run_id] = run
        cells.extend(pair)
    return project, cells, runs


ARTIFACTS = {
    BASE: ArtifactRef(
        name="rec-fp32", uri="https://models.example/rec-fp32.onnx", length=4_000_000
    ),
    CAND: ArtifactRef(
        name="rec-int8", uri="https://models.example/rec-int8.onnx", length=1_000_000
    ),
}


def _generate(n: int, key: Any, out: Path) -> dict[str, float]:
    project, cells, runs = _fleet(n)
    t0 = time.perf_counter()
    decisions = decide(project, cells, runs, digests={"rec-fp32": BASE, "rec-int8": CAND})
    t1 = time.perf_counter()
    signed = build_manifest(
        project,
        decisions,
        release="bench",
        version=1,
        created=CLOCK - timedelta(hours=1),
        expires=CLOCK + timedelta(days=30),
        snapshot="bench",
        artifacts=ARTIFACTS,
        encoded=True,  # as a release generates it
    )
    t2 = time.perf_counter()
    _, doc = sign_encoded(signed, key)
    t3 = time.perf_counter()
    write_manifest(doc, out)
    t4 = time.perf_counter()
    return {
        "decide": t1 - t0,
        "build": t2 - t1,
        "sign": t3 - t2,
        "write": t4 - t3,
        "total": t4 - t0,
    }


def _clone_fleet(template: dict[str, Any], n: int) -> dict[str, Any]:
    """A ``signed`` part of ``n`` classes, each a copy of one real entry under its own name/key."""
    entries = {}
    for i in range(n):
        name = f"c{i:06d}"
        entry = dict(template)
        entry["host_class"] = name
        entry["key"] = {"hardware": f"hw{i}", "runtime": "ort-r8", "provider": f"p{i}"}
        entry["match"] = {**template["match"], "cpu_flags": [f"flag{i % 17}"]}
        entries[name] = entry
    return {**template["_signed"], "entries": entries}


def _answered(code: int, cmd: list[str]) -> None:
    """A full answer: resolved (0) or on hold (3, the synthetic class's decision) both verify
    and parse the whole document; anything else means the benchmark measured a refusal."""
    if code not in (0, 3):
        raise SystemExit(f"{' '.join(cmd)} exited {code}: not an answer, nothing to time")


def _median_runs(
    commands: dict[str, list[str]], repeat: int, cwd: Path, expect: dict[str, tuple[int, ...]]
) -> dict[str, tuple[float, float]]:
    """Per command, the medians of its wall time and of its CPU time (user + system, from
    ``getrusage(RUSAGE_CHILDREN)``: on a shared machine, waiting for a core inflates the wall
    time and not this), the commands run in turn ``repeat`` times."""
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in commands}

    def once(label: str, cmd: list[str]) -> tuple[float, float]:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        code = subprocess.run(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd
        ).returncode
        elapsed = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if code not in expect.get(label, (0,)):
            raise SystemExit(f"{' '.join(cmd)} exited {code}: not an answer, nothing to time")
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return elapsed, cpu

    for label, cmd in commands.items():  # warm the page cache and the state dir, untimed
        once(label, cmd)
    for _ in range(repeat):
        for label, cmd in commands.items():
            times[label].append(once(label, cmd))
    return {
        k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
        for k, v in times.items()
    }


_FLOOR_PUBLIC = """
import json, sys
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
with open(sys.argv[1], "rb") as f:
    raw = f.read()
with open(sys.argv[2], "rb") as f:
    der = __import__("binascii").a2b_base64(b"".join(f.read().split(b"-----")[2].split()))
cut = raw.index(b',"signed":{')
sig = json.loads(raw[14:cut])[0]["sig"]
signed = raw[cut + 10 : -1]
Ed25519PublicKey.from_public_bytes(der[12:]).verify(bytes.fromhex(sig), signed)
document = json.loads(signed)
"""
_FLOOR_TOOLS = (
    _FLOOR_PUBLIC
    + """
# What issue 36 asks the host side to use besides: argparse for a command line of the same
# seventeen options, datetime for the expiry.
import argparse
from datetime import UTC, datetime
parser = argparse.ArgumentParser(prog="floor")
for name in ("manifest host-class model state-dir verify-file runtime providers "
             "emit-telemetry host-id uri-schemes").split():
    parser.add_argument("--" + name, metavar="X", help="an option of resolve-artifact")
for name in ("max-bytes", "grace-days", "max-validity-days"):
    parser.add_argument("--" + name, type=float, default=1.0, help="%(default)s")
for name in ("no-state", "json"):
    parser.add_argument("--" + name, action="store_true", help="a switch")
parser.parse_args(["--manifest", sys.argv[1], "--providers", "CPUExecutionProvider"])
datetime.fromisoformat(document["expires"].replace("Z", "+00:00")) > datetime.now(UTC)
"""
)
_TEARDOWN = "import sys; from manifest.resolve import main; sys.exit(main(sys.argv[1:]))"


def _wheel_install(work: Path) -> Path:
    """A fresh venv with this project installed from its wheel and cryptography copied in;
    returns its ``bin`` folder. Builds from a copy of the tree, so nothing lands in the checkout
    (no ``build/``, no ``*.egg-info``); downloads nothing."""
    src = work / "src"
    ignore = shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "demo"
    )
    shutil.copytree(ROOT, src, ignore=ignore)
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run(
        [
            *pip,
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(work / "w"),
            str(src),
        ],
        check=True,
        stderr=subprocess.DEVNULL,
    )
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    wheel = next((work / "w").glob("qualify-*.whl"))
    subprocess.run(
        [*pip, "--python", str(py), "install", "--no-deps", "--no-index", str(wheel)], check=True
    )
    import cryptography

    site = Path(cryptography.__file__).resolve().parent.parent
    target = Path(
        subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    for pattern in (
        "cryptography",
        "cryptography-*",
        "cffi",
        "cffi-*",
        "pycparser",
        "pycparser-*",
        "_cffi_backend*",
    ):
        for item in site.glob(pattern):
            copy = shutil.copytree if item.is_dir() else shutil.copy2
            copy(item, target / item.name)
    # As pip would have: bytecode for what was copied (this checkout may not write any).
    subprocess.run([str(py), "-m", "compileall", "-q", str(target)], check=True)
    return venv / "bin"


def _measure_resolve(work: Path, key: Any, pub: Path, repeat: int) -> dict[str, Any]:
    """Medians of each command, interleaved with ``python -c pass`` of the wheel install."""
    import json

    _generate(1_000, key, work / "m1000.json")
    doc1000 = json.loads((work / "m1000.json").read_bytes())
    template = dict(doc1000["signed"]["entries"]["c000500"])
    template["_signed"] = {k: v for k, v in doc1000["signed"].items() if k != "entries"}
    signed100k = _clone_fleet(template, 100_000)
    t0 = time.perf_counter()
    write_manifest(sign_encoded(signed100k, key)[1], work / "m100000.json")
    t_big = time.perf_counter() - t0
    t0 = time.perf_counter()
    docs = per_class_documents(signed100k)
    t_split = time.perf_counter() - t0
    classes, resolved = work / "classes", work / "resolved"
    classes.mkdir(exist_ok=True)
    resolved.mkdir(exist_ok=True)
    one, ok = "c050000", "c000000"  # on hold (every clone is), and a candidate of the 1,000
    write_manifest(sign_document(docs[one], key), classes / envelope.class_filename(one))
    own = per_class_documents(doc1000["signed"])[ok]
    write_manifest(sign_document(own, key), resolved / envelope.class_filename(ok))
    floors = work / "floors"
    floors.mkdir(exist_ok=True)
    (floors / "floor_public.py").write_text(_FLOOR_PUBLIC)
    (floors / "floor_tools.py").write_text(_FLOOR_TOOLS)

    bin_dir = _wheel_install(work)
    py, tool = str(bin_dir / "python"), str(bin_dir / "resolve-artifact")
    # The floors are imported from their bytecode, as resolve-artifact's modules are (a script
    # run by path would be compiled at every start, and the floor would not be one).
    subprocess.run([py, "-m", "compileall", "-q", str(floors)], check=True)

    def floor(name: str, document: Path | str) -> list[str]:
        code = f"import sys; sys.path.insert(0, {str(floors)!r}); import {name}"
        return [py, "-c", code, str(document), str(pub)]

    base = [tool, "--pubkey", str(pub), "--host-class"]
    host = ["--runtime", "onnxruntime==1.32.0", "--providers", "CPUExecutionProvider"]
    one_doc = str(classes / envelope.class_filename(one))

    def state(n: int) -> list[str]:
        shutil.rmtree(work / f"s{n}", ignore_errors=True)  # fresh host state for this key
        return ["--state-dir", str(work / f"s{n}")]

    commands = {
        "bare": [py, "-c", "pass"],
        "m1000": [*base, "c000500", "--manifest", str(work / "m1000.json"), *state(1)],
        "class": [*base, one, "--manifest", str(classes), *state(2)],
        "resolved": [*base, ok, "--manifest", str(resolved), *host, *state(3)],
        "resolved-json": [*base, ok, "--manifest", str(resolved), *host, "--json", *state(4)],
        "m1000-m": [
            py,
            "-m",
            "manifest.resolve",
            *base[1:],
            "c000500",
            "--manifest",
            str(work / "m1000.json"),
            *state(5),
        ],
        "floor-public": floor("floor_public", one_doc),
        "floor-tools": floor("floor_tools", one_doc),
        "floor-tools-m1000": floor("floor_tools", work / "m1000.json"),
        "floor-public-m1000": floor("floor_public", work / "m1000.json"),
        "m1000-teardown": [
            py,
            "-c",
            _TEARDOWN,
            *base[1:],
            "c000500",
            "--manifest",
            str(work / "m1000.json"),
            *state(7),
        ],
    }
    expect: dict[str, tuple[int, ...]] = {
        "m1000": (3,),
        "class": (3,),
        "m1000-m": (3,),
        "m1000-teardown": (3,),
    }
    med = _median_runs(commands, repeat, work, expect)
    big = [*base, one, "--manifest", str(work / "m100000.json"), "--max-bytes", str(1 << 30)]
    on_hold: dict[str, tuple[int, ...]] = {"m100000": (3,)}  # the synthetic class is on hold
    med.update(_median_runs({"m100000": [*big, *state(6)]}, max(3, repeat // 4), work, on_hold))
    sizes = {
        "m1000": (work / "m1000.json").stat().st_size,
        "class": (classes / envelope.class_filename(one)).stat().st_size,
        "resolved": (resolved / envelope.class_filename(ok)).stat().st_size,
        "m100000": (work / "m100000.json").stat().st_size,
    }
    return {"med": med, "sizes": sizes, "t_big": t_big, "t_split": t_split}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _floor_note(med: dict[str, tuple[float, float]], bare: tuple[float, float]) -> str:
    """What the floors say of the targets: a target below the public floor cannot be met with
    public APIs at all, and one below the floor with the tools issue 36 requires (argparse,
    datetime) cannot be met without re-implementing them; then it is the target that is wrong
    (issue 36), not a reason to reach for a private API. Also: how far the code is above it."""
    notes = []
    for label, ours, floor, tools, target in (
        ("per-class document", "resolved", "floor-public", "floor-tools", 3.5),
        ("1,000-class manifest", "m1000", "floor-public-m1000", "floor-tools-m1000", 5.0),
    ):
        ratios = {k: (med[k][0] / bare[0], med[k][1] / bare[1]) for k in (ours, floor, tools)}
        if min(ratios[floor]) > target:
            verdict = (
                "the public floor alone is above the target on both clocks, so the target is "
                "wrong for this machine (issue 36: not a reason to reach for a private API)"
            )
        elif min(ratios[tools]) > target:
            verdict = (
                "argparse and datetime on top of it are above the target on both clocks, so "
                "the target is wrong for this machine (meeting it would mean re-implementing "
                "them, which issue 36 rules out)"
            )
        else:
            verdict = "the target can be met with public APIs and the required tools"
        above = (med[ours][1] - med[tools][1]) * 1000
        notes.append(
            f"{label}: public floor {ratios[floor][0]:.2f}x wall / {ratios[floor][1]:.2f}x CPU, "
            f"with argparse and datetime {ratios[tools][0]:.2f}x / {ratios[tools][1]:.2f}x, "
            f"against <= {target:g}x: {verdict}; resolve-artifact is {above:+.1f} ms CPU "
            "from that floor"
        )
    return "Floors: " + "; ".join(notes) + "."


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print the markdown tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeat", type=int, default=30, help="runs per command (median)")
    parser.add_argument("--workdir", type=Path, help="keep the files here (default: a temp dir)")
    args = parser.parse_args(argv)
    # A host has no PYTHONPATH (make bench sets it to this checkout): with it, pip would see
    # the checkout as installed and write no console script, and the runs would time the
    # checkout's modules instead of the wheel's.
    os.environ.pop("PYTHONPATH", None)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.workdir or Path(tmp)
        if args.workdir is not None:
            shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True, exist_ok=True)
        key_path, pub_path = generate_keypair("bench", work, overwrite=True)
        key = load_private_key(key_path)

        gen = min(
            (_generate(10_000, key, work / "m10000.json") for _ in range(3)),
            key=lambda r: r["total"],
        )
        gen_size = (work / "m10000.json").stat().st_size
        load_before = os.getloadavg()
        found = _measure_resolve(work, key, pub_path, args.repeat)
        load_after = os.getloadavg()
    med, sizes, t_big, t_split = found["med"], found["sizes"], found["t_big"], found["t_split"]
    sizes["m10000"] = gen_size
    bare = med["bare"]

    def row(label: str, key_: str, size: int | None, target: str) -> str:
        (wall, cpu), (bare_wall, bare_cpu) = med[key_], bare
        ratio, cpu_ratio = wall / bare_wall, cpu / bare_cpu
        ok = "" if target == "none" else "yes" if within(ratio, target) else "**no**"
        cpu_ok = "" if target == "none" else "yes" if within(cpu_ratio, target) else "no"
        size_s = (
            "" if size is None else f"{size / 1e6:.2f} MB" if size > 1e5 else f"{size / 1e3:.1f} kB"
        )
        return (
            f"| {label} | {size_s} | {wall * 1000:.1f} ms | {ratio:.2f}x | {target} | {ok} "
            f"| {cpu * 1000:.1f} ms | {cpu_ratio:.2f}x {cpu_ok} |"
        )

    def within(ratio: float, target: str) -> bool:
        return ratio <= float(target.removeprefix("<= ").removesuffix("x"))

    print(
        f"Machine: {_cpu_model()} ({isa_flags()}), {os.cpu_count()} logical CPUs, "
        f"{platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}; load average "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after"
    )
    print(
        f"Command: `{Path(sys.executable).name} bench/resolve.py --repeat {args.repeat}` "
        f"(median of {args.repeat} interleaved runs from a wheel-style install; whole process, "
        "signature included)"
    )
    print()
    print(
        "| resolve-artifact | document | median wall | vs `python -c pass` | target | met "
        "| median CPU (user+sys) | CPU vs `python -c pass` |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print(
        f"| `python -c pass` | | {bare[0] * 1000:.1f} ms | 1.00x | | | {bare[1] * 1000:.1f} ms "
        "| 1.00x |"
    )
    rows = [
        ("1,000-class manifest, class on hold", "m1000", "m1000", "<= 5x"),
        ("per-class document of a 100,000-class fleet, on hold", "class", "class", "<= 3.5x"),
        ("per-class document, resolved to its artifact", "resolved", "resolved", "<= 3.5x"),
        ("per-class document, resolved, `--json`", "resolved-json", None, "<= 3.5x"),
        ("1,000-class manifest through `python -m manifest.resolve`", "m1000-m", None, "none"),
        (
            "floor: read, `json`, cryptography's public Ed25519, verify (per-class)",
            "floor-public",
            None,
            "none",
        ),
        ("floor, public API, 1,000-class manifest", "floor-public-m1000", None, "none"),
        (
            "floor with the required tools: the public floor + argparse (the same 17 options) + "
            "`datetime` expiry (per-class)",
            "floor-tools",
            None,
            "none",
        ),
        ("floor with the required tools, 1,000-class manifest", "floor-tools-m1000", None, "none"),
        (
            "1,000-class manifest through `main(argv)`: the interpreter's teardown kept",
            "m1000-teardown",
            None,
            "none",
        ),
        ("whole 100,000-class manifest (no target)", "m100000", "m100000", "none"),
    ]
    for label, key_, size_key, target in rows:
        size = sizes[size_key] if size_key else None
        print(row(label, key_, size, target))
    print()
    print(
        "'met' is judged on wall time, as issue 36 states its targets; the CPU columns are the "
        "same runs' user + system time, which waiting for a core on a shared machine does not "
        "inflate ('no' there too means the code, not the machine, misses the target)."
    )
    print()
    print(_floor_note(med, bare))
    print()
    print("| manifest generation | time | target | met |")
    print("|---|---|---|---|")
    print(
        f"| 10,000 classes: decide + build + sign + write ({sizes['m10000'] / 1e6:.1f} MB) | "
        f"{gen['total']:.2f} s (decide {gen['decide']:.2f}, build {gen['build']:.2f}, "
        f"sign {gen['sign']:.2f}, write {gen['write']:.2f}) | none (see the next section) | |"
    )
    print(f"| 100,000 classes: sign + write the whole manifest | {t_big:.2f} s | none | |")
    print(
        f"| 100,000 classes: split into per-class documents (unsigned) | {t_split:.2f} s | none | |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
