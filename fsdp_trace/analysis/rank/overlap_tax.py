"""The overlap tax, measured: the same block op's duration with NCCL kernels beside it and
alone. Read by the overlap-tax rule and by the what-if replay (compute beside NCCL runs
slower by this rate)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from fsdp_trace.analysis import intervals as iv
from fsdp_trace.analysis.results import RankAnalysis
from fsdp_trace.analysis.table import array_of
from fsdp_trace.vocab import NON_BLOCK_UNITS, Kind

TAX_MIN_LAUNCHES = 3  # launches of an op with and without NCCL beside it, each
# The kernel columns an op is measured on.
MEASURED = ("ts", "end", "dur", "name", "grid", "block_dim", "phase", "step", "block")


def op_tax(r: RankAnalysis, blocks: set[str]) -> pd.DataFrame:
    """Per compute op of the transformer blocks, its median duration with NCCL beside it
    (over half of the kernel overlaps communication) and alone (none does): `measure` over
    the rank's kernels, indexed by (shape, nth)."""
    ops = op_table(r, blocks)
    if ops.empty and "shape" not in ops:
        return pd.DataFrame()
    return ops.set_index(["shape", "nth"])


def op_table(r: RankAnalysis, blocks: set[str]) -> pd.DataFrame:
    """`op_tax` with shape and nth as columns, not its index (`OP_TAX_COLUMNS`; may be an
    empty frame without them).

    Measured with the rank's analysis (`RankAnalysis.op_tax`) for its units named like
    blocks (`block_like`); where `blocks` selects other ops of this rank (a run.json naming
    other blocks), measured again from its kernels, read again."""
    chosen = {b for b in r.op_blocks if b in blocks}
    if chosen == set(r.op_tax_blocks):
        return r.op_tax
    return measure(r.load_kernels(), blocks, moving(r.collectives))


def block_like(name: str) -> bool:
    """A unit named like a transformer block: one module, not the root (as
    `InferredConfig.blocks` tells them)."""
    return name not in NON_BLOCK_UNITS and ", " not in name


def op_blocks(kernels: pd.DataFrame) -> list[str]:
    """The blocks of the compute kernels an op can be measured on (launch shape known)."""
    k = kernels
    if k.empty or "grid" not in k or "block_dim" not in k:
        return []
    blocks = array_of(k, "block")[_measurable(k, array_of(k, "kind") == Kind.COMPUTE)]
    return sorted(str(b) for b in pd.unique(blocks[pd.notna(blocks)]))


