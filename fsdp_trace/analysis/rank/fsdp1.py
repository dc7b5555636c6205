"""FSDP1's collectives attributed to its units. The `FullyShardedDataParallel` class labels its
hooks without a module path, so units are told apart by order within each step (torch 2.11,
checked on real traces): forward enters each unit's `FullyShardedDataParallel.forward` in
forward order, the root's enclosing the others (unit 0, `root`; then `unit 1`…`unit N`);
backward runs `_pre_backward_hook` for the root, then the units last to first, each one's
`_pre_backward_prefetch` gathering the unit after it in that order; `_post_backward_hook`
reduce-scatters the units last to first, the root's last. A gather inside a unit's forward is
that unit's."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fsdp_trace.analysis.rank import steps as steps_mod
from fsdp_trace.analysis.rank.context import EventRows, ThreadKeys, name_mask
from fsdp_trace.analysis.table import array_of
from fsdp_trace.vocab import ROOT, Phase

PREFIX = "FullyShardedDataParallel."


def unit_name(index: int) -> str:
    """`root` for the outermost unit, `unit K` for the K-th unit forward enters after it."""
    return ROOT if index == 0 else f"unit {index}"


def _inside(lab: pd.DataFrame, thread: np.ndarray, time: np.ndarray) -> np.ndarray:
    """Per query, the row of `lab` (sorted by start) that contains it on its thread, the
    latest-starting one (the innermost of nested ones); -1: none."""
    if lab.empty or thread.size == 0:
        return np.full(thread.size, -1)
    t0, t1, code = (array_of(lab, c) for c in ("ts", "end", "code"))
    hit = (
        (code[None, :] == thread[:, None])
        & (t0[None, :] <= time[:, None])
        & (time[:, None] <= t1[None, :])
    )
    last = hit.shape[1] - 1 - np.argmax(hit[:, ::-1], axis=1)
    return np.where(hit.any(axis=1), last, -1)


def attribute(
    cpu: EventRows,
    keys: ThreadKeys,
    cpu_steps: pd.DataFrame,
    thread: np.ndarray,
    time: np.ndarray,
) -> tuple[np.ndarray, np.ndarray] | None:
    """The unit and phase of each collective launched by `thread` at `time` (None where no
    FSDP1 hook encloses it); None when the trace has no FSDP1 labels."""
    mask = name_mask(cpu["name"], lambda n: n.startswith(PREFIX))
    if not mask.any() or cpu_steps.empty:
        return None
    ts = array_of(cpu, "ts")[mask]
    lab = pd.DataFrame(
        {
            "kind": np.asarray(cpu["name"].array[mask], dtype=object),
            "ts": ts,
            "end": array_of(cpu, "end")[mask],
            "code": keys.codes[mask],
            "step": steps_mod.step_of_time(cpu_steps, ts),
        }
    )
    lab["kind"] = lab["kind"].str.slice(len(PREFIX))
    block = np.full(thread.size, None, dtype=object)
    phase = np.full(thread.size, None, dtype=object)
    known = np.nan_to_num(time, nan=-np.inf)
    query_step = steps_mod.step_of_time(cpu_steps, known)
    for step, g in lab[lab["step"] >= 0].groupby("step"):
        q = np.flatnonzero((query_step == step) & (thread >= 0))
        if q.size == 0:
            continue
        g = g.sort_values("ts", kind="stable")
        forward = g[g["kind"] == "forward"]
        n = len(forward)
        pre = g[g["kind"] == "_pre_backward_hook"]
        post = g[g["kind"] == "_post_backward_hook"]
        prefetch = g[g["kind"] == "_pre_backward_prefetch"]
        pre_order = [0, *range(n - 1, 0, -1)]  # the root's hook first, then last to first
        post_order = [*range(n - 1, 0, -1), 0]  # the root's reduction last
        qt, qtime = thread[q], known[q]
        in_fwd = _inside(forward, qt, qtime)
        in_pre = _inside(pre, qt, qtime)
        in_prefetch = _inside(prefetch, qt, qtime)
        in_post = _inside(post, qt, qtime)
        units = np.full(q.size, -1)
        units = np.where(in_fwd >= 0, in_fwd, units)
        for i in np.flatnonzero((units < 0) & (in_pre >= 0)):
            j = int(in_pre[i]) + (1 if in_prefetch[i] >= 0 else 0)
            units[i] = pre_order[j] if j < len(pre_order) else -1
        for i in np.flatnonzero((units < 0) & (in_post >= 0)):
            m = int(in_post[i])
            units[i] = post_order[m] if m < len(post_order) else -1
        found = units >= 0
        block[q[found]] = [unit_name(int(u)) for u in units[found]]
        phase[q[found]] = np.where(in_fwd[found] >= 0, Phase.FORWARD.value, Phase.BACKWARD.value)
    return block, phase
