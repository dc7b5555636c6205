"""The one event classifier: what each event is (kernel kinds, launches, CPU ops) and which
collective a communication kernel runs. Works on categorical columns, so the regexes run once
per distinct name, never per event."""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from fsdp_trace.vocab import Collective, Kind

# Event kinds (small ints in the `kind` column).
OTHER, COMM, COMPUTE, MEMCPY, MEMSET, SYNC, LAUNCH, CPU_OP, ANNOTATION, GPU_ANNOTATION = range(10)
KIND_NAMES = {
    OTHER: "other",
    COMM: Kind.COMM.value,
    COMPUTE: Kind.COMPUTE.value,
    MEMCPY: Kind.MEMCPY.value,
    MEMSET: Kind.MEMSET.value,
    SYNC: Kind.SYNC.value,
    LAUNCH: "launch",
    CPU_OP: "cpu_op",
    ANNOTATION: "annotation",
    GPU_ANNOTATION: "gpu_annotation",
}
GPU_KINDS = (COMM, COMPUTE, MEMCPY, MEMSET, SYNC)

# NCCL/RCCL kernels: legacy `ncclKernel_*` (NCCL <= 2.18), `ncclDevKernel_*` (>= 2.19),
# symmetric-memory `ncclSymDevKernel_*` (2.27) and `ncclSymkDevKernel_*` (2.28).
COMM_KERNEL = re.compile(r"^(nccl|rccl)\w*Kernel", re.IGNORECASE)

_CATEGORY_KIND = {
    "gpu_memcpy": MEMCPY,
    "memcpy": MEMCPY,
    "gpu_memset": MEMSET,
    "memset": MEMSET,
    "cuda_sync": SYNC,
    "cuda_runtime": LAUNCH,
    "cuda_driver": LAUNCH,
    "runtime": LAUNCH,
    "cpu_op": CPU_OP,
    "operator": CPU_OP,
    "user_annotation": ANNOTATION,
    "gpu_user_annotation": GPU_ANNOTATION,
}

# Collective type from the kernel name: the order matters (ReduceScatter before Reduce).
_NAME_COLLECTIVES = (
    (Collective.REDUCE_SCATTER, re.compile(r"ReduceScatter", re.IGNORECASE)),
    (Collective.ALL_GATHER, re.compile(r"AllGather", re.IGNORECASE)),
    (Collective.ALL_REDUCE, re.compile(r"AllReduce", re.IGNORECASE)),
    (Collective.ALL_TO_ALL, re.compile(r"AllToAll", re.IGNORECASE)),
    (Collective.BROADCAST, re.compile(r"Broadcast", re.IGNORECASE)),
    (Collective.SEND_RECV, re.compile(r"SendRecv|_Send|_Recv", re.IGNORECASE)),
    (Collective.REDUCE, re.compile(r"_Reduce(?!Scatter)", re.IGNORECASE)),
)
# Collective type from the `Collective name` argument (torch's c10d op names).
_ARG_COLLECTIVES = (
    (Collective.REDUCE_SCATTER, re.compile(r"reduce_?scatter", re.IGNORECASE)),
    (Collective.ALL_GATHER, re.compile(r"all_?gather", re.IGNORECASE)),
    (Collective.ALL_REDUCE, re.compile(r"all_?reduce", re.IGNORECASE)),
    (Collective.ALL_TO_ALL, re.compile(r"all_?to_?all", re.IGNORECASE)),
    (Collective.BROADCAST, re.compile(r"broadcast", re.IGNORECASE)),
    (Collective.SEND_RECV, re.compile(r"^(send|recv|sendrecv|batch_isend_irecv)", re.IGNORECASE)),
    (Collective.REDUCE, re.compile(r"^_?reduce$", re.IGNORECASE)),
    (Collective.BARRIER, re.compile(r"barrier", re.IGNORECASE)),
)
# CPU (gloo) collectives: the work runs on gloo's own thread as `gloo:<op>` annotations.
_GLOO_COLLECTIVES = {
    "gloo:all_gather": Collective.ALL_GATHER,
    "gloo:reduce_scatter": Collective.REDUCE_SCATTER,
    "gloo:all_reduce": Collective.ALL_REDUCE,
    "gloo:broadcast": Collective.BROADCAST,
    "gloo:send": Collective.SEND_RECV,
    "gloo:recv": Collective.SEND_RECV,
    "gloo:all_to_all": Collective.ALL_TO_ALL,
    "gloo:barrier": Collective.BARRIER,
}
BUS_FACTOR = {
    # busbw = algbw × factor (nccl-tests PERFORMANCE.md), n = group size
    Collective.ALL_GATHER: lambda n: (n - 1) / n,
    Collective.REDUCE_SCATTER: lambda n: (n - 1) / n,
    Collective.ALL_REDUCE: lambda n: 2 * (n - 1) / n,
    Collective.ALL_TO_ALL: lambda n: (n - 1) / n,
    Collective.BROADCAST: lambda n: 1.0,
    Collective.REDUCE: lambda n: 1.0,
    Collective.SEND_RECV: lambda n: 1.0,
}
DTYPE_BYTES = {
    "Float": 4,
    "float": 4,
    "Float32": 4,
    "BFloat16": 2,
    "Half": 2,
    "Float16": 2,
    "Double": 8,
    "Long": 8,
    "Int": 4,
    "Int32": 4,
    "Short": 2,
    "Char": 1,
    "Byte": 1,
    "Bool": 1,
    "Float8_e4m3fn": 1,
    "Float8_e5m2": 1,
    "Float8_e4m3fnuz": 1,
    "Float8_e5m2fnuz": 1,
    "ComplexFloat": 8,
}


