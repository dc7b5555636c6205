"""efficiency.html: scaling efficiency, throughput, exposed communication, recompute and
memory against activation-checkpoint coverage, best point marked. Self-contained (plotly.js
inlined), opens offline, fills the browser's width.

CPU (gloo) runs are never drawn as timing fact: their step time measures the host's shared
cores, not GPUs and links, so a sweep of CPU runs plots what a CPU run does measure (host
memory and the blocks under activation checkpointing) and says why the rest is left out; CPU
runs among GPU runs are left out of the timing panels."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pandas as pd

from fsdp_trace import atomic
from fsdp_trace.fmt import plural, short_name

PANELS = (
    ("scaling_efficiency", "Scaling efficiency (vs 1 GPU)", ".0%"),
    ("tokens_per_s_per_gpu", "Tokens/s per GPU", ",.0f"),
    ("exposed_pct", "Exposed communication, % of step", ".1f"),
    ("recompute_pct", "Recompute (AC) compute, % of step", ".1f"),
    ("peak_allocated_gib", "Peak memory allocated, GiB", ".1f"),
)
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")
# Figures that mean nothing on one GPU (1.0 by definition; no communication to expose).
MULTI_GPU_ONLY = {"scaling_efficiency", "exposed_pct"}
# Shares of the step start at zero: a few points of noise must not look like a trend.
ZERO_BASED = {"exposed_pct", "recompute_pct"}


def _cell(value, spec: str) -> str:
    return "—" if pd.isna(value) else format(value, spec)


def cpu_rows(table: pd.DataFrame) -> pd.Series:
    """Which rows ran on CPU (gloo)."""
    if "device" not in table:
        return pd.Series(False, index=table.index)
    return table["device"].eq("cpu")


def best_point(table: pd.DataFrame) -> pd.Series | None:
    """The multi-GPU run with the most tokens/s/GPU (less memory breaks ties); never a CPU
    run (its tokens/s measure the host)."""
    table = table[~cpu_rows(table)]
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
    """The GPU figure (CPU rows left out of its panels), or the CPU one when every run ran
    on CPU."""
    cpu = cpu_rows(table)
    if len(table) and cpu.all():
        return cpu_figure(table, title)
    full = table
    table = table[~cpu]
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
    points = sorted(table["ac_coverage"].dropna().unique().tolist())
    for index, (column, label, fmt) in enumerate(PANELS):
        row, col = divmod(index, 3)
        for color, (world, group) in zip(COLORS, table.groupby("world_size"), strict=False):
            if column in MULTI_GPU_ONLY and world == 1:
                continue
            group = group.sort_values("ac_coverage")
            point = per_point(group, column)
            repeated = bool((point["runs"] > 1).any())
            error = None
            if repeated:  # the spread of the repeats: min to max around the median
                error = {
                    "type": "data",
                    "symmetric": False,
                    "array": (point["max"] - point["median"]).to_numpy(),
                    "arrayminus": (point["median"] - point["min"]).to_numpy(),
                    "color": color,
                    "thickness": 1.5,
                    "width": 5,
                }
            fig.add_trace(
                go.Scatter(
                    x=point["ac_coverage"],
                    y=point["median"],
                    mode="lines+markers",
                    name=f"{world} GPU",
                    legendgroup=str(world),
                    showlegend=index == 1,
                    line={"color": color},
                    error_y=error,
                    customdata=point[["label", "step_ms", "runs"]].to_numpy(),
                    hovertemplate=f"AC %{{x:.2f}}<br>{label}: %{{y:{fmt}}}<br>"
                    "step %{customdata[1]:.1f} ms<br>%{customdata[0]}"
                    + ("<br>median of %{customdata[2]} runs" if repeated else "")
                    + "<extra></extra>",
                ),
                row=row + 1,
                col=col + 1,
            )
            if repeated:  # every run, faint, beside the median it is part of
                fig.add_trace(
                    go.Scatter(
                        x=group["ac_coverage"],
                        y=group[column],
                        mode="markers",
                        name=f"{world} GPU, each run",
                        legendgroup=str(world),
                        showlegend=False,
                        marker={"color": color, "size": 5, "opacity": 0.45},
                        customdata=list(
                            zip(
                                [short_name(r) for r in group["run"]],
                                group["step_ms"],
                                strict=True,
                            )
                        ),
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
                    cliponaxis=False,
                    hovertemplate=f"best point: {best['label']}<extra></extra>",
                ),
                row=row + 1,
                col=col + 1,
            )
        fig.update_xaxes(
            title_text="AC coverage (fraction of blocks)",
            range=[-0.05, 1.05],
            tickvals=points,
            ticktext=[f"{p:g}" for p in points],
            row=row + 1,
            col=col + 1,
        )
        fig.update_yaxes(
            tickformat=fmt.replace(",", ""),
            rangemode="tozero" if column in ZERO_BASED else "normal",
            row=row + 1,
            col=col + 1,
        )
    shown = table.sort_values(["world_size", "ac_coverage"])
    fig.add_trace(
        go.Table(
            header={
                "values": [
                    "GPUs",
                    "AC",
                    "tok/s<br>/GPU",
                    "eff.",
                    "exposed<br>%",
                    "recomp.<br>%",
                    "mem<br>GiB",
                ],
                "font": {"size": 11},
            },
            cells={
                "values": [
                    shown["world_size"],
                    shown["ac_coverage"].map("{:.2f}".format),
                    shown["tokens_per_s_per_gpu"].map(lambda v: _cell(v, ",.0f")),
                    shown["scaling_efficiency"].map(lambda v: _cell(v, ".1%")),
                    shown["exposed_pct"].map(lambda v: _cell(v, ".1f")),
                    shown["recompute_pct"].map(lambda v: _cell(v, ".1f")),
                    shown["peak_allocated_gib"].map(lambda v: _cell(v, ".1f")),
                ]
            },
            columnwidth=[0.8, 0.9, 1.3, 1.2, 1.1, 1.1, 1],
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
            if pd.notna(best.get("baseline_alloc_retries")) and best["baseline_alloc_retries"] > 0:
                subtitle += " against a 1-GPU run slowed by allocator retries (below)"
        subtitle += "</sup>"
    notes = [READING, *footnotes(full)]
    fig.update_layout(
        title={"text": title + subtitle, "x": 0.01, "xanchor": "left"},
        height=PLOTS_PX + 110 + 60 + _footnote_height(notes),  # the notes below, not over
        autosize=True,
        template="plotly_white",
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.07, "xanchor": "right", "x": 1},
        margin={"l": 60, "r": 30, "t": 110, "b": 60 + _footnote_height(notes)},
    )
    _footnotes(fig, notes)
    return fig


# What the GPU page is for, under it: the trade AC coverage makes and the point to pick.
READING = (
    "Reading it: more AC coverage recomputes more blocks' forward in backward, so tokens/s per "
    "GPU falls (recompute % rises) while peak memory falls; scaling efficiency compares each "
    "point on N GPUs with 1 GPU at the same coverage. Pick the lowest coverage whose memory "
    "fits the card with room to spare (no allocator retries): it is the fastest that fits."
)


def per_point(group: pd.DataFrame, column: str) -> pd.DataFrame:
    """One row per AC coverage of one GPU count: the median of `column` over the runs at that
    point, their min and max, how many runs there are, the median step and a label."""
    by = group.groupby("ac_coverage", sort=True)
    point = by.agg(
        median=(column, "median"),
        min=(column, "min"),
        max=(column, "max"),
        runs=(column, "count"),
        step_ms=("step_ms", "median"),
        label=("label", "first"),
    ).reset_index()
    point["runs"] = point["runs"].astype(int)
    return point


def repeats_note(table: pd.DataFrame) -> str | None:
    """The footnote of a sweep whose points were captured more than once."""
    counts = table.groupby(["world_size", "ac_coverage"]).size()
    if counts.empty or counts.max() <= 1:
        return None
    many = sorted(set(counts.tolist()))
    runs = "-".join(str(n) for n in (many[0], many[-1]) if n) if len(many) > 1 else str(many[0])
    return (
        f"Repeated points ({runs} runs each): the line joins the medians, the bars span the "
        "runs' min to max, the dots are the runs; each multi-GPU run's efficiency is against "
        "the 1-GPU run of its own folder."
    )


# Height of the GPU page's two rows of panels, between its title and its notes.
PLOTS_PX = 640
FOOTNOTE_CHARACTERS = 120  # a footnote's line, wrapped to fit a 1024 px window
FOOTNOTE_LINE_PX = 18


def footnote_rows(lines: list[str]) -> list[str]:
    """The footnotes as the rows they take, each line wrapped (plotly never wraps text: a
    long notice ran off the page)."""
    return [row for line in lines for row in textwrap.wrap(line, FOOTNOTE_CHARACTERS)]


def _footnote_height(lines: list[str]) -> int:
    return FOOTNOTE_LINE_PX * len(footnote_rows(lines))


def _footnotes(fig, lines: list[str]) -> None:
    for i, row in enumerate(footnote_rows(lines)):
        fig.add_annotation(
            text=row,
            xref="paper",
            yref="paper",
            x=0,
            xanchor="left",
            align="left",
            y=-0.08,
            yanchor="top",
            yshift=-FOOTNOTE_LINE_PX * i,
            showarrow=False,
            font={"size": 12, "color": "#555"},
        )


CPU_PANELS = (
    ("peak_allocated_gib", "Peak host memory (RSS), GiB", ".2f"),
    ("ac_blocks", "Blocks under activation checkpointing", "d"),
)
CPU_NOTE = (
    "CPU (gloo) runs: step time, tokens/s and scaling efficiency measure the host's shared "
    "cores, not GPUs and their links, so they are not plotted; exposed communication and "
    "recompute need GPU kernels. Shown: what a CPU run measures."
)


def cpu_figure(table: pd.DataFrame, title: str):
    """A sweep of CPU runs: host memory and the checkpointed blocks against AC coverage, and
    the runs' table with their timing marked as not meaningful for scaling."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=1,
        cols=3,
        subplot_titles=[p[1] for p in CPU_PANELS] + ["Runs (CPU)"],
        specs=[[{}, {}, {"type": "table"}]],
        horizontal_spacing=0.08,
    )
    points = sorted(table["ac_coverage"].dropna().unique().tolist())
    for index, (column, label, fmt) in enumerate(CPU_PANELS):
        for color, (world, group) in zip(COLORS, table.groupby("world_size"), strict=False):
            group = group.sort_values("ac_coverage")
            fig.add_trace(
                go.Scatter(
                    x=group["ac_coverage"],
                    y=group[column],
                    mode="lines+markers",
                    name=plural(world, "CPU rank"),
                    legendgroup=str(world),
                    showlegend=index == 0,
                    line={"color": color},
                    customdata=group[["label"]].to_numpy(),
                    hovertemplate=f"AC %{{x:.2f}}<br>{label}: %{{y:{fmt}}}<br>"
                    "%{customdata[0]}<extra></extra>",
                ),
                row=1,
                col=index + 1,
            )
        fig.update_xaxes(
            title_text="AC coverage (fraction of blocks)",
            range=[-0.05, 1.05],
            tickvals=points,
            ticktext=[f"{p:g}" for p in points],
            row=1,
            col=index + 1,
        )
        fig.update_yaxes(rangemode="tozero", row=1, col=index + 1)
    shown = table.sort_values(["world_size", "ac_coverage"])
    blocks = [
        f"{a}/{n}" if pd.notna(n) else f"{a}"
        for a, n in zip(shown["ac_blocks"], shown["n_blocks"], strict=True)
    ]
    fig.add_trace(
        go.Table(
            header={
                "values": ["CPU<br>ranks", "AC", "AC<br>blocks", "efficiency", "mem GiB<br>(RSS)"],
                "font": {"size": 11},
            },
            cells={
                "values": [
                    shown["world_size"],
                    shown["ac_coverage"].map("{:.2f}".format),
                    blocks,
                    ["— (CPU)"] * len(shown),
                    shown["peak_allocated_gib"].map(lambda v: _cell(v, ".2f")),
                ]
            },
            columnwidth=[0.9, 0.8, 0.9, 1.1, 1.1],
        ),
        row=1,
        col=3,
    )
    # the table's own CPU notice says what the title's note says
    notes = [n for n in footnotes(table) if "ran on CPU (gloo)" not in n]
    note = "<br>".join(textwrap.wrap(CPU_NOTE, 120))
    fig.update_layout(
        title={"text": f"{title}<br><sup>{note}</sup>", "x": 0.01, "xanchor": "left"},
        height=560,
        autosize=True,
        template="plotly_white",
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.1, "xanchor": "right", "x": 1},
        margin={"l": 60, "r": 30, "t": 130, "b": 80 + _footnote_height(notes)},
    )
    _footnotes(fig, notes)
    return fig


