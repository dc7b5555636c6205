"""The annotated Perfetto view: an analysis written as a protobuf TrackEvent trace.

Per rank, one process track ("rank R") holding
- the GPU streams, named by their role ("stream 7 (compute)"), with every kept GPU event;
- the CPU threads with their cpu_op / user_annotation slices (reloaded from the rank's trace);
- tracks fsdp-trace adds: "exposed communication" (one slice per interval of C \\ K),
  "FSDP collectives" (each NCCL collective named with what matters at a glance,
  "AG layers.3 bwd · 25.2 MB · 97 GB/s · 0.44 ms exposed", and every figure kept as arguments:
  block, phase, bytes, bandwidth, exposed time, ...), flow arrows from each all-gather to the
  first compute kernel of the block that consumes it, and the counter "exposed µs per step".

The file is ordered as trace processor reads it best: every track descriptor, then the interned
strings (event names, categories, argument names and string values, on the one packet
sequence), then every event in timestamp order across all tracks and ranks. Events are
serialized as they are made into a spill file beside the output, with only their timestamps
and offsets kept in memory, then copied out in timestamp order (a stable sort, so each track
keeps its begin/end order at equal timestamps). The output is a temporary file renamed at the
end: a failed or interrupted write leaves nothing behind.

A slice track must hold strictly nested slices; where the input's do not nest (kernels that
overlap on one stream, CPU ops cut by clock rounding, concurrent collectives), the slices that
do not fit go to extra lanes, sibling tracks named "<track> [2]", "[3]", ...
"""

from __future__ import annotations

import math
import mmap
import numbers
import tempfile
import time
from array import array
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pandas as pd
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import (
    TracePacket,
    TrackDescriptor,
    TrackEvent,
)

from fsdp_trace.analysis import classify
from fsdp_trace.analysis.loader import load_trace
from fsdp_trace.analysis.results import RankAnalysis
from fsdp_trace.atomic import atomic_open
from fsdp_trace.errors import UserError

SEQUENCE_ID = 1  # trusted_packet_sequence_id: one writer, one sequence
INTERNED_PER_PACKET = 10_000  # interned strings per packet (keeps each packet small)
PID_BASE = 1000  # synthetic pids (one per analyzed trace) and tids (globally unique)
TID_BASE = 100_000

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

_BEGIN = TrackEvent.TYPE_SLICE_BEGIN
_END = TrackEvent.TYPE_SLICE_END
_COUNTER = TrackEvent.TYPE_COUNTER
_CLEARED = TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
_NEEDS = TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
_EXPLICIT = TrackDescriptor.ChildTracksOrdering.Value("EXPLICIT")


# A Perfetto timestamp is an unsigned 64-bit ns count; kept below 2^63 so that it also fits
# the int64 arrays the writer sorts (the largest float64 below 2^63 that rint keeps there).
MAX_NS = float(2**63 - 1024)


def to_ns(us: np.ndarray | float) -> np.ndarray:
    """µs floats to integer ns: round(ts_us * 1000). A time Perfetto cannot hold (before 0,
    from 2^63 ns, not finite) is refused in one line, never cast to a wrapped integer."""
    values = np.asarray(us, dtype=np.float64)
    ns = values * 1000.0
    with np.errstate(invalid="ignore"):
        bad = ~((ns >= 0) & (ns <= MAX_NS))
    if bad.any():
        first = values[bad].flat[0]
        raise UserError(
            f"--perfetto: a time of {first:g} µs is outside what a Perfetto trace holds (0 to "
            "2^63 ns since its clock's origin): write the analysis without --perfetto"
        )
    return np.rint(ns).astype(np.int64)


def _frame(size: int) -> bytes:
    """Header of one `Trace.packet` entry: field 1, wire type 2, varint length."""
    out = bytearray(b"\x0a")
    while size > 0x7F:
        out.append((size & 0x7F) | 0x80)
        size >>= 7
    out.append(size)
    return bytes(out)


_SHORT_FRAMES = [_frame(n) for n in range(1 << 14)]


