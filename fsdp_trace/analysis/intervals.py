"""The one interval algebra (numpy, µs floats). Sets of intervals are pairs of arrays
(starts, ends); "union form" means sorted, disjoint and non-touching, as `union` returns.

Every overlap figure in the tool is built from these: sums of durations double-count
concurrent streams, unions do not.
"""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pandas as pd

try:  # pandas' own groupby-sum kernel (Kahan, in row order), called without the groupby around it
    from pandas._libs.groupby import group_sum as _pandas_group_sum
except ImportError:  # pragma: no cover - a pandas without it: the public groupby
    _pandas_group_sum = None
try:  # pandas 3.1 and later sum runs of sorted group codes with np.add.reduceat
    from pandas.core.groupby.ops import BaseGrouper

    _SORTED_RUNS = hasattr(BaseGrouper, "_reduceat_aggregate")
except ImportError:  # pragma: no cover - another pandas layout: its kernel everywhere
    _SORTED_RUNS = False

Intervals = tuple[np.ndarray, np.ndarray]
EMPTY: Intervals = (np.empty(0), np.empty(0))
# Intervals with a label each (the row of the interval they come from, a step, ...).
Labelled = tuple[np.ndarray, np.ndarray, np.ndarray]
_EMPTY_EACH: Labelled = (np.empty(0), np.empty(0), np.empty(0, dtype=np.int64))


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


def _overlapping_runs(a: Intervals, b: Intervals) -> tuple[np.ndarray, np.ndarray]:
    """For each interval of `a`, the run [lo, hi) of `b`'s that share more than a point with
    it (both in union form: sorted and strictly apart, so each run is contiguous)."""
    (a_s, a_e), (b_s, b_e) = a, b
    return np.searchsorted(b_e, a_s, "right"), np.searchsorted(b_s, a_e, "left")


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """a ∩ b for two sets in union form: for each interval of a and each of b sharing more
    than a point with it, their common part (pieces of a union form are strictly apart, so
    the pieces are too: sorted, nothing to merge). Only the pairs that meet are read."""
    s, e, _ = intersect_each(a, b)
    return s, e


def intersect_each(a: Intervals, b: Intervals) -> Labelled:
    """`intersect(a, b)`, each piece with the row of the interval of `a` it lies in: `a`
    in any order, overlapping or not (each interval met by itself), `b` in union form;
    pieces in the order of `a`'s intervals."""
    (a_s, a_e), (b_s, b_e) = a, b
    if not a_s.size or not b_s.size:
        return _EMPTY_EACH
    lo, hi = _overlapping_runs(a, b)
    j = _ranges(lo, hi)
    if not j.size:
        return _EMPTY_EACH
    i = np.repeat(np.arange(a_s.size), np.maximum(hi - lo, 0))
    s, e = np.maximum(a_s[i], b_s[j]), np.minimum(a_e[i], b_e[j])
    keep = e > s
    return s[keep], e[keep], i[keep]


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """a \\ b for two sets in union form: each interval of a cut by the run of b's sharing
    more than a point with it (the pieces between them; empty ones dropped, and pieces
    touching across an empty interval of b merged, as a union)."""
    (a_s, a_e), (b_s, _) = a, b
    if not a_s.size:
        return EMPTY
    if not b_s.size:
        keep = a_e > a_s
        return a_s[keep], a_e[keep]
    s, e, _ = _cut(a, b)
    keep = e > s
    return union(s[keep], e[keep])


def subtract_each(a: Intervals, b: Intervals) -> Labelled:
    """`subtract(a, b)` of each interval of `a` by itself, each piece with the row of the
    interval it comes from: `a` in any order, overlapping or not, `b` in union form; pieces
    in the order of `a`'s intervals, those touching across an empty interval of b merged
    (as `subtract`'s union does; pieces of different intervals never)."""
    (a_s, a_e), (b_s, _) = a, b
    if not b_s.size:
        keep = a_e > a_s
        return a_s[keep], a_e[keep], np.flatnonzero(keep)
    s, e, src = _cut(a, b)
    keep = e > s
    s, e, src = s[keep], e[keep], src[keep]
    if not s.size:
        return _EMPTY_EACH
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = (src[1:] != src[:-1]) | (s[1:] > e[:-1])  # one interval's pieces: sorted, apart
    first = np.flatnonzero(new)
    return s[first], np.maximum.reduceat(e, first), src[first]


