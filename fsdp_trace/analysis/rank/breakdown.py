"""Where every microsecond of a step goes, per rank: the step window cut into disjoint parts
that add up to it exactly.

At each instant the window is in exactly one part, the first of these that holds:
1. `recompute_us`: a recompute kernel runs (activation checkpointing re-running forward);
2. `compute_us`: a model compute kernel runs (not FSDP's own);
3. `fsdp_copy_us`: only FSDP's own copy/cast kernels run (those launched inside `FSDP::`
   labels: all-gather copy-in/out, chunk_cat, casts);
4. `exposed_transfer_us`: no compute, and a matched collective is moving data (its last
   `transfer` µs, the shortest duration of that collective across the ranks);
5. `exposed_wait_us`: no compute, and a matched collective waits for a peer to arrive (its
   first `duration − transfer` µs);
6. `exposed_unsplit_us`: no compute, and only collectives no other rank's trace matched run:
   whether they wait or transfer is unknown (one rank, or no match), never guessed;
7. `idle_us`: nothing runs on the GPU (memcpy/memset alone count as idle, as in `idle_us`).

So compute + fsdp_copy + recompute = |K| (the `compute_us` of the steps table: every compute
kernel), the three exposed parts = `exposed_us`, and idle = `idle_us`. A rank with no matched
collective has `exposed_transfer_us` and `exposed_wait_us` unknown (NaN) and all of its
exposed communication in `exposed_unsplit_us`.

A rank's breakdown is made in two halves, so that its kernels never leave the worker that
analyzed it: the compute parts from its kernels, with its analysis (`kernel_parts`); the
exposed parts once the cross-rank view knows each collective's transfer
(`exposed_split`), from the collectives and the exposed intervals C \\ K alone: each
exposed part is a set of communication time no compute covers, i.e. that set within C \\ K.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from fsdp_trace.analysis import intervals as iv
from fsdp_trace.analysis.results import (  # noqa: F401 (the parts' names, kept here too)
    BREAKDOWN_COLUMNS,
    EXPOSED_PARTS,
    PARTS,
    RankAnalysis,
)
from fsdp_trace.analysis.table import array_of
from fsdp_trace.vocab import Kind, Phase


def _lengths(u: iv.Intervals, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    return iv.covered_up_to(u, ends) - iv.covered_up_to(u, starts)


def _merge(*sets: iv.Intervals) -> iv.Intervals:
    return iv.union(np.concatenate([s[0] for s in sets]), np.concatenate([s[1] for s in sets]))


@dataclass
class Spans:
    """GPU compute intervals and what each is: compute (every compute kernel), recompute,
    FSDP's own (the rest being model compute)."""

    ts: np.ndarray
    end: np.ndarray
    compute: np.ndarray  # bool
    recompute: np.ndarray  # bool
    fsdp: np.ndarray  # bool


def _compute_sets(spans: Spans) -> tuple[iv.Intervals, iv.Intervals, iv.Intervals, iv.Intervals]:
    """Recompute, model compute and FSDP-copy time (each without the ones before it), and K:
    every compute kernel."""
    model = spans.compute & ~spans.recompute & ~spans.fsdp
    fsdp = spans.compute & spans.fsdp & ~spans.recompute

    def union(mask: np.ndarray) -> iv.Intervals:
        return iv.union(spans.ts[mask], spans.end[mask])

    r_set = union(spans.compute & spans.recompute)
    m_set = iv.subtract(union(model), r_set)
    f_set = iv.subtract(union(fsdp), _merge(r_set, m_set))
    return r_set, m_set, f_set, union(spans.compute)


def _comm_sets(
    comm_ts: np.ndarray, comm_end: np.ndarray, transfer: np.ndarray
) -> tuple[iv.Intervals, iv.Intervals, iv.Intervals]:
    """Matched collectives' transfer (their last `transfer` µs) and wait (the rest), and the
    unmatched collectives (transfer NaN: the split unknown)."""
    is_matched = ~np.isnan(transfer)
    cut = np.maximum(comm_end - np.nan_to_num(transfer), comm_ts)
    t_set = iv.union(cut[is_matched], comm_end[is_matched])
    w_set = iv.union(comm_ts[is_matched], cut[is_matched])
    u_set = iv.union(comm_ts[~is_matched], comm_end[~is_matched])
    return t_set, w_set, u_set


