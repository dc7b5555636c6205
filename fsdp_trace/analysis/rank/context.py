"""CPU-side context of a launch: which FSDP2 label, block window, autograd region or
optimizer step encloses it, on the thread that launched it.

Record-function labels on one thread nest properly (LIFO), so each family of labels is a
forest; a query finds the innermost enclosing label with one searchsorted plus a few parent
hops, vectorized over all queries. Threads are kept apart by composite keys
(thread code × span + time), so nothing loops over events in Python.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import pandas as pd

from fsdp_trace.analysis import classify
from fsdp_trace.analysis import intervals as iv
from fsdp_trace.analysis.read.trace import MISSING
from fsdp_trace.analysis.results import kept_columns
from fsdp_trace.analysis.table import array_of, one_object_each
from fsdp_trace.vocab import ROOT, Collective, Phase

FSDP_LABEL = re.compile(r"^FSDP::(?P<kind>\w+?)(?: \((?P<fqn>.*?)\))?(?: \[pg=\d+\])?$")
FSDP_PREFETCH = re.compile(r"^FSDP::(?P<kind>forward_prefetch|backward_prefetch) for (?P<fqn>.*)$")

# FSDP2's record_function labels, by the word after `FSDP::` (trace-facts.md lists them).
ALL_GATHER = "all_gather"  # around the all-gather of the unit it names
REDUCE = "post_backward_reduce"  # around the reduce-scatter (and HSDP all-reduce) of its unit
PRE_FORWARD = "pre_forward"
POST_FORWARD = "post_forward"
PRE_BACKWARD = "pre_backward"
ROOT_PRE_FORWARD = "root_pre_forward"  # once per forward (micro-batch) of the root
PREFETCH_LABELS = frozenset({"forward_prefetch", "backward_prefetch"})
FORWARD_LABELS = frozenset(
    {
        PRE_FORWARD,
        "forward_prefetch",
        POST_FORWARD,
        ROOT_PRE_FORWARD,
        "all_gather_copy_out",
        "cast_forward_inputs",
        "cast_forward_outputs",
    }
)
BACKWARD_LABELS = frozenset(
    {
        PRE_BACKWARD,
        "backward_prefetch",
        "post_backward_accumulate",
        "post_backward_reshard",
        REDUCE,
        "post_backward_rs_wait",
        "root_post_backward_callback",
        "finalize_backward",
    }
)
# The hooks that issue work for a unit (the `issued_by` of a collective).
ISSUER_LABELS = frozenset(
    {
        PRE_FORWARD,
        PRE_BACKWARD,
        POST_FORWARD,
        REDUCE,
        ROOT_PRE_FORWARD,
        "root_post_backward_callback",
    }
)
AUTOGRAD_PREFIX = "autograd::engine::evaluate_function"
OPTIMIZER_PREFIX = "Optimizer.step#"
# torch.compile leaves these CPU ops around compiled graphs.
COMPILED_PREFIXES = ("Torch-Compiled Region", "CompiledFunction")
# The c10d ops that issue a collective (on gloo, the work then runs on gloo's thread).
C10D_COLLECTIVES = {
    "c10d::_allgather_base_": Collective.ALL_GATHER.value,
    "c10d::allgather_": Collective.ALL_GATHER.value,
    "c10d::allgather_into_tensor_coalesced_": Collective.ALL_GATHER.value,
    "c10d::_reduce_scatter_base_": Collective.REDUCE_SCATTER.value,
    "c10d::reduce_scatter_": Collective.REDUCE_SCATTER.value,
    "c10d::reduce_scatter_tensor_coalesced_": Collective.REDUCE_SCATTER.value,
    "c10d::allreduce_": Collective.ALL_REDUCE.value,
    "c10d::broadcast_": Collective.BROADCAST.value,
}


# Module-path segments that wrappers add: activation checkpointing, torch.compile, FSDP1,
# DDP/DataParallel's leading `module.`. Users know `model.layers.3`, not
# `model.layers.3._checkpoint_wrapped_module`.
WRAPPER_SEGMENTS = frozenset({"_checkpoint_wrapped_module", "_orig_mod", "_fsdp_wrapped_module"})


def display_name(fqn: str) -> str:
    """A unit's path as users know it: wrapper segments and a leading `module.` removed, in
    every module of a multi-module unit ("a, b"); the root stays `root`."""
    parts = []
    for module in str(fqn).split(", "):
        segments = [s for s in module.split(".") if s not in WRAPPER_SEGMENTS]
        if len(segments) > 1 and segments[0] == "module":
            segments = segments[1:]
        parts.append(".".join(segments) or module)
    return ", ".join(parts)


@lru_cache(maxsize=4096)  # the ranks of one job carry the same labels
def parse_fsdp_label(name: str) -> tuple[str, str, str] | None:
    """('all_gather', 'layers.3', raw) from 'FSDP::all_gather (layers.3)': the kind, the unit
    as users know it (`display_name`) and its raw path; the root's is 'root'."""
    match = FSDP_PREFETCH.match(name) or FSDP_LABEL.match(name)
    if match is None:
        return None
    fqn = match.group("fqn")
    raw = (fqn.strip() or ROOT) if fqn is not None else ROOT
    return match.group("kind"), display_name(raw) if raw != ROOT else ROOT, raw


