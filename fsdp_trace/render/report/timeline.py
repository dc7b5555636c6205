"""What the step timeline draws, as data (no plotly here): which ranks, which step of each,
and per rank the rows (GPU streams, or gloo threads) and groups of bars (phases, compute,
memory, each collective kind, exposed intervals) relative to the step's start, in ms."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pandas as pd

from fsdp_trace import fmt

# MAX_TIMELINE_RANKS is defined with the results: a local run's analysis reads it too.
from fsdp_trace.analysis.results import MAX_TIMELINE_RANKS, RankAnalysis
from fsdp_trace.render.report.style import PHASE_COLORS
from fsdp_trace.result import RunAnalysis
from fsdp_trace.vocab import Device


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


def timeline_ranks(run: RunAnalysis) -> list[RankAnalysis]:
    """The ranks drawn on the timeline: all, or the most and least exposed when many."""
    ranks = [r for r in run.ranks if not r.steps.empty]
    if len(ranks) <= MAX_TIMELINE_RANKS:
        return ranks

    def exposure(r: RankAnalysis) -> float:
        values = pd.to_numeric(r.steps["exposed_pct"], errors="coerce").dropna()
        return float(values.median()) if len(values) else -1.0

    ordered = sorted(ranks, key=exposure, reverse=True)
    half = MAX_TIMELINE_RANKS // 2
    chosen = {id(r) for r in ordered[:half] + ordered[-(MAX_TIMELINE_RANKS - half) :]}
    return [r for r in ranks if id(r) in chosen]


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
    spans = _merge([[p, a, b] for p, a, b in zip(phase, ts, end, strict=True)])
    total = end.max() - ts.min()
    for _ in range(2):  # fold short runs, then merge the neighbours that now touch
        spans = _merge([sp for sp in spans if sp[2] - sp[1] >= 0.005 * total] or spans[:1])
    for this, following in itertools.pairwise(spans):
        this[2] = following[1]
    return pd.DataFrame(spans, columns=["phase", "start", "end"])


def _merge(spans: list[list]) -> list[list]:
    merged: list[list] = []
    for sp in spans:
        if merged and merged[-1][0] == sp[0]:
            merged[-1][2] = max(merged[-1][2], sp[2])
        else:
            merged.append(list(sp))
    return merged


def short_kernel(name: str, limit: int = 90) -> str:
    """A kernel name short enough for a hover box, with its angle brackets escaped."""
    name = str(name).replace("(anonymous namespace)::", "")
    if name.startswith("void "):
        name = name[5:]
    if len(name) > 60:
        cut = min((i for i in (name.find("<"), name.find("(")) if i > 0), default=len(name))
        name = name[:cut]
    name = name if len(name) <= limit else name[: limit - 1] + "…"
    return name.replace("<", "&lt;").replace(">", "&gt;")


def by_collective(frame: pd.DataFrame):
    """(kind, rows) for AllGather, ReduceScatter, then every other collective together."""
    for kind in ("AllGather", "ReduceScatter"):
        part = frame[frame["collective"] == kind]
        if not part.empty:
            yield kind, part
    other = frame[~frame["collective"].isin(["AllGather", "ReduceScatter"])]
    if not other.empty:
        yield "other", other


def comm_hover(row: dict[str, Any], t0: float) -> str:
    start = row.get("ts", row.get("start_us"))
    dur = row.get("dur", row.get("dur_us"))
    block = row.get("block") if isinstance(row.get("block"), str) else "unattributed"
    text = f"<b>{row.get('collective')}</b> {block} · {row.get('phase')}<br>"
    text += f"{fmt.mb(row.get('bytes'))} MB in {dur:,.1f} µs at {(start - t0) / 1e3:.3f} ms<br>"
    text += (
        f"busbw {fmt.num(row.get('busbw_gbps'), ',.1f')} GB/s · "
        f"algbw {fmt.num(row.get('algbw_gbps'), ',.1f')} GB/s"
    )
    if fmt.finite(row.get("exposed_us")):
        text += f"<br>exposed {row['exposed_us']:,.1f} µs"
    issued = row.get("issued_by")
    if isinstance(issued, str) and issued != block:
        text += f"<br>issued by {issued}"
    if row.get("prefetched") is True:
        text += " (prefetched)"
    return text


def rows_of(r: RankAnalysis, step: pd.Series) -> tuple[list[str], list[dict[str, Any]]]:
    """Row labels and bar groups of one rank's step: GPU streams, or gloo threads."""
    if r.device == Device.GPU and r.n_kernels:
        return gpu_rows(r, step)
    return cpu_rows(r, step)


def _group(kind: str, y: list[str], start, dur, t0: float, hover: list[str], **extra) -> dict:
    start = np.asarray(start, dtype=np.float64)
    return {
        "kind": kind,
        "y": y,
        "base": (start - t0) / 1e3,
        "x": np.asarray(dur, dtype=np.float64) / 1e3,
        "hover": hover,
        **extra,
    }


def _stream_order(roles: dict[int, str]):
    def key(stream: int) -> tuple[int, int]:
        role = roles.get(int(stream), "")
        order = 0 if role == "compute" else 1 if role.startswith("compute") else 2
        order = 3 if "NCCL" in role or role == "communication" else order
        return (order, int(stream))

    return key


