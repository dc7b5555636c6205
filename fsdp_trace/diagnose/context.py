"""What every rule reads: one run's analysis, seen through the figures the rules share (per
rank medians of the step breakdown, collectives with waiting for peers taken out, the
configuration and the capture's environment). Rules read timing (or plain) traces only: a
detailed trace's profiler overhead distorts timing, so it feeds attribution and the
profiler-distortion rule, never a timing rule."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property, partial

import numpy as np
import pandas as pd

from fsdp_trace.analysis.job.config import InferredConfig
from fsdp_trace.analysis.job.crossrank import CrossRank
from fsdp_trace.analysis.rank.context import display_name
from fsdp_trace.analysis.results import RankAnalysis
from fsdp_trace.analysis.table import array_of
from fsdp_trace.runrecord import RunRecord
from fsdp_trace.vocab import Collective, Device

# A sum's bound is raised by this share: the rules' sums (`iv.group_sum`, compensated) and
# the bound's (plain) may round apart by a few ulps (the relative error of either is far
# below this for any number of rows a rank holds).
SUM_MARGIN = 1e-6

# The columns `Context.collectives` adds to a rank's collectives.
NET_COLUMNS = ("net_us", "exposed_net_us", "matched")


def net_columns(read: Callable[[str], np.ndarray]) -> dict[str, np.ndarray]:
    """`NET_COLUMNS` from the columns `read` gives (one rank's, or a run's joined): the
    cross-rank transfer where matched, else the duration, and the same for exposed time."""
    transfer = np.asarray(read("transfer_us"), dtype=np.float64)
    matched = ~np.isnan(transfer)
    return {
        "net_us": np.where(matched, transfer, read("dur_us")),
        "exposed_net_us": np.where(matched, read("exposed_transfer_us"), read("exposed_us")),
        "matched": matched,
    }


class RunCollectives:
    """The collectives of a run's ranks as columns over all of them (`NET_COLUMNS` too),
    each joined once: rules that read a thousand ranks' columns one rank at a time paid a
    pandas read a column and a new frame (for the net columns) a rank. A rank's column is
    its slice of the joined one: the same values and dtype as read from its own table, and
    read from its own table where they could differ (no rows; a column whose dtype is not
    the same on every rank; a rank not of the run)."""

    def __init__(self, ranks: list[RankAnalysis]) -> None:
        self.ranks = [r for r in ranks if len(r.collectives)]
        self._at = {id(r): i for i, r in enumerate(self.ranks)}
        sizes = np.array([len(r.collectives) for r in self.ranks], dtype=np.int64)
        self._starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        self._bounds = [*self._starts.tolist(), int(sizes.sum())]  # each rank's rows: [i, i+1)
        self._joined: dict[str, np.ndarray | None] = {}

    def column(self, rank: RankAnalysis, name: str) -> np.ndarray:
        """The rank's column `name` of `Context.collectives(rank)`, as an array (read it,
        never change it)."""
        i = self._at.get(id(rank))
        joined = self.joined(name) if i is not None else None
        if joined is None:
            if name in NET_COLUMNS:
                return net_columns(lambda n: array_of(rank.collectives, n))[name]
            return array_of(rank.collectives, name)
        return joined[self._bounds[i] : self._bounds[i + 1]]

    def rank_bound(self, name: str, total: bool = False, **among: list[str]) -> dict[int, float]:
        """Per rank (by id) with collectives: the largest of its column `name` over its rows
        whose columns hold one of the values `among` gives (`collective=[...]`), or with
        `total` the sum of its positive values there (raised by `SUM_MARGIN`); NaN skipped,
        -inf (0 for `total`) for none.
        An upper bound on any median (with `total`: any sum) of those values a rule takes, so
        a rule skips the ranks that cannot pass its threshold. Empty where a column read is
        not joined: no rank skipped."""
        values = self.joined(name)
        columns = {column: self.joined(column) for column in among}
        if values is None or not values.size or any(c is None for c in columns.values()):
            return {}
        values = np.asarray(values, dtype=np.float64)
        keep = ~np.isnan(values)
        for column, wanted in among.items():
            keep &= np.isin(columns[column], wanted)
        if total:  # a plain sum, a rule's may be compensated: a margin for their rounding
            positive = np.where(keep, np.maximum(values, 0.0), 0.0)
            bound = np.add.reduceat(positive, self._starts) * (1.0 + SUM_MARGIN)
        else:  # exact: no median of these values exceeds their largest
            bound = np.maximum.reduceat(np.where(keep, values, -np.inf), self._starts)
        return {id(r): float(b) for r, b in zip(self.ranks, bound.tolist(), strict=True)}

    def joined(self, name: str) -> np.ndarray | None:
        """Column `name` of every rank with collectives, joined in `ranks`' order, once (read
        it, never change it); None where a rank's dtype differs (or, for a net column, that of
        a column it is made of)."""
        if name not in self._joined:
            if name in NET_COLUMNS:
                sources = {n: self.joined(n) for n in _NET_SOURCES}
                made = dict.fromkeys(NET_COLUMNS)
                if all(v is not None for v in sources.values()):
                    made = net_columns(sources.__getitem__)
                self._joined.update(made)
            else:
                parts = [array_of(r.collectives, name) for r in self.ranks]
                same = parts and all(p.dtype == parts[0].dtype for p in parts)
                self._joined[name] = np.concatenate(parts) if same else None
            for values in self._joined.values():
                if values is not None:
                    values.flags.writeable = False  # every rule reads the same one
        return self._joined[name]


_NET_SOURCES = ("transfer_us", "dur_us", "exposed_transfer_us", "exposed_us")


@dataclass(frozen=True)
class Rows:
    """Some rows of a rank's collectives, read a column at a time as an array (no frame
    copied), each column once: several rules read a rank's gathers (read them, never change
    them)."""

    read: Callable[[str], np.ndarray]  # a column of the rank's collectives, whole
    rows: np.ndarray
    _read: dict[str, np.ndarray] = field(default_factory=dict, compare=False, repr=False)

    def __getitem__(self, column: str) -> np.ndarray:
        values = self._read.get(column)
        if values is None:
            values = self._read[column] = self.read(column)[self.rows]
            values.flags.writeable = False  # shared by the rules that read it
        return values

    def __len__(self) -> int:
        return int(self.rows.size)


@dataclass
class Context:
    analysis: object  # fsdp_trace.result.RunAnalysis (not imported: it imports the diagnosis)
    # Each rank's `collectives(rank)` and `gathers(rank)`, made once (by id: ranks are not
    # hashable); several rules read them, and each pandas step costs ~1 ms over any size.
    _collectives: dict[int, pd.DataFrame] = field(default_factory=dict, init=False, repr=False)
    _gathers: dict[int, Rows] = field(default_factory=dict, init=False, repr=False)

    @property
    def record(self) -> RunRecord | None:
        return self.analysis.run

    @property
    def config(self) -> InferredConfig:
        return self.analysis.config

    @property
    def crossrank(self) -> CrossRank:
        return self.analysis.crossrank

    @cached_property
    def gpu_ranks(self) -> list[RankAnalysis]:
        """Timing (or plain) GPU traces with at least one step."""
        return [r for r in self.analysis.ranks if r.device == Device.GPU and not r.steps.empty]

    def step_us(self, rank: RankAnalysis) -> float:
        """The rank's median step (the step every per-rank figure is read from)."""
        b = self.analysis.rank_breakdown(rank)
        return float(b["step_us"]) if b is not None else float(rank.steps["step_us"].median())

    def median_step_us(self) -> float:
        steps = [self.step_us(r) for r in self.gpu_ranks]
        return float(np.median(steps)) if steps else 0.0

    def part(self, rank: RankAnalysis, name: str) -> float:
        """A breakdown part of the rank's median step (NaN: unknown), so a cost and its share
        of the step come from one real step, as the views show them."""
        b = self.analysis.rank_breakdown(rank)
        value = b.get(name) if b is not None else None
        return float(value) if value is not None else float("nan")

    @cached_property
    def run_collectives(self) -> RunCollectives:
        return RunCollectives(self.analysis.ranks)

    def column(self, rank: RankAnalysis, name: str) -> np.ndarray:
        """A column of `collectives(rank)` as an array, without making the frame (read it,
        never change it)."""
        return self.run_collectives.column(rank, name)

    def collectives(self, rank: RankAnalysis) -> pd.DataFrame:
        """A rank's collectives with `net_us` (the cross-rank transfer time, the duration
        where unmatched), `exposed_net_us` (exposed transfer, the exposed share where
        unmatched) and `matched`: waiting for a late peer is the straggler's cost, not the
        collective's. Made once per rank: read it, never change it."""
        made = self._collectives.get(id(rank))
        if made is None:
            net = {n: np.array(self.column(rank, n)) for n in NET_COLUMNS}  # the frame's own
            made = rank.collectives.assign(**net)
            self._collectives[id(rank)] = made
        return made

    def gathers(self, rank: RankAnalysis) -> Rows:
        """The rank's all-gathers among `collectives(rank)`, in order. Made once per rank."""
        made = self._gathers.get(id(rank))
        if made is None:
            read = partial(self.column, rank)
            made = Rows(read, np.flatnonzero(read("collective") == Collective.ALL_GATHER))
            self._gathers[id(rank)] = made
        return made

    def unmatched_share(self) -> float:
        """Share of the timing GPU ranks' collectives with no cross-rank match, in a job of
        more than one rank (0 for one rank: nothing to wait for)."""
        world = self.config.world_size.value or len(self.gpu_ranks)
        counts = [len(r.collectives) for r in self.gpu_ranks]
        total = sum(counts)
        if world <= 1 or total == 0:
            return 0.0
        matched = sum(int(np.count_nonzero(self.column(r, "matched"))) for r in self.gpu_ranks)
        return 1.0 - matched / total

    def env(self, name: str) -> str | None:
        """An environment variable of the capture (run.json; not in the trace)."""
        return self.record.env(name) if self.record is not None else None

    def env_vars(self) -> dict[str, str]:
        return dict(self.record.environment.env_vars) if self.record is not None else {}

    def block_units(self) -> set[str]:
        """The transformer-block units: run.json's list, else the inferred ones."""
        if self.record is not None and self.record.model.blocks:
            return {display_name(b) for b in self.record.model.blocks}
        return set(self.config.blocks)

    @property
    def knob(self):
        """The capture options (run.json `config`), or None without run.json."""
        return self.record.config if self.record is not None else None


def pct(fraction: float) -> str:
    return f"{100 * fraction:.1f} %"


def ms(us: float) -> str:
    return f"{us / 1e3:.2f} ms"


def per_step_rows(step: np.ndarray, key: np.ndarray, first: bool) -> np.ndarray:
    """Positions of one row per step, by step ascending: each step's earliest (`first`) or
    latest row by `key` (ties: the earlier row first; NaN keys last), as a stable sort by
    (step, key) and `groupby("step").head(1)` / `.tail(1)` pick them."""
    if step.size == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((key, step))  # stable: equal (step, key) rows keep their order
    ordered = step[order]
    change = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
    if first:
        return order[np.concatenate([[0], change])]
    return order[np.concatenate([change - 1, [ordered.size - 1]])]
