"""The report's plotly figures, one builder each: the step breakdown per rank (from the view
model), the step timeline, communication per block, bandwidth against message size and the
rank × block map of exposed time (from the run's tables: data the view does not carry).
Each returns a plotly Figure, or None when there is nothing to draw. Times are in ms."""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pandas as pd

from fsdp_trace import fmt
from fsdp_trace.analysis import intervals as iv
from fsdp_trace.present.view import PART_LABELS, STACK_ORDER, RunView, rank_label, rank_labels
from fsdp_trace.render.report import timeline as tl
from fsdp_trace.render.report.style import BLOCK_CATEGORIES, COLORS, PART_COLORS
from fsdp_trace.result import RunAnalysis
from fsdp_trace.vocab import ROOT, Source

MAX_SCATTER_POINTS = 3000  # per collective type; more are sampled (SVG stays responsive)
LEGEND_TOP = {"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 0}


def timing(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of a run table that come from timing (or plain) traces."""
    if frame.empty or "source" not in frame:
        return frame
    return frame[frame["source"] != Source.DETAILED]


def _labels(run: RunAnalysis) -> dict[Any, str]:
    return dict(zip((r.rank for r in run.ranks), rank_labels(run.ranks, run.ranks), strict=True))


# --- where each rank's step goes ---------------------------------------------------------------


def breakdown_figure(view: RunView):
    """One stacked bar per rank: its median step cut into the view's parts (STACK_ORDER), in
    fixed colours; hover gives each part's ms and share of the step (the view's text)."""
    import plotly.graph_objects as go

    bars = view.bars
    if not bars:
        return None
    labels = [f"{b.label} · step {b.step}" for b in bars]
    fig = go.Figure()
    for part in STACK_ORDER:
        values = np.array([b.parts.get(part, math.nan) for b in bars], dtype=np.float64)
        if not np.any(np.nan_to_num(values) > 0):
            continue
        hover = [
            f"<b>{b.label}</b>, step {b.step}: {b.step_ms:.2f} ms<br>"
            + f"{PART_LABELS[part]}: {b.text[part]}"
            for b in bars
        ]
        fig.add_trace(
            go.Bar(
                orientation="h",
                y=labels,
                x=np.round(np.nan_to_num(values), 5),  # unknown: no length (hover says —)
                name=PART_LABELS[part],
                marker={"color": PART_COLORS[part], "line": {"width": 0.5, "color": "white"}},
                hovertext=hover,
                hoverinfo="text",
                meta={"part": part, "ranks": [b.label for b in bars]},
            )
        )
    fig.add_trace(  # the step's length at the end of each bar
        go.Scatter(
            x=[b.step_ms for b in bars],
            y=labels,
            mode="text",
            text=[f"  {b.step_ms:.2f} ms" for b in bars],
            textposition="middle right",
            hoverinfo="skip",
            showlegend=False,
            meta={"part": "step"},
        )
    )
    longest = max(b.step_ms for b in bars)
    fig.update_layout(
        barmode="stack",
        height=max(220, 46 * len(bars) + 130),
        xaxis={"title": "ms of the rank's median step", "range": [0, 1.12 * longest]},
        yaxis={"autorange": "reversed", "type": "category", "title": None},
        legend={**LEGEND_TOP, "traceorder": "normal"},
        margin={"l": 10, "r": 20, "t": 40, "b": 50},
        bargap=0.35,
        hovermode="closest",
    )
    return fig


# --- the step timeline -------------------------------------------------------------------------

TIMELINE_NAMES = {
    "compute": "compute kernels",
    "AllGather": "AllGather",
    "ReduceScatter": "ReduceScatter",
    "other": "other collectives",
    "memory": "memcpy / memset",
    "exposed": "exposed communication",
    "phase": "phase",
}


def _timeline_title(run: RunAnalysis, r, step: pd.Series) -> str:
    lengths = pd.to_numeric(r.steps["step_us"], errors="coerce").dropna()
    title = (
        f"<b>{rank_label(r, run.ranks)}</b> — step {int(step['step'])}: "
        f"{fmt.ms(step['step_us'], ' ms')} (this rank's median {fmt.ms(lengths.median(), ' ms')}"
        f" over {len(lengths)})"
    )
    if fmt.finite(step["exposed_pct"]) and fmt.finite(step["comm_us"]) and step["comm_us"] > 0:
        title += f", exposed {step['exposed_pct']:.1f} %, overlap "
        title += fmt.pct(step["overlap_pct"], " %")
    return title


def _timeline_panels(run: RunAnalysis) -> list[tuple[Any, pd.Series, list, list]]:
    ranks = tl.timeline_ranks(run)
    chosen = tl.representative_steps(ranks)
    panels = []
    for r in ranks:
        step = chosen.get(id(r))
        if step is None:
            continue
        rows, groups = tl.rows_of(r, step)
        if groups:
            panels.append((r, step, rows, groups))
    return panels


def _timeline_bar(g: dict[str, Any], shown: set[str]):
    import plotly.graph_objects as go

    kind, text = g["kind"], "text" in g
    return go.Bar(
        orientation="h",
        y=g["y"],
        x=np.round(g["x"], 5),
        base=np.round(g["base"], 5),
        name=TIMELINE_NAMES[kind],
        legendgroup=kind,
        showlegend=kind not in shown and kind != "phase",
        marker={"color": g.get("colors", COLORS.get(kind)), "line": {"width": 0}},
        text=g.get("text"),
        textposition="inside" if text else None,
        insidetextanchor="middle" if text else None,
        textfont={"color": "#333", "size": 11} if text else None,
        hovertext=g["hover"],
        hoverinfo="text",
        meta={"kind": kind},
    )


def timeline_figure(run: RunAnalysis):
    """One representative step per rank: its GPU streams (or gloo threads), phases on top,
    exposed communication at the bottom; one subplot per rank, a shared time axis."""
    from plotly.subplots import make_subplots

    panels = _timeline_panels(run)
    if not panels:
        return None
    heights = [len(rows) for _, _, rows, _ in panels]
    per_row, gap = 26, 70
    height = sum(heights) * per_row + gap * len(panels) + 110
    fig = make_subplots(
        rows=len(panels),
        cols=1,
        shared_xaxes=True,
        row_heights=[h / sum(heights) for h in heights],
        vertical_spacing=min(gap / height, 0.3 / max(len(panels) - 1, 1)),
        subplot_titles=[_timeline_title(run, r, step) for r, step, _, _ in panels],
    )
    shown: set[str] = set()
    for index, (_, _, rows, groups) in enumerate(panels, start=1):
        for g in groups:
            fig.add_trace(_timeline_bar(g, shown), row=index, col=1)
            shown.add(g["kind"])
        fig.update_yaxes(
            categoryorder="array", categoryarray=rows, autorange="reversed", row=index, col=1
        )
    fig.update_xaxes(title_text="time since step start (ms)", row=len(panels), col=1)
    fig.update_xaxes(showticklabels=True, zeroline=False)
    fig.update_layout(
        height=height,
        barmode="overlay",
        bargap=0.25,
        uniformtext={"minsize": 9, "mode": "hide"},
        hovermode="closest",
        legend={"orientation": "h", "yref": "container", "y": 1, "yanchor": "top", "x": 0},
        margin={"l": 10, "r": 20, "t": 80, "b": 50},
    )
    fig.update_annotations(font={"size": 13}, xanchor="left", x=0)
    return fig


# --- communication per block -------------------------------------------------------------------


def comm_per_block(run: RunAnalysis) -> pd.DataFrame:
    """Per block × category (AllGather forward / backward, ReduceScatter, others), per step:
    time and exposed time (µs), mean over the ranks that have the block (timing traces)."""
    b = timing(run.blocks)
    columns = ["block", "category", "time_us", "exposed_us", "bytes", "busbw_gbps", "count"]
    columns.append("ranks")
    if b.empty:
        return pd.DataFrame(columns=columns)
    coll = b["collective"].astype(str)
    forward = np.where(b["phase"] == "forward", "AllGather forward", "AllGather backward")
    b = b.assign(category=np.where(coll == "AllGather", forward, coll))
    keys = ["rank", "block", "category"]
    groups = b.groupby(keys, dropna=False, sort=False)
    totals = {"exposed_us": "exposed_us_per_step", "bytes": "bytes_per_step"}
    # Exposed time and bytes: each group's `sum(min_count=1)` (NaN when every value is), as
    # arrays (a pandas call per group was ~2 s of a thousand ranks' report) where the values
    # are float64 and every row a group seen (a categorical key makes rows of unseen
    # combinations too, under pandas 2); else pandas' own.
    arrays = all(b[c].dtype == np.float64 for c in totals.values()) and not any(
        isinstance(b[k].dtype, pd.CategoricalDtype) for k in keys
    )
    total = lambda s: s.sum(min_count=1)  # noqa: E731
    per_rank = groups.agg(
        time_us=("time_us_per_step", "sum"),
        **({} if arrays else {name: (c, total) for name, c in totals.items()}),
        busbw_gbps=("busbw_gbps", "mean"),
        count=("count_per_step", "sum"),
    )
    if arrays:
        codes = groups.ngroup().to_numpy()
        for name, column in totals.items():
            per_rank[name] = iv.group_totals(codes, b[column].to_numpy(), groups.ngroups, 1)
    per_rank = per_rank[["time_us", "exposed_us", "bytes", "busbw_gbps", "count"]].reset_index()
    out = (
        per_rank.groupby(["block", "category"], sort=False)
        .agg(
            time_us=("time_us", "mean"),
            exposed_us=("exposed_us", "mean"),
            bytes=("bytes", "mean"),
            busbw_gbps=("busbw_gbps", "mean"),
            count=("count", "mean"),
            ranks=("rank", "nunique"),
        )
        .reset_index()
    )
    return out[columns]


def _block_hover(block: str, cat: str, row: pd.Series) -> str:
    if pd.isna(row["time_us"]):
        return ""
    text = f"<b>{block}</b> · {cat}<br>{row['time_us'] / 1e3:.3f} ms per step"
    if fmt.finite(row["exposed_us"]):
        share = 100 * row["exposed_us"] / row["time_us"] if row["time_us"] else 0.0
        text += f", exposed {row['exposed_us'] / 1e3:.3f} ms ({share:.0f} %)"
    text += f"<br>{row['count']:g} per step · {fmt.mb(row['bytes'])} MB"
    text += f" · busbw {fmt.num(row['busbw_gbps'], ',.1f')} GB/s"
    if row["ranks"] > 1:
        text += f"<br>mean of {int(row['ranks'])} ranks"
    return text


def _block_marker(color: str, part: str, has_exposed: bool) -> dict[str, Any]:
    marker: dict[str, Any] = {"color": color, "line": {"width": 0}}
    if part == "exposed":
        marker["pattern"] = {
            "shape": "/",
            "fgcolor": COLORS["exposed"],
            "size": 7,
            "solidity": 0.45,
        }
        marker["line"] = {"width": 1, "color": COLORS["exposed"]}
    elif has_exposed:
        marker["opacity"] = 0.45
    return marker


def blocks_figure(run: RunAnalysis):
    """Communication time per block and category, stacked; the exposed part hatched red,
    worst exposed first."""
    import plotly.graph_objects as go

    table = comm_per_block(run)
    if table.empty:
        return None
    has_exposed = table["exposed_us"].notna().any()
    totals = table.groupby("block").agg(exposed=("exposed_us", lambda s: s.sum(min_count=1)))
    totals["time"] = table.groupby("block")["time_us"].sum()
    order = list(totals.sort_values(["exposed", "time"], ascending=False).index)
    categories = [c for c in BLOCK_CATEGORIES if c in set(table["category"])]
    categories += sorted(set(table["category"]) - set(BLOCK_CATEGORIES))
    fig = go.Figure()
    for cat in categories:
        part = table[table["category"] == cat].set_index("block").reindex(order)
        time_ms = part["time_us"].to_numpy(dtype=np.float64) / 1e3
        exposed_ms = np.nan_to_num(part["exposed_us"].to_numpy(dtype=np.float64) / 1e3)
        hover = [_block_hover(block, cat, row) for block, row in part.iterrows()]
        parts = (
            [("exposed", exposed_ms), ("hidden", np.clip(time_ms - exposed_ms, 0, None))]
            if has_exposed
            else [("time", time_ms)]
        )
        for name, values in parts:
            fig.add_trace(
                go.Bar(
                    orientation="h",
                    y=order,
                    x=np.round(np.nan_to_num(values), 5),
                    name=f"{cat} — {name}" if has_exposed else cat,
                    legendgroup=cat,
                    marker=_block_marker(COLORS.get(cat, COLORS["other"]), name, has_exposed),
                    hovertext=hover,
                    hoverinfo="text",
                    meta={"category": cat, "part": name},
                )
            )
    ranks = int(table["ranks"].max())
    fig.update_layout(
        barmode="stack",
        height=max(260, 28 * len(order) + 150),
        xaxis_title="communication time per step (ms"
        + (f", mean of {ranks} ranks)" if ranks > 1 else ")"),
        yaxis={"categoryorder": "array", "categoryarray": order, "autorange": "reversed"},
        legend=LEGEND_TOP,
        margin={"l": 10, "r": 20, "t": 40, "b": 50},
        bargap=0.3,
    )
    return fig


# --- bandwidth against message size ------------------------------------------------------------


def log_ticks(lo: float, hi: float) -> list[float]:
    """Round tick values within [lo, hi]: 1-2-5 per decade, 1 over a wide range, denser over a
    narrow one."""
    ticks: list[float] = []
    choices = ((1,), (1, 2, 5)) if hi / lo > 1e4 else ((1, 2, 5), (1, 1.5, 2, 3, 5, 7))
    for mantissas in choices:
        ticks = [
            float(f"{m * 10.0**e:.6g}")
            for e in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)
            for m in mantissas
            if lo <= m * 10.0**e <= hi
        ]
        if len(ticks) >= 4:
            break
    return ticks


def _sized(frame: pd.DataFrame, bw: str) -> pd.DataFrame:
    """Rows with a positive size and a finite bandwidth in column `bw`."""
    if frame.empty or not {"bytes", bw} <= set(frame.columns):
        return frame.iloc[0:0]
    size = pd.to_numeric(frame["bytes"], errors="coerce")
    speed = pd.to_numeric(frame[bw], errors="coerce").astype(float)
    return frame[(size > 0) & np.isfinite(speed)]


def _sampled(name: str, part: pd.DataFrame) -> tuple[str, pd.DataFrame]:
    if len(part) > MAX_SCATTER_POINTS:
        name += f" ({MAX_SCATTER_POINTS:,} of {len(part):,}, sampled)"
        part = part.sample(n=MAX_SCATTER_POINTS, random_state=0).sort_index()
    return name, part


def _kernel_points(run: RunAnalysis, c: pd.DataFrame):
    import plotly.graph_objects as go

    labels = _labels(run)
    for kind, part in tl.by_collective(c):
        name, part = _sampled(kind if kind != "other" else "other collectives", part)
        hover = [
            f"<b>{row['collective']}</b> {row['block']} · {row['phase']}<br>"
            f"{labels.get(row['rank'], 'rank ?')}, step {row['step']}<br>"
            f"{fmt.mb(row['bytes'])} MB in {row['dur_us']:,.1f} µs<br>"
            f"busbw {row['busbw_gbps']:,.1f} GB/s · algbw {fmt.num(row['algbw_gbps'], ',.1f')} GB/s"
            for row in part.to_dict("records")
        ]
        yield go.Scatter(
            x=part["bytes"].to_numpy(dtype=np.float64) / 1e6,
            y=np.round(part["busbw_gbps"].to_numpy(dtype=np.float64), 3),
            mode="markers",
            name=name,
            marker={
                "color": COLORS[kind],
                "size": 8,
                "opacity": 0.7,
                "line": {"width": 0.5, "color": "white"},
            },
            hovertext=hover,
            hoverinfo="text",
            meta={"kind": kind, "basis": "kernel"},
        )


def _transfer_points(run: RunAnalysis):
    """Every collective matched across ranks, over its transfer time (the shortest duration
    across ranks): closer to what the link did than a kernel's own duration."""
    import plotly.graph_objects as go

    cross = run.crossrank
    if cross is None or cross.empty:
        return
    matched = _sized(cross.matched, "transfer_busbw_gbps")
    if "collective" not in matched:
        return
    for kind, part in tl.by_collective(matched):
        label = kind if kind != "other" else "other collectives"
        name, part = _sampled(f"{label}, transfer time", part)
        hover = [
            f"<b>{row['collective']}</b> {row.get('block', '')} · {row.get('phase', '')}"
            f", step {row.get('step', '?')}<br>matched across ranks: transfer "
            f"{fmt.num(row.get('transfer_us'), ',.1f')} µs for {fmt.mb(row['bytes'])} MB<br>"
            f"busbw {row['transfer_busbw_gbps']:,.1f} GB/s"
            for row in part.to_dict("records")
        ]
        yield go.Scatter(
            x=part["bytes"].to_numpy(dtype=np.float64) / 1e6,
            y=np.round(part["transfer_busbw_gbps"].to_numpy(dtype=np.float64), 3),
            mode="markers",
            name=name,
            marker={
                "color": COLORS[kind],
                "symbol": "diamond",
                "size": 9,
                "line": {"width": 1, "color": "#2a2f36"},
            },
            hovertext=hover,
            hoverinfo="text",
            meta={"kind": kind, "basis": "transfer"},
        )


def bandwidth_figure(run: RunAnalysis):
    """Bus bandwidth against message size: every kernel (its duration includes waiting for
    peers: a lower bound), and every matched collective's transfer time."""
    import plotly.graph_objects as go

    c = _sized(timing(run.collectives), "busbw_gbps")
    if c.empty:
        return None
    fig = go.Figure([*_kernel_points(run, c), *_transfer_points(run)])
    sizes = c["bytes"].to_numpy(dtype=np.float64) / 1e6
    lo, hi = float(sizes.min()) / 1.4, float(sizes.max()) * 1.4
    xaxis = {
        "type": "log",
        "title": "message size (MB, log scale)",
        "range": [math.log10(lo), math.log10(hi)],
    }
    ticks = log_ticks(lo, hi)
    if len(ticks) >= 2:
        xaxis |= {"tickvals": ticks, "ticktext": [f"{t:g}" for t in ticks]}
    fig.update_layout(
        height=420,
        xaxis=xaxis,
        yaxis={"title": "bus bandwidth (GB/s)", "rangemode": "tozero"},
        legend=LEGEND_TOP,
        margin={"l": 10, "r": 20, "t": 40, "b": 50},
    )
    return fig


# --- rank × block ------------------------------------------------------------------------------

# Heatmap cells carry their value as text only where it is legible: "0.12" at 11 px needs about
# 30 px of cell width. Plot-area widths of the panel at the page's full width (1480 px), half
# (beside the bandwidth figure) or full width (the page puts it alone past WIDE_HEATMAP_BLOCKS).
HEATMAP_TEXT_MIN_CELL_PX = 36
HEATMAP_PLOT_PX = {"half": 560, "full": 1250}
WIDE_HEATMAP_BLOCKS = 12
# Colour cap: a unit far above the others (usually the root's first gather) would otherwise
# take the whole colour scale and leave every block the same pale shade.
HEATMAP_CAP_PERCENTILE = 95
HEATMAP_CAP_RATIO = 1.5


def block_order(run: RunAnalysis, blocks: list[str]) -> list[str]:
    """Execution order (first collective of each block, on the first rank that has it),
    then natural order for the rest."""

    def natural(name: str) -> list:
        return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(name))]

    coll = timing(run.collectives)
    first: dict[str, float] = {}
    if not coll.empty:
        ranks = coll["rank"].dropna().unique()
        one = coll[coll["rank"] == ranks[0]] if len(ranks) else coll
        first = one.groupby("block")["start_us"].min().to_dict()
    known = sorted((b for b in blocks if b in first), key=lambda b: first[b])
    return known + sorted((b for b in blocks if b not in first), key=natural)


