"""Rules about the set-up itself (fsdp_trace.analysis.rank.setup): FSDP2 with the root as its only
unit, CPU offload, float8 without torch.compile, DDP's gradient all-reduce, HSDP's all-reduce
across replicas, and FSDP1. Each names the set-up, costs what it measurably adds to the step,
and says what to change in the user's own code (fsdp-trace's capture never makes these)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fsdp_trace.analysis.classify import DTYPE_BYTES
from fsdp_trace.analysis.intervals import median
from fsdp_trace.analysis.table import array_of
from fsdp_trace.diagnose.context import Context, ms, pct
from fsdp_trace.diagnose.finding import Change, Finding, FindingKind
from fsdp_trace.diagnose.registry import rule
from fsdp_trace.fmt import plural
from fsdp_trace.vocab import ROOT, Basis, Collective, MeshKind, Parallelism, Phase

# Bytes per parameter FSDP2 holds on the GPU without offload, per shard: the fp32 parameter,
# its gradient and AdamW's two moments.
RESIDENT_BYTES_PER_PARAM = 16
# A set-up finding is a cause only where it adds at least this share of the step.
SETUP_COST = 0.01


def _exposed(ctx: Context, r, mask) -> float:
    """Exposed time per step (waiting for peers excluded) of the rank's collectives in
    `mask`: the median over its steps (steps without any count 0)."""
    c = ctx.collectives(r)
    c = c[mask(c)]
    steps = array_of(r.steps, "step")
    if steps.size == 0:
        return 0.0
    per = c.groupby("step")["exposed_net_us"].sum().reindex(steps, fill_value=0.0)
    return float(np.median(per.fillna(0.0).to_numpy(dtype=np.float64)))


def _worst(ctx: Context, cost) -> tuple | None:
    """(rank, cost µs, its median step) of the rank where `cost(rank)` is largest."""
    best = None
    for r in ctx.gpu_ranks:
        value = cost(r)
        if np.isfinite(value) and (best is None or value > best[1]):
            best = (r, value, ctx.step_us(r))
    return best


def _exposure(ctx: Context, mask) -> tuple | None:
    """The rank whose collectives in `mask` expose the most per step: (rank, exposed µs,
    its median step, those collectives, their transfer per step); None below `SETUP_COST`."""
    worst = _worst(ctx, lambda r: _exposed(ctx, r, mask))
    if worst is None or worst[1] < SETUP_COST * worst[2]:
        return None
    r, cost, step = worst
    c = ctx.collectives(r)
    rows = c[mask(c)]
    return r, cost, step, rows, float(rows["net_us"].sum()) / max(len(r.steps), 1)


def _parameters(ctx: Context) -> float | None:
    """Parameters of the model (elements), from one rank's forward all-gathers of one step:
    each unit is gathered once in forward, whole (NaN-free bytes and a known dtype)."""
    for r in ctx.gpu_ranks:
        c = r.collectives
        ag = c[(c["collective"] == Collective.ALL_GATHER) & (c["phase"] == Phase.FORWARD)]
        if ag.empty:
            continue
        size = ag["dtype"].astype(object).map(DTYPE_BYTES).astype("float64")
        elements = (ag["bytes"].astype("float64") / size).groupby(ag["step"]).sum()
        if len(elements) and np.isfinite(elements.median()):
            return float(elements.median())
    return None


@rule(
    "one-unit",
    "One FSDP unit: the whole model is gathered at once",
    "FSDP2 on ≥ 2 ranks whose only unit is the root (fully_shard(model) without per-block "
    "calls), its communication exposed ≥ 1 % of the step",
    communication=True,
)
def one_unit(ctx: Context) -> Finding | None:
    """`fully_shard(model)` alone: one unit, gathered whole at the start of forward (and of
    backward), reduced whole at its end; nothing runs beside it to hide it."""
    config = ctx.config
    if config.parallelism != Parallelism.FSDP2 or [u.name for u in config.units] != [ROOT]:
        return None
    if (config.world_size.value or 1) < 2:
        return None

    def root(c: pd.DataFrame) -> pd.Series:
        return c["collective"].isin([Collective.ALL_GATHER, Collective.REDUCE_SCATTER]) & (
            c["block"] == ROOT
        )

    worst = _worst(ctx, lambda r: _exposed(ctx, r, root))
    if worst is None and not ctx.analysis.gpu and ctx.analysis.ranks:
        # a CPU (gloo) trace: structural, not costed (the diagnosis marks it so)
        first = ctx.analysis.ranks[0]
        worst = (first, 0.0, float(first.steps["step_us"].median() or 0.0))
    elif worst is None or worst[1] < SETUP_COST * worst[2]:
        return None
    r, cost, step = worst
    c = ctx.collectives(r)
    gathers = c[(c["collective"] == Collective.ALL_GATHER) & (c["block"] == ROOT)]
    nbytes = median(array_of(gathers, "bytes"))  # NaN: none, or no sizes (gloo)
    per_step = len(gathers) / max(len(r.steps), 1)
    size = f"{nbytes / 1e9:.2f} GB" if np.isfinite(nbytes) else "all of its parameters"
    return Finding(
        "one-unit",
        "One FSDP unit: the whole model is gathered at once",
        cause="fully_shard was applied to the model alone, so FSDP2 has one unit: every "
        "parameter is gathered before any compute can start and every gradient reduced after "
        "the last; nothing is left to overlap them with",
        evidence=f"rank {r.rank}: the only unit is the root; it all-gathers {size} "
        f"{plural(per_step, 'time')} per step and its gathers and reduce-scatters are exposed "
        f"{ms(cost)} per step ({pct(cost / step) if step else 'not timed'}, waiting for peers "
        "excluded; what per-block units save is at most that: they still expose the first "
        "gather and the last reduce-scatter, and add copies and launches of their own); the whole "
        f"model ({size} in the compute dtype) is unsharded at once on every rank, where one "
        "unit per block holds only the blocks being computed and prefetched",
        why="FSDP overlaps a unit's gather with the previous unit's compute: with a single unit "
        "there is no previous unit, and the peak memory is that of an unsharded model",
        change=Change(
            "fully_shard each transformer block first, then the root, so each block's gather "
            "hides behind its neighbour's compute",
            code="for block in model.layers: fully_shard(block)\nfully_shard(model)",
        ),
        cost_us=cost,
        step_us=step,
        ranks=[int(r.rank)],
        blocks=[ROOT],
        metrics={"exposed_us": cost, "bytes": nbytes, "gathers_per_step": per_step},
    )


@rule(
    "cpu-offload",
    "CPU offload: the optimizer step runs on the host",
    "FSDP2 CPUOffloadPolicy (pinned copies both ways, an optimizer step with no GPU work): "
    "the GPU idles in the optimizer step and waits for copies ≥ 1 % of the step",
)
def cpu_offload(ctx: Context) -> Finding | None:
    """CPUOffloadPolicy keeps parameters, gradients and optimizer states in host memory: the
    optimizer step runs on the CPU while the GPU idles, and every unit's shard crosses PCIe
    to the GPU before its gather and its gradient back after its reduction."""
    if not ctx.config.setup.value.cpu_offload:
        return None

    def cost(r) -> float:
        s = r.signals
        return s.optimizer_idle_us + s.offload_copies_exposed_us

    worst = _worst(ctx, cost)
    if worst is None or worst[1] < SETUP_COST * worst[2]:
        return None
    r, total, step = worst
    s = r.signals
    params = _parameters(ctx)
    world = int(ctx.config.world_size.value or len(ctx.gpu_ranks) or 1)
    memory = ""
    if params:
        resident = params / world * RESIDENT_BYTES_PER_PARAM / 2**30
        memory = (
            f"; without offload each GPU holds about {resident:.1f} GiB more ({params / 1e9:.2f} "
            f"B parameters ÷ {world} ranks × {RESIDENT_BYTES_PER_PARAM} bytes: fp32 parameter, "
            "gradient and AdamW's two moments)"
        )
    peak = ctx.record.figures.peak_memory_gib if ctx.record is not None else None
    if peak is not None:
        memory += f"; its peak today is {peak:.1f} GiB per GPU (run.json)"
    return Finding(
        "cpu-offload",
        "CPU offload: the optimizer step runs on the host",
        cause="FSDP2's CPUOffloadPolicy keeps parameters, gradients and optimizer states in host "
        "memory: the optimizer step runs on the CPU while the GPU waits, and shards cross PCIe "
        "both ways every step",
        evidence=f"rank {r.rank}: the optimizer step takes {ms(s.optimizer_cpu_us)} on the host "
        f"with {ms(s.optimizer_gpu_us)} of GPU work, the GPU idle {ms(s.optimizer_idle_us)} of "
        f"it; pinned copies {ms(s.h2d_pinned_us)} to the GPU and {ms(s.d2h_pinned_us)} back "
        f"per step, {ms(s.offload_copies_exposed_us)} of them with no compute beside them "
        f"(median per step){memory}",
        why="offload trades step time for GPU memory: an AdamW step over the host's copy of "
        "every shard is CPU-bound, and nothing else runs on the GPU meanwhile",
        change=Change(
            "drop the offload where the memory allows (fewer ranks' worth of shards per GPU is "
            "what offload saves); if it does not fit, activation checkpointing or a smaller "
            "batch frees memory at less cost than a host optimizer step",
            code="fully_shard(block)  # without offload_policy=CPUOffloadPolicy()",
        ),
        cost_us=total,
        step_us=step,
        ranks=[int(r.rank)],
        metrics={
            "optimizer_cpu_us": s.optimizer_cpu_us,
            "optimizer_idle_us": s.optimizer_idle_us,
            "copies_exposed_us": s.offload_copies_exposed_us,
            "parameters": params,
        },
    )


@rule(
    "float8-uncompiled",
    "float8 training without torch.compile",
    "float8 GEMMs (aten::_scaled_mm) in a run without compiled regions, their cast and amax "
    "kernels (and the launches they add) and exposed amax all-reduces ≥ 1 % of the step",
)
def float8_uncompiled(ctx: Context) -> Finding | None:
    """torchao's float8 linears cast every weight, activation and gradient to float8 with its
    amax in eager mode as a dozen small kernels each; torch.compile fuses them. Uncompiled,
    the casts cost GPU time and, worse, launches: the host falls behind."""
    setup = ctx.config.setup.value
    if not setup.float8 or ctx.config.compiled.value:
        return None

    def amax(r) -> pd.DataFrame:
        """The amax all-reduces (scalars) float8's dynamic scaling syncs across ranks."""
        c = ctx.collectives(r)
        return c[(c["collective"] == Collective.ALL_REDUCE) & (c["bytes"] <= AMAX_BYTES)]

    def amax_exposed(r) -> float:
        a = amax(r)
        return float(a["exposed_transfer_us"].fillna(0.0).sum()) / max(len(r.steps), 1)

    def cost(r) -> float:
        s = r.signals
        idle = ctx.part(r, "idle_us")
        per_step = r.n_compute / max(len(r.steps), 1)
        share = min(1.0, s.float8_cast_kernels / per_step) if per_step else 0.0
        return s.float8_cast_us + (share * idle if np.isfinite(idle) else 0.0) + amax_exposed(r)

    worst = _worst(ctx, cost)
    if worst is None or worst[1] < SETUP_COST * worst[2]:
        return None
    r, total, step = worst
    s = r.signals
    per_step = r.n_compute / max(len(r.steps), 1)
    share = min(1.0, s.float8_cast_kernels / per_step) if per_step else 0.0
    idle = ctx.part(r, "idle_us")
    n_steps = max(len(r.steps), 1)
    c = ctx.collectives(r)
    gathers = c[(c["collective"] == Collective.ALL_GATHER) & (c["dtype"].astype(str) == "Byte")]
    gathered = (
        f"; {len(gathers) / n_steps:.0f} float8 all-gathers per step "
        f"({median(array_of(gathers, 'bytes')) / 1e6:.1f} MB each: one byte a parameter, half of "
        "bf16's)"
        if len(gathers)
        else ""
    )
    reduces = len(amax(r)) / n_steps
    synced_us = amax_exposed(r)
    synced = (
        f"; {reduces:.0f} amax all-reduces per step (scalars, one per float8 tensor scaled), "
        f"{ms(synced_us)} of them exposed"
        if reduces
        else ""
    )
    return Finding(
        "float8-uncompiled",
        "float8 training without torch.compile",
        cause="float8 linears run eagerly: each casts its weight, input and gradient to float8 "
        "with an amax as separate small kernels, which cost GPU time and, launched one by one, "
        "keep the host from feeding the GPU",
        evidence=f"rank {r.rank}: {s.float8_gemms:.0f} float8 GEMMs and "
        f"{s.float8_cast_kernels:.0f} cast/amax kernels per step ({pct(share)} of its "
        f"{per_step:.0f} compute kernels), {ms(s.float8_cast_us)} of GPU time per step; the GPU "
        f"idles {ms(idle)} per step waiting for launches, {pct(share)} of which (their share of "
        f"the launches) is {ms(share * idle if np.isfinite(idle) else 0.0)}{synced}{gathered}; "
        "no compiled regions",
        why="float8 pays off only when the casts are fused into the neighbouring kernels "
        "(torchao's float8 training recipe assumes torch.compile); eager, it is usually slower "
        "than bf16",
        change=Change(
            "torch.compile the model (or each block) so the casts fuse; without compile, train "
            "in bf16",
            cli="--compile",
            code="model = torch.compile(model)  # after convert_to_float8_training",
        ),
        cost_us=total,
        step_us=step,
        basis=Basis.INFERRED,
        ranks=[int(r.rank)],
        metrics={
            "cast_us": s.float8_cast_us,
            "cast_kernels": s.float8_cast_kernels,
            "launch_share": share,
            "amax_allreduces_per_step": reduces,
            "amax_exposed_us": synced_us,
        },
    )


