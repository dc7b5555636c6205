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
SLOW_HOST = 0.20  # a host taking this much longer per step than its peers' median (and longer
# on every step than any peer's slowest): one slow host; else every host paces its GPU alike
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


# The profiler's own host cost per recorded event (cpu_op, annotation, runtime call), as the
# shipped captures measured it (profiled step − un-profiled step, over the events per step, on
# the host-bound ones: 1.4–6.4 µs on two VMs; record_shapes/with_stack cost more): used to say
# how much of a trace's idle the profiler may explain where no un-profiled step was timed.
PROFILER_US_PER_EVENT = (1.5, 6.0)

# What to do about the largest use of the host's time while the GPU idles.
HOST_ADVICE = {
    "synchronization": (
        "take the synchronizations out of the step: the host waits for the GPU (a loss "
        "`.item()` or print every step, torch.cuda.synchronize(), a blocking copy); read "
        "metrics every N steps or asynchronously",
        "loss_log.append(loss.detach())  # .item() only every N steps",
    ),
    "optimizer": (
        "a cheaper optimizer step on the host: fused=True (or foreach) AdamW, fewer parameter "
        "tensors",
        "torch.optim.AdamW(model.parameters(), lr=lr, fused=True)",
    ),
    "optimizer, batched": (
        "a cheaper optimizer step on the host: it already batches its tensors ({impl}), so fewer "
        "parameter tensors, or fewer optimizer steps per token (a larger batch, gradient "
        "accumulation)",
        "",
    ),
    "FSDP hooks": (
        "less FSDP hook work per step: fewer and larger units (each unit's hooks run on the "
        "host every forward and backward), and more compute per unit (a larger batch)",
        "fully_shard(model.layers[i : i + 2])  # two blocks a unit",
    ),
    "other operators": (
        "fewer, larger kernels to launch: torch.compile fuses the small operators; a larger "
        "batch gives each launch more work",
        "for block in model.layers: block.compile()  # before fully_shard",
    ),
    "Python": (
        "the host runs Python outside any operator between launches (the training loop, "
        "logging, metrics): keep the loop lean; a larger batch gives each launch more work",
        "",
    ),
    "data loading": (
        "the training loop waits for its batches (the trace's DataLoader events): load them in "
        "DataLoader workers, pinned, ahead of the step",
        "DataLoader(..., num_workers=N, pin_memory=True, persistent_workers=True)",
    ),
}


def _profiler_share(ctx: Context, r, idle_us: float) -> tuple[float, float, str, bool]:
    """How much of a rank's idle the profiler's own overhead explains (µs; a low and a high
    figure), how that is known, and whether it is measured (run.json's un-profiled step) or
    an estimate from the events recorded per step."""
    stats = ctx.record.figures.step_time_ms if ctx.record is not None else None
    if stats is not None and stats.median:
        unprofiled = float(stats.median) * 1e3
        profiled = ctx.median_step_us()
        extra = min(max(0.0, profiled - unprofiled), idle_us)
        text = (
            f"the un-profiled step is {ms(unprofiled)} (run.json median), the profiled one "
            f"{ms(profiled)}: up to {ms(extra)} of the idle is the profiler's own"
        )
        return extra, extra, text, True
    events = r.host_time.events_per_step
    low, high = (min(events * c, idle_us) for c in PROFILER_US_PER_EVENT)
    share = f"{100 * low / idle_us:.0f}–{100 * high / idle_us:.0f} %" if idle_us > 0 else "?"
    text = (
        f"no un-profiled step to compare (no run.json): the profiler recorded {events:.0f} "
        f"events per step, {ms(events * PROFILER_US_PER_EVENT[0])}–"
        f"{ms(events * PROFILER_US_PER_EVENT[1])} of host time at "
        f"{PROFILER_US_PER_EVENT[0]:g}–{PROFILER_US_PER_EVENT[1]:g} µs each: it may explain "
        f"{share} of the idle"
    )
    return low, high, text, False


