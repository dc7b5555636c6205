"""Diagnosis → advice. Each rule reads the analysis (and the cross-rank view), and when it
sees its problem says what it saw with numbers, why it matters, and the knob to change.

Thresholds are deliberately plain and documented here; every rule is tested on a real trace
that shows the problem and on one where it must stay silent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from fsdp_trace.analyze import intervals as iv
from fsdp_trace.analyze.results import Analysis, RankAnalysis
from fsdp_trace.diagnose.crossrank import CrossRank, match

# Thresholds (fractions of the step unless named otherwise).
FIRST_AG_EXPOSED = 0.01  # rule 1: exposed first all-gather
ROOT_SIZE_RATIO = 2.0  # rule 1: root unit at least this many blocks' worth of bytes
REGATHER_MIN = 0.002  # rule 2: the re-gather's length, share of the step
RS_TAIL = 0.02  # rule 3
COMM_BOUND_SHARE = 0.25  # rule 4: share of block units whose gather outlasts their compute
HOST_IDLE = 0.20  # rule 5: GPU idle share of the step
TAX_SLOWDOWN = 0.10  # rule 7: median slowdown of a kernel next to NCCL
TAX_TIME = 0.05  # rule 7: overlapped compute time, share of the step
BUSBW_FLOOR_GBPS = {"nvlink": 50.0, "mixed": 20.0, "pcie": 5.0, None: 10.0}  # rule 8
LARGE_MESSAGE_BYTES = 8e6  # rule 8: messages big enough to reach link bandwidth
STRAGGLER_SHARE = 0.6  # rule 10: arrives last at this share of collectives
STRAGGLER_WAIT = 0.05  # rule 10: what it costs the others, share of the step
DISTORTION = 0.25  # rule 11: detailed step slower than the timing median by this much


@dataclass
class Finding:
    number: int
    rule: str
    title: str
    saw: str
    why: str
    change: str
    severity: float  # estimated share of the step at stake (for ordering)
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass
class Context:
    analysis: Analysis
    crossrank: CrossRank
    run: dict[str, Any]

    @property
    def gpu_ranks(self) -> list[RankAnalysis]:
        return [r for r in self.analysis.ranks if r.device == "gpu" and not r.steps.empty]

    def step_us(self, rank: RankAnalysis) -> float:
        return float(rank.steps["step_us"].median())

    def parallel(self) -> dict[str, Any]:
        return self.run.get("parallel", {})

    def env_vars(self) -> dict[str, str]:
        return self.run.get("environment", {}).get("env_vars", {})

    def exposed_without_waiting(self, rank: RankAnalysis, collectives: pd.DataFrame) -> pd.Series:
        """Exposed time capped by the cross-rank transfer time: waiting for a late peer is
        the straggler's cost (rule 10), not this collective's."""
        transfer = self.crossrank.transfer_us(rank.rank, collectives["correlation"])
        exposed = collectives["exposed_us"].to_numpy(dtype=np.float64)
        capped = np.where(np.isnan(transfer), exposed, np.minimum(exposed, transfer))
        return pd.Series(capped, index=collectives.index)

    def block_units(self, units: pd.Series) -> set[str]:
        """The transformer-block units: run.json's list, else every single-module unit
        other than the root (the embedding/head units of torchtitan-style models name
        several modules, e.g. 'norm, output')."""
        blocks = self.run.get("model", {}).get("blocks")
        if blocks:
            return set(blocks)
        names = set(units.astype(str))
        return {u for u in names if u not in ("root", "unattributed") and ", " not in u}


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _ms(us: float) -> str:
    return f"{us / 1e3:.2f} ms"


def _per_step(frame: pd.DataFrame, pick: Callable[[pd.DataFrame], pd.Series]) -> pd.DataFrame:
    """One row per step chosen by `pick` from each step's rows."""
    rows = [pick(group) for _, group in frame.groupby("step", sort=True)]
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=frame.columns)


