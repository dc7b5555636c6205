"""The numpy helpers of the diagnosis and the per-rank figures give what the pandas they stand
for gives, to the bit: one row per step, a column's median, sum and mean, a unit name's mode,
a descending sort."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fsdp_trace.analysis import intervals as iv
from fsdp_trace.analysis.rank.analyze import most_frequent
from fsdp_trace.diagnose.context import per_step_rows


def _random_frame(rng: np.random.Generator, n: int) -> pd.DataFrame:
    start = np.round(rng.uniform(0, 50, n), 0)  # ties, to check which row wins
    start[rng.random(n) < 0.1] = np.nan
    return pd.DataFrame(
        {
            "step": rng.integers(0, 6, n),
            "start_us": start,
            "value": rng.normal(0, 1e3, n),
        }
    )


def test_per_step_rows_pick_what_a_stable_sort_and_groupby_pick():
    rng = np.random.default_rng(3)
    for _ in range(300):
        frame = _random_frame(rng, int(rng.integers(0, 40)))
        ordered = frame.sort_values(["step", "start_us"], kind="stable").groupby("step")
        for first, expected in ((True, ordered.head(1)), (False, ordered.tail(1))):
            rows = per_step_rows(frame["step"].to_numpy(), frame["start_us"].to_numpy(), first)
            assert rows.tolist() == expected.index.tolist()


def test_median_total_and_mean_equal_pandas():
    rng = np.random.default_rng(5)
    for _ in range(500):
        n = int(rng.integers(0, 30))
        values = rng.normal(0, 1e6, n) * rng.uniform(0, 1e-3, n) ** 2
        values[rng.random(n) < 0.2] = np.nan
        series = pd.Series(values, dtype=np.float64)
        assert np.array_equal(iv.median(values), series.median(), equal_nan=True)
        assert iv.total(values) == series.sum()
        assert np.array_equal(iv.mean(values), series.mean(), equal_nan=True)


def test_descending_order_is_pandas_sort_either_kind():
    rng = np.random.default_rng(13)
    for _ in range(300):
        n = int(rng.integers(0, 80))
        values = np.round(rng.normal(0, 3, n), 0)  # ties: their order tells the sorts apart
        values[rng.random(n) < 0.15] = np.nan
        for kind in ("stable", "quicksort"):
            expected = pd.Series(values).sort_values(ascending=False, kind=kind).index
            assert iv.descending_order(values, kind).tolist() == expected.tolist()


def test_mode_is_the_first_of_the_most_frequent_in_sorted_order():
    rng = np.random.default_rng(9)
    names = np.array(["root", "layers.0", "layers.1", "layers.10", "layers.2"], dtype=object)
    for _ in range(300):
        picked = names[rng.integers(0, names.size, int(rng.integers(1, 12)))]
        assert iv.mode(picked.astype(str)) == pd.Series(picked).mode().iloc[0]


def test_most_frequent_is_value_counts_first():
    rng = np.random.default_rng(17)
    kinds = np.array(["AllGather", "ReduceScatter", "AllReduce", None], dtype=object)
    for _ in range(300):
        values = kinds[rng.integers(0, kinds.size, int(rng.integers(0, 12)))]
        counts = pd.Series(values).value_counts()
        assert most_frequent(values) == (counts.index[0] if len(counts) else None)


def test_value_counts_equal_pandas():
    rng = np.random.default_rng(19)
    units = np.array(["", "layers.0", "layers.1", "root"], dtype=object)
    for _ in range(200):
        values = units[rng.integers(0, units.size, int(rng.integers(0, 20)))]
        assert iv.value_counts(values) == pd.Series(values).value_counts().to_dict()
