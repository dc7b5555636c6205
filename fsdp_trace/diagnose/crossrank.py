"""Match each collective across ranks and split its duration into transfer and waiting.

A collective's kernel on every rank ends at about the same moment (they finish together); it
starts when that rank arrives. So the shortest duration across ranks approximates the transfer
time, each rank's excess is time spent waiting for the last one to arrive, and the rank that
starts last is the one the others waited for.

Matching: per process group and profiled step, the k-th collective launched on one rank is the
k-th on every other (NCCL requires that order; every rank runs the same steps); launch order
is the kernels' correlation order. Keying by step keeps ranks aligned even when they dropped
different numbers of kernels launched before the profiled window. Clocks of
different hosts can disagree: each rank's offset is the median difference of matched end
times to rank 0's, and start times are corrected by it before deciding who arrived last.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from fsdp_trace.analyze import classify
from fsdp_trace.analyze.results import RankAnalysis

# Matched collectives end within a few µs of each other on one host (NCCL's own completion
# skew); only a larger median difference means the ranks' clocks disagree.
CLOCK_TOLERANCE_US = 50.0


@dataclass
class CrossRank:
    """Matched collectives and per-rank waiting; empty with fewer than two GPU ranks."""

    matched: pd.DataFrame  # one row per matched collective
    per_rank: pd.DataFrame  # rank, wait_us_per_step, arrived_last, arrived_last_share, ...
    clock_offsets_us: dict[int, float] = field(default_factory=dict)
    notices: list[str] = field(default_factory=list)
    transfer_by_rank: dict[int, pd.Series] = field(default_factory=dict)  # correlation → µs

    def transfer_us(self, rank: int | None, correlations: pd.Series) -> np.ndarray:
        """The cross-rank transfer time of a rank's collectives (NaN where unmatched)."""
        series = self.transfer_by_rank.get(rank)
        if series is None:
            return np.full(len(correlations), np.nan)
        return series.reindex(correlations.to_numpy()).to_numpy(dtype=np.float64)

    @property
    def empty(self) -> bool:
        return self.matched.empty


def _index_collectives(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.sort_values("correlation", kind="stable").copy()
    frame["pg"] = frame["pg_name"].astype(object).where(frame["pg_name"].notna(), "default")
    frame["index"] = frame.groupby(["pg", "step"], sort=False).cumcount()
    return frame


def match(ranks: list[RankAnalysis]) -> CrossRank:
    """Cross-rank view of the given ranks' collectives (GPU traces, one per rank)."""
    usable = [
        r for r in ranks if r.device == "gpu" and not r.collectives.empty and r.rank is not None
    ]
    ids = [r.rank for r in usable]
    if len(usable) < 2 or len(set(ids)) != len(ids):
        return CrossRank(pd.DataFrame(), pd.DataFrame())
    notices: list[str] = []
    frames = {r.rank: _index_collectives(r.collectives) for r in usable}
    reference = min(frames)
    keys = ["pg", "step", "index"]
    common = None
    for frame in frames.values():
        idx = pd.MultiIndex.from_frame(frame[keys])
        common = idx if common is None else common.intersection(idx)
    counts = {rank: len(f) for rank, f in frames.items()}
    if len(set(counts.values())) > 1:
        notices.append(
            "ranks launched different numbers of collectives "
            + ", ".join(f"rank {r}: {n}" for r, n in sorted(counts.items()))
            + f"; matched {len(common)} by process group, step and order"
        )
    aligned = {r: f.set_index(keys).loc[common] for r, f in frames.items()}
    base = aligned[reference]
    agree = np.ones(len(common), dtype=bool)
    for frame in aligned.values():
        agree &= frame["collective"].to_numpy() == base["collective"].to_numpy()
    if not agree.all():
        notices.append(f"{int((~agree).sum())} collectives differ in type across ranks: left out")
    order = sorted(aligned)
    starts = np.column_stack([aligned[r]["start_us"].to_numpy() for r in order])[agree]
    ends = np.column_stack([aligned[r]["end_us"].to_numpy() for r in order])[agree]
    offsets = np.median(ends - ends[:, [order.index(reference)]], axis=0)
    applied = np.where(np.abs(offsets) > CLOCK_TOLERANCE_US, offsets, 0.0)
    if np.any(applied != 0.0):
        notices.append(
            "rank clocks disagree: aligned by matched collective ends ("
            + ", ".join(f"rank {r}: {o:+.1f} µs" for r, o in zip(order, offsets, strict=True))
            + ")"
        )
    starts = starts - applied
    durations = ends - applied - starts
    transfer = durations.min(axis=1)
    waits = durations - transfer[:, None]
    last = np.asarray(order)[np.argmax(starts, axis=1)]
    lateness = starts.max(axis=1) - np.median(starts, axis=1)
    info = base[agree].reset_index()
    group = info["group_size"].to_numpy(dtype=np.float64)
    factor = np.array(
        [
            classify.bus_factor(c, int(g)) if not np.isnan(g) else np.nan
            for c, g in zip(info["collective"], group, strict=True)
        ]
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        algbw = np.where(
            transfer > 0, info["bytes"].to_numpy(dtype=np.float64) / (transfer * 1e-6) / 1e9, np.nan
        )
    matched = pd.DataFrame(
        {
            "pg": info["pg"],
            "step": info["step"],
            "index": info["index"],
            "collective": info["collective"],
            "block": info["block"],
            "phase": info["phase"],
            "bytes": info["bytes"],
            "transfer_us": transfer,
            "max_wait_us": waits.max(axis=1),
            "last_rank": last,
            "lateness_us": lateness,
            "transfer_algbw_gbps": algbw,
            "transfer_busbw_gbps": algbw * factor,
        }
    )
    for column, rank in enumerate(order):
        matched[f"wait_us_rank{rank}"] = waits[:, column]
    n_steps = max(matched["step"].nunique(), 1)
    per_rank = pd.DataFrame(
        {
            "rank": order,
            "wait_us_per_step": waits.sum(axis=0) / n_steps,
            "arrived_last": [int((last == r).sum()) for r in order],
            "arrived_last_share": [float((last == r).mean()) if len(last) else 0.0 for r in order],
            "clock_offset_us": offsets,
        }
    )
    transfers = {
        r: pd.Series(transfer, index=aligned[r]["correlation"].to_numpy()[agree]) for r in order
    }
    offsets_by_rank = dict(zip(order, offsets.tolist(), strict=True))
    return CrossRank(matched, per_rank, offsets_by_rank, notices, transfers)
