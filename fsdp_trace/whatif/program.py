"""One measured step of one rank as a program a replay can run again, changed.

The step is read as what FSDP2 issued: the compute stream's work in order, cut into segments
(a unit's forward, its backward, its recompute, FSDP's own copies, the optimizer, anything
else), and the collectives on their own streams. Each piece keeps:
- its GPU time: a segment's busy time (its kernels) and idle gaps inside it; a collective's
  transfer time (the cross-rank match's, without waiting; its duration when unmatched);
- its launch time on the host, relative to the step's first launch: the GPU cannot start it
  earlier, which is how a host-bound step stays host-bound in the replay;
- its dependencies, per micro-batch (`waits`: the collective streams' waits on compute;
  `compute_waits`: the compute stream's on collectives; FSDP2's, below); the segment that
  needs an all-gather is its unit's first segment in that phase after it; an HSDP
  all-reduce follows its reduce-scatter on its own stream; a collective's copy-in on a side
  stream runs after its wait, before its NCCL kernel (`setup_us`);
- its cross-rank identity (the match id): matched collectives end together on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import pairwise

import numpy as np
import pandas as pd

from fsdp_trace.analysis import intervals as iv
from fsdp_trace.analysis.results import RankAnalysis
from fsdp_trace.vocab import GRADIENT_REDUCTIONS, ROOT, Collective, Kind, Phase

OTHER = "other"  # compute outside every unit's window (loss, casts, ...)


class SegmentKind:
    MODEL = "model"
    RECOMPUTE = "recompute"
    FSDP = "fsdp"  # FSDP's own copies/casts
    OPTIMIZER = "optimizer"


@dataclass
class Program:
    rank: int | None
    step: int
    segments: pd.DataFrame  # SEGMENT_COLUMNS, in compute-stream order
    ops: pd.DataFrame  # OP_COLUMNS, in launch order
    host_origin: float  # the step's first launch (µs, trace clock)
    gpu_origin: float  # the step window's start
    window_us: float  # the measured step
    tail_us: float  # window end − the step's last work end (the next step's start gap)
    latency_us: float  # launch → start, where the GPU waited for the host

    @property
    def host_span_us(self) -> float:
        """The host's time issuing the step: its first launch to its last."""
        segs = self.segments
        last = (
            segs["host_us"] + segs["k_off"].map(lambda o: float(o.max()) if len(o) else 0.0)
        ).max()
        return float(max(last, self.ops["host_us"].max() if len(self.ops) else 0.0))

    def copy(self) -> Program:
        return replace(self, segments=self.segments.copy(), ops=self.ops.copy())


SEGMENT_COLUMNS = [
    "unit",
    "phase",
    "kind",
    "busy_us",  # the kernels' time
    "gap_us",  # idle between its kernels (host launches, small waits)
    "beside_us",  # of busy_us, the time NCCL kernels ran beside it (slowed by the tax)
    "kernels",  # how many kernels it ran
    "k_off",  # per kernel (arrays): launch after the segment's first launch
    "k_dur",  # per kernel: its time
    "k_extra",  # per kernel: GPU idle before it that no launch or kernel explains
    "host_us",  # its first launch, from the step's first launch
    "start_us",  # measured (trace clock)
    "end_us",
]
OP_COLUMNS = [
    "collective",
    "unit",
    "phase",
    "transfer_us",
    "setup_us",  # its copy-in on a side stream, after its wait, before the NCCL kernel
    "matched",  # bool: `transfer_us` is the cross-rank one; `match` identifies it
    "match",
    "bytes",
    "host_us",
    "start_us",
    "end_us",
    "consumer",  # segment position that needs it (all-gather), -1: none
    "after",  # op position it follows (HSDP all-reduce after its reduce-scatter), -1
]


def _segment_kind(phase: str, fsdp: bool) -> str:
    if phase == Phase.RECOMPUTE:
        return SegmentKind.RECOMPUTE
    if phase == Phase.OPTIMIZER:
        return SegmentKind.OPTIMIZER
    return SegmentKind.FSDP if fsdp else SegmentKind.MODEL


def launch_latency(kernels: pd.DataFrame) -> float:
    """Launch to start where the GPU waited for the host: the least any kernel took."""
    waited = (kernels["ts"] - kernels["launch_ts"]).to_numpy(dtype=np.float64)
    waited = waited[waited >= 0]
    return float(waited.min()) if waited.size else 0.0


