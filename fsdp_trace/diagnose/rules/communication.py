"""Rules about collectives that compute does not hide: the step's first gather, the last
unit's re-gather, the gradient-reduction tail, blocks whose gather outlasts their compute,
link bandwidth, and HSDP shard groups that leave a node. Communication times exclude waiting
for late peers wherever the cross-rank view matched the collective (`net_us`,
`exposed_net_us`): that wait belongs to whatever made the peer late."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial

import numpy as np
import pandas as pd

from fsdp_trace.analysis import intervals as iv
from fsdp_trace.analysis.rank.kernel_figures import backward_end
from fsdp_trace.analysis.results import RankAnalysis
from fsdp_trace.analysis.table import array_of
from fsdp_trace.diagnose import busbw as reference
from fsdp_trace.diagnose.context import Context, ms, pct, per_step_rows
from fsdp_trace.diagnose.finding import Change, Finding
from fsdp_trace.diagnose.registry import rule
from fsdp_trace.fmt import agree, plural
from fsdp_trace.vocab import (
    GRADIENT_REDUCTIONS,
    NON_BLOCK_UNITS,
    ROOT,
    Basis,
    Collective,
    MeshKind,
    Phase,
)

FIRST_AG_EXPOSED = 0.01  # first all-gather exposed (waiting excluded), share of the step
ROOT_SIZE_RATIO = 2.0  # ... and the root at least this many blocks' worth of bytes
REGATHER_MIN = 0.002  # the last unit's re-gather: transfer time, share of the step
TAIL_EXPOSED = 0.02  # gradient reductions after the last backward kernel, exposed share
COMM_BOUND_SHARE = 0.25  # share of block units whose gather outlasts their compute ...
COMM_BOUND_RATIO = 1.2  # ... by at least this factor (transfer vs unslowed compute)
# Where the reference table (diagnose/data/busbw.csv: busbw per message size, group size and
# collective, measured on healthy links) has a curve for the link, a message is compared with
# the curve at its own size: below this share of it (the median over the messages) the link is
# broken rather than busy (the shipped 2x H200 runs reach a median 0.98-1.00 of it, NCCL
# through host memory, p2p-disabled, 0.13).
BUSBW_FLOOR_SHARE = 0.25
# Where it has none (the link's kind, or sizes below its curve): floors (GB/s) below which a
# link is broken rather than busy, and the bandwidth FSDP-sized messages (10-100 MB) reach on
# a healthy link (55-85 % of the large-message figure; metrics-and-advice.md): what a cost
# estimate compares against.
BUSBW_FLOOR_GBPS = {"nvlink": 50.0, "mixed": 20.0, "pcie": 5.0, None: 10.0}
BUSBW_HEALTHY_GBPS = {"nvlink": 200.0, "mixed": 40.0, "pcie": 15.0}
LARGE_MESSAGE_BYTES = 8e6  # messages big enough to reach link bandwidth
# GPUs that only come as SXM/OAM modules on an NVLink board: with no topology in run.json,
# a single-node trace whose deviceProperties name one of these is taken to be on NVLink.
NVLINK_PARTS = re.compile(
    r"SXM|H100 80GB HBM3|H200(?! NVL)|H800(?! PCIe)|\bH20\b|\bGH200\b|\bG?B[23]00\b",
    re.IGNORECASE,
)


@rule(
    "first-allgather-exposed",
    "First forward all-gather exposed",
    "the step's first gather is the root unit, ≥ 2 blocks' bytes, exposed ≥ 1 % of the step "
    "(waiting excluded)",
    communication=True,
)
def first_forward_allgather(ctx: Context) -> Finding | None:
    """The first forward all-gather (the root unit) is exposed: expected once per step, but
    a root that holds the embeddings and output head makes it several blocks long."""
    worst = None
    blocks = ctx.block_units()
    # A rank's first gathers' exposed median is at most its largest forward gather's: ranks
    # whose largest is under the threshold are skipped unread (one pass over the run).
    bound = ctx.run_collectives.rank_bound(
        "exposed_net_us", collective=[Collective.ALL_GATHER], phase=[Phase.FORWARD]
    )
    for r in ctx.gpu_ranks:
        step = ctx.step_us(r)
        if bound.get(id(r), np.inf) < FIRST_AG_EXPOSED * step:
            continue
        ag = ctx.gathers(r)
        forward = np.flatnonzero(ag["phase"] == Phase.FORWARD)
        if forward.size == 0:
            continue
        first = forward[per_step_rows(ag["step"][forward], ag["start_us"][forward], True)]
        block = ag["block"]
        nbytes = ag["bytes"].astype(np.float64)
        exposed = iv.median(ag["exposed_net_us"][first])
        block_bytes = iv.median(nbytes[forward[np.isin(block[forward], list(blocks))]])
        unit_bytes = iv.median(nbytes[first])
        unit = str(iv.mode(block[first].astype(str)))
        big_root = unit == ROOT and unit_bytes >= ROOT_SIZE_RATIO * block_bytes
        if (
            exposed >= FIRST_AG_EXPOSED * step
            and big_root
            and (worst is None or exposed > worst[1])
        ):
            matched = bool(ag["matched"][first].all())
            worst = (r.rank, exposed, step, unit_bytes, block_bytes, matched)
    if worst is None:
        return None
    rank, exposed, step, unit_bytes, block_bytes, matched = worst
    separate = ctx.knob is not None and ctx.knob.shard_embeddings
    if separate:
        change = Change(
            "the embeddings and head already are their own units: give the largest modules "
            "left in the root their own fully_shard, so the first gather is small",
            code="fully_shard(model.<largest root module>)",
        )
    else:
        change = Change(
            "shard the embeddings and the norm+output head as their own units, so the first "
            "gather is small and the head's is prefetched",
            cli="--shard-embeddings",
            code="fully_shard(model.tok_embeddings); fully_shard([model.norm, model.output]); "
            "fully_shard(model)",
        )
    return Finding(
        "first-allgather-exposed",
        "First forward all-gather exposed",
        cause=f"the root unit holds {unit_bytes / 1e6:.0f} MB ({unit_bytes / block_bytes:.1f}x a "
        "block's), so the step's first gather, which nothing can hide, is long",
        evidence=f"rank {rank}: the step's first all-gather (the root unit, "
        f"{unit_bytes / 1e6:.0f} MB) is exposed for {ms(exposed)} per step ({pct(exposed / step)} "
        f"of the step, {_net(matched)}; threshold {pct(FIRST_AG_EXPOSED)})",
        why="nothing can hide the first gather of a step; one is expected, but a root unit that "
        "carries the embeddings and the output head makes it several blocks long",
        change=change,
        cost_us=exposed,
        step_us=step,
        ranks=[rank],
        blocks=[ROOT],
        metrics={"rank": rank, "exposed_us": exposed, "bytes": unit_bytes},
    )


def _net(matched: bool) -> str:
    return (
        "cross-rank transfer time, waiting for peers excluded"
        if matched
        else "its duration: no cross-rank match, so it may include waiting for peers"
    )


@rule(
    "last-unit-regathered",
    "Last unit re-gathered at the start of backward",
    "backward's first gather is forward's last unit, its transfer ≥ 0.2 % of the step",
    communication=True,
)
def last_unit_regathered(ctx: Context) -> Finding | None:
    """The last block of forward is all-gathered again right at the start of backward."""
    worst = None
    blocks = list(ctx.block_units())
    for r in ctx.analysis.ranks:  # CPU (gloo) traces show it too
        if r.collectives.empty or r.steps.empty:
            continue
        ag = ctx.gathers(r)
        block, phase = ag["block"], ag["phase"]
        step_of, start = ag["step"], ag["start_us"]
        of_block = np.isin(block, blocks)
        fwd = np.flatnonzero(of_block & (phase == Phase.FORWARD))
        bwd = np.flatnonzero(of_block & (phase == Phase.BACKWARD))
        if fwd.size == 0 or bwd.size == 0:
            continue
        last_fwd = fwd[per_step_rows(step_of[fwd], start[fwd], first=False)]
        first_bwd = bwd[per_step_rows(step_of[bwd], start[bwd], first=True)]
        steps = np.intersect1d(step_of[first_bwd], step_of[last_fwd], assume_unique=True)
        last_fwd = last_fwd[np.isin(step_of[last_fwd], steps)]  # both by step ascending
        first_bwd = first_bwd[np.isin(step_of[first_bwd], steps)]
        same = first_bwd[block[first_bwd] == block[last_fwd]]
        if same.size < max(1, steps.size // 2):
            continue
        transfer = iv.median(ag["net_us"][same])
        exposed_net = ag["exposed_net_us"][same]
        exposed = iv.median(np.where(np.isnan(exposed_net), 0.0, exposed_net))  # gloo: no overlap
        step = ctx.step_us(r)
        if transfer >= REGATHER_MIN * step and (worst is None or transfer > worst[3]):
            matched = bool(ag["matched"][same].all())
            worst = (r.rank, str(block[same[0]]), exposed, transfer, step, matched)
    if worst is None:
        return None
    rank, unit, exposed, transfer, step, matched = worst
    already = ctx.knob is not None and ctx.knob.keep_last_unsharded
    text = (
        f"`--keep-last-unsharded` is set, yet {unit} is gathered again: keep the unit forward "
        "runs last unsharded"
        if already
        else f"keep the last unit ({unit}) unsharded after forward, as torchtitan does"
    )
    return Finding(
        "last-unit-regathered",
        "Last unit re-gathered at the start of backward",
        cause=f"{unit}, the last unit of forward, reshards after forward although backward "
        "needs it at once",
        evidence=f"rank {rank}: {unit} is all-gathered again as the first gather of backward: "
        f"{ms(transfer)} per step ({pct(transfer / step)} of the step; {_net(matched)}; "
        f"threshold {pct(REGATHER_MIN)}), {ms(exposed)} of it exposed",
        why="backward needs the last unit at once, so resharding it after forward frees its "
        "memory only for a moment and costs a gather (link time, and SMs and memory bandwidth "
        "taken from compute while it runs)",
        change=Change(
            text,
            cli="" if already else "--keep-last-unsharded",
            code=f'fully_shard(model.get_submodule("{unit}"), reshard_after_forward=False)',
        ),
        cost_us=exposed,
        step_us=step,
        ranks=[rank],
        blocks=[unit],
        metrics={"rank": rank, "unit": unit, "exposed_us": exposed, "transfer_us": transfer},
    )


@rule(
    "reduction-tail",
    "Gradient-reduction tail exposed at the end of backward",
    "reduce-scatters (and HSDP all-reduces) after the last backward kernel expose ≥ 2 % of "
    "the step (waiting excluded)",
    communication=True,
)
def reduction_tail(ctx: Context) -> Finding | None:
    """Gradient reductions still running after the last backward compute: every reduce-scatter
    and, under HSDP, the all-reduce across replicas. About one is unavoidable."""
    worst = None
    # A rank's median step tail is at most all its reductions' exposed time: ranks whose
    # total is under the threshold are skipped unread (one pass over the run).
    bound = ctx.run_collectives.rank_bound("exposed_net_us", total=True, collective=_REDUCTIONS)
    for r in ctx.gpu_ranks:
        if not r.n_kernels or r.collectives.empty:
            continue
        step = ctx.step_us(r)
        if bound.get(id(r), np.inf) < TAIL_EXPOSED * step:
            continue
        column = partial(ctx.column, r)
        in_tail, row = _tail(column, r)
        # Per step with backward compute, its tail's exposed time (0 for none), as
        # `groupby("step").sum()` adds them.
        per = iv.group_sum(
            np.where(in_tail, row, -1), column("exposed_net_us"), len(r.backward_end)
        )
        exposed = iv.median(per)
        if exposed >= TAIL_EXPOSED * step and (worst is None or exposed > worst[1]):
            worst = (r, exposed, step, in_tail)
    if worst is None:
        return None
    r, exposed, step, in_tail = worst
    tail = ctx.collectives(r)[in_tail]
    rank, last_compute = r.rank, backward_end(r)
    count = float(tail.groupby("step").size().reindex(last_compute.index, fill_value=0).median())
    units = ", ".join(dict.fromkeys(tail["block"].astype(str)))
    by_type = tail.groupby("collective")["exposed_net_us"].sum() / max(len(last_compute), 1)
    all_reduce = float(by_type.get(Collective.ALL_REDUCE, 0.0))
    raw = float(tail.groupby("step")["exposed_us"].sum().reindex(last_compute.index).median())
    knobs, cli = [], []
    if not (ctx.knob is not None and ctx.knob.shard_embeddings):
        knobs.append(
            "shard the embeddings and head as their own units so the last gradient to reduce is "
            "one small unit's"
        )
        cli.append("--shard-embeddings")
    dtype = str(ctx.config.reduce_dtype.value or "")
    if dtype not in ("bf16", "bfloat16", "BFloat16"):
        knobs.append("reduce in bf16: half the bytes")
        cli.append("--reduce-dtype bf16")
    hsdp = ""
    mesh = ctx.config.mesh.value
    kind = mesh.kind if mesh is not None else MeshKind.UNKNOWN
    if all_reduce > 0 and kind == MeshKind.HSDP:
        hsdp = f"; {ms(all_reduce)} of it is HSDP's all-reduce across the {mesh.replicate} replicas"
    elif all_reduce > 0 and kind == MeshKind.DDP:
        hsdp = f"; {ms(all_reduce)} of it is DDP's gradient all-reduce"
    elif all_reduce > 0:  # FSDP's own gradients are reduce-scattered: another all-reduce
        hsdp = f"; {ms(all_reduce)} of it is all-reduces (not FSDP's gradient reduction)"
    text = (
        "; ".join(knobs)
        if knobs
        else f"the knobs that shrink the tail are already set: what remains is the first unit's "
        f"gradient ({units}); keep that unit small"
    )
    return Finding(
        "reduction-tail",
        "Gradient-reduction tail exposed at the end of backward",
        cause=f"{plural(count, 'gradient reduction')} ({units}) {agree(count, 'is', 'are')} "
        "still running when backward's compute is done, and the optimizer waits for "
        f"{agree(count, 'it', 'them')}",
        evidence=f"rank {rank}: {plural(count, 'reduce-scatter/all-reduce kernel')} still "
        f"{agree(count, 'runs', 'run')} after the "
        f"last backward kernel, {ms(exposed)} exposed per step ({pct(exposed / step)}; threshold "
        f"{pct(TAIL_EXPOSED)}; {ms(raw)} before taking out waiting for peers){hsdp}",
        why="the optimizer waits for every gradient; about one reduction at the end is "
        "unavoidable, more than that (or a large one) is time the GPU only waits",
        change=Change(
            text,
            cli=" ".join(cli),
            code="fully_shard(..., mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, "
            "reduce_dtype=torch.bfloat16))"
            if "--reduce-dtype bf16" in cli
            else "fully_shard(model.tok_embeddings); fully_shard([model.norm, model.output])",
        ),
        cost_us=exposed,
        step_us=step,
        ranks=[rank],
        blocks=list(dict.fromkeys(tail["block"].astype(str))),
        metrics={
            "rank": rank,
            "exposed_us": exposed,
            "count": count,
            "raw_exposed_us": raw,
            "all_reduce_us": all_reduce,
        },
    )


_REDUCTIONS = [g.value for g in GRADIENT_REDUCTIONS]


def _tail(column: Callable[[str], np.ndarray], r: RankAnalysis) -> tuple[np.ndarray, np.ndarray]:
    """Which of the rank's collectives (`column`: a column of them) are gradient reductions
    that end after their step's last backward (or recompute) kernel, and each one's step's
    row in `r.backward_end` (-1: a step without backward compute)."""
    last = r.backward_end
    steps, step = array_of(last, "step"), column("step")
    row = np.full(step.size, -1, dtype=np.int64)
    known = np.isin(step, steps)
    if not known.any():
        return known, row
    order = np.argsort(steps, kind="stable")
    row[known] = order[np.searchsorted(steps, step[known], sorter=order)]
    last_end = np.where(known, array_of(last, "end_us", np.float64)[row], np.nan)
    reduction = np.isin(column("collective"), _REDUCTIONS)
    return reduction & known & (column("end_us") > last_end), row


@rule(
    "communication-bound",
    "Communication-bound blocks",
    "≥ 25 % of blocks gather (transfer time) ≥ 1.2× longer than the fastest rank computes "
    "them (backward compute includes recompute)",
    communication=True,
)
def communication_bound(ctx: Context) -> Finding | None:
    """A block's all-gather takes longer than the compute it could hide behind.

    Both sides without interference: the gather is the cross-rank transfer time (no waiting),
    the compute the fastest rank's (a rank whose NCCL kernels spin while they wait for a late
    peer computes measurably slower beside them). Backward compute includes the unit's
    recomputation under activation checkpointing: that is compute a gather hides behind."""
    transfer = None
    if not ctx.crossrank.empty:
        m = ctx.crossrank.matched
        transfer = (
            m[m["collective"] == Collective.ALL_GATHER]
            .groupby(["block", "phase"])["transfer_us"]
            .median()
        )
    transfer_of = {} if transfer is None else transfer.to_dict()  # (block, phase) → µs
    rows = []
    blocks = list(ctx.block_units())
    columns = [
        "block",
        "phase",
        "time_us_per_step",
        "count_per_step",
        "compute_us_per_step",
        "recompute_us_per_step",
    ]
    for r in ctx.gpu_ranks:
        b = r.blocks
        keep = (
            (array_of(b, "collective") == Collective.ALL_GATHER)
            & np.isin(array_of(b, "block"), blocks)
            & np.isin(array_of(b, "phase"), [Phase.FORWARD.value, Phase.BACKWARD.value])
        )
        picked = [array_of(b, name)[keep].tolist() for name in columns]
        for block, phase, time_us, count, compute, recompute_us in zip(*picked, strict=True):
            gather = transfer_of.get((block, phase), time_us / max(count, 1))
            if phase == Phase.BACKWARD and np.isfinite(recompute_us):
                compute += recompute_us
            rows.append((r.rank, block, phase, gather, compute))
    if not rows:
        return None
    table = pd.DataFrame(rows, columns=["rank", "block", "phase", "gather", "compute"])
    per_unit = table.groupby(["block", "phase"]).agg(
        gather=("gather", "median"), compute=("compute", "min")
    )
    ratio = per_unit["gather"] / per_unit["compute"]
    bound = per_unit[ratio >= COMM_BOUND_RATIO]
    units = per_unit.index.get_level_values("block").nunique()
    bound_units = bound.index.get_level_values("block").nunique()
    if units == 0 or bound_units / units < COMM_BOUND_SHARE:
        return None
    worst = (bound["gather"] - bound["compute"]).idxmax()
    g, c = bound.loc[worst, "gather"], bound.loc[worst, "compute"]
    excess = float((bound["gather"] - bound["compute"]).sum())
    step = ctx.median_step_us()
    # What it costs: the bound blocks' exposed gather time (measured), at most the excess no
    # prefetch can hide (what more compute per gather would buy).
    bound_names = set(bound.index.get_level_values("block"))
    exposed = []
    for r in ctx.gpu_ranks:
        ag = ctx.gathers(r)
        bound_rows = np.isin(ag["block"], list(bound_names))
        exposed.append(iv.total(ag["exposed_net_us"][bound_rows]) / max(len(r.steps), 1))
    cost = min(float(np.median(exposed)) if exposed else excess, excess)
    knobs, cli = ["a larger local batch or sequence"], ["--batch-size"]
    checkpointed = set(ctx.config.checkpointed.value or [])
    if not bound_names <= checkpointed:
        knobs.append(
            "activation checkpointing on the bound blocks (recompute gives backward gathers work "
            "to hide behind)"
        )
        cli.append("--ac-coverage")
    knobs.append("fewer and larger units")
    if any(ctx.config.reshards(b) is True for b in bound_names):
        knobs.append(
            "reshard_after_forward=False (or an int group size) to drop or shrink the backward "
            "gathers"
        )
        cli.append("--reshard-after-forward false")
    return Finding(
        "communication-bound",
        "Communication-bound blocks",
        cause=f"{bound_units} of {units} blocks move their parameters for longer than they "
        "compute, so prefetching cannot hide the difference",
        evidence=f"{bound_units} of {units} blocks gather their parameters for at least "
        f"{COMM_BOUND_RATIO:g}x as long as they compute (worst: {worst[0]} {worst[1]}, "
        f"all-gather {ms(g)} vs {ms(c)} of compute, {g / c:.1f}x; gathers are "
        + ("cross-rank transfer times" if transfer is not None else "kernel durations")
        + f", compute the fastest rank's, recompute included); {ms(excess)} per step no "
        f"prefetch can hide, {ms(cost)} of it exposed ({pct(cost / step)})",
        why="prefetching can only hide a gather behind the neighbouring block's compute; when "
        "the gather is longer, the difference is exposed on every block",
        change=Change(
            "more compute per gather: " + ", ".join(knobs),
            cli=" / ".join(cli),
            code="fully_shard(block, reshard_after_forward=False)  # or a larger batch",
        ),
        cost_us=cost,
        step_us=step,
        basis=Basis.INFERRED,
        ranks=[int(r.rank) for r in ctx.gpu_ranks],
        blocks=sorted(bound_names, key=_natural),
        metrics={
            "bound_units": bound_units,
            "units": units,
            "worst": f"{worst[0]} {worst[1]}",
            "ratio": float(g / c),
            "excess_us": excess,
        },
    )


def _natural(name: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(name))]


def _single_node(ctx: Context) -> bool | None:
    """Whether every rank runs on one host: run.json's node count, else the trace's world
    size against the GPUs its deviceProperties lists; None when neither tells."""
    if ctx.record is not None and ctx.record.world.nnodes is not None:
        return ctx.record.world.nnodes == 1
    world = ctx.config.world_size.value
    devices = max((len(r.meta.get("device_names") or []) for r in ctx.gpu_ranks), default=0)
    if world and devices:
        return world <= devices
    return None


def _gpus_per_node(ctx: Context) -> int | None:
    if ctx.record is not None and ctx.record.world.local_world_size:
        return ctx.record.world.local_world_size
    return None


@rule(
    "low-bus-bandwidth",
    "Bus bandwidth far below the interconnect",
    "busbw of ≥ 8 MB all-gathers/reduce-scatters below 25 % of the reference curve at their "
    "size and group size (diagnose/data/busbw.csv: NVLink, measured on 2× H200); where it has "
    "none, below 50 GB/s on NVLink (20 mixed, 5 PCIe, 10 unknown); a known SXM GPU counts as "
    "NVLink only when every rank is on one node",
    communication=True,
)
def low_bus_bandwidth(ctx: Context) -> Finding | None:
    """Large all-gathers and reduce-scatters (the shard group's; HSDP's all-reduce across
    nodes is another link) reach far less bus bandwidth than the interconnect gives: compared
    message by message with what a healthy link of the kind measured at the same size (the
    reference table), else with one floor per kind of link."""
    topology = ctx.record.environment.topology if ctx.record is not None else None
    assumed = ""
    if topology is None:
        names = sorted({n for r in ctx.gpu_ranks for n in r.meta.get("device_names") or []})
        if names and all(NVLINK_PARTS.search(n) for n in names) and _single_node(ctx):
            topology = "nvlink"
            assumed = (
                f" (assumed: no topology from run.json; {', '.join(names)} only comes as an SXM "
                "module on an NVLink board, and every rank is on one node)"
            )
    floor = BUSBW_FLOOR_GBPS.get(topology, BUSBW_FLOOR_GBPS[None])
    kinds = [Collective.ALL_GATHER, Collective.REDUCE_SCATTER]
    if not ctx.crossrank.empty:
        m = ctx.crossrank.matched
        large = m[(m["bytes"] >= LARGE_MESSAGE_BYTES) & m["collective"].isin(kinds)]
        values, source = large["transfer_busbw_gbps"], "transfer-time"
        sizes = reference.group_sizes(ctx.analysis)
        groups = large["pg"].astype(str).map(sizes).astype("float64")
        groups = groups.fillna(large["n_ranks"].astype("float64"))
    else:
        # Only the columns read here: every rank's collectives at once (the client's peak).
        needed = ["collective", "bytes", "busbw_gbps", "group_size"]
        frames = [r.collectives[needed] for r in ctx.gpu_ranks if not r.collectives.empty]
        if not frames:
            return None
        c = pd.concat(frames)
        large = c[(c["bytes"] >= LARGE_MESSAGE_BYTES) & c["collective"].isin(kinds)]
        values, source = large["busbw_gbps"], "kernel-duration"
        groups = large["group_size"]
    values = pd.to_numeric(values, errors="coerce")
    keep = values.notna().to_numpy()
    large, values, groups = large[keep], values[keep], groups[keep]
    if len(values) < 3:
        return None
    expected, curves = reference.expected(
        reference.reference(), topology, large["collective"].astype(str), groups, large["bytes"]
    )
    compared = np.isfinite(expected)
    if topology is not None and compared.sum() >= 3:
        # message by message against the reference curve at its size
        measured = values.to_numpy(dtype=np.float64)[compared]
        ratio = float(np.median(measured / expected[compared]))
        busbw = float(np.median(measured))
        healthy = float(np.median(expected[compared]))
        floor = BUSBW_FLOOR_SHARE * healthy
        if ratio >= BUSBW_FLOOR_SHARE:
            return None
        provisional = any(c.provisional for c in curves)
        curve_note = "; ".join(c.describe() for c in curves) + (
            ": not measured at this group size yet" if provisional else ""
        )
        expectation = (
            f"{pct(ratio)} of what a healthy {_link_name(topology)} measured at the same sizes "
            f"(a median {healthy:.0f} GB/s; reference curves: {curve_note}), where at least "
            f"{pct(BUSBW_FLOOR_SHARE)} ({floor:.0f} GB/s) is expected"
        )
        compared_n = int(compared.sum())
    else:
        busbw = float(values.median())
        if busbw >= floor:
            return None
        healthy = BUSBW_HEALTHY_GBPS.get(topology)
        ratio = busbw / (healthy if healthy is not None else floor)
        provisional = False
        expectation = f"at least {floor:.0f} GB/s is expected" + (
            f" (a healthy link gives about {healthy:.0f} at these sizes)" if healthy else ""
        )
        compared_n = 0
    link = _link_name(topology)
    exposed = []
    for r in ctx.gpu_ranks:
        c = ctx.collectives(r)
        c = c[c["collective"].isin(kinds)]
        exposed.append(float(c["exposed_net_us"].sum()) / max(len(r.steps), 1))
    exposed_us = float(np.max(exposed)) if exposed else 0.0
    cost = exposed_us * max(0.0, 1.0 - ratio)
    env = ctx.env_vars()
    hints = [
        f"{k}={v}"
        for k, v in env.items()
        if k in ("NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE")
    ]
    return Finding(
        "low-bus-bandwidth",
        "Bus bandwidth far below the interconnect",
        cause=f"collectives move data at {busbw:.0f} GB/s on {link}, far below what it gives: "
        "every gather and reduction takes several times longer than it should"
        + (f" ({', '.join(hints)} is set)" if hints else ""),
        evidence=f"large all-gathers/reduce-scatters (>= {LARGE_MESSAGE_BYTES / 1e6:.0f} MB) reach "
        f"a median busbw of {busbw:.0f} GB/s ({source}) on {link}{assumed}: {expectation}"
        + f"; {ms(exposed_us)} of their transfer per step is exposed",
        why="every exposed microsecond of communication scales with 1/bandwidth; NVLink gives "
        "hundreds of GB/s, PCIe-only pairs about 20 and reach 30–40 % scaling efficiency, not "
        "70 %+",
        change=Change(
            "check the topology (`nvidia-smi topo -m`) and NCCL's transport (NCCL_DEBUG=INFO: "
            "P2P/NVLink vs SHM/NET), unset NCCL_P2P_DISABLE / NCCL_P2P_LEVEL limits, merge small "
            "units into larger messages",
            code=("unset " + " ".join(h.split("=")[0] for h in hints)) if hints else "",
        ),
        cost_us=cost,
        step_us=ctx.median_step_us(),
        basis=Basis.INFERRED,
        ranks=[int(r.rank) for r in ctx.gpu_ranks],
        metrics={
            "busbw_gbps": busbw,
            "floor_gbps": floor,
            "expected_gbps": healthy,
            "ratio": ratio,
            "compared": compared_n,
            "provisional": provisional,
            "topology": topology,
            "assumed": bool(assumed),
            "exposed_us": exposed_us,
        },
    )


def _link_name(topology: str | None) -> str:
    return {"nvlink": "NVLink", "pcie": "PCIe", "mixed": "mixed NVLink/PCIe"}.get(
        topology, "an unknown link"
    )


@rule(
    "shard-group-crosses-nodes",
    "Shard group spans several nodes",
    "the all-gather/reduce-scatter group has more ranks than a node has GPUs",
    needs="run.json (GPUs per node)",
    communication=True,
)
def shard_group_crosses_nodes(ctx: Context) -> Finding | None:
    """Every block's gathers and reductions cross the network when the shard group is
    larger than a node: HSDP keeps them inside the NVLink domain."""
    per_node = _gpus_per_node(ctx)
    mesh = ctx.config.mesh.value
    if not per_node or not mesh.shard or mesh.shard <= per_node or not ctx.gpu_ranks:
        return None
    exposed = []
    blocks = ctx.block_units()
    for r in ctx.gpu_ranks:
        c = ctx.collectives(r)
        c = c[
            c["collective"].isin([Collective.ALL_GATHER, Collective.REDUCE_SCATTER])
            & c["block"].isin(blocks)
        ]
        exposed.append(float(c["exposed_net_us"].sum()) / max(len(r.steps), 1))
    cost = float(np.max(exposed)) if exposed else 0.0
    world = int(ctx.config.world_size.value or mesh.shard * (mesh.replicate or 1))
    replicas = max(world // per_node, 2)
    return Finding(
        "shard-group-crosses-nodes",
        "Shard group spans several nodes",
        cause=f"parameters are sharded over {mesh.shard} ranks, more than the {per_node} GPUs "
        "of a node: every block's gathers and reductions cross the network",
        evidence=f"{mesh.describe()}; {per_node} GPUs per node (run.json); the blocks' "
        f"all-gathers and reduce-scatters expose {ms(cost)} per step",
        why="a node's NVLink gives ~10x the bandwidth of the network between nodes; with "
        "HSDP the per-block traffic stays inside a node and only one all-reduce per unit "
        "crosses nodes",
        change=Change(
            f"hybrid sharding: {replicas} replicas of {world // replicas}-rank shard groups",
            cli=f"--hsdp {replicas}",
            code=f'mesh = init_device_mesh("cuda", ({replicas}, {world // replicas}), '
            'mesh_dim_names=("replicate", "shard")); fully_shard(block, mesh=mesh)',
        ),
        cost_us=cost,
        step_us=ctx.median_step_us(),
        ranks=[int(r.rank) for r in ctx.gpu_ranks],
        metrics={"shard": mesh.shard, "gpus_per_node": per_node, "exposed_us": cost},
    )


def block_order(ctx: Context) -> list[str]:
    """The units in forward order (blocks first-to-last), for rules that need neighbours."""
    order = [u.name for u in ctx.config.units if u.name not in NON_BLOCK_UNITS]
    return order
