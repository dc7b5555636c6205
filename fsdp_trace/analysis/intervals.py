"""The one interval algebra (numpy, µs floats). Sets of intervals are pairs of arrays
(starts, ends); "union form" means sorted, disjoint and non-touching, as `union` returns.

Every overlap figure in the tool is built from these: sums of durations double-count
concurrent streams, unions do not.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

Intervals = tuple[np.ndarray, np.ndarray]
EMPTY: Intervals = (np.empty(0), np.empty(0))


def as_arrays(starts, ends) -> Intervals:
    return np.asarray(starts, dtype=np.float64), np.asarray(ends, dtype=np.float64)


def union(starts, ends) -> Intervals:
    """Merge into sorted disjoint intervals; touching intervals merge (as HTA does)."""
    s, e = as_arrays(starts, ends)
    if s.size == 0:
        return EMPTY
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    running_end = np.maximum.accumulate(e)
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > running_end[:-1]
    first = np.flatnonzero(new)
    return s[first], np.maximum.reduceat(e, first)


def length(intervals: Intervals) -> float:
    s, e = intervals
    return float(np.sum(e - s)) if s.size else 0.0


def clip(intervals: Intervals, lo: float, hi: float) -> Intervals:
    """Cut to [lo, hi); intervals left empty are dropped."""
    s, e = intervals
    s2, e2 = np.maximum(s, lo), np.minimum(e, hi)
    keep = e2 > s2
    return s2[keep], e2[keep]


def _combine(
    a: Intervals, b: Intervals, op: Callable[[np.ndarray, np.ndarray], np.ndarray]
) -> Intervals:
    """Sweep both sets' boundaries; keep the elementary segments where op(in_a, in_b)."""
    (a_s, a_e), (b_s, b_e) = a, b
    points = np.concatenate([a_s, a_e, b_s, b_e])
    if points.size == 0:
        return EMPTY
    da = np.concatenate([np.ones(a_s.size), -np.ones(a_e.size), np.zeros(b_s.size + b_e.size)])
    db = np.concatenate([np.zeros(a_s.size + a_e.size), np.ones(b_s.size), -np.ones(b_e.size)])
    order = np.argsort(points, kind="stable")
    points = points[order]
    in_a = np.cumsum(da[order]) > 0
    in_b = np.cumsum(db[order]) > 0
    keep = op(in_a, in_b)[:-1]
    seg_s, seg_e = points[:-1][keep], points[1:][keep]
    nonempty = seg_e > seg_s
    return union(seg_s[nonempty], seg_e[nonempty])


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """a ∩ b for two sets in union form."""
    return _combine(a, b, np.logical_and)


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """a \\ b for two sets in union form."""
    return _combine(a, b, lambda x, y: x & ~y)


def covered_up_to(u: Intervals, points) -> np.ndarray:
    """Length of u ∩ (-inf, x] for each x (u in union form)."""
    us, ue = u
    x = np.asarray(points, dtype=np.float64)
    if us.size == 0:
        return np.zeros(x.shape)
    cumulative = np.concatenate([[0.0], np.cumsum(ue - us)])
    idx = np.searchsorted(us, x, side="right") - 1
    safe = np.maximum(idx, 0)
    partial = np.clip(x - us[safe], 0.0, ue[safe] - us[safe])
    return np.where(idx >= 0, cumulative[safe] + partial, 0.0)


def overlap_each(starts, ends, u: Intervals) -> np.ndarray:
    """|[s_i, e_i] ∩ u| for each interval i (u in union form)."""
    s, e = as_arrays(starts, ends)
    return covered_up_to(u, e) - covered_up_to(u, s)


def contains(u: Intervals, points) -> np.ndarray:
    """Whether each point lies in u (closed intervals; u in union form)."""
    us, ue = u
    x = np.asarray(points, dtype=np.float64)
    if us.size == 0:
        return np.zeros(x.shape, dtype=bool)
    idx = np.searchsorted(us, x, side="right") - 1
    safe = np.maximum(idx, 0)
    return (idx >= 0) & (x <= ue[safe])


def split_uncovered(starts, ends, cover: Intervals) -> np.ndarray:
    """Each interval's share of the time not covered by `cover`, split equally among the
    intervals active at that moment: the shares add up to |union(intervals) \\ cover|.

    Used for per-collective exposed time, so blocks' exposed times sum to the step's.
    """
    return _split(starts, ends, cover, covered=False)


def split_covered(starts, ends, cover: Intervals) -> np.ndarray:
    """Each interval's share of the time `cover` covers, split equally among the intervals
    active at that moment: the shares add up to |union(intervals) ∩ cover|."""
    return _split(starts, ends, cover, covered=True)


def _split(starts, ends, cover: Intervals, covered: bool) -> np.ndarray:
    s, e = as_arrays(starts, ends)
    if s.size == 0:
        return np.zeros(0)
    points = np.unique(np.concatenate([s, e]))
    first = np.searchsorted(points, s)
    last = np.searchsorted(points, e)
    delta = np.bincount(first, minlength=points.size) - np.bincount(last, minlength=points.size)
    active = np.cumsum(delta)[:-1]
    inside = np.diff(covered_up_to(cover, points))
    part = inside if covered else np.diff(points) - inside
    share = np.where(active > 0, part / np.maximum(active, 1), 0.0)
    prefix = np.concatenate([[0.0], np.cumsum(share)])
    return prefix[last] - prefix[first]


def grouped_union_length(groups, starts, ends) -> pd.Series:
    """|union| per group label, without a Python loop over groups."""
    frame = pd.DataFrame({"g": groups, "s": starts, "e": ends}).sort_values(
        ["g", "s"], kind="stable"
    )
    if frame.empty:
        return pd.Series(dtype=np.float64)
    prev_end = frame.groupby("g", sort=False)["e"].cummax().groupby(frame["g"], sort=False).shift()
    new = prev_end.isna() | (frame["s"] > prev_end)
    run = new.cumsum()
    merged = frame.groupby(run, sort=False).agg(g=("g", "first"), s=("s", "min"), e=("e", "max"))
    return (merged["e"] - merged["s"]).groupby(merged["g"]).sum()


def overlapping(a_starts, a_ends, b_starts, b_ends) -> list[list[int]]:
    """For each interval of a (sorted, disjoint: union form), the indices of the intervals of b
    that overlap it (start < a_end and end > a_start), by b's start. One heap sweep."""
    import heapq

    a_s, a_e = as_arrays(a_starts, a_ends)
    b_s, b_e = as_arrays(b_starts, b_ends)
    order = np.argsort(b_s, kind="stable").tolist()
    out: list[list[int]] = []
    active: list[tuple[float, int]] = []
    j = 0
    for lo, hi in zip(a_s.tolist(), a_e.tolist(), strict=True):
        while j < len(order) and b_s[order[j]] < hi:
            heapq.heappush(active, (float(b_e[order[j]]), order[j]))
            j += 1
        while active and active[0][0] <= lo:
            heapq.heappop(active)
        out.append(sorted((i for _, i in active), key=lambda i: (b_s[i], i)))
    return out
