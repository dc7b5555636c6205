"""The page's layout: the header, each run's headline (verdict, run.json figures, per-rank
cards, notices) and its panels (`panels.PANELS`, in order; half-width panels paired), and the
document around them: the stylesheet and script shipped in `static/`, plotly.js inlined once,
packed (`fsdp_trace.render.plotlyjs`: the file opens offline), every figure stored once as
JSON (packed too: `fsdp-figures`) and drawn by `static/report.js`, which sets
`data-fsdp-rendered` on <body> once all of them have drawn."""

from __future__ import annotations

import json
import math
import time
from functools import cache
from importlib import resources
from typing import Any

from fsdp_trace import __version__
from fsdp_trace.present.view import RunView, run_view, side_by_side
from fsdp_trace.render import plotlyjs
from fsdp_trace.render.report import markup, panels
from fsdp_trace.render.report.markup import esc
from fsdp_trace.render.report.panels import Panel
from fsdp_trace.render.report.style import COLORS, FONT, RENDERED_ATTRIBUTE
from fsdp_trace.result import Result, RunAnalysis


@cache
def static(name: str) -> str:
    """A file shipped in the package's static/ folder."""
    return resources.files(__package__).joinpath("static", name).read_text(encoding="utf-8")


def _template() -> dict[str, Any]:
    import plotly.io as pio
    from plotly.io.json import to_json_plotly

    template = json.loads(to_json_plotly(pio.templates["plotly_white"].to_plotly_json()))
    layout = template.setdefault("layout", {})
    layout["font"] = {"family": FONT, "size": 12, "color": "#2a2f36"}
    layout["hoverlabel"] = {"font": {"family": FONT, "size": 12}, "align": "left"}
    layout["paper_bgcolor"] = "rgba(0,0,0,0)"
    return template


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _figure_json(fig) -> dict[str, Any]:
    data = json.loads(fig.to_json())
    data.get("layout", {}).pop("template", None)
    return _json_safe(data)


def _packed_json(element_id: str, payload: Any) -> str:
    """`payload` as JSON in a packed element (`plotlyjs.packed_element`): no '<' in the page,
    so no '</script>' or '<!--', and ~10× smaller than the JSON."""
    text = json.dumps(payload, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    return plotlyjs.packed_element(element_id, text.encode("utf-8"))


class Page:
    """The page being assembled: its HTML parts and the figures to draw, with ids unique
    across runs (`suffix`: "" for a single run, "-2" for the second of several)."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.figures: list[dict[str, Any]] = []

    def panel(self, p: Panel, suffix: str) -> str:
        pid = f"{p.key}{suffix}"
        if p.figure is not None:
            plot = f'<div class="plot" id="fig-{pid}" data-figure="{esc(p.key)}"></div>'
            self.figures.append({"id": f"fig-{pid}", "figure": _figure_json(p.figure)})
        else:
            plot = f'<p class="missing">{esc(p.missing)}</p>' if p.missing else ""
        caption = f'<p class="caption">{esc(p.caption)}</p>' if p.caption else ""
        return (
            f'<section class="panel" id="{esc(pid)}" data-panel="{esc(p.key)}">'
            f"<h2>{esc(p.title)}</h2>{caption}{plot}{p.body}</section>"
        )

    def panels(self, items: list[Panel], suffix: str) -> str:
        """Every panel, consecutive half-width ones two to a row."""
        out, i = [], 0
        while i < len(items):
            if items[i].half and i + 1 < len(items) and items[i + 1].half:
                pair = self.panel(items[i], suffix) + self.panel(items[i + 1], suffix)
                out.append(f'<div class="row">{pair}</div>')
                i += 2
            else:
                out.append(self.panel(items[i], suffix))
                i += 1
        return "".join(out)


def _header(result: Result, views: list[RunView]) -> str:
    meta = [f'<div class="meta inputs">{esc(", ".join(result.inputs))}</div>']
    if len(views) == 1:
        meta.insert(0, f'<div class="meta description"><b>{esc(views[0].description)}</b></div>')
    else:
        meta.append(f'<div class="meta">{esc(result.grouping)}</div>')
    return f"<header><h1>fsdp-trace report</h1>{''.join(meta)}</header>"


def _headline(view: RunView, several: bool) -> str:
    """What a reader needs first: the verdict, the run's own figures, the per-rank cards."""
    name = (
        f'<h2 class="run-name">{esc(view.name)}</h2>'
        f'<div class="description">{esc(view.description)}</div>'
        if several
        else ""
    )
    return (
        name
        + markup.verdict(view)
        + '<div class="headline">'
        + markup.cards(view.run_figures, "run", "Un-profiled steps (run.json)")
        + markup.cards(view.cards, "ranks", "Profiled steps, per rank (the worst rank shown)")
        + "</div>"
        + markup.notices(view.notices, "run")
    )


def _run(page: Page, run: RunAnalysis, view: RunView, index: int, several: bool) -> str:
    suffix = f"-{index + 1}" if several else ""
    body = _headline(view, several) + page.panels(panels.build(run, view), suffix)
    return f'<section class="run" id="run{suffix}" data-run="{esc(view.name)}">{body}</section>'


def _style() -> str:
    """The shipped stylesheet, after the colours and font it uses as CSS variables."""
    names = {"compute": "compute", "AllGather": "ag", "ReduceScatter": "rs", "exposed": "exposed"}
    names |= {"waiting": "waiting", "idle": "idle"}
    variables = "".join(f"--{css}:{COLORS[key]};" for key, css in names.items())
    return f":root{{{variables}--font:{FONT};}}\n{static('report.css')}"


def render(result: Result) -> str:
    """The whole page of `result` (one run, or several side by side then one after another)."""
    views = [run_view(run, top=None) for run in result.runs]
    for view in views:
        view.peers = result.runs  # the what-if panel's measured points
    several = len(views) > 1
    page = Page()
    main = [markup.notices(result.input_notices, "result")]
    compared = side_by_side(result)
    if compared is not None:
        main.append(
            '<section class="panel" id="runs" data-panel="runs"><h2>Runs side by side</h2>'
            f"{markup.table(compared, heading='Runs side by side')}</section>"
        )
    main += [
        _run(page, run, view, i, several)
        for i, (run, view) in enumerate(zip(result.runs, views, strict=True))
    ]
    payload = {"attribute": RENDERED_ATTRIBUTE, "template": _template(), "figures": page.figures}
    title = "fsdp-trace report" + (f" — {views[0].name}" if len(views) == 1 else "")
    footer = (
        f"<footer>fsdp-trace {esc(__version__)} · {time.strftime('%Y-%m-%d %H:%M %Z')} · "
        "self-contained: opens offline</footer>"
    )
    return "".join(
        [
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{esc(title)}</title><style>{_style()}</style></head>",
            f'<body data-fsdp-figures="{len(page.figures)}">',
            _header(result, views),
            f"<main>{''.join(main)}</main>",
            footer,
            plotlyjs.script(),
            _packed_json("fsdp-figures", payload),
            f"<script>{static('report.js')}</script>",
            "</body></html>\n",
        ]
    )
