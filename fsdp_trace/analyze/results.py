"""What analysis returns: dataclasses holding DataFrames with stable, documented columns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
    "pg_ranks",
    "seq",
    "stream",
    "correlation",
    "kernel",
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
    streams: dict[int, str] = field(default_factory=dict)  # stream id -> role
    notices: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def exposed_collectives(self) -> list[list[int]]:
        """For each exposed interval, the rows of `collectives` running during it."""
        from fsdp_trace.analyze.intervals import overlapping

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


@dataclass
class Analysis:
    """Everything `fsdp-trace analyze` found for one input (a trace, run or directory)."""

    inputs: list[str]
    ranks: list[RankAnalysis]  # timing (or plain) traces, one per rank
    detailed: list[RankAnalysis] = field(default_factory=list)  # capture's detailed traces
    run: dict[str, Any] | None = None  # run.json, when the input is a capture run
    notices: list[str] = field(default_factory=list)
    hta: pd.DataFrame | None = None  # HTA cross-check, when asked for
    findings: list[Any] = field(default_factory=list)  # fsdp_trace.diagnose.Finding
    crossrank: Any = None  # fsdp_trace.diagnose.CrossRank, with two or more GPU ranks

    def _concat(self, attr: str, columns: list[str]) -> pd.DataFrame:
        """One table over every trace, timing then detailed (tell them apart by `source`)."""
        frames = [getattr(r, attr) for r in self.ranks + self.detailed if len(getattr(r, attr))]
        if not frames:
            return pd.DataFrame(columns=columns)
        return pd.concat(frames, ignore_index=True)[columns]

    @property
    def steps(self) -> pd.DataFrame:
        return self._concat("steps", STEP_COLUMNS)

    @property
    def collectives(self) -> pd.DataFrame:
        return self._concat("collectives", COLLECTIVE_COLUMNS)

    @property
    def blocks(self) -> pd.DataFrame:
        return self._concat("blocks", BLOCK_COLUMNS)

    def distortion(self) -> list[dict[str, Any]]:
        """Detailed (record_shapes + with_stack) step vs the timing steps' median, per rank."""
        out = []
        timing = {r.rank: r for r in self.ranks}
        for det in self.detailed:
            base = timing.get(det.rank)
            if base is None or base.steps.empty or det.steps.empty:
                continue
            t_med = float(base.steps["step_us"].median())
            d_step = float(det.steps["step_us"].iloc[-1])
            out.append(
                {
                    "rank": det.rank,
                    "detailed_step_us": d_step,
                    "timing_median_step_us": t_med,
                    "slowdown_pct": 100.0 * (d_step - t_med) / t_med if t_med else float("nan"),
                    "detailed_exposed_pct": float(det.steps["exposed_pct"].iloc[-1]),
                    "timing_exposed_pct": float(base.steps["exposed_pct"].median()),
                }
            )
        return out
