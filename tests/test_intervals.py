"""The interval algebra against brute force on a fine grid, over many random sets."""

from __future__ import annotations

import decimal
import warnings

import numpy as np
import pandas as pd
import pytest

from fsdp_trace.analysis import intervals as iv
from tests.synth import random_unit_rows

RES = 0.5


def grid_mask(starts, ends, hi=200.0):
    grid = np.arange(0.0, hi, RES) + RES / 2
    mask = np.zeros(grid.size, dtype=bool)
    for a, b in zip(starts, ends, strict=True):
        mask |= (grid >= a) & (grid < b)
    return mask


def random_sets(seed: int):
    rng = np.random.default_rng(seed)
    n, m = rng.integers(0, 9, size=2)
    a_s = rng.integers(0, 150, n).astype(float)
    b_s = rng.integers(0, 150, m).astype(float)
    return a_s, a_s + rng.integers(0, 40, n), b_s, b_s + rng.integers(0, 40, m)


@pytest.mark.parametrize("seed", range(300))
def test_set_operations_match_brute_force(seed):
    a_s, a_e, b_s, b_e = random_sets(seed)
    a, b = iv.union(a_s, a_e), iv.union(b_s, b_e)
    ma, mb = grid_mask(a_s, a_e), grid_mask(b_s, b_e)
    assert iv.length(a) == pytest.approx(ma.sum() * RES)
    assert iv.length(iv.intersect(a, b)) == pytest.approx((ma & mb).sum() * RES)
    assert iv.length(iv.subtract(a, b)) == pytest.approx((ma & ~mb).sum() * RES)
    # union form: sorted, disjoint, not touching
    assert np.all(a[0][1:] > a[1][:-1]) and np.all(a[1] >= a[0])
    # each interval's overlap with b, and shares of the uncovered time that add up
    for k in range(len(a_s)):
        alone = grid_mask([a_s[k]], [a_e[k]])
        assert iv.overlap_each(a_s, a_e, b)[k] == pytest.approx((alone & mb).sum() * RES)
    assert iv.split_uncovered(a_s, a_e, b).sum() == pytest.approx((ma & ~mb).sum() * RES)
    # grouped unions
    groups = np.arange(len(a_s)) % 3
    lengths = iv.grouped_union_length(groups, a_s, a_e)
    for g in set(groups.tolist()):
        assert lengths[g] == pytest.approx(
            grid_mask(a_s[groups == g], a_e[groups == g]).sum() * RES
        )
    # which of b overlap each interval of a (a in union form)
    expected = [
        sorted(
            (j for j in range(len(b_s)) if b_s[j] < hi and b_e[j] > lo), key=lambda j: (b_s[j], j)
        )
        for lo, hi in zip(*a, strict=True)
    ]
    assert iv.overlapping(a[0], a[1], b_s, b_e) == expected


@pytest.mark.parametrize("seed", range(200))
def test_reading_only_what_meets_gives_the_same_bits(seed):
    """`near` and `StartIndex.meeting` leave out only intervals strictly apart from the
    queries: intersections, differences and per-interval overlaps computed on what they keep
    are the whole computation's to the bit, and the left-out intervals' overlap is exactly 0."""
    rng = np.random.default_rng(seed)
    # Fractional times (not on a grid: sums round), touching and nested intervals included.
    n, m = rng.integers(0, 40, size=2)
    a_s = np.round(rng.uniform(0, 500, n), 3)
    b_s = np.round(rng.uniform(0, 500, m), 3)
    a_e = a_s + np.round(rng.exponential(8, n), 3)
    b_e = b_s + np.round(rng.exponential(8, m), 3)
    if m > 1 and n:  # one interval of b touching one of a
        b_e[1] = a_e[0] + (b_e[1] - b_s[1])
        b_s[1] = a_e[0]
    a, b = iv.union(a_s, a_e), iv.union(b_s, b_e)
    kept = iv.near(b, *a)
    for whole, part in (
        (iv.intersect(a, b), iv.intersect(a, kept)),
        (iv.subtract(a, b), iv.subtract(a, kept)),
    ):
        assert whole[0].tobytes() == part[0].tobytes() and whole[1].tobytes() == part[1].tobytes()
    # What `near` leaves out lies strictly apart from every interval of a.
    out = ~np.isin(b[0], kept[0])
    for s, e in zip(b[0][out], b[1][out], strict=True):
        assert not np.any((a[0] <= e) & (a[1] >= s))
    # Nested, overlapping intervals (an operator tree) against a few query intervals.
    rows = iv.StartIndex(b_s, b_e).meeting(*a)
    assert np.all(np.diff(rows) > 0)
    every = iv.overlap_each(b_s, b_e, a)
    assert every[rows].tobytes() == iv.overlap_each(b_s[rows], b_e[rows], a).tobytes()
    left_out = np.setdiff1d(np.arange(m), rows)
    assert np.all(every[left_out] == 0.0)
    touching = [j for j in range(m) if np.any((a[0] <= b_e[j]) & (a[1] >= b_s[j]))]
    assert set(touching) <= set(rows.tolist())


