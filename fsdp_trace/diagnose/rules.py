"""Diagnosis → advice. Each rule reads the analysis (and the cross-rank view), and when it
sees its problem says what it saw with numbers, why it matters, and the knob to change.

Thresholds are deliberately plain and documented here; every rule is tested on a real trace
that shows the problem and on one where it must stay silent. Communication times exclude
waiting for late peers wherever the cross-rank view has the collective (`without_waiting`):
that wait is the straggler's cost (rule 10), not the collective's. Advice never names a knob
that run.json shows is already set.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from fsdp_trace.analyze import intervals as iv
from fsdp_trace.analyze.results import Analysis, RankAnalysis
from fsdp_trace.diagnose.crossrank import CrossRank, match

# Thresholds (fractions of the step unless named otherwise).
FIRST_AG_EXPOSED = 0.01  # rule 1: exposed first all-gather (waiting excluded)
ROOT_SIZE_RATIO = 2.0  # rule 1: root unit at least this many blocks' worth of bytes
REGATHER_MIN = 0.002  # rule 2: the re-gather's cross-rank transfer time
RS_TAIL = 0.02  # rule 3: reduce-scatter tail exposed (waiting excluded)
COMM_BOUND_SHARE = 0.25  # rule 4: share of block units whose gather outlasts their compute
COMM_BOUND_RATIO = 1.2  # rule 4: ... by at least this factor (transfer vs unslowed compute)
HOST_IDLE = 0.20  # rule 5: GPU idle share of the step
TAX_COST = 0.03  # rule 7: time NCCL adds to the compute beside it
TAX_MIN_LAUNCHES = 3  # rule 7: launches of an op with and without NCCL beside it, each
BUSBW_FLOOR_GBPS = {"nvlink": 50.0, "mixed": 20.0, "pcie": 5.0, None: 10.0}  # rule 8
LARGE_MESSAGE_BYTES = 8e6  # rule 8: messages big enough to reach link bandwidth
STRAGGLER_SHARE = 0.6  # rule 10: arrives last at this share of its matched collectives
STRAGGLER_WAIT = 0.10  # rule 10: the others' median wait inside NCCL kernels
DISTORTION = 0.25  # rule 11: detailed step slower than the timing median by this much ...
# ... and slower than every timing step (else it is within the run's own spread).

# GPUs that only come as SXM/OAM modules on an NVLink board: with no topology in run.json, a
# trace whose deviceProperties name one of these is taken to be on NVLink (rule 8).
NVLINK_PARTS = re.compile(
    r"SXM|H100 80GB HBM3|H200(?! NVL)|H800(?! PCIe)|\bH20\b|\bGH200\b|\bG?B[23]00\b",
    re.IGNORECASE,
)


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

    def median_step_us(self) -> float:
        return float(np.median([self.step_us(r) for r in self.gpu_ranks]))

    def parallel(self) -> dict[str, Any]:
        return self.run.get("parallel", {})

    def env_vars(self) -> dict[str, str]:
        return self.run.get("environment", {}).get("env_vars", {})

    def setting(self, knob: str) -> Any:
        """A capture option as run.json recorded it (`config`); None without run.json."""
        return (self.run.get("config") or {}).get(knob)

    def block_units(self, units: pd.Series) -> set[str]:
        """The transformer-block units: run.json's list, else every single-module unit
        other than the root (the embedding/head units of torchtitan-style models name
        several modules, e.g. 'norm, output')."""
        blocks = self.run.get("model", {}).get("blocks")
        if blocks:
            return set(blocks)
        names = set(units.dropna().astype(str))
        return {u for u in names if u not in ("root", "unattributed") and ", " not in u}


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _ms(us: float) -> str:
    return f"{us / 1e3:.2f} ms"


def _per_step(frame: pd.DataFrame, pick: Callable[[pd.DataFrame], pd.Series]) -> pd.DataFrame:
    """One row per step chosen by `pick` from each step's rows."""
    rows = [pick(group) for _, group in frame.groupby("step", sort=True)]
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=frame.columns)


