"""Regenerate the README's pictures from the shipped samples:

    python scripts/readme_images.py

docs/images/terminal.svg   `fsdp-trace analyze sample_traces/gpt-small-2gpu` (rich's SVG export)
docs/images/report.png     the HTML report of that run, the whole page (headless Chromium)
docs/images/efficiency.png the committed AC-coverage sweep's efficiency.html (made by
                           `fsdp-trace plot r1 r2 r3 --no-traces --out efficiency.html` in
                           sample_traces/sweep-gpt-1.3b-b14)
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402

import fsdp_trace  # noqa: E402
from fsdp_trace.render import terminal  # noqa: E402
from fsdp_trace.render.report import write_report  # noqa: E402
from tests.test_report_browser import BROWSER, chromium, probed  # noqa: E402

IMAGES = ROOT / "docs" / "images"


def screenshot(html: Path, png: Path, width: int, height: int) -> None:
    done = chromium(html.as_uri(), f"--window-size={width},{height}", f"--screenshot={png}")
    if done.returncode != 0 or not png.exists():
        raise SystemExit(f"chromium failed on {html}: {done.stderr[-500:]}")


def main() -> None:
    IMAGES.mkdir(parents=True, exist_ok=True)
    sample = ROOT / "sample_traces" / "gpt-small-2gpu"
    result = fsdp_trace.analyze(sample)
    result.inputs = ["sample_traces/gpt-small-2gpu"]
    console = Console(record=True, width=150, file=open("/dev/null", "w"))  # noqa: SIM115
    terminal.render(result, console=console, top=10)
    console.save_svg(str(IMAGES / "terminal.svg"), title="fsdp-trace analyze")
    if BROWSER is None:
        raise SystemExit("no Chromium: install it (apt-get install chromium) for the PNGs")
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.html"
        write_report(result, report)
        probe, _, errors = probed(report, Path(tmp))  # the page's full height, once drawn
        if errors:
            raise SystemExit(f"the report logged to the console: {errors}")
        screenshot(report, IMAGES / "report.png", 1400, int(probe["height"]))
    sweep = ROOT / "sample_traces" / "sweep-gpt-1.3b-b14" / "efficiency.html"
    # the figure's own height (it grows with the notes under it), and the page's margins
    height = int(re.search(r"height:(\d+)px", sweep.read_text(encoding="utf-8")).group(1))
    screenshot(sweep, IMAGES / "efficiency.png", 1420, height + 30)
    print(f"wrote {', '.join(p.name for p in sorted(IMAGES.iterdir()))}")


if __name__ == "__main__":
    main()
