"""report.html, compare.html and efficiency.html in a real browser (headless Chromium,
offline, from file://): plotly.js, inlined packed, unpacks; nothing is logged to the console,
every figure has drawn data (counted by Plotly itself and in the rendered SVG), and on a
full-page screenshot every figure's plot area holds coloured marks where a blank page has none.
A report with one figure emptied must fail these checks (tested below), or they prove
nothing."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fsdp_trace
from fsdp_trace.render import plotlyjs
from fsdp_trace.render.report import COLORS, RENDERED_ATTRIBUTE, write_report
from tests.conftest import SAMPLES, run_cli
from tests.test_report import PAYLOAD_ID, gloo_run, single_gpu_trace
from tests.test_report_size import fnv1a, page_of_packed, samples_to_pack

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
BROWSER = os.environ.get("FSDP_TRACE_CHROMIUM") or next(
    (found for name in BROWSERS if (found := shutil.which(name))), None
)


def needs_browser(unchecked: str) -> list:
    """The marks of a browser test: slow, and skipped (saying what goes unchecked) without
    Chromium."""
    return [
        pytest.mark.slow,
        pytest.mark.skipif(
            BROWSER is None,
            reason="no Chromium found (apt-get install chromium; .ci/run installs it): "
            + unchecked,
        ),
    ]


pytestmark = needs_browser("the report is not checked in a browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    # Offline: any attempt to reach a host fails (and is logged to the console).
    "--host-resolver-rules=MAP * ~NOTFOUND",
    # Console messages and uncaught errors go to stderr as 'INFO:CONSOLE...' lines.
    "--enable-logging=stderr",
    "--v=0",
    # Run timers and animation frames until the page is idle (Plotly draws asynchronously).
    "--virtual-time-budget=30000",
]
CONSOLE = re.compile(r"CONSOLE[(:]\d*\)?\]? ?(.*)$|Uncaught.*$", re.MULTILINE)
WIDTH = 1400
PROBE_ATTRIBUTE = "data-test-probe"
# Added to a copy of the page by the test (the shipped page carries no test code): once the
# page says its figures are drawn (report.html: all of them at once; compare.html and
# efficiency.html: one count per figure drawn, up to their number of plotly divs), record per
# figure what Plotly holds (`_fullData`: finite points of visible traces, a category counting
# as a place on its axis; bars of zero length
# and NaN cells do not count), what the SVG shows (bar paths and markers with a non-empty box,
# heatmap images), and where its plot area is.
PROBE = """<script>
(function () {
  function finite(v) { return v !== null && v !== "" && isFinite(Number(v)); }
  function drawnPoints(t) {
    if (t.visible !== true) return 0;
    var n = 0, i, j;
    if (t.type === "heatmap") {
      for (i = 0; i < (t.z || []).length; i++)
        for (j = 0; j < (t.z[i] || []).length; j++) if (finite(t.z[i][j])) n++;
      return n;
    }
    if (t.type === "scatter" && !/markers|lines/.test(t.mode || "")) return 0;  // labels
    var x = t.x || [], y = t.y || [];
    var length = t.type === "bar" ? (t.orientation === "h" ? x : y) : null;
    for (i = 0; i < Math.max(x.length, y.length); i++) {
      if (t.type === "bar" ? finite(length[i]) && Number(length[i]) !== 0
                           : finite(x[i]) && (finite(y[i]) || typeof y[i] === "string")) n++;
    }
    return n;
  }
  function measure() {
    var out = {height: document.documentElement.scrollHeight, figures: {}};
    document.querySelectorAll(FIGURES).forEach(function (gd) {
      var points = (gd._fullData || []).reduce(function (s, t) { return s + drawnPoints(t); }, 0);
      var marks = 0;
      gd.querySelectorAll(".bars g.point path, .scatterlayer path.point, g.hm image")
        .forEach(function (el) {
          var box = el.getBBox();
          if (box.width > 0 && box.height > 0) marks++;
        });
      var rect = gd.getBoundingClientRect(), size = gd._fullLayout._size;
      out.figures[gd.id] = {
        points: points, marks: marks, traces: (gd._fullData || []).length,
        plot: [rect.left + size.l, rect.top + window.scrollY + size.t, size.w, size.h]
      };
    });
    document.body.setAttribute("__PROBE__", JSON.stringify(out));
  }
  (function wait() {
    var b = document.body, expected = document.querySelectorAll(FIGURES).length;
    if (Number(b.getAttribute("__DONE__")) >= expected || b.hasAttribute("__DONE__-error")
        || b.hasAttribute("data-fsdp-plotly-error")) measure();
    else setTimeout(wait, 50);
  })();
})();
</script>""".replace("__PROBE__", PROBE_ATTRIBUTE).replace("__DONE__", RENDERED_ATTRIBUTE)
# The figures' divs: report.html's, and those of plotly's own to_html (compare, efficiency).
PROBE = PROBE.replace("FIGURES", json.dumps("div.plot, div.plotly-graph-div"))
# A plot area is drawn when this share of its pixels (and at least MIN_MARK_PIXELS) is clearly
# coloured: axes, grid lines, text and the page are grey or white (channel spread < 40).
COLOURED_SPREAD = 40
MIN_MARK_SHARE = 0.004
MIN_MARK_PIXELS = 300


def chromium(url: str, *extra: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="fsdp-trace-chromium-") as profile:
        return subprocess.run(
            [BROWSER, *FLAGS, f"--user-data-dir={profile}", *extra, url],
            capture_output=True,
            text=True,
            timeout=180,
            cwd=profile,
        )


def console_lines(stderr: str) -> list[str]:
    return [m.group(0) for m in CONSOLE.finditer(stderr)]


def rendered(path: Path) -> tuple[str, list[str]]:
    """The DOM after the page settled, and what it logged to the console."""
    done = chromium(path.as_uri(), f"--window-size={WIDTH},2000", "--dump-dom")
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, console_lines(done.stderr)


def body_attributes(dom: str) -> dict[str, str]:
    body = re.search(r"<body([^>]*)>", dom)
    assert body, dom[:2000]
    return {k: html.unescape(v) for k, v in re.findall(r'([\w-]+)="([^"]*)"', body.group(1))}


def probed(page: Path, tmp: Path) -> tuple[dict, dict[str, str], list[str]]:
    """Load a copy of `page` with the probe: (probe result, <body> attributes, console)."""
    text = page.read_text(encoding="utf-8")
    copy = tmp / f"probed-{page.name}"
    end = text.rindex("</body>")
    copy.write_text(text[:end] + PROBE + text[end:], encoding="utf-8")
    dom, errors = rendered(copy)
    attributes = body_attributes(dom)
    assert PROBE_ATTRIBUTE in attributes, f"the probe never ran: {attributes}"
    return json.loads(attributes[PROBE_ATTRIBUTE]), attributes, errors


def check_page(attributes: dict[str, str], errors: list[str], n: int | None = None) -> int:
    """No console output; plotly.js unpacked; the page says all of its figures were drawn
    (`n`: their number where the page does not say it). Returns their number."""
    assert errors == [], errors
    assert "data-fsdp-plotly-error" not in attributes, attributes
    n = int(attributes["data-fsdp-figures"]) if n is None else n
    assert f"{RENDERED_ATTRIBUTE}-error" not in attributes, attributes
    assert attributes.get(RENDERED_ATTRIBUTE) == str(n), (
        f"the page never said all {n} figures were drawn: {attributes}"
    )
    return n


def undrawn_in_dom(probe: dict) -> dict[str, str]:
    """Figures with no data in Plotly's own model or nothing visible in their SVG."""
    return {
        key: f"{f['points']} points, {f['marks']} drawn marks, {f['traces']} traces"
        for key, f in probe["figures"].items()
        if f["points"] == 0 or f["marks"] == 0
    }


