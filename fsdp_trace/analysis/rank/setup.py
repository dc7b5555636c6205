"""What a trace comes from beyond the FSDP2 configuration: the data-parallel wrapper (FSDP2's
`fully_shard`, the FSDP1 class, DDP), CPU offload and float8 training. Read per rank from the
names each leaves in the trace (trace-facts.md, "Set-ups that are not plain FSDP2") and the
work it puts on the GPU (`Signals`, made with the rank's analysis); decided per run (`infer`)
and said in the inferred configuration with its evidence, so that no rule holds a DDP run to
FSDP's expectations or reads a float8 cast as recompute."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from fsdp_trace.analysis import classify
from fsdp_trace.analysis import intervals as iv
from fsdp_trace.analysis.rank import steps as steps_mod
from fsdp_trace.analysis.rank.context import CpuContext, EventRows, ThreadUnion, name_mask
from fsdp_trace.analysis.results import Signals
from fsdp_trace.analysis.table import array_of
from fsdp_trace.vocab import Parallelism, Phase

# The wrappers' own record_function names (torch 2.11; trace-facts.md).
FSDP1_PREFIX = "FullyShardedDataParallel."
DDP_FORWARD = "DistributedDataParallel.forward"
OPTIMIZER_PREFIX = "Optimizer.step#"
# FSDP2's CPUOffloadPolicy: each unit's sharded parameters come from pinned host memory before
# its all-gather, its gradient shards go back after its reduce-scatter.
HOST_TO_DEVICE = "Memcpy HtoD (Pinned -> Device)"
DEVICE_TO_HOST = "Memcpy DtoH (Device -> Pinned)"
# torchao float8 training: its GEMM and the CPU ops around the casts of weights, activations
# and gradients to float8 (each with its amax).
FLOAT8_GEMM = "aten::_scaled_mm"
FLOAT8_REGION = re.compile(r"float8|Float8|_scaled_mm")


def _per_step(values: np.ndarray, step_of: np.ndarray, steps: np.ndarray) -> float:
    """Median over `steps` of the per-step sums of `values` (steps with none count 0)."""
    if steps.size == 0:
        return 0.0
    per_step = np.zeros(steps.size, dtype=np.float64)  # `groupby(step_of).sum()`, reindexed
    if step_of.size:
        present, where = iv.unique(step_of, return_inverse=True)
        sums = iv.groupby_sum(where.reshape(-1), values, present.size)
        at = np.minimum(np.searchsorted(present, steps), present.size - 1)
        found = present[at] == steps
        per_step[found] = sums[at[found]]
    return iv.short_median(per_step)


def _union_per_step(
    ts: np.ndarray, end: np.ndarray, step_of: np.ndarray, steps: np.ndarray, cover=None
) -> float:
    """Median over steps of the union length of the intervals of each step (minus `cover`)."""
    if steps.size == 0 or ts.size == 0:
        return 0.0
    # Each step's rows (in their order) as one run of a stable sort, and of `cover` only what
    # they can meet (`iv.near`): the same lengths, without reading every row at every step.
    order = np.argsort(step_of, kind="stable")
    firsts = np.searchsorted(step_of[order], steps, side="left").tolist()
    lasts = np.searchsorted(step_of[order], steps, side="right").tolist()
    lengths = []
    for first, last in zip(firsts, lasts, strict=True):
        mine = order[first:last]
        u = iv.union(ts[mine], end[mine])
        if cover is not None:
            u = iv.subtract(u, iv.near(cover, *u))
        lengths.append(iv.length(u))
    return iv.short_median(lengths)


def optimizer_ends(cpu: EventRows, cpu_steps: pd.DataFrame) -> pd.Series:
    """Per step, when its last optimizer step (`Optimizer.step#…`) ends on the host."""
    is_opt = name_mask(cpu["name"], lambda n: n.startswith(OPTIMIZER_PREFIX))
    if not is_opt.any() or cpu_steps.empty:
        return pd.Series(dtype=np.float64)
    ends = array_of(cpu, "end")[is_opt]
    step = steps_mod.step_of_time(cpu_steps, array_of(cpu, "ts")[is_opt])
    steps, where = iv.unique(step[step >= 0], return_inverse=True)  # groupby(step).max()
    return pd.Series(iv.group_max(where, ends[step >= 0], steps.size), index=steps)


def label_signals(cpu: EventRows, cpu_ctx: CpuContext, steps: int) -> Signals:
    """The wrappers' labels alone (a CPU/gloo trace: no GPU work to read)."""
    names = cpu["name"]
    return Signals(
        steps=steps,
        fsdp2_labels=len(cpu_ctx.label_table),
        fsdp1_labels=int(name_mask(names, lambda n: n.startswith(FSDP1_PREFIX)).sum()),
        ddp_forwards=int(name_mask(names, lambda n: n == DDP_FORWARD).sum()),
    )


