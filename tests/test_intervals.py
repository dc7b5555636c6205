"""The interval algebra against brute force on a fine grid, over many random sets."""

from __future__ import annotations

import numpy as np
import pytest

from fsdp_trace.analysis import intervals as iv

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


def test_points_and_clipping():
    u = iv.union([0, 10, 12], [5, 12, 20])
    assert u[0].tolist() == [0, 10] and u[1].tolist() == [5, 20]  # touching intervals merge
    assert iv.contains(u, [0, 5, 7, 10, 20, 21]).tolist() == [True, True, False, True, True, False]
    assert iv.covered_up_to(u, [-1, 3, 7, 15, 30]).tolist() == [0, 3, 5, 10, 15]
    s, e = iv.clip(u, 3, 11)
    assert s.tolist() == [3, 10] and e.tolist() == [5, 11]
    assert iv.length(iv.EMPTY) == 0.0 and iv.union([], [])[0].size == 0
