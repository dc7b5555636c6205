"""Regenerate the README's pictures from the shipped samples, or check that they are current:

    python scripts/readme_images.py            # write them (the PNGs need headless Chromium)
    python scripts/readme_images.py --check    # exit 1, saying what drifted, where they are not

docs/images/terminal.svg   what `fsdp-trace analyze sample_traces/gpt-small-2gpu --top 10
                           --no-report` prints at 150 columns, in colour (rich's SVG export of
                           the command's own output); --check compares its text, line by line,
                           with the command's output now
docs/images/report.png     the HTML report of that run, the whole page at 1400 px (headless
                           Chromium); the PNG carries what the page says (verdict, cards,
                           findings, panels: `page_summary`) in a text chunk, which --check
                           compares with the report made now (no browser needed)
docs/images/efficiency.png the committed AC-coverage sweep's efficiency.html (made by
                           `fsdp-trace plot r1 r2 r3` in sample_traces/sweep-gpt-1.3b-b14)
"""

from __future__ import annotations

import argparse
import html
import io
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

IMAGES = ROOT / "docs" / "images"
SAMPLE = "sample_traces/gpt-small-2gpu"
COMMAND = ["analyze", SAMPLE, "--top", "10", "--no-report"]
WIDTH = 150
SUMMARY_KEY = "fsdp-trace:page"  # the PNG's text chunk holding `page_summary`


