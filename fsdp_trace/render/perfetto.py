"""The annotated Perfetto view: an analysis written as a protobuf TrackEvent trace.

Per rank, one process track ("rank R") holding
- the GPU streams, named by their role ("stream 7 (compute)"), with every kept GPU event
  (read again: a run does not hold its ranks' kernels, `RankAnalysis.load_kernels`);
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
from collections.abc import Sequence
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
from fsdp_trace.analysis.rank.analyze import CpuSlices
from fsdp_trace.analysis.read.loader import load_trace
from fsdp_trace.analysis.results import RankAnalysis
from fsdp_trace.atomic import atomic_open
from fsdp_trace.errors import UserError

SEQUENCE_ID = 1  # trusted_packet_sequence_id: one writer, one sequence
INTERNED_PER_PACKET = 10_000  # interned strings per packet (keeps each packet small)
_COPY_EVENTS = 1 << 17  # events copied to the output at a time (bounds the gather's memory)
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

_BEGIN = TrackEvent.TYPE_SLICE_BEGIN
_END = TrackEvent.TYPE_SLICE_END
_COUNTER = TrackEvent.TYPE_COUNTER
_CLEARED = TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
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

# -- bulk encoding ---------------------------------------------------------------------------
# Most packets (every CPU and GPU slice's begin and end) are encoded many at a time with numpy,
# in the wire format protobuf itself writes (fields in number order, unpacked repeated fields;
# tests decode them with perfetto's protos). Tags of the fields written that way:
_TAG_TIMESTAMP = b"\x40"  # TracePacket.timestamp = 8, varint
_SEQUENCE = bytes([0x50, SEQUENCE_ID])  # TracePacket.trusted_packet_sequence_id = 10
_TAG_TRACK_EVENT = b"\x5a"  # TracePacket.track_event = 11, length-delimited
_NEEDS_FLAGS = bytes([0x68, TracePacket.SEQ_NEEDS_INCREMENTAL_STATE])  # sequence_flags = 13
_TAG_CATEGORY = b"\x18"  # TrackEvent.category_iids = 3
_TAG_ANNOTATION = b"\x22"  # TrackEvent.debug_annotations = 4
_BEGIN_TYPE = bytes([0x48, _BEGIN])  # TrackEvent.type = 9
_END_TYPE = bytes([0x48, _END])
_TAG_NAME = b"\x50"  # TrackEvent.name_iid = 10
_TAG_TRACK = b"\x58"  # TrackEvent.track_uuid = 11
_TAG_FLOW = b"\xf9\x02"  # TrackEvent.flow_ids = 47, fixed64
_TAG_TERMINATING = b"\x81\x03"  # TrackEvent.terminating_flow_ids = 48, fixed64
_TAG_ARG_NAME = b"\x08"  # DebugAnnotation.name_iid = 1
_TAG_ARG_BOOL = b"\x10"  # bool_value = 2
_TAG_ARG_INT = b"\x20"  # int_value = 4 (int64: negative values take 10 bytes)
_TAG_ARG_DOUBLE = b"\x29"  # double_value = 5, fixed64
_TAG_ARG_STRING = b"\x88\x01"  # string_value_iid = 17
_VARINT_STEPS = np.array([1 << (7 * k) for k in range(1, 10)], dtype=np.uint64)
_SHIFTS = np.arange(0, 70, 7, dtype=np.uint64)


def _varint_len(values: np.ndarray) -> np.ndarray | int:
    """Bytes of each value's varint (uint64 view: negative int64 take 10); one int when they
    all take the same."""
    if not values.size:
        return 1
    low, high = values.min(), values.max()
    steps = _VARINT_STEPS[high >= _VARINT_STEPS]
    if not steps.size or steps[-1] <= low:  # one length for all
        return int(steps.size) + 1
    out = np.ones(values.size, dtype=np.int8)
    for step in steps:
        out += values >= step
    return out


class _Bulk:
    """N protobuf messages of one layout, encoded at once: a list of parts (a field's tag and
    value, or constant bytes), each present in all messages or in those of a mask.

    Encoding flattens the parts (nested messages included) into atoms: constant bytes, a
    varint, 8 fixed bytes. Messages whose atoms all have the same byte lengths form a group;
    a group is one 2-D byte array, filled a column at a time (no per-message work)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.parts: list[tuple[str, bytes, Any, np.ndarray | None]] = []

    def const(self, data: bytes, present: np.ndarray | None = None) -> None:
        self.parts.append(("const", data, None, present))

    def varint(self, tag: bytes, values: np.ndarray, present: np.ndarray | None = None) -> None:
        values = np.asarray(values).astype(np.int64, copy=False).view(np.uint64)
        self.parts.append(("varint", tag, values, present))

    def fixed64(self, tag: bytes, values: np.ndarray, present: np.ndarray | None = None) -> None:
        """8 little-endian bytes: a double's, or an unsigned integer's (fixed64)."""
        self.parts.append(("fixed64", tag, np.ascontiguousarray(values).view(np.uint64), present))

    def message(self, tag: bytes, inner: _Bulk, present: np.ndarray | None = None) -> None:
        """A length-delimited field holding `inner`'s message (one per message of this)."""
        self.parts.append(("message", tag, inner, present))

    def atoms(
        self, mask: np.ndarray | None = None
    ) -> tuple[list[tuple[str, Any, np.ndarray | int]], np.ndarray | int]:
        """(kind, bytes or values, byte length: per message, or one int for all) of every
        atom, in wire order, and each message's total length; absent atoms have length 0."""
        out: list[tuple[str, Any, np.ndarray | int]] = []
        total: np.ndarray | int = 0

        def add(kind: str, value: Any, length: np.ndarray | int, present: Any) -> None:
            nonlocal total
            if present is not None:
                length = np.where(present, length, 0).astype(np.int8)
            out.append((kind, value, length))
            total = total + (length.astype(np.int64) if isinstance(length, np.ndarray) else length)

        for kind, tag, value, present in self.parts:
            if mask is not None:
                present = mask if present is None else mask & present
            add("const", tag, len(tag), present)
            if kind == "varint":
                add("varint", value, _varint_len(value), present)
            elif kind == "fixed64":
                add("fixed64", value, 8, present)
            elif kind == "message":
                inner, size = value.atoms(present)
                sizes = np.broadcast_to(np.asarray(size, dtype=np.int64), (self.n,))
                sizes = sizes.view(np.uint64)
                add("varint", sizes, _varint_len(sizes), present)
                out.extend(inner)
                total = total + size
        return out, total

    def encode(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The messages framed as `Trace.packet` entries: (bytes, each one's offset, each
        one's size). Messages of one group lie together (offsets are not in message order)."""
        framed = _Bulk(self.n)
        framed.message(b"\x0a", self)
        atoms, total = framed.atoms()
        sizes = np.broadcast_to(np.asarray(total, dtype=np.int64), (self.n,))
        key = np.zeros(self.n, dtype=np.int64)
        varying = [length for _, _, length in atoms if not np.isscalar(length)]
        for i, length in enumerate(varying):  # lengths are at most 10: base 11
            key = key * 11 + length
            if i % 17 == 16:
                key = np.unique(key, return_inverse=True)[1].astype(np.int64)
        order = np.argsort(key, kind="stable")
        edges = np.flatnonzero(np.diff(key[order])) + 1
        buf = np.empty(int(sizes.sum()), dtype=np.uint8)
        offsets = np.empty(self.n, dtype=np.int64)
        at = 0
        for rows in np.split(order, edges) if self.n else []:
            m, size = rows.size, int(sizes[rows[0]])
            block = buf[at : at + m * size].reshape(m, size)
            offsets[rows] = at + size * np.arange(m, dtype=np.int64)
            every = rows.size == self.n  # one group: the values need no gathering
            col = 0
            for kind, value, length in atoms:
                width = int(length if np.isscalar(length) else length[rows[0]])
                if not width:
                    continue
                if kind == "const":
                    block[:, col : col + width] = np.frombuffer(value, dtype=np.uint8)
                elif kind == "fixed64":
                    raw = (value if every else value[rows]).astype("<u8", copy=False)
                    block[:, col : col + 8] = raw.view(np.uint8).reshape(m, 8)
                else:  # a varint: 7 bits a byte, the high bit set on all but the last
                    _put_varint(block, col, width, value if every else value[rows])
                col += width
            at += m * size
        return buf, offsets, np.array(sizes)


def _put_varint(block: np.ndarray, col: int, width: int, values: np.ndarray) -> None:
    """Write `values` (uint64, each `width` bytes long as a varint) into columns col.. of
    `block` (one row per value), a byte column at a time."""
    part = np.empty(values.size, dtype=np.uint64)
    for k in range(width):
        np.right_shift(values, _SHIFTS[k], out=part)
        np.bitwise_and(part, np.uint64(0x7F), out=part)
        if k < width - 1:
            np.bitwise_or(part, np.uint64(0x80), out=part)
        block[:, col + k] = part


class _Arg:
    """One debug annotation over many slices, split by the type each value takes: a string
    (interned), an integer, a double or a bool; None and NaN leave it out."""

    ABSENT, STRING, INT, DOUBLE, BOOL = range(5)

    def __init__(
        self, writer: _Writer, values: pd.Series | np.ndarray | list, integral: bool = False
    ) -> None:
        """`integral`: an integer-valued float is written as an integer (byte counts)."""
        if isinstance(values, pd.Series):
            array = values.to_numpy()
        elif isinstance(values, list):
            array = np.empty(len(values), dtype=object)
            array[:] = values
        else:
            array = np.asarray(values)
        n = array.size
        self.n = n
        if integral and array.dtype.kind == "f":
            whole = np.isfinite(array) & (array == np.rint(array)) & (np.abs(array) < 2.0**63)
            self.kind = np.where(
                np.isnan(array), self.ABSENT, np.where(whole, self.INT, self.DOUBLE)
            ).astype(np.int8)
            self.value = np.where(whole, array, 0).astype(np.int64)
            self.double = array.astype(np.float64)
            return
        if array.dtype.kind in "iu":
            self.kind = np.full(n, self.INT, dtype=np.int8)
            self.value = array.astype(np.int64)
        elif array.dtype.kind == "f":
            self.kind = np.where(np.isnan(array), self.ABSENT, self.DOUBLE).astype(np.int8)
            self.value = array.astype(np.float64)
        elif array.dtype.kind == "b":
            self.kind = np.full(n, self.BOOL, dtype=np.int8)
            self.value = array.astype(np.int64)
        else:  # typed value by value: each distinct one once where all are text (or absent)
            strings: dict[str, int] = {}
            codes, uniques = pd.factorize(array, use_na_sentinel=False)
            values = uniques.tolist()
            if not all(type(v) is str or v is None or v != v for v in values):
                # Mixed types (1, 1.0 and True are one key to factorize): one at a time.
                codes, values = np.arange(n), array.tolist()
            if integral:
                values = [_num(value) for value in values]
            typed = [self._one(writer, strings, value) for value in values]
            self.kind = np.array([k for k, _ in typed], dtype=np.int8)[codes]
            self.value = np.array([v for _, v in typed] or [0], dtype=object)[codes]
            doubles = self.kind == self.DOUBLE
            if doubles.any():
                self.double = np.zeros(n)
                self.double[doubles] = self.value[doubles].astype(np.float64)
            self.value = np.where(doubles, 0, self.value).astype(np.int64)
            return
        if self.kind.size and (self.kind == self.DOUBLE).any():
            self.double = self.value.astype(np.float64)
            self.value = np.zeros(n, dtype=np.int64)

    def _one(self, writer: _Writer, strings: dict[str, int], value: Any) -> tuple[int, Any]:
        """(kind, number) of one value: its Python type decides."""
        if value is None or value != value:  # None, NaN
            return self.ABSENT, 0
        kind = type(value)
        if kind is str:
            iid = strings.get(value)
            if iid is None:
                iid = strings[value] = writer._intern(writer._strings, value)
            return self.STRING, iid
        if kind is int:
            return self.INT, value
        if kind is float:
            return self.DOUBLE, value
        if kind is bool or isinstance(value, np.bool_):
            return self.BOOL, int(bool(value))
        if isinstance(value, numbers.Integral):
            return self.INT, int(value)
        if isinstance(value, numbers.Real):
            return self.DOUBLE, float(value)
        return self.STRING, writer._intern(writer._strings, str(value))

    def add_to(self, event: _Bulk, name_iid: int) -> None:
        """This annotation in `event` (a TrackEvent bulk), for the slices that have it."""
        names = np.full(self.n, name_iid, dtype=np.int64)
        for kind, tag in (
            (self.STRING, _TAG_ARG_STRING),
            (self.INT, _TAG_ARG_INT),
            (self.DOUBLE, _TAG_ARG_DOUBLE),
            (self.BOOL, _TAG_ARG_BOOL),
        ):
            mask = self.kind == kind
            if not mask.any():
                continue
            inner = _Bulk(self.n)
            inner.varint(_TAG_ARG_NAME, names)
            if kind == self.DOUBLE:
                inner.fixed64(tag, self.double)
            else:
                inner.varint(tag, self.value)
            event.message(_TAG_ANNOTATION, inner, mask)


def _nesting_sequence(
    ts: np.ndarray, end: np.ndarray, lane: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """The order to make the begin and end events of slices in, each lane's strictly nested:
    by time; at one time, ends first (inner ones first), then begins (outer ones first),
    then zero-length slices, each begun and ended. Returns (slice, is_end) per event, or
    None when some lane's slices do not nest (they must go to more lanes: `_assign_lanes`).
    Checked exactly: matching each end with the latest open begin of its lane (a stack, done
    as pairs per depth level) must pair every slice with itself."""
    one_lane = not lane.any()
    o1 = np.argsort(-end, kind="stable")  # start order, parents (longer) first: a lexsort
    order = o1[np.argsort(ts[o1], kind="stable")]
    if not one_lane:
        order = order[np.argsort(lane[order], kind="stable")]
    zero = (end == ts)[order]
    spans, points = order[~zero], order[zero]
    # Laid out in the order wanted among events of one time (a stable sort by time keeps it):
    # ends (innermost first), begins (outermost first), zero-length begin/end pairs.
    slices = np.concatenate([spans[::-1], spans, np.repeat(points, 2)])
    is_end = np.concatenate(
        [
            np.ones(spans.size, dtype=bool),
            np.zeros(spans.size, dtype=bool),
            np.tile(np.array([False, True]), points.size),
        ]
    )
    time = np.where(is_end, end[slices], ts[slices])
    seq = np.argsort(time, kind="stable")
    if not one_lane:
        seq = seq[np.argsort(lane[slices][seq], kind="stable")]
    slices, is_end = slices[seq], is_end[seq]
    depth = np.cumsum(np.where(is_end, -1, 1))  # per lane: each lane's events sum to 0
    if depth.size and depth.min() < 0:
        return None
    level = np.where(is_end, depth + 1, depth)
    if level.size and level.max() < np.iinfo(np.int16).max:
        level = level.astype(np.int16)  # a radix sort
    paired = np.argsort(level, kind="stable") if one_lane else np.lexsort((level, lane[slices]))
    opened, closed = paired[0::2], paired[1::2]
    if is_end[opened].any() or not is_end[closed].all():
        return None
    if (slices[opened] != slices[closed]).any():
        return None
    return slices, is_end


def _assign_lanes(ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Lane of each slice where they do not all nest: the first lane whose open slices it
    nests in (in start order, parents first), a new one when none."""
    lane = np.zeros(ts.size, dtype=np.int64)
    stacks: list[list[int]] = [[]]
    starts, ends = ts.tolist(), end.tolist()
    for i in np.lexsort((-end, ts)).tolist():
        t, e = starts[i], ends[i]
        for k, stack in enumerate(stacks):
            while stack and stack[-1] <= t:
                stack.pop()
            if not stack or e <= stack[-1]:
                stack.append(e)
                lane[i] = k
                break
        else:
            stacks.append([e])
            lane[i] = len(stacks) - 1
    return lane


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
        self._chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # bulk index entries
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
        ends stay balanced). Events are copied a chunk at a time with numpy gathers."""
        self._write_interned()
        self._spill.flush()
        ts, offsets, sizes = self._index()
        if not ts.size:
            return
        order = np.argsort(ts, kind="stable")
        offsets, sizes = offsets[order], sizes[order]
        with mmap.mmap(self._spill.fileno(), 0, access=mmap.ACCESS_READ) as spilled:
            data = np.frombuffer(spilled, dtype=np.uint8)
            for first in range(0, order.size, _COPY_EVENTS):
                chunk = slice(first, first + _COPY_EVENTS)
                start, size = offsets[chunk], sizes[chunk]
                ends = np.cumsum(size)
                # Byte k of the chunk's output comes from the spill at k - (its event's output
                # start - the event's spill offset).
                shift = np.repeat(start - (ends - size), size)
                self._out.write(data[np.arange(int(ends[-1]), dtype=np.int64) + shift].tobytes())
            del data
        self.packets += int(order.size)

    def _index(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every spilled event's timestamp, offset and size, in the order they were made."""
        self._flush_index()
        if not self._chunks:
            return (np.empty(0, dtype=np.int64),) * 3  # type: ignore[return-value]
        return tuple(np.concatenate(parts) for parts in zip(*self._chunks, strict=True))  # type: ignore[return-value]

    def _flush_index(self) -> None:
        """The one-at-a-time index entries so far as a chunk (keeps the order of making)."""
        if self._event_ts:
            self._chunks.append(
                tuple(
                    np.frombuffer(a, dtype=np.int64).copy()
                    for a in (self._event_ts, self._event_offset, self._event_size)
                )
            )
            self._event_ts, self._event_offset, self._event_size = (array("q") for _ in "tos")

    def slices(
        self,
        ts: np.ndarray,
        end: np.ndarray,
        track: np.ndarray,
        name: np.ndarray,
        category: np.ndarray,
        sequence: tuple[np.ndarray, np.ndarray],
        args: Sequence[tuple[int, _Arg]] = (),
        terminating: Sequence[np.ndarray] = (),
        flows: Sequence[np.ndarray] = (),
    ) -> None:
        """Many slices' begin and end packets at once, encoded with numpy. Per slice: `ts` and
        `end` (ns), its lane's `track` uuid, `name` and `category` iids; `args`: (name iid,
        values) per debug annotation; `flows` / `terminating`: flow ids (0: none), one array
        per flow a slice may start / end. `sequence` (slices, is_end): the order the events
        are made in (`_nesting_sequence`), which the timestamp sort keeps at equal times."""
        n = ts.size
        if not n:
            return
        event = _Bulk(n)
        event.varint(_TAG_CATEGORY, category)
        for name_iid, arg in args:
            arg.add_to(event, name_iid)
        event.const(_BEGIN_TYPE)
        event.varint(_TAG_NAME, name)
        event.varint(_TAG_TRACK, track)
        for ids in flows:
            event.fixed64(_TAG_FLOW, ids.astype(np.uint64), ids != 0)
        for ids in terminating:
            event.fixed64(_TAG_TERMINATING, ids.astype(np.uint64), ids != 0)
        begins = _Bulk(n)
        begins.varint(_TAG_TIMESTAMP, ts)
        begins.const(_SEQUENCE)
        begins.message(_TAG_TRACK_EVENT, event)
        begins.const(_NEEDS_FLAGS)
        ending = _Bulk(n)
        ending.const(_END_TYPE)
        ending.varint(_TAG_TRACK, track)
        ends = _Bulk(n)
        ends.varint(_TAG_TIMESTAMP, end)
        ends.const(_SEQUENCE)
        ends.message(_TAG_TRACK_EVENT, ending)
        offsets = []
        for bulk in (begins, ends):
            data, offset, size = bulk.encode()
            offsets.append((offset + self._spilled, size))
            self._spill.write(data.data)
            self._spilled += data.size
        rows, is_end = sequence
        self._flush_index()
        self._chunks.append(
            (
                np.where(is_end, end[rows], ts[rows]),
                np.where(is_end, offsets[1][0][rows], offsets[0][0][rows]),
                np.where(is_end, offsets[1][1][rows], offsets[0][1][rows]),
            )
        )

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

    def category_iid(self, category: str) -> int:
        return self._intern(self._categories, category)

    def arg_name(self, name: str) -> int:
        return self._intern(self._arg_names, name)

    def name_iids(self, names: pd.Series | pd.Categorical) -> np.ndarray:
        """The event-name iid of each value (strings; a categorical's missing ones: "")."""
        values = pd.Categorical(names) if isinstance(names, pd.Series) else names
        table = np.array(
            [self._intern(self._names, str(c)) for c in values.categories] + [0], dtype=np.int64
        )
        codes = np.asarray(values.codes, dtype=np.int64)
        if (codes < 0).any():
            table[-1] = self._intern(self._names, "")
        return table[codes]

    def category_iids(self, categories: np.ndarray) -> np.ndarray:
        values = pd.Categorical(categories)
        table = np.array([self.category_iid(str(c)) for c in values.categories], dtype=np.int64)
        return table[np.asarray(values.codes, dtype=np.int64)]

    def counter(self, ts: int, track: int, value: float) -> None:
        packet = self._packet()
        packet.timestamp = ts
        e = packet.track_event
        e.type = _COUNTER
        e.track_uuid = track
        e.double_counter_value = value
        self._spill_event(ts, packet)
        self.counters += 1


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
            (self.w.arg_name("step"), _Arg(self.w, steps)),
            (self.w.arg_name("dur_us"), _Arg(self.w, e_us - s_us)),
            (self.w.arg_name("collectives"), _Arg(self.w, [x or None for x in labels])),
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
            (self.w.arg_name(arg_names.get(key, key)), _Arg(self.w, coll[key], integral=True))
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
            (self.w.arg_name(name), _Arg(self.w, kernels[name]))
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
        sequence = _nesting_sequence(ts, end, lane)
        if sequence is None:
            lane = _assign_lanes(ts, end)
            sequence = _nesting_sequence(ts, end, lane)
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
