"""The overlap tax: hidden communication is not free. NCCL kernels take SMs and memory
bandwidth from the compute they overlap, so the same block op runs slower beside them."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fsdp_trace.analysis import intervals as iv
from fsdp_trace.analysis.results import RankAnalysis
from fsdp_trace.diagnose.context import Context, ms, pct
from fsdp_trace.diagnose.finding import Change, Finding
from fsdp_trace.diagnose.registry import rule
from fsdp_trace.vocab import Basis
from fsdp_trace.vocab import Kind as EventKind

TAX_COST = 0.03  # time NCCL adds to the compute beside it, share of the step
TAX_MIN_LAUNCHES = 3  # launches of an op with and without NCCL beside it, each


def _op_tax(ctx: Context, r: RankAnalysis) -> pd.DataFrame:
    """Per compute op of the transformer blocks, its median duration with NCCL beside it
    (over half of the kernel overlaps communication) and alone (none does).

    An op is one kernel position of a block: name, launch grid and block shape, phase and the
    n-th launch of that shape in the block's phase. Every block runs the same ops on the same
    shapes, so an op compares like with like across blocks and steps; a name alone mixes
    problem sizes (persistent GEMM kernels launch one grid for every shape)."""
    k = r.kernels
    if k.empty or "grid" not in k or "block_dim" not in k:
        return pd.DataFrame()
    comm = k[k["kind"] == EventKind.COMM]
    blocks = ctx.block_units()
    compute = k[
        (k["kind"] == EventKind.COMPUTE)
        & k["block"].isin(blocks)
        & k["grid"].notna()
        & k["block_dim"].notna()
    ].sort_values("ts", kind="stable")
    if comm.empty or compute.empty:
        return pd.DataFrame()
    comm_u = iv.union(comm["ts"].to_numpy(), comm["end"].to_numpy())
    dur = compute["dur"].to_numpy(dtype=np.float64)
    shared = iv.overlap_each(compute["ts"].to_numpy(), compute["end"].to_numpy(), comm_u)
    frac = np.divide(shared, dur, out=np.zeros_like(dur), where=dur > 0)
    shape = ["name", "grid", "block_dim", "phase"]
    frame = pd.DataFrame(
        {
            "shape": compute.groupby(shape, sort=False, observed=True, dropna=False)
            .ngroup()
            .to_numpy(),
            "nth": compute.groupby(["step", "block", *shape], observed=True, dropna=False)
            .cumcount()
            .to_numpy(),
            "kernel": compute["name"].to_numpy(),
            "phase": compute["phase"].to_numpy(),
            "dur": dur,
        }
    )
    beside = (
        frame[frac > 0.5]
        .groupby(["shape", "nth"])
        .agg(
            kernel=("kernel", "first"),
            phase=("phase", "first"),
            median_with=("dur", "median"),
            time_with=("dur", "sum"),
            n_with=("dur", "size"),
        )
    )
    alone = (
        frame[frac == 0].groupby(["shape", "nth"])["dur"].agg(median_alone="median", n_alone="size")
    )
    ops = beside.join(alone, how="inner")
    ops = ops[(ops["n_with"] >= TAX_MIN_LAUNCHES) & (ops["n_alone"] >= TAX_MIN_LAUNCHES)].copy()
    ops["slowdown"] = ops["median_with"] / ops["median_alone"] - 1.0
    # Time beside NCCL beyond what the same launches take alone: T − T / (1 + slowdown).
    ops["added_us"] = ops["time_with"] * ops["slowdown"] / (1.0 + ops["slowdown"])
    return ops


@rule(
    "overlap-tax",
    "Overlap tax: compute slows down next to NCCL",
    "the same block op (kernel name, launch shape, phase, position in the block) runs slower "
    "beside NCCL and that adds ≥ 3 % to the step",
)
def overlap_tax(ctx: Context) -> Finding | None:
    """The same compute op runs measurably slower while NCCL runs beside it, and that costs
    a noticeable share of the step."""
    worst = None
    for r in ctx.gpu_ranks:
        ops = _op_tax(ctx, r)
        if ops.empty:
            continue
        n_steps = max(len(r.steps), 1)
        step = ctx.step_us(r)
        added = float(ops["added_us"].sum()) / n_steps
        if added >= TAX_COST * step and (worst is None or added / step > worst[1]):
            worst = (r.rank, added / step, added, ops, n_steps, step)
    if worst is None:
        return None
    rank, share, added, ops, n_steps, step = worst
    slowdown = float((ops["slowdown"] * ops["time_with"]).sum() / ops["time_with"].sum())
    beside = float(ops["time_with"].sum()) / n_steps
    top = ops.sort_values("added_us", ascending=False).head(3)
    examples = "; ".join(
        f"{str(row.kernel)[:48]} ({row.phase}) {100 * row.slowdown:+.0f} %"
        for row in top.itertuples(index=False)
    )
    env = ctx.env_vars()
    limits = [f"{k}={env[k]}" for k in ("NCCL_MAX_NCHANNELS", "NCCL_MAX_CTAS") if k in env]
    knobs = [
        "give NCCL fewer SMs (NCCL_MAX_NCHANNELS / NCCL_MAX_CTAS"
        + (f", now {', '.join(limits)}" if limits else "")
        + ") where communication has slack to spare"
    ]
    cli = ""
    prefetch = max(
        int(ctx.config.forward_prefetch.value or 0), int(ctx.config.backward_prefetch.value or 0)
    )
    if prefetch > 1:
        knobs.append(f"prefetch one unit ahead instead of {prefetch}")
        cli = "--prefetch-forward 1 --prefetch-backward 1"
    knobs.append("or overlap with less bandwidth-hungry compute")
    return Finding(
        "overlap-tax",
        "Overlap tax: compute slows down next to NCCL",
        cause=f"rank {rank}'s block compute runs {100 * slowdown:.0f} % slower while NCCL "
        "kernels share the GPU with it",
        evidence=f"rank {rank}: {len(ops)} block ops run {100 * slowdown:.0f} % slower beside "
        f"NCCL than the same ops alone (time-weighted; {ms(beside)} per step of such compute), "
        f"adding {ms(added)} per step ({pct(share)} of the step; threshold {pct(TAX_COST)}). "
        f"Largest: {examples}",
        why="NCCL kernels take SMs and memory bandwidth from the GEMMs they overlap (about "
        "19 % on average in arXiv 2507.03114): hidden communication is not free",
        change=Change("; ".join(knobs), cli=cli, code="NCCL_MAX_NCHANNELS=8  # environment, try"),
        cost_us=added,
        step_us=step,
        basis=Basis.INFERRED,
        ranks=[int(rank)],
        metrics={"rank": rank, "slowdown": slowdown, "added_us": added, "cost": share},
    )