def _measurable(k: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """`rows` of the kernels whose launch shape (grid and block) is known."""
    return rows & pd.notna(array_of(k, "grid")) & pd.notna(array_of(k, "block_dim"))


def moving(collectives: pd.DataFrame) -> iv.Intervals | None:
    """When the rank's NCCL kernels move data: the last `transfer` µs of each, where transfer
    is the shortest duration of the rank's collectives of the same type, size and group (a
    kernel that did not wait; the rest of a longer one is waiting for a peer, spinning on
    few SMs). None without collectives."""
    c = collectives
    if c is None or c.empty or "dur_us" not in c:
        return None
    keys = [c["collective"].astype(str), c["bytes"].fillna(-1.0), c["group_size"].fillna(-1.0)]
    code, first = iv.first_seen_codes(keys)
    dur = array_of(c, "dur_us", np.float64)
    shortest = -iv.group_max(code, -dur, first.size)[code]  # groupby(keys).transform("min")
    end = array_of(c, "end_us", np.float64)
    start = np.maximum(array_of(c, "start_us", np.float64), end - shortest)
    return iv.union(start, end)


def measure(
    kernels: pd.DataFrame, blocks: set[str], transfer: iv.Intervals | None = None
) -> pd.DataFrame:
    """Per compute op of `blocks` (a row each, `OP_TAX_COLUMNS`), its median duration with
    NCCL beside it and alone, from a rank's kernels. "Beside NCCL" is beside NCCL moving data
    (`transfer`, see `moving`; the NCCL kernels' whole span where not given): a kernel that
    waits for a late peer takes little from the compute beside it, and what a late peer
    costs is the straggler's.

    An op is one kernel position of a block: name, launch grid and block shape, phase and the
    n-th launch of that shape in the block's phase. Every block runs the same ops on the same
    shapes, so an op compares like with like across blocks and steps; a name alone mixes
    problem sizes (persistent GEMM kernels launch one grid for every shape)."""
    k = kernels
    if k.empty or "grid" not in k or "block_dim" not in k:
        return pd.DataFrame()
    kind = array_of(k, "kind")
    is_comm = kind == Kind.COMM
    chosen = _measurable(k, (kind == Kind.COMPUTE) & k["block"].isin(blocks).to_numpy())
    if not is_comm.any() or not chosen.any():
        return pd.DataFrame()
    ts = array_of(k, "ts")
    rows = np.flatnonzero(chosen)
    rows = rows[np.argsort(ts[rows], kind="stable")]  # sort_values("ts", kind="stable")
    compute = {c: k[c].array[rows] for c in MEASURED}  # a frame only where pandas measures
    comm_ts, comm_end = ts[is_comm], array_of(k, "end")[is_comm]
    comm_u = iv.union(comm_ts, comm_end)
    if transfer is not None:
        comm_u = iv.intersect(comm_u, transfer)
    # "alone": no NCCL kernel at all beside it, moving data or waiting
    idle_u = iv.union(comm_ts, comm_end)
    dur = array_of(compute, "dur", np.float64)
    shared = iv.overlap_each(array_of(compute, "ts"), array_of(compute, "end"), comm_u)
    frac = np.divide(shared, dur, out=np.zeros_like(dur), where=dur > 0)
    touched = iv.overlap_each(array_of(compute, "ts"), array_of(compute, "end"), idle_u)
    if not np.isnan(dur).any():
        return _ops(compute, dur, frac > 0.5, touched == 0)
    return _ops_frame(pd.DataFrame(compute, index=k.index[rows]), dur, frac, touched)


def _first_seen(columns: list) -> np.ndarray:
    """A number per row for each distinct combination of `columns` (NaN a value like any
    other), in order of first appearance: `groupby(columns, sort=False, dropna=False)
    .ngroup()`."""
    return iv.first_seen_codes(columns, dropna=False)[0]


def _ops(compute: Mapping[str, Any], dur: np.ndarray, with_: np.ndarray, alone: np.ndarray):
    """`_ops_frame` in numpy (durations without NaN): the same table, to the bit (one row per
    op, `OP_TAX_COLUMNS`). `compute`: the measured kernels' columns (a frame, or arrays by
    name)."""
    shape = _first_seen([compute[c] for c in ("name", "grid", "block_dim", "phase")])
    group = _first_seen([compute["step"], compute["block"], shape])
    order = np.argsort(group, kind="stable")  # n-th launch: position in its group, in order
    runs = np.flatnonzero(np.diff(group[order], prepend=-1))
    nth = np.empty(group.size, dtype=np.int64)
    nth[order] = np.arange(group.size) - np.repeat(runs, np.diff(np.append(runs, group.size)))
    key = shape * (int(nth.max()) + 1) + nth

    def per_key(rows: np.ndarray):
        """Per key among `rows`, sorted: the key, its median duration, count, a row of it."""
        k, d, idx = key[rows], dur[rows], np.flatnonzero(rows)
        order = np.lexsort((d, k))
        k, d, idx = k[order], d[order], idx[order]
        starts = np.flatnonzero(np.diff(k, prepend=-1))
        counts = np.diff(np.append(starts, k.size))
        lo, hi = d[starts + (counts - 1) // 2], d[starts + counts // 2]
        median = np.where(counts % 2 == 1, lo, (hi + lo) / 2)  # as pandas' group median
        return k[starts], median, counts, idx[starts]

    k_with, median_with, n_with, row = per_key(with_)
    k_alone, median_alone, n_alone, _ = per_key(alone)
    time_with = iv.group_sum(np.searchsorted(k_with, key[with_]), dur[with_], k_with.size)
    _, at_with, at_alone = np.intersect1d(k_with, k_alone, return_indices=True)
    kept = (n_with[at_with] >= TAX_MIN_LAUNCHES) & (n_alone[at_alone] >= TAX_MIN_LAUNCHES)
    at_with, at_alone, row = at_with[kept], at_alone[kept], row[at_with[kept]]
    slowdown, added_us = _tax(median_with[at_with], median_alone[at_alone], time_with[at_with])
    return pd.DataFrame(
        {
            "shape": shape[row],
            "nth": nth[row],
            # Text typed as a frame of the whole column types it (pandas 3: `str`).
            "kernel": pd.Series(np.asarray(compute["name"])).array[row],
            "phase": pd.Series(np.asarray(compute["phase"])).array[row],
            "median_with": median_with[at_with],
            "time_with": time_with[at_with],
            "n_with": n_with[at_with].astype(np.int64),
            "median_alone": median_alone[at_alone],
            "n_alone": n_alone[at_alone].astype(np.int64),
            "slowdown": slowdown,
            "added_us": added_us,
        },
    )


def _tax(median_with, median_alone, time_with):
    """Per op, its slowdown beside NCCL (median with / median alone − 1) and the time beside
    NCCL beyond what the same launches take alone: T − T / (1 + slowdown)."""
    slowdown = median_with / median_alone - 1.0
    return slowdown, time_with * slowdown / (1.0 + slowdown)


def _ops_frame(compute: pd.DataFrame, dur: np.ndarray, frac: np.ndarray, touched: np.ndarray):
    """Per op (shape × n-th launch), its median duration with NCCL beside it and alone."""
    shape = ["name", "grid", "block_dim", "phase"]
    frame = pd.DataFrame(
        {
            "shape": compute.groupby(shape, sort=False, observed=True, dropna=False)
            .ngroup()
            .to_numpy(),
            "nth": compute.groupby(["step", "block", *shape], observed=True, dropna=False)
            .cumcount()
            .to_numpy(),
            "kernel": array_of(compute, "name"),
            "phase": array_of(compute, "phase"),
            "dur": dur,
        }
    )
    beside = (
        frame[frac > 0.5]
        .groupby(["shape", "nth"])
        .agg(
            kernel=("kernel", "first"),
            phase=("phase", "first"),
            median_with=("dur", "median"),
            time_with=("dur", "sum"),
            n_with=("dur", "size"),
        )
    )
    alone = (
        frame[touched == 0]
        .groupby(["shape", "nth"])["dur"]
        .agg(median_alone="median", n_alone="size")
    )
    ops = beside.join(alone, how="inner")
    ops = ops[(ops["n_with"] >= TAX_MIN_LAUNCHES) & (ops["n_alone"] >= TAX_MIN_LAUNCHES)].copy()
    slowdown, added_us = _tax(ops["median_with"], ops["median_alone"], ops["time_with"])
    ops["slowdown"] = slowdown
    ops["added_us"] = added_us
    return ops.reset_index()


def tax_rate(ranks: list[RankAnalysis], blocks: set[str]) -> float:
    """How much slower compute runs beside NCCL (0.4: 40 %), pooled over the ranks'
    measured ops by their time beside NCCL; 0 where no op was measured both ways."""
    frames = [op_tax(r, blocks) for r in ranks]
    ops = (
        pd.concat([f for f in frames if not f.empty]) if any(not f.empty for f in frames) else None
    )
    if ops is None or not len(ops):
        return 0.0
    weight = array_of(ops, "time_with", np.float64)
    return max(0.0, float((array_of(ops, "slowdown") * weight).sum() / weight.sum()))
