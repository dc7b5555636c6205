"""report.html: one self-contained page (plotly.js inlined once, opens offline from disk) with
the headline figures, a step timeline per rank, communication per block, bandwidth per
collective, the rank × block map of exposed time, and the profiler-distortion and HTA tables.

    from fsdp_trace.render.report import write_report
    write_report(analysis, Path("report.html"))

Every figure is stored once as JSON in the page and drawn by `Plotly.newPlot`; when all of
them have resolved, the page sets `data-fsdp-rendered` on <body> to the number drawn (the
browser test waits for it). Numbers follow README "Definitions"; times are in ms.
"""

from __future__ import annotations

import html
import itertools
import json
import math
import re
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fsdp_trace import __version__, atomic
from fsdp_trace.analysis.results import Analysis, RankAnalysis

# One color per meaning, everywhere in the report.
COLORS = {
    "compute": "#4e79a7",
    "AllGather": "#59a14f",
    "AllGather forward": "#59a14f",
    "AllGather backward": "#8c6bb1",
    "ReduceScatter": "#f28e2b",
    "other": "#9c755f",
    "memory": "#bab0ac",
    "exposed": "#e15759",
}
PHASE_COLORS = {
    "forward": "#e3ebf4",
    "backward": "#f3e8dc",
    "recompute": "#efe3ee",
    "optimizer": "#e6e6e6",
}
BLOCK_CATEGORIES = ("AllGather forward", "AllGather backward", "ReduceScatter")
MAX_TIMELINE_RANKS = 8
MAX_SCATTER_POINTS = 3000  # per collective type; more are sampled (SVG stays responsive)
FONT = 'system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif'
RENDERED_ATTRIBUTE = "data-fsdp-rendered"


@dataclass
class Card:
    key: str
    label: str
    value: str
    sub: str = ""
    tone: str = ""  # "", "good", "warn", "bad"


@dataclass
class Figure:
    key: str
    title: str
    caption: str
    figure: Any | None  # plotly.graph_objects.Figure, or None with `missing` said instead
    missing: str = ""


# ---------------------------------------------------------------------------------------------
# Small helpers


def _finite(value: Any) -> bool:
    try:
        return value is not None and math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _fmt(value: Any, fmt: str, unit: str = "") -> str:
    return f"{value:{fmt}}{unit}" if _finite(value) else "—"


def _timing_ranks(analysis: Analysis) -> list[RankAnalysis]:
    return [r for r in analysis.ranks if r.source != "detailed"]


def _rank_labels(ranks: list[RankAnalysis]) -> list[str]:
    numbers = [r.rank for r in ranks]
    unique = len(set(numbers)) == len(numbers) and None not in numbers
    if unique:
        return [f"rank {n}" for n in numbers]
    return [f"rank {'?' if r.rank is None else r.rank} ({Path(r.path).name})" for r in ranks]


def _timing(frame: pd.DataFrame) -> pd.DataFrame:
    if frame.empty or "source" not in frame:
        return frame
    return frame[frame["source"] != "detailed"]


def _values(frame: pd.DataFrame, column: str) -> np.ndarray:
    if frame.empty or column not in frame:
        return np.empty(0)
    values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=np.float64)
    return values[np.isfinite(values)]


def _short_kernel(name: str, limit: int = 90) -> str:
    name = str(name).replace("(anonymous namespace)::", "")
    if name.startswith("void "):
        name = name[5:]
    if len(name) > 60:
        cut = min((i for i in (name.find("<"), name.find("(")) if i > 0), default=len(name))
        name = name[:cut]
    name = name if len(name) <= limit else name[: limit - 1] + "…"
    return name.replace("<", "&lt;").replace(">", "&gt;")


def _mb(nbytes: Any) -> str:
    return f"{nbytes / 1e6:,.1f} MB" if _finite(nbytes) else "? MB"


def _block_order(analysis: Analysis, blocks: list[str]) -> list[str]:
    """Execution order (first collective of each block, on the first rank that has it),
    then natural order for the rest."""

    def natural(name: str) -> list:
        return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(name))]

    coll = _timing(analysis.collectives)
    first: dict[str, float] = {}
    if not coll.empty:
        ranks = coll["rank"].dropna().unique()
        one = coll[coll["rank"] == ranks[0]] if len(ranks) else coll
        first = one.groupby("block")["start_us"].min().to_dict()
    known = sorted((b for b in blocks if b in first), key=lambda b: first[b])
    rest = sorted((b for b in blocks if b not in first), key=natural)
    return known + rest


# ---------------------------------------------------------------------------------------------
# Summary cards and tables


def summary_cards(analysis: Analysis) -> list[Card]:
    """Headline figures: over the timing steps of every rank (median), and the capture's own."""
    steps = _timing(analysis.steps)
    cards: list[Card] = []
    n_ranks = len(_timing_ranks(analysis))
    n_rows = len(steps)
    per_rank = n_rows // n_ranks if n_ranks and n_rows % n_ranks == 0 else None
    over = (
        f"median of {n_rows} steps"
        if n_ranks <= 1
        else f"median of {per_rank} steps × {n_ranks} ranks"
        if per_rank
        else f"median of {n_rows} steps over {n_ranks} ranks"
    )
    exposed = _values(steps, "exposed_pct")
    cpu = any(r.device == "cpu" for r in analysis.ranks)
    if exposed.size:
        median = float(np.median(exposed))
        spread = (
            f" (range {exposed.min():.1f}–{exposed.max():.1f})"
            if exposed.min() != exposed.max()
            else ""
        )
        tone = "bad" if median >= 20 else "warn" if median >= 5 else "good"
        cards.append(
            Card(
                "exposed_pct",
                "Exposed communication",
                f"{median:.1f} %",
                f"of step time; {over}{spread}",
                tone,
            )
        )
    else:
        cards.append(
            Card(
                "exposed_pct",
                "Exposed communication",
                "—",
                "CPU (gloo) trace: not measured" if cpu else "no steps",
            )
        )
    overlap = _values(steps, "overlap_pct")
    if overlap.size:
        median = float(np.median(overlap))
        spread = (
            f" (range {overlap.min():.1f}–{overlap.max():.1f})"
            if overlap.min() != overlap.max()
            else ""
        )
        cards.append(
            Card(
                "overlap_pct",
                "Overlap",
                f"{median:.1f} %",
                f"of communication hidden by compute; {over}{spread}",
            )
        )
    else:
        why = "CPU (gloo) trace: not measured" if cpu else "no communication to overlap"
        cards.append(Card("overlap_pct", "Overlap", "—", why))
    step = _values(steps, "step_us")
    figures = (analysis.run or {}).get("figures") or {}
    unprofiled = (figures.get("step_time_ms") or {}).get("median")
    if step.size:
        sub = f"profiled, {over}"
        if _finite(unprofiled):
            sub += f"; un-profiled {unprofiled:.2f} ms"
        cards.append(Card("step_ms", "Step time", f"{np.median(step) / 1e3:.2f} ms", sub))
    elif _finite(unprofiled):
        cards.append(Card("step_ms", "Step time", f"{unprofiled:.2f} ms", "un-profiled median"))
    if _finite(figures.get("tokens_per_s_per_gpu")):
        cards.append(
            Card(
                "tokens_per_s_per_gpu",
                "Tokens/s per GPU",
                f"{figures['tokens_per_s_per_gpu']:,.0f}",
                "un-profiled steps",
            )
        )
    if _finite(figures.get("mfu")):
        tflops = figures.get("achieved_tflops_per_gpu")
        sub = f"{tflops:.0f} TFLOP/s per GPU" if _finite(tflops) else "model FLOPs utilization"
        cards.append(Card("mfu", "MFU", f"{100 * figures['mfu']:.1f} %", sub))
    if _finite(figures.get("scaling_efficiency")):
        base = figures.get("baseline_tokens_per_s")
        sub = f"vs 1 GPU at {base:,.0f} tokens/s" if _finite(base) else "vs the 1-GPU baseline"
        cards.append(
            Card(
                "scaling_efficiency",
                "Scaling efficiency",
                f"{100 * figures['scaling_efficiency']:.1f} %",
                sub,
            )
        )
    if _finite(figures.get("peak_allocated_gib")):
        reserved = figures.get("peak_reserved_gib")
        sub = f"allocated; {reserved:.2f} GiB reserved" if _finite(reserved) else "allocated"
        retries = figures.get("num_alloc_retries")
        if retries:
            sub += f"; {retries} allocator retries"
        cards.append(
            Card(
                "peak_memory",
                "Peak memory",
                f"{figures['peak_allocated_gib']:.2f} GiB",
                sub,
                "warn" if retries else "",
            )
        )
    elif _finite(figures.get("peak_rss_gib")):
        cards.append(
            Card(
                "peak_memory",
                "Peak memory",
                f"{figures['peak_rss_gib']:.2f} GiB",
                "resident set size (CPU)",
            )
        )
    return cards