# Some events' columns by name, each a Series (of a frame, or as `analyze._rows_of` gives
# them): what the CPU-side readers take, frame or not; `len(rows["ts"])` rows.
EventRows = Mapping[str, pd.Series]


class ThreadKeys:
    """Composite keys that keep threads apart: code(pid, tid) × span + (t − origin)."""

    def __init__(self, pids: np.ndarray, tids: np.ndarray, times: np.ndarray) -> None:
        self.origin = float(np.min(times)) if times.size else 0.0
        self.span = (float(np.max(times)) - self.origin + 10.0) if times.size else 10.0
        combined = pids.astype(np.int64) * (1 << 32) + (tids.astype(np.int64) & 0xFFFFFFFF)
        codes, uniques = pd.factorize(combined)
        self.codes = codes.astype(np.int64)
        self.threads = pd.Index(uniques)

    def code(self, pids: np.ndarray, tids: np.ndarray) -> np.ndarray:
        combined = np.asarray(pids, np.int64) * (1 << 32) + (
            np.asarray(tids, np.int64) & 0xFFFFFFFF
        )
        return self.threads.get_indexer(combined)

    def key(self, codes: np.ndarray, times: np.ndarray) -> np.ndarray:
        return codes.astype(np.float64) * self.span + (np.asarray(times, np.float64) - self.origin)