class _Writer:
    """Writes TracePackets: track descriptors straight to the output; events to a spill file,
    copied to the output in timestamp order by `finish`; strings interned per table, their
    definitions written once, between the descriptors and the events."""

    def __init__(self, handle: BinaryIO, spill: BinaryIO) -> None:
        self._out = handle
        self._spill = spill
        self._first = True
        self._next_uuid = 1
        self._next_flow = 1
        self._next_tid = TID_BASE
        self._names: dict[str, int] = {}
        self._categories: dict[str, int] = {}
        self._arg_names: dict[str, int] = {}
        self._strings: dict[str, int] = {}
        self._event_ts = array("q")  # per spilled event: timestamp, offset and size of its bytes
        self._event_offset = array("q")
        self._event_size = array("q")
        self._spilled = 0
        self.packets = 0
        self.tracks = 0
        self.flows = 0
        self.counters = 0

    # -- plumbing ---------------------------------------------------------------------------
    def _packet(self) -> TracePacket:
        packet = TracePacket()
        packet.trusted_packet_sequence_id = SEQUENCE_ID
        if self._first:
            packet.sequence_flags = _CLEARED
            packet.first_packet_on_sequence = True
            self._first = False
        return packet

    @staticmethod
    def _framed(packet: TracePacket) -> bytes:
        data = packet.SerializeToString()
        size = len(data)
        return (_SHORT_FRAMES[size] if size < 16384 else _frame(size)) + data

    def _emit(self, packet: TracePacket) -> None:
        """A packet for the output now (descriptors, interned data)."""
        self._out.write(self._framed(packet))
        self.packets += 1

    def _spill_event(self, ts: int, packet: TracePacket) -> None:
        """An event packet, copied to the output in timestamp order by `finish`."""
        data = self._framed(packet)
        self._spill.write(data)
        self._event_ts.append(ts)
        self._event_offset.append(self._spilled)
        self._event_size.append(len(data))
        self._spilled += len(data)

    def finish(self) -> None:
        """Write the interned strings, then every spilled event in timestamp order (stable:
        events of equal timestamp keep the order they were made in, so each track's begins and
        ends stay balanced)."""
        self._write_interned()
        self._spill.flush()
        if not self._event_ts:
            return
        ts = np.frombuffer(self._event_ts, dtype=np.int64)
        offsets = np.frombuffer(self._event_offset, dtype=np.int64)
        sizes = np.frombuffer(self._event_size, dtype=np.int64)
        order = np.argsort(ts, kind="stable")
        with mmap.mmap(self._spill.fileno(), 0, access=mmap.ACCESS_READ) as spilled:
            view = memoryview(spilled)
            write = self._out.write
            for start, size in zip(offsets[order].tolist(), sizes[order].tolist(), strict=True):
                write(view[start : start + size])
            view.release()
        self.packets += len(order)

    def _write_interned(self) -> None:
        tables = (
            ("event_names", self._names),
            ("event_categories", self._categories),
            ("debug_annotation_names", self._arg_names),
            ("debug_annotation_string_values", self._strings),
        )
        entries = [(field, iid, value) for field, table in tables for value, iid in table.items()]
        for chunk in range(0, len(entries), INTERNED_PER_PACKET):
            packet = self._packet()
            for field, iid, value in entries[chunk : chunk + INTERNED_PER_PACKET]:
                entry = getattr(packet.interned_data, field).add()
                entry.iid = iid
                if field == "debug_annotation_string_values":
                    entry.str = value.encode()
                else:
                    entry.name = value
            self._emit(packet)

    def new_tid(self) -> int:
        self._next_tid += 1
        return self._next_tid

    def new_flow(self) -> int:
        self._next_flow += 1
        self.flows += 1
        return self._next_flow

    # -- tracks -----------------------------------------------------------------------------
    def track(
        self,
        name: str,
        *,
        parent: int | None = None,
        pid: int | None = None,
        tid: int | None = None,
        counter_unit: str | None = None,
        order: int | None = None,
        explicit_children: bool = False,
    ) -> int:
        """Declare a track (process when pid alone, thread with tid, counter, or plain)."""
        uuid = self._next_uuid
        self._next_uuid += 1
        packet = self._packet()
        d = packet.track_descriptor
        d.uuid = uuid
        d.name = name
        if parent is not None:
            d.parent_uuid = parent
        if pid is not None and tid is None:
            d.process.pid = pid
            d.process.process_name = name
        elif tid is not None:
            d.thread.pid = pid or 0
            d.thread.tid = tid
            d.thread.thread_name = name
        if counter_unit is not None:
            d.counter.unit_name = counter_unit
        if order is not None:
            d.sibling_order_rank = order
        if explicit_children:
            d.child_ordering = _EXPLICIT
        self._emit(packet)
        self.tracks += 1
        return uuid

    # -- events -----------------------------------------------------------------------------
    @staticmethod
    def _intern(table: dict[str, int], value: str) -> int:
        """The iid of `value` in `table`, a new one on first use (defined by `finish`)."""
        iid = table.get(value)
        if iid is None:
            iid = table[value] = len(table) + 1
        return iid

    def begin(
        self,
        ts: int,
        track: int,
        name: str,
        category: str,
        args: Iterable[tuple[str, Any]] = (),
        flows: Sequence[int] = (),
        terminating: Sequence[int] = (),
    ) -> None:
        """Open a slice; `args` become debug annotations (None / NaN values are left out)."""
        packet = self._packet()
        packet.timestamp = ts
        packet.sequence_flags |= _NEEDS
        e = packet.track_event
        e.type = _BEGIN
        e.track_uuid = track
        intern = self._intern
        e.name_iid = intern(self._names, name)
        e.category_iids.append(intern(self._categories, category))
        if args:
            arg_names, strings, add = self._arg_names, self._strings, e.debug_annotations.add
            for key, value in args:
                if value is None or value != value:  # None, NaN
                    continue
                a = add()
                a.name_iid = intern(arg_names, key)
                kind = type(value)
                if kind is str:
                    a.string_value_iid = intern(strings, value)
                elif kind is int:
                    a.int_value = value
                elif kind is float:
                    a.double_value = value
                elif kind is bool or isinstance(value, np.bool_):
                    a.bool_value = bool(value)
                elif isinstance(value, numbers.Integral):
                    a.int_value = int(value)
                elif isinstance(value, numbers.Real):
                    a.double_value = float(value)
                else:
                    a.string_value_iid = intern(strings, str(value))
        if flows:
            e.flow_ids.extend(flows)
        if terminating:
            e.terminating_flow_ids.extend(terminating)
        self._spill_event(ts, packet)

    def end(self, ts: int, track: int) -> None:
        packet = self._packet()
        packet.timestamp = ts
        e = packet.track_event
        e.type = _END
        e.track_uuid = track
        self._spill_event(ts, packet)

    def counter(self, ts: int, track: int, value: float) -> None:
        packet = self._packet()
        packet.timestamp = ts
        e = packet.track_event
        e.type = _COUNTER
        e.track_uuid = track
        e.double_counter_value = value
        self._spill_event(ts, packet)
        self.counters += 1