def signals(
    cpu: EventRows,
    cpu_ctx: CpuContext,
    cpu_steps: pd.DataFrame,
    kernels: Mapping[str, Any],
    launch_thread: np.ndarray,
    busy: iv.Intervals,
    compute: iv.Intervals,
) -> Signals:
    """A rank's set-up evidence from its CPU events (`cpu`: operators, annotations,
    launches), its kept GPU events (`kernels`, their columns by name, a frame or arrays: kind,
    name, step, times, `launch_ts`, phase), the thread code of each one's launch, and the
    unions of busy and compute GPU time."""
    names = cpu["name"]
    step_of = np.asarray(kernels["step"])
    steps = iv.unique(step_of) if step_of.size else np.empty(0, np.int64)
    n_steps = max(int(steps.size), 1)
    kind = np.asarray(kernels["kind"])
    ts, end = np.asarray(kernels["ts"], np.float64), np.asarray(kernels["end"], np.float64)

    gemm = name_mask(names, lambda n: n == FLOAT8_GEMM)
    cast_us = cast_kernels = 0.0
    if gemm.any():
        keys, code = cpu_ctx.keys, cpu_ctx.keys.codes  # one code per row of `cpu`
        region = name_mask(names, lambda n: bool(FLOAT8_REGION.search(n)))
        t0, t1 = array_of(cpu, "ts"), array_of(cpu, "end")
        in_region = ThreadUnion(keys, code[region & ~gemm], t0[region & ~gemm], t1[region & ~gemm])
        in_gemm = ThreadUnion(keys, code[gemm], t0[gemm], t1[gemm])
        launch = np.asarray(kernels["launch_ts"], np.float64)
        known = np.isfinite(launch)
        cast = np.zeros(kind.size, dtype=bool)
        at = np.nan_to_num(launch[known])
        cast[known] = in_region.contains(launch_thread[known], at) & ~in_gemm.contains(
            launch_thread[known], at
        )
        cast &= kind == classify.COMPUTE
        cast_us = _union_per_step(ts[cast], end[cast], step_of[cast], steps)
        cast_kernels = float(cast.sum()) / n_steps

    copies = kind == classify.MEMCPY
    h2d = copies & name_mask(kernels["name"], lambda n: n == HOST_TO_DEVICE)
    d2h = copies & name_mask(kernels["name"], lambda n: n == DEVICE_TO_HOST)
    offload = h2d | d2h

    opt_cpu = opt_gpu = opt_idle = 0.0
    is_opt = name_mask(names, lambda n: n.startswith(OPTIMIZER_PREFIX))
    if is_opt.any() and not cpu_steps.empty:
        o_ts, o_end = array_of(cpu, "ts")[is_opt], array_of(cpu, "end")[is_opt]
        o_step = steps_mod.step_of_time(cpu_steps, o_ts)
        inside = np.isin(o_step, steps)
        opt_cpu = _per_step(o_end[inside] - o_ts[inside], o_step[inside], steps)
        idle = [
            (e - s) - iv.length(iv.clip(iv.near(busy, [s], [e]), s, e))
            for s, e in zip(o_ts[inside], o_end[inside], strict=True)
        ]
        opt_idle = _per_step(np.asarray(idle, dtype=np.float64), o_step[inside], steps)
        in_opt = (np.asarray(kernels["phase"]) == Phase.OPTIMIZER) & (kind == classify.COMPUTE)
        opt_gpu = _union_per_step(ts[in_opt], end[in_opt], step_of[in_opt], steps)

    return dataclasses.replace(
        label_signals(cpu, cpu_ctx, int(steps.size)),
        float8_gemms=float(gemm.sum()) / n_steps,
        float8_cast_us=cast_us,
        float8_cast_kernels=cast_kernels,
        h2d_pinned_us=_union_per_step(ts[h2d], end[h2d], step_of[h2d], steps),
        d2h_pinned_us=_union_per_step(ts[d2h], end[d2h], step_of[d2h], steps),
        offload_copies_exposed_us=_union_per_step(
            ts[offload], end[offload], step_of[offload], steps, cover=compute
        ),
        optimizer_cpu_us=opt_cpu,
        optimizer_gpu_us=opt_gpu,
        optimizer_idle_us=opt_idle,
    )


# --- the run's set-up -------------------------------------------------------------------------