def _slow_host(ctx: Context, bound: dict) -> tuple[int, float, float, str] | None:
    """One rank whose host takes longer per step than its peers' on the same work: SLOW_HOST
    beyond their median, and longer on every step than any peer on its slowest. Its rank,
    its host time, the peers' median (µs), and the host times as evidence. None when every
    host takes about as long (each paces its own GPU alike: a launch-bound step)."""
    hosts = {int(r.rank): r.host_time.host_steps for r in ctx.gpu_ranks if r.host_time.host_steps}
    if len(hosts) < 2:
        return None
    median = {k: float(np.median(v)) for k, v in hosts.items()}
    slow = max(median, key=median.get)
    peers = [k for k in hosts if k != slow]
    theirs = float(np.median([median[k] for k in peers]))
    text = _host_times(median)
    apart = min(hosts[slow]) > max(max(hosts[k]) for k in peers)
    if slow in bound and apart and median[slow] >= (1 + SLOW_HOST) * theirs:
        return slow, median[slow], theirs, text
    return None


def _host_times(median: dict[int, float]) -> str:
    shown = sorted(median.items())[:6]
    more = ", …" if len(median) > 6 else ""
    return ", ".join(f"rank {k} {ms(v)}" for k, v in shown) + more


@rule("host-bound", "Host-bound: the GPU waits for the CPU", "the GPU is idle ≥ 20 % of the step")
def host_bound(ctx: Context) -> Finding | None:
    """The GPU sits idle: the CPU (Python, FSDP hooks, launches, the optimizer, data loading)
    cannot keep up. Which host: the hosts' own time per step (the main thread's step less its
    waiting for the GPU) tells one slow host (SLOW_HOST beyond its peers', on every step: its
    extra host time is the cost, and its peers wait for it inside their NCCL kernels, folded
    under it) from a launch-bound step (every host about as long: fewer, larger kernels). A
    peer's GPU idle never tells: it spins in NCCL kernels waiting. What the host does while
    the GPU idles says what to change; idle the un-profiled step does not have is the
    profiler's."""
    idle = {}
    for r in ctx.gpu_ranks:
        idle[int(r.rank)] = (ctx.part(r, "idle_us"), ctx.step_us(r), r)
    bound = {rank: v for rank, v in idle.items() if v[0] >= HOST_IDLE * v[1]}
    if not bound:
        return None
    slow = _slow_host(ctx, bound)
    worst = slow[0] if slow else max(bound, key=lambda k: bound[k][0] / bound[k][1])
    idle_us, step, r = bound[worst]
    host = r.host_time
    low, high, profiler_text, measured = _profiler_share(ctx, r, idle_us)
    if idle_us - low < HOST_IDLE * (step - low):
        return _profiler_only(ctx, worst, idle_us, step, profiler_text, measured)
    maybe_profiler = not measured and idle_us - high < HOST_IDLE * (step - high)
    wait, others = _waiting_on_others(ctx, set(bound) if not slow else {worst})
    peers = ""
    if others and np.isfinite(wait) and wait > 0:
        peers = f"; {_who(others)} for it inside NCCL kernels {ms(wait)} per step (exposed, median)"
    ranks = [worst] if slow else sorted(bound)
    where = f"rank {worst}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
    spent = {k: v for k, v in host.by_category.items() if v > 0}
    doing = "; ".join(f"{name} {ms(v)}" for name, v in sorted(spent.items(), key=lambda kv: -kv[1]))
    top = ", ".join(f"{name} {ms(v)}" for name, v in host.top_ops[:3])
    largest = host.largest or "other operators"
    extra = ""
    cost = idle_us - low
    if slow:  # what the slow host does more of than its peers, over its whole step
        _, mine_us, theirs_us, times = slow
        cost = min(mine_us - theirs_us, cost)
        calm = [idle[k][2] for k in idle if k != worst]
        mine = host.main_by_category
        theirs = {
            c: float(np.median([o.host_time.main_by_category.get(c, 0.0) for o in calm]))
            for c in mine
        }
        more = {c: mine.get(c, 0.0) - theirs.get(c, 0.0) for c in mine if c != "synchronization"}
        if more and max(more.values()) > 0:
            largest = max(more, key=more.get)
            extra = (
                f"; over its whole step rank {worst}'s main thread spends {ms(more[largest])} "
                f"more than its peers' (median) on {largest}"
            )
        extra += f"; the hosts' own time per step (less waiting for the GPU): {times}"
    elif len(idle) > 1:
        times = _host_times(
            {k: v[2].host_time.host_us for k, v in idle.items() if v[2].host_time.host_steps}
        )
        if times:
            extra = (
                f"; every host takes about as long per step (less waiting for the GPU: "
                f"{times}; one slow host would take {pct(SLOW_HOST)} longer than its peers')"
            )
    text, code = _advice(ctx, host, largest)
    if slow:
        loading = "data loading, " if host.main_by_category.get("data loading", 0) > 0 else ""
        text = (
            f"look at rank {worst}'s host first: it takes {ms(slow[1] - slow[2])} longer per "
            f"step than its peers' on the same work ({loading}CPU contention or affinity, "
            f"another process, logging or metrics on that rank); it spends its extra time on "
            f"{largest}: {text}"
        )
        cause = (
            f"{where}: its host takes {pct(slow[1] / slow[2] - 1)} longer per step than its "
            f"peers' on the same work, so its GPU idles {pct(idle_us / step)} of the step"
        )
    else:
        launch = "" if largest in ("data loading", "synchronization") else "a launch-bound step: "
        cause = (
            f"{where}: {launch}the host cannot launch work fast enough, so the GPU idles "
            f"{pct(idle_us / step)} of the step, its host busiest with {largest}"
        )
    if maybe_profiler:
        cause += ", though the profiler's own overhead may explain most of that idle"
        text += (
            "; first time un-profiled steps (`fsdp-trace capture` does): the profiler may "
            "explain most of this idle"
        )
    per_step = r.n_compute / max(len(r.steps), 1)
    mean_us = r.compute_mean_us if r.compute_mean_us is not None else float("nan")
    return Finding(
        "host-bound",
        "Host-bound: the GPU waits for the CPU",
        cause=cause + (" and the other ranks wait for it" if peers else ""),
        evidence=f"{where}: the GPU is idle {pct(idle_us / step)} of the step ({ms(idle_us)}, "
        f"its median step; threshold {pct(HOST_IDLE)}), running {per_step:.0f} compute kernels "
        f"per step of {mean_us:.0f} µs on average{peers}. While it idles, the launching host "
        f"thread runs: {doing or 'nothing recorded'}"
        + (f" (operators most in the gaps, self time: {top})" if top else "")
        + extra
        + f"; {profiler_text}",
        why="with no communication or compute running, the GPU waits for the host to launch "
        "work; a rank that is late makes every collective wait for it",
        change=Change(text, cli="--compile" if code and "compile" in code else "", code=code),
        cost_us=cost,
        step_us=step,
        basis=Basis.INFERRED if maybe_profiler else Basis.MEASURED,
        ranks=ranks,
        metrics={
            "rank": worst,
            "idle_pct": 100 * idle_us / step,
            "kernels_per_step": per_step,
            "peers_wait_us": wait,
            "imbalanced": bool(slow),
            "host_us": {k: v[2].host_time.host_us for k, v in idle.items()},
            "host": dict(host.by_category),
            "largest": largest,
            "profiler_us": low,
            "profiler_high_us": high,
            "profiler_may_explain": bool(maybe_profiler),
        },
    )


