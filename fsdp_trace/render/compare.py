"""compare.html: the efficiency table users write by hand — 1 GPU, N GPUs, then each tuning
step — as a chart and a table, self-contained (plotly.js inlined, opens offline).

The chart has two panels on one run axis: tokens/s per GPU (bars, labelled) above, scaling
efficiency and exposed communication (%, one fixed 0–100 axis) below, so that no line crosses
a bar label. The table is plain HTML: long cells ("what changed") wrap instead of being cut.
A CPU run's bar is grey and says so (its tokens/s measure the host, not GPUs); it has no
efficiency point.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from fsdp_trace import atomic, fmt
from fsdp_trace.present.compare import compare_table, numeric
from fsdp_trace.present.view import Table
from fsdp_trace.render.report import markup

THROUGHPUT = "#4e79a7"
CPU_BAR = "#bab0ac"
EFFICIENCY = "#59a14f"
EXPOSED = "#e15759"


def run_labels(table: pd.DataFrame) -> list[str]:
    return [f"{i + 1}. {label}" for i, label in enumerate(table["label"])]


def figure(table: pd.DataFrame):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    labels = run_labels(table)
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        row_heights=[0.58, 0.42],
        vertical_spacing=0.1,
        subplot_titles=["Tokens/s per GPU", "Scaling efficiency and exposed communication, %"],
    )
    tps = table["tokens_per_s_per_gpu"].astype(float)
    cpu = (table["device"] == "cpu") if "device" in table else pd.Series(False, index=table.index)
    hover = [
        (c or "first run") + ("<br>CPU run: the host's tokens/s, not a GPU's" if on else "")
        for c, on in zip(table["change"], cpu, strict=True)
    ]
    fig.add_trace(
        go.Bar(
            x=labels,
            y=tps,
            name="tokens/s/GPU",
            marker_color=[CPU_BAR if on else THROUGHPUT for on in cpu],
            text=[
                fmt.num(v, ",.0f") + (" (CPU)" if on else "")
                for v, on in zip(tps, cpu, strict=True)
            ],
            textposition="outside",
            cliponaxis=False,
            hovertext=hover,
            hovertemplate="%{x}<br>%{y:,.0f} tokens/s/GPU<br>%{hovertext}<extra></extra>",
        ),
        row=1,
        col=1,
    )
    # Headroom for the labels above the bars; plotly picks round ticks inside the range.
    top = 1.15 * float(tps.max()) if tps.notna().any() and tps.max() > 0 else 1.0
    fig.update_yaxes(title_text="tokens/s per GPU", range=[0, top], row=1, col=1)
    highest = 100.0
    for column, name, color in (
        ("scaling_efficiency", "scaling efficiency", EFFICIENCY),
        ("exposed_pct", "exposed communication", EXPOSED),
    ):
        values = table[column].astype(float) * (100.0 if column == "scaling_efficiency" else 1.0)
        if values.notna().any():
            highest = max(highest, float(values.max()))
        fig.add_trace(
            go.Scatter(
                x=labels,
                y=values,
                name=name + " %",
                mode="lines+markers+text",
                line={"color": color, "width": 2},
                marker={"color": color, "size": 9},
                text=values.map(lambda v: fmt.num(v, ".1f")),
                textposition="top center",
                textfont={"color": color},
                cliponaxis=False,
                connectgaps=False,
                hovertemplate="%{x}<br>" + name + " %{y:.1f} %<extra></extra>",
            ),
            row=2,
            col=1,
        )
    # One fixed axis in steps of 20 (no secondary axis: its ticks never land on round values),
    # with room above the highest point for its label.
    ticks = list(range(0, math.ceil(highest / 20.0) * 20 + 1, 20))
    fig.update_yaxes(title_text="%", range=[0, highest * 1.12 + 2], tickvals=ticks, row=2, col=1)
    fig.update_layout(
        template="plotly_white",
        height=720,
        autosize=True,
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.04, "x": 0},
        margin={"l": 70, "r": 30, "t": 70, "b": 40},
        bargap=0.45,
    )
    return fig


def view_html(view: Table, numeric: Callable[[str], bool]) -> str:
    """A view model's table as plain HTML (long cells wrap; numbers are right-aligned)."""
    head = "".join(
        f'<th class="{"num" if numeric(h) else ""}">{html.escape(h)}</th>' for h in view.headers
    )
    highlight = view.highlight or [False] * len(view.rows)

    def cell(i: int, text: str) -> str:
        if numeric(view.headers[i]):
            return markup.number(text)
        return markup.name(text) if i in view.names else html.escape(text)

    rows = "".join(
        ('<tr class="hl">' if lit else "<tr>")
        + "".join(
            f'<td class="{"num" if numeric(h) else ""}">{cell(i, c)}</td>'
            for i, (h, c) in enumerate(zip(view.headers, row, strict=True))
        )
        + "</tr>"
        for row, lit in zip(view.rows, highlight, strict=True)
    )
    return (
        f'<table data-table="{view.key}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{rows}</tbody></table>"
    )


def table_html(table: pd.DataFrame) -> str:
    return view_html(compare_table(table), numeric)


CSS = """
body { margin:0; font:14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, Arial, sans-serif;
  color:#2a2f36; background:#fff; }
main { max-width:1400px; margin:0 auto; padding:18px 28px 32px; }
h1 { font-size:20px; font-weight:600; margin:0 0 4px; }
p.caption { color:#6b7480; margin:0 0 10px; font-size:13px; }
table { border-collapse:collapse; font-size:13px; margin:8px 0; width:100%; }
th, td { padding:5px 10px; border-bottom:1px solid #e3e6ea; text-align:left; vertical-align:top; }
th { color:#6b7480; font-weight:600; vertical-align:bottom; }
td.num, th.num { text-align:right; font-variant-numeric:tabular-nums; }
.nw { white-space:nowrap; }
td { overflow-wrap:anywhere; }
@media (max-width:1200px) { th, td { padding:5px 6px; } }
/* plotly's toolbar in a band of its own above the chart, never on its legend */
.plotly-graph-div { margin-top:30px; }
.plotly-graph-div .modebar-container { top:-30px !important; }
ul.notices { color:#8a6d1a; font-size:13px; }
tr.hl td { background:#eef6ec; }
"""


def render_html(table: pd.DataFrame) -> str:
    from fsdp_trace.render import plotlyjs  # plotly.js inlined packed: the page stays small

    chart = plotlyjs.to_html(
        figure(table),
        full_html=False,
        default_width="100%",
        default_height="720px",
        config={"responsive": True, "displaylogo": False},
    )
    notices = table.attrs.get("notices") or []
    notes = (
        '<ul class="notices">' + "".join(f"<li>{html.escape(n)}</li>" for n in notices) + "</ul>"
        if notices
        else ""
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>fsdp-trace compare</title><style>{CSS}</style></head><body><main>"
        "<h1>Runs compared, in the order given</h1>"
        '<p class="caption">Each run against the previous one: what changed and what it bought. '
        "Efficiency = tokens/s/GPU ÷ tokens/s of the 1-GPU run named under baseline (same "
        "model, batch and sequence; knobs that differ are named). Exposed % is blank on one "
        "GPU: there is no communication. Δ exposed is in points of the step. A CPU run (grey) "
        "has no efficiency: its timing measures the host, not GPUs.</p>"
        f"{chart}{table_html(table)}{notes}</main></body></html>\n"
    )


def write_compare_html(table: pd.DataFrame, path: Path) -> None:
    atomic.write_text(path, render_html(table))