def notices(analysis: Analysis) -> list[str]:
    items = list(analysis.notices)
    figures = (analysis.run or {}).get("figures") or {}
    items += [str(n) for n in figures.get("notices") or []]
    for label, r in zip(_rank_labels(analysis.ranks), analysis.ranks, strict=True):
        items += [f"{label}: {n}" for n in r.notices]
    return list(dict.fromkeys(items))


def _table(headers: list[str], rows: list[list[str]], key: str, numeric_from: int = 1) -> str:
    head = "".join(
        f'<th class="{"num" if i >= numeric_from else ""}">{html.escape(h)}</th>'
        for i, h in enumerate(headers)
    )
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="{"num" if i >= numeric_from else ""}">{html.escape(c)}</td>'
            for i, c in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return (
        f'<table class="data" data-table="{key}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table>"
    )


def _spread(values: np.ndarray, scale: float = 1.0, fmt: str = ".1f") -> str:
    if not values.size:
        return "—"
    median = f"{np.median(values) / scale:{fmt}}"
    if values.min() == values.max():
        return median
    return f"{median} ({values.min() / scale:{fmt}}–{values.max() / scale:{fmt}})"


def rank_table(analysis: Analysis) -> str:
    rows = []
    for label, r in zip(_rank_labels(analysis.ranks), analysis.ranks, strict=True):
        s = r.steps
        rows.append(
            [
                label,
                str(len(s)),
                _spread(_values(s, "step_us"), 1e3, ".2f"),
                _spread(_values(s, "exposed_pct")),
                _spread(_values(s, "overlap_pct")),
                _spread(_values(s, "comm_us"), 1e3, ".2f"),
                _spread(_values(s, "compute_us"), 1e3, ".2f"),
                _spread(_values(s, "idle_pct")),
            ]
        )
    headers = [
        "rank",
        "steps",
        "step ms",
        "exposed comm %",
        "overlap %",
        "comm ms",
        "compute ms",
        "idle %",
    ]
    return _table(headers, rows, "ranks")


def distortion_table(analysis: Analysis) -> str | None:
    items = analysis.distortion()
    if not items:
        return None
    rows = [
        [
            f"rank {d['rank']}",
            _fmt(d["detailed_step_us"] / 1e3, ".2f"),
            _fmt(d["timing_median_step_us"] / 1e3, ".2f"),
            _fmt(d["slowdown_pct"], "+.1f"),
            _fmt(d["detailed_exposed_pct"], ".1f"),
            _fmt(d["timing_exposed_pct"], ".1f"),
        ]
        for d in items
    ]
    headers = [
        "rank",
        "detailed step ms",
        "timing median ms",
        "slowdown %",
        "detailed exposed %",
        "timing exposed %",
    ]
    return _table(headers, rows, "distortion")


def hta_table(analysis: Analysis) -> str | None:
    hta = analysis.hta
    if hta is None or hta.empty:
        return None
    rows = [
        [
            f"rank {row.get('rank')}",
            _fmt(row.get("hta_pct"), ".2f"),
            _fmt(row.get("ours_hta_rules_pct"), ".2f"),
            _fmt(row.get("ours_steps_pct"), ".2f"),
        ]
        for row in hta.to_dict("records")
    ]
    headers = ["rank", "HTA overlap %", "fsdp-trace, HTA's rules %", "fsdp-trace, its steps %"]
    return _table(headers, rows, "hta")


@dataclass
class Diagnosis:
    """What the report shows of `fsdp_trace.diagnose`: the findings and the cross-rank view
    (None when it could not be computed: `error` says why)."""

    findings: list[Any]
    crossrank: Any | None
    error: str = ""


def diagnosis_of(analysis: Analysis) -> Diagnosis:
    """The analysis' own diagnosis when the caller ran it (the CLI does), else run it here, so
    that a report written from the Python API shows the findings and the cross-rank view too.
    A failing diagnosis must not cost the user the rest of the report: it becomes a notice."""
    if analysis.crossrank is not None:
        return Diagnosis(list(analysis.findings or []), analysis.crossrank)
    try:
        from fsdp_trace.diagnose import diagnose

        findings, crossrank = diagnose(analysis)
    except Exception as exc:  # reported on the page: the rest of the report is still written
        return Diagnosis(list(analysis.findings or []), None, f"{type(exc).__name__}: {exc}")
    return Diagnosis(list(findings), crossrank)


def findings_html(diagnosis: Diagnosis) -> str | None:
    """The diagnosis (what was seen, why it matters, what to change), most costly first
    (`Finding`s: objects with number, title, saw, why, change)."""
    items = diagnosis.findings
    if diagnosis.error:
        return (
            '<section class="panel" id="diagnosis"><h2>Diagnosis</h2>'
            f'<p class="missing">The diagnosis could not run ({html.escape(diagnosis.error)}): '
            "the figures below are unaffected.</p></section>"
        )
    if not items:
        return (
            '<section class="panel" id="diagnosis"><h2>Diagnosis</h2>'
            '<p class="caption">No rule found a problem (the rules and their thresholds are '
            "listed in the README).</p></section>"
        )
    rows = []
    for f in items:
        number = getattr(f, "number", "")
        rows.append(
            f'<div class="finding"><div class="title">{html.escape(str(number))}. '
            f"{html.escape(str(getattr(f, 'title', '')))}</div>"
            + "".join(
                f'<div class="line"><b>{label}</b> {html.escape(str(getattr(f, key)))}</div>'
                for key, label in (("saw", "saw:"), ("why", "why:"), ("change", "change:"))
                if getattr(f, key, None)
            )
            + "</div>"
        )
    return (
        '<section class="panel" id="diagnosis"><h2>Diagnosis</h2><p class="caption">'
        f"{len(items)} finding{'s' * (len(items) != 1)}, most costly first.</p>"
        + "".join(rows)
        + "</section>"
    )