# Of a run's ranks, at least this share must show a set-up's signal for the run to have it
# (a rank whose trace lost its CPU side does not veto it).
AGREE = 0.5
# CPU offload: pinned copies both ways, and an optimizer step that leaves the GPU idle at least
# as long as the copies take (the optimizer runs on the host).
OFFLOAD_MIN_COPY_US = 1.0


@dataclass(frozen=True)
class SetUp:
    """The set-up of one run, each part with where it came from and what showed it."""

    parallelism: str  # a Parallelism
    parallelism_evidence: str
    cpu_offload: bool = False
    cpu_offload_evidence: str = ""
    float8: bool = False
    float8_evidence: str = ""

    def describe(self) -> str:
        """`FSDP2 (fully_shard), CPU offload` / `DDP (DistributedDataParallel)` ..."""
        words = {
            Parallelism.FSDP2: "FSDP2 (fully_shard)",
            Parallelism.FSDP1: "FSDP1 (the FullyShardedDataParallel class)",
            Parallelism.DDP: "DDP (DistributedDataParallel)",
            Parallelism.NONE: "no data-parallel wrapper seen",
        }
        parts = [words[Parallelism(self.parallelism)]]
        if self.cpu_offload:
            parts.append("CPU offload")
        if self.float8:
            parts.append("float8 training")
        return ", ".join(parts)

    @property
    def fsdp(self) -> bool:
        """Parameters are sharded (FSDP2 or FSDP1): all-gathers and reduce-scatters."""
        return self.parallelism in (Parallelism.FSDP2, Parallelism.FSDP1)


def _share(ranks: list[Signals], test) -> float:
    return sum(1 for s in ranks if test(s)) / len(ranks) if ranks else 0.0


def infer(signals_of_ranks: list[Signals], run_parallelism: str | None = None) -> SetUp:
    """The run's set-up from its ranks' signals (`run_parallelism`: what run.json says, for
    a capture of fsdp-trace's own, always FSDP2)."""
    s = signals_of_ranks
    n = len(s)
    if run_parallelism is not None:
        parallelism, evidence = run_parallelism, "run.json: captured with `fully_shard`"
    elif _share(s, lambda x: x.fsdp2_labels > 0) >= AGREE:
        per = int(np.median([x.fsdp2_labels for x in s]))
        parallelism = Parallelism.FSDP2
        evidence = f"FSDP:: labels ({per} per trace, median of {n})"
    elif _share(s, lambda x: x.fsdp1_labels > 0) >= AGREE:
        per = int(np.median([x.fsdp1_labels for x in s]))
        parallelism = Parallelism.FSDP1
        evidence = f"FullyShardedDataParallel.* labels ({per} per trace), no FSDP:: labels"
    elif _share(s, lambda x: x.ddp_forwards > 0) >= AGREE:
        parallelism = Parallelism.DDP
        evidence = f"{DDP_FORWARD} labels, no FSDP labels"
    else:
        parallelism = Parallelism.NONE
        evidence = "no FSDP2, FSDP1 or DDP labels in the traces"

    def offloads(x: Signals) -> bool:
        return (
            x.h2d_pinned_us >= OFFLOAD_MIN_COPY_US
            and x.d2h_pinned_us >= OFFLOAD_MIN_COPY_US
            and x.optimizer_gpu_us < x.optimizer_cpu_us / 10
        )

    offload = parallelism == Parallelism.FSDP2 and _share(s, offloads) >= AGREE
    offload_evidence = ""
    if offload:
        med = {
            k: float(np.median([getattr(x, k) for x in s]))
            for k in ("h2d_pinned_us", "d2h_pinned_us", "optimizer_cpu_us", "optimizer_gpu_us")
        }
        offload_evidence = (
            f"pinned host↔device copies every step ({med['h2d_pinned_us'] / 1e3:.2f} ms to the "
            f"GPU, {med['d2h_pinned_us'] / 1e3:.2f} ms back, median per step) and an optimizer "
            f"step of {med['optimizer_cpu_us'] / 1e3:.1f} ms on the host with "
            f"{med['optimizer_gpu_us'] / 1e3:.2f} ms of GPU work"
        )
    float8 = _share(s, lambda x: x.float8_gemms > 0) >= AGREE
    float8_evidence = ""
    if float8:
        gemms = float(np.median([x.float8_gemms for x in s]))
        casts = float(np.median([x.float8_cast_kernels for x in s]))
        float8_evidence = (
            f"{gemms:.0f} float8 GEMMs ({FLOAT8_GEMM}) and {casts:.0f} cast/amax kernels per "
            "step (median over ranks)"
        )
    return SetUp(parallelism, evidence, offload, offload_evidence, float8, float8_evidence)
