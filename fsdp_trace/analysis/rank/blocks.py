"""Per-unit tables shared by GPU and CPU (gloo) traces: collectives per block × phase ×
collective per step, and compute per step × phase. What the reshard setting implies
(`expected_per_step`, `excess`) is filled in later, from the run's configuration
(`fsdp_trace.analysis.job.config`), because it depends on every rank and on run.json."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from fsdp_trace.analysis import classify
from fsdp_trace.analysis import intervals as iv
from fsdp_trace.analysis.results import BLOCK_COLUMNS
from fsdp_trace.analysis.table import array_of
from fsdp_trace.vocab import Phase


def empty_frame(columns: list[str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in columns})


def block_table(
    collectives: pd.DataFrame,
    compute: Mapping[str, Any],
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
    dur = array_of(c, "dur_us", np.float64)
    nbytes = array_of(c, "bytes", np.float64)
    known = ~np.isnan(nbytes) & (dur > 0)
    block, phase, collective = (key.array[first] for key in keys)
    count = np.bincount(code[code >= 0], minlength=n).astype(np.int64)
    exposed = iv.group_sum(code, array_of(c, "exposed_us", np.float64), n)
    total_bytes = iv.group_sum(code, nbytes, n, min_count=1)
    timed_bytes = iv.group_sum(code, np.where(known, nbytes, np.nan), n, min_count=1)
    timed_dur = iv.group_sum(code, np.where(known, dur, np.nan), n)
    group_size = iv.group_max(code, array_of(c, "group_size", np.float64), n)
    # The union of each group's kernels.
    kept = code >= 0
    start_us = array_of(c, "start_us", np.float64)
    end_us = array_of(c, "end_us", np.float64)
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
    block_compute = _compute_by_block_phase(compute)
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


def _compute_by_block_phase(compute: Mapping[str, Any]) -> dict[str, float]:
    """The union length of the compute kernels of each unit × phase, keyed "block|phase" (no
    block: ""). Two pairs that read as one key (a "|" inside a name) are one group, as the
    key says."""
    if not len(compute["ts"]):
        return {}
    block = pd.Series(compute["block"], dtype=object).fillna("").astype(str).to_numpy()
    phase = np.asarray(compute["phase"], dtype=object)
    rows, lengths = iv.union_length_by_keys([block, phase], compute["ts"], compute["end"])
    keys = [f"{b}|{p}" for b, p in zip(block[rows].tolist(), phase[rows].tolist(), strict=True)]
    if len(set(keys)) < len(keys):  # grouped by the keys' text instead (no phase: no text)
        pairs = zip(block.tolist(), pd.isna(phase).tolist(), phase.tolist(), strict=True)
        texts = [None if missing else f"{b}|{p}" for b, missing, p in pairs]
        by_text = np.array(texts, dtype=object)
        rows, lengths = iv.union_length_by_keys([by_text], compute["ts"], compute["end"])
        keys = by_text[rows].tolist()
    return dict(zip(keys, lengths.tolist(), strict=True))


def no_phases() -> pd.DataFrame:
    """The compute per step × phase of a trace without compute kernels."""
    return pd.DataFrame(columns=["rank", "source", "step", "phase", "compute_us"])


def phase_table(
    steps: np.ndarray, phases: np.ndarray, lengths: np.ndarray, rank: int | None, source: str
) -> pd.DataFrame:
    """Compute per step × phase (each pair once, with its union length), by step, then
    phase."""
    if not len(lengths):
        return no_phases()
    # A handful of rows: sorted in Python (a two-column sort_values costs ~1 ms a rank). The
    # pairs are distinct: any sort gives the one order.
    pairs = [(int(s), str(p)) for s, p in zip(steps.tolist(), phases.tolist(), strict=True)]
    order = sorted(range(len(pairs)), key=pairs.__getitem__)
    return pd.DataFrame(
        {
            "rank": rank,
            "source": source,
            "step": np.array([pairs[i][0] for i in order], dtype=np.int64),
            "phase": np.array([pairs[i][1] for i in order], dtype=object),
            "compute_us": np.asarray(lengths, dtype=np.float64)[order],
        }
    )