def footnotes(table: pd.DataFrame) -> list[str]:
    """Where exposed % and recompute % came from, and the table's notices."""
    lines = []
    note = repeats_note(table[~cpu_rows(table)]) if "ac_coverage" in table else None
    if note:
        lines.append(note)
    sources = table["figures_from"].fillna("") if "figures_from" in table else pd.Series()
    saved = int((sources == "analysis.json").sum())
    if saved:
        lines.append(
            f"Exposed % and recompute %: from analysis.json for {saved} of "
            f"{plural(len(table), 'run')} "
            "(the figures the sweep computed from their timing traces, which are not here)."
        )
    lines += list(table.attrs.get("notices", []))
    return lines


def write_efficiency_html(table: pd.DataFrame, path: Path, title: str) -> None:
    from fsdp_trace.render import plotlyjs  # plotly.js inlined packed: the page stays small

    fig = figure(table, title)
    html = plotlyjs.to_html(
        fig,
        full_html=True,
        default_width="100%",
        default_height=f"{fig.layout.height}px",
        config={"responsive": True, "displaylogo": False},
    )
    atomic.write_text(path, html)


def sweep_title(table: pd.DataFrame) -> str:
    first = table.iloc[0]
    shape = f"{first['model']}, batch {first['batch_size']} x seq {first['seq_len']}"
    if len(table) and cpu_rows(table).all():
        return f"Activation-checkpoint coverage on CPU (gloo) — {shape}"
    return f"Efficiency vs activation-checkpoint coverage — {shape}"
