"""What every rule reads: one run's analysis, seen through the figures the rules share (per
rank medians of the step breakdown, collectives with waiting for peers taken out, the
configuration and the capture's environment). Rules read timing (or plain) traces only: a
detailed trace's profiler overhead distorts timing, so it feeds attribution and the
profiler-distortion rule, never a timing rule."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import pandas as pd

from fsdp_trace.analysis.job.config import InferredConfig
from fsdp_trace.analysis.job.crossrank import CrossRank
from fsdp_trace.analysis.rank.context import display_name
from fsdp_trace.analysis.results import RankAnalysis
from fsdp_trace.analysis.table import array_of
from fsdp_trace.runrecord import RunRecord
from fsdp_trace.vocab import Collective, Device


@dataclass(frozen=True)
class Rows:
    """Some rows of a frame, read a column at a time as an array (no frame copied), each
    column once: several rules read a rank's gathers (read them, never change them)."""

    frame: pd.DataFrame
    rows: np.ndarray
    _read: dict[str, np.ndarray] = field(default_factory=dict, compare=False, repr=False)

    def __getitem__(self, column: str) -> np.ndarray:
        values = self._read.get(column)
        if values is None:
            values = self._read[column] = array_of(self.frame, column)[self.rows]
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

    def collectives(self, rank: RankAnalysis) -> pd.DataFrame:
        """A rank's collectives with `net_us` (the cross-rank transfer time, the duration
        where unmatched), `exposed_net_us` (exposed transfer, the exposed share where
        unmatched) and `matched`: waiting for a late peer is the straggler's cost, not the
        collective's. Made once per rank: read it, never change it."""
        made = self._collectives.get(id(rank))
        if made is None:
            c = rank.collectives
            transfer = array_of(c, "transfer_us", np.float64)
            matched = ~np.isnan(transfer)
            made = c.assign(
                net_us=np.where(matched, transfer, array_of(c, "dur_us")),
                exposed_net_us=np.where(
                    matched, array_of(c, "exposed_transfer_us"), array_of(c, "exposed_us")
                ),
                matched=matched,
            )
            self._collectives[id(rank)] = made
        return made

    def gathers(self, rank: RankAnalysis) -> Rows:
        """The rank's all-gathers among `collectives(rank)`, in order. Made once per rank."""
        made = self._gathers.get(id(rank))
        if made is None:
            c = self.collectives(rank)
            made = Rows(c, np.flatnonzero(array_of(c, "collective") == Collective.ALL_GATHER))
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
        matched = sum(int(r.collectives["transfer_us"].notna().sum()) for r in self.gpu_ranks)
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
