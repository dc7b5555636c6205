"""What the host does while its GPU idles: for each gap with nothing on the GPU inside a step,
the thread that launches the kernel ending the gap, and what that thread runs meanwhile, by
category (first that applies): a synchronization (the host waiting for the GPU: stream or
device synchronize, a blocking copy, `.item()`), the optimizer step (whatever runs inside it),
data loading (the DataLoader's events), an FSDP hook, another operator, or nothing recorded
(Python between operators). A gap no later kernel ends (the
step's last, e.g. a host-side optimizer step) is the training loop's: the main thread's. Also
the operators that take the gaps' time themselves (self time: an operator's own, less the
operators it calls), the host's own time per step (the main thread's step less its waiting
for the GPU), whether the optimizer batches its tensors (foreach or fused), and
how many events the profiler recorded per step (its own cost grows with them). Made with the
rank's analysis, from its CPU events and kernels."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from fsdp_trace.analysis import classify
from fsdp_trace.analysis import intervals as iv
from fsdp_trace.analysis.rank.context import CpuContext, name_mask
from fsdp_trace.analysis.results import HostTime

SYNC_NAMES = re.compile(
    r"^(cudaStreamSynchronize|cudaDeviceSynchronize|cudaEventSynchronize|cudaMemcpy|"
    r"cuStreamSynchronize|cuCtxSynchronize|aten::item|aten::_local_scalar_dense)$"
)
OPTIMIZER = re.compile(r"^Optimizer\.(step|zero_grad)#")
FSDP_HOOK = re.compile(r"^FSDP::|^FullyShardedDataParallel\._")  # hooks, not whole forwards
# The training loop fetching a batch:
# `enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__`.
DATA_LOADING = re.compile(r"DataLoader|\.__next__$")
# Inside the optimizer step: a fused (one kernel for all tensors) or foreach implementation.
FUSED_STEP = re.compile(r"^aten::_fused_|^Optimizer\.step#Fused")
FOREACH_STEP = re.compile(r"^aten::_foreach_")
# In the order a gap's time is given to them: a synchronization inside the optimizer step is
# the host waiting, an operator inside an FSDP hook is the hook's.
CATEGORIES = (
    "synchronization",
    "optimizer",
    "data loading",
    "FSDP hooks",
    "other operators",
    "Python",
)
TOP_OPS = 5


def host_time(
    cpu: pd.DataFrame,
    cpu_kinds: np.ndarray,
    cpu_ctx: CpuContext,
    kernels: pd.DataFrame,
    launch_thread: np.ndarray,
    windows: pd.DataFrame,
    busy: iv.Intervals,
    cpu_steps: pd.DataFrame,
) -> HostTime:
    """From the CPU events (`cpu`, their classify kinds), the kept GPU events with the code
    of each one's launching thread, the GPU step windows and the busy union."""
    if windows.empty or kernels.empty:
        return HostTime()
    keys = cpu_ctx.keys
    codes = keys.codes
    names = cpu["name"]
    ts, end = cpu["ts"].to_numpy(np.float64), cpu["end"].to_numpy(np.float64)
    is_op = cpu_kinds == classify.CPU_OP
    masks = {
        "synchronization": name_mask(names, lambda n: bool(SYNC_NAMES.match(n))),
        "optimizer": name_mask(names, lambda n: bool(OPTIMIZER.match(n))),
        "data loading": name_mask(names, lambda n: bool(DATA_LOADING.search(n))),
        "FSDP hooks": name_mask(names, lambda n: bool(FSDP_HOOK.match(n))),
        "other operators": is_op,
    }
    unions = {
        c: iv.union(keys.key(codes[m], ts[m]), keys.key(codes[m], end[m])) for c, m in masks.items()
    }

    # The GPU events that can end a gap (compute and communication: what `busy` is made of).
    kind = kernels["kind"].to_numpy()
    ends_gap = (kind == classify.COMPUTE) | (kind == classify.COMM)
    k_ts = kernels["ts"].to_numpy(np.float64)[ends_gap]
    k_thread = launch_thread[ends_gap]
    order = np.argsort(k_ts, kind="stable")
    k_ts, k_thread = k_ts[order], k_thread[order]

    main = _main_thread(cpu, cpu_kinds, codes)
    per_step: dict[str, list[float]] = {c: [] for c in CATEGORIES}
    idle, op_time = [], np.zeros(len(cpu))
    op_rows = np.flatnonzero(is_op)
    op_start, op_end = keys.key(codes[is_op], ts[is_op]), keys.key(codes[is_op], end[is_op])
    ops = iv.StartIndex(op_start, op_end)
    # Each step reads only the busy time, category time and operators its gaps can meet
    # (`iv.near`, `StartIndex.meeting`: the same figures to the bit), not the whole trace's.
    for start, stop in zip(windows["start"].to_numpy(), windows["end"].to_numpy(), strict=True):
        inside = iv.clip(iv.near(busy, [start], [stop]), float(start), float(stop))
        gaps = iv.subtract((np.array([start], float), np.array([stop], float)), inside)
        idle.append(iv.length(gaps))
        g0, g1 = gaps
        nxt = np.searchsorted(k_ts, g1, side="left")
        thread = np.where(nxt < k_ts.size, k_thread[np.minimum(nxt, max(k_ts.size - 1, 0))], -1)
        if main is not None:  # no kernel ends it (the step's last gap): the training loop's
            thread = np.where(thread >= 0, thread, main)
        known = thread >= 0
        gap_keys = iv.union(keys.key(thread[known], g0[known]), keys.key(thread[known], g1[known]))
        remaining = gap_keys
        for category in CATEGORIES[:-1]:
            got = iv.intersect(remaining, iv.near(unions[category], *remaining))
            per_step[category].append(iv.length(got))
            remaining = iv.subtract(remaining, got)
        per_step["Python"].append(iv.length(remaining) + float(np.sum(g1[~known] - g0[~known])))
        met = ops.meeting(*gap_keys)  # the others' overlap with the gaps is exactly 0
        op_time[op_rows[met]] += iv.overlap_each(op_start[met], op_end[met], gap_keys)
    del ops  # its sorted copies: not held beside what follows
    n_steps = len(windows)
    own = _self_time(op_start, op_end)
    # Per operator name (sorted, as groupby's), its time in gaps; the top ones by time.
    op_names, totals = _sum_by_name(
        np.asarray(names.array[is_op], object), own(op_time[is_op]) / n_steps
    )
    positive = np.flatnonzero(totals > 0)
    top = positive[iv.descending_order(totals[positive], kind="quicksort")][:TOP_OPS]
    whole: dict[str, list[float]] = {c: [] for c in CATEGORIES}
    host_steps: list[float] = []
    if main is not None and not cpu_steps.empty:
        for start, stop in zip(cpu_steps["cpu_start"], cpu_steps["cpu_end"], strict=True):
            remaining = iv.union(
                [keys.key(np.array([main]), float(start))[0]],
                [keys.key(np.array([main]), float(stop))[0]],
            )
            for category in CATEGORIES[:-1]:
                got = iv.intersect(remaining, iv.near(unions[category], *remaining))
                whole[category].append(iv.length(got))
                remaining = iv.subtract(remaining, got)
            whole["Python"].append(iv.length(remaining))
            step_span = float(stop) - float(start)
            host_steps.append(step_span - whole["synchronization"][-1])
    recorded = cpu_kinds != classify.OTHER
    if cpu_steps.empty:
        events = float(recorded.sum())
    else:
        first, last = cpu_steps["cpu_start"].min(), cpu_steps["cpu_end"].max()
        events = float((recorded & (ts >= first) & (ts <= last)).sum()) / max(len(cpu_steps), 1)
    return HostTime(
        idle_us=float(np.median(idle)),
        by_category={c: float(np.median(v)) for c, v in per_step.items()},
        top_ops=[[str(op_names[i]), float(totals[i])] for i in top.tolist()],
        events_per_step=events,
        main_by_category={c: float(np.median(v)) for c, v in whole.items() if v},
        host_steps=host_steps,
        optimizer_impl=_optimizer_impl(names, codes, ts, is_op, cpu_ctx),
    )