def segments(
    kernels: pd.DataFrame, cuts: np.ndarray | None = None, latency: float = 0.0
) -> pd.DataFrame:
    """The compute stream's kernels cut where the unit, phase or kind changes and where a
    collective was launched between two of them (`cuts`: those launch times).

    Each segment keeps its kernels (`k_off`: launch after the segment's first, `k_dur`, and
    `k_extra`: idle before a kernel that neither the one before it nor its launch explains,
    the GPU's own bubbles), so the replay can pace them by the host (launch + `latency`)."""
    k = kernels.sort_values("ts", kind="stable")
    unit = k["unit"].astype(object).where(k["unit"].notna(), OTHER).astype(str).to_numpy()
    phase = k["phase"].astype(str).to_numpy()
    kind = np.array([_segment_kind(p, f) for p, f in zip(phase, k["fsdp"], strict=True)])
    key = np.char.add(np.char.add(unit.astype(str), "|"), np.char.add(phase, kind))
    new = np.ones(len(k), dtype=bool)
    new[1:] = key[1:] != key[:-1]
    launch = k["launch_ts"].to_numpy(dtype=np.float64)
    if cuts is not None and len(cuts) and len(k) > 1:
        before = np.searchsorted(np.sort(cuts), launch, side="left")
        new[1:] |= before[1:] != before[:-1]
    seg = np.cumsum(new) - 1
    ts, end = k["ts"].to_numpy(dtype=np.float64), k["end"].to_numpy(dtype=np.float64)
    prev_end = np.concatenate([[-np.inf], np.maximum.accumulate(end)[:-1]])
    allowed = np.fmax(prev_end, launch + latency)  # fmax: a launch not known is no limit
    extra = np.where(new, 0.0, np.maximum(0.0, ts - allowed))
    frame = pd.DataFrame(
        {
            "seg": seg,
            "unit": unit,
            "phase": phase,
            "kind": kind,
            "ts": ts,
            "end": end,
            "dur": k["dur"].to_numpy(dtype=np.float64),
            "launch": launch,
            "extra": extra,
            "beside": k["beside"].to_numpy() if "beside" in k else np.zeros(len(k)),
        }
    )
    g = frame.groupby("seg", sort=True).agg(
        unit=("unit", "first"),
        phase=("phase", "first"),
        kind=("kind", "first"),
        start_us=("ts", "min"),
        end_us=("end", "max"),
        busy_us=("dur", "sum"),
        kernels=("dur", "size"),
        launch=("launch", "min"),
        beside_us=("beside", "sum"),
    )
    span = g["end_us"] - g["start_us"]
    g["busy_us"] = np.minimum(g["busy_us"], span)  # one stream: kernels do not overlap
    g["gap_us"] = span - g["busy_us"]
    g["beside_us"] = np.minimum(g["beside_us"], g["busy_us"])
    bounds = list(pairwise([*np.flatnonzero(new).tolist(), len(frame)]))
    dur = frame["dur"].to_numpy()
    g["k_off"] = [_offsets(launch[a:b]) for a, b in bounds]
    g["k_dur"] = [dur[a:b].copy() for a, b in bounds]
    g["k_extra"] = [extra[a:b].copy() for a, b in bounds]
    return g.reset_index(drop=True)


def _offsets(launch: np.ndarray) -> np.ndarray:
    """Launch times after the first (0 where a launch is not known)."""
    known = np.isfinite(launch)
    if not known.any():
        return np.zeros(len(launch))
    return np.where(known, launch - launch[known].min(), 0.0)


def extract(rank: RankAnalysis, step: int, participants: pd.DataFrame | None) -> Program:
    """The program of one rank's `step` (its timing trace; its kernels read again)."""
    k = rank.load_kernels(step)
    window = rank.steps.set_index("step").loc[step]
    compute = k[k["kind"] == Kind.COMPUTE]
    main = compute.groupby("stream")["dur"].sum().idxmax() if len(compute) else None
    comm = k[k["kind"] == Kind.COMM]
    if main is not None:
        on_main = compute[compute["stream"] == main]
        nccl = iv.union(comm["ts"].to_numpy(), comm["end"].to_numpy())
        beside = iv.overlap_each(on_main["ts"].to_numpy(), on_main["end"].to_numpy(), nccl)
        cuts = comm["launch_ts"].dropna().to_numpy(dtype=np.float64)
        latency = launch_latency(on_main)
        segs = segments(on_main.assign(beside=beside), cuts, latency)
    else:
        segs = None
    if segs is None or segs.empty:
        raise ValueError(f"rank {rank.rank} step {step}: no compute to replay")
    launches = k["launch_ts"].dropna()
    host_origin = float(launches.min()) if len(launches) else float(segs["start_us"].min())
    segs["host_us"] = segs.pop("launch").fillna(host_origin) - host_origin

    side = k[(k["stream"] != main) & (k["kind"] != Kind.COMM)]
    ops = _ops(rank, k, step, participants, segs, host_origin, side)
    last = max(float(segs["end_us"].max()), float(ops["end_us"].max()) if len(ops) else 0.0)
    return Program(
        rank=rank.rank,
        step=int(step),
        segments=segs[SEGMENT_COLUMNS].reset_index(drop=True),
        ops=ops,
        host_origin=host_origin,
        gpu_origin=float(window["start_us"]),
        window_us=float(window["step_us"]),
        tail_us=max(0.0, float(window["end_us"]) - last),
        latency_us=latency,
    )


