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
    # it sums them (`iv.group_sum`), every column an array: a pandas step's fixed cost, ~1 ms
    # each, was most of a small rank's block table.
    keys = [c["block"], c["phase"], c["collective"]]
    code, first = iv.first_seen_codes(keys)
    n = first.size
    dur = c["dur_us"].to_numpy(dtype=np.float64)
    nbytes = c["bytes"].to_numpy(dtype=np.float64)
    known = ~np.isnan(nbytes) & (dur > 0)
    block, phase, collective = (key.array[first] for key in keys)
    count = np.bincount(code[code >= 0], minlength=n).astype(np.int64)
    exposed = iv.group_sum(code, c["exposed_us"].to_numpy(dtype=np.float64), n)
    total_bytes = iv.group_sum(code, nbytes, n, min_count=1)
    timed_bytes = iv.group_sum(code, np.where(known, nbytes, np.nan), n, min_count=1)
    timed_dur = iv.group_sum(code, np.where(known, dur, np.nan), n)
    group_size = iv.group_max(code, c["group_size"].to_numpy(dtype=np.float64), n)
    # The union of each group's kernels.
    kept = code >= 0
    start_us = c["start_us"].to_numpy(dtype=np.float64)
    end_us = c["end_us"].to_numpy(dtype=np.float64)
    if kept.any() and not (np.isnan(start_us[kept]).any() or np.isnan(end_us[kept]).any()):
        present, lengths, _ = iv.union_length_by_code(code[kept], start_us[kept], end_us[kept])
        time = np.full(n, np.nan)
        time[present] = lengths
    else:
        union = iv.grouped_union_length(
            c["block"].astype(str) + "|" + c["phase"] + "|" + c["collective"],
            c["start_us"],
            c["end_us"],
        )
        labels = pd.Series(block).astype(str) + "|" + pd.Series(phase) + "|" + collective
        time = labels.map(union).to_numpy(dtype=np.float64)
    # Counts per unit and step over both phases (e.g. 2 all-gathers with reshard).
    unit_code, unit_first = iv.first_seen_codes([c["block"], c["collective"]])
    per_unit = np.bincount(unit_code[unit_code >= 0], minlength=unit_first.size) / n_steps
    unit_count = per_unit[unit_code[first]]
    by_label = iv.grouped_union_length_by_label(
        lambda b, p: f"{b}|{p}",
        [compute["block"].fillna("").astype(str), compute["phase"]],
        compute["ts"],
        compute["end"],
    )
    block_compute = dict(zip(by_label.index.tolist(), by_label.tolist(), strict=True))
    # algbw over the kernels whose bytes and duration are known: Σ bytes / Σ duration. busbw
    # is that × the collective's bus factor, so the two stay in the nccl-tests ratio.
    with np.errstate(invalid="ignore", divide="ignore"):
        algbw = (timed_bytes / np.where(timed_dur > 0, timed_dur, np.nan)) * 1e6 / 1e9
    factor = classify.bus_factors(collective, group_size)
    pairs = list(zip(block.tolist(), phase.tolist(), strict=True))
    recompute = np.array(
        [
            block_compute.get(f"{b}|{Phase.RECOMPUTE}", np.nan) / n_steps
            if p == Phase.BACKWARD
            else np.nan
            for b, p in pairs
        ],
        dtype=np.float64,
    )
    columns = {
        "block": block,
        "phase": phase,
        "collective": collective,
        "count_per_step": count / n_steps,
        "unit_count_per_step": unit_count,
        "expected_per_step": np.full(n, np.nan),
        "excess": np.full(n, np.nan),
        "time_us_per_step": time / n_steps,
        "exposed_us_per_step": exposed / n_steps,
        "bytes_per_step": total_bytes / n_steps,
        "algbw_gbps": algbw,
        "busbw_gbps": algbw * factor,
        "compute_us_per_step": np.array(
            [block_compute.get(f"{b}|{p}", np.nan) / n_steps for b, p in pairs],
            dtype=np.float64,
        ),
        "recompute_us_per_step": recompute,
    }
    order = iv.descending_order(columns["exposed_us_per_step"])
    out = {name: values[order] for name, values in columns.items()}
    table = pd.DataFrame({"rank": rank, "source": source, **out})
    assert list(table.columns) == BLOCK_COLUMNS
    return table


def phase_table(lengths: pd.Series, rank: int | None, source: str) -> pd.DataFrame:
    """Compute per step × phase from `grouped_union_length` keyed 'step|phase'."""
    if lengths.empty:
        return pd.DataFrame(columns=["rank", "source", "step", "phase", "compute_us"])
    # A handful of keys: split and sorted in Python (pandas' str.split and a two-column
    # sort_values cost ~1 ms a rank). The keys are distinct: any sort gives the one order.
    split = [str(key).split("|", 1) for key in lengths.index]
    order = sorted(range(len(split)), key=lambda i: (int(split[i][0]), split[i][1]))
    values = lengths.to_numpy()
    return pd.DataFrame(
        {
            "rank": rank,
            "source": source,
            "step": np.array([int(split[i][0]) for i in order], dtype=np.int64),
            "phase": np.array([split[i][1] for i in order], dtype=object),
            "compute_us": values[order],
        }
    )