AMAX_BYTES = 64  # an all-reduce this small is a scalar: float8's amax sync, not gradients


@rule(
    "ddp-allreduce",
    "DDP: gradient all-reduce exposed",
    "a DDP run's bucket all-reduces are exposed (no compute beside them, waiting excluded) "
    "≥ 1 % of the step",
    communication=True,
)
def ddp_allreduce(ctx: Context) -> Finding | None:
    """DistributedDataParallel all-reduces gradients in buckets as backward produces them;
    the last buckets (the first layers' gradients) finish after backward's compute."""
    if ctx.config.parallelism != Parallelism.DDP:
        return None

    def reduce(c: pd.DataFrame) -> pd.Series:
        return c["collective"] == Collective.ALL_REDUCE

    found = _exposure(ctx, reduce)
    if found is None:
        return None
    r, cost, step, ar, transfer = found
    buckets = len(ar) / max(len(r.steps), 1)
    mb = median(array_of(ar, "bytes")) / 1e6
    return Finding(
        "ddp-allreduce",
        "DDP: gradient all-reduce exposed",
        cause="DDP all-reduces every gradient bucket across the ranks; the buckets reduced after "
        "backward's compute has ended have nothing to hide behind",
        evidence=f"rank {r.rank}: {buckets:.0f} bucket all-reduces per step (median "
        f"{mb:.0f} MB), {ms(transfer)} of transfer per step, {ms(cost)} of it exposed "
        f"({pct(cost / step)}, waiting for peers excluded)",
        why="DDP starts a bucket's all-reduce once all its gradients are ready; the last "
        "bucket holds the first layers' gradients, ready only when backward ends",
        change=Change(
            "smaller buckets so the last one is short (bucket_cap_mb, 25 MB by default), "
            "gradient_as_bucket_view=True to drop the bucket copies; for a model that does not "
            "fit replicated, FSDP2 (fully_shard per block) overlaps its reductions block by "
            "block",
            code="DistributedDataParallel(model, bucket_cap_mb=10, gradient_as_bucket_view=True)",
        ),
        cost_us=cost,
        step_us=step,
        ranks=[int(r.rank)],
        metrics={"exposed_us": cost, "buckets_per_step": buckets, "transfer_us": transfer},
    )