@dataclass
class Forest:
    """Properly nested intervals (per thread) with parent links, sorted by start."""

    thread: np.ndarray
    ts: np.ndarray
    end: np.ndarray
    kind: np.ndarray  # object
    fqn: np.ndarray  # object
    parent: np.ndarray
    start_key: np.ndarray
    # The kinds numbered (each interval's code, -1 appended for index -1; the distinct kinds):
    # made on the first `kind_in`, which a rank asks a dozen times of a few hundred intervals.
    _kinds: tuple[np.ndarray, list] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    @classmethod
    def build(cls, keys: ThreadKeys, thread, ts, end, kind, fqn) -> Forest:
        thread = np.asarray(thread, dtype=np.int64)
        ts = np.asarray(ts, dtype=np.float64)
        end = np.asarray(end, dtype=np.float64)
        order = np.lexsort((-end, ts, thread))  # parents before children at equal starts
        thread, ts, end = thread[order], ts[order], end[order]
        kind = np.asarray(kind, dtype=object)[order]
        # One object a unit name: every table that names units takes them from here.
        fqn = one_object_each(np.asarray(fqn, dtype=object)[order])
        return cls(thread, ts, end, kind, fqn, _parents(thread, end), keys.key(thread, ts))

    def innermost(self, keys: ThreadKeys, q_thread: np.ndarray, q_time: np.ndarray) -> np.ndarray:
        """Index of the innermost interval containing each query point (-1: none)."""
        q_thread = np.asarray(q_thread, dtype=np.int64)
        q_time = np.asarray(q_time, dtype=np.float64)
        if self.ts.size == 0 or q_time.size == 0:
            return np.full(q_time.size, -1, dtype=np.int64)
        idx = np.searchsorted(self.start_key, keys.key(q_thread, q_time), side="right") - 1
        for _ in range(64):  # nesting depth bound
            ok = idx >= 0
            safe = np.maximum(idx, 0)
            bad = ok & ((self.thread[safe] != q_thread) | (self.end[safe] < q_time))
            if not bad.any():
                break
            idx = np.where(bad, np.where(self.thread[safe] == q_thread, self.parent[safe], -1), idx)
        return idx

    def chain(self, idx: np.ndarray, depth: int = 8) -> np.ndarray:
        """Rows of [innermost, parent, grandparent, ...] indices (-1 padded)."""
        out = np.full((idx.size, depth), -1, dtype=np.int64)
        if self.parent.size == 0:
            return out
        current = idx.copy()
        for level in range(depth):
            out[:, level] = current
            current = np.where(current >= 0, self.parent[np.maximum(current, 0)], -1)
        return out

    def first_of(self, chain: np.ndarray, kinds: set[str]) -> np.ndarray:
        """Per row, the innermost chain entry whose kind is in `kinds` (-1: none)."""
        if chain.size == 0 or self.kind.size == 0:
            return np.full(chain.shape[0], -1, dtype=np.int64)
        hit = self.kind_in(kinds, chain)
        first = np.argmax(hit, axis=1)
        found = hit[np.arange(chain.shape[0]), first]
        return np.where(found, chain[np.arange(chain.shape[0]), first], -1)

    def fqn_at(self, idx: np.ndarray) -> np.ndarray:
        return _take(self.fqn, idx)

    def kind_at(self, idx: np.ndarray) -> np.ndarray:
        return _take(self.kind, idx)

    def kind_in(self, kinds: set[str], idx: np.ndarray) -> np.ndarray:
        """Whether the interval at each index (-1: none, never) has a kind in `kinds`; the
        same as `np.isin(self.kind_at(idx), list(kinds))`, tested once per distinct kind."""
        if self._kinds is None:
            codes, distinct = pd.factorize(self.kind)  # a missing kind: -1, in no set
            at = np.full(self.kind.size + 1, -1, dtype=np.int64)
            at[:-1] = codes  # idx -1 (none) reads the trailing -1
            self._kinds = (at, distinct.tolist())
        at, distinct = self._kinds
        node = np.zeros(len(distinct) + 1, dtype=bool)  # code -1 reads the trailing False
        node[:-1] = [k in kinds for k in distinct]
        return node[at[idx]]


# A unit recomputes when backward re-runs at least this share of the forward ops its forward
# ran (activation checkpointing re-runs all of them). Fewer are ops a backward creates on its
# own: torchao's float8 linears cast each gradient to float8 in backward through an autograd
# Function (`_ToFloat8ConstrFunc`), a handful per layer, not the unit's forward.
RECOMPUTE_SHARE = 0.5


