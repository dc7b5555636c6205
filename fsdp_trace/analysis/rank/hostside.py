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
from collections.abc import Mapping
from itertools import pairwise
from typing import Any

import numpy as np
import pandas as pd

from fsdp_trace.analysis import classify
from fsdp_trace.analysis import intervals as iv
from fsdp_trace.analysis.rank.context import CpuContext, EventRows, ThreadKeys, name_mask
from fsdp_trace.analysis.results import HostTime
from fsdp_trace.analysis.table import array_of

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
    cpu: EventRows,
    cpu_kinds: np.ndarray,
    cpu_ctx: CpuContext,
    kernels: Mapping[str, Any],
    launch_thread: np.ndarray,
    windows: pd.DataFrame,
    busy: iv.Intervals,
    cpu_steps: pd.DataFrame,
) -> HostTime:
    """From the CPU events (`cpu`, their classify kinds), the kept GPU events with the code
    of each one's launching thread (`kernels`: their columns by name, a frame or arrays), the
    GPU step windows and the busy union."""
    if windows.empty or not len(kernels["ts"]):
        return HostTime()
    keys = cpu_ctx.keys
    codes = keys.codes
    names = cpu["name"]
    ts, end = array_of(cpu, "ts", np.float64), array_of(cpu, "end", np.float64)
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

    main = _main_thread(cpu, cpu_kinds, codes)
    n_steps = len(windows)
    idle, per_step, gap_keys = gaps_per_step(
        windows, busy, kernels, launch_thread, main, keys, unions
    )
    op_rows = np.flatnonzero(is_op)
    op_start, op_end = keys.key(codes[is_op], ts[is_op]), keys.key(codes[is_op], end[is_op])
    own = _self_time(op_start, op_end, time_in_gaps(gap_keys, n_steps, op_start, op_end))
    # Per operator name (sorted, as groupby's), its time in gaps; the top ones by time.
    op_names, totals = _sum_by_name(names, op_rows, own / n_steps)
    positive = np.flatnonzero(totals > 0)
    top = positive[iv.descending_order(totals[positive], kind="quicksort")][:TOP_OPS]
    whole: dict[str, list[float]] = {}
    host_steps: list[float] = []
    if main is not None and not cpu_steps.empty:
        whole, host_steps = main_per_step(cpu_steps, main, keys, unions)
    recorded = cpu_kinds != classify.OTHER
    if cpu_steps.empty:
        events = float(recorded.sum())
    else:
        first = iv.nan_min(array_of(cpu_steps, "cpu_start", np.float64))
        last = iv.nan_max(array_of(cpu_steps, "cpu_end", np.float64))
        events = float((recorded & (ts >= first) & (ts <= last)).sum()) / max(len(cpu_steps), 1)
    return HostTime(
        idle_us=iv.short_median(idle),
        by_category={c: iv.short_median(v) for c, v in per_step.items()},
        top_ops=[[str(op_names[i]), float(totals[i])] for i in top.tolist()],
        events_per_step=events,
        main_by_category={c: iv.short_median(v) for c, v in whole.items() if v},
        host_steps=host_steps,
        optimizer_impl=_optimizer_impl(names, codes, ts, is_op, cpu_ctx),
    )