def _cut(a: Intervals, b: Intervals) -> Labelled:
    """Each interval of `a` cut where the run of b's sharing more than a point with it lies:
    the pieces between them (empty ones and those of negative length included), each with
    the row of its interval in `a`."""
    (a_s, a_e), (b_s, b_e) = a, b
    lo, hi = _overlapping_runs(a, b)
    cuts = np.maximum(hi - lo, 0)
    first = np.cumsum(cuts + 1) - (cuts + 1)  # each interval's first piece
    s = np.empty(int(cuts.sum()) + a_s.size)
    e = np.empty_like(s)
    j = _ranges(lo, hi)
    at = np.repeat(first - lo, cuts) + j  # the piece that ends where b's interval j starts
    s[first], e[first + cuts] = a_s, a_e
    e[at], s[at + 1] = b_s[j], b_e[j]
    return s, e, np.repeat(np.arange(a_s.size), cuts + 1)


def union_each(starts, ends, labels) -> Labelled:
    """`union` of each label's intervals: sorted by label, then as `union` sorts them; the
    label of each merged interval."""
    s, e = as_arrays(starts, ends)
    label = np.asarray(labels, dtype=np.int64)
    if not s.size:
        return _EMPTY_EACH
    order, first = _merged_by_label(s, e, label)
    return s[order][first], np.maximum.reduceat(e[order], first), label[order][first]


def _merged_by_label(s: np.ndarray, e: np.ndarray, label: np.ndarray):
    """The order that sorts intervals by label, then by start (stable, as `union` sorts), and
    where, in that order, each label's union starts a merged interval (`union`'s rule: a
    start past the running maximum of the label's ends so far). Not empty."""
    order = np.lexsort((s, label))
    s, e, label = s[order], e[order], label[order]
    group = np.concatenate([[0], np.cumsum(label[1:] != label[:-1])])
    # The running maximum of the ends within each label, exact: ends as their ranks among
    # all ends, offset by the label's group so that a group never reads an earlier one's.
    values, rank = unique(e, return_inverse=True)
    offset = group * (values.size + 1)
    running_end = values[np.maximum.accumulate(offset + rank) - offset]
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = (group[1:] != group[:-1]) | (s[1:] > running_end[:-1])
    return order, np.flatnonzero(new)


def lengths_each(starts, ends, labels, n: int) -> list[float]:
    """`length` of each label's intervals, labels 0..n-1 (sorted ascending): each one's own
    sum, as `length` adds it (numpy's pairwise sum of its intervals in order)."""
    s, e = as_arrays(starts, ends)
    durations = e - s
    bounds = np.searchsorted(np.asarray(labels), np.arange(n + 1)).tolist()
    return [float(np.sum(durations[lo:hi])) if hi > lo else 0.0 for lo, hi in pairwise(bounds)]


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


