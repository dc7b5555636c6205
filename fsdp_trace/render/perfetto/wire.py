"""The Perfetto protobuf wire format as the writer emits it: timestamps in ns
(`to_ns`), packet framing, the TrackEvent types, and the bulk encoder that writes many
slices' begin and end packets at once with numpy (`Bulk`), with their arguments (`Arg`)."""

from __future__ import annotations

import math
import numbers
from typing import Any, Protocol

import numpy as np
import pandas as pd
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import (
    TracePacket,
    TrackDescriptor,
    TrackEvent,
)

from fsdp_trace.errors import UserError


class _Interning(Protocol):
    """What `Arg` needs of the file's writer (`file._Writer`): its interned strings."""

    _strings: dict[str, int]

    @staticmethod
    def _intern(table: dict[str, int], value: str) -> int: ...


SEQUENCE_ID = 1  # trusted_packet_sequence_id: one writer, one sequence
INTERNED_PER_PACKET = 10_000  # interned strings per packet (keeps each packet small)
COPY_EVENTS = 1 << 17  # events copied to the output at a time (bounds the gather's memory)
PID_BASE = 1000  # synthetic pids (one per analyzed trace) and tids (globally unique)
TID_BASE = 100_000

_BEGIN = TrackEvent.TYPE_SLICE_BEGIN
_END = TrackEvent.TYPE_SLICE_END
COUNTER = TrackEvent.TYPE_COUNTER
CLEARED = TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
EXPLICIT_ORDERING = TrackDescriptor.ChildTracksOrdering.Value("EXPLICIT")


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


def packet_header(size: int) -> bytes:
    """Header of one `Trace.packet` entry: field 1, wire type 2, varint length."""
    out = bytearray(b"\x0a")
    while size > 0x7F:
        out.append((size & 0x7F) | 0x80)
        size >>= 7
    out.append(size)
    return bytes(out)


SHORT_FRAMES = [packet_header(n) for n in range(1 << 14)]

# -- bulk encoding ---------------------------------------------------------------------------
# Most packets (every CPU and GPU slice's begin and end) are encoded many at a time with numpy,
# in the wire format protobuf itself writes (fields in number order, unpacked repeated fields;
# tests decode them with perfetto's protos). Tags of the fields written that way:
TAG_TIMESTAMP = b"\x40"  # TracePacket.timestamp = 8, varint
SEQUENCE = bytes([0x50, SEQUENCE_ID])  # TracePacket.trusted_packet_sequence_id = 10
TAG_TRACK_EVENT = b"\x5a"  # TracePacket.track_event = 11, length-delimited
NEEDS_FLAGS = bytes([0x68, TracePacket.SEQ_NEEDS_INCREMENTAL_STATE])  # sequence_flags = 13
TAG_CATEGORY = b"\x18"  # TrackEvent.category_iids = 3
_TAG_ANNOTATION = b"\x22"  # TrackEvent.debug_annotations = 4
BEGIN_TYPE = bytes([0x48, _BEGIN])  # TrackEvent.type = 9
END_TYPE = bytes([0x48, _END])
TAG_NAME = b"\x50"  # TrackEvent.name_iid = 10
TAG_TRACK = b"\x58"  # TrackEvent.track_uuid = 11
TAG_FLOW = b"\xf9\x02"  # TrackEvent.flow_ids = 47, fixed64
TAG_TERMINATING = b"\x81\x03"  # TrackEvent.terminating_flow_ids = 48, fixed64
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


class Bulk:
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

    def message(self, tag: bytes, inner: Bulk, present: np.ndarray | None = None) -> None:
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
        framed = Bulk(self.n)
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


class Arg:
    """One debug annotation over many slices, split by the type each value takes: a string
    (interned), an integer, a double or a bool; None and NaN leave it out."""

    ABSENT, STRING, INT, DOUBLE, BOOL = range(5)

    def __init__(
        self, writer: _Interning, values: pd.Series | np.ndarray | list, integral: bool = False
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

    def _one(self, writer: _Interning, strings: dict[str, int], value: Any) -> tuple[int, Any]:
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

    def add_to(self, event: Bulk, name_iid: int) -> None:
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
            inner = Bulk(self.n)
            inner.varint(_TAG_ARG_NAME, names)
            if kind == self.DOUBLE:
                inner.fixed64(tag, self.double)
            else:
                inner.varint(tag, self.value)
            event.message(_TAG_ANNOTATION, inner, mask)


def _num(value: Any) -> Any:
    """An integer-valued float as int (bytes), NaN / None left as is (dropped later)."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value