def sweep(a, b, keep_where):
    """a ∩ b or a \\ b the slow way, independently of the module: sweep every boundary of both
    sets in order, keep the elementary segments where `keep_where(in_a, in_b)`, drop empty
    ones and merge those that touch."""
    points = np.concatenate([a[0], a[1], b[0], b[1]])
    if not points.size:
        return iv.EMPTY
    da = np.concatenate([np.ones(a[0].size), -np.ones(a[1].size), np.zeros(2 * b[0].size)])
    db = np.concatenate([np.zeros(2 * a[0].size), np.ones(b[0].size), -np.ones(b[1].size)])
    order = np.argsort(points, kind="stable")
    points = points[order]
    keep = keep_where(np.cumsum(da[order]) > 0, np.cumsum(db[order]) > 0)[:-1]
    s, e = points[:-1][keep], points[1:][keep]
    s, e = s[e > s], e[e > s]
    out_s, out_e = [], []
    for x, y in zip(s.tolist(), e.tolist(), strict=True):
        if out_e and x <= out_e[-1]:
            out_e[-1] = max(out_e[-1], y)
        else:
            out_s.append(x)
            out_e.append(y)
    return np.array(out_s, float), np.array(out_e, float)


@pytest.mark.parametrize("seed", range(300))
def test_intersect_and_subtract_are_the_sweep_to_the_bit(seed):
    """Union forms with touching and zero-length intervals, shared end points, fractions."""
    rng = np.random.default_rng(seed)
    points = np.round(rng.uniform(0, 100, 12), 2)
    sets = []
    for n in rng.integers(0, 25, size=2):
        s = rng.choice(points, n) if seed % 2 else np.round(rng.uniform(0, 100, n), 3)
        sets.append(iv.union(s, s + rng.choice([0.0, 0.5, 1.7, 10.0], n)))
    a, b = sets
    for got, want in (
        (iv.intersect(a, b), sweep(a, b, np.logical_and)),
        (iv.subtract(a, b), sweep(a, b, lambda x, y: x & ~y)),
        (iv.subtract(b, a), sweep(b, a, lambda x, y: x & ~y)),
    ):
        assert got[0].tobytes() == want[0].tobytes() and got[1].tobytes() == want[1].tobytes()


def test_points_and_clipping():
    u = iv.union([0, 10, 12], [5, 12, 20])
    assert u[0].tolist() == [0, 10] and u[1].tolist() == [5, 20]  # touching intervals merge
    assert iv.contains(u, [0, 5, 7, 10, 20, 21]).tolist() == [True, True, False, True, True, False]
    assert iv.covered_up_to(u, [-1, 3, 7, 15, 30]).tolist() == [0, 3, 5, 10, 15]
    s, e = iv.clip(u, 3, 11)
    assert s.tolist() == [3, 10] and e.tolist() == [5, 11]
    assert iv.length(iv.EMPTY) == 0.0 and iv.union([], [])[0].size == 0


# --- the numpy group reductions equal pandas' groupby, to the bit (issue 23) ---------------


def _random_groups(rng, n):
    keys = pd.Series(rng.choice(["x", "y", "zz", None], n), dtype=object)
    values = rng.normal(0, 1e3, n) * rng.choice([1.0, 1e-7, 1e9], n)  # Kahan-sensitive sums
    values[rng.random(n) < 0.2] = np.nan
    return keys, values


