"""Rules about ranks that keep the others waiting: a host that cannot keep its GPU busy, a
rank that arrives last at the collectives, and the profiler's own overhead on the detailed
step."""

from __future__ import annotations

import numpy as np

from fsdp_trace.diagnose.context import Context, ms, pct
from fsdp_trace.diagnose.finding import Change, Finding, FindingKind
from fsdp_trace.diagnose.registry import rule
from fsdp_trace.vocab import Basis

HOST_IDLE = 0.20  # GPU idle share of the step
IMBALANCE = 0.25  # another rank idling under this × the worst's share: the worst's own host
STRAGGLER_SHARE = 0.6  # arrives last at this share of its matched collectives ...
STRAGGLER_WAIT = 0.10  # ... and the others wait (exposed) at least this share of the step
SLOW_COMPUTE = 1.05  # a straggler computing this much longer than the others: a slow GPU
DISTORTION = 0.25  # detailed step slower than the timing median by this much, and slower
# than every timing step (else it is within the run's own spread)


def _who(ranks: list[int]) -> str:
    """ "rank 1 waits" / "ranks 1, 2 wait"."""
    if len(ranks) == 1:
        return f"rank {ranks[0]} waits"
    return f"ranks {', '.join(map(str, ranks[:6]))}{', …' if len(ranks) > 6 else ''} wait"


def _waiting_on_others(ctx: Context, ranks: set[int]) -> tuple[float, list[int]]:
    """Median over the other ranks of their exposed waiting per step, and who they are."""
    others = [r for r in ctx.gpu_ranks if r.rank not in ranks]
    waits = [ctx.part(r, "exposed_wait_us") for r in others]
    waits = [w for w in waits if np.isfinite(w)]
    return (float(np.median(waits)) if waits else float("nan")), [int(r.rank) for r in others]


@rule("host-bound", "Host-bound: the GPU waits for the CPU", "the GPU is idle ≥ 20 % of the step")
def host_bound(ctx: Context) -> Finding | None:
    """The GPU sits idle: the CPU (Python, FSDP hooks, launches, the optimizer, data loading)
    cannot keep up. When one rank's host is the slow one, the others wait for it inside their
    NCCL kernels: that waiting is this cause's, folded under it."""
    idle = {}
    for r in ctx.gpu_ranks:
        idle[int(r.rank)] = (ctx.part(r, "idle_us"), ctx.step_us(r), r)
    bound = {rank: v for rank, v in idle.items() if v[0] >= HOST_IDLE * v[1]}
    if not bound:
        return None
    worst = max(bound, key=lambda k: bound[k][0] / bound[k][1])
    idle_us, step, r = bound[worst]
    per_step = r.n_compute / max(len(r.steps), 1)
    mean_us = r.compute_mean_us if r.compute_mean_us is not None else float("nan")
    wait, others = _waiting_on_others(ctx, set(bound))
    peers = ""
    if others and np.isfinite(wait) and wait > 0:
        peers = f"; {_who(others)} for it inside NCCL kernels {ms(wait)} per step (exposed, median)"
    where = f"rank {worst}" if len(bound) == 1 else f"ranks {', '.join(map(str, sorted(bound)))}"
    knobs, cli = [], []
    if not ctx.config.compiled.value:
        knobs.append("torch.compile the blocks")
        cli.append("--compile")
    knobs += ["fewer and larger FSDP units", "explicit prefetch", "a larger batch per step"]
    cli += ["--prefetch-forward 1", "--batch-size"]
    # The same work on every rank: a rank idling far more than its peers has a slow or busy
    # host (data loading, another process, logging on rank 0), not launch overhead alone.
    shares = {k: v[0] / v[1] for k, v in idle.items() if v[1] > 0}
    calm = min(shares.values()) if shares else 0.0
    lone = len(shares) > 1 and calm < IMBALANCE * shares[worst]
    if lone:
        text = (
            f"look at rank {worst}'s host first: it idles {pct(shares[worst])} of the step where "
            f"another rank on the same work idles {pct(calm)} (data loading, CPU contention or "
            "affinity, another process, logging or metrics on that rank); then launch less from "
            "the host: " + ", ".join(knobs)
        )
        code = (
            "DataLoader(..., num_workers=N, pin_memory=True, persistent_workers=True)  # the "
            "slow rank's input; pin its threads (taskset / numactl) away from others"
        )
        cause = (
            f"{where}: its host is slower than its peers' on the same work, so its GPU idles "
            f"{pct(idle_us / step)} of the step"
        )
    else:
        text = (
            "launch less from the host: "
            + ", ".join(knobs)
            + "; check the optimizer's and the data loader's CPU time"
        )
        code = (
            "for block in model.layers: block.compile()  # before fully_shard; "
            "layers[i].set_modules_to_forward_prefetch([layers[i + 1]])"
        )
        cause = (
            f"{where}: the host cannot launch work fast enough, so the GPU idles "
            f"{pct(idle_us / step)} of the step"
        )
    return Finding(
        "host-bound",
        "Host-bound: the GPU waits for the CPU",
        cause=cause + (" and the other ranks wait for it" if peers else ""),
        evidence=f"{where}: the GPU is idle {pct(idle_us / step)} of the step ({ms(idle_us)}, "
        f"its median step; threshold {pct(HOST_IDLE)}), running {per_step:.0f} compute kernels "
        f"per step of {mean_us:.0f} µs on average{peers}",
        why="with no communication or compute running, the GPU waits for the host to launch "
        "work (Python, FSDP hooks, the optimizer, data loading); a rank that is late makes "
        "every collective wait for it",
        change=Change(text, cli=" / ".join(cli), code=code),
        cost_us=idle_us,
        step_us=step,
        ranks=sorted(bound),
        metrics={
            "rank": worst,
            "idle_pct": 100 * idle_us / step,
            "kernels_per_step": per_step,
            "peers_wait_us": wait,
            "imbalanced": lone,
        },
    )