class _Lanes:
    """One logical slice track, split into lanes so that each lane's slices nest strictly.

    Feed slices in (start ascending, end descending) order; `place` closes what ended on the
    lane it tries, and returns the lane track the slice must open on. Lane 0 is declared by the
    caller (a thread track, say); later lanes are plain tracks declared on first use."""

    def __init__(self, writer: _Writer, name: str, parent: int, order: int, first: int) -> None:
        self.writer = writer
        self.name = name
        self.parent = parent
        self.order = order
        self.uuids = [first]
        self.stacks: list[list[int]] = [[]]

    def place(self, ts: int, end: int) -> int:
        for uuid, stack in zip(self.uuids, self.stacks, strict=True):
            while stack and stack[-1] <= ts:
                self.writer.end(stack.pop(), uuid)
            if not stack or end <= stack[-1]:
                stack.append(end)
                return uuid
        k = len(self.uuids)
        uuid = self.writer.track(f"{self.name} [{k + 1}]", parent=self.parent, order=self.order + k)
        self.uuids.append(uuid)
        self.stacks.append([end])
        return uuid

    def close(self) -> None:
        for uuid, stack in zip(self.uuids, self.stacks, strict=True):
            while stack:
                self.writer.end(stack.pop(), uuid)

    @property
    def extra(self) -> int:
        return len(self.uuids) - 1


def _slice_order(ts: np.ndarray, end: np.ndarray, *groups: np.ndarray) -> np.ndarray:
    """Row order by group(s), then start ascending, then end descending (parents first)."""
    return np.lexsort((-end, ts, *reversed(groups)))


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