def test_group_reductions_equal_pandas_groupby():
    rng = np.random.default_rng(23)
    for _ in range(300):
        n = int(rng.integers(1, 200))
        keys, values = _random_groups(rng, n)
        other = pd.Series(rng.choice(["p", "q"], n)).astype(str)
        codes, first = iv.first_seen_codes([keys, other])
        frame = pd.DataFrame({"a": keys, "b": other, "v": values})
        grouped = frame.groupby(["a", "b"], sort=False)
        expected_codes = np.where(keys.isna().to_numpy(), -1, grouped.ngroup().to_numpy())
        assert np.array_equal(codes, expected_codes)
        assert np.array_equal(keys.to_numpy()[first], grouped["a"].first().to_numpy())
        for min_count in (0, 1):
            assert np.array_equal(
                iv.group_sum(codes, values, first.size, min_count),
                grouped["v"].sum(min_count=min_count).to_numpy(),
                equal_nan=True,
            )
        assert np.array_equal(
            iv.group_max(codes, values, first.size), grouped["v"].max().to_numpy(), equal_nan=True
        )
    big = rng.integers(0, 3, 5000)  # groups past SMALL_GROUPS: pandas' own sum
    values = rng.normal(0, 1, 5000)
    assert np.array_equal(iv.group_sum(big, values, 3), pd.Series(values).groupby(big).sum())


def _pandas_sums(codes: np.ndarray, values: np.ndarray, n_groups: int) -> np.ndarray:
    """The public groupby over the rows of a code (>= 0), every group 0..n_groups-1."""
    kept = codes >= 0
    sums = pd.Series(values[kept]).groupby(codes[kept]).sum()
    out = np.zeros(n_groups)
    out[sums.index.to_numpy()] = sums.to_numpy()
    return out


@pytest.mark.parametrize("way", ["as installed", "kernel missing", "kernel refuses"])
def test_groupby_sum_is_pandas_groupby_sum_to_the_bit(monkeypatch, way):
    """Sorted codes (pandas >= 3.1 sums their runs with reduceat) and unsorted ones (its
    compensated kernel), NaN values, -1 codes, empty groups: the public groupby's bits, also
    where pandas' kernel is not there or refuses the arguments."""
    if way == "kernel missing":
        monkeypatch.setattr(iv, "_pandas_group_sum", None)
    elif way == "kernel refuses":

        def refuses(**_):
            raise TypeError("another signature")

        monkeypatch.setattr(iv, "_pandas_group_sum", refuses)
    rng = np.random.default_rng(5)
    for i in range(400):
        n, n_groups = int(rng.integers(0, 300)), int(rng.integers(1, 12))
        codes = rng.integers(-1, n_groups, n)
        if i % 2:
            codes = np.sort(codes)
        values = rng.normal(0, 1e3, n) * rng.choice([1.0, 1e-9, 1e9], n)  # Kahan-sensitive
        if i % 3 == 0:
            values[rng.random(n) < 0.1] = np.nan
        got = iv.groupby_sum(codes, values, n_groups)
        expected = _pandas_sums(codes, values, n_groups)
        assert np.array_equal(got.view(np.int64), expected.view(np.int64))


def test_group_totals_are_a_per_group_series_sum_to_the_bit():
    """`group_totals` against the lambda it replaces, `groupby(...).agg(lambda s:
    s.sum(min_count=...))`, on groups of 1 to hundreds of values (numpy's pairwise sum
    differs from a running sum from 9 values on), NaN and all-NaN groups, dropna=False keys."""
    rng = np.random.default_rng(31)
    for _ in range(200):
        n = int(rng.integers(1, 400))
        keys = pd.Series(rng.choice(["a", "b", "c", None], n, p=[0.6, 0.2, 0.15, 0.05]))
        values = rng.normal(0, 1e3, n) * rng.choice([1e-3, 1.0, 1e6], n)
        values[rng.random(n) < 0.2] = np.nan
        values[(keys == "c").to_numpy()] = np.nan  # a group with nothing but NaN
        frame = pd.DataFrame({"k": keys, "v": values})
        grouped = frame.groupby("k", dropna=False, sort=False)
        for min_count in (0, 1):
            expected = grouped["v"].agg(lambda s, m=min_count: s.sum(min_count=m)).to_numpy()
            got = iv.group_totals(grouped.ngroup().to_numpy(), values, grouped.ngroups, min_count)
            assert np.array_equal(got.view(np.int64), expected.astype(np.float64).view(np.int64))


