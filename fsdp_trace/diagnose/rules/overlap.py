"""The overlap tax: hidden communication is not free. NCCL kernels take SMs and memory
bandwidth from the compute they overlap, so the same block op runs slower beside them."""

from __future__ import annotations

from fsdp_trace.analysis.overlap_tax import op_tax
from fsdp_trace.diagnose.context import Context, ms, pct
from fsdp_trace.diagnose.finding import Change, Finding
from fsdp_trace.diagnose.registry import rule
from fsdp_trace.vocab import Basis

TAX_COST = 0.03  # time NCCL adds to the compute beside it, share of the step


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
        ops = op_tax(r, ctx.block_units())
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