def heatmap_grid(run: RunAnalysis) -> tuple[pd.DataFrame, bool] | None:
    """Rank × block per-step time (µs) of exposed communication (communication time on CPU
    traces), blocks in execution order; None with fewer than two ranks."""
    b = timing(run.blocks)
    ranks = [r for r in run.ranks if not r.blocks.empty]
    if b.empty or len(ranks) < 2:
        return None
    exposed = bool(b["exposed_us_per_step"].notna().any())
    column = "exposed_us_per_step" if exposed else "time_us_per_step"
    grid = b.groupby(["rank", "block"])[column].sum(min_count=1).unstack("block")
    rank_ids = list(dict.fromkeys(r.rank for r in ranks if r.rank in grid.index))
    return grid.reindex(index=rank_ids, columns=block_order(run, list(grid.columns))), exposed


def heatmap_wide(run: RunAnalysis) -> bool:
    """Whether the heatmap gets the page's full width (many blocks) instead of half."""
    found = heatmap_grid(run)
    return found is not None and found[0].shape[1] > WIDE_HEATMAP_BLOCKS


def colour_cap(z: np.ndarray, blocks: list[str], root: str = ROOT) -> float | None:
    """The top of the colour scale when the root (or another outlier) would saturate it: the
    HEATMAP_CAP_PERCENTILE-th percentile of the other cells, if the largest cell exceeds it
    HEATMAP_CAP_RATIO times; None when the plain scale reads fine."""
    others = z[:, [i for i, b in enumerate(blocks) if b != root]]
    others = others[np.isfinite(others)]
    every = z[np.isfinite(z)]
    if others.size < 2 or not every.size:
        return None
    cap = float(np.percentile(others, HEATMAP_CAP_PERCENTILE))
    return cap if cap > 0 and float(every.max()) > HEATMAP_CAP_RATIO * cap else None