def gaps_per_step(
    windows: pd.DataFrame,
    busy: iv.Intervals,
    kernels: Mapping[str, Any],
    launch_thread: np.ndarray,
    main: int | None,
    keys: ThreadKeys,
    unions: dict[str, iv.Intervals],
) -> tuple[list[float], dict[str, list[float]], iv.Labelled]:
    """Per step window: its idle time (the window less `busy`), that time by what the host
    thread that launches the kernel ending each gap does meanwhile (a gap no kernel ends is
    `main`'s; `unions`: each category's time as thread keys), and the gaps as thread keys,
    labelled with their step. Every step at once (`iv.*_each`): the same figures to the bit
    as step by step, without a dozen numpy calls per step."""
    n_steps = len(windows)
    k_ts, k_thread = gap_enders(kernels, launch_thread)
    start, end = array_of(windows, "start", np.float64), array_of(windows, "end", np.float64)
    timed = np.flatnonzero(~np.isnan(start) & ~np.isnan(end))  # a window without a time: no gap
    g0, g1, step = iv.subtract_each((start[timed], end[timed]), busy)
    step = timed[step]
    idle = iv.lengths_each(g0, g1, step, n_steps)
    nxt = np.searchsorted(k_ts, g1, side="left")
    thread = np.full(g1.size, -1, dtype=np.int64)  # no kernel ends the gap
    later = nxt < k_ts.size
    thread[later] = k_thread[nxt[later]]
    if main is not None:  # no kernel ends it (the step's last gap): the training loop's
        thread = np.where(thread >= 0, thread, main)
    known = thread >= 0
    gap_keys = iv.union_each(
        keys.key(thread[known], g0[known]), keys.key(thread[known], g1[known]), step[known]
    )
    per_step = _by_category(gap_keys[:2], gap_keys[2], n_steps, unions)
    unknown = iv.lengths_each(g0[~known], g1[~known], step[~known], n_steps)
    per_step["Python"] = [a + b for a, b in zip(per_step["Python"], unknown, strict=True)]
    return idle, per_step, gap_keys