def _column(frame: pd.DataFrame, name: str) -> pd.Series:
    """A column of the cross-rank frames, all-NaN when this version does not have it."""
    if name in frame:
        return pd.to_numeric(frame[name], errors="coerce")
    return pd.Series(np.nan, index=frame.index, dtype=np.float64)


def crossrank_usable(crossrank: Any) -> bool:
    """A cross-rank view with matched collectives and the per-rank table the report reads."""
    if crossrank is None:
        return False
    per_rank = getattr(crossrank, "per_rank", None)
    matched = getattr(crossrank, "matched", None)
    return (
        isinstance(per_rank, pd.DataFrame)
        and isinstance(matched, pd.DataFrame)
        and not matched.empty
        and "rank" in per_rank
        and len(per_rank) > 0
    )


def crossrank_table(analysis: Analysis, crossrank: Any) -> str | None:
    """Per rank: waiting inside NCCL kernels for peers (ms per step and share of the rank's
    median step), how often it arrived last, and its clock offset."""
    if not crossrank_usable(crossrank):
        return None
    per_rank = crossrank.per_rank
    steps = _timing(analysis.steps)
    median_step = steps.groupby("rank")["step_us"].median() if len(steps) else pd.Series()
    wait = _column(per_rank, "wait_us_per_step")
    share = _column(per_rank, "wait_pct")
    last, last_share = _column(per_rank, "arrived_last"), _column(per_rank, "arrived_last_share")
    offset, matched = _column(per_rank, "clock_offset_us"), _column(per_rank, "n_matched")
    rows = []
    for i, rank in enumerate(per_rank["rank"].tolist()):
        pct = share.iloc[i]
        if not _finite(pct) and _finite(wait.iloc[i]) and _finite(median_step.get(rank)):
            pct = 100.0 * wait.iloc[i] / median_step.get(rank)
        arrived = "—"
        if _finite(last.iloc[i]):
            arrived = f"{int(last.iloc[i])}"
            if _finite(last_share.iloc[i]):
                arrived += f" ({100 * last_share.iloc[i]:.0f} %)"
        rows.append(
            [
                f"rank {rank}",
                _fmt(matched.iloc[i], ",.0f") if _finite(matched.iloc[i]) else "—",
                _fmt(wait.iloc[i] / 1e3 if _finite(wait.iloc[i]) else None, ".2f"),
                _fmt(pct, ".1f"),
                arrived,
                _fmt(offset.iloc[i], "+.1f"),
            ]
        )
    headers = [
        "rank",
        "matched collectives",
        "waiting ms / step",
        "waiting % of step",
        "arrived last",
        "clock offset µs",
    ]
    return _table(headers, rows, "crossrank")


def transfer_table(analysis: Analysis, crossrank: Any) -> str | None:
    """Per collective type: bus bandwidth from each kernel's own duration (waiting included,
    a lower bound) beside bus bandwidth from the cross-rank transfer time."""
    if not crossrank_usable(crossrank) or "collective" not in crossrank.matched:
        return None
    matched = crossrank.matched
    transfer_bw = _column(matched, "transfer_busbw_gbps")
    sizes = _column(matched, "bytes")
    coll = _timing(analysis.collectives)
    rows = []
    for kind in sorted(matched["collective"].dropna().astype(str).unique()):
        mine = (matched["collective"].astype(str) == kind).to_numpy()
        bw = transfer_bw[mine].to_numpy()
        bw = bw[np.isfinite(bw)]
        kernel = _values(coll[coll["collective"] == kind], "busbw_gbps") if len(coll) else []
        rows.append(
            [
                kind,
                f"{int(mine.sum()):,}",
                _fmt(float(np.nanmedian(sizes[mine])) / 1e6 if mine.any() else None, ",.1f"),
                _fmt(float(np.median(kernel)) if len(kernel) else None, ",.1f"),
                _fmt(float(np.median(bw)) if bw.size else None, ",.1f"),
                _fmt(float(np.percentile(bw, 90)) if bw.size else None, ",.1f"),
            ]
        )
    if not rows:
        return None
    headers = [
        "collective",
        "matched",
        "median MB",
        "busbw from kernel time, median GB/s",
        "busbw from transfer time, median GB/s",
        "p90 GB/s",
    ]
    return _table(headers, rows, "transfer")


def crossrank_html(analysis: Analysis, crossrank: Any, shown: Collection[str] = ()) -> str | None:
    """The "Across ranks" panel: per-rank waiting and arrival, transfer-based bandwidth, and the
    cross-rank notices not `shown` already among the page's notices."""
    ranks_table = crossrank_table(analysis, crossrank)
    if ranks_table is None:
        return None
    n = len(crossrank.matched)
    notes = [str(x) for x in getattr(crossrank, "notices", None) or [] if str(x) not in shown]
    caption = (
        f"{n:,} collectives matched across ranks. A collective ends at about the same moment on "
        "every rank, so the shortest duration across ranks approximates the transfer; each "
        "rank's excess is waiting for the last to arrive (a straggler shows as the others' "
        "waiting). Clocks are aligned by matched end times when they disagree."
    )
    transfer = transfer_table(analysis, crossrank)
    return (
        '<section class="panel" id="crossrank"><h2>Across ranks</h2>'
        f'<p class="caption">{html.escape(caption)}</p>{ranks_table}'
        + (
            '<p class="caption">Bandwidth: a kernel\'s duration includes waiting for peers; '
            "the transfer time does not.</p>" + transfer
            if transfer
            else ""
        )
        + "".join(f'<p class="caption">{html.escape(note)}</p>' for note in notes)
        + "</section>"
    )


# ---------------------------------------------------------------------------------------------
# Figures