def screenshot(url: str, out: Path, height: int) -> np.ndarray:
    done = chromium(url, f"--window-size={WIDTH},{height}", f"--screenshot={out}")
    assert done.returncode == 0 and out.exists(), done.stderr[-3000:]
    assert console_lines(done.stderr) == []
    with Image.open(out) as image:
        assert image.size == (WIDTH, height)
        return np.asarray(image.convert("RGB"), dtype=np.float64)


def region(pixels: np.ndarray, box: list[float]) -> np.ndarray:
    x, y, w, h = (round(v) for v in box)
    return pixels[max(y, 0) : y + h, max(x, 0) : x + w]


def coloured(pixels: np.ndarray) -> int:
    return int((np.ptp(pixels, axis=-1) >= COLOURED_SPREAD).sum())


def blank_plot_areas(shot: np.ndarray, blank: np.ndarray, probe: dict) -> dict[str, str]:
    """Figures whose plot area on the screenshot is no more coloured than a blank page's."""
    problems = {}
    for key, figure in probe["figures"].items():
        area, empty = region(shot, figure["plot"]), region(blank, figure["plot"])
        assert area.size and area.shape == empty.shape, (key, figure["plot"], shot.shape)
        marks, baseline = coloured(area), coloured(empty)
        needed = max(MIN_MARK_PIXELS, MIN_MARK_SHARE * area.shape[0] * area.shape[1])
        if marks - baseline < needed:
            problems[key] = f"{marks} coloured pixels (blank page: {baseline}; need {needed:.0f})"
    return problems


