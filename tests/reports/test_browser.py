"""The report in a real browser: headless Chromium opens it, runs its scripts, draws its charts.

Chromium is driven with command-line flags only (no selenium, no DevTools client): one run dumps
the DOM after the scripts ran (``--dump-dom``) while logging the page's console to stderr, a
second takes a screenshot. The page logs nothing when it works, so any console line from the
page is a failure. In CI (``CI`` set) a missing Chromium fails the test; locally it skips.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from reports import ReportView, write_report
from tests.reports.htmltree import parse

pytestmark = pytest.mark.browser

_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
)


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    if os.environ.get("CI"):
        pytest.fail("CI: headless Chromium is required (apt-get install chromium); not found")
    pytest.skip("headless Chromium not installed (apt-get install chromium)")


def _run(args: list[str], profile: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_chromium(), *_FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory, golden_view: ReportView) -> Path:
    """The golden report written to disk."""
    out = tmp_path_factory.mktemp("browser") / "report.html"
    write_report(golden_view, out)
    return out


def test_report_loads_without_console_errors_and_draws_every_chart(
    page: Path, golden_view: ReportView, tmp_path: Path
) -> None:
    url = page.as_uri() + "?charts=all"
    done = _run(
        [
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=5000",
            "--dump-dom",
            url,
        ],
        tmp_path / "profile",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], "the page wrote to the console:\n" + "\n".join(console)

    dom = parse(done.stdout)
    sections = dom.find_all("section", "cls")
    assert [s.attrs["id"] for s in sections] == [c.anchor for c in golden_view.classes]
    charts = dom.find_all("div", "chart")
    expected = [c.chart.dom_id for c in golden_view.classes if c.chart is not None]
    assert [c.attrs["id"] for c in charts] == expected
    for chart in charts:
        assert chart.attrs.get("data-drawn") == "1", chart.attrs["id"]
        assert chart.find_all("canvas"), f"{chart.attrs['id']} has no canvas: uPlot did not draw"
        legend = chart.all_text()
        assert "rec-fp32" in legend
    # The hostile class name is still text after the scripts ran.
    assert not any(
        "alert(1)" in s.all_text() for s in dom.find_all("script") if "type" not in s.attrs
    )


def test_screenshot_of_the_report(page: Path, tmp_path: Path) -> None:
    shot = Path(os.environ.get("QUALIFY_SCREENSHOT_DIR", tmp_path)) / "report.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    done = _run(
        [
            f"--screenshot={shot}",
            "--window-size=1280,2400",
            "--virtual-time-budget=5000",
            page.as_uri() + "?charts=all",
        ],
        tmp_path / "profile",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1280, 2400)
    assert len(data) > 50_000, "a near-empty screenshot: the page did not render"
    assert re.search(rb"IDAT", data)


# Measures the laid-out page and appends what it found as JSON: the page's and each visible
# table's width against its container, and how many lines each cell that must not wrap takes.
_PROBE = """
addEventListener("load", () => {
  const lines = (el) => {
    const range = document.createRange();
    range.selectNodeContents(el);
    return new Set([...range.getClientRects()].map((r) => Math.round(r.top))).size;
  };
  const root = document.documentElement;
  const out = {page: [root.scrollWidth, root.clientWidth], tables: [], single: []};
  for (const t of document.querySelectorAll("table")) {
    if (t.offsetParent === null) continue;
    const box = t.parentElement;
    out.tables.push({
      table: t.className, section: (t.closest("section") || {}).id || "",
      over: t.getBoundingClientRect().right - box.getBoundingClientRect().right,
      box: [box.scrollWidth, box.clientWidth],
      tallest: Math.max(...[...t.rows].map((r) => r.getBoundingClientRect().height)),
    });
  }
  for (const td of document.querySelectorAll("td.when, td.tok")) {
    out.single.push([td.textContent, lines(td)]);
  }
  const pre = document.createElement("pre");
  pre.id = "layout-probe";
  pre.textContent = JSON.stringify(out);
  document.body.append(pre);
});
"""
# A row of a history table taller than this has a column squeezed to a sliver (the lineage's
# parameters once took 476 px at 1,024 px wide; they take about 230 now).
_TALLEST_ROW_PX = 320
# Classes lay out lazily off screen (content-visibility: auto); the probe needs them laid out.
_EAGER = "<style>section.cls{content-visibility:visible!important}</style>"


@pytest.mark.parametrize("width", [1024, 1600])
def test_no_table_is_clipped_or_wrapped_badly_at_common_widths(
    page: Path, tmp_path: Path, width: int
) -> None:
    probed = tmp_path / "probed.html"
    html = page.read_text(encoding="utf-8")
    probed.write_text(
        html.replace("</body>", f"{_EAGER}<script>{_PROBE}</script></body>"), encoding="utf-8"
    )
    flags = [f"--window-size={width},900", "--virtual-time-budget=5000"]
    done = _run([*flags, "--dump-dom", probed.as_uri()], tmp_path / "profile")
    assert done.returncode == 0, done.stderr[-2000:]
    (pre,) = [p for p in parse(done.stdout).find_all("pre") if p.attrs.get("id") == "layout-probe"]
    found = json.loads(pre.all_text())

    scroll_width, client_width = found["page"]
    assert scroll_width <= client_width, f"the page scrolls sideways at {width} px"
    sections = {t["section"] for t in found["tables"]}
    assert {"matrix", "diff", "releases", "rollouts", "tuning", "lineage"} <= sections
    for table in found["tables"]:
        box_scroll, box_client = table["box"]
        assert table["over"] <= 1 and box_scroll <= box_client + 1, (
            f"at {width} px the {table['table']} table of {table['section']} is cut: {table}"
        )
    squeezed = [
        (t["section"], round(t["tallest"]))
        for t in found["tables"]
        if t["section"] in ("diff", "releases", "rollouts", "tuning", "lineage")
        and t["tallest"] > _TALLEST_ROW_PX
    ]
    assert not squeezed, f"at {width} px rows taller than {_TALLEST_ROW_PX} px: {squeezed}"
    wrapped = [(text, n) for text, n in found["single"] if n != 1]
    assert found["single"] and not wrapped, f"at {width} px these wrap: {wrapped}"

    shots = Path(os.environ.get("QUALIFY_SCREENSHOT_DIR", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    shot = shots / f"report-{width}.png"
    shoot = [f"--screenshot={shot}", f"--window-size={width},4000", "--virtual-time-budget=5000"]
    done = _run([*shoot, probed.as_uri()], tmp_path / "profile")
    assert done.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