def command_output(color: bool) -> str:
    """What `fsdp-trace COMMAND` prints at WIDTH columns (with its colours, or plain)."""
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    env.update(COLUMNS=str(WIDTH), FSDP_TRACE_QUIET="1", **({"FORCE_COLOR": "1"} if color else {}))
    done = subprocess.run(
        [sys.executable, "-m", "fsdp_trace", *COMMAND],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    if done.returncode != 0:
        raise SystemExit(f"fsdp-trace {' '.join(COMMAND)} failed: {done.stderr[-2000:]}")
    return done.stdout


def write_svg(path: Path) -> None:
    from rich.console import Console
    from rich.text import Text

    console = Console(record=True, width=WIDTH, file=io.StringIO(), force_terminal=True)
    console.print(Text.from_ansi(command_output(color=True)), end="", soft_wrap=True)
    console.save_svg(str(path), title="fsdp-trace " + " ".join(COMMAND))


CHARACTER = re.compile(r'class="terminal-\d+-matrix"[^}]*?font-size: (\d+(?:\.\d+)?)px', re.S)
TEXT = re.compile(
    r'<text class="[^"]*" x="([\d.]+)" y="[\d.]+" textLength="[\d.]+" '
    r'clip-path="url\(#[\w-]+-line-(\d+)\)">(.*?)</text>'
)


def svg_lines(svg: str) -> list[str]:
    """The text of a rich SVG export, line by line (each run of text put back at its column)."""
    size = CHARACTER.search(svg)
    width = float(size.group(1)) * 0.61 if size else 12.2  # rich's character width
    lines: dict[int, list[str]] = {}
    for x, line, text in TEXT.findall(svg):
        row = lines.setdefault(int(line), [])
        column = round(float(x) / width)
        content = html.unescape(text).replace("\xa0", " ")
        row.extend([" "] * (column - len(row)))
        row[column : column + len(content)] = content
    last = max(lines, default=-1)
    return ["".join(lines.get(i, [])).rstrip() for i in range(last + 1)]


def printed_lines(output: str) -> list[str]:
    lines = [line.rstrip() for line in output.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def page_summary(result) -> dict:
    """What report.png must show of the report made now: the verdict, every card, the
    diagnosis (heading and numbered titles), the what-if table's changes and the panels."""
    from fsdp_trace.present.view import run_view
    from fsdp_trace.render.report import panels

    run = result.only
    view = run_view(run, top=None)
    return {
        "verdict": view.verdict,
        "cards": [f"{c.label}: {c.value}" for c in [*view.run_figures, *view.cards]],
        "diagnosis": view.diagnosis_heading,
        "findings": [f"{f.number}. {f.title}" for f in view.findings],
        "panels": [p.title for p in panels.build(run, view)],
    }


def analyzed():
    import fsdp_trace

    result = fsdp_trace.analyze(ROOT / SAMPLE)
    result.inputs = [SAMPLE]
    return result


def write_png(result, path: Path) -> None:
    from PIL import Image, PngImagePlugin

    from fsdp_trace.render.report import write_report
    from tests.test_report_browser import BROWSER, chromium, probed

    if BROWSER is None:
        raise SystemExit("no Chromium: install it (apt-get install chromium) for the PNGs")
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.html"
        write_report(result, report)
        probe, _, errors = probed(report, Path(tmp))  # the page's full height, once drawn
        if errors:
            raise SystemExit(f"the report logged to the console: {errors}")
        shot = Path(tmp) / "report.png"
        screenshot(chromium, report, shot, 1400, int(probe["height"]))
        info = PngImagePlugin.PngInfo()
        info.add_text(SUMMARY_KEY, json.dumps(page_summary(result), ensure_ascii=False))
        with Image.open(shot) as image:  # 256 colours: a third of the size, the same to read
            flat = image.convert("RGB").quantize(256, Image.Quantize.MEDIANCUT, dither=0)
            flat.save(path, pnginfo=info, optimize=True)


def screenshot(chromium, html_path: Path, png: Path, width: int, height: int) -> None:
    done = chromium(html_path.as_uri(), f"--window-size={width},{height}", f"--screenshot={png}")
    if done.returncode != 0 or not png.exists():
        raise SystemExit(f"chromium failed on {html_path}: {done.stderr[-500:]}")


def drift() -> list[str]:
    """What differs between the pictures and what the code makes now (empty: current)."""
    from PIL import Image

    problems = []
    svg = svg_lines((IMAGES / "terminal.svg").read_text(encoding="utf-8"))
    printed = printed_lines(command_output(color=False))
    if svg != printed:
        first = next(
            (i for i, (a, b) in enumerate(zip(svg, printed, strict=False)) if a != b),
            min(len(svg), len(printed)),
        )
        problems.append(
            f"docs/images/terminal.svg: line {first + 1} differs from what `fsdp-trace "
            f"{' '.join(COMMAND)}` prints at {WIDTH} columns:\n  picture: "
            f"{svg[first] if first < len(svg) else '(none)'!r}\n  command: "
            f"{printed[first] if first < len(printed) else '(none)'!r}"
        )
    with Image.open(IMAGES / "report.png") as image:
        shown = json.loads(image.text.get(SUMMARY_KEY, "{}"))
    now = page_summary(analyzed())
    for key in now:
        if shown.get(key) != now[key]:
            problems.append(
                f"docs/images/report.png: its {key} is {shown.get(key)!r}, the report's now "
                f"{now[key]!r}"
            )
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 where a picture drifted")
    if parser.parse_args().check:
        problems = drift()
        if problems:
            print("\n".join(problems), file=sys.stderr)
            print("run `python scripts/readme_images.py` (needs Chromium)", file=sys.stderr)
            raise SystemExit(1)
        print("the README's pictures are current")
        return
    IMAGES.mkdir(parents=True, exist_ok=True)
    write_svg(IMAGES / "terminal.svg")
    write_png(analyzed(), IMAGES / "report.png")
    from tests.test_report_browser import chromium

    sweep = ROOT / "sample_traces" / "sweep-gpt-1.3b-b14" / "efficiency.html"
    # the figure's own height (it grows with the notes under it), and the page's margins
    height = int(re.search(r"height:(\d+)px", sweep.read_text(encoding="utf-8")).group(1))
    screenshot(chromium, sweep, IMAGES / "efficiency.png", 1420, height + 30)
    print(f"wrote {', '.join(p.name for p in sorted(IMAGES.iterdir()))}")


if __name__ == "__main__":
    main()
