"""What a run reads of one rank's kernels, made with the rank's analysis (wherever that runs:
this process, a `--jobs` worker, a Dask worker), so that the per-rank result the run keeps holds
no per-event table (`RankAnalysis.without_kernels`): what travels back from a worker and stays
on the client is bounded by steps, blocks and collectives, not by the trace's kernels.

- the compute half of the step breakdown (`breakdown.kernel_parts`: the steps' model compute
  and FSDP copies; the exposed half needs the cross-rank view and the exposed intervals);
- the overlap tax of the units named like blocks (`overlap_tax.measure`);
- per step, when backward's last compute ends (the gradient-reduction tail);
- how many kernels and compute kernels, and the compute kernels' mean duration (host-bound).

The views that draw or replay kernels (the report's step timeline, what-if, --perfetto) read
them again (`RankAnalysis.load_kernels`)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fsdp_trace.analysis import intervals as iv
from fsdp_trace.analysis.rank import overlap_tax
from fsdp_trace.analysis.rank.breakdown import kernel_parts
from fsdp_trace.analysis.results import RankAnalysis
from fsdp_trace.analysis.table import array_of
from fsdp_trace.vocab import Kind, Phase

KERNEL_TIME_TOP = 50  # kernel names whose compute time per step a rank keeps


def attach(result: RankAnalysis) -> RankAnalysis:
    """`result` (fresh from its trace, its kernels held) with its kernels' figures, in place.
    Nothing for a trace without GPU kernels (CPU/gloo): the defaults say so."""
    k = result.kernel_table
    if k is None or k.empty or "fsdp" not in k:
        return result
    result.steps = result.steps.assign(**kernel_parts(k, result.steps))
    # Each figure from arrays of the compute kernels (a pandas step costs ~1 ms on any size).
    is_compute = array_of(k, "kind") == Kind.COMPUTE
    dur = array_of(k, "dur", np.float64)[is_compute]
    result.n_kernels = len(k)
    result.n_compute = int(is_compute.sum())
    result.compute_mean_us = iv.mean(dur) if dur.size else None
    result.kernel_time = _kernel_time(k["name"], is_compute, dur, max(len(result.steps), 1))
    result.backward_end = _backward_end(k, is_compute)
    result.op_blocks = overlap_tax.op_blocks(k)
    result.op_tax_blocks = [b for b in result.op_blocks if overlap_tax.block_like(b)]
    ops = overlap_tax.measure(k, set(result.op_tax_blocks), overlap_tax.moving(result.collectives))
    if "slowdown" in ops:  # measured (OP_TAX_COLUMNS); else the result's empty table stays
        result.op_tax = ops
    return result


def _kernel_time(
    name: pd.Series, rows: np.ndarray, dur: np.ndarray, n_steps: int
) -> dict[str, float]:
    """The `KERNEL_TIME_TOP` kernel names of most compute time, per step, among the kernels
    at `rows` (their durations `dur`): `groupby(names)["dur"].sum()` (names sorted as text, a
    missing one as "nan"), `sort_values(ascending=False).head(KERNEL_TIME_TOP)`. The loader's
    name column is grouped by its codes (`iv.sorted_category_codes`), no string made a kernel."""
    found = iv.sorted_category_codes(name.array, rows)
    if found is not None and found[1].size and (found[0] >= 0).all():
        code, uniques = found
    else:
        code, uniques = pd.factorize(name.astype(str).to_numpy()[rows], sort=True)
    per_name = iv.group_sum(code, dur, len(uniques))
    top = iv.descending_order(per_name, kind="quicksort")[:KERNEL_TIME_TOP]
    return {str(uniques[i]): float(v) for i, v in zip(top, per_name[top] / n_steps, strict=True)}


def _backward_end(k: pd.DataFrame, is_compute: np.ndarray) -> pd.DataFrame:
    """Per step with backward (or recompute) compute, when its last such kernel ends:
    `groupby("step")["end"].max()` as a frame (step, end_us)."""
    phases = [Phase.BACKWARD.value, Phase.RECOMPUTE.value]
    backward = is_compute & np.isin(array_of(k, "phase"), phases)
    steps, where = iv.unique(array_of(k, "step")[backward], return_inverse=True)
    last = iv.group_max(where, array_of(k, "end", np.float64)[backward], steps.size)
    return pd.DataFrame({"step": steps.astype(np.int64), "end_us": last})


def backward_end(rank: RankAnalysis) -> pd.Series:
    """Per step with backward (or recompute) compute, when its last such kernel ends (µs),
    indexed by step."""
    frame = rank.backward_end
    return pd.Series(
        array_of(frame, "end_us", np.float64),
        index=pd.Index(array_of(frame, "step", np.int64), name="step"),
        name="end",
    )