def _sum_by_name(names: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`Series(values).groupby(names).sum()`: the names sorted (missing ones left out), each
    one's sum as pandas adds it."""
    code, uniques = pd.factorize(names, sort=True)
    return uniques, iv.group_sum(code.astype(np.int64), values, len(uniques))


def _optimizer_impl(names: pd.Series, codes, ts, is_op, cpu_ctx: CpuContext) -> str:
    """ "fused" or "foreach" where the optimizer step's operators show it, else ""."""
    inside = np.zeros(len(names), dtype=bool)
    inside[is_op] = cpu_ctx.optimizer.contains(codes[is_op], ts[is_op])
    step = name_mask(names, lambda n: n.startswith("Optimizer.step#"))
    step_names = set(names.array[inside | step])
    if any(FUSED_STEP.match(str(n)) for n in step_names):
        return "fused"
    if any(FOREACH_STEP.match(str(n)) for n in step_names):
        return "foreach"
    return ""


def _self_time(start_keys: np.ndarray, end_keys: np.ndarray):
    """A function from each operator's time (in the order given) to its self time: its own
    less that of the operators directly inside it (same thread; keys keep threads apart).
    Nesting depth is counted from the starts and ends; each operator's parent is the one a
    level up that starts last before it and contains it."""
    n = start_keys.size
    order = np.lexsort((-end_keys, start_keys))  # parents before children at equal starts
    s, e = start_keys[order], end_keys[order]
    depth = np.maximum(np.arange(n) - np.searchsorted(np.sort(e), s, side="right"), 0)
    parent = np.full(n, -1, dtype=np.int64)
    for d in range(1, int(depth.max()) + 1 if n else 1):
        up = np.flatnonzero(depth == d - 1)
        child = np.flatnonzero(depth == d)
        if up.size == 0 or child.size == 0:
            continue
        at = np.searchsorted(s[up], s[child], side="right") - 1
        ok = at >= 0
        cand = up[np.maximum(at, 0)]
        ok &= (e[cand] >= e[child]) & (cand < child)
        parent[child[ok]] = cand[ok]

    def own(values: np.ndarray) -> np.ndarray:
        sorted_values = np.asarray(values, np.float64)[order]
        out = sorted_values.copy()
        has = parent >= 0
        np.subtract.at(out, parent[has], sorted_values[has])
        result = np.empty(n)
        result[order] = np.maximum(out, 0.0)
        return result

    return own


def _main_thread(cpu: pd.DataFrame, cpu_kinds: np.ndarray, codes: np.ndarray) -> int | None:
    """The thread code of the training loop: the one holding the ProfilerStep annotations."""
    steps = (cpu_kinds == classify.ANNOTATION) & name_mask(
        cpu["name"], lambda n: n.startswith("ProfilerStep#")
    )
    if not steps.any():
        return None
    return int(iv.mode(codes[steps]))