def first_forward_allgather(ctx: Context) -> Finding | None:
    """1. The first forward all-gather (usually the root unit) is exposed: expected once, but a
    root that holds the embeddings and output head makes it large."""
    worst = None
    for r in ctx.gpu_ranks:
        ag = r.collectives[
            (r.collectives["collective"] == "AllGather") & (r.collectives["phase"] == "forward")
        ]
        if ag.empty:
            continue
        first = _per_step(ag, lambda g: g.loc[g["start_us"].idxmin()])
        unit = first["block"].mode().iloc[0]
        exposed = float(ctx.exposed_without_waiting(r, first).median())
        step = ctx.step_us(r)
        blocks = ag[~ag["block"].isin(["root", "unattributed"])]
        block_bytes = float(blocks["bytes"].median()) if len(blocks) else float("nan")
        unit_bytes = float(first["bytes"].median())
        big_root = unit == "root" and unit_bytes >= ROOT_SIZE_RATIO * block_bytes
        if (
            exposed >= FIRST_AG_EXPOSED * step
            and big_root
            and (worst is None or exposed > worst[1])
        ):
            worst = (r.rank, exposed, step, unit_bytes, block_bytes)
    if worst is None:
        return None
    rank, exposed, step, unit_bytes, block_bytes = worst
    return Finding(
        1,
        "first-allgather-exposed",
        "First forward all-gather exposed",
        saw=f"rank {rank}: the step's first all-gather (the root unit, {unit_bytes / 1e6:.0f} MB, "
        f"{unit_bytes / block_bytes:.1f}x a block's) is exposed for {_ms(exposed)} per step "
        f"({_pct(exposed / step)} of the step)",
        why="nothing can hide the first gather of a step; one is expected, but a root unit that "
        "carries the embeddings and the output head makes it several blocks long",
        change="shard the embeddings and the norm+output head as their own units "
        "(fully_shard(tok_embeddings), fully_shard([norm, output]); `--shard-embeddings`), so "
        "the first gather is small and the head's is prefetched",
        severity=exposed / step,
        metrics={"rank": rank, "exposed_us": exposed, "bytes": unit_bytes},
    )