def test_grouped_union_lengths_equal_the_frame_way():
    rng = np.random.default_rng(7)
    for _ in range(300):
        n = int(rng.integers(1, 150))
        step = pd.Series(rng.integers(0, 12, n))
        phase = pd.Series(rng.choice(["forward", "backward", "recompute"], n)).astype(str)
        starts = np.round(rng.uniform(0, 100, n), 1)
        ends = starts + np.round(rng.uniform(0, 20, n), 1)
        labels = step.astype(str) + "|" + phase
        expected = iv._grouped_union_length_frame(labels, starts, ends)
        pd.testing.assert_series_equal(
            iv.grouped_union_length(labels, starts, ends), expected, check_exact=True
        )
        rows, lengths = iv.union_length_by_keys([step, phase], starts, ends)
        by_keys = pd.Series(lengths, index=pd.Index(labels.to_numpy()[rows], name="g"))
        pd.testing.assert_series_equal(by_keys.sort_index(), expected, check_exact=True)
        ints = pd.Series(rng.integers(0, 5, n))
        pd.testing.assert_series_equal(
            iv.grouped_union_length(ints, starts, ends),
            iv._grouped_union_length_frame(ints, starts, ends),
            check_exact=True,
        )


def test_union_length_by_keys_leaves_out_missing_keys_and_reads_missing_times():
    """A row with a missing key is in no group; a missing start or end takes pandas' own way:
    the lengths of the frame way over the rows with keys, per text label made of them."""
    rng = np.random.default_rng(8)
    for _ in range(100):
        block, phase, starts, ends = random_unit_rows(rng, int(rng.integers(1, 80)), 20)
        ends[rng.random(ends.size) < 0.1] = np.nan
        labels = pd.Series(
            [None if b is None else f"{b}|{p}" for b, p in zip(block, phase, strict=True)],
            dtype=object,
        )
        keyed = labels.notna().to_numpy()
        expected = iv._grouped_union_length_frame(
            labels[keyed].reset_index(drop=True), starts[keyed], ends[keyed]
        )
        rows, lengths = iv.union_length_by_keys([block, phase], starts, ends)
        got = pd.Series(lengths, index=pd.Index(labels.to_numpy()[rows], name="g"))
        pd.testing.assert_series_equal(got.sort_index(), expected, check_exact=True)


def test_union_length_by_code_equals_pandas_groupby_sum():
    """Unrounded times (the compensated sum matters), groups of a few and of hundreds of
    merged intervals (past SMALL_GROUPS), codes with gaps."""
    rng = np.random.default_rng(11)
    for n, n_codes in ((1, 1), (40, 3), (400, 9), (3000, 4)):
        codes = rng.choice(np.arange(0, 3 * n_codes, 3), n)
        starts = rng.uniform(0, 1e6, n)
        ends = starts + rng.exponential(30.0, n)
        present, lengths, heads = iv.union_length_by_code(codes, starts, ends)
        frame = iv._grouped_union_length_frame(codes, starts, ends)
        assert np.array_equal(present, frame.index.to_numpy())
        assert np.array_equal(lengths, frame.to_numpy())
        assert np.array_equal(codes[heads], present)


@pytest.mark.parametrize(
    "values",
    [
        pd.Series([3.0, np.nan, 1.0, 2.5]),
        pd.Series([5, 1, 4, 2], dtype=np.int64),
        pd.Series([2**53 + 1, 3], dtype=np.int64),
        pd.Series(["1.5", None, "x", 4.0], dtype=object),
        pd.Series([16777216, 16777218], dtype=np.float32),  # pandas' median in float32
        pd.Series([], dtype=np.float64),
        pd.Series([np.nan, np.nan]),
        pd.Series([1.0, np.inf, -np.inf]),
    ],
)
def test_column_numbers_and_median_read_as_to_numeric(values):
    frame = pd.DataFrame({"c": values})
    numeric = pd.to_numeric(frame["c"], errors="coerce")
    expected = numeric.dropna()
    want = float(expected.median()) if len(expected) else float("nan")
    got = iv.column_median(frame, "c")
    assert (np.isnan(want) and np.isnan(got)) or got == want
    np.testing.assert_array_equal(
        iv.column_numbers(frame, "c"), numeric.to_numpy(dtype=np.float64, na_value=np.nan)
    )


