"""What each rank's tracks hold (`RankWriter`): GPU streams, CPU threads, the exposed
communication, the FSDP collectives named at a glance (`collective_name`), flows from each
all-gather to its consumer, the exposed-µs counter; the names and categories they use."""

from __future__ import annotations

import math
import numbers
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fsdp_trace.analysis import classify
from fsdp_trace.analysis.rank.analyze import CpuSlices
from fsdp_trace.analysis.read.loader import load_trace
from fsdp_trace.analysis.results import RankAnalysis
from fsdp_trace.render.perfetto.file import Writer, assign_lanes, nesting_sequence
from fsdp_trace.render.perfetto.wire import PID_BASE, Arg, to_ns

# Categories of the slices written (tests and UI queries select by them).
CAT_KERNEL = {"compute": "kernel", "comm": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset"}
CAT_CPU = {classify.CPU_OP: "cpu_op", classify.ANNOTATION: "user_annotation"}
CAT_COLLECTIVE = "fsdp_trace.collective"
CAT_EXPOSED = "fsdp_trace.exposed"

EXPOSED_TRACK = "exposed communication"
COLLECTIVE_TRACK = "FSDP collectives"
COUNTER_TRACK = "exposed µs per step"

SHORT = {
    "AllGather": "AG",
    "ReduceScatter": "RS",
    "AllReduce": "AR",
    "Broadcast": "BC",
    "Reduce": "RD",
    "AllToAll": "A2A",
    "SendRecv": "P2P",
}
# The compute that consumes an all-gather of a given phase. Under activation checkpointing the
# backward all-gather is first used by the block's recomputation.
CONSUMER_PHASES = {
    "forward": ("forward",),
    "backward": ("backward", "recompute"),
    "recompute": ("recompute", "backward"),
}
STREAM_ORDER = {"compute": 0, "compute (side)": 1}  # then NCCL streams, then copy streams
# Arguments of the collective slices, in this order (algbw/busbw named with GBps).
COLLECTIVE_ARGS = (
    "collective",
    "block",
    "phase",
    "step",
    "issued_by",
    "prefetched",
    "bytes",
    "dur_us",
    "exposed_us",
    "algbw_gbps",
    "busbw_gbps",
    "group_size",
    "dtype",
    "stream",
    "kernel",
)


PHASE_SHORT = {"forward": "fwd", "backward": "bwd", "recompute": "recompute", "optimizer": "opt"}


def _label(collective: str, block: Any, phase: Any) -> str:
    """'AG layers.3 bwd': collective, unit and phase."""
    return f"{SHORT.get(collective, collective)} {block} {PHASE_SHORT.get(phase, phase)}"


def _finite(value: Any) -> bool:
    return isinstance(value, numbers.Real) and math.isfinite(value)


def _duration(us: float) -> str:
    return f"{us / 1e3:.2f} ms" if us >= 100 else f"{us:.0f} µs"


def collective_name(
    collective: str, block: Any, phase: Any, nbytes: Any, busbw_gbps: Any, exposed_us: Any
) -> str:
    """What a collective slice shows on the timeline without clicking it:
    'AG layers.0 fwd · 25.2 MB · 97 GB/s · 0.44 ms exposed' (bus bandwidth; 'hidden' when no
    part of it is exposed; parts left out where unknown, e.g. exposure on CPU traces)."""
    parts = [_label(collective, block, phase)]
    if _finite(nbytes) and nbytes > 0:
        parts.append(f"{nbytes / 1e6:,.1f} MB")
    if _finite(busbw_gbps):
        parts.append(f"{busbw_gbps:,.0f} GB/s" if busbw_gbps >= 10 else f"{busbw_gbps:.1f} GB/s")
    if _finite(exposed_us):
        parts.append(f"{_duration(exposed_us)} exposed" if exposed_us > 0.05 else "hidden")
    return " · ".join(parts)


class RankWriter:
    """Everything of one RankAnalysis under one process track."""

    def __init__(self, writer: Writer, rank: RankAnalysis, index: int, cache: bool = True) -> None:
        self.w = writer
        self.rank = rank
        self.cache = cache  # kernels and CPU threads are read again (the cache when allowed)
        self.kernels = pd.DataFrame()  # the rank's, while it is written
        self.pid = PID_BASE + index
        self.process = 0  # the process track's uuid, once declared
        self.counts = {"gpu": 0, "cpu": 0, "collective": 0, "exposed": 0, "counter": 0}
        self.lanes = 0
        self.flows = 0

    @property
    def title(self) -> str:
        r = self.rank
        title = f"rank {r.rank}" if r.rank is not None else Path(r.path).name
        return f"{title} ({r.source})" if r.source == "detailed" else title

    def write(self, cpu: bool = True) -> dict[str, Any]:
        w = self.w
        self.process = w.track(self.title, pid=self.pid, explicit_children=True)
        exposed_track = w.track(EXPOSED_TRACK, parent=self.process, order=0)
        collective_track = w.track(COLLECTIVE_TRACK, parent=self.process, order=1_000)
        counter_track = w.track(COUNTER_TRACK, parent=self.process, counter_unit="µs", order=2_000)
        self.kernels = self.rank.load_kernels(cache=None if self.cache else False)
        kernel_flows, collective_flows = self._flows()
        self._exposed(exposed_track)
        self._collectives(collective_track, collective_flows)
        self._counter(counter_track)
        self._kernels(kernel_flows)
        self.kernels = pd.DataFrame()
        if cpu:
            self._cpu_threads()
        return {
            "rank": self.rank.rank,
            "source": self.rank.source,
            "title": self.title,
            "slices": dict(self.counts),
            "flows": self.flows,
            "lanes": self.lanes,
        }

    # -- flows ------------------------------------------------------------------------------
    def _flows(self) -> tuple[dict[int, list[int]], dict[int, int]]:
        """Flow ids: all-gather (row of `collectives`) → first compute kernel (row of
        `kernels`) of the same block and a consuming phase starting at or after it."""
        coll, kernels = self.rank.collectives, self.kernels
        kernel_flows: dict[int, list[int]] = {}
        collective_flows: dict[int, int] = {}
        if coll.empty or kernels.empty:
            return kernel_flows, collective_flows
        compute = np.flatnonzero(
            (kernels["kind"].to_numpy() == "compute") & kernels["block"].notna().to_numpy()
        )
        if compute.size == 0:
            return kernel_flows, collective_flows
        k_ts = kernels["ts"].to_numpy(dtype=np.float64)[compute]
        groups = (
            pd.DataFrame(
                {
                    "block": kernels["block"].to_numpy()[compute],
                    "phase": kernels["phase"].to_numpy()[compute],
                }
            )
            .groupby(["block", "phase"], sort=False)
            .indices
        )
        by_key: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}
        for key, positions in groups.items():
            order = positions[np.argsort(k_ts[positions], kind="stable")]
            by_key[key] = (k_ts[order], compute[order])
        ag = np.flatnonzero(coll["collective"].to_numpy() == "AllGather")
        starts = coll["start_us"].to_numpy(dtype=np.float64)[ag].tolist()
        blocks = coll["block"].to_numpy()[ag].tolist()
        phases = coll["phase"].to_numpy()[ag].tolist()
        for row, start, block, phase in zip(ag.tolist(), starts, blocks, phases, strict=True):
            best_ts, best_row = math.inf, -1
            for consumer in CONSUMER_PHASES.get(phase, (phase,)):
                found = by_key.get((block, consumer))
                if found is None:
                    continue
                ts, rows = found
                j = int(np.searchsorted(ts, start, side="left"))
                if j < ts.size and ts[j] < best_ts:
                    best_ts, best_row = float(ts[j]), int(rows[j])
            if best_row >= 0:
                flow = self.w.new_flow()
                collective_flows[row] = flow
                kernel_flows.setdefault(best_row, []).append(flow)
                self.flows += 1
        return kernel_flows, collective_flows

    # -- tool tracks ------------------------------------------------------------------------
    def _exposed(self, track: int) -> None:
        exposed, coll = self.rank.exposed, self.rank.collectives
        if exposed.empty:
            return
        s_us = exposed["start_us"].to_numpy(dtype=np.float64)
        e_us = exposed["end_us"].to_numpy(dtype=np.float64)
        starts, ends = to_ns(s_us), to_ns(e_us)
        names = [
            _label(c, b, p)
            for c, b, p in zip(coll["collective"], coll["block"], coll["phase"], strict=True)
        ]
        labels = [" + ".join(names[j] for j in rows) for rows in self.rank.exposed_collectives()]
        n = len(exposed)
        steps = exposed["step"] if "step" in exposed else np.full(n, None, dtype=object)
        args = [
            (self.w.arg_name("step"), Arg(self.w, steps)),
            (self.w.arg_name("dur_us"), Arg(self.w, e_us - s_us)),
            (self.w.arg_name("collectives"), Arg(self.w, [x or None for x in labels])),
        ]
        titles = [f"exposed {x}" if x else "exposed" for x in labels]
        tracks = np.zeros(n, dtype=np.int64)
        rows = np.arange(n)
        sequence = self._lanes(track, EXPOSED_TRACK, 0, rows, starts, ends, tracks)
        category = np.full(n, self.w.category_iid(CAT_EXPOSED), dtype=np.int64)
        self.w.slices(
            starts, ends, tracks, self.w.name_iids(pd.Series(titles)), category, sequence, args
        )
        self.counts["exposed"] += n

    def _collectives(self, track: int, flows: dict[int, int]) -> None:
        coll = self.rank.collectives
        if coll.empty:
            return
        n = len(coll)
        starts = to_ns(coll["start_us"].to_numpy(dtype=np.float64))
        ends = to_ns(coll["end_us"].to_numpy(dtype=np.float64))
        names = [
            collective_name(c, b, p, nbytes, bw, exposed)
            for c, b, p, nbytes, bw, exposed in zip(
                coll["collective"].tolist(),
                coll["block"].tolist(),
                coll["phase"].tolist(),
                coll["bytes"].tolist(),
                coll["busbw_gbps"].tolist(),
                coll["exposed_us"].tolist(),
                strict=True,
            )
        ]
        arg_names = {"algbw_gbps": "algbw_GBps", "busbw_gbps": "busbw_GBps"}
        args = [
            (self.w.arg_name(arg_names.get(key, key)), Arg(self.w, coll[key], integral=True))
            for key in COLLECTIVE_ARGS
        ]
        flow_ids = np.zeros(n, dtype=np.int64)
        for row, flow in flows.items():
            flow_ids[row] = flow
        tracks = np.zeros(n, dtype=np.int64)
        sequence = self._lanes(track, COLLECTIVE_TRACK, 1_000, np.arange(n), starts, ends, tracks)
        category = np.full(n, self.w.category_iid(CAT_COLLECTIVE), dtype=np.int64)
        self.w.slices(
            starts,
            ends,
            tracks,
            self.w.name_iids(pd.Series(names)),
            category,
            sequence,
            args,
            flows=[flow_ids],
        )
        self.counts["collective"] += n

    def _counter(self, track: int) -> None:
        steps = self.rank.steps
        if steps.empty:
            return
        starts = to_ns(steps["start_us"].to_numpy(dtype=np.float64)).tolist()
        values = steps["exposed_us"].to_numpy(dtype=np.float64).tolist()
        for ts, value in sorted(zip(starts, values, strict=True)):
            if math.isfinite(value):
                self.w.counter(ts, track, value)
                self.counts["counter"] += 1

    # -- GPU streams ------------------------------------------------------------------------
    def _kernels(self, flows: dict[int, list[int]]) -> None:
        kernels = self.kernels
        if kernels.empty:
            return
        device = kernels["device"].to_numpy(dtype=np.int64)
        stream = kernels["stream"].to_numpy(dtype=np.int64)
        starts = to_ns(kernels["ts"].to_numpy(dtype=np.float64))
        ends = to_ns(kernels["end"].to_numpy(dtype=np.float64))
        names = self.w.name_iids(kernels["name"].astype(str))
        kinds = kernels["kind"].astype(object).to_numpy()
        categories = self.w.category_iids(
            np.array([CAT_KERNEL.get(k, "kernel") for k in kinds.tolist()], dtype=object)
        )
        args = [
            (self.w.arg_name(name), Arg(self.w, kernels[name]))
            for name in ("kind", "step", "block", "phase", "correlation")
            if name in kernels
        ]
        most = max((len(f) for f in flows.values()), default=0)
        terminating = [np.zeros(len(kernels), dtype=np.int64) for _ in range(most)]
        for row, ids in flows.items():
            for k, flow in enumerate(ids):
                terminating[k][row] = flow
        several_devices = np.unique(device).size > 1
        pairs = sorted(
            {(int(d), int(s)) for d, s in zip(device.tolist(), stream.tolist(), strict=True)},
            key=lambda p: self._stream_key(p[1], p[0]),
        )
        order = np.lexsort((stream, device))
        bounds = np.flatnonzero(np.diff(device[order]) | np.diff(stream[order])) + 1
        by_pair = {(int(device[g[0]]), int(stream[g[0]])): g for g in np.split(order, bounds)}
        tracks = np.zeros(len(kernels), dtype=np.int64)
        sequences = []
        for rank_in_process, (dev, sid) in enumerate(pairs):
            role = self.rank.streams.get(sid)
            name = f"stream {sid}" + (f" ({role})" if role else "")
            if several_devices:
                name = f"GPU {dev} {name}"
            rows = by_pair[(dev, sid)]
            sequences.append(
                self._thread(name, 10_000 + 100 * rank_in_process, rows, starts, ends, tracks)
            )
        rows, is_end = (np.concatenate(parts) for parts in zip(*sequences, strict=True))
        self.w.slices(starts, ends, tracks, names, categories, (rows, is_end), args, terminating)
        self.counts["gpu"] += len(kernels)

    def _thread(
        self,
        name: str,
        order_rank: int,
        rows: np.ndarray,
        starts: np.ndarray,
        ends: np.ndarray,
        tracks: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Declare a thread track for the slices at `rows` (and more lanes where they do not
        nest), set each one's track in `tracks`; returns the order of their events (rows)."""
        uuid0 = self.w.track(
            name, parent=self.process, pid=self.pid, tid=self.w.new_tid(), order=order_rank
        )
        return self._lanes(uuid0, name, order_rank, rows, starts, ends, tracks)

    def _lanes(
        self,
        uuid0: int,
        name: str,
        order_rank: int,
        rows: np.ndarray,
        starts: np.ndarray,
        ends: np.ndarray,
        tracks: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The slices at `rows` on track `uuid0`, and on more lanes ("NAME [2]", ...) where
        they do not nest; sets each one's track in `tracks`; returns the order of their events
        (rows, is_end)."""
        ts, end = starts[rows], ends[rows]
        lane = np.zeros(rows.size, dtype=np.int64)
        sequence = nesting_sequence(ts, end, lane)
        if sequence is None:
            lane = assign_lanes(ts, end)
            sequence = nesting_sequence(ts, end, lane)
            assert sequence is not None, "lanes always nest"
        uuids = [uuid0]
        for k in range(1, int(lane.max()) + 1):
            uuids.append(
                self.w.track(f"{name} [{k + 1}]", parent=self.process, order=order_rank + k)
            )
        tracks[rows] = np.array(uuids, dtype=np.int64)[lane]
        self.lanes += len(uuids) - 1
        local, is_end = sequence
        return rows[local], is_end

    def _stream_key(self, stream: int, device: int) -> tuple[int, int, int]:
        role = self.rank.streams.get(stream, "")
        rank = STREAM_ORDER.get(role, 2 if "NCCL" in role or role == "communication" else 3)
        return (device, rank, stream)

    # -- CPU threads ------------------------------------------------------------------------
    def _cpu_slices(self) -> CpuSlices:
        """The rank's CPU slices: kept by its analysis (`rank.keeping_cpu_slices`), else read
        from its trace again (through the cache when allowed)."""
        kept = self.rank.cpu_slices
        if kept is not None:
            return kept
        trace = load_trace(self.rank.path, cache=self.cache)
        return CpuSlices.of(trace, classify.event_kinds(trace.events))

    def _cpu_threads(self) -> None:
        cpu = self._cpu_slices()
        n = cpu.ts.size
        if n == 0:
            return
        pid, tid = cpu.pid, cpu.tid
        starts, ends = to_ns(cpu.ts), to_ns(cpu.end)
        names = self.w.name_iids(pd.Categorical.from_codes(cpu.name, cpu.names, validate=False))
        category = np.array(
            [self.w.category_iid(CAT_CPU[k]) for k in (classify.CPU_OP, classify.ANNOTATION)]
        )
        categories = category[(cpu.kind == classify.ANNOTATION).astype(np.int64)]
        order = np.lexsort((tid, pid))
        edges = np.flatnonzero(np.diff(pid[order]) | np.diff(tid[order])) + 1
        groups = sorted(
            np.split(order, edges),
            key=lambda g: (int(starts[g].min()), int(tid[g[0]])),
        )
        tracks = np.zeros(n, dtype=np.int64)
        sequences = []
        for position, group in enumerate(groups):
            key = (int(pid[group[0]]), int(tid[group[0]]))
            name = cpu.thread_names.get(key) or f"thread {key[1]}"
            order_rank = 100_000 + 100 * position
            sequences.append(self._thread(name, order_rank, group, starts, ends, tracks))
        rows, is_end = (np.concatenate(parts) for parts in zip(*sequences, strict=True))
        self.w.slices(starts, ends, tracks, names, categories, (rows, is_end))
        self.counts["cpu"] += n
