"""compare.html: the efficiency table users write by hand — 1 GPU, N GPUs, then each tuning
step — as a chart and a table, self-contained."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from fsdp_trace.render.export import write_text_atomically


def _fmt(value, spec: str) -> str:
    return "—" if pd.isna(value) else format(value, spec)


def figure(table: pd.DataFrame):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    labels = [f"{i + 1}. {label}" for i, label in enumerate(table["label"])]
    fig = make_subplots(
        rows=2,
        cols=1,
        row_heights=[0.55, 0.45],
        vertical_spacing=0.08,
        specs=[[{"secondary_y": True}], [{"type": "table"}]],
    )
    throughput = table["tokens_per_s_per_gpu"].map(lambda v: _fmt(v, ",.0f"))
    fig.add_trace(
        go.Bar(
            x=labels,
            y=table["tokens_per_s_per_gpu"],
            name="tokens/s/GPU",
            marker_color="#1f77b4",
            text=throughput,
            textposition="outside",
            hovertext=table["change"],
        ),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Scatter(
            x=labels,
            y=100 * table["scaling_efficiency"],
            name="scaling efficiency %",
            mode="lines+markers",
            marker_color="#2ca02c",
        ),
        row=1,
        col=1,
        secondary_y=True,
    )
    fig.add_trace(
        go.Scatter(
            x=labels,
            y=table["exposed_pct"],
            name="exposed comm %",
            mode="lines+markers",
            marker_color="#d62728",
        ),
        row=1,
        col=1,
        secondary_y=True,
    )
    fig.update_yaxes(title_text="tokens/s per GPU", row=1, col=1, secondary_y=False)
    fig.update_yaxes(title_text="%", row=1, col=1, secondary_y=True, rangemode="tozero")
    fig.add_trace(
        go.Table(
            columnwidth=[3, 1, 1.2, 1, 1, 1, 1, 4],
            header={
                "values": [
                    "run",
                    "GPUs",
                    "tok/s/GPU",
                    "Δ vs previous",
                    "efficiency",
                    "exposed %",
                    "mem GiB",
                    "what changed",
                ]
            },
            cells={
                "values": [
                    labels,
                    table["world_size"],
                    throughput,
                    table["tokens_per_s_per_gpu_change_pct"].map(
                        lambda v: _fmt(v, "+.1f") + " %" if pd.notna(v) else "—"
                    ),
                    table["scaling_efficiency"].map(lambda v: _fmt(v, ".1%")),
                    table["exposed_pct"].map(lambda v: _fmt(v, ".1f")),
                    table["peak_allocated_gib"].map(lambda v: _fmt(v, ".1f")),
                    table["change"],
                ]
            },
        ),
        row=2,
        col=1,
    )
    fig.update_layout(
        title="Runs compared, in the order given",
        template="plotly_white",
        height=900,
        width=1300,
        legend={"orientation": "h", "y": 1.05},
    )
    return fig


def write_compare_html(table: pd.DataFrame, path: Path) -> None:
    write_text_atomically(path, figure(table).to_html(include_plotlyjs=True, full_html=True))