def _loose_intervals(rng, points, n: int):
    """`n` intervals in any order: overlapping, nested, touching, repeated, zero-length."""
    s = rng.choice(points, n) if rng.random() < 0.5 else np.round(rng.uniform(0, 100, n), 3)
    return s, s + rng.choice([0.0, 0.5, 1.7, 10.0, 40.0], n)


@pytest.mark.parametrize("seed", range(200))
def test_each_interval_by_itself_is_the_sweep_to_the_bit(seed):
    """`intersect_each` / `subtract_each`: every interval of a loose set (any order,
    overlapping) against a union form with zero-length pieces, each piece with its row: for
    each row, its pieces are the sweep of that interval alone."""
    rng = np.random.default_rng(seed)
    points = np.round(rng.uniform(0, 100, 12), 2)
    a = _loose_intervals(rng, points, int(rng.integers(0, 20)))
    b = iv.union(*_loose_intervals(rng, points, int(rng.integers(0, 20))))
    for each, keep in (
        (iv.intersect_each, np.logical_and),
        (iv.subtract_each, lambda x, y: x & ~y),
    ):
        s, e, row = each(a, b)
        assert np.all(np.diff(row) >= 0)  # in the order of a's intervals
        for i in range(a[0].size):
            want = sweep((a[0][i : i + 1], a[1][i : i + 1]), b, keep)
            mine = row == i
            assert s[mine].tobytes() == want[0].tobytes()
            assert e[mine].tobytes() == want[1].tobytes()


@pytest.mark.parametrize("seed", range(100))
def test_union_and_length_of_each_label_are_each_labels_own(seed):
    """`union_each` and `lengths_each` against `union` and `length` of each label's
    intervals taken apart (labels interleaved, some labels empty)."""
    rng = np.random.default_rng(seed)
    points = np.round(rng.uniform(0, 100, 12), 2)
    n = int(rng.integers(0, 40))
    s, e = _loose_intervals(rng, points, n)
    labels = rng.integers(0, 5, n)
    us, ue, ul = iv.union_each(s, e, labels)
    assert np.all(np.diff(ul) >= 0)
    lengths = iv.lengths_each(us, ue, ul, 6)
    for label in range(6):
        want = iv.union(s[labels == label], e[labels == label])
        assert us[ul == label].tobytes() == want[0].tobytes()
        assert ue[ul == label].tobytes() == want[1].tobytes()
        assert lengths[label] == iv.length(want)  # the same sum, to the bit


@pytest.mark.parametrize("kind", ["float", "nan", "int64"])
def test_parents_first_is_the_lexsort(kind):
    rng = np.random.default_rng(11)
    for _ in range(300):
        n = int(rng.integers(0, 50))
        s = rng.integers(0, 8, n)
        e = s + rng.integers(0, 4, n)
        if kind == "int64":  # ns since the epoch: beyond a float's integers
            s, e = s + 1_700_000_000_000_000_123, e + 1_700_000_000_000_000_123
        else:
            s, e = s.astype(float), e.astype(float)
        if kind == "nan":
            s[rng.random(n) < 0.2] = np.nan
            e[rng.random(n) < 0.2] = np.nan
        assert np.array_equal(iv.parents_first(s, e), np.lexsort((-e, s)))


def test_lengths_of_labels_of_many_intervals_are_numpys_sums():
    """A label's length is numpy's sum of its intervals in order (pairwise beyond 8 values:
    not the sum one by one), as `length` of that label's intervals alone."""
    rng = np.random.default_rng(5)
    n = 2000
    s = rng.uniform(0.0, 1.0, n)  # near 0: durations keep all their bits (not exact sums)
    e = s + 10 ** rng.uniform(-3, 3, n)  # of every magnitude: the order of the sum shows
    labels = np.sort(rng.integers(0, 4, n))  # about 500 intervals a label
    lengths = iv.lengths_each(s, e, labels, 5)
    for label in range(5):
        mine = labels == label
        assert lengths[label] == iv.length((s[mine], e[mine]))
    assert lengths[4] == 0.0
    one_by_one = [float(np.cumsum((e - s)[labels == label])[-1]) for label in range(4)]
    assert one_by_one != lengths[:4]  # the order of the sum shows in the last bits