def representative_step(r: RankAnalysis) -> pd.Series | None:
    """The median-length step of a rank (the lower middle one for an even count)."""
    steps = r.steps
    if steps.empty:
        return None
    ordered = steps.sort_values(["step_us", "step"], kind="stable").reset_index(drop=True)
    return ordered.iloc[(len(ordered) - 1) // 2]


def representative_steps(ranks: list[RankAnalysis]) -> dict[int, pd.Series]:
    """One step per rank (keyed by id(rank)): the same step number on every rank when they
    share steps (collectives pair up across ranks, so a wait on one rank shows beside its
    cause on another): the one of median length averaged over ranks; else each rank's own
    median-length step."""
    ranks = [r for r in ranks if not r.steps.empty]
    if not ranks:
        return {}
    common = set.intersection(*(set(r.steps["step"].tolist()) for r in ranks))
    if not common:
        chosen = {id(r): representative_step(r) for r in ranks}
        return {k: v for k, v in chosen.items() if v is not None}
    both = pd.concat([r.steps[r.steps["step"].isin(common)] for r in ranks])
    mean = both.groupby("step")["step_us"].mean().sort_values(kind="stable")
    number = mean.index[(len(mean) - 1) // 2]
    return {id(r): r.steps[r.steps["step"] == number].iloc[0] for r in ranks}


def phase_spans(compute: pd.DataFrame, main_streams: list[int]) -> pd.DataFrame:
    """Contiguous runs of one phase (forward, backward, recompute, optimizer) among the compute
    kernels of the main stream(s), each running until the next one starts; runs shorter than
    0.5 % of the whole are folded into their neighbours."""
    on_main = compute[compute["stream"].isin(main_streams)] if main_streams else compute
    k = (on_main if not on_main.empty else compute).sort_values("ts", kind="stable")
    if k.empty:
        return pd.DataFrame(columns=["phase", "start", "end"])
    phase = k["phase"].astype(str).to_numpy()
    ts, end = k["ts"].to_numpy(dtype=np.float64), k["end"].to_numpy(dtype=np.float64)
    spans: list[list] = []
    for p, a, b in zip(phase, ts, end, strict=True):
        if spans and spans[-1][0] == p:
            spans[-1][2] = max(spans[-1][2], b)
        else:
            spans.append([p, a, b])
    total = end.max() - ts.min()
    for _ in range(2):  # fold short runs, then merge the neighbours that now touch
        spans = [sp for sp in spans if sp[2] - sp[1] >= 0.005 * total] or spans[:1]
        merged: list[list] = []
        for sp in spans:
            if merged and merged[-1][0] == sp[0]:
                merged[-1][2] = max(merged[-1][2], sp[2])
            else:
                merged.append(list(sp))
        spans = merged
    for this, following in itertools.pairwise(spans):
        this[2] = following[1]
    return pd.DataFrame(spans, columns=["phase", "start", "end"])


def _gpu_rows(r: RankAnalysis, step: pd.Series) -> tuple[list[str], list[dict[str, Any]]]:
    """Row labels and bar groups (one per kind) of one rank's step on the GPU."""
    k = r.kernels
    k = k[k["step"] == step["step"]]
    t0 = float(step["start_us"])
    roles = r.streams

    def label(stream: int) -> str:
        return f"{roles.get(int(stream), 'stream')} · s{int(stream)}"

    def rank_of(stream: int) -> tuple[int, int]:
        role = roles.get(int(stream), "")
        order = 0 if role == "compute" else 1 if role.startswith("compute") else 2
        order = 3 if "NCCL" in role or role == "communication" else order
        return (order, int(stream))

    streams = sorted(k["stream"].unique(), key=rank_of)
    rows = [label(s) for s in streams]
    groups: list[dict[str, Any]] = []

    # Phases: runs of one phase on the main compute stream, drawn on the top row.
    comp = k[k["kind"] == "compute"]
    spans = phase_spans(comp, [s for s, role in roles.items() if role == "compute"])
    if not spans.empty:
        rows.insert(0, "phase")
        groups.append(
            {
                "kind": "phase",
                "y": ["phase"] * len(spans),
                "base": (spans["start"].to_numpy() - t0) / 1e3,
                "x": (spans["end"] - spans["start"]).to_numpy() / 1e3,
                "text": list(spans["phase"]),
                "colors": [PHASE_COLORS.get(p, "#e6e6e6") for p in spans["phase"]],
                "hover": [
                    f"<b>{p}</b><br>{(e - s) / 1e3:.2f} ms, from {(s - t0) / 1e3:.2f} ms"
                    for p, s, e in zip(spans["phase"], spans["start"], spans["end"], strict=True)
                ],
            }
        )

    def bars(kind: str, frame: pd.DataFrame, hover: list[str]) -> None:
        if frame.empty:
            return
        groups.append(
            {
                "kind": kind,
                "y": [label(s) for s in frame["stream"]],
                "base": (frame["ts"].to_numpy(dtype=np.float64) - t0) / 1e3,
                "x": frame["dur"].to_numpy(dtype=np.float64) / 1e3,
                "hover": hover,
            }
        )

    hover = [
        f"<b>{_short_kernel(n)}</b><br>{b if isinstance(b, str) else 'no block'} · {p}<br>"
        f"{d:,.1f} µs at {(s - t0) / 1e3:.3f} ms"
        for n, b, p, d, s in zip(
            comp["name"], comp["block"], comp["phase"], comp["dur"], comp["ts"], strict=True
        )
    ]
    bars("compute", comp, hover)
    mem = k[k["kind"].isin(["memcpy", "memset"])]
    bars(
        "memory",
        mem,
        [
            f"<b>{_short_kernel(n)}</b><br>{d:,.1f} µs at {(s - t0) / 1e3:.3f} ms"
            for n, d, s in zip(mem["name"], mem["dur"], mem["ts"], strict=True)
        ],
    )
    comm = k[k["kind"] == "comm"]
    if not comm.empty:
        info = r.collectives
        keep = [
            "correlation",
            "collective",
            "block",
            "phase",
            "bytes",
            "algbw_gbps",
            "busbw_gbps",
            "exposed_us",
            "issued_by",
            "prefetched",
        ]
        comm = comm.drop(columns=["block", "phase"]).merge(
            info[keep].drop_duplicates("correlation"), on="correlation", how="left"
        )
        comm["collective"] = comm["collective"].fillna("other")
        for kind, part in _by_collective(comm):
            bars(kind, part, [_comm_hover(row, t0) for row in part.to_dict("records")])
    exposed = r.exposed
    if not exposed.empty:
        running = pd.Series(r.exposed_collectives(), index=exposed.index)
        exposed = exposed[exposed["step"] == step["step"]]
    if not exposed.empty:
        rows.append("exposed comm")
        s = exposed["start_us"].to_numpy(dtype=np.float64)
        e = exposed["end_us"].to_numpy(dtype=np.float64)
        coll = r.collectives
        names = [
            f"{c} {b} {p}"
            for c, b, p in zip(coll["collective"], coll["block"], coll["phase"], strict=True)
        ]
        during = [
            "during " + ", ".join(names[j] for j in rows_[:3]) if rows_ else ""
            for rows_ in running.loc[exposed.index]
        ]
        groups.append(
            {
                "kind": "exposed",
                "y": ["exposed comm"] * len(s),
                "base": (s - t0) / 1e3,
                "x": (e - s) / 1e3,
                "hover": [
                    f"<b>exposed</b> {(b - a):,.1f} µs at {(a - t0) / 1e3:.3f} ms<br>{d}"
                    for a, b, d in zip(s, e, during, strict=True)
                ],
            }
        )
    return rows, groups


def _by_collective(frame: pd.DataFrame):
    for kind in ("AllGather", "ReduceScatter"):
        part = frame[frame["collective"] == kind]
        if not part.empty:
            yield kind, part
    other = frame[~frame["collective"].isin(["AllGather", "ReduceScatter"])]
    if not other.empty:
        yield "other", other


def _comm_hover(row: dict[str, Any], t0: float) -> str:
    start = row.get("ts", row.get("start_us"))
    dur = row.get("dur", row.get("dur_us"))
    block = row.get("block") if isinstance(row.get("block"), str) else "unattributed"
    text = f"<b>{row.get('collective')}</b> {block} · {row.get('phase')}<br>"
    text += f"{_mb(row.get('bytes'))} in {dur:,.1f} µs at {(start - t0) / 1e3:.3f} ms<br>"
    text += (
        f"busbw {_fmt(row.get('busbw_gbps'), ',.1f')} GB/s · "
        f"algbw {_fmt(row.get('algbw_gbps'), ',.1f')} GB/s"
    )
    if _finite(row.get("exposed_us")):
        text += f"<br>exposed {row['exposed_us']:,.1f} µs"
    issued = row.get("issued_by")
    if isinstance(issued, str) and issued != block:
        text += f"<br>issued by {issued}"
    if row.get("prefetched") is True:
        text += " (prefetched)"
    return text


def _cpu_rows(r: RankAnalysis, step: pd.Series) -> tuple[list[str], list[dict[str, Any]]]:
    """A CPU (gloo) rank: its collectives on gloo's threads (there are no kernels)."""
    c = r.collectives
    if c.empty:
        return [], []
    c = c[c["step"] == step["step"]]
    t0 = float(step["start_us"])
    threads = sorted(c["stream"].unique())
    rows = [f"gloo thread {t}" for t in threads]
    groups = []
    for kind, part in _by_collective(c):
        groups.append(
            {
                "kind": kind,
                "y": [f"gloo thread {t}" for t in part["stream"]],
                "base": (part["start_us"].to_numpy(dtype=np.float64) - t0) / 1e3,
                "x": part["dur_us"].to_numpy(dtype=np.float64) / 1e3,
                "hover": [_comm_hover(row, t0) for row in part.to_dict("records")],
            }
        )
    return rows, groups


def timeline_ranks(analysis: Analysis) -> list[RankAnalysis]:
    """The ranks drawn on the timeline: all, or the most and least exposed when many."""
    ranks = [r for r in _timing_ranks(analysis) if not r.steps.empty]
    if len(ranks) <= MAX_TIMELINE_RANKS:
        return ranks

    def exposure(r: RankAnalysis) -> float:
        values = _values(r.steps, "exposed_pct")
        return float(np.median(values)) if values.size else -1.0

    ordered = sorted(ranks, key=exposure, reverse=True)
    half = MAX_TIMELINE_RANKS // 2
    chosen = {id(r) for r in ordered[:half] + ordered[-(MAX_TIMELINE_RANKS - half) :]}
    return [r for r in ranks if id(r) in chosen]


def timeline_figure(analysis: Analysis):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    ranks = timeline_ranks(analysis)
    labels = dict(zip(map(id, analysis.ranks), _rank_labels(analysis.ranks), strict=True))
    panels = []
    chosen = representative_steps(ranks)
    for r in ranks:
        step = chosen.get(id(r))
        if step is None:
            continue
        rows, groups = (_gpu_rows if r.device == "gpu" and not r.kernels.empty else _cpu_rows)(
            r, step
        )
        if groups:
            panels.append((r, step, rows, groups))
    if not panels:
        return None
    heights = [len(rows) for _, _, rows, _ in panels]
    titles = []
    for r, step, _, _ in panels:
        lengths = _values(r.steps, "step_us")
        title = (
            f"<b>{labels[id(r)]}</b> — step {int(step['step'])}: {step['step_us'] / 1e3:.2f} ms"
            f" (this rank's median {np.median(lengths) / 1e3:.2f} ms over {lengths.size})"
        )
        if _finite(step["exposed_pct"]) and _finite(step["comm_us"]) and step["comm_us"] > 0:
            title += f", exposed {step['exposed_pct']:.1f} %, overlap "
            title += _fmt(step["overlap_pct"], ".1f", " %")
        titles.append(title)
    per_row, gap = 26, 70
    height = sum(heights) * per_row + gap * len(panels) + 110
    fig = make_subplots(
        rows=len(panels),
        cols=1,
        shared_xaxes=True,
        row_heights=[h / sum(heights) for h in heights],
        vertical_spacing=min(gap / height, 0.3 / max(len(panels) - 1, 1)),
        subplot_titles=titles,
    )
    names = {
        "compute": "compute kernels",
        "AllGather": "AllGather",
        "ReduceScatter": "ReduceScatter",
        "other": "other collectives",
        "memory": "memcpy / memset",
        "exposed": "exposed communication",
        "phase": "phase",
    }
    shown: set[str] = set()
    for index, (_, _, rows, groups) in enumerate(panels, start=1):
        for g in groups:
            kind = g["kind"]
            fig.add_trace(
                go.Bar(
                    orientation="h",
                    y=g["y"],
                    x=np.round(g["x"], 5),
                    base=np.round(g["base"], 5),
                    name=names[kind],
                    legendgroup=kind,
                    showlegend=kind not in shown and kind != "phase",
                    marker={
                        "color": g["colors"] if "colors" in g else COLORS[kind],
                        "line": {"width": 0},
                    },
                    text=g.get("text"),
                    textposition="inside" if "text" in g else None,
                    insidetextanchor="middle" if "text" in g else None,
                    textfont={"color": "#333", "size": 11} if "text" in g else None,
                    hovertext=g["hover"],
                    hoverinfo="text",
                    meta={"kind": kind},
                ),
                row=index,
                col=1,
            )
            shown.add(kind)
        fig.update_yaxes(
            categoryorder="array",
            categoryarray=rows,
            autorange="reversed",
            row=index,
            col=1,
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


def block_table(analysis: Analysis) -> pd.DataFrame:
    """Per block × category (AllGather forward / backward, ReduceScatter, others), per step:
    time and exposed time (µs), mean over the ranks that have the block (timing traces)."""
    b = _timing(analysis.blocks)
    columns = [
        "block",
        "category",
        "time_us",
        "exposed_us",
        "bytes",
        "busbw_gbps",
        "count",
        "ranks",
    ]
    if b.empty:
        return pd.DataFrame(columns=columns)
    coll = b["collective"].astype(str)
    b = b.assign(
        category=np.where(
            coll == "AllGather",
            np.where(b["phase"] == "forward", "AllGather forward", "AllGather backward"),
            coll,
        )
    )
    per_rank = (
        b.groupby(["rank", "block", "category"], dropna=False, sort=False)
        .agg(
            time_us=("time_us_per_step", "sum"),
            exposed_us=("exposed_us_per_step", lambda s: s.sum(min_count=1)),
            bytes=("bytes_per_step", lambda s: s.sum(min_count=1)),
            busbw_gbps=("busbw_gbps", "mean"),
            count=("count_per_step", "sum"),
        )
        .reset_index()
    )
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


def blocks_figure(analysis: Analysis):
    import plotly.graph_objects as go

    table = block_table(analysis)
    if table.empty:
        return None
    has_exposed = table["exposed_us"].notna().any()
    totals = table.groupby("block").agg(
        exposed=("exposed_us", lambda s: s.sum(min_count=1)), time=("time_us", "sum")
    )
    order = totals.sort_values(["exposed", "time"], ascending=False, na_position="last").index
    order = list(order)  # worst first: drawn at the top
    categories = [c for c in BLOCK_CATEGORIES if c in set(table["category"])]
    categories += sorted(set(table["category"]) - set(BLOCK_CATEGORIES))
    ranks = int(table["ranks"].max())
    fig = go.Figure()
    for cat in categories:
        part = table[table["category"] == cat].set_index("block").reindex(order)
        color = COLORS.get(cat, COLORS["other"])
        time_ms = part["time_us"].to_numpy(dtype=np.float64) / 1e3
        exposed_ms = part["exposed_us"].to_numpy(dtype=np.float64) / 1e3
        hover = []
        for block, row in part.iterrows():
            if pd.isna(row["time_us"]):
                hover.append("")
                continue
            text = f"<b>{block}</b> · {cat}<br>{row['time_us'] / 1e3:.3f} ms per step"
            if _finite(row["exposed_us"]):
                share = 100 * row["exposed_us"] / row["time_us"] if row["time_us"] else 0.0
                text += f", exposed {row['exposed_us'] / 1e3:.3f} ms ({share:.0f} %)"
            text += f"<br>{row['count']:g} per step · {_mb(row['bytes'])}"
            text += f" · busbw {_fmt(row['busbw_gbps'], ',.1f')} GB/s"
            if row["ranks"] > 1:
                text += f"<br>mean of {int(row['ranks'])} ranks"
            hover.append(text)
        if has_exposed:
            hidden = np.clip(time_ms - np.nan_to_num(exposed_ms), 0, None)
            parts = [("exposed", np.nan_to_num(exposed_ms)), ("hidden", hidden)]
        else:
            parts = [("time", time_ms)]
        for part_name, values in parts:
            exposed_part = part_name == "exposed"
            marker: dict[str, Any] = {"color": color, "line": {"width": 0}}
            if exposed_part:
                marker["pattern"] = {
                    "shape": "/",
                    "fgcolor": COLORS["exposed"],
                    "size": 7,
                    "solidity": 0.45,
                }
                marker["line"] = {"width": 1, "color": COLORS["exposed"]}
            elif has_exposed:
                marker["opacity"] = 0.45
            fig.add_trace(
                go.Bar(
                    orientation="h",
                    y=order,
                    x=np.round(np.nan_to_num(values), 5),
                    name=f"{cat} — {part_name}" if has_exposed else cat,
                    legendgroup=cat,
                    marker=marker,
                    hovertext=hover,
                    hoverinfo="text",
                    meta={"category": cat, "part": part_name},
                )
            )
    unit = f", mean of {ranks} ranks" if ranks > 1 else ""
    fig.update_layout(
        barmode="stack",
        height=max(260, 28 * len(order) + 150),
        xaxis_title=f"communication time per step (ms{unit})",
        yaxis={
            "categoryorder": "array",
            "categoryarray": order,
            "autorange": "reversed",
            "title": None,
        },
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 0},
        margin={"l": 10, "r": 20, "t": 40, "b": 50},
        bargap=0.3,
    )
    return fig


def _log_ticks(lo: float, hi: float) -> list[float]:
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


def bandwidth_figure(analysis: Analysis, crossrank: Any = None):
    """Bus bandwidth against message size: every kernel (its duration includes waiting for
    peers: a lower bound), and, with a cross-rank view, every matched collective's transfer
    time (the shortest duration across ranks: closer to what the link did)."""
    import plotly.graph_objects as go

    c = _timing(analysis.collectives)
    if c.empty:
        return None
    c = c[
        (pd.to_numeric(c["bytes"], errors="coerce") > 0)
        & np.isfinite(pd.to_numeric(c["busbw_gbps"], errors="coerce").astype(float))
    ]
    if c.empty:
        return None
    labels = dict(zip([r.rank for r in analysis.ranks], _rank_labels(analysis.ranks), strict=False))
    fig = go.Figure()
    for kind, part in _by_collective(c):
        name = kind if kind != "other" else "other collectives"
        if len(part) > MAX_SCATTER_POINTS:
            name += f" ({MAX_SCATTER_POINTS:,} of {len(part):,}, sampled)"
            part = part.sample(n=MAX_SCATTER_POINTS, random_state=0).sort_index()
        hover = [
            f"<b>{row['collective']}</b> {row['block']} · {row['phase']}<br>"
            f"{labels.get(row['rank'], 'rank ?')}, step {row['step']}<br>"
            f"{_mb(row['bytes'])} in {row['dur_us']:,.1f} µs<br>"
            f"busbw {row['busbw_gbps']:,.1f} GB/s · algbw {_fmt(row['algbw_gbps'], ',.1f')} GB/s"
            for row in part.to_dict("records")
        ]
        fig.add_trace(
            go.Scatter(
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
        )
    for kind, part in _transfer_points(crossrank):
        name = f"{kind if kind != 'other' else 'other collectives'}, transfer time"
        if len(part) > MAX_SCATTER_POINTS:
            name += f" ({MAX_SCATTER_POINTS:,} of {len(part):,}, sampled)"
            part = part.sample(n=MAX_SCATTER_POINTS, random_state=0).sort_index()
        fig.add_trace(
            go.Scatter(
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
                hovertext=[
                    f"<b>{row['collective']}</b> {row.get('block', '')} · {row.get('phase', '')}"
                    f", step {row.get('step', '?')}<br>matched across ranks: transfer "
                    f"{_fmt(row.get('transfer_us'), ',.1f')} µs for {_mb(row['bytes'])}<br>"
                    f"busbw {row['transfer_busbw_gbps']:,.1f} GB/s"
                    for row in part.to_dict("records")
                ],
                hoverinfo="text",
                meta={"kind": kind, "basis": "transfer"},
            )
        )
    sizes = c["bytes"].to_numpy(dtype=np.float64) / 1e6
    lo, hi = float(sizes.min()) / 1.4, float(sizes.max()) * 1.4
    ticks = _log_ticks(lo, hi)
    xaxis = {
        "type": "log",
        "title": "message size (MB, log scale)",
        "range": [math.log10(lo), math.log10(hi)],
    }
    if len(ticks) >= 2:
        xaxis |= {"tickvals": ticks, "ticktext": [f"{t:g}" for t in ticks]}
    fig.update_layout(
        height=420,
        xaxis=xaxis,
        yaxis={"title": "bus bandwidth (GB/s)", "rangemode": "tozero"},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 0},
        margin={"l": 10, "r": 20, "t": 40, "b": 50},
    )
    return fig


def _transfer_points(crossrank: Any):
    """(kind, matched collectives with a finite transfer busbw and size) per collective kind."""
    if not crossrank_usable(crossrank):
        return
    m = crossrank.matched
    if not {"collective", "bytes", "transfer_busbw_gbps"} <= set(m.columns):
        return
    m = m[
        (pd.to_numeric(m["bytes"], errors="coerce") > 0)
        & np.isfinite(pd.to_numeric(m["transfer_busbw_gbps"], errors="coerce").astype(float))
    ]
    yield from _by_collective(m)


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


def heatmap_grid(analysis: Analysis) -> tuple[pd.DataFrame, bool] | None:
    """Rank × block per-step time (µs) of exposed communication (communication time on CPU
    traces), blocks in execution order; None with fewer than two ranks."""
    b = _timing(analysis.blocks)
    ranks = [r for r in _timing_ranks(analysis) if not r.blocks.empty]
    if b.empty or len(ranks) < 2:
        return None
    exposed = bool(b["exposed_us_per_step"].notna().any())
    column = "exposed_us_per_step" if exposed else "time_us_per_step"
    grid = b.groupby(["rank", "block"])[column].sum(min_count=1).unstack("block")
    blocks = _block_order(analysis, list(grid.columns))
    rank_ids = [r.rank for r in ranks if r.rank in grid.index]
    return grid.reindex(index=list(dict.fromkeys(rank_ids)), columns=blocks), exposed


def heatmap_wide(analysis: Analysis) -> bool:
    """Whether the heatmap gets the page's full width (many blocks) instead of half."""
    found = heatmap_grid(analysis)
    return found is not None and found[0].shape[1] > WIDE_HEATMAP_BLOCKS


def colour_cap(z: np.ndarray, blocks: list[str], root: str = "root") -> float | None:
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


def heatmap_figure(analysis: Analysis):
    import plotly.graph_objects as go

    found = heatmap_grid(analysis)
    if found is None:
        return None
    grid, exposed = found
    blocks = list(grid.columns)
    labels = dict(zip([r.rank for r in analysis.ranks], _rank_labels(analysis.ranks), strict=False))
    ylabels = [labels.get(r, f"rank {r}") for r in grid.index]
    z = np.round(grid.to_numpy(dtype=np.float64) / 1e3, 4)
    what = "exposed communication" if exposed else "communication time"
    width = HEATMAP_PLOT_PX["full" if len(blocks) > WIDE_HEATMAP_BLOCKS else "half"]
    legible = width / max(len(blocks), 1) >= HEATMAP_TEXT_MIN_CELL_PX
    root = (analysis.run or {}).get("parallel", {}).get("root") or "root"
    cap = colour_cap(z, blocks, root)
    colorbar_title = "ms / step"
    if cap is not None:
        colorbar_title += f"<br><sup>colour capped at {cap:.2f}<br>(95th pct. of blocks)</sup>"
    hover = "%{y} · %{x}<br>" + what + " %{z:.3f} ms per step"
    if cap is not None:
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


def figures(analysis: Analysis, diagnosis: Diagnosis | None = None) -> list[Figure]:
    """Every figure of the report, in page order (None where there is nothing to draw)."""
    crossrank = (diagnosis or diagnosis_of(analysis)).crossrank
    transfer = crossrank_usable(crossrank)
    gpu = any(r.device == "gpu" for r in analysis.ranks)
    no_comm = _timing(analysis.collectives).empty
    shown, total = len(timeline_ranks(analysis)), len([r for r in analysis.ranks if len(r.steps)])
    subset = (
        f" Showing {shown} of {total} ranks: the most and the least exposed."
        if shown < total
        else ""
    )
    out = [
        Figure(
            "timeline",
            "Step timeline",
            "One representative step: the timing step of median length (averaged over ranks), "
            "the same step on every rank. Rows are GPU streams; bars are kernels, colored "
            "compute / AllGather / ReduceScatter; the bottom row shows when communication ran "
            "with no compute beside it (exposed). Hover a bar for its block, phase, bytes and "
            "bandwidth; drag to zoom, double-click to reset." + subset
            if gpu
            else "One representative step: the step of median length (averaged over ranks). "
            "A CPU (gloo) trace has no GPU kernels: the bars are the collectives on gloo's "
            "threads." + subset,
            timeline_figure(analysis),
            "No profiled steps to draw.",
        ),
        Figure(
            "blocks",
            "Communication per block",
            "Per step, worst exposed first: AllGather in forward, AllGather in backward "
            "(including recompute), ReduceScatter. Hatched red: the part not hidden by compute."
            if gpu
            else "Per step, longest first. On CPU (gloo) traces exposure is not measured.",
            blocks_figure(analysis),
            "No collectives: a single-GPU (or non-distributed) trace has nothing to attribute."
            if no_comm
            else "No per-block figures.",
        ),
        Figure(
            "bandwidth",
            "Bandwidth per collective",
            "Bus bandwidth (nccl-tests convention) against message size. Circles: each kernel's "
            "own duration, which includes waiting for peers (lower bounds)."
            + (
                " Diamonds: each collective matched across ranks, over its transfer time (the "
                "shortest duration across ranks)."
                if transfer
                else ""
            ),
            bandwidth_figure(analysis, crossrank),
            "No collectives with a known size and duration." if not no_comm else "No collectives.",
        ),
        Figure(
            "heatmap",
            "Exposed communication, rank × block" if gpu else "Communication time, rank × block",
            "Per step, summed over phases and collectives: a straggler shows as a row. Where one "
            "unit (usually the root) is far above the blocks, the colour is capped at the 95th "
            "percentile of the other cells (said on the colour bar); hover shows every value."
            if gpu
            else "Communication time per step (exposure is not measured on CPU traces).",
            heatmap_figure(analysis),
            "Needs collectives from two ranks or more.",
        ),
    ]
    return out


# ---------------------------------------------------------------------------------------------
# The page


def _template() -> dict[str, Any]:
    import plotly.io as pio
    from plotly.io.json import to_json_plotly

    template = json.loads(to_json_plotly(pio.templates["plotly_white"].to_plotly_json()))
    layout = template.setdefault("layout", {})
    layout["font"] = {"family": FONT, "size": 12, "color": "#2a2f36"}
    layout["hoverlabel"] = {"font": {"family": FONT, "size": 12}, "align": "left"}
    layout["paper_bgcolor"] = "rgba(0,0,0,0)"
    return template


def _figure_json(fig) -> dict[str, Any]:
    data = json.loads(fig.to_json())
    data.get("layout", {}).pop("template", None)
    return data


def _script_json(payload: Any) -> str:
    """JSON safe inside <script>: no '<' at all (so no '</script>' or '<!--')."""
    text = json.dumps(payload, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


CSS = """
:root { --ink:#2a2f36; --muted:#6b7480; --line:#e3e6ea; --bg:#f6f7f9; --card:#fff;
  --compute:%(compute)s; --ag:%(AllGather)s; --rs:%(ReduceScatter)s; --exposed:%(exposed)s; }
* { box-sizing:border-box; }
body { margin:0; background:var(--bg); color:var(--ink); font:14px/1.45 %(font)s; }
header { background:#1f2933; color:#fff; padding:22px 32px 18px; }
header h1 { margin:0 0 4px; font-size:22px; font-weight:600; letter-spacing:.2px; }
header .meta { color:#c5ccd6; font-size:13px; }
header .meta b { color:#fff; font-weight:600; }
main { max-width:1480px; margin:0 auto; padding:20px 32px 40px; }
.cards { display:grid; grid-template-columns:repeat(auto-fill,minmax(165px,1fr)); gap:12px;
  margin-bottom:18px; }
.card { background:var(--card); border:1px solid var(--line); border-radius:8px;
  padding:12px 14px; border-top:4px solid #9aa5b1; }
.card.good { border-top-color:#59a14f; } .card.warn { border-top-color:#edc948; }
.card.bad { border-top-color:var(--exposed); }
.card .label { color:var(--muted); font-size:12px; text-transform:uppercase;
  letter-spacing:.4px; }
.card .value { font-size:26px; font-weight:600; margin:2px 0; white-space:nowrap; }
.card .sub { color:var(--muted); font-size:12px; }
.notices { background:#fff8e6; border:1px solid #f0dca8; border-radius:8px; padding:8px 14px;
  margin-bottom:18px; font-size:13px; }
.notices ul { margin:4px 0; padding-left:20px; }
section.panel { background:var(--card); border:1px solid var(--line); border-radius:8px;
  padding:14px 18px 10px; margin-bottom:18px; }
section.panel h2 { margin:0 0 2px; font-size:16px; font-weight:600; }
section.panel p.caption { margin:0 0 6px; color:var(--muted); font-size:13px; }
section.panel p.missing { color:var(--muted); font-style:italic; margin:16px 0; }
.row { display:grid; grid-template-columns:1fr 1fr; gap:18px; }
.row > section.panel { margin-bottom:18px; min-width:0; }
@media (max-width:1100px) { .row { grid-template-columns:1fr; } }
.legend-key { display:inline-block; width:10px; height:10px; border-radius:2px;
  margin:0 4px 0 10px; vertical-align:middle; }
table.data { border-collapse:collapse; font-size:13px; margin:6px 0 8px; }
table.data th, table.data td { padding:4px 12px; border-bottom:1px solid var(--line);
  text-align:left; }
table.data th { color:var(--muted); font-weight:600; }
table.data .num { text-align:right; font-variant-numeric:tabular-nums; }
.finding { border-left:4px solid var(--exposed); padding:4px 12px; margin:8px 0; }
.finding .title { font-weight:600; }
.finding .line { color:#3d4550; font-size:13px; }
footer { color:var(--muted); font-size:12px; text-align:center; padding:0 0 30px; }
"""

SCRIPT = """
(function () {
  var spec = JSON.parse(document.getElementById("fsdp-figures").textContent);
  var config = {displaylogo: false, responsive: true,
                modeBarButtonsToRemove: ["lasso2d", "select2d", "autoScale2d"],
                toImageButtonOptions: {format: "png", scale: 2}};
  var jobs = spec.figures.map(function (f) {
    var layout = f.figure.layout || {};
    layout.template = spec.template;
    return Plotly.newPlot(document.getElementById(f.id), f.figure.data, layout, config);
  });
  Promise.all(jobs).then(function () {
    document.body.setAttribute("%(attr)s", String(jobs.length));
  }, function (err) {
    document.body.setAttribute("%(attr)s-error", String(err));
    throw err;
  });
})();
"""


def _header(analysis: Analysis) -> str:
    run = analysis.run or {}
    bits = []
    if run:
        model = run.get("model", {})
        world = run.get("world", {})
        parallel = run.get("parallel", {})
        name = model.get("preset") or model.get("factory", "?")
        params = model.get("params_total")
        bits.append(
            f"<b>{html.escape(str(name))}</b>"
            + (
                f" ({params / 1e6:,.{0 if params >= 1e7 else 1}f}M params)"
                if _finite(params)
                else ""
            )
        )
        bits.append(f"batch {model.get('batch_size')} × seq {model.get('seq_len')}")
        bits.append(f"{world.get('world_size')} × {html.escape(str(world.get('device')))}")
        if model.get("n_blocks") is not None:
            bits.append(f"AC {len(parallel.get('ac_blocks', []))}/{model.get('n_blocks')} blocks")
        env = run.get("environment", {})
        if env.get("gpu_name"):
            link = (env.get("interconnect") or {}).get("summary")
            bits.append(html.escape(env["gpu_name"] + (f", {link}" if link else "")))
    n = len(_timing_ranks(analysis))
    devices = sorted({r.device.upper() for r in analysis.ranks})
    bits.append(f"{n} rank{'s' * (n != 1)} analyzed ({'/'.join(devices) or '—'})")
    inputs = html.escape(", ".join(analysis.inputs))
    return (
        f'<header><h1>fsdp-trace report</h1><div class="meta">{" · ".join(bits)}</div>'
        f'<div class="meta">{inputs}</div></header>'
    )


def _cards_html(cards: list[Card]) -> str:
    return (
        '<div class="cards">'
        + "".join(
            f'<div class="card {c.tone}" data-key="{c.key}"><div class="label">'
            f'{html.escape(c.label)}</div><div class="value">{html.escape(c.value)}</div>'
            f'<div class="sub">{html.escape(c.sub)}</div></div>'
            for c in cards
        )
        + "</div>"
    )


def _panel(fig: Figure) -> str:
    body = (
        f'<div class="plot" id="fig-{fig.key}" data-figure="{fig.key}"></div>'
        if fig.figure is not None
        else f'<p class="missing">{html.escape(fig.missing)}</p>'
    )
    return (
        f'<section class="panel" id="{fig.key}"><h2>{html.escape(fig.title)}</h2>'
        f'<p class="caption">{html.escape(fig.caption)}</p>{body}</section>'
    )


def render_html(analysis: Analysis) -> str:
    """The whole page as one string."""
    from plotly.offline import get_plotlyjs

    diagnosis = diagnosis_of(analysis)
    figs = figures(analysis, diagnosis)
    parts = [_header(analysis), "<main>", _cards_html(summary_cards(analysis))]
    items = notices(analysis)
    if items:
        parts.append(
            '<div class="notices"><b>Notices</b><ul>'
            + "".join(f"<li>{html.escape(n)}</li>" for n in items)
            + "</ul></div>"
        )
    legend = "".join(
        f'<span class="legend-key" style="background:{COLORS[k]}"></span>{label}'
        for k, label in (
            ("compute", "compute"),
            ("AllGather", "AllGather"),
            ("ReduceScatter", "ReduceScatter"),
            ("exposed", "exposed"),
        )
    )
    by_key = {f.key: f for f in figs}
    findings = findings_html(diagnosis)
    if findings:
        parts.append(findings)
    parts.append(
        '<section class="panel" id="ranks"><h2>Per rank</h2><p class="caption">Median and '
        f"min–max over the profiled steps. Colors used throughout: {legend}</p>"
        f"{rank_table(analysis)}</section>"
    )
    across = crossrank_html(analysis, diagnosis.crossrank, shown=set(items))
    if across:
        parts.append(across)
    parts.append(_panel(by_key["timeline"]))
    if _timing(analysis.collectives).empty:
        # Nothing to attribute (single GPU, or no collectives found): one note, not three.
        figs = [f for f in figs if f.key == "timeline"]
        parts.append(
            '<section class="panel" id="communication"><h2>Communication</h2>'
            f'<p class="missing">{html.escape(by_key["blocks"].missing)}</p></section>'
        )
    else:
        parts.append(_panel(by_key["blocks"]))
        if heatmap_wide(analysis):  # many blocks: each figure gets the full width
            parts += [_panel(by_key["bandwidth"]), _panel(by_key["heatmap"])]
        else:
            parts.append(
                f'<div class="row">{_panel(by_key["bandwidth"])}{_panel(by_key["heatmap"])}</div>'
            )
    tables = []
    distortion = distortion_table(analysis)
    if distortion:
        tables.append(
            '<section class="panel" id="distortion"><h2>Profiler distortion</h2>'
            '<p class="caption">The detailed step (record_shapes + with_stack) against the '
            "timing steps' median, per rank.</p>" + distortion + "</section>"
        )
    hta = hta_table(analysis)
    if hta:
        tables.append(
            '<section class="panel" id="hta"><h2>Cross-check with HTA</h2>'
            '<p class="caption">holistictraceanalysis get_comm_comp_overlap beside '
            "fsdp-trace's overlap, over HTA's window and over the timing steps.</p>"
            + hta
            + "</section>"
        )
    if len(tables) == 2:
        parts.append(f'<div class="row">{"".join(tables)}</div>')
    else:
        parts += tables
    parts.append("</main>")
    parts.append(
        f"<footer>fsdp-trace {html.escape(__version__)} · "
        f"{time.strftime('%Y-%m-%d %H:%M %Z')} · self-contained: opens offline</footer>"
    )
    drawn = [f for f in figs if f.figure is not None]
    payload = {
        "template": _template(),
        "figures": [
            {"id": f"fig-{f.key}", "figure": _json_safe(_figure_json(f.figure))} for f in drawn
        ],
    }
    title = "fsdp-trace report"
    if analysis.run and (analysis.run.get("model") or {}).get("preset"):
        title += f" — {analysis.run['model']['preset']}"
    return "".join(
        [
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{html.escape(title)}</title>",
            f"<style>{CSS % {**COLORS, 'font': FONT}}</style></head>",
            f'<body data-fsdp-figures="{len(drawn)}">',
            *parts,
            f'<script type="text/javascript">{get_plotlyjs()}</script>',
            '<script type="application/json" id="fsdp-figures">',
            _script_json(payload),
            "</script>",
            f"<script>{SCRIPT % {'attr': RENDERED_ATTRIBUTE}}</script>",
            "</body></html>\n",
        ]
    )


def write_report(analysis: Analysis, path: Path) -> None:
    """Write the self-contained HTML report of `analysis` to `path` (atomically)."""
    atomic.write_bytes(Path(path), render_html(analysis).encode("utf-8"))