def _num(value: Any) -> Any:
    """An integer-valued float as int (bytes), NaN / None left as is (dropped later)."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


class _RankWriter:
    """Everything of one RankAnalysis under one process track."""

    def __init__(self, writer: _Writer, rank: RankAnalysis, index: int, cache: bool = True) -> None:
        self.w = writer
        self.rank = rank
        self.cache = cache  # the CPU threads re-read the trace (from the cache when allowed)
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
        kernel_flows, collective_flows = self._flows()
        self._exposed(exposed_track)
        self._collectives(collective_track, collective_flows)
        self._counter(counter_track)
        self._kernels(kernel_flows)
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
        coll, kernels = self.rank.collectives, self.rank.kernels
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
        lanes = _Lanes(self.w, EXPOSED_TRACK, self.process, 0, track)
        s_us = exposed["start_us"].to_numpy(dtype=np.float64)
        e_us = exposed["end_us"].to_numpy(dtype=np.float64)
        starts, ends = to_ns(s_us), to_ns(e_us)
        order = _slice_order(starts, ends)
        names = [
            _label(c, b, p)
            for c, b, p in zip(coll["collective"], coll["block"], coll["phase"], strict=True)
        ]
        labels = [" + ".join(names[j] for j in rows) for rows in self.rank.exposed_collectives()]
        steps = exposed["step"].to_numpy().tolist() if "step" in exposed else [None] * len(s_us)
        dur = (e_us - s_us).tolist()
        for i in order.tolist():
            ts, end = int(starts[i]), int(ends[i])
            uuid = lanes.place(ts, end)
            name = f"exposed {labels[i]}" if labels[i] else "exposed"
            args = (("step", steps[i]), ("dur_us", dur[i]), ("collectives", labels[i] or None))
            self.w.begin(ts, uuid, name, CAT_EXPOSED, args)
        lanes.close()
        self.counts["exposed"] += len(order)
        self.lanes += lanes.extra

    def _collectives(self, track: int, flows: dict[int, int]) -> None:
        coll = self.rank.collectives
        if coll.empty:
            return
        lanes = _Lanes(self.w, COLLECTIVE_TRACK, self.process, 1_000, track)
        starts = to_ns(coll["start_us"].to_numpy(dtype=np.float64))
        ends = to_ns(coll["end_us"].to_numpy(dtype=np.float64))
        columns = {
            name: coll[name].tolist()
            for name in (
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
        }
        arg_names = {"algbw_gbps": "algbw_GBps", "busbw_gbps": "busbw_GBps"}
        for i in _slice_order(starts, ends).tolist():
            ts, end = int(starts[i]), int(ends[i])
            uuid = lanes.place(ts, end)
            name = collective_name(
                columns["collective"][i],
                columns["block"][i],
                columns["phase"][i],
                columns["bytes"][i],
                columns["busbw_gbps"][i],
                columns["exposed_us"][i],
            )
            args = [(arg_names.get(key, key), _num(values[i])) for key, values in columns.items()]
            flow = flows.get(i)
            self.w.begin(ts, uuid, name, CAT_COLLECTIVE, args, flows=(flow,) if flow else ())
        lanes.close()
        self.counts["collective"] += len(coll)
        self.lanes += lanes.extra

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
        kernels = self.rank.kernels
        if kernels.empty:
            return
        device = kernels["device"].to_numpy(dtype=np.int64)
        stream = kernels["stream"].to_numpy(dtype=np.int64)
        starts = to_ns(kernels["ts"].to_numpy(dtype=np.float64))
        ends = to_ns(kernels["end"].to_numpy(dtype=np.float64))
        names = kernels["name"].astype(str).tolist()
        kinds = kernels["kind"].tolist()
        columns = {
            name: kernels[name].tolist()
            for name in ("kind", "step", "block", "phase", "correlation")
            if name in kernels
        }
        several_devices = np.unique(device).size > 1
        pairs = sorted(
            {(int(d), int(s)) for d, s in zip(device.tolist(), stream.tolist(), strict=True)},
            key=lambda p: self._stream_key(p[1], p[0]),
        )
        order = _slice_order(starts, ends, device, stream)
        bounds = np.flatnonzero(
            np.diff(device[order]) | np.diff(stream[order])
        ).tolist()  # group edges
        groups = np.split(order, [b + 1 for b in bounds])
        by_pair = {(int(device[g[0]]), int(stream[g[0]])): g for g in groups}
        for rank_in_process, (dev, sid) in enumerate(pairs):
            role = self.rank.streams.get(sid)
            name = f"stream {sid}" + (f" ({role})" if role else "")
            if several_devices:
                name = f"GPU {dev} {name}"
            order_rank = 10_000 + 100 * rank_in_process
            uuid0 = self.w.track(
                name, parent=self.process, pid=self.pid, tid=self.w.new_tid(), order=order_rank
            )
            lanes = _Lanes(self.w, name, self.process, order_rank, uuid0)
            for i in by_pair[(dev, sid)].tolist():
                ts, end = int(starts[i]), int(ends[i])
                uuid = lanes.place(ts, end)
                args = [(key, values[i]) for key, values in columns.items()]
                self.w.begin(
                    ts,
                    uuid,
                    names[i],
                    CAT_KERNEL.get(kinds[i], "kernel"),
                    args,
                    terminating=flows.get(i, ()),
                )
            lanes.close()
            self.lanes += lanes.extra
        self.counts["gpu"] += len(kernels)

    def _stream_key(self, stream: int, device: int) -> tuple[int, int, int]:
        role = self.rank.streams.get(stream, "")
        rank = STREAM_ORDER.get(role, 2 if "NCCL" in role or role == "communication" else 3)
        return (device, rank, stream)

    # -- CPU threads ------------------------------------------------------------------------
    def _cpu_threads(self) -> None:
        trace = load_trace(self.rank.path, cache=self.cache)
        events = trace.events
        kinds = classify.event_kinds(events)
        rows = np.flatnonzero((kinds == classify.CPU_OP) | (kinds == classify.ANNOTATION))
        if rows.size == 0:
            return
        pid = events["pid"].to_numpy()[rows]
        tid = events["tid"].to_numpy()[rows]
        starts = to_ns(events["ts"].to_numpy()[rows])
        ends = to_ns(events["end"].to_numpy()[rows])
        names = events["name"].array
        categories = [str(c) for c in names.categories]
        codes = names.codes[rows]
        cats = [CAT_CPU[k] for k in kinds[rows].tolist()]
        thread_names = trace.thread_names
        del trace, events, names, kinds
        order = _slice_order(starts, ends, pid, tid)
        edges = np.flatnonzero(np.diff(pid[order]) | np.diff(tid[order])) + 1
        groups = sorted(np.split(order, edges), key=lambda g: (int(starts[g[0]]), int(tid[g[0]])))
        code_list = codes.tolist()
        for position, group in enumerate(groups):
            key = (int(pid[group[0]]), int(tid[group[0]]))
            name = thread_names.get(key) or f"thread {key[1]}"
            order_rank = 100_000 + 100 * position
            uuid0 = self.w.track(
                name, parent=self.process, pid=self.pid, tid=self.w.new_tid(), order=order_rank
            )
            lanes = _Lanes(self.w, name, self.process, order_rank, uuid0)
            for i in group.tolist():
                ts, end = int(starts[i]), int(ends[i])
                uuid = lanes.place(ts, end)
                code = code_list[i]
                self.w.begin(ts, uuid, categories[code] if code >= 0 else "", cats[i])
            lanes.close()
            self.lanes += lanes.extra
        self.counts["cpu"] += int(rows.size)


def write_perfetto(
    analysis: Any,
    path: Path,
    *,
    include_detailed: bool = False,
    cpu: bool = True,
    cache: bool = True,
) -> dict[str, Any]:
    """Write `analysis` (a `Result`, or one `RunAnalysis`) as an annotated Perfetto trace at
    `path` (atomically: a temporary file in the same folder, renamed at the end). Returns
    counts of what was written: tracks, slices per kind (gpu, cpu, collective, exposed),
    flows, counter values, per rank."""
    path = Path(path)
    runs = analysis.runs if hasattr(analysis, "runs") else [analysis]
    items = [
        r
        for run in runs
        for r in list(run.ranks) + (list(run.detailed) if include_detailed else [])
    ]
    if not items:
        raise UserError("nothing to write to the Perfetto trace: the analysis holds no trace")
    started = time.perf_counter()
    per_rank = []
    with (
        atomic_open(path, "wb", buffering=1 << 20) as handle,
        tempfile.TemporaryFile(prefix=f".{path.name}.", suffix=".spill", dir=path.parent) as spill,
    ):
        writer = _Writer(handle, spill)
        for index, rank in enumerate(items):
            per_rank.append(_RankWriter(writer, rank, index, cache).write(cpu=cpu))
        writer.finish()
    slices: dict[str, int] = {}
    for item in per_rank:
        for kind, count in item["slices"].items():
            if kind != "counter":
                slices[kind] = slices.get(kind, 0) + count
    return {
        "path": str(path),
        "bytes": path.stat().st_size,
        "ranks": len(per_rank),
        "tracks": writer.tracks,
        "lanes": sum(item["lanes"] for item in per_rank),
        "slices": slices,
        "flows": writer.flows,
        "counters": writer.counters,
        "packets": writer.packets,
        "seconds": time.perf_counter() - started,
        "per_rank": per_rank,
    }
