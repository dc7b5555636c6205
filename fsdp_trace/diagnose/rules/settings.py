"""Rules about settings the run chose: units gathered more often than their reshard setting
implies, gradient accumulation that re-gathers and re-reduces every micro-batch, a root
unit that reshards after forward, activation checkpointing that costs more than it hides,
and CUDA_DEVICE_MAX_CONNECTIONS=1. The configuration each rule holds the run to is the
inferred one (`fsdp_trace.analysis.job.config`), run.json winning where it exists."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fsdp_trace.analysis.intervals import median, total
from fsdp_trace.analysis.table import array_of
from fsdp_trace.diagnose.context import Context, ms, pct
from fsdp_trace.diagnose.finding import Change, Finding
from fsdp_trace.diagnose.registry import rule
from fsdp_trace.fmt import agree, plural
from fsdp_trace.vocab import ROOT, Basis, Collective, Phase

PAIR = (Collective.ALL_GATHER, Collective.REDUCE_SCATTER)
_PAIR_SET = frozenset(PAIR)  # found by plain strings too (a Word hashes as its text)


def _exposed_per_step(ctx: Context, r, mask) -> float:
    c = ctx.collectives(r)
    rows = np.asarray(mask(c), dtype=bool)
    return total(array_of(c, "exposed_net_us")[rows]) / max(len(r.steps), 1)


def _pairs_in_excess(blocks: pd.DataFrame) -> np.ndarray:
    """The block table's all-gather and reduce-scatter rows in excess of the configuration:
    `blocks["collective"].isin(PAIR) & (blocks["excess"] > 1e-9)`, read as arrays."""
    kinds = array_of(blocks, "collective", object)
    pair = np.fromiter(map(_PAIR_SET.__contains__, kinds), dtype=bool, count=kinds.size)
    return pair & (array_of(blocks, "excess", np.float64) > 1e-9)


@rule(
    "redundant-collectives",
    "Redundant collectives",
    "more all-gathers / reduce-scatters per unit and optimizer step than the configuration "
    "implies (2 per micro-batch with reshard, 1 without)",
    communication=True,
)
def redundant_collectives(ctx: Context) -> Finding | None:
    """More all-gathers (or reduce-scatters) per unit and optimizer step than the reshard
    setting and the micro-batches imply: reentrant checkpointing, parameters touched outside
    forward, or nested units gathering twice."""
    worst = None
    for r in ctx.gpu_ranks:
        b = r.blocks
        in_excess = _pairs_in_excess(b)
        if not in_excess.any():  # most ranks: no frame picked, nothing deduplicated
            continue
        extra = b[in_excess].drop_duplicates(["block", "collective"])
        cost = 0.0
        for row in extra.itertuples():
            share = row.excess / row.unit_count_per_step
            cost += share * _exposed_per_step(
                ctx,
                r,
                lambda c, row=row: (c["block"] == row.block) & (c["collective"] == row.collective),
            )
        if worst is None or cost > worst[1]:
            worst = (r.rank, cost, extra, ctx.step_us(r))
    if worst is None:
        return None
    rank, cost, extra, step = worst
    ag = extra[extra["collective"] == Collective.ALL_GATHER].sort_values("excess", ascending=False)
    rs = extra[extra["collective"] == Collective.REDUCE_SCATTER].sort_values(
        "excess", ascending=False
    )
    saw = []
    if len(ag):
        w = ag.iloc[0]
        saw.append(
            f"{ag['block'].nunique()} units all-gather {w['unit_count_per_step']:g} times per step "
            f"where the configuration implies {w['expected_per_step']:g} (e.g. {w['block']})"
        )
    if len(rs):
        w = rs.iloc[0]
        saw.append(
            f"{rs['block'].nunique()} units reduce-scatter {w['unit_count_per_step']:g} times per "
            f"step where {w['expected_per_step']:g} suffice (e.g. {w['block']})"
        )
    return Finding(
        "redundant-collectives",
        "Redundant all-gathers" if len(ag) else "Redundant reduce-scatters",
        cause="parameters are gathered (or gradients reduced) more often than the reshard "
        "setting needs: something gathers them outside the normal forward/backward",
        evidence=f"rank {rank}: " + "; ".join(saw) + f"; the extra ones expose {ms(cost)} per "
        f"step ({pct(cost / step)})",
        why="each extra gather moves the unit's parameters again, each extra reduce-scatter its "
        "gradients, on the same streams the next prefetch and reduction need",
        change=Change(
            "look for reentrant checkpointing around FSDP units (use non-reentrant), parameters "
            "touched outside forward (weight tying, regularisers, model.unshard()), or nested "
            "FSDP units gathering twice",
            cli="--ac-mode non-reentrant",
            code="checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT)",
        ),
        cost_us=cost,
        step_us=step,
        basis=Basis.INFERRED,
        ranks=[int(rank)],
        blocks=list(dict.fromkeys(extra["block"].astype(str))),
        metrics={
            "units": int(extra["block"].nunique()),
            "count": float(extra.iloc[0]["unit_count_per_step"]),
            "expected": float(extra.iloc[0]["expected_per_step"]),
        },
    )


@rule(
    "gradient-accumulation",
    "Gradient accumulation repeats the collectives of every micro-batch",
    "micro-batches > 1 and units re-gather or reduce-scatter per micro-batch",
    communication=True,
)
def gradient_accumulation(ctx: Context) -> Finding | None:
    """Under gradient accumulation FSDP2 re-gathers each unit and reduce-scatters its
    gradient every micro-batch unless told otherwise."""
    micro = int(ctx.config.micro_batches.value or 1)
    if micro <= 1 or not ctx.gpu_ranks:
        return None
    no_sync = bool(ctx.config.accum_no_sync.value)
    blocks = ctx.block_units()
    worst = None
    for r in ctx.gpu_ranks:
        c = r.collectives
        units = c[c["block"].isin(blocks)]
        n_steps = max(len(r.steps), 1)
        per_unit = units.groupby(["collective", "block"]).size() / n_steps
        ag = float(per_unit.get(Collective.ALL_GATHER, pd.Series(dtype=float)).median())
        rs = float(per_unit.get(Collective.REDUCE_SCATTER, pd.Series(dtype=float)).median())
        later = (micro - 1) / micro  # what keeping them across micro-batches saves
        fwd = _exposed_per_step(
            ctx,
            r,
            lambda c: (c["collective"] == Collective.ALL_GATHER) & (c["phase"] == Phase.FORWARD),
        )
        red = _exposed_per_step(ctx, r, lambda c: c["collective"] == Collective.REDUCE_SCATTER)
        cost = later * fwd + (0.0 if no_sync else later * red)
        if worst is None or cost > worst[1]:
            worst = (r.rank, cost, ag, rs, ctx.step_us(r))
    rank, cost, ag, rs, step = worst
    source = ctx.config.micro_batches.source
    changes, cli = [], []
    if not no_sync and rs >= micro - 1e-9:
        changes.append(
            f"skip the gradient reduction on all but the last micro-batch (one reduce-scatter "
            f"per step instead of {micro})"
        )
        cli.append("--accum-no-sync")
    changes.append(
        "keep parameters unsharded across micro-batches (set_reshard_after_backward(False) on "
        "all but the last), or fewer and larger micro-batches"
    )
    return Finding(
        "gradient-accumulation",
        "Gradient accumulation repeats the collectives of every micro-batch",
        cause=f"{micro} micro-batches per step each gather every unit and reduce its "
        "gradients again" + (" (gradient sync is already limited to the last)" if no_sync else ""),
        evidence=f"rank {rank}: {micro} micro-batches per optimizer step ({source}); each block "
        f"all-gathers {ag:g} and reduce-scatters {rs:g} times per step; repeating them costs "
        f"about {ms(cost)} of exposed communication per step ({pct(cost / step)})",
        why="FSDP2 reshards after every backward and reduces every micro-batch's gradients "
        "unless told not to: the same parameters cross the link once per micro-batch",
        change=Change(
            "; ".join(changes),
            cli=" ".join(cli),
            code="model.set_requires_gradient_sync(is_last_micro_batch); "
            "model.set_reshard_after_backward(is_last_micro_batch)",
        ),
        cost_us=cost,
        step_us=step,
        basis=Basis.INFERRED,
        ranks=[int(rank)],
        metrics={"micro_batches": micro, "gathers_per_step": ag, "reductions_per_step": rs},
    )


@rule(
    "root-resharded",
    "Root unit resharded after forward",
    "the root unit is all-gathered again in backward (reshard_after_forward=True on the root)",
    communication=True,
)
def root_resharded(ctx: Context) -> Finding | None:
    """The root unit (the module given to the last fully_shard) is gathered in forward and
    again at the start of backward: its reshard setting, not a redundancy."""
    if ctx.config.reshards(ROOT) is not True:
        return None
    worst = None
    for r in ctx.gpu_ranks + [r for r in ctx.analysis.ranks if r not in ctx.gpu_ranks]:
        c = ctx.collectives(r)
        again = c[
            (c["collective"] == Collective.ALL_GATHER)
            & (c["block"] == ROOT)
            & c["phase"].isin([Phase.BACKWARD, Phase.RECOMPUTE])
        ]
        if again.empty:
            continue
        n_steps = max(len(r.steps), 1)
        exposed = float(again["exposed_net_us"].fillna(0.0).sum()) / n_steps
        transfer = float(again["net_us"].sum()) / n_steps
        nbytes = median(array_of(again, "bytes"))  # NaN on gloo (no sizes), no warning
        if worst is None or exposed > worst[1]:
            worst = (r.rank, exposed, transfer, nbytes, ctx.step_us(r), len(again) / n_steps)
    if worst is None:
        return None
    rank, exposed, transfer, nbytes, step, count = worst
    setting = ctx.config.unit(ROOT).reshard_after_forward
    size = f"{nbytes / 1e6:.0f} MB, " if np.isfinite(nbytes) else ""
    return Finding(
        "root-resharded",
        "Root unit resharded after forward",
        cause="the root unit reshards after forward, so backward gathers it again at once "
        f"(reshard_after_forward=True on the root, from {setting.source})",
        evidence=f"rank {rank}: the root is all-gathered {plural(count, 'more time')} per step in "
        f"backward ({size}{ms(transfer)} of transfer per step, {ms(exposed)} of it exposed)",
        why="backward starts with the root's own layers (the output head), so its parameters "
        "are needed right after forward ends: resharding them frees memory for an instant and "
        "costs a gather; FSDP2 keeps the root unsharded after forward by default for this reason",
        change=Change(
            "keep the root's parameters after forward (FSDP2's default for the root)",
            cli="--root-reshard-after-forward false",
            code="fully_shard(model, reshard_after_forward=False)",
        ),
        cost_us=exposed,
        step_us=step,
        ranks=[int(rank)],
        blocks=[ROOT],
        metrics={"rank": rank, "exposed_us": exposed, "transfer_us": transfer, "bytes": nbytes},
    )


@rule(
    "max-connections-1",
    "CUDA_DEVICE_MAX_CONNECTIONS=1",
    "the capture's environment set it",
    needs="run.json (the environment is not in the trace)",
    communication=True,
)
def max_connections_one(ctx: Context) -> Finding | None:
    """CUDA_DEVICE_MAX_CONNECTIONS=1 serialises communication with compute."""
    if ctx.env("CUDA_DEVICE_MAX_CONNECTIONS") != "1" or not ctx.gpu_ranks:
        return None
    exposed = {
        int(r.rank): _exposed_per_step(ctx, r, lambda c: c["collective"].notna())
        for r in ctx.gpu_ranks
    }
    overlap = [float(r.steps["overlap_pct"].median()) for r in ctx.gpu_ranks]
    rank = max(exposed, key=exposed.get)
    step = ctx.step_us(next(r for r in ctx.gpu_ranks if r.rank == rank))
    return Finding(
        "max-connections-1",
        "CUDA_DEVICE_MAX_CONNECTIONS=1",
        cause="one hardware work queue serialises every stream: communication cannot run "
        "beside compute",
        evidence=f"the capture ran with CUDA_DEVICE_MAX_CONNECTIONS=1 (run.json); overlap "
        f"{np.median(overlap):.1f} % of communication, {ms(exposed[rank])} of it exposed per "
        f"step on rank {rank} ({pct(exposed[rank] / step)})",
        why="one hardware work queue puts every stream's kernels in one line: FSDP's "
        "communication streams can no longer run beside compute (tensor-parallel recipes set "
        "it; FSDP needs the opposite)",
        change=Change(
            "unset CUDA_DEVICE_MAX_CONNECTIONS (or set it to 32) for FSDP training",
            code="unset CUDA_DEVICE_MAX_CONNECTIONS",
        ),
        cost_us=exposed[rank],
        step_us=step,
        basis=Basis.INFERRED,
        ranks=sorted(exposed),
        metrics={"overlap_pct": overlap, "exposed_us": exposed[rank]},
    )


AC_HIDES = 1.0  # a block's own backward compute at least this × the gather it must hide


@rule(
    "ac-over-applied",
    "Activation checkpointing costs more than it hides",
    "checkpointed blocks recompute ≥ 1 % of the step although their own backward compute "
    "already hides the all-gather they overlap",
)
def ac_over_applied(ctx: Context) -> Finding | None:
    """Activation checkpointing recomputes a block's forward inside its backward. That gives
    the backward all-gathers compute to hide behind; where the block's own backward compute
    already hides the gather, the recompute only costs time (and saves memory)."""
    checkpointed = [b for b in (ctx.config.checkpointed.value or []) if b in ctx.block_units()]
    if not checkpointed or not ctx.gpu_ranks:
        return None
    order = [u.name for u in ctx.config.units if u.name != ROOT]
    gather = _backward_gathers(ctx)
    rows = []
    for r in ctx.gpu_ranks:
        b = r.blocks
        back = b[(b["phase"] == Phase.BACKWARD) & b["recompute_us_per_step"].notna()]
        back = back.drop_duplicates("block").set_index("block")
        for unit in checkpointed:
            if unit not in back.index:
                continue
            recompute = float(back.loc[unit, "recompute_us_per_step"])
            compute = float(back.loc[unit, "compute_us_per_step"])
            i = order.index(unit) if unit in order else -1
            previous = order[i - 1] if i > 0 else None  # prefetched during this unit's backward
            needed = gather.get(previous, 0.0) if previous else 0.0
            rows.append((r.rank, unit, recompute, compute, needed))
    if not rows:
        return None
    table = pd.DataFrame(rows, columns=["rank", "unit", "recompute", "compute", "gather"])
    per_unit = table.groupby("unit").agg(
        recompute=("recompute", "median"), compute=("compute", "min"), gather=("gather", "max")
    )
    spare = per_unit[per_unit["compute"] >= AC_HIDES * per_unit["gather"]]
    if spare.empty:
        return None
    cost = float(spare["recompute"].sum())
    step = ctx.median_step_us()
    n_blocks = len(ctx.block_units()) or len(order)
    keep = len(checkpointed) - len(spare)
    names = sorted(spare.index, key=lambda u: order.index(u) if u in order else 0)
    memory = ""
    if ctx.record is not None:
        peak = ctx.record.figures.peak_allocated_gib
        total = ctx.record.environment.gpu_memory_gib
        if peak is not None and total:
            memory = f"; peak memory {peak:.1f} of {total:.0f} GiB"
            memory += (
                ": room to keep their activations" if peak < 0.8 * total else ": little headroom"
            )
    shown = spare.sort_values("gather", ascending=False).index[0]  # the gather it hides
    example = spare.loc[shown]
    return Finding(
        "ac-over-applied",
        "Activation checkpointing costs more than it hides",
        cause=f"{plural(len(spare), 'checkpointed block')} "
        f"{agree(len(spare), 'recomputes its', 'recompute their')} forward although "
        f"{agree(len(spare), 'its', 'their')} own backward compute already hides the gathers: "
        "the recompute is pure cost",
        evidence=f"{len(spare)} of {len(checkpointed)} checkpointed blocks recompute "
        f"{ms(cost)} per step ({pct(cost / step)}) while their backward compute alone "
        f"(e.g. {shown}: {ms(example['compute'])}) hides the backward all-gather it "
        f"overlaps ({ms(example['gather'])}, transfer time){memory}",
        why="checkpointing trades compute for memory, and under FSDP its recompute also gives "
        "backward gathers work to hide behind; where the gather is hidden anyway, only the "
        "memory saving remains, at the cost of the recompute",
        change=Change(
            f"stop checkpointing {', '.join(names[:6])}{' …' if len(names) > 6 else ''} if "
            "memory allows (AC coverage "
            f"{len(checkpointed)}/{n_blocks} → {keep}/{n_blocks})",
            cli=f"--ac-coverage {keep / n_blocks:.2f}",
            code="wrap only the blocks that need it: checkpoint_wrapper(block) for those",
        ),
        cost_us=cost,
        step_us=step,
        basis=Basis.INFERRED,
        ranks=[int(r.rank) for r in ctx.gpu_ranks],
        blocks=names,
        metrics={"recompute_us": cost, "blocks": names, "keep": keep},
    )


def _backward_gathers(ctx: Context) -> dict[str, float]:
    """Per unit: the transfer time of its backward all-gather (cross-rank, else the kernel
    duration), the largest over ranks."""
    out: dict[str, float] = {}
    for r in ctx.gpu_ranks:
        c = ctx.collectives(r)
        ag = c[(c["collective"] == Collective.ALL_GATHER) & (c["phase"] == Phase.BACKWARD)]
        for unit, value in ag.groupby("block")["net_us"].median().items():
            out[str(unit)] = max(out.get(str(unit), 0.0), float(value))
    return out