def _per_category(values: pd.Categorical, fn, dtype) -> np.ndarray:
    """Apply `fn` once per distinct category and broadcast through the codes (where the rows
    are few against the categories, a slice of a trace's events, only to those they use)."""
    codes = values.codes
    if codes.size * 4 < len(values.categories):
        used, where = np.unique(codes, return_inverse=True)
        texts = values.categories[used[used >= 0]].tolist()
        results = ([fn(None)] if used.size and used[0] < 0 else []) + [fn(c) for c in texts]
        return np.array(results, dtype=dtype)[where.reshape(codes.shape)]
    categories = values.categories
    texts = tuple(categories.tolist())
    lookup = category_table(texts, fn, dtype, None, keep=categories.inferred_type == "string")
    return lookup[codes]  # code -1 (missing) reads the last entry: fn(None)


# Per-category answers kept for the next trace: the ranks of one job name the same operators
# and kernels, and a rank's analysis asks a dozen questions (regular expressions, prefixes) of
# the same few hundred names. Keyed by the function's code and the names (text only: 1 and
# 1.0 are equal keys), so only plain functions that hold nothing of their own (no closure, no
# defaults, not a bound method: module constants at most) are kept. Threads of one process
# (a Dask worker's) share the table.
_TABLES: dict[tuple, np.ndarray] = {}
_TABLES_KEPT = 64  # the oldest goes first
_TABLES_LOCK = threading.Lock()


def category_table(texts: tuple, fn, dtype, missing, keep: bool = True) -> np.ndarray:
    """`[fn(t) for t in texts] + [fn(missing)]` as an array of `dtype` (read only: index it);
    `keep`: `texts` are all text, the answers may be kept for the next set of equal names."""
    code = getattr(fn, "__code__", None)
    pure = (
        keep
        and code is not None
        and getattr(fn, "__self__", None) is None
        and getattr(fn, "__closure__", None) is None
        and not getattr(fn, "__defaults__", None)
        and not getattr(fn, "__kwdefaults__", None)
    )
    key = (code, np.dtype(dtype).str, missing, texts) if pure else None
    table = _TABLES.get(key) if key is not None else None
    if table is None:
        table = np.array([fn(t) for t in texts] + [fn(missing)], dtype=dtype)
        table.flags.writeable = False
        if key is not None:
            with _TABLES_LOCK:
                while len(_TABLES) >= _TABLES_KEPT:
                    del _TABLES[next(iter(_TABLES))]
                _TABLES[key] = table
    return table