def _ops(
    rank: RankAnalysis,
    k: pd.DataFrame,
    step: int,
    participants: pd.DataFrame | None,
    segs: pd.DataFrame,
    host_origin: float,
    side: pd.DataFrame,
) -> pd.DataFrame:
    c = rank.collectives
    c = c[c["step"] == step].sort_values("correlation", kind="stable")
    # Several GPU events may share one launch's correlation id (a Triton kernel and its
    # memset): one launch time per id.
    launch = k.groupby("correlation")["launch_ts"].min()
    match = pd.Series(-1, index=c.index, dtype=np.int64)
    if participants is not None and len(participants):
        mine = participants[participants["rank"] == rank.rank].set_index("correlation")["match"]
        match = c["correlation"].map(mine).fillna(-1).astype(np.int64)
    transfer = c["transfer_us"].where(c["transfer_us"].notna(), c["dur_us"])
    ops = pd.DataFrame(
        {
            "collective": c["collective"].astype(str).to_numpy(),
            "unit": c["block"].astype(str).to_numpy(),
            "phase": c["phase"].astype(str).to_numpy(),
            "transfer_us": transfer.to_numpy(dtype=np.float64),
            "matched": c["transfer_us"].notna().to_numpy(),
            "match": match.to_numpy(),
            "bytes": c["bytes"].to_numpy(dtype=np.float64),
            "host_us": c["correlation"].map(launch).to_numpy(dtype=np.float64) - host_origin,
            "start_us": c["start_us"].to_numpy(dtype=np.float64),
            "end_us": c["end_us"].to_numpy(dtype=np.float64),
        }
    )
    ops["host_us"] = ops["host_us"].fillna(0.0)
    ops["setup_us"] = _setup(ops["host_us"].to_numpy() + host_origin, side)
    ops["consumer"] = [_consumer(segs, op) for op in ops.itertuples()]
    ops["after"] = _after(ops)
    return ops[OP_COLUMNS].reset_index(drop=True)


def _side(phase: str) -> tuple[str, ...]:
    if phase == Phase.FORWARD:
        return (Phase.FORWARD.value,)
    return (Phase.BACKWARD.value, Phase.RECOMPUTE.value)


def _consumer(segs: pd.DataFrame, op) -> int:
    """The first segment of the gathered unit, in the gather's phase, after it started."""
    if op.collective != Collective.ALL_GATHER:
        return -1
    hit = segs[
        (segs["unit"] == op.unit)
        & segs["phase"].isin(_side(op.phase))
        & (segs["start_us"] >= op.start_us)
    ]
    return int(hit.index[0]) if len(hit) else -1


def _setup(launch: np.ndarray, side: pd.DataFrame) -> np.ndarray:
    """Per collective (`launch`: its launch times, in order), the side-stream kernels (its
    copy-in) launched after the collective before it: their GPU time."""
    out = np.zeros(len(launch))
    if side.empty or not len(launch):
        return out
    order = np.argsort(launch, kind="stable")
    t = side["launch_ts"].to_numpy(dtype=np.float64)
    nth = np.searchsorted(launch[order], t, side="left")  # the first collective after it
    ok = ~np.isnan(t) & (nth < len(launch))
    np.add.at(out, order[nth[ok]], side["dur"].to_numpy(dtype=np.float64)[ok])
    return out


def _after(ops: pd.DataFrame) -> list[int]:
    """An HSDP all-reduce follows its unit's reduce-scatter."""
    out = []
    for i, op in enumerate(ops.itertuples()):
        found = -1
        if op.collective == Collective.ALL_REDUCE:
            before = ops.iloc[:i]
            rs = before[
                (before["collective"] == Collective.REDUCE_SCATTER) & (before["unit"] == op.unit)
            ]
            found = int(rs.index[-1]) if len(rs) else -1
        out.append(found)
    return out