def _advice(ctx: Context, host, largest: str) -> tuple[str, str]:
    """The advice for the largest use of host time (data loading only where the trace shows
    its events), never a knob the run already set (compile, a batched optimizer)."""
    if largest == "optimizer" and host.optimizer_impl:
        text, code = HOST_ADVICE["optimizer, batched"]
        return text.format(impl=host.optimizer_impl), code
    text, code = HOST_ADVICE[largest]
    return _not_already(ctx, largest, text, code)


def _not_already(ctx: Context, largest: str, text: str, code: str) -> tuple[str, str]:
    """The advice for the largest use of host time, without a knob the run already set."""
    if largest == "other operators" and ctx.config.compiled.value:
        return (
            "the blocks are compiled already: what is left launches outside them (the loss, "
            "the optimizer, FSDP's copies); a larger batch gives each launch more work",
            "",
        )
    return text, code


def _profiler_only(
    ctx: Context, rank: int, idle_us: float, step: float, text: str, measured: bool = True
) -> Finding:
    """The idle is the profiler's: the un-profiled step does not have it (measured), or even
    the lowest estimate of the profiler's cost per event accounts for it."""
    known = (
        "the un-profiled step is shorter by about that much"
        if measured
        else "even the profiler's lowest cost per recorded event accounts for about that much"
    )
    return Finding(
        "host-bound",
        "Host-bound only under the profiler",
        cause=f"rank {rank}'s GPU idles {pct(idle_us / step)} of the profiled step, but {known}: "
        "the profiler's own host overhead, not the training's",
        evidence=f"rank {rank}: {ms(idle_us)} idle per profiled step; {text}",
        why="the profiler adds host time to every operator it records; a step that keeps its "
        "GPU busy unprofiled can idle under it",
        change=Change(
            "nothing to change in training; read host-boundness from un-profiled timing "
            "(`fsdp-trace capture` times un-profiled steps), and profile with record_shapes "
            "and with_stack off",
        ),
        cost_us=0.0,
        step_us=step,
        ranks=[int(rank)],
        kind=FindingKind.MEASUREMENT,
        metrics={"rank": rank, "idle_us": idle_us},
    )


