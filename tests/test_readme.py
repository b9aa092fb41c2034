"""The README's ten-minute walk runs as written and prints what the README shows.

Every ``$ `` line of the walk's console blocks runs, in order, in one shell in a fresh folder laid
out as a clone (``qualify/`` beside ``walk/``), with the installed ``qualify`` and
``resolve-artifact`` on PATH. Each command must exit 0, the project file ``qualify init`` writes
must be the one the README shows, and every output line the README shows (but table rows and
lines with an elided path) must be printed (a line ending in '...' as its start), with numbers,
digests and times free to differ.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
_MARK = "=== qualify-readme-step ==="


def _walk_section() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("## Ten minutes with your own model")
    return text[start : text.index("\n## ", start + 1)]


def _steps(section: str) -> list[tuple[str, list[str]]]:
    """Each ``$ `` command of the console blocks with the output lines shown under it."""
    steps: list[tuple[str, list[str]]] = []
    for block in re.findall(r"```console\n(.*?)```", section, re.S):
        for line in block.splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], []))
            elif steps:
                steps[-1][1].append(line)
    return steps


def _shape(line: str) -> str:
    """A line with what changes from run to run (numbers, digests, times) made alike."""
    line = re.sub(r"\d{4}-\d\d-\d\dT[\d:]+Z", "TIME", line)
    line = re.sub(r"[0-9a-f]{12,}", "HEX", line)
    return re.sub(r"\d+(\.\d+)?", "N", line).strip()


_DECISION = re.compile(r"^(\s+[\w.-]+: )(baseline|candidate|hold) — ")
"""A class's decision line: which decision a tiny model gets turns on measured speed (a
candidate a few microseconds slower or not), so the test asks for the class's line with a
decision, not for the one the README's run happened to get."""


def test_the_walk_runs_as_written_and_prints_what_it_shows(tmp_path: Path) -> None:
    section = _walk_section()
    steps = _steps(section)
    assert [c.split()[0] for c, _ in steps][:4] == ["mkdir", "cp", "qualify", "qualify"]
    (tmp_path / "qualify").symlink_to(ROOT / "qualify")
    # After `qualify init`, a copy of what it wrote, before later steps edit the file.
    keep = "\ncp qualify.yaml ../init.yaml"
    script = "set -e\n" + "".join(
        f"echo '{_MARK}'\n{command}{keep if command.startswith('qualify init') else ''}\n"
        for command, _ in steps
    )
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    printed = done.stdout.split(_MARK + "\n")[1:]
    assert len(printed) == len(steps)
    for (command, shown), out in zip(steps, printed, strict=True):
        seen = {_shape(line) for line in (out + done.stderr).splitlines()}
        for line in shown:
            if not line.strip() or line.startswith(("┃", "│", "...")) or "…" in line:
                continue
            shape = _shape(line)
            decision = _DECISION.match(line)
            if decision is not None:
                found = any(
                    re.match(
                        rf"{re.escape(_shape(decision.group(1)))} (baseline|candidate|hold) — ", s
                    )
                    for s in seen
                )
            elif shape.endswith("..."):  # shortened in the README: what it shows is the start
                found = any(s.startswith(shape[:-3].rstrip()) for s in seen)
            else:
                found = shape in seen
            assert found, f"{command!r} did not print {line!r}:\n{out}"
    written = (tmp_path / "init.yaml").read_text(encoding="utf-8")
    shown_yaml = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert shown_yaml is not None

    def code(text: str) -> list[str]:
        return [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]

    assert code(written) == code(shown_yaml.group(1))
