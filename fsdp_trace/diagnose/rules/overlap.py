"""The overlap tax: hidden communication is not free. NCCL kernels take SMs and memory
bandwidth from the compute they overlap, so the same block op runs slower beside them. A
measured fact about hidden communication, said as a note: its only knobs (fewer NCCL channels
or CTAs) were measured to slow healthy steps, so it never leads a verdict."""

from __future__ import annotations

from fsdp_trace.analysis.intervals import total
from fsdp_trace.analysis.rank.overlap_tax import op_table
from fsdp_trace.analysis.table import array_of
from fsdp_trace.diagnose.context import Context, ms, pct
from fsdp_trace.diagnose.finding import Change, Finding, FindingKind
from fsdp_trace.diagnose.registry import rule
from fsdp_trace.vocab import Basis

TAX_COST = 0.03  # time NCCL adds to the compute beside it, share of the step


@rule(
    "overlap-tax",
    "Overlap tax: compute runs slower beside NCCL (a measurement)",
    "a note, never a cause: the same block op (kernel name, launch shape, phase, position in "
    "the block) runs slower beside NCCL kernels moving data than alone, adding ≥ 3 % to the step",
)
def overlap_tax(ctx: Context) -> Finding | None:
    """The same compute op runs measurably slower while NCCL runs beside it, and that costs
    a noticeable share of the step."""
    worst = None
    for r in ctx.gpu_ranks:
        ops = op_table(r, ctx.block_units())  # its columns read, not its (shape, nth) index
        if ops.empty:
            continue
        n_steps = max(len(r.steps), 1)
        step = ctx.step_us(r)
        added = total(array_of(ops, "added_us")) / n_steps
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
    prefetch = max(
        int(ctx.config.forward_prefetch.value or 0), int(ctx.config.backward_prefetch.value or 0)
    )
    advice = (
        "nothing to change for it alone: it is the price of hiding communication, paid beside "
        "NCCL kernels that move data. Giving NCCL fewer SMs was measured to slow a healthy "
        "step (NCCL_MAX_NCHANNELS=8: +2.6 %, =4: +8 %, gpt-1.3b-class on 2× H100; =8: "
        "+1.2 %, within noise, gpt-1.3b batch 8 on 2× H200): the transfers lengthen more than "
        "compute gains; to try a limit on your run, capture it with and without the variable "
        "in the environment and compare (`fsdp-trace compare`): keep it only beyond the run's "
        "noise"
    )
    if prefetch > 1:
        advice += f"; prefetching {prefetch} units ahead keeps more NCCL work beside compute"
    return Finding(
        "overlap-tax",
        "Overlap tax: compute runs slower beside NCCL (a measurement)",
        cause=f"rank {rank}'s block compute runs {100 * slowdown:.0f} % slower while NCCL "
        "kernels move data beside it",
        evidence=f"rank {rank}: {len(ops)} block ops run {100 * slowdown:.0f} % slower beside "
        f"NCCL kernels moving data than the same ops with no NCCL kernel beside them "
        f"(time-weighted; {ms(beside)} per step of such compute), adding {ms(added)} per step "
        f"({pct(share)} of the step; shown from {pct(TAX_COST)}). Largest: {examples}. "
        "Compute beside the part of an NCCL kernel beyond the shortest of its kind on this rank "
        "(waiting for a peer) is not counted",
        why="NCCL kernels take SMs and memory bandwidth from the GEMMs they overlap (about "
        "19 % on average in arXiv 2507.03114): hidden communication is not free, but not "
        "hiding it costs more",
        change=Change(advice),
        cost_us=added,
        step_us=step,
        basis=Basis.MEASURED,
        ranks=[int(rank)],
        kind=FindingKind.NOTE,
        metrics={"rank": rank, "slowdown": slowdown, "added_us": added, "cost": share},
    )
