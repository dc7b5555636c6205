"""The pages' layout in headless Chromium at 1024 and 1400 px: report.html, compare.html and
efficiency.html never scroll sideways (the page, or a table inside it: compare.html's table
once ran past a 1400 px window and the report's idle column scrolled away at 1024), no text
of a figure runs out of it (efficiency.html's footnote ran off the page), plotly's toolbar
never covers a legend entry, and no panel's caption repeats its heading ("Per rank" / "Per
rank (median…)", "Profiler distortion" twice). Each check is shown to catch its problem on a
page made to have it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from fsdp_trace.render.report import RENDERED_ATTRIBUTE, write_report
from tests.conftest import SAMPLES, run_cli
from tests.test_report_browser import body_attributes, check_page, chromium, needs_browser

pytestmark = needs_browser("the pages' layout is not checked in a browser")
WIDTHS = (1024, 1400)
LAYOUT = "data-layout-probe"
# Added to a copy of the page: once every figure is drawn, what overflows, per check.
PROBE = """<script>
(function () {
  var FIGURES = "div.plot, div.plotly-graph-div";
  function box(el) {
    var r = el.getBoundingClientRect();
    return [r.left, r.top, r.right, r.bottom];
  }
  function overlap(a, b) {
    return a[0] < b[2] - 1 && b[0] < a[2] - 1 && a[1] < b[3] - 1 && b[1] < a[3] - 1;
  }
  function name(el) {
    var cls = typeof el.className === "string" && el.className ? "." + el.className : "";
    return el.tagName.toLowerCase() + cls + (el.id ? "#" + el.id : "");
  }
  function measure() {
    var root = document.documentElement, width = root.clientWidth;
    var out = {viewport: width, scrollWidth: root.scrollWidth, scrollers: [], outside: [],
               covered: [], repeated: [], figures: 0};
    document.querySelectorAll("body *").forEach(function (el) {
      var style = getComputedStyle(el);
      if (/auto|scroll/.test(style.overflowX) && el.scrollWidth > el.clientWidth + 1)
        out.scrollers.push(name(el) + " " + el.scrollWidth + " > " + el.clientWidth);
    });
    document.querySelectorAll(FIGURES).forEach(function (gd) {
      out.figures++;
      var own = box(gd), left = Math.max(own[0], 0), right = Math.min(own[2], width);
      gd.querySelectorAll("svg text").forEach(function (t) {
        var r = box(t);
        if (r[2] - r[0] > 0 && (r[0] < left - 1 || r[2] > right + 1))
          out.outside.push((gd.id || "figure") + ": " + t.textContent.slice(0, 80));
      });
      var bar = gd.querySelector(".modebar");
      if (bar) {
        var b = box(bar);
        gd.querySelectorAll(".legend .traces").forEach(function (entry) {
          if (overlap(b, box(entry)))
            out.covered.push((gd.id || "figure") + ": " + entry.textContent);
        });
      }
    });
    document.querySelectorAll("section.panel").forEach(function (panel) {
      var h = panel.querySelector("h2");
      if (!h) return;
      var heading = h.textContent.trim().toLowerCase();
      panel.querySelectorAll("p.caption, summary").forEach(function (c) {
        if (c.textContent.trim().toLowerCase().indexOf(heading) === 0)
          out.repeated.push(h.textContent.trim() + " / " + c.textContent.trim().slice(0, 60));
      });
    });
    document.body.setAttribute("__LAYOUT__", JSON.stringify(out));
  }
  (function wait() {
    var b = document.body, n = document.querySelectorAll(FIGURES).length;
    if (Number(b.getAttribute("__DONE__")) >= n || b.hasAttribute("__DONE__-error")
        || b.hasAttribute("data-fsdp-plotly-error")) setTimeout(measure, 300);
    else setTimeout(wait, 50);
  })();
})();
</script>""".replace("__LAYOUT__", LAYOUT).replace("__DONE__", RENDERED_ATTRIBUTE)


def layout(page: Path, width: int, tmp: Path) -> dict:
    """The probe's findings on `page` in a window `width` px wide (and a screenshot, kept where
    FSDP_TRACE_KEEP_SCREENSHOT names a folder)."""
    text = page.read_text(encoding="utf-8")
    end = text.rindex("</body>")
    copy = tmp / f"layout-{width}-{page.name}"
    copy.write_text(text[:end] + PROBE + text[end:], encoding="utf-8")
    done = chromium(copy.as_uri(), f"--window-size={width},1200", "--dump-dom")
    assert done.returncode == 0, done.stderr[-3000:]
    attributes = body_attributes(done.stdout)
    assert LAYOUT in attributes, f"the probe never ran: {sorted(attributes)}"
    found = json.loads(attributes[LAYOUT])
    assert found["viewport"] == width, found
    keep = os.environ.get("FSDP_TRACE_KEEP_SCREENSHOT")
    if keep:
        shot = tmp / f"{page.stem}-{width}.png"
        chromium(page.as_uri(), f"--window-size={width},3000", f"--screenshot={shot}")
        shutil.copy(shot, Path(keep) / shot.name)
    return found


def problems(found: dict) -> dict:
    out = {k: found[k] for k in ("scrollers", "outside", "covered", "repeated") if found[k]}
    if found["scrollWidth"] > found["viewport"]:
        out["page"] = f"scroll width {found['scrollWidth']} > {found['viewport']}"
    return out


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, Path]:
    import fsdp_trace

    folder = tmp_path_factory.mktemp("pages")
    report = folder / "report.html"
    write_report(fsdp_trace.analyze(SAMPLES / "gpt-small-2gpu", cache=False), report)
    compare = folder / "compare.html"
    runs = ("gpt-small-1gpu", "gpt-small-2gpu", "gpt-small-2gpu-fullac")
    done = run_cli("compare", *(str(SAMPLES / r) for r in runs), "--html", str(compare))
    assert done.returncode == 0, done.stderr
    efficiency = folder / "efficiency.html"
    sweep = SAMPLES / "sweep-gpt-1.3b-b14"
    repeats = [str(sweep / r) for r in ("r1", "r2", "r3")]  # its notes: the most footnotes
    done = run_cli("plot", *repeats, "--no-traces", "--out", str(efficiency))
    assert done.returncode == 0, done.stderr
    return {"report": report, "compare": compare, "efficiency": efficiency}


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("page", ["report", "compare", "efficiency"])
def test_each_page_fits_its_window(pages, page, width, tmp_path):
    found = layout(pages[page], width, tmp_path)
    assert found["figures"] >= 1
    assert problems(found) == {}, problems(found)


def test_the_checks_catch_each_problem(pages, tmp_path):
    """A page with each problem made on purpose: a table wider than the window, a figure's
    text placed beyond its right edge, the toolbar moved onto the legend, a caption that
    repeats its heading. Each is caught, by its own check."""
    text = pages["report"].read_text(encoding="utf-8")
    css = (  # a wide column; the toolbar back on the figure's top edge, where the legend is
        "<style>table.data td.num{min-width:400px}"
        "div.plot{margin-top:0} div.plot .modebar-container{top:0!important}</style>"
    )
    repeated = '<p class="caption">Per rank (median and min–max over the profiled steps)</p>'
    broken = text.replace("</head>", css + "</head>", 1).replace(
        "<h2>Per rank</h2>", "<h2>Per rank</h2>" + repeated, 1
    )
    assert broken != text and "<h2>Per rank</h2>" + repeated in broken
    page = tmp_path / "broken.html"
    page.write_text(broken, encoding="utf-8")
    found = problems(layout(page, 1024, tmp_path))
    assert found.get("scrollers"), found
    assert found.get("covered"), found
    (repeat,) = found.get("repeated", [])
    assert repeat.startswith("Per rank / Per rank (median and min–max"), repeat
    assert not found.get("outside"), found
    # A footnote past the figure's right edge (as efficiency.html's ran off the page).
    efficiency = pages["efficiency"].read_text(encoding="utf-8")
    long = "x" * 400
    page = tmp_path / "long.html"
    page.write_text(efficiency.replace("Exposed % and recompute %", long, 1), encoding="utf-8")
    assert long in page.read_text(encoding="utf-8")
    assert any(long[:80] in t for t in layout(page, 1024, tmp_path)["outside"])


def test_the_pages_still_draw(pages, tmp_path):
    """(The layout changes leave the figures drawn and the console quiet.)"""
    from tests.test_report_browser import probed

    for key in ("report", "compare"):
        probe, attributes, errors = probed(pages[key], tmp_path)
        n = None if "data-fsdp-figures" in attributes else 1
        assert check_page(attributes, errors, n) == len(probe["figures"])
