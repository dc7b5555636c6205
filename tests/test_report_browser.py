"""report.html in a real browser (headless Chromium, offline, from file://): every figure is
drawn, nothing is logged to the console, and the page does not look blank."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fsdp_trace.analyze import analyze
from fsdp_trace.render.report import COLORS, RENDERED_ATTRIBUTE, write_report
from tests.conftest import SAMPLES
from tests.test_report import gloo_run, single_gpu_trace

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
BROWSER = os.environ.get("FSDP_TRACE_CHROMIUM") or next(
    (found for name in BROWSERS if (found := shutil.which(name))), None
)
pytestmark = pytest.mark.skipif(
    BROWSER is None,
    reason="no Chromium found (apt-get install chromium; .ci/run installs it): "
    "the report is not checked in a browser",
)
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
WIDTH, HEIGHT = 1400, 2200


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
    done = chromium(path.as_uri(), "--dump-dom")
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, console_lines(done.stderr)


def check_drawn(dom: str, errors: list[str]) -> None:
    assert errors == [], errors
    body = re.search(r"<body([^>]*)>", dom)
    assert body, dom[:2000]
    attributes = dict(re.findall(r'([\w-]+)="([^"]*)"', body.group(1)))
    n = int(attributes["data-fsdp-figures"])
    assert n >= 1
    assert f"{RENDERED_ATTRIBUTE}-error" not in attributes, attributes
    assert attributes.get(RENDERED_ATTRIBUTE) == str(n), (
        f"the page never said all {n} figures were drawn: {attributes}"
    )
    # Each figure's div holds Plotly's SVG with at least one drawn trace.
    for key in re.findall(r'<div class="plot[^"]*" id="(fig-[a-z]+)"', dom):
        start = dom.index(f'id="{key}"')
        block = dom[start : start + 200_000]
        assert "main-svg" in block, key
        assert re.search(r'class="(trace bars|scatterlayer|hm|heatmaplayer)', block), key


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


def test_sample_report_draws_every_figure_without_console_errors(sample_report):
    dom, errors = rendered(sample_report)
    check_drawn(dom, errors)
    assert int(re.search(r'data-fsdp-figures="(\d+)"', dom).group(1)) == 4


@pytest.mark.parametrize("case", ["cpu-gloo", "single-gpu"])
def test_other_inputs_draw_without_console_errors(tmp_path, case):
    source = (
        gloo_run(tmp_path / "gloo")
        if case == "cpu-gloo"
        else single_gpu_trace(tmp_path / "one.json")
    )
    path = tmp_path / "report.html"
    write_report(analyze(source), path)
    check_drawn(*rendered(path))


def near(pixels: np.ndarray, color: str, tolerance: float = 24.0) -> int:
    rgb = np.array([int(color[i : i + 2], 16) for i in (1, 3, 5)], dtype=np.float64)
    return int((np.abs(pixels - rgb).max(axis=-1) <= tolerance).sum())


def screenshot(url: str, out: Path) -> np.ndarray:
    done = chromium(url, f"--window-size={WIDTH},{HEIGHT}", f"--screenshot={out}")
    assert done.returncode == 0 and out.exists(), done.stderr[-3000:]
    assert console_lines(done.stderr) == []
    with Image.open(out) as image:
        assert image.size == (WIDTH, HEIGHT)
        return np.asarray(image.convert("RGB"), dtype=np.float64)


def test_screenshot_is_clearly_not_a_blank_page(sample_report, tmp_path):
    blank_page = tmp_path / "blank.html"
    blank_page.write_text("<!DOCTYPE html><html><body></body></html>")
    blank = screenshot(blank_page.as_uri(), tmp_path / "blank.png")
    shot = screenshot(sample_report.as_uri(), tmp_path / "report.png")
    if os.environ.get("FSDP_TRACE_KEEP_SCREENSHOT"):
        shutil.copy(tmp_path / "report.png", os.environ["FSDP_TRACE_KEEP_SCREENSHOT"])

    assert blank.std() < 1.0  # the control is uniform
    background = np.median(shot.reshape(-1, 3), axis=0)
    differs = (np.abs(shot - background).max(axis=-1) > 16).mean()
    assert differs > 0.15, f"only {differs:.1%} of the page differs from its background"
    assert shot.std() > 20 * max(blank.std(), 1.0)
    coarse = (shot // 8).astype(np.int64)
    distinct = np.unique(coarse[..., 0] << 10 | coarse[..., 1] << 5 | coarse[..., 2]).size
    assert distinct > 200, distinct
    # The figures' own colors are on screen, not just text.
    for name in ("compute", "AllGather", "ReduceScatter", "exposed"):
        count = near(shot, COLORS[name])
        assert count > 2000, f"{name}: {count} pixels of {COLORS[name]}"
