"""A frame's column as an array, at the cost of a dict lookup.

`frame[name].to_numpy()` makes a Series (its index, flags, name) only to hand its array back:
~14 µs a read on pandas 3, where the array is ~2 µs away. A rank's analysis reads ~150
columns and the run level ~100 a rank, so at a thousand ranks those Series are seconds.
`array_of` reads the array from the frame's column store, as `Series.to_numpy` would,
and asks pandas for anything else (a repeated label, a mapping that is not a frame), so
what it returns is always what `to_numpy` returns."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from pandas.api.extensions import ExtensionDtype


def array_of(frame: pd.DataFrame | Any, name: str, dtype: Any = None) -> np.ndarray:
    """`frame[name].to_numpy(dtype=dtype)`: for a numpy column, its values (a view, read-only
    where pandas copies on write, as pandas gives it; a new array where `dtype` converts
    them); for an extension array (pandas' text, categoricals), its `to_numpy`. `frame` may
    also be a mapping of Series."""
    if type(frame) is pd.DataFrame:
        values = _values(frame, name)
        if type(values) is np.ndarray:  # as `Series.to_numpy` does with one
            result = np.asarray(values, dtype=dtype)
            shared = result is values or np.shares_memory(values[:2], result[:2])
            if shared and _copy_on_write():
                result = result.view()
                result.flags.writeable = False
            return result
        if values is not None and isinstance(values.dtype, ExtensionDtype):
            return values.to_numpy(dtype=dtype)
    return frame[name].to_numpy(dtype=dtype)  # and a datetime column: pandas' own path


def dtype_of(frame: pd.DataFrame, name: str) -> Any:
    """`frame[name].dtype`, without the Series (`array_of`'s column store read)."""
    values = _values(frame, name)
    return values.dtype if values is not None else frame[name].dtype


def _values(frame: pd.DataFrame, name: str) -> Any:
    """Column `name`'s values in the frame's column store (a numpy or extension array);
    None where the label is repeated or pandas has no such accessor (another version). A
    missing label raises KeyError, as `frame[name]` does."""
    where = frame.columns.get_loc(name)
    read = getattr(getattr(frame, "_mgr", None), "iget_values", None)
    return read(where) if read is not None and type(where) is int else None


_PANDAS_3 = int(pd.__version__.split(".")[0]) >= 3


def _copy_on_write() -> bool:
    """Whether pandas copies on write (always from pandas 3; an option before), so hands a
    column's values back read-only."""
    if _PANDAS_3:
        return True
    return pd.get_option("mode.copy_on_write") is True  # pandas 2's ("warn": not yet)


def one_object_each(values: np.ndarray) -> np.ndarray:
    """`values` (an object array) with one object per distinct string, None and NaN left as
    they are: text a table repeats on every row (a unit, a phase) then costs a pointer a row
    once pickled or held, not a string. `values` itself where nothing repeats, a value is no
    string (1 and 1.0 are equal: merged they would change), or it holds no such copies."""
    try:
        codes, uniques = pd.factorize(values, use_na_sentinel=True)
    except TypeError:  # unhashable values
        return values
    if len(uniques) == len(values) or not all(isinstance(u, str) for u in uniques):
        return values
    found = codes >= 0
    if len(set(map(id, values[found]))) == len(uniques):
        return values
    shared = values.copy()  # missing values (None, NaN) stay the objects they are
    shared[found] = np.asarray(uniques, dtype=object)[codes[found]]
    return shared
