"""What `fsdp_trace.analyze` returns: one `Result` holding a `RunAnalysis` per run, each with
everything any front end shows (per-rank tables, the step breakdown, the inferred
configuration, the cross-rank view, the diagnosis). Front ends render these; they compute
nothing of their own (`fsdp_trace.present` formats them once for all of them)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from fsdp_trace.analysis import intervals as iv
from fsdp_trace.analysis.results import (
    BLOCK_COLUMNS,
    BREAKDOWN_COLUMNS,
    COLLECTIVE_COLUMNS,
    PARTS,
    STEP_COLUMNS,
    RankAnalysis,
)
from fsdp_trace.analysis.table import array_of
from fsdp_trace.vocab import Device, Source

if TYPE_CHECKING:
    from fsdp_trace.analysis.job.config import InferredConfig
    from fsdp_trace.analysis.job.crossrank import CrossRank
    from fsdp_trace.diagnose.finding import Diagnosis
    from fsdp_trace.runrecord import RunRecord


def _concat(frames: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame(columns=columns)
    return pd.concat(frames, ignore_index=True).reindex(columns=columns)


def median_step(steps: pd.DataFrame) -> int | None:
    """The row of the step whose length (`step_us`) is the median of a rank's steps (the lower
    middle one for an even count; equal lengths by step): its parts add up to its step
    exactly, as a real step's do. None without steps."""
    if steps.empty:
        return None
    order = np.lexsort((array_of(steps, "step"), array_of(steps, "step_us", np.float64)))
    return int(order[(order.size - 1) // 2])  # as a stable sort_values(["step_us", "step"])


@dataclass
class RunAnalysis:
    """One run (one training job's traces, one per rank) analyzed end to end."""

    name: str
    inputs: list[str]
    ranks: list[RankAnalysis]  # timing (or plain) traces, one per rank
    detailed: list[RankAnalysis]  # record_shapes + with_stack traces beside timing ones
    run: RunRecord | None
    config: InferredConfig
    crossrank: CrossRank
    diagnosis: Diagnosis
    # The run's own notices (grouping, configuration, cross-rank, diagnosis, HTA); `notices`
    # adds run.json's and each trace's, as every front end shows them.
    own_notices: list[str] = field(default_factory=list)
    hta: pd.DataFrame | None = None
    run_dir: str | None = None
    _median_steps: dict = field(default_factory=dict, repr=False, compare=False)
    # While `tables_held`: the joined tables by name, (the traces' tables, their join).
    _joined: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _holding: int = field(default=0, init=False, repr=False, compare=False)

    # --- tables over every trace of the run (timing, then detailed: tell them by `source`)

    @contextmanager
    def tables_held(self) -> Iterator[RunAnalysis]:
        """Within it, `steps`, `blocks` and `collectives` are joined once (again only where a
        trace's table was replaced by another), each read a copy of its own: for a front end
        that reads them many times (a thousand ranks' join costs ~0.4 s; the report reads the
        collectives seven times) and changes no trace's table in place. Outside, each read
        joins afresh."""
        self._holding += 1
        try:
            yield self
        finally:
            self._holding -= 1
            if not self._holding:
                self._joined.clear()

    def _table(self, name: str, columns: list[str]) -> pd.DataFrame:
        parts = [getattr(r, name) for r in self.ranks + self.detailed]
        if not self._holding:
            return _concat(parts, columns)
        held = self._joined.get(name)
        if (
            held is None
            or len(held[0]) != len(parts)
            or any(a is not b for a, b in zip(held[0], parts, strict=True))
        ):
            held = self._joined[name] = (parts, _concat(parts, columns))  # one store: threads
        return held[1].copy()

    @property
    def steps(self) -> pd.DataFrame:
        """One row per rank × step."""
        return self._table("steps", STEP_COLUMNS)

    @property
    def blocks(self) -> pd.DataFrame:
        """One row per rank × unit × phase × collective."""
        return self._table("blocks", BLOCK_COLUMNS)

    @property
    def collectives(self) -> pd.DataFrame:
        """One row per NCCL kernel (gloo traces: per CPU collective)."""
        return self._table("collectives", COLLECTIVE_COLUMNS)

    @property
    def breakdown(self) -> pd.DataFrame:
        """Where every µs of each rank's steps goes: one row per rank × step, parts adding up
        to `step_us` (fsdp_trace.analysis.rank.breakdown)."""
        steps = self.steps
        frame = steps.rename(columns={"model_compute_us": "compute_us_model"})
        out = frame[["rank", "source", "step", "step_us"]].copy()
        for part in PARTS:
            column = "compute_us_model" if part == "compute_us" else part
            out[part] = array_of(frame, column)
        return out[BREAKDOWN_COLUMNS]

    def rank_breakdown(self, rank: RankAnalysis) -> dict[str, Any] | None:
        """A rank's breakdown: its median step's parts (they add up to its step_us). The one
        per-rank statistic every view and rule reads (cards, tables, costs)."""
        key = (id(rank), rank.rank, rank.source)
        if key not in self._median_steps:
            steps = rank.steps
            row = median_step(steps)
            # The parts as the breakdown names them: its compute is the model's.
            source = {**{p: p for p in PARTS}, "compute_us": "model_compute_us"}
            value = {
                p: float(array_of(steps, c)[row]) if row is not None and c in steps else np.nan
                for p, c in {"step_us": "step_us", **source}.items()
            }
            if row is None or not np.isfinite(value["compute_us"]):
                self._median_steps[key] = None
            else:
                parts = {k: _float(value[k]) for k in ("step_us", *PARTS)}
                self._median_steps[key] = {"step": int(steps["step"].iloc[row]), **parts}
        return self._median_steps[key]

    @property
    def findings(self) -> list:
        return self.diagnosis.findings

    @property
    def notices(self) -> list[str]:
        """Every notice about this run, as the terminal, the report and to_json() show them:
        run.json's, the run's own, then each trace's (prefixed by who gave it; one line for a
        notice several traces share)."""
        lines = [f"run.json: {n}" for n in (self.run.figures.notices if self.run else [])]
        lines += list(self.own_notices)
        owners: dict[str, list[RankAnalysis]] = {}
        for r in self.ranks + self.detailed:
            for notice in dict.fromkeys(r.notices):
                owners.setdefault(notice, []).append(r)
        lines += [f"{_owners(traces)}: {notice}" for notice, traces in owners.items()]
        return list(dict.fromkeys(lines))

    @property
    def gpu(self) -> bool:
        return any(r.device == Device.GPU for r in self.ranks)

    def distortion(self) -> list[dict[str, Any]]:
        """The detailed step (record_shapes + with_stack) against the timing steps' median,
        per rank."""
        out = []
        timing = {r.rank: r for r in self.ranks}
        for det in self.detailed:
            base = timing.get(det.rank)
            if base is None or base.steps.empty or det.steps.empty:
                continue
            t_med = iv.median(array_of(base.steps, "step_us"))
            d_step = float(det.steps["step_us"].iloc[-1])
            out.append(
                {
                    "rank": det.rank,
                    "detailed_step_us": d_step,
                    "timing_median_step_us": t_med,
                    "timing_max_step_us": float(base.steps["step_us"].max()),
                    "slowdown_pct": 100.0 * (d_step - t_med) / t_med if t_med else float("nan"),
                    "detailed_exposed_pct": float(det.steps["exposed_pct"].iloc[-1]),
                    # NaN on a CPU trace: no exposed time to read (NaN, no warning)
                    "timing_exposed_pct": iv.median(array_of(base.steps, "exposed_pct")),
                }
            )
        return out

    def to_json(self) -> dict[str, Any]:
        """A shim for API users: `fsdp_trace.present.payload.to_json(run)`, the presentation
        layer's (the one import upward a record makes: ARCHITECTURE.md)."""
        from fsdp_trace.present.payload import to_json

        return to_json(self)


# A notice several traces share names at most this many of them (then their count).
OWNERS_LISTED = 16


def _owners(traces: list[RankAnalysis]) -> str:
    """Who a notice came from: 'rank 1', 'ranks 0, 1 (timing and detailed traces)', 'rank 1;
    rank 0 (detailed)', or file names where ranks cannot tell traces apart."""

    def ranks(numbers: list[int]) -> str:
        if len(numbers) > OWNERS_LISTED:  # a thousand ranks: the count, the first, the last
            shown = ", ".join(map(str, numbers[: OWNERS_LISTED // 2]))
            return f"{len(numbers):,} ranks ({shown}, …, {numbers[-1]})"
        return ("ranks " if len(numbers) > 1 else "rank ") + ", ".join(map(str, numbers))

    numbers = [r.rank for r in traces]
    if None in numbers or len({(r.rank, r.source) for r in traces}) < len(traces):
        names = list(dict.fromkeys(Path(r.path).name for r in traces))
        if len(names) > OWNERS_LISTED:
            return ", ".join(names[: OWNERS_LISTED // 2]) + f", … ({len(names):,} traces)"
        return ", ".join(names)
    plain = sorted({r.rank for r in traces if r.source != Source.DETAILED})
    detailed = sorted({r.rank for r in traces if r.source == Source.DETAILED})
    if plain and plain == detailed:
        return f"{ranks(plain)} (timing and detailed traces)"
    parts = [ranks(plain)] if plain else []
    parts += [f"{ranks(detailed)} (detailed)"] if detailed else []
    return "; ".join(parts)


def _float(value: Any) -> float | None:
    value = float(value)
    return value if np.isfinite(value) else None


class SeveralRuns(ValueError):
    """A single-run accessor was used on a result holding several runs."""


@dataclass
class Result:
    """Everything `fsdp_trace.analyze(paths)` found: the runs behind the paths (each with its
    own cross-rank view and diagnosis), how the files were grouped into them, and notices.
    With one run, its tables and findings are reachable directly (`result.findings`)."""

    inputs: list[str]
    runs: list[RunAnalysis]
    grouping: str
    # Notices about the inputs as a whole (traces that failed, left out of every run);
    # `notices` adds the run's where there is one.
    input_notices: list[str] = field(default_factory=list)

    @property
    def notices(self) -> list[str]:
        """The notices to_json() puts at its top: the inputs', and with one run its own
        (`RunAnalysis.notices`); with several, each run holds its own."""
        mine = self.runs[0].notices if len(self.runs) == 1 else []
        return list(dict.fromkeys([*self.input_notices, *mine]))

    @property
    def only(self) -> RunAnalysis:
        """The one run (SeveralRuns when the inputs held several: use `result.runs`)."""
        if len(self.runs) != 1:
            raise SeveralRuns(
                f"{len(self.runs)} runs were analyzed ({', '.join(r.name for r in self.runs)}): "
                "pick one from result.runs"
            )
        return self.runs[0]

    ranks = property(lambda self: self.only.ranks, doc="The one run's timing/plain traces.")
    detailed = property(lambda self: self.only.detailed, doc="The one run's detailed traces.")
    run = property(lambda self: self.only.run, doc="The one run's run.json record, or None.")
    config = property(lambda self: self.only.config, doc="The one run's inferred config.")
    crossrank = property(lambda self: self.only.crossrank, doc="The one run's cross-rank view.")
    diagnosis = property(lambda self: self.only.diagnosis, doc="The one run's diagnosis.")
    findings = property(lambda self: self.only.findings, doc="The one run's findings.")
    steps = property(lambda self: self.only.steps, doc="The one run's steps table.")
    blocks = property(lambda self: self.only.blocks, doc="The one run's blocks table.")
    collectives = property(lambda self: self.only.collectives, doc="Its collectives table.")
    breakdown = property(lambda self: self.only.breakdown, doc="Its per-step breakdown.")
    hta = property(lambda self: self.only.hta, doc="The one run's HTA cross-check, or None.")

    def distortion(self) -> list[dict[str, Any]]:
        """The one run's profiler distortion per rank (RunAnalysis.distortion)."""
        return self.only.distortion()

    def to_json(self) -> dict[str, Any]:
        """Everything, JSON-ready (the CLI's --json). A shim for API users (README):
        `fsdp_trace.present.payload.to_json(result)`, the presentation layer's (the one
        import upward a record makes: ARCHITECTURE.md)."""
        from fsdp_trace.present.payload import to_json

        return to_json(self)
