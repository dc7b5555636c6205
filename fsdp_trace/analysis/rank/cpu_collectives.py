"""Traces with no GPU kernels (CPU + gloo runs): report the CPU-side collectives.

gloo runs each collective on its own thread as a `gloo:<op>` annotation; the issuing
`c10d::` op sits on the training thread inside the FSDP2 labels. The k-th issuing op of a
type pairs with the k-th gloo annotation of that type. There is no GPU compute to overlap
with, so overlap figures are left empty and a notice says so.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fsdp_trace.analysis import classify
from fsdp_trace.analysis import intervals as iv
from fsdp_trace.analysis.rank import steps as steps_mod
from fsdp_trace.analysis.rank.blocks import block_table, empty_frame, no_phases
from fsdp_trace.analysis.rank.context import (
    ALL_GATHER,
    BACKWARD_LABELS,
    C10D_COLLECTIVES,
    FORWARD_LABELS,
    ISSUER_LABELS,
    PREFETCH_LABELS,
    REDUCE,
    CpuContext,
    name_mask,
)
from fsdp_trace.analysis.rank.setup import label_signals
from fsdp_trace.analysis.read.trace import MISSING, Trace, pg_sizes, trace_meta
from fsdp_trace.analysis.results import COLLECTIVE_COLUMNS, STEP_COLUMNS, RankAnalysis
from fsdp_trace.analysis.table import array_of
from fsdp_trace.vocab import UNATTRIBUTED, Collective, Device, Phase


def analyze_cpu_trace(trace: Trace, kinds: np.ndarray, source: str) -> RankAnalysis:
    """The CPU-side collectives of a trace without GPU kernels, attributed like NCCL ones."""
    events = trace.events
    names = events["name"]  # categorical: string tests run once per distinct name
    notices: list[str] = list(trace.notices)
    cpu_mask = np.isin(kinds, (classify.CPU_OP, classify.ANNOTATION, classify.LAUNCH))
    cpu = events[cpu_mask]
    cpu_steps = steps_mod.cpu_steps(events, kinds, notices)

    gloo_mask = name_mask(names, lambda n: n.startswith("gloo:"))
    issue_type = names.map(C10D_COLLECTIVES).astype(object).to_numpy()
    issue_mask = pd.notna(issue_type)
    ts_all = array_of(events, "ts")
    gloo_rows = np.flatnonzero(gloo_mask)
    gloo_names = np.asarray(names.array[gloo_rows], dtype=object)
    issue_rows = np.flatnonzero(issue_mask)
    # Which gloo op runs each issued type; gloo implements reduce-scatter as an all-reduce.
    has_rs = "gloo:reduce_scatter" in set(gloo_names)
    target = {
        Collective.ALL_GATHER: "gloo:all_gather",
        Collective.ALL_REDUCE: "gloo:all_reduce",
        Collective.REDUCE_SCATTER: "gloo:reduce_scatter" if has_rs else "gloo:all_reduce",
        Collective.BROADCAST: "gloo:broadcast",
    }
    issue_target = np.array([target.get(t) for t in issue_type[issue_rows]], dtype=object)
    pairs = []
    for gloo_name in sorted({t for t in issue_target if t}):
        ops = issue_rows[issue_target == gloo_name]
        runs = gloo_rows[gloo_names == gloo_name]
        ops = ops[np.argsort(ts_all[ops], kind="stable")]
        runs = runs[np.argsort(ts_all[runs], kind="stable")]
        m = min(ops.size, runs.size)
        pairs += [(o, r, issue_type[o]) for o, r in zip(ops[:m], runs[:m], strict=True)]
        if ops.size != runs.size:
            notices.append(
                f"{gloo_name}: {ops.size} issued vs {runs.size} run; paired {m} in order"
            )
    cpu_ctx = CpuContext.build(cpu)
    if not pairs:
        notices.append(_nothing_to_report(gloo_rows.size, issue_rows.size))
        empty = empty_frame(COLLECTIVE_COLUMNS)
        return RankAnalysis(
            rank=trace.rank,
            path=trace.path,
            source=source,
            device=Device.CPU.value,
            steps=_cpu_steps_frame(trace, cpu_steps, [], source),
            collectives=empty,
            blocks=block_table(empty, pd.DataFrame(), 0, trace.rank, source),
            kernel_table=pd.DataFrame(),
            exposed=pd.DataFrame(columns=["start_us", "end_us", "step"]),
            compute_phases=no_phases(),
            fsdp=cpu_ctx.facts(cpu_steps),
            notices=notices,
            meta=trace_meta(trace, 0, []),
            setup=label_signals(cpu, cpu_ctx, len(cpu_steps)).to_dict(),
        )
    notices.insert(
        0, "no GPU kernels: a CPU (gloo) trace; reporting CPU-side collectives, no overlap"
    )
    issue = np.array([p[0] for p in pairs])
    run = np.array([p[1] for p in pairs])
    ctype = np.array([p[2] for p in pairs], dtype=object)

    ctx = cpu_ctx
    thread = ctx.keys.code(array_of(events, "pid")[issue], array_of(events, "tid")[issue])
    t = array_of(events, "ts")[issue]
    chain = ctx.labels.chain(ctx.labels.innermost(ctx.keys, thread, t))
    ag = ctx.labels.first_of(chain, {ALL_GATHER})
    rs = ctx.labels.first_of(chain, {REDUCE})
    hooks = ctx.labels.first_of(chain, FORWARD_LABELS | BACKWARD_LABELS)
    block = np.where(ctype == Collective.ALL_GATHER, ctx.labels.fqn_at(ag), ctx.labels.fqn_at(rs))
    block = np.where(pd.isna(block), ctx.labels.fqn_at(hooks), block)
    hook_kind = ctx.labels.kind_at(hooks)
    in_autograd = ctx.autograd.contains(thread, t)
    phase = np.where(
        np.isin(hook_kind, list(BACKWARD_LABELS)) | in_autograd,
        Phase.BACKWARD.value,
        Phase.FORWARD.value,
    )
    issuer = ctx.labels.fqn_at(ctx.labels.first_of(chain, ISSUER_LABELS))
    start = array_of(events, "ts")[run]
    end = array_of(events, "end")[run]
    dur = end - start
    nbytes = (
        array_of(events, "cpu_coll_bytes")[run].astype(np.float64)
        if "cpu_coll_bytes" in events
        else np.full(run.size, np.nan)
    )
    nbytes = np.where(nbytes == MISSING, np.nan, nbytes)
    if trace.world_size:
        # gloo's recorded input is this rank's shard for all-gather; the message is n× that.
        nbytes = np.where(ctype == Collective.ALL_GATHER, nbytes * trace.world_size, nbytes)
    group = _gloo_group_sizes(trace, ctype)
    with np.errstate(divide="ignore", invalid="ignore"):
        algbw = np.where(dur > 0, nbytes / (dur * 1e-6) / 1e9, np.nan)
    factor = classify.bus_factors(ctype, group)
    step = (
        steps_mod.step_of_time(cpu_steps, t)
        if not cpu_steps.empty
        else np.zeros(t.size, dtype=np.int64)
    )
    frame = pd.DataFrame(
        {
            "rank": trace.rank,
            "source": source,
            "step": step,
            "collective": ctype,
            "block": pd.Series(block).fillna(UNATTRIBUTED).to_numpy(),
            "phase": phase,
            "issued_by": np.where(pd.isna(issuer), block, issuer),
            "prefetched": ctx.labels.first_of(chain, PREFETCH_LABELS) >= 0,
            "start_us": start,
            "end_us": end,
            "dur_us": dur,
            "exposed_us": np.nan,
            "bytes": nbytes,
            "group_size": group,
            "algbw_gbps": algbw,
            "busbw_gbps": algbw * factor,
            "dtype": None,
            "pg_name": None,
            "pg_desc": None,
            "pg_ranks": None,
            "seq": MISSING,
            "stream": array_of(events, "tid")[run],
            "correlation": MISSING,
            "kernel": np.asarray(names.array[run], dtype=object),
        }
    )
    frame = frame[frame["step"] >= 0].reset_index(drop=True).reindex(columns=COLLECTIVE_COLUMNS)
    n_steps = max(len(cpu_steps), 1)
    blocks = block_table(
        frame, pd.DataFrame(columns=["block", "phase", "ts", "end"]), n_steps, trace.rank, source
    )
    blocks["exposed_us_per_step"] = np.nan
    return RankAnalysis(
        rank=trace.rank,
        path=trace.path,
        source=source,
        device=Device.CPU.value,
        steps=_cpu_steps_frame(trace, cpu_steps, [(frame["start_us"], frame["end_us"])], source),
        collectives=frame,
        blocks=blocks,
        kernel_table=pd.DataFrame(),
        exposed=pd.DataFrame(columns=["start_us", "end_us", "step"]),
        compute_phases=no_phases(),
        fsdp=ctx.facts(cpu_steps),
        streams={},
        notices=notices,
        meta=trace_meta(trace, ctx.compiled_regions, [], ctx.unit_names),
        setup=label_signals(cpu, ctx, len(cpu_steps)).to_dict(),
    )


def _gloo_group_sizes(trace: Trace, ctype: np.ndarray) -> np.ndarray:
    """gloo ops carry no group. The group is the world for 1-D FSDP; on a 2-D mesh (HSDP)
    the trace's pg_config holds the shard group (all-gather, reduce-scatter) and the
    replicate group (all-reduce), whose sizes multiply to the world. NaN when unknown."""
    if not trace.world_size:
        return np.full(ctype.size, np.nan)
    world = float(trace.world_size)
    sizes = sorted(set(pg_sizes(trace.distributed).values()) - {world})
    if not sizes:
        return np.full(ctype.size, world)
    shard, replicate = max(sizes), min(sizes)
    if shard * replicate != world and shard * shard == world:
        replicate = shard  # a square mesh: both groups have one size
    if shard * replicate != world:
        return np.full(ctype.size, world)
    return np.where(ctype == Collective.ALL_REDUCE, replicate, shard)


def _nothing_to_report(n_gloo: int, n_issued: int) -> str:
    """Why a trace without GPU kernels gave no collectives: none at all, or none paired."""
    if n_gloo == 0 and n_issued == 0:
        return (
            "no GPU kernels and no collectives (neither NCCL kernels nor gloo ops): a CPU-only "
            "trace, nothing to measure"
        )
    return (
        f"no GPU kernels, and its {n_gloo} gloo ops and {n_issued} issuing c10d collectives "
        "could not be paired: no collectives to report"
    )


def _cpu_steps_frame(trace: Trace, cpu_steps: pd.DataFrame, comm, source: str) -> pd.DataFrame:
    """Per step: CPU step time and the union of collective time; overlap columns are NaN."""
    if cpu_steps.empty:
        return pd.DataFrame(columns=STEP_COLUMNS)
    starts = array_of(cpu_steps, "cpu_start")
    ends = array_of(cpu_steps, "cpu_end")
    if comm:
        u = iv.union(*comm[0])
        comm_us = iv.covered_up_to(u, ends) - iv.covered_up_to(u, starts)
    else:
        comm_us = np.zeros(starts.size)
    nan = np.full(starts.size, np.nan)
    return pd.DataFrame(
        {
            "rank": trace.rank,
            "source": source,
            "step": array_of(cpu_steps, "step"),
            "start_us": starts,
            "end_us": ends,
            "step_us": ends - starts,
            "compute_us": nan,
            "comm_us": comm_us,
            "overlap_us": nan,
            "exposed_us": nan,
            "exposed_pct": nan,
            "idle_us": nan,
            "idle_pct": nan,
            "overlap_pct": nan,
            "ag_us": nan,
            "rs_us": nan,
            "recompute_us": nan,
            "recompute_pct": nan,
            "n_comm_kernels": 0,
            "n_compute_kernels": 0,
        }
    ).reindex(columns=STEP_COLUMNS)