def _recomputing(
    keys: ThreadKeys,
    windows: Forest,
    code: np.ndarray,
    ts: np.ndarray,
    in_backward: np.ndarray,
    in_forward: np.ndarray,
) -> np.ndarray:
    """Per op (True where kept): forward ops run inside backward (`in_backward`) count as
    recompute only in units whose backward re-runs `RECOMPUTE_SHARE` of the forward ops
    (`in_forward`) that the unit's forward ran; by unit window where FSDP2 labels give them,
    else over the whole trace."""

    # Each window's unit as a number (a unit has a window per step and phase; no window: ""),
    # the window index -1 reading the last entry: ops are counted, not their names compared.
    fqn = np.asarray(windows.fqn, dtype=object)
    names = np.where(pd.isna(fqn), "", fqn).astype(object)
    unit_of, units = pd.factorize(np.append(names, ""))

    def units_of(mask: np.ndarray) -> np.ndarray:
        return unit_of[windows.innermost(keys, code[mask], ts[mask])]

    back = units_of(in_backward)
    n_back = np.bincount(back, minlength=len(units)).tolist()
    n_fwd = np.bincount(units_of(in_forward), minlength=len(units)).tolist()
    # no forward ops to compare with (reentrant checkpointing runs forward without grad):
    # everything re-run in backward is the forward
    kept_unit = np.array(
        [not f or b / f >= RECOMPUTE_SHARE for b, f in zip(n_back, n_fwd, strict=True)]
    )
    keep = np.ones(len(code), dtype=bool)
    keep[np.flatnonzero(in_backward)] = kept_unit[back]
    return keep


