"""One rank's analysis (`RankAnalysis`) and the documented columns of every table.
The run-level result (`fsdp_trace.result`) holds these, one per trace."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import pandas as pd

# Per rank × step (µs unless the name says otherwise). Documented in README "Definitions".
STEP_COLUMNS = [
    "rank",
    "source",
    "step",
    "start_us",
    "end_us",
    "step_us",
    "compute_us",
    "comm_us",
    "overlap_us",
    "exposed_us",
    "exposed_pct",
    "idle_us",
    "idle_pct",
    "overlap_pct",
    "ag_us",
    "rs_us",
    "recompute_us",
    "recompute_pct",
    "n_comm_kernels",
    "n_compute_kernels",
    # The step's breakdown (fsdp_trace.analysis.breakdown): its parts add up to step_us.
    # `model_compute_us` is `compute_us` without FSDP's own kernels and recompute.
    "model_compute_us",
    "fsdp_copy_us",
    "exposed_transfer_us",
    "exposed_wait_us",
    "exposed_unsplit_us",
]
# One row per communication kernel (or CPU collective on gloo traces).
COLLECTIVE_COLUMNS = [
    "rank",
    "source",
    "step",
    "collective",
    "block",
    "phase",
    "issued_by",
    "prefetched",
    "start_us",
    "end_us",
    "dur_us",
    "exposed_us",
    "bytes",
    "group_size",
    "algbw_gbps",
    "busbw_gbps",
    "dtype",
    "pg_name",
    "pg_desc",
    "pg_ranks",
    "seq",
    "stream",
    "correlation",
    "kernel",
    # From the cross-rank match (NaN where the collective matched no other rank's):
    "transfer_us",  # the shortest duration of the collective across its group's ranks
    "wait_us",  # this rank's duration − transfer: waiting for the last rank to arrive
    "exposed_transfer_us",  # the part of [end − transfer, end] no compute hides
]
# Per block × phase × collective, averaged per step over the analyzed steps.
BLOCK_COLUMNS = [
    "rank",
    "source",
    "block",
    "phase",
    "collective",
    "count_per_step",
    "unit_count_per_step",
    "expected_per_step",
    "excess",
    "time_us_per_step",
    "exposed_us_per_step",
    "bytes_per_step",
    "algbw_gbps",
    "busbw_gbps",
    "compute_us_per_step",
    "recompute_us_per_step",
]


@dataclass
class RankAnalysis:
    """One trace (one rank, one capture phase) analyzed."""

    rank: int | None
    path: str
    source: str  # "timing", "detailed" or "trace"
    device: str  # "gpu" or "cpu"
    steps: pd.DataFrame
    collectives: pd.DataFrame
    blocks: pd.DataFrame
    kernels: pd.DataFrame  # kept GPU events with step, phase and block (for views)
    exposed: pd.DataFrame  # exposed-communication intervals: start_us, end_us, step
    compute_phases: pd.DataFrame  # per step: forward/backward/recompute/optimizer compute µs
    fsdp: pd.DataFrame  # per step × FSDP2 label kind × unit: count (context.FACT_COLUMNS)
    streams: dict[int, str] = field(default_factory=dict)  # stream id -> role
    notices: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    # The trace's CPU slices (fsdp_trace.analysis.rank.CpuSlices), set on the instance only
    # while `rank.keeping_cpu_slices()` is on: a class attribute, not a field, so the cache
    # never stores it.
    cpu_slices: ClassVar[Any] = None

    def exposed_collectives(self) -> list[list[int]]:
        """For each exposed interval, the rows of `collectives` running during it."""
        from fsdp_trace.analysis.intervals import overlapping

        if self.exposed.empty or self.collectives.empty:
            return [[] for _ in range(len(self.exposed))]
        return overlapping(
            self.exposed["start_us"],
            self.exposed["end_us"],
            self.collectives["start_us"],
            self.collectives["end_us"],
        )

    def summary(self) -> dict[str, Any]:
        """Median and min–max over this trace's steps of the headline figures."""
        out: dict[str, Any] = {"rank": self.rank, "source": self.source, "n_steps": len(self.steps)}
        for column in (
            "step_us",
            "exposed_us",
            "exposed_pct",
            "overlap_pct",
            "idle_pct",
            "comm_us",
            "compute_us",
            "recompute_pct",
        ):
            values = (
                self.steps[column].to_numpy(dtype=np.float64) if len(self.steps) else np.empty(0)
            )
            values = values[~np.isnan(values)]
            if values.size:
                out[column] = {
                    "median": float(np.median(values)),
                    "min": float(values.min()),
                    "max": float(values.max()),
                }
            else:
                out[column] = None
        return out