@rule(
    "hsdp-allreduce",
    "HSDP: the all-reduce across replicas exposed",
    "HSDP's gradient all-reduce on the replicate group is exposed ≥ 1 % of the step "
    "(waiting excluded)",
    communication=True,
)
def hsdp_allreduce(ctx: Context) -> Finding | None:
    """Under HSDP each unit's reduced gradient shard is all-reduced across the replicas (a
    second collective per unit, often across nodes): the last units' finish after backward."""
    mesh = ctx.config.mesh.value
    if mesh.kind != MeshKind.HSDP:
        return None

    def replicate(c: pd.DataFrame) -> pd.Series:
        return (c["collective"] == Collective.ALL_REDUCE) & (c["phase"] == Phase.BACKWARD)

    found = _exposure(ctx, replicate)
    if found is None:
        return None
    r, cost, step, ar, transfer = found
    n_steps = max(len(r.steps), 1)
    dtype = str(ctx.config.reduce_dtype.value or "")
    bf16 = dtype in ("bf16", "BFloat16")
    knobs = [] if bf16 else ["reduce in bf16 (half the bytes across replicas)"]
    knobs.append(
        "with gradient accumulation, all-reduce on the last micro-batch only "
        "(set_requires_all_reduce(False) before the others)"
    )
    return Finding(
        "hsdp-allreduce",
        "HSDP: the all-reduce across replicas exposed",
        cause=f"{mesh.describe()}: each unit's gradient shard is all-reduced across the "
        f"{mesh.replicate} replicas after its reduce-scatter, and the last ones run after "
        "backward's compute",
        evidence=f"rank {r.rank}: {len(ar) / n_steps:.0f} all-reduces per step on the "
        f"replicate group ({mesh.replicate_group or 'replicate'}), {ms(transfer)} of transfer "
        f"per step, {ms(cost)} exposed ({pct(cost / step)}, waiting for peers excluded)",
        why="the replicate group is often the slow link (across nodes); its all-reduce moves "
        "2(R−1)/R of the shard's gradient bytes and waits for the reduce-scatter before it",
        change=Change(
            "; ".join(knobs),
            cli="" if bf16 else "--reduce-dtype bf16",
            code="MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)",
        ),
        cost_us=cost,
        step_us=step,
        ranks=[int(r.rank)],
        metrics={"exposed_us": cost, "all_reduce_us": cost, "transfer_us": transfer},
    )