def _exposed_parts(
    exposed: iv.Intervals,
    sets: tuple[iv.Intervals, iv.Intervals, iv.Intervals],
    starts: np.ndarray,
    ends: np.ndarray,
) -> dict[str, np.ndarray]:
    """The exposed parts: transfer, then wait, then unsplit time within `exposed` (C \\ K;
    the three sets lie in C, so within C \\ K is the same as outside K)."""
    t_set, w_set, u_set = sets
    # An empty set's parts are empty (every collective matched, or none): not computed.
    wait = iv.intersect(iv.subtract(w_set, t_set), exposed) if w_set[0].size else iv.EMPTY
    unsplit = (
        iv.intersect(iv.subtract(u_set, _merge(t_set, w_set)), exposed)
        if u_set[0].size
        else iv.EMPTY
    )
    return {
        "exposed_transfer_us": _lengths(iv.intersect(t_set, exposed), starts, ends),
        "exposed_wait_us": _lengths(wait, starts, ends),
        "exposed_unsplit_us": _lengths(unsplit, starts, ends),
    }


def partition(
    spans: Spans,
    comm_ts: np.ndarray,
    comm_end: np.ndarray,
    transfer: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
) -> dict[str, np.ndarray]:
    """The parts of each window [starts, ends) (µs, in precedence order, see the module's
    docstring): compute intervals, and collectives with their transfer (NaN: unmatched, the
    split unknown). The one algorithm behind the measured breakdown (in its two halves,
    `kernel_parts` and `exposed_split`) and the what-if replay."""
    r_set, m_set, f_set, busy = _compute_sets(spans)
    sets = _comm_sets(comm_ts, comm_end, transfer)
    exposed = iv.subtract(iv.union(comm_ts, comm_end), busy)
    return {
        "recompute_us": _lengths(r_set, starts, ends),
        "compute_us": _lengths(m_set, starts, ends),
        "fsdp_copy_us": _lengths(f_set, starts, ends),
        **_exposed_parts(exposed, sets, starts, ends),
        "idle_us": (ends - starts) - _lengths(_merge(busy, *sets), starts, ends),
    }


def kernel_parts(kernels: pd.DataFrame, steps: pd.DataFrame) -> dict[str, np.ndarray]:
    """The compute half of a rank's breakdown, per step: `model_compute_us` (the part
    `compute_us`) and `fsdp_copy_us`, from its kernels (with its analysis, on the worker)."""
    k = kernels
    kind = array_of(k, "kind")
    compute = kind == Kind.COMPUTE
    recompute = compute & (array_of(k, "phase") == Phase.RECOMPUTE)
    fsdp = compute & array_of(k, "fsdp", bool) & ~recompute
    spans = Spans(array_of(k, "ts"), array_of(k, "end"), compute, recompute, fsdp)
    _, m_set, f_set, _ = _compute_sets(spans)
    starts = array_of(steps, "start_us", np.float64)
    ends = array_of(steps, "end_us", np.float64)
    return {
        "model_compute_us": _lengths(m_set, starts, ends),
        "fsdp_copy_us": _lengths(f_set, starts, ends),
    }


@dataclass(frozen=True)
class Matched:
    """A rank's matched collectives in the cross-rank view, one row each (arrays of one
    length): what the rank's breakdown reads of the match."""

    correlation: np.ndarray
    transfer_us: np.ndarray  # the collective's transfer time (its shortest duration)
    wait_us: np.ndarray  # this rank's wait for its late peers

    def __len__(self) -> int:
        return int(self.correlation.size)


