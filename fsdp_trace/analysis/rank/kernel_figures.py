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

from fsdp_trace.analysis.rank import overlap_tax
from fsdp_trace.analysis.rank.breakdown import kernel_parts
from fsdp_trace.analysis.results import OP_TAX_COLUMNS, RankAnalysis
from fsdp_trace.vocab import Kind, Phase

KERNEL_TIME_TOP = 50  # kernel names whose compute time per step a rank keeps


def attach(result: RankAnalysis) -> RankAnalysis:
    """`result` (fresh from its trace, its kernels held) with its kernels' figures, in place.
    Nothing for a trace without GPU kernels (CPU/gloo): the defaults say so."""
    k = result.kernel_table
    if k is None or k.empty or "fsdp" not in k:
        return result
    result.steps = result.steps.assign(**kernel_parts(k, result.steps))
    compute = k[k["kind"] == Kind.COMPUTE]
    result.n_kernels = len(k)
    result.n_compute = len(compute)
    result.compute_mean_us = float(compute["dur"].mean()) if len(compute) else None
    per_name = compute.groupby(compute["name"].astype(str), observed=True)["dur"].sum()
    top = per_name.sort_values(ascending=False).head(KERNEL_TIME_TOP) / max(len(result.steps), 1)
    result.kernel_time = {str(k): float(v) for k, v in top.items()}
    backward = compute[compute["phase"].isin([Phase.BACKWARD, Phase.RECOMPUTE])]
    last = backward.groupby("step")["end"].max()
    result.backward_end = pd.DataFrame(
        {"step": last.index.to_numpy(dtype=np.int64), "end_us": last.to_numpy(dtype=np.float64)}
    )
    result.op_blocks = overlap_tax.op_blocks(k)
    result.op_tax_blocks = [b for b in result.op_blocks if overlap_tax.block_like(b)]
    ops = overlap_tax.measure(k, set(result.op_tax_blocks), overlap_tax.moving(result.collectives))
    result.op_tax = (
        ops.reset_index()[OP_TAX_COLUMNS]
        if "slowdown" in ops
        else pd.DataFrame(columns=OP_TAX_COLUMNS)
    )
    return result


def backward_end(rank: RankAnalysis) -> pd.Series:
    """Per step with backward (or recompute) compute, when its last such kernel ends (µs),
    indexed by step."""
    frame = rank.backward_end
    return pd.Series(
        frame["end_us"].to_numpy(dtype=np.float64),
        index=pd.Index(frame["step"].to_numpy(dtype=np.int64), name="step"),
        name="end",
    )