def _timing_note(matched: bool) -> str:
    return (
        "cross-rank transfer time, waiting for peers excluded"
        if matched
        else "its duration: no cross-rank match, so it may include waiting for peers"
    )


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
        exposed = float(ctx.crossrank.without_waiting(r.rank, first)["exposed_us"].median())
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
    if ctx.setting("shard_embeddings"):
        change = (
            "the embeddings and head already are their own units (`--shard-embeddings`); give "
            "the largest modules left in the root their own fully_shard, so the first gather "
            "is small"
        )
    else:
        change = (
            "shard the embeddings and the norm+output head as their own units "
            "(fully_shard(tok_embeddings), fully_shard([norm, output]); `--shard-embeddings`), "
            "so the first gather is small and the head's is prefetched"
        )
    return Finding(
        1,
        "first-allgather-exposed",
        "First forward all-gather exposed",
        saw=f"rank {rank}: the step's first all-gather (the root unit, {unit_bytes / 1e6:.0f} MB, "
        f"{unit_bytes / block_bytes:.1f}x a block's) is exposed for {_ms(exposed)} per step "
        f"({_pct(exposed / step)} of the step, waiting for peers excluded; threshold "
        f"{_pct(FIRST_AG_EXPOSED)})",
        why="nothing can hide the first gather of a step; one is expected, but a root unit that "
        "carries the embeddings and the output head makes it several blocks long",
        change=change,
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
        cost = ctx.crossrank.without_waiting(r.rank, same)
        transfer = float(cost["transfer_us"].median())
        exposed = float(cost["exposed_us"].fillna(0.0).median())  # CPU traces: no overlap
        step = ctx.step_us(r)
        if transfer >= REGATHER_MIN * step and (worst is None or transfer > worst[3]):
            matched = bool(cost["matched"].all())
            worst = (r.rank, same["block"].iloc[0], exposed, transfer, step, matched)
    if worst is None:
        return None
    rank, unit, exposed, transfer, step, matched = worst
    if ctx.setting("keep_last_unsharded"):
        change = (
            f"`--keep-last-unsharded` is set, yet {unit} is gathered again: keep the unit that "
            f"forward runs last unsharded (reshard_after_forward=False on {unit})"
        )
    else:
        change = (
            f"reshard_after_forward=False on the last unit ({unit}; `--keep-last-unsharded`, "
            "as torchtitan does)"
        )
    return Finding(
        2,
        "last-unit-regathered",
        "Last unit re-gathered at the start of backward",
        saw=f"rank {rank}: {unit}, the last unit of forward, is all-gathered again as the "
        f"first gather of backward: {_ms(transfer)} per step ({_pct(transfer / step)} of the "
        f"step; {_timing_note(matched)}; threshold {_pct(REGATHER_MIN)}), {_ms(exposed)} of it "
        "exposed",
        why="backward needs the last unit at once, so resharding it after forward frees its "
        "memory only for a moment and costs a gather (link time, and SMs and memory bandwidth "
        "taken from compute while it runs)",
        change=change,
        severity=(exposed + 0.1 * transfer) / step,
        metrics={"rank": rank, "unit": unit, "exposed_us": exposed, "transfer_us": transfer},
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
        cost = ctx.crossrank.without_waiting(r.rank, tail)
        per_step = (
            cost["exposed_us"]
            .groupby(tail["step"])
            .sum()
            .reindex(last_compute.index, fill_value=0.0)
        )
        count = tail.groupby("step").size().reindex(last_compute.index, fill_value=0)
        exposed, step = float(per_step.median()), ctx.step_us(r)
        if exposed >= RS_TAIL * step and (worst is None or exposed > worst[1]):
            units = ", ".join(dict.fromkeys(tail["block"].astype(str)))
            raw = float(
                tail.groupby("step")["exposed_us"].sum().reindex(last_compute.index).median()
            )
            worst = (r.rank, exposed, step, float(count.median()), units, raw)
    if worst is None:
        return None
    rank, exposed, step, count, units, raw = worst
    knobs = []
    if not ctx.setting("shard_embeddings"):
        knobs.append(
            "shard the embeddings and head as their own units (`--shard-embeddings`) so the "
            "last gradient to reduce is one small unit's"
        )
    reduce_dtype = str(
        ctx.setting("reduce_dtype")
        or ctx.parallel().get("mixed_precision", {}).get("reduce_dtype")
        or ""
    )
    if reduce_dtype not in ("bf16", "bfloat16"):
        knobs.append("reduce in bf16 (`--reduce-dtype bf16`, MixedPrecisionPolicy): half the bytes")
    change = (
        "; ".join(knobs)
        if knobs
        else "the knobs that shrink the tail are already set (`--shard-embeddings`, bf16 "
        f"reduction): what remains is the first unit's gradient ({units}); keep that unit small"
    )
    return Finding(
        3,
        "reduce-scatter-tail",
        "Reduce-scatter tail exposed at the end of backward",
        saw=f"rank {rank}: {count:g} reduce-scatter(s) ({units}) still run after the last "
        f"backward kernel, {_ms(exposed)} exposed per step ({_pct(exposed / step)}; threshold "
        f"{_pct(RS_TAIL)}; {_ms(raw)} before taking out waiting for peers)",
        why="the optimizer waits for every gradient; about one reduce-scatter at the end is "
        "unavoidable, more than that (or a large one) is time the GPU only waits",
        change=change,
        severity=exposed / step,
        metrics={"rank": rank, "exposed_us": exposed, "count": count, "raw_exposed_us": raw},
    )


def communication_bound(ctx: Context) -> Finding | None:
    """4. A block's all-gather takes longer than the compute it could hide behind.

    Both sides are taken without interference: the gather is the cross-rank transfer time
    (no waiting), the compute the fastest rank's (a rank whose NCCL kernels spin while they
    wait for a late peer computes measurably slower beside them)."""
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
            & b["block"].isin(ctx.block_units(b["block"]))
            & b["phase"].isin(["forward", "backward"])
        ]
        for row in b.itertuples():
            gather = row.time_us_per_step / max(row.count_per_step, 1)
            if transfer is not None and (row.block, row.phase) in transfer.index:
                gather = float(transfer.loc[(row.block, row.phase)])
            rows.append((r.rank, row.block, row.phase, gather, row.compute_us_per_step))
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
    knobs = ["a larger local batch or sequence"]
    if float(ctx.setting("ac_coverage") or 0.0) < 1.0:
        knobs.append(
            "activation checkpointing (recompute gives backward gathers work to hide behind, "
            "`--ac-coverage`)"
        )
    knobs.append("fewer and larger units")
    if ctx.setting("reshard_after_forward") is not False:
        knobs.append(
            "reshard_after_forward=False or an int group size (`--reshard-after-forward`) to "
            "drop or shrink the backward gathers"
        )
    return Finding(
        4,
        "communication-bound",
        "Communication-bound blocks",
        saw=f"{bound_units} of {units} blocks gather their parameters for at least "
        f"{COMM_BOUND_RATIO:g}x as long as they compute (worst: {worst[0]} {worst[1]}, "
        f"all-gather {_ms(g)} vs {_ms(c)} of compute, {g / c:.1f}x; gathers are "
        + ("cross-rank transfer times" if transfer is not None else "kernel durations")
        + f", compute the fastest rank's); together {_ms(excess)} per step "
        f"({_pct(excess / step)}) no prefetch can hide",
        why="prefetching can only hide a gather behind the neighbouring block's compute; when "
        "the gather is longer, the difference is exposed on every block",
        change="more compute per gather: " + ", ".join(knobs),
        severity=excess / step,
        metrics={
            "bound_units": bound_units,
            "units": units,
            "worst": f"{worst[0]} {worst[1]}",
            "ratio": float(g / c),
        },
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
    knobs = [] if ctx.setting("compile") else ["torch.compile the blocks (`--compile`)"]
    knobs += [
        "fewer and larger FSDP units",
        "a fused/foreach optimizer",
        "explicit prefetch",
        "a larger batch per step",
    ]
    return Finding(
        5,
        "host-bound",
        "Host-bound: the GPU waits for the CPU",
        saw=f"rank {rank}: the GPU is idle {_pct(idle)} of the step (median over steps; "
        f"threshold {_pct(HOST_IDLE)}), running {per_step:.0f} compute kernels per step of "
        f"{mean_us:.0f} µs on average",
        why="with no communication or compute running, the GPU waits for the host to launch "
        "work (Python, FSDP hooks, the optimizer, data loading)",
        change="launch less from the host: "
        + ", ".join(knobs)
        + "; check the optimizer's and the data loader's CPU time",
        severity=idle,
        metrics={"rank": rank, "idle_pct": 100 * idle, "kernels_per_step": per_step},
    )


def redundant_collectives(ctx: Context) -> Finding | None:
    """6. More all-gathers (or reduce-scatters) per unit and optimizer step than the reshard
    setting implies."""
    frames = [r.blocks for r in ctx.gpu_ranks if not r.blocks.empty]
    if not frames:
        return None
    b = pd.concat(frames)
    extra = b[b["collective"].isin(["AllGather", "ReduceScatter"]) & (b["excess"] > 0)]
    extra = extra.drop_duplicates(["rank", "block", "collective"])
    if extra.empty:
        return None
    micro = int(ctx.parallel().get("grad_accum", 1) or 1)
    saw, changes = [], []
    ag = extra[extra["collective"] == "AllGather"].sort_values("excess", ascending=False)
    rs = extra[extra["collective"] == "ReduceScatter"].sort_values("excess", ascending=False)
    if len(ag):
        worst = ag.iloc[0]
        saw.append(
            f"{ag['block'].nunique()} units all-gather {worst['unit_count_per_step']:g} times per "
            f"step where the reshard setting implies {worst['expected_per_step']:g} (e.g. "
            f"{worst['block']})"
        )
    if len(rs):
        worst_rs = rs.iloc[0]
        saw.append(
            f"{rs['block'].nunique()} units reduce-scatter {worst_rs['unit_count_per_step']:g} "
            f"times per step where 1 suffices (e.g. {worst_rs['block']})"
        )
    if micro > 1:
        saw.append(f"gradient accumulation over {micro} micro-batches repeats them per micro-batch")
        if len(ag):
            changes.append(
                "keep parameters unsharded across micro-batches: set_reshard_after_backward("
                "False) (and reshard_after_forward=False) on non-final micro-batches, or fewer "
                "and larger micro-batches"
            )
        if len(rs) and not ctx.setting("accum_no_sync"):
            changes.append(
                "call set_requires_gradient_sync(False) on all but the last micro-batch "
                f"(`--accum-no-sync`): one reduce-scatter per step instead of {micro}"
            )
        elif len(rs):
            changes.append(
                "`--accum-no-sync` is set, yet gradients are reduced per micro-batch: check that "
                "set_requires_gradient_sync(False) reaches every FSDP unit, not only the root"
            )
    else:
        saw.append("parameters are gathered outside the normal forward/backward")
        changes.append(
            "look for reentrant checkpointing around FSDP units (use non-reentrant), "
            "parameters touched outside forward (weight tying, regularisers, "
            "model.unshard()), or nested FSDP units gathering twice"
        )
    first = ag.iloc[0] if len(ag) else rs.iloc[0]
    return Finding(
        6,
        "redundant-collectives",
        "Redundant all-gathers" if len(ag) else "Redundant reduce-scatters",
        saw="; ".join(saw),
        why="each extra gather moves the unit's parameters again, each extra reduce-scatter its "
        "gradients, on the same streams the next prefetch and reduction need",
        change="; ".join(changes),
        severity=float(
            (extra["time_us_per_step"] * extra["excess"] / extra["unit_count_per_step"]).sum()
        )
        / max(ctx.median_step_us(), 1.0),
        metrics={
            "units": int(extra["block"].nunique()),
            "count": float(first["unit_count_per_step"]),
            "expected": float(first["expected_per_step"]),
            "rs_count": float(rs.iloc[0]["unit_count_per_step"]) if len(rs) else None,
        },
    )


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
    comm = k[k["kind"] == "comm"]
    blocks = ctx.block_units(k["block"])
    compute = k[
        (k["kind"] == "compute")
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


def overlap_tax(ctx: Context) -> Finding | None:
    """7. The same compute op runs measurably slower while NCCL runs beside it, and that
    costs a noticeable share of the step."""
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
    rank, cost, added, ops, n_steps, step = worst
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
    prefetch = max(
        int(ctx.setting("prefetch_forward") or 0), int(ctx.setting("prefetch_backward") or 0)
    )
    if prefetch > 1:
        knobs.append(
            f"prefetch one unit ahead instead of {prefetch} (`--prefetch-forward/-backward 1`)"
        )
    knobs.append("or overlap with less bandwidth-hungry compute")
    return Finding(
        7,
        "overlap-tax",
        "Overlap tax: compute slows down next to NCCL",
        saw=f"rank {rank}: {len(ops)} block ops run {100 * slowdown:.0f} % slower beside NCCL "
        f"than the same ops alone (time-weighted; {_ms(beside)} per step of such compute), "
        f"adding {_ms(added)} per step ({_pct(cost)} of the step; threshold {_pct(TAX_COST)}). "
        f"Largest: {examples}",
        why="NCCL kernels take SMs and memory bandwidth from the GEMMs they overlap (about "
        "19 % on average in arXiv 2507.03114): hidden communication is not free",
        change="; ".join(knobs),
        severity=cost,
        metrics={"rank": rank, "slowdown": slowdown, "added_us": added, "cost": cost},
    )


def low_bus_bandwidth(ctx: Context) -> Finding | None:
    """8. Large collectives reach far less bus bandwidth than the interconnect should give."""
    topology = ctx.run.get("environment", {}).get("interconnect", {}).get("summary")
    assumed = ""
    if topology is None:
        names = sorted({n for r in ctx.gpu_ranks for n in r.meta.get("device_names", [])})
        if names and all(NVLINK_PARTS.search(n) for n in names):
            topology = "nvlink"
            assumed = (
                f" (assumed: no topology from run.json, and {', '.join(names)} only comes as "
                "an SXM module on an NVLink board)"
            )
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
        f"median busbw of {busbw:.0f} GB/s ({source}) on {link}{assumed}, where at least "
        f"{floor:.0f} GB/s is expected" + (f"; set: {', '.join(hints)}" if hints else ""),
        why="every exposed microsecond of communication scales with 1/bandwidth; NVLink gives "
        "hundreds of GB/s, PCIe-only pairs about 20 and reach 30–40 % scaling efficiency, not "
        "70 %+",
        change="check the topology (`nvidia-smi topo -m`) and NCCL's transport (NCCL_DEBUG=INFO: "
        "P2P/NVLink vs SHM/NET), unset NCCL_P2P_DISABLE / NCCL_P2P_LEVEL limits, merge small "
        "units into larger messages, and look for a straggler inflating durations",
        severity=1.0 - busbw / floor,
        metrics={
            "busbw_gbps": busbw,
            "floor_gbps": floor,
            "topology": topology,
            "assumed": bool(assumed),
        },
    )


def max_connections_one(ctx: Context) -> Finding | None:
    """9. CUDA_DEVICE_MAX_CONNECTIONS=1 serialises communication with compute (needs run.json:
    the environment is not in the trace)."""
    if ctx.env_vars().get("CUDA_DEVICE_MAX_CONNECTIONS") != "1":
        return None
    overlap = [float(r.steps["overlap_pct"].median()) for r in ctx.gpu_ranks]
    exposed = [float(r.steps["exposed_pct"].median()) for r in ctx.gpu_ranks]
    return Finding(
        9,
        "max-connections-1",
        "CUDA_DEVICE_MAX_CONNECTIONS=1",
        saw="the capture ran with CUDA_DEVICE_MAX_CONNECTIONS=1 (run.json)"
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
    wait_pct = float(others["wait_pct"].median())
    wait_us = float(others["wait_us_per_step"].median())
    if not wait_pct >= 100 * STRAGGLER_WAIT:
        return None
    m = ctx.crossrank.matched
    late = float(m.loc[m["last_rank"] == slow["rank"], "lateness_us"].median())
    rank = int(slow["rank"])
    return Finding(
        10,
        "straggler",
        f"Straggler: rank {rank}",
        saw=f"rank {rank} arrived last at {_pct(slow['arrived_last_share'])} of its "
        f"{int(slow['n_matched'])} matched collectives (median {late / 1e3:.2f} ms late; "
        f"threshold {_pct(STRAGGLER_SHARE)}); the other ranks wait {_ms(wait_us)} per step for "
        f"it inside NCCL kernels ({wait_pct:.1f} % of the step, medians over steps; threshold "
        f"{_pct(STRAGGLER_WAIT)})",
        why="a collective ends when its last rank arrives: every other rank's NCCL kernel "
        "includes that wait, so the slowest rank sets the pace of all",
        change=f"look at rank {rank}'s host: data loading, CPU contention or affinity, thermals "
        "or clocks, a different GPU; compare its step time and idle share with the others'",
        severity=wait_pct / 100,
        metrics={
            "rank": rank,
            "share": float(slow["arrived_last_share"]),
            "wait_us_per_step": wait_us,
            "wait_pct": wait_pct,
        },
    )


def profiler_distortion(ctx: Context) -> Finding | None:
    """11. The detailed (record_shapes + with_stack) step is much slower than the timing ones,
    and slower than every one of them (not just the run's own step-to-step spread)."""
    slowest = {
        r.rank: float(r.steps["step_us"].max()) for r in ctx.analysis.ranks if not r.steps.empty
    }
    items = [
        d
        for d in ctx.analysis.distortion()
        if d["slowdown_pct"] >= 100 * DISTORTION
        and d["detailed_step_us"] > slowest.get(d["rank"], np.inf)
    ]
    if not items:
        return None
    worst = max(items, key=lambda d: d["slowdown_pct"])
    return Finding(
        11,
        "profiler-distortion",
        "Profiler distortion in the detailed step",
        saw=f"rank {worst['rank']}: the detailed step took {_ms(worst['detailed_step_us'])} vs "
        f"{_ms(worst['timing_median_step_us'])} for the timing steps "
        f"({worst['slowdown_pct']:+.0f} %; threshold {100 * DISTORTION:+.0f} %, and beyond the "
        f"slowest timing step, {_ms(slowest[worst['rank']])})",
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
    redundant_collectives,
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
