"""Validation of a loaded trace: what cannot be true is dropped with a counted notice that
names it, and a file where too much is wrong is refused (UserError, one line). It runs in one
place, on the loader's columns right after every parse, so a cached trace was validated when
it was parsed. The thresholds, and why:

Events (`events`), in this order:

1. Duplicates. An event identical to another in every column the loader keeps (category,
   name, process, thread, start, duration, correlation, External id, sequence number, stream
   and the collective arguments) is a copy, from a trace concatenated with itself or a merge
   run twice: the copies are dropped. None of the shipped samples holds one (two events of one
   thread cannot share their ns start and end, name and ids).
2. Impossible times, each dropped:
   - a start or duration that is not a finite number, or a start or end beyond ±2^53 µs
     (285 years: no clock gives it, and ns past it do not fit the int64 that Perfetto and
     every consumer of the times use);
   - a negative duration;
   - in traces of 1000 events or more, a start out of place: farther outside the core of the
     trace (the starts between the 0.1 % and 99.9 % quantiles) than the core's own length, or
     1 s. A trace is one contiguous profiling window, so a lone event hours away is a broken
     timestamp (it would stretch its step to hours);
   - an end past the trace's horizon: later than the last event start by more than the
     trace's span (first to last start) or 1 s. Events are recorded as they start, so none
     can outlast the recording by more than the recording's own length (shipped samples: at
     most 1.7 ms past the last start, over spans of 50 ms to 1.1 s; the 1 s floor covers tiny
     traces whose ProfilerStep outlives the few events inside it). This drops a 1e300 µs
     kernel;
3. Refusal. More than half of the GPU events impossible (of all events, in a trace without
   GPU events) means the figures would rest on a minority of the trace: the file is refused.
   So is a trace whose events all start at one time (its timestamps were lost), and one where
   more than half of the GPU events (kernel, memcpy, memset) contain the next event of their
   own stream (start no later, end no earlier, positive duration): a stream runs one event at
   a time (clock rounding makes neighbours overlap by under 0.2 µs on the samples, never
   contain one another), so the GPU timestamps were lost. A few such events are kept: a trace
   converted by another tool may put several streams on one thread.
4. Correlation ids. CUPTI numbers every runtime/driver call, so two launch events
   (cuda_runtime / cuda_driver) sharing a correlation id cannot be told apart: the id is
   cleared on them and on the GPU events carrying it (those become unlinked, which the
   analysis reports). When more than half of the GPU events that carry a correlation id lose
   it this way (every id the same, say), the file is refused.

`distributedInfo` (`distributed_info`): `rank` must be an integer in [0, 2^31) and
`world_size` one in [1, 2^31), else it is ignored with a notice (the rank then comes from the
file name); `pg_config` keeps the groups of the right shape (a name, ranks that are integers,
a positive size), the others are dropped with a notice; other fields must be plain JSON with
integers within int64.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fsdp_trace.analysis import classify
from fsdp_trace.analysis.read.trace import MISSING
from fsdp_trace.analysis.table import array_of
from fsdp_trace.errors import UserError

TIME_LIMIT_US = float(2**53)  # ±285 years in µs
HORIZON_FLOOR_US = 1e6  # 1 s
CORE_MIN_EVENTS = 1000  # out-of-place starts are judged in traces at least this large
CORE_QUANTILE = 0.001
REFUSE_FRACTION = 0.5
RANK_LIMIT = 1 << 31
_INT64 = 1 << 63

_HASH_PRIMES = (
    0x9E3779B97F4A7C15,
    0xC2B2AE3D27D4EB4F,
    0x165667B19E3779F9,
    0x27D4EB2F165667C5,
    0x94D049BB133111EB,
    0xBF58476D1CE4E5B9,
    0xFF51AFD7ED558CCD,
    0xC4CEB9FE1A85EC53,
)


def _key_columns(frame: pd.DataFrame, names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """Every column the loader keeps (or those of `names` present), as integers (the derived
    `end` left out)."""
    out = {}
    wanted = frame.columns if names is None else [n for n in names if n in frame.columns]
    for name in wanted:
        if name == "end":
            continue
        values = frame[name]
        if isinstance(values.dtype, pd.CategoricalDtype):
            out[name] = values.array.codes
        else:
            array = values.to_numpy()
            out[name] = array.view(np.int64) if array.dtype.kind == "f" else array
    return out


# Hashed to find candidate copies (then compared on every column): what tells events apart.
_HASHED = ("ts", "dur", "tid", "name", "correlation", "external_id")


def duplicates(frame: pd.DataFrame) -> np.ndarray:
    """Rows identical to an earlier row in every kept column (all but the first of each).

    Copies share their start, so only rows whose start another row shares (or is NaN) are
    candidates: found by a stable sort of the starts, linear on a trace's nearly sorted
    times (a sort of every row's digest is not: ~50 ms at 900,000 events, against ~9). The
    candidates' digests are compared, then their every column."""
    ts = array_of(frame, "ts", np.float64)
    ordered = ts[np.argsort(ts, kind="stable")]
    same = ordered[1:] == ordered[:-1]
    shared = ordered[1:][same]  # NaN never equals: NaN starts are candidates by themselves
    out = np.zeros(len(frame), dtype=bool)
    if not shared.size and not np.isnan(ordered[-1:]).any():
        return out
    rows = np.flatnonzero(np.isin(ts, shared) | np.isnan(ts))
    hashed = _key_columns(frame, _HASHED)
    with np.errstate(over="ignore"):
        digest = np.zeros(rows.size, dtype=np.uint64)
        for i, name in enumerate(n for n in _HASHED if n in hashed):
            column = hashed[name][rows].astype(np.int64, copy=False).view(np.uint64)
            np.bitwise_xor(digest, column, out=digest)  # in place: no temporary per step
            np.multiply(digest, np.uint64(_HASH_PRIMES[i]), out=digest)
    by_digest = np.sort(digest)
    twice = by_digest[1:][by_digest[1:] == by_digest[:-1]]
    if twice.size:  # confirm exactly, on every column (a hash collision is no copy)
        rows = rows[np.isin(digest, twice)]
        keys = _key_columns(frame)
        table = pd.DataFrame({name: column[rows] for name, column in keys.items()})
        out[rows] = table.duplicated(keep="first").to_numpy()
    return out


def _most_common(names: pd.Series, rows: np.ndarray) -> str:
    if not rows.size:
        return ""
    name = str(names.iloc[rows].value_counts().index[0])
    return name if len(name) <= 60 else name[:57] + "..."


@dataclass
class _Verdict:
    """Why each event is impossible (0: it is not)."""

    reasons: list[str]
    code: np.ndarray

    def mark(self, rows: np.ndarray, reason: str) -> None:
        rows = rows[self.code[rows] == 0]  # the first reason found stays
        if rows.size:
            if reason not in self.reasons:
                self.reasons.append(reason)
            self.code[rows] = self.reasons.index(reason) + 1


def _stream_containers(
    ts: np.ndarray, end: np.ndarray, pid: np.ndarray, tid: np.ndarray, rows: np.ndarray
) -> np.ndarray:
    """Among `rows` (GPU events), those containing the next event of their stream."""
    if rows.size < 2:
        return rows[:0]
    order = rows[np.lexsort((-end[rows], ts[rows], tid[rows], pid[rows]))]
    same = (pid[order[1:]] == pid[order[:-1]]) & (tid[order[1:]] == tid[order[:-1]])
    nxt, cur = order[1:], order[:-1]
    contains = same & (ts[nxt] < end[cur]) & (end[nxt] <= end[cur])
    return cur[contains]


def events(path: Path, frame: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The events without what is impossible, and the notices saying what was dropped; a
    UserError when the file is too broken to analyze (see the module docstring)."""
    notices: list[str] = []
    n = len(frame)
    dropped = duplicates(frame)
    if dropped.any():
        notices.append(
            f"{int(dropped.sum())} duplicated events (identical in every field to another "
            f"one, e.g. {_most_common(frame['name'], np.flatnonzero(dropped))}) were dropped"
        )
    ts = array_of(frame, "ts")
    dur = array_of(frame, "dur")
    end = ts + dur
    names = frame["name"]
    kinds = classify.event_kinds(frame)
    is_gpu = classify.kind_mask(
        kinds, classify.COMM, classify.COMPUTE, classify.MEMCPY, classify.MEMSET
    )
    verdict = _Verdict([], np.zeros(n, dtype=np.int8))
    live = ~dropped
    with np.errstate(invalid="ignore", over="ignore"):
        bad_time = ~(np.isfinite(ts) & np.isfinite(dur) & (np.abs(ts) <= TIME_LIMIT_US))
        bad_time |= ~(np.abs(end) <= TIME_LIMIT_US)
    verdict.mark(np.flatnonzero(live & bad_time), "a time that is not finite or past ±2^53 µs")
    verdict.mark(np.flatnonzero(live & (dur < 0)), "a negative duration")
    ok = live & (verdict.code == 0)
    starts = ts[ok]
    if starts.size > 1 and starts.min() == starts.max():
        raise UserError(
            f"{path}: all {starts.size} events start at the same time (ts {starts[0]:g}): the "
            "timestamps were lost; re-export the trace"
        )
    if starts.size >= CORE_MIN_EVENTS:
        low, high = np.quantile(starts, [CORE_QUANTILE, 1 - CORE_QUANTILE])
        slack = max(high - low, HORIZON_FLOOR_US)
        lone = ok & ((ts < low - slack) | (ts > high + slack))
        verdict.mark(np.flatnonzero(lone), "a start far outside the trace's time window")
        ok &= ~lone
    if ok.any():
        first, last = ts[ok].min(), ts[ok].max()
        horizon = last + max(last - first, HORIZON_FLOOR_US)
        verdict.mark(np.flatnonzero(ok & (end > horizon)), "an end past the trace's horizon")
        ok = live & (verdict.code == 0)
    bad = verdict.code > 0
    gpu_total = int((live & is_gpu).sum())
    pid = array_of(frame, "pid")
    tid = array_of(frame, "tid")
    containers = _stream_containers(ts, end, pid, tid, np.flatnonzero(live & ~bad & is_gpu))
    if containers.size > REFUSE_FRACTION * gpu_total:
        raise UserError(
            f"{path}: {containers.size} of {gpu_total} GPU events contain the next event of "
            f"their own stream (e.g. {_most_common(names, containers)}), which runs one at a "
            "time: the GPU timestamps are corrupt; re-export the trace"
        )
    if gpu_total:
        bad_n, total, what = int((bad & is_gpu).sum()), gpu_total, "GPU events"
    else:
        bad_n, total, what = int(bad.sum()), int(live.sum()), "events"
    parts = []
    for i, reason in enumerate(verdict.reasons):
        rows = np.flatnonzero(verdict.code == i + 1)
        parts.append(f"{rows.size} with {reason} (e.g. {_most_common(names, rows)})")
    if bad_n > REFUSE_FRACTION * total:
        raise UserError(
            f"{path}: {bad_n} of {total} {what} are impossible ({'; '.join(parts)}): the "
            "trace is corrupt; re-export it"
        )
    if bad.any():
        notices.append(
            f"{int(bad.sum())} events with impossible times were dropped: {'; '.join(parts)}"
        )
    keep = ~(dropped | bad)
    if not keep.all():
        frame = frame.loc[keep].reset_index(drop=True)
        kinds = kinds[keep]
        is_gpu = is_gpu[keep]
    frame, correlation_notices = _shared_correlations(path, frame, kinds, is_gpu)
    return frame, notices + correlation_notices


def _shared_correlations(
    path: Path, frame: pd.DataFrame, kinds: np.ndarray, is_gpu: np.ndarray
) -> tuple[pd.DataFrame, list[str]]:
    """Clear correlation ids that several launch events share (rule 4)."""
    correlation = array_of(frame, "correlation")
    launch = (kinds == classify.LAUNCH) & (correlation >= 0)
    ids = correlation[launch]
    if ids.size < 2:
        return frame, []
    unique, counts = np.unique(ids, return_counts=True)
    shared = unique[counts > 1]
    if not shared.size:
        return frame, []
    hit = np.isin(correlation, shared) & (launch | is_gpu)
    gpu_linked = int((is_gpu & (correlation >= 0)).sum())
    gpu_hit = int((hit & is_gpu).sum())
    where = (
        f"{int((counts > 1).sum())} correlation ids are each shared by several launch events "
        f"(e.g. id {int(shared[0])}: {int(counts[counts > 1][0])} launches)"
    )
    if gpu_linked and gpu_hit > REFUSE_FRACTION * gpu_linked:
        raise UserError(
            f"{path}: {where}, so {gpu_hit} of {gpu_linked} GPU events cannot be tied to their "
            "launch: the correlation ids are corrupt; re-export the trace"
        )
    column = correlation.copy()
    column[hit] = MISSING
    frame = frame.assign(correlation=column)
    return frame, [
        f"{where}: CUPTI numbers each call, so these cannot be told apart; their "
        f"{gpu_hit} GPU events are left unlinked"
    ]


# --- distributedInfo ------------------------------------------------------------------------


@dataclass
class DistributedInfo:
    clean: dict[str, Any]
    rank: int | None
    world_size: int | None
    notices: list[str] = field(default_factory=list)


def plain(value: Any, depth: int = 0) -> bool:
    """JSON of the kinds the rest of fsdp-trace stores (cache, JSON output): integers within
    int64, finite floats, nesting under 32 levels."""
    if depth > 32:
        return False
    if value is None or isinstance(value, bool | str):
        return True
    if isinstance(value, int):
        return -_INT64 <= value < _INT64
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        # A group's members: thousands of ints at a thousand ranks, checked in one pass.
        within = _ints_within(value, -_INT64, _INT64) if depth < 32 else None
        if within is not None:
            return within
        return all(plain(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and plain(v, depth + 1) for k, v in value.items())
    return False


def plain_items(items: Any) -> tuple[list[Any], int]:
    """The entries of a list field that are plain JSON objects, and how many were not."""
    if not isinstance(items, list):
        return [], 0
    kept = [item for item in items if isinstance(item, dict) and plain(item)]
    return kept, len(items) - len(kept)


def _ints_within(values: list, low: int, high: int) -> bool | None:
    """For a list of plain ints (not bools), whether every one lies in [low, high), in a few
    C-level passes; None for a list of anything else (check it value by value)."""
    if not set(map(type, values)) <= {int}:
        return None
    return not values or (min(values) >= low and max(values) < high)


def _all_ranks(values: list) -> bool:
    """Every value a rank number (`_count(v, 0)`); a list of ints in one pass (thousands of
    members at a thousand ranks)."""
    within = _ints_within(values, 0, RANK_LIMIT)
    return within if within is not None else all(_count(v, 0) is not None for v in values)


def _count(value: Any, low: int) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and low <= value < RANK_LIMIT:
        return value
    return None


def _good_group(pg: Any) -> bool:
    if not isinstance(pg, dict) or not isinstance(pg.get("pg_name"), str | int):
        return False
    if isinstance(pg.get("pg_name"), bool) or not plain(pg):
        return False
    ranks = pg.get("ranks")
    if ranks is not None and not (isinstance(ranks, list) and _all_ranks(ranks)):
        return False
    size = pg.get("pg_size")
    return size is None or _count(size, 1) is not None


def distributed_info(raw: dict[str, Any] | None) -> DistributedInfo:
    """`distributedInfo` with every field the analysis reads of the right type (see the
    module docstring); what is not is left out, with a notice."""
    if not raw:
        return DistributedInfo({}, None, None)
    notices: list[str] = []
    clean: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "pg_config":
            groups = value if isinstance(value, list) else None
            kept = [pg for pg in groups or [] if _good_group(pg)]
            if groups is None or len(kept) != len(groups):
                bad = len(groups) - len(kept) if groups is not None else 1
                notices.append(
                    f"distributedInfo.pg_config: {bad} process group entr"
                    f"{'y' if bad == 1 else 'ies'} of the wrong shape ignored"
                )
            clean[key] = kept
        elif key in ("rank", "world_size"):
            low = 0 if key == "rank" else 1
            if value is None:
                continue
            if _count(value, low) is None:
                shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
                then = " (the rank comes from the file name)" if key == "rank" else ""
                notices.append(
                    f"distributedInfo.{key} {shown} is not a {key.replace('_', ' ')} number: "
                    f"ignored{then}"
                )
                continue
            clean[key] = value
        elif plain(value):
            clean[key] = value
        else:
            notices.append(f"distributedInfo.{key} is not plain JSON: ignored")
    return DistributedInfo(clean, clean.get("rank"), clean.get("world_size"), notices)