def exposed_split(
    rank: RankAnalysis,
    matched: Matched | None,
    exposed: iv.Intervals | None = None,
    transfer: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """The exposed half of a rank's breakdown, per step (its steps' order): exposed
    communication split into transfer, wait and unsplit by each collective's cross-rank
    transfer. `matched`: this rank's matched collectives from the cross-rank view, or None /
    empty. `exposed` (the rank's C \\ K) and `transfer` (`collective_transfer`'s), where the
    caller has them already. NaN without GPU kernels (CPU traces: nothing to break down), and
    transfer and wait NaN without a match."""
    n = len(rank.steps)
    if rank.n_kernels == 0:
        return {part: np.full(n, np.nan) for part in EXPOSED_PARTS}
    starts = array_of(rank.steps, "start_us", np.float64)
    ends = array_of(rank.steps, "end_us", np.float64)
    c = rank.collectives
    has_match = matched is not None and len(matched) > 0
    if not has_match:
        transfer = np.full(len(c), np.nan)
    elif transfer is None:
        transfer = _matched(c, matched, "transfer_us")[0]  # type: ignore[arg-type]
    sets = _comm_sets(
        array_of(c, "start_us", np.float64), array_of(c, "end_us", np.float64), transfer
    )
    if exposed is None:
        exposed = exposed_intervals(rank)
    out = _exposed_parts(exposed, sets, starts, ends)
    if not has_match:
        out["exposed_transfer_us"] = np.full(n, np.nan)
        out["exposed_wait_us"] = np.full(n, np.nan)
    return out


def exposed_intervals(rank: RankAnalysis) -> iv.Intervals:
    """C \\ K of a rank (union form, as its analysis made it)."""
    e = rank.exposed
    return iv.as_arrays(array_of(e, "start_us"), array_of(e, "end_us"))


def _matched(collectives: pd.DataFrame, matched: Matched, *columns: str) -> list[np.ndarray]:
    """Cross-rank figures (`transfer_us`, `wait_us`) of each of a rank's collectives, by
    correlation (NaN where unmatched): each collective's row in `matched` found once."""
    at = _positions(np.asarray(matched.correlation), array_of(collectives, "correlation"))
    found = at >= 0
    out = []
    for column in columns:
        values = np.asarray(getattr(matched, column), dtype=np.float64)
        picked = values[np.maximum(at, 0)] if values.size else np.full(at.size, np.nan)
        out.append(np.where(found, picked, np.nan))
    return out


def _positions(keys: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """`pd.Index(keys).get_indexer(wanted)` (`keys` distinct: each wanted value's position
    in `keys`, -1 where absent), by a sort of `keys` rather than a hash table a rank: integer
    ids; anything else (a NaN would match a NaN there) through pandas."""
    if keys.dtype.kind != "i" or wanted.dtype.kind != "i":
        return pd.Index(keys).get_indexer(wanted)
    if not keys.size:
        return np.full(wanted.size, -1, dtype=np.intp)
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    if ordered.size > 1 and not (ordered[1:] != ordered[:-1]).all():
        return pd.Index(keys).get_indexer(wanted)  # repeated keys: pandas says so
    at = np.minimum(np.searchsorted(ordered, wanted), ordered.size - 1)
    return np.where(ordered[at] == wanted, order[at], -1)


def collective_transfer(
    collectives: pd.DataFrame, matched: Matched | None, exposed: iv.Intervals | None
) -> dict[str, np.ndarray]:
    """Per collective of a rank (arrays in its rows' order): its cross-rank `transfer_us` and
    `wait_us` (NaN where unmatched) and `exposed_transfer_us`: the part of its transfer
    [end − transfer, end] no compute hides, split equally among transfers running at the
    same moment (so they add up to the step's exposed transfer). `exposed`: the rank's
    C \\ K (the transfer lies in C, so what no compute hides is what lies in C \\ K); None
    where the rank has no compute kernels (CPU traces): all of it."""
    n = len(collectives)
    if n == 0 or matched is None or len(matched) == 0:
        return {name: np.full(n, np.nan) for name in TRANSFER_COLUMNS}
    transfer, wait = _matched(collectives, matched, "transfer_us", "wait_us")
    ok = ~np.isnan(transfer)
    end = array_of(collectives, "end_us", np.float64)
    start = np.maximum(end - np.nan_to_num(transfer), array_of(collectives, "start_us"))
    result = np.full(n, np.nan)
    if exposed is None:
        result[ok] = iv.split_uncovered(start[ok], end[ok], iv.EMPTY)
    else:
        result[ok] = iv.split_covered(start[ok], end[ok], exposed)
    return {"transfer_us": transfer, "wait_us": wait, "exposed_transfer_us": result}


TRANSFER_COLUMNS = ("transfer_us", "wait_us", "exposed_transfer_us")  # collective_transfer's
