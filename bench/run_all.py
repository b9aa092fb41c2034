"""Run every benchmark in ``bench/`` and rewrite ``docs/benchmarks.md`` (``make bench``).

Owns discovering the benchmark scripts, running each in its own subprocess from the repository
root (each prints one markdown section on stdout; progress on stderr passes through), describing
the machine, and writing the document atomically. It does not measure anything itself and does
not interpret the sections: a benchmark that fails or times out gets a section saying so, with
its exit status and the tail of its output, and this script then exits 1.

A benchmark is any ``bench/*.py`` except this file, ``__init__.py`` and names starting with an
underscore; the known ones run first, in a fixed order, then any others alphabetically.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

# Runnable as `python bench/NAME.py` from a checkout that is not installed.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from manifest.hostmatch import read_host_facts

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "ORDER",
    "Section",
    "discover",
    "machine_facts",
    "main",
    "render_document",
    "run_one",
    "write_atomically",
]

REPO = Path(__file__).resolve().parent.parent

ORDER = (
    "harness_vs_loadgen",
    "ab",
    "openloop",
    "memory",
    "resolve",
    "generate",
    "report",
    "telemetry",
    "telemetry_ingest",
    "ingest",
)
"""Known benchmarks, in the order their sections appear."""
DEFAULT_TIMEOUT_S = 600.0
"""Per benchmark; the whole of ``make bench`` should stay under ~10 minutes on 2 cores."""
STDERR_TAIL = 1500


@dataclass(frozen=True)
class Section:
    """One benchmark's outcome."""

    name: str
    markdown: str
    """Its stdout (a markdown section), or a note saying why there is none."""
    ok: bool
    wall_s: float


def discover(bench_dir: Path) -> list[Path]:
    """The benchmark scripts in ``bench_dir``: known ones in `ORDER` first, then the rest by name."""
    found = {
        p.stem: p
        for p in bench_dir.glob("*.py")
        if p.name != Path(__file__).name and p.name != "__init__.py" and not p.name.startswith("_")
    }
    known = [found.pop(name) for name in ORDER if name in found]
    return known + [found[name] for name in sorted(found)]


def run_one(script: Path, *, timeout_s: float, extra_args: list[str] | None = None) -> Section:
    """Run one benchmark script and capture its markdown section.

    Args:
        script: the benchmark's path.
        timeout_s: wall-clock limit; the script's process group is killed past it.
        extra_args: command-line arguments for the script.

    Returns:
        Its section; on failure or timeout a section that says what happened.
    """
    env = dict(os.environ)
    extra = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + extra if extra else "")
    command = [sys.executable, str(script), *(extra_args or [])]
    started = time.monotonic()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            command,
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            timed_out = True
        err.seek(0)
        stderr = err.read().decode("utf-8", errors="replace")
    wall = time.monotonic() - started
    sys.stderr.write(stderr)
    text = out.decode("utf-8", errors="replace").strip()
    name = script.stem
    if proc.returncode == 0 and not timed_out and text:
        if not text.startswith("#"):
            # Every section gets a heading, so the document's outline names each benchmark.
            text = f"## bench/{script.name}\n\n{text}"
        return Section(name=name, markdown=text, ok=True, wall_s=wall)
    why = (
        f"timed out after {timeout_s:g} s and was killed"
        if timed_out
        else f"exited with status {proc.returncode}"
        if proc.returncode != 0
        else "printed nothing"
    )
    body = [f"## {name}", "", f"**Not measured**: `python bench/{script.name}` {why}."]
    if text:
        body += ["", "What it printed:", "", text]
    tail = stderr.strip()[-STDERR_TAIL:]
    if tail:
        body += ["", "Its last error output:", "", "```", tail, "```"]
    return Section(name=name, markdown="\n".join(body), ok=False, wall_s=wall)


def _version(*names: str) -> str | None:
    for name in names:
        try:
            return f"{name} {metadata.version(name)}"
        except metadata.PackageNotFoundError:
            continue
    return None


def _git_revision() -> str | None:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head} (with uncommitted changes)" if dirty else head


def machine_facts() -> dict[str, str]:
    """What the numbers depend on: CPU, cores, memory, OS, Python, runtime versions.

    Unknown values read ``unknown``; nothing is guessed. Does not import onnxruntime.
    """
    facts = read_host_facts()
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    cores = f"{os.cpu_count() or 'unknown'} logical"
    if affinity is not None:
        cores += f", {affinity} usable by this process"
    memory = f"{facts.memory_mb / 1024:.1f} GiB" if facts.memory_mb else "unknown"
    load = os.getloadavg()
    return {
        "CPU": facts.cpu_model or "unknown",
        "arch": facts.arch,
        "cores": cores,
        "memory": memory,
        "OS": f"{platform.system()} {platform.release()}",
        "Python": platform.python_version(),
        "onnxruntime": _version(
            "onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino", "onnxruntime-directml"
        )
        or "not installed",
        "MLPerf LoadGen": _version("mlcommons-loadgen", "mlcommons_loadgen") or "not installed",
        "numpy": _version("numpy") or "not installed",
        "qualify commit": _git_revision() or "unknown",
        "load average at start (1/5/15 min)": f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}",
    }