def near(pixels: np.ndarray, color: str, tolerance: float = 24.0) -> int:
    rgb = np.array([int(color[i : i + 2], 16) for i in (1, 3, 5)], dtype=np.float64)
    return int((np.abs(pixels - rgb).max(axis=-1) <= tolerance).sum())


def full_check(page: Path, tmp: Path) -> tuple[dict[str, str], dict[str, str], dict]:
    """Everything the browser can tell about `page`: (figures undrawn in the DOM, figures
    blank on the screenshot, probe). The page must load without console output."""
    probe, attributes, errors = probed(page, tmp)
    n = check_page(attributes, errors, None if "data-fsdp-figures" in attributes else 1)
    assert len(probe["figures"]) == n
    height = int(probe["height"])
    blank_page = tmp / "blank.html"
    blank_page.write_text("<!DOCTYPE html><html><body></body></html>")
    blank = screenshot(blank_page.as_uri(), tmp / "blank.png", height)
    assert blank.std() < 1.0  # the control is uniform
    shot = screenshot(page.as_uri(), tmp / f"{page.stem}.png", height)
    if os.environ.get("FSDP_TRACE_KEEP_SCREENSHOT"):
        shutil.copy(tmp / f"{page.stem}.png", os.environ["FSDP_TRACE_KEEP_SCREENSHOT"])
    return undrawn_in_dom(probe), blank_plot_areas(shot, blank, probe), {"shot": shot, **probe}


def analyze(path):
    """Never the user's cache: these tests neither read nor write it."""
    return fsdp_trace.analyze(path, cache=False)