def gap_enders(
    kernels: Mapping[str, Any], launch_thread: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The GPU events that can end a gap (compute and communication: what `busy` is made of),
    by start: their starts and the codes of their launching threads."""
    kind = np.asarray(kernels["kind"])
    ends_gap = (kind == classify.COMPUTE) | (kind == classify.COMM)
    k_ts = np.asarray(kernels["ts"], np.float64)[ends_gap]
    order = np.argsort(k_ts, kind="stable")
    return k_ts[order], launch_thread[ends_gap][order]


def time_in_gaps(
    gap_keys: iv.Labelled, n_steps: int, op_start: np.ndarray, op_end: np.ndarray
) -> np.ndarray:
    """Each operator's time (thread keys) in the gaps, summed over the steps in order. Each
    step reads only the operators its gaps can meet (`StartIndex.meeting`: the same figures
    to the bit), not the whole trace's."""
    out = np.zeros(op_start.size)
    ops = iv.StartIndex(op_start, op_end)
    gap_s, gap_e, gap_step = gap_keys
    bounds = np.searchsorted(gap_step, np.arange(n_steps + 1)).tolist()
    for lo, hi in pairwise(bounds):
        if hi > lo:
            step_gaps = gap_s[lo:hi], gap_e[lo:hi]
            met = ops.meeting(*step_gaps)  # the others' overlap with the gaps is exactly 0
            out[met] += iv.overlap_each(op_start[met], op_end[met], step_gaps)
    return out


def main_per_step(
    cpu_steps: pd.DataFrame, main: int, keys: ThreadKeys, unions: dict[str, iv.Intervals]
) -> tuple[dict[str, list[float]], list[float]]:
    """Per CPU step, the main thread's time by category (`_by_category`), and its own time:
    the step less its waiting for the GPU (synchronization)."""
    cpu_start = array_of(cpu_steps, "cpu_start", np.float64)
    cpu_end = array_of(cpu_steps, "cpu_end", np.float64)
    on_main = np.full(cpu_start.size, main)
    whole = _by_category(
        (keys.key(on_main, cpu_start), keys.key(on_main, cpu_end)),
        np.arange(cpu_start.size),
        cpu_start.size,
        unions,
    )
    own = [
        (stop - start) - waiting
        for start, stop, waiting in zip(
            cpu_start.tolist(), cpu_end.tolist(), whole["synchronization"], strict=True
        )
    ]
    return whole, own


def _by_category(
    intervals: iv.Intervals, labels: np.ndarray, n: int, unions: dict[str, iv.Intervals]
) -> dict[str, list[float]]:
    """Per label 0..n-1 (`labels` ascending, each label's intervals in union form), the time
    of its intervals in each category, given to the first that applies, and what none
    covers ("Python")."""
    out: dict[str, list[float]] = {}
    (s, e), label = intervals, np.asarray(labels, dtype=np.int64)
    timed = ~np.isnan(s) & ~np.isnan(e)  # an interval without a time is in no category
    s, e, label = s[timed], e[timed], label[timed]
    for category in CATEGORIES[:-1]:
        got_s, got_e, row = iv.intersect_each((s, e), unions[category])
        out[category] = iv.lengths_each(got_s, got_e, label[row], n)
        s, e, row = iv.subtract_each((s, e), unions[category])
        label = label[row]
    out["Python"] = iv.lengths_each(s, e, label, n)
    return out


def _sum_by_name(
    names: pd.Series, rows: np.ndarray, values: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """`Series(values).groupby(names[rows]).sum()`: the names sorted (missing ones left out),
    each one's sum as pandas adds it. The loader's name column is grouped by its codes
    (`iv.sorted_category_codes`): no string is read but the names that are there."""
    found = iv.sorted_category_codes(names.array, rows)
    if found is None:
        found = pd.factorize(np.asarray(names.array[rows], dtype=object), sort=True)
    code, uniques = found
    return uniques, iv.group_sum(np.asarray(code, dtype=np.int64), values, len(uniques))


def _optimizer_impl(names: pd.Series, codes, ts, is_op, cpu_ctx: CpuContext) -> str:
    """ "fused" or "foreach" where the optimizer step's operators show it, else ""."""
    inside = np.zeros(len(names), dtype=bool)
    inside[is_op] = cpu_ctx.optimizer.contains(codes[is_op], ts[is_op])
    step = name_mask(names, lambda n: n.startswith("Optimizer.step#"))
    found = iv.sorted_category_codes(names.array, np.flatnonzero(inside | step))
    # The loader's names: each read once, by its code (a name-less row has no name to match).
    step_names = set(found[1].tolist()) if found is not None else set(names.array[inside | step])
    if any(FUSED_STEP.match(str(n)) for n in step_names):
        return "fused"
    if any(FOREACH_STEP.match(str(n)) for n in step_names):
        return "foreach"
    return ""


def _self_time(start_keys: np.ndarray, end_keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Each operator's self time of `values` (in the order given): its own less that of the
    operators directly inside it (same thread; keys keep threads apart). Nesting depth is
    counted from the starts and ends; each operator's parent is the one a level up that
    starts last before it and contains it. Only operators with time are subtracted from
    their parent (a 0 leaves it as it is)."""
    n = start_keys.size
    order = iv.parents_first(start_keys, end_keys)
    s, e = start_keys[order], end_keys[order]
    sorted_values = np.asarray(values, np.float64)[order]
    ends = np.sort(e, kind="stable")  # nearly sorted already: linear, where quicksort is not
    depth = np.maximum(np.arange(n) - np.searchsorted(ends, s, side="right"), 0)
    # Each level's rows, in sorted order (a radix sort: the levels are few).
    by_depth = np.argsort(
        depth.astype(np.int16 if n and depth.max() < 2**15 else np.int64), kind="stable"
    )
    level = np.searchsorted(depth[by_depth], np.arange(int(depth.max()) + 2 if n else 1))
    parent = np.full(n, -1, dtype=np.int64)
    for d in range(1, level.size - 1):
        up = by_depth[level[d - 1] : level[d]]
        child = by_depth[level[d] : level[d + 1]]
        child = child[sorted_values[child] != 0]
        if up.size == 0 or child.size == 0:
            continue
        at = np.searchsorted(s[up], s[child], side="right") - 1
        ok = at >= 0
        cand = up[np.maximum(at, 0)]
        ok &= (e[cand] >= e[child]) & (cand < child)
        parent[child[ok]] = cand[ok]
    out = sorted_values.copy()
    has = parent >= 0
    np.subtract.at(out, parent[has], sorted_values[has])
    result = np.empty(n)
    result[order] = np.maximum(out, 0.0)
    return result


def _main_thread(cpu: EventRows, cpu_kinds: np.ndarray, codes: np.ndarray) -> int | None:
    """The thread code of the training loop: the one holding the ProfilerStep annotations."""
    steps = (cpu_kinds == classify.ANNOTATION) & name_mask(
        cpu["name"], lambda n: n.startswith("ProfilerStep#")
    )
    if not steps.any():
        return None
    return int(iv.mode(codes[steps]))