def render_document(
    machine: dict[str, str], sections: list[Section], *, now: dt.datetime, command: str
) -> str:
    """The whole ``docs/benchmarks.md``.

    Args:
        machine: `machine_facts`, possibly with more rows added by the caller.
        sections: each benchmark's outcome, in order.
        now: when the run happened (written as the date).
        command: how to reproduce it.
    """
    lines = [
        "# Benchmarks",
        "",
        "Generated by `bench/run_all.py`; do not edit by hand. Every number below was measured "
        "on the machine described here, in the run described here; another machine, or the "
        "same one under other load, gives other numbers. Shared CI-style machines are noisy, "
        "tails (p99) most of all.",
        "",
        f"Reproduce: `{command}` (each benchmark also runs alone: `python bench/NAME.py` "
        "prints its section).",
        "",
        "## Machine",
        "",
        "| | |",
        "|---|---|",
        f"| date (UTC) | {now.astimezone(dt.UTC).strftime('%Y-%m-%d %H:%M')} |",
    ]
    lines += [f"| {k} | {v} |" for k, v in machine.items()]
    lines += ["", "| benchmark | status | wall time |", "|---|---|---|"]
    lines += [
        f"| `bench/{s.name}.py` | {'measured' if s.ok else 'FAILED'} | {s.wall_s:.0f} s |"
        for s in sections
    ]
    if not sections:
        lines += ["", "No benchmark scripts were found in `bench/`."]
    for s in sections:
        lines += ["", s.markdown.rstrip()]
    return "\n".join(lines) + "\n"


def splice_sections(existing: str, sections: list[Section], *, note: str) -> str:
    """``existing`` with each of ``sections`` put in place of its earlier version (the block
    from its heading to the next ``## `` heading), each followed by ``note``; a section the page
    does not have yet (or one that failed and printed no heading) goes at its end under its
    own heading. A run of one benchmark keeps every other benchmark's numbers on the page."""
    lines = existing.rstrip("\n").splitlines()
    for section in sections:
        body = section.markdown.rstrip().splitlines()
        if not body or not body[0].startswith("## "):
            body = [f"## bench/{section.name}.py", "", *body]
        heading = body[0]
        start = lines.index(heading) if heading in lines else len(lines)
        end = next(
            (i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines)
        )
        lines[start:end] = [*([""] if start == len(lines) else []), *body, "", note, ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temp file in the same directory, fsync and rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks and rewrite the document.

    Returns:
        0 when every benchmark produced its section, 1 otherwise (the document is still written,
        with the failure in it).
    """
    parser = argparse.ArgumentParser(description="Run bench/*.py and rewrite docs/benchmarks.md.")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks.md")
    parser.add_argument(
        "--only", action="append", default=None, metavar="NAME", help="run only this benchmark"
    )
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="per benchmark")
    args = parser.parse_args(argv)
    scripts = discover(REPO / "bench")
    if args.only:
        scripts = [s for s in scripts if s.stem in set(args.only)]
    now = dt.datetime.now(dt.UTC)
    machine = machine_facts()
    sections: list[Section] = []
    for script in scripts:
        print(f"== bench/{script.name}", file=sys.stderr, flush=True)
        section = run_one(script, timeout_s=args.timeout)
        print(
            f"== bench/{script.name}: {'ok' if section.ok else 'FAILED'} in {section.wall_s:.0f} s",
            file=sys.stderr,
            flush=True,
        )
        sections.append(section)
    load = os.getloadavg()
    machine["load average at end (1/5/15 min)"] = f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}"
    command = (
        "make bench"
        if argv is None and len(sys.argv) == 1
        else "python bench/run_all.py " + " ".join(argv if argv is not None else sys.argv[1:])
    )
    text = render_document(machine, sections, now=now, command=command)
    if args.only and args.out.exists():
        note = (
            f"_Rerun alone: `{command}` at {now.strftime('%Y-%m-%d %H:%M')} UTC, qualify commit "
            f"{machine['qualify commit']}, load average {machine['load average at start (1/5/15 min)']}"
            " at start; the machine table above is the full run's._"
        )
        text = splice_sections(args.out.read_text(encoding="utf-8"), sections, note=note)
    write_atomically(args.out, text)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0 if all(s.ok for s in sections) else 1


if __name__ == "__main__":
    sys.exit(main())
