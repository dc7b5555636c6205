"""`table.array_of` returns what `frame[name].to_numpy(dtype)` returns, for every kind of
column a frame can hold (it reads pandas' column store and must never differ from it)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fsdp_trace.analysis.table import array_of, dtype_of, one_object_each

N = 12


def _frame() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "float": np.linspace(0.0, 1.0, N),
            "nan": np.where(np.arange(N) % 3 == 0, np.nan, 2.5),
            "int": np.arange(N, dtype=np.int64) - 4,
            "int32": np.arange(N, dtype=np.int32),
            "bool": np.arange(N) % 2 == 0,
            "object": np.array([None, "a", 1.5] * (N // 3), dtype=object),
            "text": ["x", None, "y"] * (N // 3),
            "category": pd.Categorical(["p", "q"] * (N // 2)),
            "nullable": pd.array([1, None] * (N // 2), dtype="Int64"),
            "datetime": pd.date_range("2026-01-01", periods=N, tz="UTC"),
            "naive": pd.date_range("2026-01-01", periods=N),
            "delta": pd.to_timedelta(np.arange(N), unit="s"),
        }
    )


def _same(expected: np.ndarray, got: np.ndarray) -> None:
    assert type(got) is np.ndarray
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape
    assert got.flags.writeable == expected.flags.writeable
    assert [repr(v) for v in got.tolist()] == [repr(v) for v in expected.tolist()]


@pytest.mark.parametrize("name", list(_frame().columns))
@pytest.mark.parametrize("dtype", [None, np.float64, object, np.int64, np.longlong])
@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")
def test_every_kind_of_column_reads_as_to_numpy_reads_it(name, dtype):
    frame = _frame()
    try:
        expected = frame[name].to_numpy(dtype=dtype)
    except (TypeError, ValueError) as error:  # a conversion pandas refuses is refused alike
        with pytest.raises(type(error)):
            array_of(frame, name, dtype)
        return
    _same(expected, array_of(frame, name, dtype))


def test_a_view_is_read_only_and_shares_the_frames_memory():
    frame = _frame()
    values = array_of(frame, "float")
    assert values.flags.writeable == frame["float"].to_numpy().flags.writeable  # pandas 2: CoW
    if int(pd.__version__.split(".")[0]) >= 3:
        assert not values.flags.writeable
    assert np.shares_memory(values, frame["float"].to_numpy())
    converted = array_of(frame, "int", np.float64)  # a conversion: an array of its own
    assert converted.flags.writeable
    assert not np.shares_memory(converted, frame["int"].to_numpy())


def test_a_frame_after_assignment_reads_its_new_values():
    frame = _frame()
    array_of(frame, "float")
    frame["float"] = np.arange(N, dtype=np.float64)
    frame = frame.assign(extra=np.full(N, 7.0))
    _same(frame["float"].to_numpy(), array_of(frame, "float"))
    _same(frame["extra"].to_numpy(), array_of(frame, "extra"))


def test_missing_repeated_and_non_frame_inputs_behave_as_pandas():
    frame = _frame()
    with pytest.raises(KeyError):
        array_of(frame, "absent")
    repeated = pd.concat(
        [frame[["float"]], frame[["int"]].rename(columns={"int": "float"})], axis=1
    )
    _same(repeated["float"].to_numpy(), array_of(repeated, "float"))  # both columns, 2-D
    rows = {"a": pd.Series([1.0, 2.0]), "b": pd.Series(["u", "v"])}  # a mapping of Series
    _same(rows["a"].to_numpy(), array_of(rows, "a"))
    _same(rows["b"].to_numpy(dtype=object), array_of(rows, "b", object))
    empty = pd.DataFrame({"x": np.empty(0), "t": pd.Series([], dtype=object)})
    _same(empty["x"].to_numpy(), array_of(empty, "x"))
    _same(empty["t"].to_numpy(), array_of(empty, "t"))


@pytest.mark.parametrize("name", list(_frame().columns))
def test_every_kind_of_column_tells_its_dtype_as_pandas_does(name):
    frame = _frame()
    assert dtype_of(frame, name) == frame[name].dtype
    assert type(dtype_of(frame, name)) is type(frame[name].dtype)


def test_repeated_text_is_held_once_and_nothing_else_changes():
    made = [f"unit{i % 3}" for i in range(12)]  # equal strings, each an object of its own
    values = np.array([None, float("nan"), *("".join(list(s)) for s in made)], dtype=object)
    assert len({id(v) for v in values[2:]}) == 12
    shared = one_object_each(values)
    assert [repr(v) for v in shared] == [repr(v) for v in values]  # every value as it was
    assert shared[0] is values[0] and shared[1] is values[1]  # None and NaN as they were
    assert len({id(v) for v in shared[2:]}) == 3  # one object per distinct string
    assert one_object_each(shared) is shared  # held once already: nothing to do
    distinct = np.array(["a", "b", None], dtype=object)
    assert one_object_each(distinct) is distinct  # nothing repeats
    numbers = np.array([1, 1.0, "1"], dtype=object)
    assert one_object_each(numbers) is numbers  # not all text: 1 and 1.0 would merge
    unhashable = np.empty(2, dtype=object)
    unhashable[:] = [[1], [1]]  # lists: not hashable
    assert one_object_each(unhashable) is unhashable