@rule(
    "fsdp1",
    "FSDP1: the FullyShardedDataParallel class",
    "the traces carry FSDP1's labels (FullyShardedDataParallel.*) and no FSDP2 labels",
)
def fsdp1(ctx: Context) -> Finding | None:
    """FSDP1 is deprecated in favour of FSDP2 (`fully_shard`): per-parameter sharding (no
    flat-parameter copies), deterministic memory without rate limiting, and labels that name
    each unit, so its communication can be attributed block by block."""
    if ctx.config.parallelism != Parallelism.FSDP1:
        return None
    step = ctx.median_step_us()
    labels = int(np.median([r.signals.fsdp1_labels for r in ctx.analysis.ranks] or [0]))
    units = [u.name for u in ctx.config.units]
    placed = (
        f"its units told apart by the order of FSDP1's hooks ({len(units)}: root, unit 1 … "
        f"unit {len(units) - 1}), not by module"
        if len(units) > 1
        else "its collectives could not be placed in units: exposure and overlap are for the "
        "whole step, not per block"
    )
    return Finding(
        "fsdp1",
        "FSDP1: the FullyShardedDataParallel class",
        cause="the model is wrapped in FSDP1 (FullyShardedDataParallel), which PyTorch has "
        "replaced with FSDP2 (fully_shard)",
        evidence=f"{labels} FullyShardedDataParallel.* labels per trace and no FSDP:: labels; "
        f"FSDP1's labels name no module: {placed}",
        why="FSDP2 shards each parameter (no flat-parameter copies), frees memory "
        "deterministically instead of rate-limiting the CPU, overlaps the same way with less "
        "host work per unit, and its labels let every gather be attributed to its block",
        change=Change(
            "move to fully_shard: each block, then the root (auto_wrap_policy becomes a loop, "
            "MixedPrecision becomes MixedPrecisionPolicy)",
            code="for block in model.layers: fully_shard(block, mp_policy=mp)\n"
            "fully_shard(model, mp_policy=mp)",
        ),
        cost_us=0.0,
        step_us=step,
        kind=FindingKind.NOTE,
        ranks=[int(r.rank) for r in ctx.analysis.ranks if r.rank is not None],
        metrics={"labels": labels},
    )