def micro_batches(segs: pd.DataFrame) -> np.ndarray:
    """Per segment, its micro-batch (0, 1, ...): a new one starts where the compute stream
    goes from a backward (or its recompute) back to forward; the optimizer is the last's."""
    phase = segs["phase"].to_numpy()
    backward = np.isin(phase, [Phase.BACKWARD.value, Phase.RECOMPUTE.value])
    forward = phase == Phase.FORWARD
    side = pd.Series(np.where(forward, 1.0, np.where(backward, 2.0, np.nan)))
    before = side.ffill().shift(1).fillna(0.0).to_numpy()  # the last side before each
    starts = forward & (before == 2.0)
    return np.cumsum(starts).astype(np.int64)


def op_micro_batches(segs: pd.DataFrame, ops: pd.DataFrame) -> np.ndarray:
    """Per collective, its micro-batch: a forward one's is the next segment's launched after
    it (the forward it gathers for), any other's the last segment's launched before it."""
    mb = micro_batches(segs)
    if not len(ops):
        return np.zeros(0, dtype=np.int64)
    host = segs["host_us"].to_numpy(dtype=np.float64)
    op_host = ops["host_us"].to_numpy(dtype=np.float64)
    nxt = np.minimum(np.searchsorted(host, op_host, side="left"), len(host) - 1)
    before = np.maximum(np.searchsorted(host, op_host, side="left") - 1, 0)
    forward = (ops["phase"] == Phase.FORWARD).to_numpy()
    return np.where(forward, mb[nxt], mb[before])


def waits(segs: pd.DataFrame, ops: pd.DataFrame) -> np.ndarray:
    """Per collective, the compute segments its streams wait for (two columns, -1: none),
    as FSDP2 makes them wait, each micro-batch (`micro_batches`) on its own:

    - a reduce-scatter (and HSDP's all-reduce, issued with it) waits for the compute stream
      as it is issued: every segment launched before it (segments are cut at every
      collective's launch);
    - an all-gather waits for the copy-out its streams were last told to wait for: in
      backward each unit's copy-out makes them wait for itself (the buffer is freed at once);
      in forward the wait is deferred by one unit (unit i's copy-out makes them wait for
      unit i−1's), afresh in each forward; each forward's root pre-forward makes them wait
      for the compute stream as a reduce-scatter does (before its first gather);
    - a gather in backward also waits for its unit's forward in the same micro-batch (the
      root's: that micro-batch's whole forward), which resharded it. (torch records that as
      an event with a post-forward mesh; otherwise the root's post-forward makes the streams
      wait for the forward's last copy-out, which this bound also covers.)"""
    host = segs["host_us"].to_numpy(dtype=np.float64)
    op_host = ops["host_us"].to_numpy(dtype=np.float64)
    before = np.searchsorted(host, op_host, side="left") - 1  # launched before each op
    gather = (ops["collective"] == Collective.ALL_GATHER).to_numpy()
    consumers = sorted({int(c) for c in ops["consumer"].to_numpy()[gather] if c >= 0})
    phase = segs["phase"].to_numpy()
    mb, op_mb = micro_batches(segs), op_micro_batches(segs, ops)
    told: list[tuple[float, int]] = []  # (when the streams were told, the segment to wait for)
    for m in np.unique(op_mb[gather]):  # each forward's root pre-forward, before its gather
        first = np.flatnonzero(gather & (op_mb == m) & (ops["phase"] == Phase.FORWARD).to_numpy())
        if first.size:
            j = first[np.argmin(op_host[first])]
            told.append((op_host[j], int(before[j])))
    last_forward, last_mb = -1, -1
    for c in consumers:
        if phase[c] == Phase.FORWARD:
            if mb[c] != last_mb:  # a new forward: nothing deferred from the last one
                last_forward, last_mb = -1, int(mb[c])
            if last_forward >= 0:
                told.append((host[c], last_forward))
            last_forward = c
        else:
            told.append((host[c], c))
    out = np.full((len(ops), 2), -1, dtype=np.int64)
    out[:, 0] = before
    if told:
        told.sort()
        when = np.array([t for t, _ in told])
        # streams wait in order: a later wait adds to the earlier ones (the latest segment)
        target = np.maximum.accumulate(np.array([c for _, c in told]))
        latest = np.searchsorted(when, op_host, side="right") - 1
        has = gather & (latest >= 0)
        out[has, 0] = target[latest[has]]
    forward = np.flatnonzero(phase == Phase.FORWARD)
    if forward.size:
        unit = segs["unit"].to_numpy()
        last: dict[tuple[int, str], int] = {}
        for i in forward:  # in order: the last one wins
            last[(int(mb[i]), str(unit[i]))] = int(i)
            last[(int(mb[i]), ROOT)] = int(i)  # the root's forward ends with the model's
        backward = gather & (ops["phase"] != Phase.FORWARD).to_numpy()
        for j in np.flatnonzero(backward):
            out[j, 1] = last.get((int(op_mb[j]), str(ops["unit"].iat[j])), -1)
    return out


