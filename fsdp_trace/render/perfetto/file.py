"""The .pftrace file: every track descriptor, then the interned strings, then every event in
timestamp order across all tracks and ranks, spilled to a file beside the output while made
(`Writer`); slices that do not nest go to extra lanes (`assign_lanes`)."""

from __future__ import annotations

import mmap
from array import array
from collections.abc import Sequence
from typing import BinaryIO

import numpy as np
import pandas as pd
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import (
    TracePacket,
)

from fsdp_trace.analysis import intervals as iv
from fsdp_trace.render.perfetto.wire import (
    BEGIN_TYPE,
    CLEARED,
    COPY_EVENTS,
    COUNTER,
    END_TYPE,
    EXPLICIT_ORDERING,
    INTERNED_PER_PACKET,
    NEEDS_FLAGS,
    SEQUENCE,
    SEQUENCE_ID,
    SHORT_FRAMES,
    TAG_CATEGORY,
    TAG_FLOW,
    TAG_NAME,
    TAG_TERMINATING,
    TAG_TIMESTAMP,
    TAG_TRACK,
    TAG_TRACK_EVENT,
    TID_BASE,
    Arg,
    Bulk,
    packet_header,
)


def nesting_sequence(
    ts: np.ndarray, end: np.ndarray, lane: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """The order to make the begin and end events of slices in, each lane's strictly nested:
    by time; at one time, ends first (inner ones first), then begins (outer ones first),
    then zero-length slices, each begun and ended. Returns (slice, is_end) per event, or
    None when some lane's slices do not nest (they must go to more lanes: `assign_lanes`).
    Checked exactly: matching each end with the latest open begin of its lane (a stack, done
    as pairs per depth level) must pair every slice with itself."""
    one_lane = not lane.any()
    order = iv.parents_first(ts, end)  # start order, parents (longer) first
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


def assign_lanes(ts: np.ndarray, end: np.ndarray) -> np.ndarray:
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


class Writer:
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
            packet.sequence_flags = CLEARED
            packet.first_packet_on_sequence = True
            self._first = False
        return packet

    @staticmethod
    def _framed(packet: TracePacket) -> bytes:
        data = packet.SerializeToString()
        size = len(data)
        return (SHORT_FRAMES[size] if size < 16384 else packet_header(size)) + data

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
            for first in range(0, order.size, COPY_EVENTS):
                chunk = slice(first, first + COPY_EVENTS)
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
        args: Sequence[tuple[int, Arg]] = (),
        terminating: Sequence[np.ndarray] = (),
        flows: Sequence[np.ndarray] = (),
    ) -> None:
        """Many slices' begin and end packets at once, encoded with numpy. Per slice: `ts` and
        `end` (ns), its lane's `track` uuid, `name` and `category` iids; `args`: (name iid,
        values) per debug annotation; `flows` / `terminating`: flow ids (0: none), one array
        per flow a slice may start / end. `sequence` (slices, is_end): the order the events
        are made in (`nesting_sequence`), which the timestamp sort keeps at equal times."""
        n = ts.size
        if not n:
            return
        event = Bulk(n)
        event.varint(TAG_CATEGORY, category)
        for name_iid, arg in args:
            arg.add_to(event, name_iid)
        event.const(BEGIN_TYPE)
        event.varint(TAG_NAME, name)
        event.varint(TAG_TRACK, track)
        for ids in flows:
            event.fixed64(TAG_FLOW, ids.astype(np.uint64), ids != 0)
        for ids in terminating:
            event.fixed64(TAG_TERMINATING, ids.astype(np.uint64), ids != 0)
        begins = Bulk(n)
        begins.varint(TAG_TIMESTAMP, ts)
        begins.const(SEQUENCE)
        begins.message(TAG_TRACK_EVENT, event)
        begins.const(NEEDS_FLAGS)
        ending = Bulk(n)
        ending.const(END_TYPE)
        ending.varint(TAG_TRACK, track)
        ends = Bulk(n)
        ends.varint(TAG_TIMESTAMP, end)
        ends.const(SEQUENCE)
        ends.message(TAG_TRACK_EVENT, ending)
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
            d.child_ordering = EXPLICIT_ORDERING
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
        e.type = COUNTER
        e.track_uuid = track
        e.double_counter_value = value
        self._spill_event(ts, packet)
        self.counters += 1