def heatmap_figure(run: RunAnalysis):
    import plotly.graph_objects as go

    found = heatmap_grid(run)
    if found is None:
        return None
    grid, exposed = found
    blocks = list(grid.columns)
    labels = _labels(run)
    ylabels = [labels.get(r, f"rank {r}") for r in grid.index]
    z = np.round(grid.to_numpy(dtype=np.float64) / 1e3, 4)
    what = "exposed communication" if exposed else "communication time"
    width = HEATMAP_PLOT_PX["full" if len(blocks) > WIDE_HEATMAP_BLOCKS else "half"]
    legible = width / max(len(blocks), 1) >= HEATMAP_TEXT_MIN_CELL_PX
    cap = colour_cap(z, blocks, run.run.parallel.root if run.run else ROOT)
    colorbar_title, hover = "ms / step", "%{y} · %{x}<br>" + what + " %{z:.3f} ms per step"
    if cap is not None:
        colorbar_title += f"<br><sup>colour capped at {cap:.2f}<br>(95th pct. of blocks)</sup>"
        hover += f"<br><i>colour capped at {cap:.3f} ms</i>"
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=blocks,
            y=ylabels,
            colorscale="Reds" if exposed else "Blues",
            zmin=0,
            zmax=cap,
            colorbar={"title": {"text": colorbar_title, "side": "right"}, "thickness": 14},
            texttemplate="%{z:.2f}" if legible else None,
            textfont={"size": 11} if legible else None,
            hovertemplate=hover + "<extra></extra>",
            xgap=2,
            ygap=2,
            meta={"value": "exposed_us_per_step" if exposed else "time_us_per_step", "cap": cap},
        )
    )
    fig.update_layout(
        height=max(360, 34 * len(ylabels) + 190),
        xaxis={"title": "block (execution order)", "type": "category", "tickangle": -45},
        yaxis={"autorange": "reversed", "type": "category"},
        # Room at the top for plotly's toolbar, which otherwise sits on the first row.
        margin={"l": 10, "r": 20, "t": 44, "b": 60},
    )
    return fig


