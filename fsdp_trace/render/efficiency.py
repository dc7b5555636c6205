"""efficiency.html: scaling efficiency, throughput, exposed communication, recompute and
memory against activation-checkpoint coverage, best point marked. Self-contained (plotly.js
inlined), opens offline."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from fsdp_trace.render.export import write_text_atomically

PANELS = (
    ("scaling_efficiency", "Scaling efficiency (tok/s/GPU ÷ 1-GPU tok/s)", ".0%"),
    ("tokens_per_s_per_gpu", "Tokens/s per GPU", ",.0f"),
    ("exposed_pct", "Exposed communication, % of step", ".1f"),
    ("recompute_pct", "Recompute (AC) compute, % of step", ".1f"),
    ("peak_allocated_gib", "Peak memory allocated, GiB", ".1f"),
)
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")


def best_point(table: pd.DataFrame) -> pd.Series | None:
    """The multi-GPU run with the most tokens/s/GPU (less memory breaks ties)."""
    multi = table[table["world_size"] > 1].dropna(subset=["tokens_per_s_per_gpu"])
    if multi.empty:
        multi = table.dropna(subset=["tokens_per_s_per_gpu"])
    if multi.empty:
        return None
    ordered = multi.sort_values(
        ["tokens_per_s_per_gpu", "peak_allocated_gib"], ascending=[False, True]
    )
    return ordered.iloc[0]


def figure(table: pd.DataFrame, title: str):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=2,
        cols=3,
        subplot_titles=[p[1] for p in PANELS] + ["Runs"],
        specs=[[{}, {}, {}], [{}, {}, {"type": "table"}]],
        horizontal_spacing=0.07,
        vertical_spacing=0.14,
    )
    best = best_point(table)
    for index, (column, label, fmt) in enumerate(PANELS):
        row, col = divmod(index, 3)
        for color, (world, group) in zip(COLORS, table.groupby("world_size"), strict=False):
            if column == "scaling_efficiency" and world == 1:
                continue
            group = group.sort_values("ac_coverage")
            fig.add_trace(
                go.Scatter(
                    x=group["ac_coverage"],
                    y=group[column],
                    mode="lines+markers",
                    name=f"{world} GPU",
                    legendgroup=str(world),
                    showlegend=index == 1,
                    line={"color": color},
                    customdata=group[["label", "step_ms"]].to_numpy(),
                    hovertemplate=f"AC %{{x:.2f}}<br>{label}: %{{y:{fmt}}}<br>"
                    "step %{customdata[1]:.1f} ms<br>%{customdata[0]}<extra></extra>",
                ),
                row=row + 1,
                col=col + 1,
            )
        if best is not None and pd.notna(best[column]):
            fig.add_trace(
                go.Scatter(
                    x=[best["ac_coverage"]],
                    y=[best[column]],
                    mode="markers",
                    marker={
                        "symbol": "star",
                        "size": 16,
                        "color": "gold",
                        "line": {"color": "black", "width": 1},
                    },
                    name="best tokens/s/GPU",
                    showlegend=index == 1,
                    hovertemplate=f"best point: {best['label']}<extra></extra>",
                ),
                row=row + 1,
                col=col + 1,
            )
        fig.update_xaxes(
            title_text="AC coverage (fraction of blocks)",
            range=[-0.05, 1.05],
            row=row + 1,
            col=col + 1,
        )
        fig.update_yaxes(tickformat=fmt.replace(",", ""), row=row + 1, col=col + 1)
    shown = table.sort_values(["world_size", "ac_coverage"])
    fig.add_trace(
        go.Table(
            header={"values": ["GPUs", "AC", "tok/s/GPU", "eff.", "exposed %", "mem GiB"]},
            cells={
                "values": [
                    shown["world_size"],
                    shown["ac_coverage"].map("{:.2f}".format),
                    shown["tokens_per_s_per_gpu"].map("{:,.0f}".format),
                    shown["scaling_efficiency"].map(lambda v: "—" if pd.isna(v) else f"{v:.1%}"),
                    shown["exposed_pct"].map(lambda v: "—" if pd.isna(v) else f"{v:.1f}"),
                    shown["peak_allocated_gib"].map(lambda v: "—" if pd.isna(v) else f"{v:.1f}"),
                ]
            },
        ),
        row=2,
        col=3,
    )
    subtitle = ""
    if best is not None:
        efficiency = best["scaling_efficiency"]
        subtitle = f"<br><sup>best: {best['label']} — {best['tokens_per_s_per_gpu']:,.0f} tok/s/GPU"
        if pd.notna(efficiency):
            subtitle += f", efficiency {efficiency:.1%}"
        subtitle += "</sup>"
    fig.update_layout(
        title=title + subtitle,
        height=820,
        width=1400,
        template="plotly_white",
        legend={"orientation": "h", "y": 1.08, "x": 0.7},
    )
    return fig


def write_efficiency_html(table: pd.DataFrame, path: Path, title: str) -> None:
    html = figure(table, title).to_html(include_plotlyjs=True, full_html=True)
    write_text_atomically(path, html)


def sweep_title(table: pd.DataFrame) -> str:
    first = table.iloc[0]
    return (
        f"Efficiency vs activation-checkpoint coverage — {first['model']}, "
        f"batch {first['batch_size']} x seq {first['seq_len']}"
    )