def last_block_regathered(ctx: Context) -> Finding | None:
    """2. The last block of forward is all-gathered again right at the start of backward."""
    worst = None
    for r in ctx.analysis.ranks:  # CPU (gloo) traces show it too
        c = r.collectives
        if c.empty or r.steps.empty:
            continue
        c = c[(c["collective"] == "AllGather") & c["block"].isin(ctx.block_units(c["block"]))]
        fwd, bwd = c[c["phase"] == "forward"], c[c["phase"] == "backward"]
        if fwd.empty or bwd.empty:
            continue
        last_fwd = _per_step(fwd, lambda g: g.loc[g["start_us"].idxmax()]).set_index("step")
        first_bwd = _per_step(bwd, lambda g: g.loc[g["start_us"].idxmin()]).set_index("step")
        steps = first_bwd.index.intersection(last_fwd.index)
        matches = first_bwd.loc[steps, "block"] == last_fwd.loc[steps, "block"]
        same = first_bwd.loc[steps][matches]
        if len(same) < max(1, len(steps) // 2):
            continue
        duration = float(same["dur_us"].median())
        exposed = float(same["exposed_us"].median()) if same["exposed_us"].notna().any() else 0.0
        step = ctx.step_us(r)
        if duration >= REGATHER_MIN * step and (worst is None or duration > worst[3]):
            worst = (r.rank, same["block"].iloc[0], exposed, duration, step)
    if worst is None:
        return None
    rank, unit, exposed, duration, step = worst
    return Finding(
        2,
        "last-unit-regathered",
        "Last unit re-gathered at the start of backward",
        saw=f"rank {rank}: {unit}, the last unit of forward, is all-gathered again as the "
        f"first gather of backward ({_ms(duration)} per step, {_ms(exposed)} of it exposed)",
        why="backward needs the last unit at once, so resharding it after forward frees its "
        "memory only for a moment and costs a gather (link time, and SMs and memory bandwidth "
        "taken from compute while it runs)",
        change=f"reshard_after_forward=False on the last unit ({unit}; `--keep-last-unsharded`, "
        "as torchtitan does)",
        severity=(exposed + 0.1 * duration) / step,
        metrics={"rank": rank, "unit": unit, "exposed_us": exposed, "duration_us": duration},
    )


def reduce_scatter_tail(ctx: Context) -> Finding | None:
    """3. Reduce-scatters still running after the last backward compute: the exposed tail."""
    worst = None
    for r in ctx.gpu_ranks:
        k = r.kernels
        if k.empty or r.collectives.empty:
            continue
        bwd = k[(k["kind"] == "compute") & k["phase"].isin(["backward", "recompute"])]
        last_compute = bwd.groupby("step")["end"].max()
        rs = r.collectives[r.collectives["collective"] == "ReduceScatter"]
        rs = rs[rs["step"].isin(last_compute.index)]
        tail = rs[rs["end_us"].to_numpy() > last_compute.reindex(rs["step"]).to_numpy()]
        per_step = (
            tail.groupby("step")["exposed_us"].sum().reindex(last_compute.index, fill_value=0.0)
        )
        count = tail.groupby("step").size().reindex(last_compute.index, fill_value=0)
        exposed, step = float(per_step.median()), ctx.step_us(r)
        if exposed >= RS_TAIL * step and (worst is None or exposed > worst[1]):
            units = ", ".join(dict.fromkeys(tail["block"].astype(str)))
            worst = (r.rank, exposed, step, float(count.median()), units)
    if worst is None:
        return None
    rank, exposed, step, count, units = worst
    micro = int(ctx.parallel().get("grad_accum", 1) or 1)
    change = (
        "make the last reduce-scatter small: shard the embeddings and head as their own "
        "units (`--shard-embeddings`) and consider reduce_dtype=bf16 (half the bytes)"
    )
    if micro > 1 and not ctx.parallel().get("accum_no_sync"):
        change = (
            f"with {micro} micro-batches, call set_requires_gradient_sync(False) on all but "
            "the last (`--accum-no-sync`): one reduce-scatter per step instead of "
            f"{micro}; and " + change
        )
    return Finding(
        3,
        "reduce-scatter-tail",
        "Reduce-scatter tail exposed at the end of backward",
        saw=f"rank {rank}: {count:g} reduce-scatter(s) ({units}) still run after the last "
        f"backward kernel, {_ms(exposed)} exposed per step ({_pct(exposed / step)})",
        why="the optimizer waits for every gradient; about one reduce-scatter at the end is "
        "unavoidable, more than that (or a large one) is time the GPU only waits",
        change=change,
        severity=exposed / step,
        metrics={"rank": rank, "exposed_us": exposed, "count": count},
    )


def communication_bound(ctx: Context) -> Finding | None:
    """4. A block's all-gather takes longer than the compute it could hide behind."""
    transfer = None
    if not ctx.crossrank.empty:
        m = ctx.crossrank.matched
        transfer = (
            m[m["collective"] == "AllGather"].groupby(["block", "phase"])["transfer_us"].median()
        )
    rows = []
    for r in ctx.gpu_ranks:
        b = r.blocks
        b = b[
            (b["collective"] == "AllGather")
            & (~b["block"].isin(["root", "unattributed"]))
            & b["phase"].isin(["forward", "backward"])
        ]
        for row in b.itertuples():
            gather = row.time_us_per_step / max(row.count_per_step, 1)
            if transfer is not None and (row.block, row.phase) in transfer.index:
                gather = float(transfer.loc[(row.block, row.phase)])
            compute = row.compute_us_per_step
            rows.append((r.rank, row.block, row.phase, gather, compute))
    if not rows:
        return None
    table = pd.DataFrame(rows, columns=["rank", "block", "phase", "gather", "compute"])
    per_unit = table.groupby(["block", "phase"])[["gather", "compute"]].median()
    bound = per_unit[per_unit["gather"] > per_unit["compute"]]
    units = per_unit.index.get_level_values("block").nunique()
    bound_units = bound.index.get_level_values("block").nunique()
    if units == 0 or bound_units / units < COMM_BOUND_SHARE:
        return None
    worst = (bound["gather"] - bound["compute"]).idxmax()
    g, c = bound.loc[worst, "gather"], bound.loc[worst, "compute"]
    step = float(np.median([ctx.step_us(r) for r in ctx.gpu_ranks]))
    excess = float((bound["gather"] - bound["compute"]).sum())
    return Finding(
        4,
        "communication-bound",
        "Communication-bound blocks",
        saw=f"{bound_units} of {units} blocks gather their parameters for longer than they "
        f"compute (worst: {worst[0]} {worst[1]}, all-gather {_ms(g)} vs {_ms(c)} of compute"
        + ("; gather times are the cross-rank transfer estimate)" if transfer is not None else ")"),
        why="prefetching can only hide a gather behind the neighbouring block's compute; when "
        "the gather is longer, the difference is exposed on every block",
        change="more compute per gather: a larger local batch or sequence, activation "
        "checkpointing (recompute gives backward gathers work to hide behind, `--ac-coverage`), "
        "fewer and larger units, or reshard_after_forward=False / an int group size to drop "
        "the backward gathers",
        severity=excess / step,
        metrics={"bound_units": bound_units, "units": units, "worst": f"{worst[0]} {worst[1]}"},
    )


def host_bound(ctx: Context) -> Finding | None:
    """5. The GPU sits idle: the CPU (FSDP hooks, launches, optimizer) cannot keep up."""
    worst = None
    for r in ctx.gpu_ranks:
        idle = float(r.steps["idle_pct"].median()) / 100.0
        if idle >= HOST_IDLE and (worst is None or idle > worst[1]):
            k = r.kernels[r.kernels["kind"] == "compute"]
            per_step = len(k) / max(len(r.steps), 1)
            mean_us = float(k["dur"].mean()) if len(k) else float("nan")
            worst = (r.rank, idle, per_step, mean_us)
    if worst is None:
        return None
    rank, idle, per_step, mean_us = worst
    return Finding(
        5,
        "host-bound",
        "Host-bound: the GPU waits for the CPU",
        saw=f"rank {rank}: the GPU is idle {_pct(idle)} of the step, running {per_step:.0f} "
        f"compute kernels per step of {mean_us:.0f} µs on average",
        why="with no communication or compute running, the GPU waits for the host to launch "
        "work (Python, FSDP hooks, the optimizer, data loading)",
        change="launch less from the host: torch.compile the blocks (`--compile`), fewer and "
        "larger FSDP units, a fused/foreach optimizer, explicit prefetch, a larger batch per "
        "step; check the optimizer's and the data loader's CPU time",
        severity=idle,
        metrics={"rank": rank, "idle_pct": 100 * idle, "kernels_per_step": per_step},
    )


def redundant_allgathers(ctx: Context) -> Finding | None:
    """6. More all-gathers per unit and step than the reshard setting implies."""
    frames = [r.blocks for r in ctx.gpu_ranks if not r.blocks.empty]
    if not frames:
        return None
    b = pd.concat(frames)
    extra = b[(b["collective"] == "AllGather") & (b["excess"] > 0)].drop_duplicates(
        ["rank", "block"]
    )
    if extra.empty:
        return None
    worst = extra.sort_values("excess", ascending=False).iloc[0]
    micro = int(ctx.parallel().get("grad_accum", 1) or 1)
    units = extra["block"].nunique()
    why = (
        "each extra gather moves the unit's parameters again and occupies the same "
        "stream the next prefetch needs"
    )
    if micro > 1:
        cause = (
            f"gradient accumulation over {micro} micro-batches re-gathers every unit in "
            "every micro-batch"
        )
        change = (
            "keep parameters unsharded across micro-batches: set_reshard_after_backward("
            "False) (and reshard_after_forward=False) on non-final micro-batches, or fewer "
            "and larger micro-batches"
        )
    else:
        cause = "parameters are gathered outside the normal forward/backward"
        change = (
            "look for reentrant checkpointing around FSDP units (use non-reentrant), "
            "parameters touched outside forward (weight tying, regularisers, "
            "model.unshard()), or nested FSDP units gathering twice"
        )
    return Finding(
        6,
        "redundant-allgathers",
        "Redundant all-gathers",
        saw=f"{units} units all-gather {worst['unit_count_per_step']:g} times per step where "
        f"the reshard setting implies {worst['expected_per_step']:g} (e.g. {worst['block']}); "
        f"{cause}",
        why=why,
        change=change,
        severity=float(extra["time_us_per_step"].sum())
        / max(float(np.median([ctx.step_us(r) for r in ctx.gpu_ranks])), 1.0),
        metrics={
            "units": units,
            "count": float(worst["unit_count_per_step"]),
            "expected": float(worst["expected_per_step"]),
        },
    )


def overlap_tax(ctx: Context) -> Finding | None:
    """7. The same compute kernel runs measurably slower while NCCL runs beside it."""
    worst = None
    for r in ctx.gpu_ranks:
        k = r.kernels
        if k.empty:
            continue
        comm = k[k["kind"] == "comm"]
        compute = k[k["kind"] == "compute"]
        if comm.empty or compute.empty:
            continue
        comm_u = iv.union(comm["ts"].to_numpy(), comm["end"].to_numpy())
        dur = compute["dur"].to_numpy()
        shared = iv.overlap_each(compute["ts"].to_numpy(), compute["end"].to_numpy(), comm_u)
        frac = np.divide(shared, dur, out=np.zeros_like(dur), where=dur > 0)
        frame = pd.DataFrame(
            {
                "name": compute["name"].astype(str).to_numpy(),
                "dur": dur,
                "with": frac > 0.5,
                "alone": frac == 0,
            }
        )
        with_nccl = frame[frame["with"]].groupby("name")["dur"].agg(["median", "sum", "size"])
        alone = frame[frame["alone"]].groupby("name")["dur"].agg(["median", "size"])
        both = with_nccl.add_suffix("_with").join(alone.add_suffix("_alone"), how="inner")
        both = both[(both["size_with"] >= 3) & (both["size_alone"] >= 3)]
        if both.empty:
            continue
        slow = both["median_with"] / both["median_alone"] - 1.0
        weight = both["sum_with"]
        tax = float((slow * weight).sum() / weight.sum())
        step = ctx.step_us(r)
        share = float(weight.sum()) / len(r.steps) / step
        if tax >= TAX_SLOWDOWN and share >= TAX_TIME and (worst is None or tax > worst[1]):
            top = slow.loc[weight.sort_values(ascending=False).index[:3]]
            worst = (r.rank, tax, share, top)
    if worst is None:
        return None
    rank, tax, share, top = worst
    examples = "; ".join(f"{name[:48]}… {100 * v:+.0f} %" for name, v in top.items())
    return Finding(
        7,
        "overlap-tax",
        "Overlap tax: compute slows down next to NCCL",
        saw=f"rank {rank}: compute kernels that run beside NCCL take {100 * tax:.0f} % longer "
        f"than the same kernels alone (time-weighted; {_pct(share)} of the step is such "
        f"compute). Largest: {examples}",
        why="NCCL kernels take SMs and memory bandwidth from the GEMMs they overlap (about "
        "19 % on average in arXiv 2507.03114): hidden communication is not free",
        change="give NCCL fewer SMs (NCCL_MAX_NCHANNELS / NCCL_MAX_CTAS), avoid over-"
        "prefetching (`--prefetch-forward/--prefetch-backward` 1), or overlap with less "
        "bandwidth-hungry compute",
        severity=tax * share,
        metrics={"rank": rank, "slowdown": tax, "overlapped_share": share},
    )


def low_bus_bandwidth(ctx: Context) -> Finding | None:
    """8. Large collectives reach far less bus bandwidth than the interconnect should give."""
    topology = ctx.run.get("environment", {}).get("interconnect", {}).get("summary")
    floor = BUSBW_FLOOR_GBPS.get(topology, BUSBW_FLOOR_GBPS[None])
    if not ctx.crossrank.empty:
        m = ctx.crossrank.matched
        large = m[m["bytes"] >= LARGE_MESSAGE_BYTES]
        values, source = large["transfer_busbw_gbps"], "transfer-time"
    else:
        frames = [r.collectives for r in ctx.gpu_ranks if not r.collectives.empty]
        if not frames:
            return None
        c = pd.concat(frames)
        large = c[c["bytes"] >= LARGE_MESSAGE_BYTES]
        values, source = large["busbw_gbps"], "kernel-duration"
    values = values.dropna()
    if len(values) < 3:
        return None
    busbw = float(values.median())
    if busbw >= floor:
        return None
    link = {"nvlink": "NVLink", "pcie": "PCIe", "mixed": "mixed NVLink/PCIe"}.get(
        topology, "an unknown link"
    )
    env = ctx.env_vars()
    hints = [
        f"{k}={v}"
        for k, v in env.items()
        if k in ("NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE")
    ]
    return Finding(
        8,
        "low-bus-bandwidth",
        "Bus bandwidth far below the interconnect",
        saw=f"large all-gathers/reduce-scatters (>= {LARGE_MESSAGE_BYTES / 1e6:.0f} MB) reach a "
        f"median busbw of {busbw:.0f} GB/s ({source}) on {link}, where at least {floor:.0f} "
        "GB/s is expected" + (f"; set: {', '.join(hints)}" if hints else ""),
        why="every exposed microsecond of communication scales with 1/bandwidth; NVLink gives "
        "hundreds of GB/s, PCIe-only pairs about 20 and reach 30–40 % scaling efficiency, not "
        "70 %+",
        change="check the topology (`nvidia-smi topo -m`) and NCCL's transport (NCCL_DEBUG=INFO: "
        "P2P/NVLink vs SHM/NET), unset NCCL_P2P_DISABLE / NCCL_P2P_LEVEL limits, merge small "
        "units into larger messages, and look for a straggler inflating durations",
        severity=1.0 - busbw / floor,
        metrics={"busbw_gbps": busbw, "floor_gbps": floor, "topology": topology},
    )


def max_connections_one(ctx: Context) -> Finding | None:
    """9. CUDA_DEVICE_MAX_CONNECTIONS=1 serialises communication with compute."""
    if ctx.env_vars().get("CUDA_DEVICE_MAX_CONNECTIONS") != "1":
        return None
    overlap = [float(r.steps["overlap_pct"].median()) for r in ctx.gpu_ranks]
    exposed = [float(r.steps["exposed_pct"].median()) for r in ctx.gpu_ranks]
    return Finding(
        9,
        "max-connections-1",
        "CUDA_DEVICE_MAX_CONNECTIONS=1",
        saw="the capture ran with CUDA_DEVICE_MAX_CONNECTIONS=1"
        + (
            f"; overlap {np.median(overlap):.1f} %, exposed communication "
            f"{np.median(exposed):.1f} % of the step"
            if overlap
            else ""
        ),
        why="one hardware work queue puts every stream's kernels in one line: FSDP's "
        "communication streams can no longer run beside compute (tensor-parallel recipes set "
        "it; FSDP needs the opposite)",
        change="unset CUDA_DEVICE_MAX_CONNECTIONS (or set it to 32) for FSDP training",
        severity=float(np.median(exposed)) / 100 if exposed else 0.0,
        metrics={"overlap_pct": overlap, "exposed_pct": exposed},
    )


def straggler(ctx: Context) -> Finding | None:
    """10. One rank arrives last at most collectives: the others wait for it."""
    if ctx.crossrank.empty:
        return None
    per_rank = ctx.crossrank.per_rank
    slow = per_rank.loc[per_rank["arrived_last_share"].idxmax()]
    if slow["arrived_last_share"] < STRAGGLER_SHARE:
        return None
    others = per_rank[per_rank["rank"] != slow["rank"]]
    wait = float(others["wait_us_per_step"].median())
    step = float(np.median([ctx.step_us(r) for r in ctx.gpu_ranks]))
    if wait < STRAGGLER_WAIT * step:
        return None
    m = ctx.crossrank.matched
    late = float(m.loc[m["last_rank"] == slow["rank"], "lateness_us"].median())
    return Finding(
        10,
        "straggler",
        f"Straggler: rank {int(slow['rank'])}",
        saw=f"rank {int(slow['rank'])} arrived last at {_pct(slow['arrived_last_share'])} of "
        f"{len(m)} matched collectives (median {late / 1e3:.2f} ms late); the other ranks wait "
        f"{_ms(wait)} per step for it ({_pct(wait / step)} of the step) inside NCCL kernels",
        why="a collective ends when its last rank arrives: every other rank's NCCL kernel "
        "includes that wait, so the slowest rank sets the pace of all",
        change=f"look at rank {int(slow['rank'])}'s host: data loading, CPU contention or "
        "affinity, thermals or clocks, a different GPU; compare its step time and idle share "
        "with the others'",
        severity=wait / step,
        metrics={
            "rank": int(slow["rank"]),
            "share": float(slow["arrived_last_share"]),
            "wait_us_per_step": wait,
        },
    )


def profiler_distortion(ctx: Context) -> Finding | None:
    """11. The detailed (record_shapes + with_stack) step is much slower than the timing ones."""
    items = [d for d in ctx.analysis.distortion() if d["slowdown_pct"] >= 100 * DISTORTION]
    if not items:
        return None
    worst = max(items, key=lambda d: d["slowdown_pct"])
    return Finding(
        11,
        "profiler-distortion",
        "Profiler distortion in the detailed step",
        saw=f"rank {worst['rank']}: the detailed step took {_ms(worst['detailed_step_us'])} vs "
        f"{_ms(worst['timing_median_step_us'])} for the timing steps "
        f"({worst['slowdown_pct']:+.0f} %)",
        why="record_shapes and with_stack add host overhead per operator; on a host-bound "
        "step that changes the overlap itself, so the detailed trace is for attribution only",
        change="read overlap and timing from the lean timing trace (fsdp-trace does); add a "
        "barrier after warmup and drop the first active step when you profile yourself",
        severity=worst["slowdown_pct"] / 100,
        metrics=worst,
    )


RULES: tuple[Callable[[Context], Finding | None], ...] = (
    first_forward_allgather,
    last_block_regathered,
    reduce_scatter_tail,
    communication_bound,
    host_bound,
    redundant_allgathers,
    overlap_tax,
    low_bus_bandwidth,
    max_connections_one,
    straggler,
    profiler_distortion,
)


def diagnose(
    analysis: Analysis, crossrank: CrossRank | None = None
) -> tuple[list[Finding], CrossRank]:
    """Every rule's finding, most costly first, and the cross-rank view they used."""
    crossrank = crossrank if crossrank is not None else match(analysis.ranks)
    ctx = Context(analysis, crossrank, analysis.run or {})
    findings = [f for rule in RULES if (f := rule(ctx)) is not None]
    return sorted(findings, key=lambda f: -f.severity), crossrank