def test_first_seen_codes_of_many_wide_columns_number_as_groupby():
    """Columns whose distinct values multiply past 2^62 (renumbered on the way): the numbers
    `groupby(columns, sort=False).ngroup()` gives, with and without NaN rows."""
    rng = np.random.default_rng(41)
    n = 4000
    columns = [pd.Series(rng.integers(0, 3000, n)) for _ in range(6)]
    columns.append(pd.Series(rng.choice(["a", "b", None], n), dtype=object))
    frame = pd.DataFrame({f"c{i}": c for i, c in enumerate(columns)})
    for dropna in (True, False):
        codes, first = iv.first_seen_codes(columns, dropna=dropna)
        expected = frame.groupby(list(frame.columns), sort=False, dropna=dropna).ngroup()
        assert np.array_equal(codes, expected.fillna(-1).to_numpy(dtype=np.int64))
        assert np.array_equal(np.sort(codes[first]), np.arange(first.size))


def test_first_seen_codes_of_few_rows_number_as_groupby():
    """A few rows (numbered with a dict) of every kind of column the analysis groups by: text
    as str and categorical Series and object arrays (numpy's str among them), integers,
    floats with 0.0 and -0.0, objects 1 and 1.0, with and without missing values: the numbers
    and first rows of `groupby(columns, sort=False, dropna=...)`, as the factorizing way
    gives them on more rows."""
    rng = np.random.default_rng(43)
    for _ in range(300):
        n = int(rng.integers(1, iv.FEW_KEYS + 1))
        text = rng.choice(["a", "b", "c"], n)
        columns = [
            pd.Series(text).astype(str),
            pd.Series(text).astype("category"),
            np.array([np.str_(t) if i % 2 else str(t) for i, t in enumerate(text)], dtype=object),
            rng.integers(0, 3, n),
            rng.choice([0.0, -0.0, 1.5], n),
            np.array(rng.choice([1, 1.0, 2], n).tolist(), dtype=object),
        ]
        if rng.random() < 0.3:
            columns.append(pd.Series(rng.choice(["x", None], n), dtype=object))
        picked = [columns[i] for i in rng.choice(len(columns), int(rng.integers(1, 4)))]
        frame = pd.DataFrame({f"c{i}": c for i, c in enumerate(picked)})
        for dropna in (True, False):
            codes, first = iv.first_seen_codes(picked, dropna=dropna)
            expected = frame.groupby(list(frame.columns), sort=False, dropna=dropna).ngroup()
            assert np.array_equal(codes, expected.fillna(-1).to_numpy(dtype=np.int64))
            seen = expected.to_numpy()
            wanted = [int(np.flatnonzero(seen == g)[0]) for g in range(first.size)]
            assert first.tolist() == wanted


def test_first_seen_codes_of_few_rows_leave_other_values_to_pandas(monkeypatch):
    """Values that are not plain text or numbers (dates and their NaT, Decimal NaN, numpy
    float32 and complex NaN, tuples holding NaN) number as the factorizing way numbers them."""
    stamp = pd.Timestamp("2026-01-01")
    columns = [
        pd.Series([stamp, pd.NaT, stamp]),
        pd.Series([pd.Timedelta(1), pd.NaT, pd.Timedelta(1)]),
        np.array([decimal.Decimal("NaN"), decimal.Decimal(1), decimal.Decimal("NaN")], object),
        np.array([np.float32("nan"), np.float32(1), np.float32("nan")], dtype=object),
        np.array([complex("nan"), 1j, complex("nan")], dtype=object),
        _objects([(float("nan"),), (1,), (float("nan"),)]),
    ]
    for column in columns:
        for dropna in (True, False):
            got = iv.first_seen_codes([column], dropna=dropna)
            monkeypatch.setattr(iv, "FEW_KEYS", 0)
            expected = iv.first_seen_codes([column], dropna=dropna)
            monkeypatch.undo()
            assert [a.tolist() for a in got] == [a.tolist() for a in expected], column


