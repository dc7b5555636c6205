"""CPU-side context of a launch: which FSDP2 label, block window, autograd region or
optimizer step encloses it, on the thread that launched it.

Record-function labels on one thread nest properly (LIFO), so each family of labels is a
forest; a query finds the innermost enclosing label with one searchsorted plus a few parent
hops, vectorized over all queries. Threads are kept apart by composite keys
(thread code × span + time), so nothing loops over events in Python.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fsdp_trace.analyze import intervals as iv

FSDP_LABEL = re.compile(r"^FSDP::(?P<kind>\w+?)(?: \((?P<fqn>.*?)\))?(?: \[pg=\d+\])?$")
FSDP_PREFETCH = re.compile(r"^FSDP::(?P<kind>forward_prefetch|backward_prefetch) for (?P<fqn>.*)$")
ROOT = "root"


def parse_fsdp_label(name: str) -> tuple[str, str] | None:
    """('all_gather', 'layers.3') from 'FSDP::all_gather (layers.3)'; the root's fqn is 'root'."""
    match = FSDP_PREFETCH.match(name) or FSDP_LABEL.match(name)
    if match is None:
        return None
    fqn = match.group("fqn")
    return match.group("kind"), (fqn.strip() or ROOT) if fqn is not None else ROOT


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

    @classmethod
    def build(cls, keys: ThreadKeys, thread, ts, end, kind, fqn) -> Forest:
        thread = np.asarray(thread, dtype=np.int64)
        ts = np.asarray(ts, dtype=np.float64)
        end = np.asarray(end, dtype=np.float64)
        order = np.lexsort((-end, ts, thread))  # parents before children at equal starts
        thread, ts, end = thread[order], ts[order], end[order]
        kind = np.asarray(kind, dtype=object)[order]
        fqn = np.asarray(fqn, dtype=object)[order]
        parent = np.full(ts.size, -1, dtype=np.int64)
        stack: list[int] = []
        for i in range(ts.size):  # one pass over labels (not events): FSDP hooks are few
            while stack and (thread[stack[-1]] != thread[i] or end[stack[-1]] < end[i]):
                stack.pop()
            if stack:
                parent[i] = stack[-1]
            stack.append(i)
        return cls(thread, ts, end, kind, fqn, parent, keys.key(thread, ts))

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
        same as `np.isin(self.kind_at(idx), list(kinds))`, tested once per interval."""
        node = np.zeros(self.kind.size + 1, dtype=bool)
        node[:-1] = np.isin(self.kind, list(kinds))
        return node[idx]  # idx -1 reads the trailing False


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


def fsdp_labels(cpu: pd.DataFrame) -> pd.DataFrame:
    """FSDP2 record-function labels with their kind and unit path, one row per label."""
    is_fsdp = name_mask(cpu["name"], lambda n: n.startswith("FSDP::"))
    labels = cpu.loc[is_fsdp, ["pid", "tid", "ts", "end", "name"]].copy()
    distinct = {n: parse_fsdp_label(n) for n in labels["name"].astype(str).unique()}
    parsed = labels["name"].astype(str).map(distinct)
    labels = labels[parsed.notna().to_numpy()]
    parsed = parsed[parsed.notna()]
    labels["kind"] = [p[0] for p in parsed]
    labels["fqn"] = [p[1] for p in parsed]
    return labels.reset_index(drop=True)


def name_mask(names: pd.Series, fn) -> np.ndarray:
    """`fn(name)` per row, once per distinct name when the column is categorical."""
    if isinstance(names.dtype, pd.CategoricalDtype):
        values = names.array
        lookup = np.array([bool(fn(str(c))) for c in values.categories] + [fn("nan")], bool)
        return lookup[values.codes]
    return names.astype(str).map(fn).to_numpy(dtype=bool)


def block_windows(labels: pd.DataFrame) -> pd.DataFrame:
    """Where each unit's own compute is launched: forward between the end of
    `pre_forward (X)` and the start of `post_forward (X)`; backward between the end of
    `pre_backward (X)` and the start of its first `post_backward_*` (same thread)."""
    pieces = []
    for phase, opener, closers in (
        ("forward", {"pre_forward"}, {"post_forward"}),
        (
            "backward",
            {"pre_backward"},
            {
                "post_backward_accumulate",
                "post_backward_reshard",
                "post_backward_reduce",
                "post_backward_rs_wait",
                "finalize_backward",
            },
        ),
    ):
        open_ = labels[labels["kind"].isin(opener)][["pid", "tid", "fqn", "end"]]
        close = labels[labels["kind"].isin(closers)][["pid", "tid", "fqn", "ts"]]
        if open_.empty or close.empty:
            continue
        open_ = open_.rename(columns={"end": "w_start"}).sort_values("w_start")
        close = close.rename(columns={"ts": "w_end"}).sort_values("w_end")
        paired = pd.merge_asof(
            open_,
            close,
            left_on="w_start",
            right_on="w_end",
            by=["pid", "tid", "fqn"],
            direction="forward",
        )
        paired = paired.dropna(subset=["w_end"])
        paired["phase"] = phase
        pieces.append(paired)
    if not pieces:
        return pd.DataFrame(columns=["pid", "tid", "fqn", "w_start", "w_end", "phase"])
    return pd.concat(pieces, ignore_index=True)