def _ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The integers of every [lo_i, hi_i), concatenated."""
    n = np.maximum(np.asarray(hi, np.int64) - np.asarray(lo, np.int64), 0)
    total = int(n.sum())
    if not total:
        return np.empty(0, np.int64)
    return np.repeat(lo - np.cumsum(n) + n, n) + np.arange(total)


def _union_of_runs(lo: np.ndarray, hi: np.ndarray, by: np.ndarray) -> np.ndarray:
    """The integers of every run [lo_i, hi_i), each once and in order, where lo rises with
    `by` (the queries' starts): taken in that order, each run's end raised to the largest so
    far and its start past the previous end, the runs are disjoint and rising, and cover the
    same integers."""
    if by.size > 1 and np.any(by[1:] < by[:-1]):
        order = np.argsort(by, kind="stable")
        lo, hi = lo[order], hi[order]
    hi = np.maximum.accumulate(hi)
    lo = np.maximum(lo, np.concatenate([[0], hi[:-1]]))
    return _ranges(lo, hi)


def near(u: Intervals, starts, ends) -> Intervals:
    """The intervals of `u` (union form) that overlap or touch any [s_i, e_i]. The others lie
    strictly apart from all of them, so `intersect(a, near(b, *a))` is `intersect(a, b)` to
    the bit: what keeps a per-step intersection with a whole trace's union from reading the
    whole union at every step (quadratic in the trace's length)."""
    us, ue = u
    s, e = as_arrays(starts, ends)
    if not us.size or not s.size:
        return EMPTY
    return tuple(
        x[_union_of_runs(np.searchsorted(ue, s, "left"), np.searchsorted(us, e, "right"), s)]
        for x in u
    )


def parents_first(starts, ends) -> np.ndarray:
    """`np.lexsort((-ends, starts))`: by start, the longer first at equal starts (a parent
    before its children), ties in the order given. Sorted by start, then only the runs of
    equal starts by end: lexsort straight away costs ~10x more on a large trace's operators.
    Any numeric type, kept (ns need int64)."""
    s, e = np.asarray(starts), np.asarray(ends)
    order = np.argsort(s, kind="stable")
    s_sorted = s[order]
    tied = s_sorted[1:] == s_sorted[:-1]
    if s_sorted.dtype.kind == "f":  # NaN starts sort last, equal among themselves
        tied |= np.isnan(s_sorted[1:]) & np.isnan(s_sorted[:-1])
    if not tied.any():
        return order
    in_run = np.zeros(s.size, dtype=bool)
    in_run[1:] |= tied
    in_run[:-1] |= tied
    at = np.flatnonzero(in_run)  # the runs' places in `order`, each run's together
    run = np.cumsum(np.concatenate([[True], ~tied]))[at]  # a number per run, rising
    order[at] = order[at[np.lexsort((-e[order[at]], run))]]
    return order


class StartIndex:
    """Intervals in any order (nested, overlapping), sorted by start with the running maximum
    of their ends, so that those that can meet a few query intervals are found without
    reading them all: per query, one run of the sorted intervals."""

    def __init__(self, starts, ends) -> None:
        s, e = as_arrays(starts, ends)
        self.order = np.argsort(s, kind="stable")
        self.starts = s[self.order]
        self.reach = np.maximum.accumulate(e[self.order]) if s.size else e

    def meeting(self, starts, ends) -> np.ndarray:
        """Rows (in the order the intervals were given; sorted) of every interval that
        overlaps or touches a query [s_i, e_i], and maybe a few that do not; every other one
        lies strictly apart from all queries (its `overlap_each` with them is exactly 0)."""
        s, e = as_arrays(starts, ends)
        if not self.starts.size or not s.size:
            return np.empty(0, np.int64)
        lo = np.searchsorted(self.reach, s, "left")  # before: every end < s
        hi = np.searchsorted(self.starts, e, "right")  # from here: every start > e
        return np.sort(self.order[_union_of_runs(lo, hi, s)], kind="stable")  # runs: linear


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
    points = unique(np.concatenate([s, e]))
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
    """|union| per group label (indexed by the labels, sorted; labels that are NaN left out),
    without a Python loop over groups: one sort and a few numpy passes, the lengths summed per
    group as pandas sums them (one groupby over integer codes)."""
    s, e = as_arrays(starts, ends)
    series = pd.Series(groups)
    codes, _ = pd.factorize(series, sort=True)
    if np.isnan(s).any() or np.isnan(e).any() or (codes < 0).any():
        return _grouped_union_length_frame(groups, starts, ends)  # NaN: pandas' own ways
    if codes.size == 0:
        return pd.Series(dtype=np.float64)
    _, lengths, heads = union_length_by_code(codes, s, e)
    index = pd.Index(series.array[heads], name="g")  # the labels' own type
    return pd.Series(lengths, index=index)


def union_length_by_code(codes: np.ndarray, s: np.ndarray, e: np.ndarray):
    """|union| per group of integer `codes` (≥ 0; s, e without NaN): (the codes present,
    ascending; their lengths; a row of each), the lengths summed as `grouped_union_length`
    sums them."""
    codes = np.asarray(codes, dtype=np.int64)
    order, first = _merged_by_label(s, e, codes)
    codes, s, e = codes[order], s[order], e[order]
    merged = np.maximum.reduceat(e, first) - s[first]
    heads = np.flatnonzero(np.diff(codes, prepend=-1))  # each group's first row, by code
    merged_code = codes[first]  # ascending: a new group where the code changes
    dense = np.cumsum(np.diff(merged_code, prepend=-1) != 0) - 1
    lengths = groupby_sum(dense, merged, heads.size)
    return codes[heads], lengths, order[heads]


# --- grouped reductions on integer codes, as pandas' groupby gives them (sums: see group_sum) ---
# A groupby costs ~1 ms of fixed pandas overhead however few its rows; per rank the analysis
# runs dozens over tables of tens to hundreds of rows (blocks, collectives, labels).

SMALL_GROUPS = 64  # largest group summed in numpy; larger ones go through pandas' own sum


FEW_KEYS = 128  # rows numbered with a dict: a factorization a column costs more on so few
_PLAIN_NUMBERS = (int, float, bool)  # Python's own: `tolist` makes them of numpy's numbers


def _first_seen_few(columns: list) -> tuple[np.ndarray, np.ndarray] | None:
    """`first_seen_codes` of a few rows of text and numbers, none missing, by a dict of the
    rows' values as Python objects, which compares them as factorizing does (equal values,
    whatever their objects). None for anything else (a missing value, a date, a tuple ...):
    pandas' own rules apply to those."""
    rows = list(zip(*(_python_values(c) for c in columns), strict=True))
    for row in rows:
        for value in row:
            if not (isinstance(value, str) or type(value) in _PLAIN_NUMBERS) or value != value:
                return None
    numbers: dict[tuple, int] = {}
    first: list[int] = []
    codes = []
    for i, row in enumerate(rows):
        code = numbers.setdefault(row, len(numbers))
        if code == len(first):
            first.append(i)
        codes.append(code)
    return np.array(codes, dtype=np.int64), np.array(first, dtype=np.int64)


def _python_values(column) -> list:
    """A column's values as Python objects (a Series, array, Categorical or list)."""
    return column if isinstance(column, list) else column.tolist()


# pandas' wrapper of a numpy column's values (`Series.array`): `PandasArray` before 2.1.
_NUMPY_WRAPPER = getattr(pd.arrays, "NumpyExtensionArray", None) or pd.arrays.PandasArray


def first_seen_codes(columns: list, dropna: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the number of its combination of `columns` in order of first appearance
    (`groupby(columns, sort=False).ngroup()`), and a row of each combination (its first);
    with `dropna`, a row with NaN in any column gets -1 (groupby leaves it out)."""
    n = len(columns[0])
    if n <= FEW_KEYS:
        found = _first_seen_few(columns)
        if found is not None:
            return found
    combined = np.zeros(n, dtype=np.int64)
    missing = np.zeros(n, dtype=bool)
    span = 1  # the numbers `combined` can hold so far
    for column in columns:
        if isinstance(column, _NUMPY_WRAPPER):  # pandas 2 warns on one
            column = column.to_numpy()
        codes, uniques = pd.factorize(column, use_na_sentinel=dropna)
        if dropna:
            missing |= codes < 0
        if span * (len(uniques) + 1) >= 1 << 62:  # numbered again to stay small
            combined = pd.factorize(combined)[0].astype(np.int64)
            span = int(combined.max()) + 1 if n else 1
        combined = combined * (len(uniques) + 1) + codes + 1
        span *= len(uniques) + 1
    combined = pd.factorize(combined)[0].astype(np.int64)  # in order of first appearance
    if dropna and missing.any():
        kept = np.flatnonzero(~missing)
        renumbered = pd.factorize(combined[kept])[0].astype(np.int64)
        combined = np.full(n, -1, dtype=np.int64)
        combined[kept] = renumbered
    present = combined >= 0
    order = np.flatnonzero(present)
    _, first = np.unique(combined[order], return_index=True)
    return combined, order[first]


def groupby_sum(codes: np.ndarray, values, n_groups: int) -> np.ndarray:
    """`Series(values).groupby(codes).sum()` for every code 0..n_groups-1 (-1 left out; a group
    with no value other than NaN sums to 0), to the bit, without the groupby machinery around
    it (~0.3 ms a call however few the rows; a rank's analysis makes a dozen). pandas sums a
    group with its compensated (Kahan) kernel in row order, or, since 3.1, where the codes are
    sorted and no value is NaN, with `np.add.reduceat` over each run of one code."""
    values = np.asarray(values, dtype=np.float64)
    labels = np.asarray(codes, dtype=np.intp)
    keep = labels >= 0
    if not keep.all():
        labels, values = labels[keep], values[keep]
    if labels.size and int(labels.max()) >= n_groups:  # pandas' kernel does not check
        raise IndexError(f"group code {int(labels.max())} past the {n_groups} groups")
    if (
        _SORTED_RUNS
        and labels.size
        and (labels[1:] >= labels[:-1]).all()
        and not np.isnan(values).any()
    ):
        starts = np.flatnonzero(np.diff(labels, prepend=-1))  # each run of one code
        total = np.zeros(n_groups, dtype=np.float64)
        total[labels[starts]] = np.add.reduceat(values, starts)
        return total
    if _pandas_group_sum is not None:
        out = np.zeros((n_groups, 1), dtype=np.float64)
        try:
            _pandas_group_sum(
                out=out,
                counts=np.zeros(n_groups, dtype=np.int64),
                values=values.reshape(-1, 1),
                labels=np.ascontiguousarray(labels),
                mask=None,
                result_mask=None,
                min_count=0,
            )
        except (TypeError, ValueError):  # another pandas' signature: its public groupby
            pass
        else:
            return out[:, 0]
    total = np.zeros(n_groups, dtype=np.float64)
    sums = pd.Series(values).groupby(labels).sum()
    total[sums.index.to_numpy()] = sums.to_numpy()
    return total


def sorted_category_codes(values: object, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """For a categorical column of sorted text categories (the loader's names): the codes at
    `rows` numbered over the categories they use, in the names' order (-1 where missing), and
    those names; what `pd.factorize(names, sort=True)` gives, without reading a string per
    row. None for any other column (factorize its values)."""
    if not (
        isinstance(values, pd.Categorical)
        and values.categories.inferred_type == "string"
        and values.categories.is_monotonic_increasing
    ):
        return None
    codes = values.codes[rows].astype(np.int64)
    used = unique(codes[codes >= 0])
    code = np.where(codes >= 0, np.searchsorted(used, codes), -1)
    return code, np.asarray(values.categories[used], dtype=object)


def group_sum(codes: np.ndarray, values, n_groups: int, min_count: int = 0) -> np.ndarray:
    """`Series(values).groupby(codes).sum(min_count=min_count)` per group 0..n_groups-1
    (codes -1 left out): pandas' compensated (Kahan) sum in row order, NaN skipped, NaN where
    fewer than `min_count` values. Not always pandas' last bit: under pandas 3.1 a few small
    groups of rounded values differ by one ulp (here the correctly rounded sum, as
    `math.fsum`: [2.3, 19.399999999999995, 15.5, 12.600000000000009] → 49.800000000000004,
    pandas 49.8); the shipped samples' outputs show no difference."""
    values = np.asarray(values, dtype=np.float64)
    keep = (codes >= 0) & ~np.isnan(values)
    lab, val = codes[keep], values[keep]
    nobs = np.bincount(lab, minlength=n_groups)
    total = np.zeros(n_groups, dtype=np.float64)
    if lab.size and nobs.max() > SMALL_GROUPS:
        total = groupby_sum(lab, val, n_groups)
    elif lab.size:
        order = np.argsort(lab, kind="stable")
        start = np.concatenate([[0], np.cumsum(nobs)[:-1]])
        position = np.empty(lab.size, dtype=np.int64)
        position[order] = np.arange(lab.size) - start[lab[order]]
        by_position = np.argsort(position, kind="stable")
        edges = np.searchsorted(position[by_position], np.arange(int(nobs.max()) + 1))
        compensation = np.zeros(n_groups, dtype=np.float64)
        for lo, hi in pairwise(edges.tolist()):
            rows = by_position[lo:hi]  # at most one row of each group
            g = lab[rows]
            y = val[rows] - compensation[g]
            t = total[g] + y
            c = t - total[g] - y
            compensation[g] = np.where(c != c, 0.0, c)
            total[g] = t
    if min_count > 0:
        total[nobs < min_count] = np.nan
    return total


def descending_order(values: np.ndarray, kind: str = "stable") -> np.ndarray:
    """The row order of `sort_values(ascending=False, kind=kind)` (pandas' `nargsort`, step by
    step: the rows reversed, sorted ascending, reversed back), NaN last in their order. With
    "stable": largest first, equal values in their order."""
    values = np.asarray(values, dtype=np.float64)
    missing = np.isnan(values)
    rows = np.flatnonzero(~missing)[::-1]
    ranked = rows[np.argsort(values[rows], kind=kind)][::-1]
    return np.concatenate([ranked, np.flatnonzero(missing)])


# Integers are counted, not sorted, when their range is at most this many times their count
# (plus the floor): the table of counts stays as small as the values themselves.
COUNTED_SPAN_PER_VALUE = 2
COUNTED_SPAN_FLOOR = 4096


def unique(values, return_inverse: bool = False, return_counts: bool = False):
    """`np.unique(values, return_inverse=..., return_counts=...)` of a 1-D array, the same
    arrays, without numpy's quicksort: integers of a small range (a step, a stream, a code)
    by counting them, O(n); anything else by a stable sort, which is linear on the nearly
    sorted times of a trace (np.unique's quicksort is not: ~12 ms for 60,000 floats or small
    integers, where this takes a fraction of a millisecond). NaNs are one value, last, as
    np.unique's `equal_nan` makes them. Where floats equal as numbers differ in their bits
    (-0.0 and 0.0, NaNs), the one standing for them is the first in the input, where
    numpy's unstable sort picks either: the same numbers, inverse and counts."""
    v = np.asarray(values)
    if v.ndim != 1 or v.dtype.kind not in "iuf" or (v.dtype.kind == "u" and v.itemsize == 8):
        return np.unique(v, return_inverse=return_inverse, return_counts=return_counts)
    if v.dtype.kind in "iu" and v.size:
        low, high = int(v.min()), int(v.max())
        span = high - low + 1
        if span <= COUNTED_SPAN_PER_VALUE * v.size + COUNTED_SPAN_FLOOR:
            return _counted(v, low, span, return_inverse, return_counts)
    order = np.argsort(v, kind="stable")
    ordered = v[order]
    first = np.empty(v.size, dtype=bool)
    first[:1] = True
    first[1:] = ordered[1:] != ordered[:-1]
    if v.dtype.kind == "f" and v.size and np.isnan(ordered[-1]):  # NaN != NaN: one value
        nan_at = int(np.searchsorted(ordered, ordered[-1], side="left"))
        first[nan_at] = True
        first[nan_at + 1 :] = False
    out = [ordered[first]]
    if return_inverse:
        inverse = np.empty(v.size, dtype=np.intp)
        inverse[order] = np.cumsum(first) - 1
        out.append(inverse)
    if return_counts:
        out.append(np.diff(np.append(np.flatnonzero(first), v.size)))
    return out[0] if len(out) == 1 else tuple(out)


def _counted(v: np.ndarray, low: int, span: int, return_inverse: bool, return_counts: bool):
    """`unique` of integers in [low, low + span) by a table of counts."""
    shifted = v.astype(np.int64) - low if low else v.astype(np.intp, copy=False)
    counts = np.bincount(shifted, minlength=span)
    present = counts > 0
    out = [(np.flatnonzero(present) + low).astype(v.dtype)]
    if return_inverse:
        out.append((np.cumsum(present, dtype=np.intp) - 1)[shifted])
    if return_counts:
        out.append(counts[present])
    return out[0] if len(out) == 1 else tuple(out)


def value_counts(values: np.ndarray) -> dict:
    """Each distinct value (sortable, none missing) → how many times it occurs."""
    distinct, n = unique(values, return_counts=True)
    return dict(zip(distinct.tolist(), n.tolist(), strict=True))


def mode(values: np.ndarray):
    """`Series.mode().iloc[0]` of sortable values, none missing: the most frequent, the
    smallest on a tie."""
    distinct, n = unique(values, return_counts=True)
    return distinct[np.argmax(n)]


def median(values) -> float:
    """`Series.median()`: NaN skipped, NaN when nothing is left."""
    values = np.asarray(values, dtype=np.float64)
    values = values[~np.isnan(values)]
    return float(np.median(values)) if values.size else float("nan")


def short_median(values) -> float:
    """`float(np.median(values))` for a short list of float64 or integer numbers (a few per
    step), without the array numpy makes: the middle value, or the two middle ones, summed
    as numpy's mean sums them (from 0.0, so -0.0 reads +0.0) and halved. NaN among them, none
    at all, or an array of another float type: numpy's own answer."""
    if isinstance(values, np.ndarray) and values.dtype.kind not in "iub" and values.dtype != float:
        return float(np.median(values))
    ordered = sorted(map(float, values))
    n = len(ordered)
    if n == 0 or any(v != v for v in ordered):
        return float(np.median(np.asarray(values, dtype=np.float64)))
    mid = n // 2
    return 0.0 + ordered[mid] if n % 2 else (0.0 + ordered[mid - 1] + ordered[mid]) / 2


def column_numbers(frame: pd.DataFrame, column: str) -> np.ndarray:
    """A column's values as `pd.to_numeric(errors="coerce")` reads them, widened to float64
    (NaN: missing or not a number); a float or integer column read as it is (a thousand
    ranks' tables are read through here)."""
    values = frame[column]
    if values.dtype.kind in "fi":
        return values.to_numpy(dtype=np.float64)
    return pd.to_numeric(values, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)


def column_median(frame: pd.DataFrame, column: str) -> float:
    """`pd.to_numeric(frame[column], errors="coerce").median()` (NaN for none): `median` of
    the array where the column is float64 or integer (pandas takes an integer column's
    median in float64 too), else pandas' own (a float32 column's median is float32's)."""
    values = frame[column]
    if values.dtype == np.float64 or values.dtype.kind in "iu":
        return median(values.to_numpy(dtype=np.float64))
    numbers = pd.to_numeric(values, errors="coerce").dropna()
    return float(numbers.median()) if len(numbers) else float("nan")


def total(values) -> float:
    """`Series.sum()`: NaN counted as 0 where it stands (numpy's pairwise sum over the same
    positions, so the same bits), 0 for none."""
    values = np.asarray(values, dtype=np.float64)
    return float(np.where(np.isnan(values), 0.0, values).sum())


def group_totals(codes: np.ndarray, values, n_groups: int, min_count: int = 0) -> np.ndarray:
    """`total` of each group's values (codes 0..n_groups-1, in row order; -1 left out), NaN
    where fewer than `min_count` are not NaN: a lambda `s.sum(min_count=...)` over a groupby,
    to the bit, without a Python call per group into pandas."""
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(codes, kind="stable")
    sorted_codes = codes[order]
    starts = np.searchsorted(sorted_codes, np.arange(n_groups), side="left")
    ends = np.searchsorted(sorted_codes, np.arange(n_groups), side="right")
    out = np.full(n_groups, np.nan)
    for group, (a, b) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        part = values[order[a:b]]
        if int((~np.isnan(part)).sum()) >= min_count:
            out[group] = total(part)
    return out


def mean(values) -> float:
    """`Series.mean()`: `total` over the values that are not NaN (NaN for none)."""
    values = np.asarray(values, dtype=np.float64)
    count = int((~np.isnan(values)).sum())
    return total(values) / count if count else float("nan")


def nan_min(values) -> float:
    """`Series.min()`: the least value that is not NaN (NaN for none)."""
    values = np.asarray(values, dtype=np.float64)
    values = values[~np.isnan(values)]
    return float(values.min()) if values.size else float("nan")


def nan_max(values) -> float:
    """`Series.max()`: the largest value that is not NaN (NaN for none)."""
    values = np.asarray(values, dtype=np.float64)
    values = values[~np.isnan(values)]
    return float(values.max()) if values.size else float("nan")


def group_max(codes: np.ndarray, values, n_groups: int) -> np.ndarray:
    """`groupby(codes).max()` per group (codes -1 left out): NaN skipped, NaN for none."""
    values = np.asarray(values, dtype=np.float64)
    out = np.full(n_groups, np.nan)
    keep = codes >= 0
    np.fmax.at(out, codes[keep], values[keep])
    return out


def union_length_by_keys(columns: list, starts, ends) -> tuple[np.ndarray, np.ndarray]:
    """|union| per distinct combination of the key `columns` (a row with NaN in any key left
    out before anything is summed): a row of each combination, in order of first
    appearance, and its length, summed as `grouped_union_length` sums the rows with keys (a
    group's length reads only its own intervals, so how the groups are numbered never
    changes it)."""
    s, e = as_arrays(starts, ends)
    code, first = first_seen_codes(columns)
    if first.size == 0:
        return first, np.empty(0)
    kept = code >= 0
    code, s, e = code[kept], s[kept], e[kept]
    if np.isnan(s).any() or np.isnan(e).any():  # pandas' own ways
        lengths = _grouped_union_length_frame(code, s, e)
        return first, lengths.reindex(np.arange(first.size)).to_numpy(dtype=np.float64)
    _, lengths, _ = union_length_by_code(code, s, e)  # every code 0..n-1 is present
    return first, lengths


def _grouped_union_length_frame(groups, starts, ends) -> pd.Series:
    """`grouped_union_length` over a frame (where a start or end is NaN)."""
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