def _objects(values: list) -> np.ndarray:
    """`values` as a 1-D object array (tuples kept whole)."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def test_short_median_is_numpys():
    """The same float as `float(np.median(values))`, to the bit and the sign of zero, on short
    lists of floats and integers with -0.0, infinities and NaN, and on none."""
    rng = np.random.default_rng(47)
    pool = [0.0, -0.0, 1.5, -2.25, 1e308, np.inf, -np.inf, 0.1, 0.2, 3]
    cases = [[], [-0.0], [-0.0, -0.0], [1.0, -0.0, -1.0], [np.nan, 1.0], [1, 2], [2, 3, 5, 7]]
    cases += [list(rng.choice(pool, int(rng.integers(1, 8)))) for _ in range(3000)]
    for values in cases:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = float(np.median(np.asarray(values, dtype=np.float64)))
            got = iv.short_median(values)
        assert np.float64(got).view(np.int64) == np.float64(expected).view(np.int64) or (
            np.isnan(got) and np.isnan(expected)
        ), values


def test_groupby_sum_refuses_a_code_past_its_groups():
    """pandas' kernel writes where a code points: a code past the groups is an IndexError
    (as the public groupby's reindex gave), sorted or not."""
    for codes in (np.array([0, 3, 1]), np.array([0, 1, 3])):
        with pytest.raises(IndexError):
            iv.groupby_sum(codes, np.ones(3), 2)


def _unique_cases():
    rng = np.random.default_rng(23)
    for dtype in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint32, np.float64):
        for n in (0, 1, 7, 3000):
            for high in (2, 90, 10**7):  # counted (small ranges) and sorted (wide ones)
                if np.issubdtype(dtype, np.integer) and high > np.iinfo(dtype).max:
                    continue
                low = 0 if np.issubdtype(dtype, np.unsignedinteger) else -high
                values = rng.integers(low, high, n).astype(dtype)
                yield values
                if dtype == np.float64 and n > 1:
                    with_nan = values.copy()
                    with_nan[:: max(n // 5, 1)] = np.nan
                    yield with_nan
                    yield np.sort(values) + rng.random(n) * 3  # a trace's nearly sorted times
    yield np.array([2**62, -(2**62), 2**62], dtype=np.int64)  # a range past int64 counts
    yield np.array([0.0, -0.0, 1.0])


def test_unique_returns_numpys_arrays():
    """`iv.unique` (counting small-range integers, a stable sort otherwise) gives what
    np.unique gives: the values, the inverse and the counts, dtypes and shapes included."""
    cases = list(_unique_cases())
    wide = sum(
        v.dtype.kind in "iu" and v.size and int(v.max()) - int(v.min()) > 2 * v.size + 4096
        for v in cases
    )
    assert wide and len(cases) - wide > 20  # both paths taken
    for values in cases:
        for inverse in (False, True):
            for counts in (False, True):
                want = np.unique(values, return_inverse=inverse, return_counts=counts)
                got = iv.unique(values, return_inverse=inverse, return_counts=counts)
                want = want if isinstance(want, tuple) else (want,)
                got = got if isinstance(got, tuple) else (got,)
                assert len(got) == len(want)
                for a, b in zip(want, got, strict=True):
                    assert a.dtype == b.dtype and a.shape == b.shape
                    if a.dtype.kind == "f":  # the same numbers (-0.0 == 0.0, NaN one value)
                        assert np.array_equal(a, b, equal_nan=True), (values, inverse, counts)
                    else:  # to the bit
                        assert a.tobytes() == b.tobytes(), (values, inverse, counts)


def test_unique_keeps_the_first_of_equal_floats():
    """Of floats equal as numbers but not in their bits, the first in the input stands for
    them (numpy's unstable sort picks either); inverse and counts as np.unique's."""
    values = np.array([-0.0] + [0.0, 1.0] * 20 + [np.nan])
    got, inverse, counts = iv.unique(values, return_inverse=True, return_counts=True)
    assert np.signbit(got[0]) and got[1] == 1.0 and np.isnan(got[2])
    _, want_inverse, want_counts = np.unique(values, return_inverse=True, return_counts=True)
    assert inverse.tolist() == want_inverse.tolist() and counts.tolist() == want_counts.tolist()
