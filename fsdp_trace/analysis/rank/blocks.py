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
    c = collectives
    # Groups as `groupby(["block", "phase", "collective"], sort=False)` makes them, summed as
    # it sums them (`iv.group_sum`): a groupby's fixed cost, ~1 ms each, was most of a small
    # rank's block table.
    keys = [c["block"], c["phase"], c["collective"]]
    code, first = iv.first_seen_codes(keys)
    n = first.size
    dur = c["dur_us"].to_numpy(dtype=np.float64)
    nbytes = c["bytes"].to_numpy(dtype=np.float64)
    known = ~np.isnan(nbytes) & (dur > 0)
    agg = pd.DataFrame(
        {
            "block": c["block"].array[first],
            "phase": c["phase"].array[first],
            "collective": c["collective"].array[first],
            "count": np.bincount(code[code >= 0], minlength=n).astype(np.int64),
            "exposed": iv.group_sum(code, c["exposed_us"].to_numpy(dtype=np.float64), n),
            "bytes": iv.group_sum(code, nbytes, n, min_count=1),
            "timed_bytes": iv.group_sum(code, np.where(known, nbytes, np.nan), n, min_count=1),
            "timed_dur": iv.group_sum(code, np.where(known, dur, np.nan), n),
            "group_size": iv.group_max(code, c["group_size"].to_numpy(dtype=np.float64), n),
        }
    )
    # The union of each group's kernels.
    kept = code >= 0
    start_us = c["start_us"].to_numpy(dtype=np.float64)
    end_us = c["end_us"].to_numpy(dtype=np.float64)
    if kept.any() and not (np.isnan(start_us[kept]).any() or np.isnan(end_us[kept]).any()):
        present, lengths, _ = iv.union_length_by_code(code[kept], start_us[kept], end_us[kept])
        time = np.full(n, np.nan)
        time[present] = lengths
        agg["time"] = time
    else:
        union = iv.grouped_union_length(
            c["block"].astype(str) + "|" + c["phase"] + "|" + c["collective"],
            c["start_us"],
            c["end_us"],
        )
        labels = agg["block"].astype(str) + "|" + agg["phase"] + "|" + agg["collective"]
        agg["time"] = labels.map(union)
    # Counts per unit and step over both phases (e.g. 2 all-gathers with reshard).
    unit_code, unit_first = iv.first_seen_codes([c["block"], c["collective"]])
    per_unit = np.bincount(unit_code[unit_code >= 0], minlength=unit_first.size) / n_steps
    unit_count = per_unit[unit_code[first]]
    block_compute = iv.grouped_union_length_by_label(
        lambda b, p: f"{b}|{p}",
        [compute["block"].fillna("").astype(str), compute["phase"]],
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
