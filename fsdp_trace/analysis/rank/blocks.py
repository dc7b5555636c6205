"""Per-unit tables shared by GPU and CPU (gloo) traces: collectives per block × phase ×
collective per step, and compute per step × phase. What the reshard setting implies
(`expected_per_step`, `excess`) is filled in later, from the run's configuration
(`fsdp_trace.analysis.job.config`), because it depends on every rank and on run.json."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fsdp_trace.analysis import classify
from fsdp_trace.analysis import intervals as iv
from fsdp_trace.analysis.results import BLOCK_COLUMNS
from fsdp_trace.vocab import Phase


def empty_frame(columns: list[str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in columns})


def block_table(
    collectives: pd.DataFrame,
    compute: pd.DataFrame,
    n_steps: int,
    rank: int | None,
    source: str,
) -> pd.DataFrame:
    """Per block × phase × collective, per step: counts, time, exposed, bandwidth, and the
    unit's own compute in that phase (plus, on backward rows, its recomputation)."""
    if collectives.empty or n_steps == 0:
        return empty_frame(BLOCK_COLUMNS)
    c = collectives.copy()
    c["key"] = c["block"].astype(str) + "|" + c["phase"] + "|" + c["collective"]
    known = c["bytes"].notna() & (c["dur_us"] > 0)
    c["timed_bytes"] = c["bytes"].where(known)
    c["timed_dur"] = c["dur_us"].where(known)
    grouped = c.groupby(["block", "phase", "collective"], sort=False)
    agg = grouped.agg(
        count=("dur_us", "size"),
        exposed=("exposed_us", "sum"),
        bytes=("bytes", lambda s: s.sum(min_count=1)),
        timed_bytes=("timed_bytes", lambda s: s.sum(min_count=1)),
        timed_dur=("timed_dur", "sum"),
        group_size=("group_size", "max"),
    ).reset_index()
    union = iv.grouped_union_length(c["key"], c["start_us"], c["end_us"])
    keys = agg["block"].astype(str) + "|" + agg["phase"] + "|" + agg["collective"]
    agg["time"] = keys.map(union)
    # Counts per unit and step over both phases (e.g. 2 all-gathers with reshard).
    per_unit = c.groupby(["block", "collective"]).size() / n_steps
    pairs = list(zip(agg["block"], agg["collective"], strict=True))
    unit_count = np.array([per_unit.get(p, 0.0) for p in pairs])
    block_compute = iv.grouped_union_length(
        compute["block"].fillna("").astype(str) + "|" + compute["phase"],
        compute["ts"],
        compute["end"],
    )
    # algbw over the kernels whose bytes and duration are known: Σ bytes / Σ duration. busbw
    # is that × the collective's bus factor, so the two stay in the nccl-tests ratio.
    with np.errstate(invalid="ignore", divide="ignore"):
        algbw = (agg["timed_bytes"] / agg["timed_dur"].where(agg["timed_dur"] > 0)) * 1e6 / 1e9
    factor = classify.bus_factors(agg["collective"], agg["group_size"])
    recompute = np.array(
        [
            block_compute.get(f"{b}|{Phase.RECOMPUTE}", np.nan) / n_steps
            if p == Phase.BACKWARD
            else np.nan
            for b, p in zip(agg["block"], agg["phase"], strict=True)
        ],
        dtype=np.float64,
    )
    out = pd.DataFrame(
        {
            "rank": rank,
            "source": source,
            "block": agg["block"],
            "phase": agg["phase"],
            "collective": agg["collective"],
            "count_per_step": agg["count"] / n_steps,
            "unit_count_per_step": unit_count,
            "expected_per_step": np.nan,
            "excess": np.nan,
            "time_us_per_step": agg["time"] / n_steps,
            "exposed_us_per_step": agg["exposed"] / n_steps,
            "bytes_per_step": agg["bytes"] / n_steps,
            "algbw_gbps": algbw,
            "busbw_gbps": algbw * factor,
            "compute_us_per_step": [
                block_compute.get(f"{b}|{p}", np.nan) / n_steps
                for b, p in zip(agg["block"], agg["phase"], strict=True)
            ],
            "recompute_us_per_step": recompute,
        }
    )
    return out.sort_values("exposed_us_per_step", ascending=False, kind="stable").reset_index(
        drop=True
    )[BLOCK_COLUMNS]


def phase_table(lengths: pd.Series, rank: int | None, source: str) -> pd.DataFrame:
    """Compute per step × phase from `grouped_union_length` keyed 'step|phase'."""
    if lengths.empty:
        return pd.DataFrame(columns=["rank", "source", "step", "phase", "compute_us"])
    keys = lengths.index.to_series().str.split("|", n=1, expand=True)
    return (
        pd.DataFrame(
            {
                "rank": rank,
                "source": source,
                "step": keys[0].astype(np.int64).to_numpy(),
                "phase": keys[1].to_numpy(),
                "compute_us": lengths.to_numpy(),
            }
        )
        .sort_values(["step", "phase"])
        .reset_index(drop=True)
    )
