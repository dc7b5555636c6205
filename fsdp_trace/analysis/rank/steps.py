"""Step windows. The GPU-side `ProfilerStep#N` annotation covers only part of a step on real
traces, so windows are built from the GPU work launched inside the CPU-side `ProfilerStep#N`:
step N runs from the start of its first GPU event (kernel, memcpy or memset: the batch's
host-to-device copy is the step's first work) to the start of the first GPU event of step N+1
(the last step: to the end of its last one)."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from fsdp_trace.analysis import classify
from fsdp_trace.analysis.table import array_of

PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")


BEYOND_INT64 = -2  # a ProfilerStep#N whose N no int64 holds


def _step_number(name: str | None) -> int:
    """N of `ProfilerStep#N`, -1 for any other name, BEYOND_INT64 for an N past int64
    (evaluated once per distinct name)."""
    match = PROFILER_STEP.match(name) if name is not None else None
    if not match:
        return -1
    number = int(match.group(1))
    return number if number <= np.iinfo(np.int64).max else BEYOND_INT64


def cpu_steps(
    events: pd.DataFrame, kinds: np.ndarray, notices: list[str] | None = None
) -> pd.DataFrame:
    """CPU `ProfilerStep#N` annotations: step number, start and end (µs), sorted by start.

    The profiler numbers its steps once each, one after the other; a trace that does not is
    read as far as it can be, each repair said in `notices`: a number past int64 or repeated
    (the second window of a number) leaves that window out; a window that starts before the
    one before it ends is cut to end where it starts (steps do not overlap)."""
    is_annotation = (kinds == classify.ANNOTATION) | (kinds == classify.CPU_OP)
    numbers = classify.per_category(events["name"].array, _step_number, np.int64)
    mask = is_annotation & ((numbers >= 0) | (numbers == BEYOND_INT64))
    # Arrays throughout (a frame sorted, picked and shifted cost ~1.5 ms a rank).
    start = array_of(events, "ts")[mask]
    order = np.argsort(start, kind="stable")
    step, start, end = numbers[mask][order], start[order], array_of(events, "end")[mask][order]
    said = notices if notices is not None else []
    huge = step == BEYOND_INT64
    if huge.any():
        said.append(
            f"ProfilerStep annotations numbering their step past int64 ({int(huge.sum())}): "
            "left out (their GPU work with them)"
        )
    repeated = np.ones(step.size, dtype=bool)  # `duplicated()`: every one after the first
    repeated[np.unique(step, return_index=True)[1]] = False
    repeated &= ~huge
    if repeated.any():
        shown = ", ".join(f"#{n}" for n in sorted(set(step[repeated].tolist()))[:5])
        said.append(
            f"ProfilerStep numbers repeat ({shown}): only the first window of each number is "
            f"read, the later ones ({int(repeated.sum())}) left out (their GPU work with them)"
        )
    kept = ~(huge | repeated)
    step, start, end = step[kept], start[kept], end[kept]
    nxt = np.append(start[1:], np.nan)  # `shift(-1)`
    overlap = end > nxt
    if overlap.any():
        first = int(np.flatnonzero(overlap)[0])
        said.append(
            f"ProfilerStep windows overlap the next one ({int(overlap.sum())} of {step.size}: "
            f"#{step[first + 1]} starts before #{step[first]} ends): each is cut to end where "
            "the next starts"
        )
        end = np.where(overlap, nxt, end)
    return pd.DataFrame({"step": step, "cpu_start": start, "cpu_end": end})


def step_of_time(
    steps: pd.DataFrame, times: np.ndarray, start: str = "cpu_start", end: str = "cpu_end"
) -> np.ndarray:
    """The step whose window (CPU by default) holds each time; -1 outside every step.
    By time, not nesting: backward runs on another thread than `ProfilerStep#N`."""
    if steps.empty:
        return np.full(len(times), -1, dtype=np.int64)
    starts = array_of(steps, start, np.float64)
    idx = np.searchsorted(starts, times, side="right") - 1
    safe = np.maximum(idx, 0)
    inside = (idx >= 0) & (times <= array_of(steps, end, np.float64)[safe])
    return np.where(inside, array_of(steps, "step")[safe], -1)


def gpu_windows(
    steps: pd.DataFrame,
    gpu_step: np.ndarray,
    ts: np.ndarray,
    end: np.ndarray,
    host_end: pd.Series | None = None,
) -> pd.DataFrame:
    """GPU window per CPU step from the GPU events launched in it (those with gpu_step ≥ 0),
    ordered by start, with the step's CPU window (`steps`' columns).
    `host_end`: per step, when its own host-only work ends (an optimizer step run on the CPU
    under CPU offload); the last step, which no next step ends, ends no earlier."""
    launched = gpu_step >= 0
    if not launched.any():
        return pd.DataFrame(columns=["step", "start", "end", "cpu_start", "cpu_end"])
    step, start, last_end = _first_and_last(gpu_step[launched], ts[launched], end[launched])
    # Each window ends where the next starts. The last step has no next step to end it: it
    # ends when its GPU work does, or when its own host work does if that is later (an
    # optimizer step on the CPU belongs to the step, as it does to every earlier one, which
    # the next step's first GPU event ends).
    tail = float(host_end.get(step[-1], -np.inf)) if host_end is not None else -np.inf
    window_end = np.append(start[1:], max(float(last_end[-1]), tail))
    windows = {"step": step, "start": start, "end": window_end}
    cpu = pd.Index(array_of(steps, "step"))
    if not cpu.is_unique or (cpu.get_indexer(step) < 0).any():  # not one CPU window each
        return pd.DataFrame(windows).merge(steps, on="step", how="left")
    at = cpu.get_indexer(step)
    return pd.DataFrame(
        {**windows, **{c: array_of(steps, c)[at] for c in steps.columns if c != "step"}}
    )


def _first_and_last(
    step: np.ndarray, ts: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per step (≥ 0): its first start and last end, ordered by start
    (`groupby("step").agg(start=min, last_end=max).sort_values("start")`, in numpy)."""
    ts, end = ts.astype(np.float64), end.astype(np.float64)
    if np.isnan(ts).any() or np.isnan(end).any():
        frame = pd.DataFrame({"step": step, "ts": ts, "end": end})
        grouped = frame.groupby("step").agg(start=("ts", "min"), last_end=("end", "max"))
        grouped = grouped.sort_values("start")
        return (
            grouped.index.to_numpy(),
            array_of(grouped, "start"),
            array_of(grouped, "last_end"),
        )
    order = np.argsort(step, kind="stable")
    heads = np.flatnonzero(np.diff(step[order], prepend=step[order][0] - 1))
    first = np.minimum.reduceat(ts[order], heads)
    by_start = np.argsort(first, kind="quicksort")  # as sort_values("start") orders them
    last = np.maximum.reduceat(end[order], heads)
    return step[order][heads][by_start], first[by_start], last[by_start]