# --- what if ------------------------------------------------------------------------------


def whatif_figure(view):
    """Per candidate change (a `present.whatif.RankingView`), the predicted step with its
    uncertainty, the run's own step as a line, and the step a run with that change measured
    where there is one."""
    import plotly.graph_objects as go

    points = view.points
    if not points:
        return None
    labels = [p.label for p in points]
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=[p.predicted_ms for p in points],
            y=labels,
            mode="markers",
            name="predicted",
            marker={"size": 11, "color": COLORS["compute"]},
            error_x={"type": "data", "array": [p.uncertainty_ms for p in points], "width": 6},
            hovertext=[
                f"<b>{p.label}</b><br>predicted {p.predicted_ms:.2f} ± {p.uncertainty_ms:.2f} ms"
                f"<br>tokens/s/GPU {p.gain_pct:+.1f} %"
                for p in points
            ],
            hoverinfo="text",
        )
    )
    seen = [p for p in points if p.measured_ms is not None]
    if seen:
        fig.add_trace(
            go.Scatter(
                x=[p.measured_ms for p in seen],
                y=[p.label for p in seen],
                mode="markers",
                name="measured (a run with the change)",
                marker={"size": 12, "symbol": "diamond-open", "color": COLORS["exposed"]},
                hovertext=[f"<b>{p.label}</b><br>measured {p.measured_ms:.2f} ms" for p in seen],
                hoverinfo="text",
            )
        )
    fig.add_vline(
        x=view.measured_ms,
        line={"dash": "dot", "color": COLORS["idle"]},
        annotation_text=f"measured {view.measured_ms:.2f} ms"
        + (f" ({view.statistic})" if view.statistic else ""),
        annotation_position="top",
    )
    fig.update_layout(
        height=max(200, 44 * len(points) + 120),
        xaxis={"title": "ms per step for the measured step's tokens (the slowest rank)"},
        yaxis={"autorange": "reversed", "type": "category", "title": None},
        legend=LEGEND_TOP,
        margin={"l": 10, "r": 20, "t": 50, "b": 50},
    )
    return fig