@pytest.fixture(scope="module")
def sample_report(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("browser") / "report.html"
    write_report(analyze(SAMPLES / "gpt-small-2gpu"), path)
    return path


def test_the_harness_sees_console_errors(tmp_path):
    """A control: a page that logs and throws must be caught, or the checks below prove
    nothing on this Chromium."""
    page = tmp_path / "bad.html"
    page.write_text(
        "<!DOCTYPE html><html><body><script>console.error('logged error');"
        "null.f();</script></body></html>"
    )
    _, errors = rendered(page)
    assert any("logged error" in e for e in errors), errors
    assert any("Uncaught" in e for e in errors), errors


def test_sample_report_draws_every_figure_full_page(sample_report, tmp_path):
    undrawn, blank, probe = full_check(sample_report, tmp_path)
    assert sorted(probe["figures"]) == [
        "fig-bandwidth",
        "fig-blocks",
        "fig-breakdown",
        "fig-heatmap",
        "fig-timeline",
        "fig-whatif",
    ]
    assert undrawn == {} and blank == {}, (undrawn, blank)
    figures = probe["figures"]
    run = analyze(SAMPLES / "gpt-small-2gpu").only
    timing = run.collectives[run.collectives["source"] == "timing"]
    # The breakdown: per trace (2 ranks, 2 detailed) a bar segment per part with a length.
    bars = [b for r in run.ranks + run.detailed if (b := run.rank_breakdown(r))]
    parts = sum(1 for b in bars for k, v in b.items() if k not in ("step", "step_us") and v)
    assert len(bars) == 4
    assert figures["fig-breakdown"]["points"] == parts
    # Plotly holds every collective of the bandwidth figure (kernels; more with transfers).
    assert figures["fig-bandwidth"]["points"] >= len(timing)
    # The heatmap is ranks × blocks, every cell finite.
    n_blocks = timing["block"].nunique()
    assert figures["fig-heatmap"]["points"] == 2 * n_blocks
    # The screenshot covers the whole page, the last figure included.
    shot = probe["shot"]
    assert shot.shape[0] >= max(f["plot"][1] + f["plot"][3] for f in figures.values())
    # Each figure shows its own colours, not just the timeline.
    expected = {
        "fig-timeline": ("compute", "AllGather", "ReduceScatter", "exposed"),
        "fig-blocks": ("ReduceScatter", "exposed"),
        "fig-bandwidth": ("AllGather", "ReduceScatter"),
        # Exposed transfer and waiting for peers, each in its own colour.
        "fig-breakdown": ("compute", "exposed", "waiting", "idle"),
    }
    for key, names in expected.items():
        area = region(shot, figures[key]["plot"])
        for name in names:
            count = near(area, COLORS[name])
            assert count > 200, f"{key}: {count} pixels of {name} {COLORS[name]}"
    heat = region(shot, figures["fig-heatmap"]["plot"])
    reds = ((heat[..., 0] - heat[..., 1:].max(axis=-1)) > 60).sum()
    assert reds > 0.3 * heat.shape[0] * heat.shape[1], reds  # most cells are shades of red


@pytest.mark.parametrize("case", ["cpu-gloo", "single-gpu"])
def test_other_inputs_draw_without_console_errors(tmp_path, case):
    source = (
        gloo_run(tmp_path / "gloo")
        if case == "cpu-gloo"
        else single_gpu_trace(tmp_path / "one.json")
    )
    path = tmp_path / "report.html"
    write_report(analyze(source), path)
    probe, attributes, errors = probed(path, tmp_path)
    assert check_page(attributes, errors) == len(probe["figures"]) >= 1
    assert undrawn_in_dom(probe) == {}


def empty_one_figure(page: Path, key: str, out: Path) -> Path:
    """A copy of the report whose figure `key` keeps its traces (legend, axes, layers) but has
    no data in them: what a regression that loses a figure's data would ship."""
    text = page.read_text(encoding="utf-8")
    payload = json.loads(plotlyjs.unpack_element(text, PAYLOAD_ID))
    (figure,) = [f["figure"] for f in payload["figures"] if f["id"] == key]
    for trace in figure["data"]:
        for field in ("x", "y", "z", "base", "hovertext", "text", "customdata"):
            if field in trace:
                trace[field] = []
    start = text.index(f'<script type="{plotlyjs.PACKED_TYPE}" id="{PAYLOAD_ID}"')
    end = text.index("</script>", start) + len("</script>")
    packed = plotlyjs.packed_element(PAYLOAD_ID, json.dumps(payload).encode("utf-8"))
    out.write_text(text[:start] + packed + text[end:], encoding="utf-8")
    return out


@pytest.mark.parametrize("key", ["fig-bandwidth", "fig-heatmap", "fig-breakdown"])
def test_a_report_with_one_figure_emptied_fails(sample_report, tmp_path, key):
    broken = empty_one_figure(sample_report, key, tmp_path / "broken.html")
    undrawn, blank, probe = full_check(broken, tmp_path)
    # The page itself still loads cleanly and says every figure was drawn ...
    assert len(probe["figures"]) == 6
    # ... and the emptied figure, only it, is caught by both checks.
    assert set(undrawn) == {key}, undrawn
    assert set(blank) == {key}, blank
    assert probe["figures"][key]["traces"] > 0  # its traces (and layer groups) still exist


def test_several_runs_draw_without_console_errors(tmp_path):
    """Two runs on one page: every figure of both drawn (their ids are unique per run)."""
    path = tmp_path / "report.html"
    write_report(
        fsdp_trace.analyze([SAMPLES / "gpt-small-2gpu", SAMPLES / "gpt-small-1gpu"], cache=False),
        path,
    )
    probe, attributes, errors = probed(path, tmp_path)
    # gpt-small-2gpu: 6 figures; the 1-GPU run: breakdown and timeline (no change to predict).
    assert check_page(attributes, errors) == len(probe["figures"]) == 6 + 2
    assert undrawn_in_dom(probe) == {}


def test_compare_page_draws_without_console_errors(tmp_path):
    """compare.html: plotly.js (packed) defined before plotly's own figure script runs; the
    chart drawn, bars and lines, with its colours on the screenshot."""
    from fsdp_trace.render.compare import EFFICIENCY, THROUGHPUT

    page = tmp_path / "compare.html"
    runs = [
        SAMPLES / "gpt-small-1gpu",
        SAMPLES / "gpt-small-2gpu",
        SAMPLES / "gpt-small-2gpu-fullac",
    ]
    done = run_cli("compare", *map(str, runs), "--no-traces", "--html", str(page))
    assert done.returncode == 0, done.stderr
    undrawn, blank, probe = full_check(page, tmp_path)
    assert undrawn == {} and blank == {}, (undrawn, blank)
    ((key, chart),) = probe["figures"].items()
    # Three bars, and markers on the lines (scaling efficiency of both 2-GPU runs at least).
    assert chart["points"] == 3 and chart["marks"] >= 3 + 2, chart
    area = region(probe["shot"], chart["plot"])
    for color in (THROUGHPUT, EFFICIENCY):
        assert near(area, color) > 200, (key, color)


def test_efficiency_page_draws_without_console_errors(tmp_path):
    """efficiency.html of the committed sweep, regenerated: every panel's points drawn."""
    from fsdp_trace.render.efficiency import COLORS as WORLD_COLORS

    page = tmp_path / "efficiency.html"
    sweep = SAMPLES / "sweep-gpt-1.3b-b14"
    repeats = sorted(p for p in sweep.iterdir() if p.is_dir())
    done = run_cli("plot", *map(str, repeats), "--out", str(page))
    assert done.returncode == 0, done.stderr
    undrawn, blank, probe = full_check(page, tmp_path)
    assert undrawn == {} and blank == {}, (undrawn, blank)
    ((key, chart),) = probe["figures"].items()
    # A point a coverage on each median line and a dot a run beside it: 2 GPUs in 5 panels,
    # 1 GPU in 3 (no efficiency or exposed %), and the best point's star in each panel.
    points = len({p.name.split("-")[0] for p in repeats[0].iterdir()})
    assert chart["points"] == points * (1 + len(repeats)) * (5 + 3) + 5, chart
    area = region(probe["shot"], chart["plot"])
    for color in WORLD_COLORS[:2]:
        assert near(area, color) > 200, (key, color)


def test_the_committed_efficiency_page_draws(tmp_path):
    """sample_traces/sweep-gpt-1.3b-b14/efficiency.html as committed (packed plotly.js)."""
    page = tmp_path / "efficiency.html"
    shutil.copy(SAMPLES / "sweep-gpt-1.3b-b14" / "efficiency.html", page)
    probe, attributes, errors = probed(page, tmp_path)
    assert check_page(attributes, errors, 1) == len(probe["figures"]) == 1
    assert undrawn_in_dom(probe) == {}


def test_the_page_unpacks_what_python_packed(tmp_path):
    """static/unpack.js against plotlyjs.pack on edge cases (empty, incompressible, long
    repeats, escaped groups, text beyond ASCII): the same bytes, and nothing on the console."""
    dom, errors = rendered(page_of_packed(tmp_path / "packed.html"))
    assert errors == [], errors
    unpacked = json.loads(body_attributes(dom)["data-unpacked"])
    expected = {k: [len(v), fnv1a(v)] for k, v in samples_to_pack().items()}
    assert unpacked == expected


def test_a_damaged_plotly_js_is_said_on_the_page(sample_report, tmp_path):
    """A page whose packed plotly.js was cut short says so at its top and on <body>, and the
    report's script marks the figures as not drawn (no silent blank page)."""
    text = sample_report.read_text(encoding="utf-8")
    start = text.index(f'id="{plotlyjs.PLOTLY_ID}"')
    start = text.index(">", start) + 1
    broken = tmp_path / "broken.html"
    broken.write_text(
        text[:start] + text[start + 1000 : start + 20000] + text[text.index("</script>", start) :],
        encoding="utf-8",
    )
    dom, errors = rendered(broken)
    attributes = body_attributes(dom)
    assert "data-fsdp-plotly-error" in attributes, attributes
    assert f"{RENDERED_ATTRIBUTE}-error" in attributes and RENDERED_ATTRIBUTE not in attributes
    assert "plotly.js could not be unpacked" in dom
    assert any("Uncaught" in e for e in errors), errors