def _take(values: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """values[idx] with None where idx is -1 (and for an empty forest)."""
    padded = np.empty(values.size + 1, dtype=object)  # a trailing None for idx -1
    padded[:-1] = values
    return padded[idx]


class ThreadUnion:
    """Union of intervals per thread, for point-in-region tests."""

    def __init__(self, keys: ThreadKeys, thread, ts, end) -> None:
        self.keys = keys
        thread = np.asarray(thread, dtype=np.int64)
        self.union = iv.union(keys.key(thread, ts), keys.key(thread, end))

    def contains(self, q_thread, q_time) -> np.ndarray:
        return iv.contains(self.union, self.keys.key(np.asarray(q_thread, np.int64), q_time))


def fsdp_labels(cpu: EventRows) -> pd.DataFrame:
    """FSDP2 record-function labels with their kind and unit path, one row per label."""
    rows = np.flatnonzero(name_mask(cpu["name"], lambda n: n.startswith("FSDP::")))
    names = cpu["name"].array[rows]
    texts = [str(n) for n in names]  # a few hundred labels a step
    distinct = {t: parse_fsdp_label(t) for t in set(texts)}
    parsed = [distinct[t] for t in texts]
    kept = np.array([p is not None for p in parsed], dtype=bool)
    parsed = [p for p in parsed if p is not None]
    return pd.DataFrame(
        {
            **{c: array_of(cpu, c)[rows[kept]] for c in ("pid", "tid", "ts", "end")},
            "name": names[kept],
            "kind": [p[0] for p in parsed],
            "fqn": [p[1] for p in parsed],
            "fqn_raw": [p[2] for p in parsed],
        }
    )


def _parents(thread: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Each interval's parent (the nearest before it on its thread that does not end before
    it; -1: none), the intervals sorted by thread, start and end descending. One pass over
    labels, not events (FSDP hooks are few), on Python numbers (a numpy scalar's compare is
    ~10x slower)."""
    parent = [-1] * thread.size
    stack: list[int] = []
    threads, ends = thread.tolist(), end.tolist()
    for i, (t, e) in enumerate(zip(threads, ends, strict=True)):
        while stack and (threads[stack[-1]] != t or ends[stack[-1]] < e):
            stack.pop()
        if stack:
            parent[i] = stack[-1]
        stack.append(i)
    return np.array(parent, dtype=np.int64)


def name_mask(names: pd.Series | pd.Categorical, fn) -> np.ndarray:
    """`fn(name)` per row, once per distinct name when the column is categorical."""
    if isinstance(names.dtype, pd.CategoricalDtype):
        values = names.array if isinstance(names, pd.Series) else names
        codes = values.codes
        texts = _category_texts(values.categories)
        if codes.size * 4 < len(texts):  # few rows: the categories they use
            used, where = iv.unique(codes, return_inverse=True)
            found = ([fn("nan")] if used.size and used[0] < 0 else []) + [
                fn(texts[i]) for i in used[used >= 0].tolist()
            ]
            return np.array(found, dtype=bool)[where.reshape(codes.shape)]
        return classify.category_table(texts, fn, bool, "nan")[codes]
    return names.astype(str).map(fn).to_numpy(dtype=bool)


# The categories of the name column read last and their text: a trace's slices share its
# categories, and a dozen string tests read them (reading a pandas Index is ~1 µs a value).
_texts_of: tuple[pd.Index, tuple[str, ...]] | None = None


def _category_texts(categories: pd.Index) -> tuple[str, ...]:
    """`tuple(str(c) for c in categories)`, made once per categories object."""
    global _texts_of
    last = _texts_of
    if last is None or last[0] is not categories:
        last = (categories, tuple([str(c) for c in categories.tolist()]))
        _texts_of = last
    return last[1]


WINDOW_COLUMNS = ("pid", "tid", "fqn", "w_start", "w_end")


def block_windows(labels: pd.DataFrame) -> dict[str, np.ndarray]:
    """Where each unit's own compute is launched: forward between the end of
    `pre_forward (X)` and the start of `post_forward (X)`; backward between the end of
    `pre_backward (X)` and the start of its first `post_backward_*` (same thread). One array
    per column: pid, tid, fqn, w_start, w_end and phase."""
    pieces = []
    for phase, opener, closers in (
        (Phase.FORWARD.value, {PRE_FORWARD}, {POST_FORWARD}),
        (
            Phase.BACKWARD.value,
            {PRE_BACKWARD},
            {
                "post_backward_accumulate",
                "post_backward_reshard",
                "post_backward_reduce",
                "post_backward_rs_wait",
                "finalize_backward",
            },
        ),
    ):
        kind = array_of(labels, "kind")
        opens = np.flatnonzero(np.isin(kind, list(opener)))
        closes = np.flatnonzero(np.isin(kind, list(closers)))
        if not opens.size or not closes.size:
            continue
        paired = _first_close_after(labels, opens, closes)
        if paired is None:  # NaN among the keys or times: pandas' own matching
            open_ = labels.iloc[opens][["pid", "tid", "fqn", "end"]]
            close = labels.iloc[closes][["pid", "tid", "fqn", "ts"]]
            open_ = open_.rename(columns={"end": "w_start"}).sort_values("w_start")
            close = close.rename(columns={"ts": "w_end"}).sort_values("w_end")
            merged = pd.merge_asof(
                open_,
                close,
                left_on="w_start",
                right_on="w_end",
                by=["pid", "tid", "fqn"],
                direction="forward",
            ).dropna(subset=["w_end"])
            paired = {c: array_of(merged, c) for c in WINDOW_COLUMNS}
        paired["phase"] = np.full(paired["w_start"].size, phase, dtype=object)
        pieces.append(paired)
    if not pieces:
        empty = (np.int64, np.int64, object, np.float64, np.float64, object)
        return {c: np.empty(0, t) for c, t in zip((*WINDOW_COLUMNS, "phase"), empty, strict=True)}
    return {c: np.concatenate([p[c] for p in pieces]) for c in pieces[0]}


def _first_close_after(
    labels: pd.DataFrame, opens: np.ndarray, closes: np.ndarray
) -> dict[str, np.ndarray] | None:
    """The opening labels (rows `opens`; sorted by their end, `w_start`), each with the start
    (`w_end`) of the first closing label (rows `closes`) of the same pid, tid and unit at or
    after it, those without one left out: `merge_asof(open_, close, by=[pid, tid, fqn],
    direction="forward")` then `dropna(w_end)`, in numpy, a column each (`WINDOW_COLUMNS`).
    None where a key or time is NaN."""
    rows = np.concatenate([opens, closes])
    group = np.zeros(rows.size, dtype=np.int64)
    keys = {column: array_of(labels, column) for column in ("pid", "tid", "fqn")}
    for values in keys.values():
        codes, uniques = pd.factorize(values[rows])
        if (codes < 0).any():
            return None
        group = pd.factorize(group * max(len(uniques), 1) + codes)[0].astype(np.int64)
    start = array_of(labels, "end", np.float64)[opens]
    end = array_of(labels, "ts", np.float64)[closes]
    if np.isnan(start).any() or np.isnan(end).any():
        return None
    by_start = np.argsort(start, kind="quicksort")  # as `sort_values("w_start")` orders them
    # (group, time) as one integer: times as their ranks among all times (exact).
    values, rank = iv.unique(np.concatenate([start, end]), return_inverse=True)
    composite = group * (values.size + 1) + rank
    open_key, close_key = composite[: opens.size][by_start], composite[opens.size :]
    open_group, close_group = group[: opens.size][by_start], group[opens.size :]
    order = np.argsort(close_key, kind="stable")
    at = np.searchsorted(close_key[order], open_key, side="left")  # first close ≥ the open
    safe = np.minimum(at, closes.size - 1)
    matched = (at < closes.size) & (close_group[order][safe] == open_group)
    chosen = opens[by_start][matched]
    return {
        **{column: values[chosen] for column, values in keys.items()},
        "w_start": start[by_start][matched],
        "w_end": end[order][safe][matched],
    }


@dataclass
class CpuContext:
    """The CPU-side context of a trace, built once and queried for every launch: FSDP2
    labels, each unit's compute windows, autograd (backward), recompute and optimizer."""

    keys: ThreadKeys
    labels: Forest
    windows: Forest
    autograd: ThreadUnion
    recompute: ThreadUnion
    optimizer: ThreadUnion
    label_table: pd.DataFrame  # one row per FSDP2 label: pid, tid, ts, end, kind, fqn
    recompute_ops: tuple[np.ndarray, np.ndarray]  # forward ops run inside backward: thread, ts
    compiled_regions: int  # torch.compile regions entered (CPU ops)

    @property
    def unit_names(self) -> dict[str, str]:
        """Each unit's name as shown (wrappers stripped) → its raw path in the labels."""
        table = self.label_table
        if table.empty:
            return {}
        # Lists first: iterating a categorical column reads it one element at a time.
        return dict(zip(table["fqn"].tolist(), table["fqn_raw"].tolist(), strict=True))

    COLUMNS = ("pid", "tid", "ts", "end", "name", "sequence_number")

    @classmethod
    def build(cls, cpu: EventRows) -> CpuContext:
        keys = ThreadKeys(array_of(cpu, "pid"), array_of(cpu, "tid"), array_of(cpu, "ts"))
        code = keys.codes
        fsdp = fsdp_labels(cpu)
        labels = Forest.build(
            keys,
            keys.code(fsdp["pid"], fsdp["tid"]),
            fsdp["ts"],
            fsdp["end"],
            fsdp["kind"],
            fsdp["fqn"],
        )
        win = block_windows(fsdp)
        windows = Forest.build(
            keys,
            keys.code(win["pid"], win["tid"]),
            win["w_start"],
            win["w_end"],
            win["phase"],
            win["fqn"],
        )
        names = cpu["name"]  # string tests run once per distinct name
        ts, end = array_of(cpu, "ts"), array_of(cpu, "end")
        is_autograd = name_mask(names, lambda n: n.startswith(AUTOGRAD_PREFIX))
        autograd = ThreadUnion(keys, code[is_autograd], ts[is_autograd], end[is_autograd])
        # Recompute = forward ops (they carry an autograd sequence number) run inside backward,
        # where they re-run the unit's forward (`_recomputing`).
        candidate = (
            (array_of(cpu, "sequence_number") != MISSING)
            & ~name_mask(names, lambda n: "Backward" in n)
            & ~is_autograd
        )
        inside = np.zeros(len(ts), dtype=bool)
        inside[candidate] = autograd.contains(code[candidate], ts[candidate])
        inside &= _recomputing(keys, windows, code, ts, inside, candidate & ~inside)
        recompute = ThreadUnion(keys, code[inside], ts[inside], end[inside])
        is_opt = name_mask(names, lambda n: n.startswith(OPTIMIZER_PREFIX))
        optimizer = ThreadUnion(keys, code[is_opt], ts[is_opt], end[is_opt])
        compiled = int(name_mask(names, lambda n: n.startswith(COMPILED_PREFIXES)).sum())
        recompute_ops = (code[inside], ts[inside])
        return cls(
            keys, labels, windows, autograd, recompute, optimizer, fsdp, recompute_ops, compiled
        )

    def facts(self, cpu_steps: pd.DataFrame) -> pd.DataFrame:
        """What the FSDP2 hooks did per profiled step: one row per step × label kind × unit
        with its count and first start (µs), plus kind `recompute`: forward ops re-run inside
        the unit's backward (activation checkpointing). The run's configuration is inferred
        from this table (`fsdp_trace.analysis.job.config`)."""
        table = self.label_table
        label_kind = array_of(table, "kind")
        wanted = np.isin(label_kind, list(FACT_KINDS))
        op_thread, op_ts = self.recompute_ops
        idx = self.windows.innermost(self.keys, op_thread, op_ts)
        units = self.windows.fqn_at(idx)
        found = pd.notna(units)
        kind = np.concatenate([label_kind[wanted], np.full(int(found.sum()), RECOMPUTE_FACT)])
        unit = np.concatenate([array_of(table, "fqn")[wanted], units[found]])
        ts = np.concatenate([array_of(table, "ts")[wanted], op_ts[found]])
        ts = ts.astype(np.float64)
        if cpu_steps.empty:
            step = np.zeros(ts.size, dtype=np.int64)
        else:
            from fsdp_trace.analysis.rank.steps import step_of_time

            step = step_of_time(cpu_steps, ts)
            inside = step >= 0
            kind, unit, ts, step = kind[inside], unit[inside], ts[inside], step[inside]
        if ts.size == 0:
            return pd.DataFrame(columns=FACT_COLUMNS)
        # `groupby(["step", "kind", "unit"], sort=True).agg(count=size, first_ts=min)`, in
        # numpy: each column's codes in sorted order, combined, order the groups as it does.
        combined = np.zeros(ts.size, dtype=np.int64)
        dropped = np.zeros(ts.size, dtype=bool)
        for column in (step, kind, unit):
            codes, uniques = pd.factorize(column, sort=True)
            dropped |= codes < 0
            combined = combined * (len(uniques) + 1) + codes + 1
        kept = np.flatnonzero(~dropped)
        groups, first, where = np.unique(combined[kept], return_index=True, return_inverse=True)
        first_ts = np.full(groups.size, np.nan)
        np.fmin.at(first_ts, where, ts[kept])
        head = kept[first]
        columns = {
            "step": step[head],
            "kind": kind[head],
            "unit": unit[head],
            "count": np.bincount(where, minlength=groups.size).astype(np.int64),
            "first_ts": first_ts,
        }
        return pd.DataFrame(kept_columns("fsdp", columns))


# The label kinds the facts table counts, and its columns.
FACT_KINDS = (
    PRE_FORWARD,
    POST_FORWARD,
    PRE_BACKWARD,
    ROOT_PRE_FORWARD,
    ALL_GATHER,
    REDUCE,
    "forward_prefetch",
    "backward_prefetch",
)
RECOMPUTE_FACT = "recompute"
FACT_COLUMNS = ["step", "kind", "unit", "count", "first_ts"]