@rule(
    "straggler",
    "Straggler: one rank arrives last",
    "one rank arrives last at ≥ 60 % of its collectives and the others wait (exposed) ≥ 10 % of "
    "the step",
    needs="≥ 2 GPU ranks",
)
def straggler(ctx: Context) -> Finding | None:
    """One rank arrives last at most collectives: the others wait for it. The rank's own
    figures say why: its GPU idles (its host; folded under host-bound), it computes longer
    (a slow GPU), or neither (something outside the step)."""
    if ctx.crossrank.empty:
        return None
    per_rank = ctx.crossrank.per_rank
    slow = per_rank.loc[per_rank["arrived_last_share"].idxmax()]
    if not slow["arrived_last_share"] >= STRAGGLER_SHARE:
        return None
    rank = int(slow["rank"])
    wait, others = _waiting_on_others(ctx, {rank})
    step = ctx.median_step_us()
    if not np.isfinite(wait) or wait < STRAGGLER_WAIT * step:
        return None
    m = ctx.crossrank.matched
    late = float(m.loc[m["last_rank"] == rank, "lateness_us"].median())
    by_rank = {int(r.rank): r for r in ctx.gpu_ranks}
    compute = {k: ctx.part(r, "compute_us") for k, r in by_rank.items()}
    others_compute = [v for k, v in compute.items() if k != rank and np.isfinite(v)]
    slow_gpu = (
        rank in compute
        and others_compute
        and compute[rank] >= SLOW_COMPUTE * float(np.median(others_compute))
    )
    if slow_gpu:
        cause = (
            f"rank {rank}'s GPU computes {compute[rank] / np.median(others_compute) - 1:.0%} "
            "longer per step than the others', so it arrives last and they wait"
        )
        look = "GPU: clocks and thermals (nvidia-smi -q -d CLOCK,PERFORMANCE), a different "
        look += "GPU model, or other work sharing it"
    else:
        cause = f"rank {rank} arrives last at most collectives and the other ranks wait for it"
        look = "host: data loading, CPU contention or affinity, a different GPU"
    return Finding(
        "straggler",
        f"Straggler: rank {rank}",
        cause=cause,
        evidence=f"rank {rank} arrived last at {pct(slow['arrived_last_share'])} of its "
        f"{int(slow['n_matched'])} matched collectives (median {late / 1e3:.2f} ms late; "
        f"threshold {pct(STRAGGLER_SHARE)}); {_who(others)} for it {ms(wait)} per step, exposed "
        f"({pct(wait / step)} of the step, median; threshold {pct(STRAGGLER_WAIT)})",
        why="a collective ends when its last rank arrives: every other rank's NCCL kernel "
        "includes that wait, so the slowest rank sets the pace of all",
        change=Change(
            f"look at rank {rank}'s {look}; compare its step time and idle share with the others'"
        ),
        cost_us=wait,
        step_us=step,
        ranks=[rank],
        metrics={
            "rank": rank,
            "share": float(slow["arrived_last_share"]),
            "wait_us_per_step": wait,
            "wait_pct": 100 * wait / step if step else float("nan"),
            "slow_gpu": bool(slow_gpu),
        },
    )


@rule(
    "profiler-distortion",
    "Profiler distortion in the detailed step",
    "the detailed step is ≥ 25 % slower than the timing median and slower than every timing step",
    needs="detailed traces",
)
def profiler_distortion(ctx: Context) -> Finding | None:
    """The detailed (record_shapes + with_stack) step is much slower than the timing ones:
    about the measurement, not the training (un-profiled steps pay nothing for it)."""
    items = [
        d
        for d in ctx.analysis.distortion()
        if d["slowdown_pct"] >= 100 * DISTORTION and d["detailed_step_us"] > d["timing_max_step_us"]
    ]
    if not items:
        return None
    worst = max(items, key=lambda d: d["slowdown_pct"])
    return Finding(
        "profiler-distortion",
        "Profiler distortion in the detailed step",
        cause="record_shapes and with_stack slow the detailed step down: read timing from the "
        "lean timing traces (fsdp-trace does)",
        evidence=f"rank {worst['rank']}: the detailed step took {ms(worst['detailed_step_us'])} "
        f"vs {ms(worst['timing_median_step_us'])} for the timing steps "
        f"({worst['slowdown_pct']:+.0f} %; threshold {100 * DISTORTION:+.0f} %, and beyond the "
        f"slowest timing step, {ms(worst['timing_max_step_us'])})",
        why="record_shapes and with_stack add host overhead per operator; on a host-bound step "
        "that changes the overlap itself, so the detailed trace is for attribution only",
        change=Change(
            "read overlap and timing from the lean timing trace; when you profile yourself, add "
            "a barrier after warmup and drop the first active step",
            code="torch.profiler.profile(record_shapes=False, with_stack=False, ...)  # timing",
        ),
        cost_us=0.0,
        step_us=worst["timing_median_step_us"],
        basis=Basis.MEASURED,
        ranks=[int(worst["rank"])],
        kind=FindingKind.MEASUREMENT,
        metrics=worst,
    )