@rule(
    "straggler",
    "Straggler: one rank arrives last",
    "one rank arrives last at ≥ 60 % of its collectives and the others wait (exposed) ≥ 10 % of "
    "the step, or its GPU runs ≥ 5 % of the step more kernel time than theirs while they wait "
    "(hidden or not) at least that long",
    needs="≥ 2 GPU ranks",
)
def straggler(ctx: Context) -> Finding | None:
    """One rank arrives last at most collectives: the others wait for it. The rank's own
    figures say why: its GPU idles (its host; folded under host-bound), it computes longer
    (a slow GPU), or neither (something outside the step).

    A slow GPU can cost the step even when its peers' waiting is hidden behind their compute:
    their NCCL kernels spin on SMs their compute then lacks, so every rank's step grows by
    about the straggler's extra kernel time. That extra time (per kernel name, against the
    others' median) is the cost then, as long as the others wait at least that long."""
    if ctx.crossrank.empty:
        return None
    per_rank = ctx.crossrank.per_rank
    slow = per_rank.loc[per_rank["arrived_last_share"].idxmax()]
    if not slow["arrived_last_share"] >= STRAGGLER_SHARE:
        return None
    rank = int(slow["rank"])
    wait, others = _waiting_on_others(ctx, {rank})
    step = ctx.median_step_us()
    if not np.isfinite(wait) or not step > 0:
        return None
    by_rank = {int(r.rank): r for r in ctx.gpu_ranks}
    extra_us, top = _extra_kernels(by_rank, rank)
    all_wait = per_rank.loc[per_rank["rank"] != rank, "wait_us_per_step"]
    all_wait_us = float(all_wait.median()) if len(all_wait) else float("nan")
    extra_gpu = extra_us >= (SLOW_COMPUTE - 1) * step and all_wait_us >= extra_us
    if wait < STRAGGLER_WAIT * step and not extra_gpu:
        return None
    m = ctx.crossrank.matched
    late = float(m.loc[m["last_rank"] == rank, "lateness_us"].median())
    compute = {k: ctx.part(r, "compute_us") for k, r in by_rank.items()}
    others_compute = [v for k, v in compute.items() if k != rank and np.isfinite(v)]
    slow_gpu = extra_gpu or bool(
        rank in compute
        and others_compute
        and compute[rank] >= SLOW_COMPUTE * float(np.median(others_compute))
    )
    kernels = ""
    cost = wait
    if slow_gpu:
        median_compute = float(np.median(others_compute)) if others_compute else float("nan")
        if rank in compute and compute[rank] >= SLOW_COMPUTE * median_compute:
            cause = (
                f"rank {rank}'s GPU computes {compute[rank] / median_compute - 1:.0%} "
                f"({ms(compute[rank] - median_compute)}) longer per step than the others' on "
                "the same work, so it arrives last and they wait"
            )
        else:  # the others' compute is slowed too: by NCCL kernels spinning beside it
            cause = (
                f"rank {rank}'s GPU runs {ms(extra_us)} more kernel time per step than the "
                f"others' ({pct(extra_us / step)} of the step), so it arrives last and they wait"
            )
        look = "GPU: work only it runs (the kernels in the evidence), clocks and thermals "
        look += "(nvidia-smi -q -d CLOCK,PERFORMANCE), a different GPU model, or other work on it"
        if top:
            kernels = (
                "; the kernels that account for it (per step, against the others' median): "
                + ", ".join(f"{n[:60]} +{ms(v)}" for v, n in top)
            )
        if extra_gpu:
            cost = max(wait, min(extra_us, all_wait_us))
            kernels += (
                f"; the others wait {ms(all_wait_us)} per step in all, most of it hidden behind "
                "compute their spinning NCCL kernels slow down"
            )
    else:
        cause = f"rank {rank} arrives last at most collectives and the other ranks wait for it"
        look = "host: data loading, CPU contention or affinity, a different GPU"
    return Finding(
        "straggler",
        f"Slow GPU: rank {rank}" if slow_gpu else f"Straggler: rank {rank}",
        cause=cause,
        evidence=f"rank {rank} arrived last at {pct(slow['arrived_last_share'])} of its "
        f"{int(slow['n_matched'])} matched collectives (median {late / 1e3:.2f} ms late; "
        f"threshold {pct(STRAGGLER_SHARE)}); {_who(others)} for it {ms(wait)} per step, exposed "
        f"({pct(wait / step)} of the step, median; threshold {pct(STRAGGLER_WAIT)})" + kernels,
        why="a collective ends when its last rank arrives: every other rank's NCCL kernel "
        "includes that wait, so the slowest rank sets the pace of all",
        change=Change(
            f"look at rank {rank}'s {look}; compare its step time and idle share with the others'"
        ),
        cost_us=cost,
        step_us=step,
        ranks=[rank],
        metrics={
            "rank": rank,
            "share": float(slow["arrived_last_share"]),
            "wait_us_per_step": wait,
            "wait_pct": 100 * wait / step,
            "all_wait_us_per_step": all_wait_us,
            "extra_kernel_us_per_step": extra_us,
            "slow_gpu": bool(slow_gpu),
        },
    )


def _extra_kernels(by_rank: dict, rank: int) -> tuple[float, list[tuple[float, str]]]:
    """The kernel time per step the slow rank runs beyond the others' median, summed over
    kernel names where it runs more (extra kernels or slower ones), and the top three."""
    mine = by_rank[rank].kernel_time
    others = [r.kernel_time for k, r in by_rank.items() if k != rank]
    if not mine or not others:
        return 0.0, []
    extra = {
        name: us - float(np.median([o.get(name, 0.0) for o in others])) for name, us in mine.items()
    }
    positive = sorted(((v, n) for n, v in extra.items() if v > 0), reverse=True)
    return float(sum(v for v, _ in positive)), positive[:3]


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