per_category = _per_category


def kind_mask(kinds: np.ndarray, *wanted: int) -> np.ndarray:
    """`np.isin(kinds, wanted)` for the small-int `kind` column, by table lookup."""
    table = np.zeros(len(KIND_NAMES), dtype=bool)
    table[list(wanted)] = True
    return table[kinds]


def event_kinds(events: pd.DataFrame) -> np.ndarray:
    """The `kind` of every event, from its category and (for kernels) its name, or the
    `Collective name` torch records on every NCCL kernel (a kernel renamed by another build
    or a wrapper library is communication still)."""
    cat_kind = _per_category(
        events["cat"].array,
        lambda c: (
            -1
            if c is None
            else (-2 if c.lower() == "kernel" else _CATEGORY_KIND.get(c.lower(), OTHER))
        ),
        np.int8,
    )
    is_comm_name = _per_category(
        events["name"].array, lambda n: bool(n and COMM_KERNEL.match(n)), bool
    )
    if "collective_name" in events:
        is_comm_name = is_comm_name | events["collective_name"].notna().to_numpy()
    kinds = np.where(cat_kind == -2, np.where(is_comm_name, COMM, COMPUTE), cat_kind)
    return np.where(kinds < 0, OTHER, kinds).astype(np.int8)


def collective_from_name(name: str | None) -> str | None:
    if not name:
        return None
    if name in _GLOO_COLLECTIVES:
        return _GLOO_COLLECTIVES[name].value
    for label, pattern in _NAME_COLLECTIVES:
        if pattern.search(name):
            return label.value
    return None


def collective_from_arg(arg: str | None) -> str | None:
    if not arg:
        return None
    for label, pattern in _ARG_COLLECTIVES:
        if pattern.search(arg):
            return label.value
    return None


def collective_types(events: Mapping[str, pd.Series]) -> np.ndarray:
    """Collective type per event (`events`: their columns, a frame or Series by name): the
    `Collective name` arg first (it is what torch asked for; `ncclDevKernel_Generic` names
    none), else the kernel name; 'Unknown' otherwise."""
    from_name = _per_category(events["name"].array, collective_from_name, object)
    if "collective_name" in events:
        from_arg = _per_category(events["collective_name"].array, collective_from_arg, object)
        result = np.where(pd.isna(from_arg), from_name, from_arg)
    else:
        result = from_name
    return np.where(pd.isna(result), Collective.UNKNOWN.value, result).astype(object)


def dtype_bytes(dtypes: pd.Series) -> np.ndarray:
    """Bytes per element of the NCCL `dtype` argument (0 when absent or unknown)."""
    return _per_category(dtypes.array, lambda d: DTYPE_BYTES.get(d, 0) if d else 0, np.int64)


def bus_factors(collectives: ArrayLike, group_sizes: ArrayLike) -> np.ndarray:
    """nccl-tests' algbw → busbw factor per row: the collective types and their group sizes
    (one size for all rows, or one each); NaN where it does not apply (an unknown type, or
    no group of at least one rank). Vectorized per type: never a Python loop over rows."""
    kinds = np.asarray(collectives, dtype=object)
    sizes = np.trunc(np.broadcast_to(np.asarray(group_sizes, dtype=np.float64), kinds.shape))
    factors = np.full(kinds.shape, np.nan)
    for collective, factor in BUS_FACTOR.items():
        rows = (kinds == collective) & (sizes >= 1)
        factors[rows] = factor(sizes[rows])
    return factors
