"""The diagnosis' numpy helpers give what the pandas they stand for gives, to the bit: one
row per step, the median and the sum of a column, a unit name's mode."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fsdp_trace.diagnose.context import median, per_step_rows, total
from fsdp_trace.diagnose.rules.communication import _mode


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


def test_median_and_total_equal_pandas():
    rng = np.random.default_rng(5)
    for _ in range(500):
        n = int(rng.integers(0, 30))
        values = rng.normal(0, 1e6, n) * rng.uniform(0, 1e-3, n) ** 2
        values[rng.random(n) < 0.2] = np.nan
        series = pd.Series(values, dtype=np.float64)
        assert np.array_equal(median(values), series.median(), equal_nan=True)
        assert total(values) == series.sum()


def test_mode_is_the_first_of_the_most_frequent_in_sorted_order():
    rng = np.random.default_rng(9)
    names = np.array(["root", "layers.0", "layers.1", "layers.10", "layers.2"], dtype=object)
    for _ in range(300):
        picked = names[rng.integers(0, names.size, int(rng.integers(1, 12)))]
        assert _mode(picked) == pd.Series(picked).mode().iloc[0]