def gpu_rows(r: RankAnalysis, step: pd.Series) -> tuple[list[str], list[dict[str, Any]]]:
    """Row labels and bar groups (one per kind) of one rank's step on the GPU: its kernels
    read again (a run does not hold them), through the cache when the run used it."""
    k = r.load_kernels(step["step"])
    t0 = float(step["start_us"])
    roles = r.streams

    def label(stream: int) -> str:
        return f"{roles.get(int(stream), 'stream')} · s{int(stream)}"

    rows = [label(s) for s in sorted(k["stream"].unique(), key=_stream_order(roles))]
    groups: list[dict[str, Any]] = []
    comp = k[k["kind"] == "compute"]
    spans = phase_spans(comp, [s for s, role in roles.items() if role == "compute"])
    if not spans.empty:  # phases: runs of one phase on the main compute stream, on top
        rows.insert(0, "phase")
        groups.append(_phase_group(spans, t0))
    hover = [
        f"<b>{short_kernel(n)}</b><br>{b if isinstance(b, str) else 'no block'} · {p}<br>"
        f"{d:,.1f} µs at {(s - t0) / 1e3:.3f} ms"
        for n, b, p, d, s in zip(
            comp["name"], comp["block"], comp["phase"], comp["dur"], comp["ts"], strict=True
        )
    ]
    if not comp.empty:
        groups.append(
            _group(
                "compute", [label(s) for s in comp["stream"]], comp["ts"], comp["dur"], t0, hover
            )
        )
    mem = k[k["kind"].isin(["memcpy", "memset"])]
    if not mem.empty:
        hover = [
            f"<b>{short_kernel(n)}</b><br>{d:,.1f} µs at {(s - t0) / 1e3:.3f} ms"
            for n, d, s in zip(mem["name"], mem["dur"], mem["ts"], strict=True)
        ]
        groups.append(
            _group("memory", [label(s) for s in mem["stream"]], mem["ts"], mem["dur"], t0, hover)
        )
    groups += _comm_groups(r, k[k["kind"] == "comm"], t0, label)
    exposed = _exposed_group(r, step, t0)
    if exposed:
        rows.append("exposed comm")
        groups.append(exposed)
    return rows, groups


def _phase_group(spans: pd.DataFrame, t0: float) -> dict[str, Any]:
    hover = [
        f"<b>{p}</b><br>{(e - s) / 1e3:.2f} ms, from {(s - t0) / 1e3:.2f} ms"
        for p, s, e in zip(spans["phase"], spans["start"], spans["end"], strict=True)
    ]
    return _group(
        "phase",
        ["phase"] * len(spans),
        spans["start"],
        spans["end"] - spans["start"],
        t0,
        hover,
        text=list(spans["phase"]),
        colors=[PHASE_COLORS.get(p, "#e6e6e6") for p in spans["phase"]],
    )


COMM_INFO = [
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


def _comm_groups(r: RankAnalysis, comm: pd.DataFrame, t0: float, label) -> list[dict]:
    """The communication kernels, one group per collective kind, with the collectives
    table's block, phase, size and bandwidth for their hover."""
    if comm.empty:
        return []
    info = r.collectives[COMM_INFO].drop_duplicates("correlation")
    comm = comm.drop(columns=["block", "phase"]).merge(info, on="correlation", how="left")
    comm["collective"] = comm["collective"].fillna("other")
    return [
        _group(
            kind,
            [label(s) for s in part["stream"]],
            part["ts"],
            part["dur"],
            t0,
            [comm_hover(row, t0) for row in part.to_dict("records")],
        )
        for kind, part in by_collective(comm)
    ]


def _exposed_group(r: RankAnalysis, step: pd.Series, t0: float) -> dict[str, Any] | None:
    """The step's exposed-communication intervals, each with the collectives running then."""
    exposed = r.exposed
    if exposed.empty:
        return None
    running = pd.Series(r.exposed_collectives(), index=exposed.index)
    exposed = exposed[exposed["step"] == step["step"]]
    if exposed.empty:
        return None
    s = exposed["start_us"].to_numpy(dtype=np.float64)
    e = exposed["end_us"].to_numpy(dtype=np.float64)
    coll = r.collectives
    names = [
        f"{c} {b} {p}"
        for c, b, p in zip(coll["collective"], coll["block"], coll["phase"], strict=True)
    ]
    during = [
        "during " + ", ".join(names[j] for j in rows[:3]) if rows else ""
        for rows in running.loc[exposed.index]
    ]
    hover = [
        f"<b>exposed</b> {(b - a):,.1f} µs at {(a - t0) / 1e3:.3f} ms<br>{d}"
        for a, b, d in zip(s, e, during, strict=True)
    ]
    return _group("exposed", ["exposed comm"] * len(s), s, e - s, t0, hover)


def cpu_rows(r: RankAnalysis, step: pd.Series) -> tuple[list[str], list[dict[str, Any]]]:
    """A CPU (gloo) rank: its collectives on gloo's threads (there are no kernels)."""
    c = r.collectives
    if c.empty:
        return [], []
    c = c[c["step"] == step["step"]]
    t0 = float(step["start_us"])
    rows = [f"gloo thread {t}" for t in sorted(c["stream"].unique())]
    groups = [
        _group(
            kind,
            [f"gloo thread {t}" for t in part["stream"]],
            part["start_us"],
            part["dur_us"],
            t0,
            [comm_hover(row, t0) for row in part.to_dict("records")],
        )
        for kind, part in by_collective(c)
    ]
    return rows, groups