def op_waits(segs: pd.DataFrame, ops: pd.DataFrame) -> list[list[int]]:
    """Per collective, the collectives its stream waits for through the compute stream's own
    waits (beyond `after`): a forward's root pre-forward makes the gather streams wait for the
    compute stream, whose end-of-backward wait (`compute_waits`) was for every reduction of
    the micro-batches before, so that forward's first gather waits for them too."""
    out: list[list[int]] = [[] for _ in range(len(ops))]
    if not len(ops) or not len(segs):
        return out
    op_host = ops["host_us"].to_numpy(dtype=np.float64)
    op_mb = op_micro_batches(segs, ops)
    gather = (ops["collective"] == Collective.ALL_GATHER).to_numpy()
    forward = (ops["phase"] == Phase.FORWARD).to_numpy()
    reduction = ops["collective"].isin(GRADIENT_REDUCTIONS).to_numpy()
    for m in np.unique(op_mb[gather & forward]):
        first = np.flatnonzero(gather & forward & (op_mb == m))
        j = int(first[np.argmin(op_host[first])])
        out[j] = np.flatnonzero(reduction & (op_mb < m)).tolist()
    return out


def compute_waits(segs: pd.DataFrame, ops: pd.DataFrame) -> list[list[int]]:
    """Per segment, the collectives the compute stream waits for before it, as FSDP2 (torch
    2.6 on) makes it wait:

    - an all-gather's consumer waits for it (its copy-out reads the gathered buffer);
    - post_backward, before issuing a unit's reduce-scatter, makes the compute stream wait
      for the previous reduce-scatter of that backward (`comm_ctx.reduce_scatter_state`,
      recorded as its NCCL kernel ends, before HSDP's all-reduce): the unit's copy-in (the
      FSDP segment of the unit launched just before the reduce-scatter) waits, or where the
      trace has none, the first segment launched after the reduce-scatter;
    - at the end of each backward the root's post-backward callback (`finalize_backward`)
      makes it wait for every reduction of that backward (HSDP's all-reduces too): the first
      segment launched after them outside backward waits; the optimizer waits for every
      reduction of the step."""
    needs: list[list[int]] = [[] for _ in range(len(segs))]
    for j, consumer in enumerate(ops["consumer"].to_numpy()):
        if consumer >= 0:
            needs[int(consumer)].append(j)
    if not len(ops) or not len(segs):
        return needs
    host = segs["host_us"].to_numpy(dtype=np.float64)
    op_host = ops["host_us"].to_numpy(dtype=np.float64)
    before = np.searchsorted(host, op_host, side="left") - 1
    phase, kind = segs["phase"].to_numpy(), segs["kind"].to_numpy()
    unit = segs["unit"].to_numpy().astype(str)
    in_backward = np.isin(phase, [Phase.BACKWARD.value, Phase.RECOMPUTE.value])
    op_mb = op_micro_batches(segs, ops)
    collective = ops["collective"].to_numpy()
    order = np.argsort(op_host, kind="stable")
    previous: dict[int, int] = {}  # micro-batch → its last reduce-scatter so far
    for j in order:
        if collective[j] != Collective.REDUCE_SCATTER:
            continue
        m = int(op_mb[j])
        if m in previous:
            b = int(before[j])
            mine = b >= 0 and unit[b] == str(ops["unit"].iat[j]) and in_backward[b]
            at = b if mine and kind[b] == SegmentKind.FSDP else b + 1  # its copy-in, or next
            if 0 <= at < len(segs):
                needs[at].append(previous[m])
        previous[m] = int(j)
    reduction = np.isin(collective, GRADIENT_REDUCTIONS)
    for m in np.unique(op_mb[reduction]):
        mine = np.flatnonzero(reduction & (op_mb == m))
        last = int(before[mine[np.argmax(op_host[mine])]])
        later = np.flatnonzero(~in_backward[last + 1 :]) + last + 1
        if later.size:
            needs[int(later[0])] += mine.tolist()
    optimizer = np.flatnonzero(kind == SegmentKind.OPTIMIZER)
    if optimizer.size:
        needs[int(optimizer[0])] += reductions(ops).tolist()
    return [sorted(set(n)) for n in needs]


def reductions(ops: pd.DataFrame) -> np.ndarray:
    """Positions of the gradient reductions (what the optimizer waits for)."""
    return np.flatnonzero(ops["collective"].isin(GRADIENT_REDUCTIONS).to_numpy())
