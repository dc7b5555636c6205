"""The one trace loader: Kineto Chrome JSON (.json / .json.gz) into columnar arrays.

The file is streamed: blocks are read (and gunzipped on a helper thread, which runs beside the
decoder since zlib releases the GIL), the `traceEvents` array is cut at event boundaries into
small pieces, and msgspec decodes each piece into typed structs holding only the fields the
analysis reads. Each piece's structs become compact C arrays at once (C-level `map` over
attribute getters, no per-event Python code) and are freed before the next piece, so decoded
structs never all live at once and they stay in the CPU cache while they are read. Strings
become categorical codes as they arrive; Python-stack events (with_stack traces hold ~9 of them
per operator), flows and other non-complete events are dropped on the way. Timestamps stay exact
floats (µs with ns fractions).

Large files (256 MB of JSON, gzip's estimated by its size trailer) are decoded by two
processes: a forked helper takes
2 MB batches of events whenever it is free, the main process decodes the rest, and the
batches are merged in file order into exactly the columns one process would build (any batch
that does not decode sends the file down the one-process path, which reports the real error).

Parsed columns are cached by file content (`fsdp_trace.analysis.read.cache`): a second load of the
same bytes reads them back instead of parsing.

Bad input is refused in one line (UserError), never with a traceback, a hang or unbounded
memory: only regular files are opened (never blocking: a FIFO is refused, not waited on); the
text must be UTF-8 (UTF-16/32 and invalid bytes anywhere are refused, naming the byte; a
UTF-8 byte-order mark is skipped); nothing is held beyond a look-ahead of _LOOKAHEAD bytes
while looking for the `traceEvents` array or the end of an event, so a gzip bomb costs what
that window costs, and no file is ever decoded whole unless it fits in it; nesting too deep
for the decoder, two `traceEvents` keys, and values of the wrong type are refused with their
place in the file. Integers beyond int64 are read as absent (pid/tid: ids like strings'),
with a counted notice. The decoded events then go through `fsdp_trace.analysis.read.validate`
(impossible times, duplicates, shared correlation ids, `distributedInfo` fields), whose
notices the `Trace` carries.
"""

from __future__ import annotations

import codecs
import errno
import gzip
import json
import math
import os
import queue
import re
import stat
import sys
import threading
import zlib
from array import array
from collections.abc import Callable, Iterator
from itertools import chain, compress, repeat
from operator import attrgetter, is_
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from fsdp_trace.analysis.read import validate
from fsdp_trace.analysis.read.trace import FORMAT_VERSION, MISSING, Trace, rank_from_name
from fsdp_trace.errors import UserError
from fsdp_trace.runrecord import NotRegularFile, open_regular

__all__ = ["FORMAT_VERSION", "MISSING", "Trace", "load_trace", "rank_from_name", "raw_size"]

PROGRESS_MIN_BYTES = 50 * 1024 * 1024  # show a progress bar for larger files (raw JSON bytes)

_BLOCK = 8 << 20  # bytes read (or gunzipped) at a time
_PIECE = 256 << 10  # bytes of events decoded at a time: the structs of a piece stay in cache
# Look-ahead bound: the most text held while looking for what must come next (the
# `"traceEvents": [` key, the end of an event, the end of a file decoded whole). Kineto's
# header is a few KB and an event well under a megabyte; a file that keeps neither promise in
# this many bytes is refused, so memory never grows with a hostile (or gzip-bomb) input.
_LOOKAHEAD = 16 << 20
_BATCH = 8 << 20  # bytes of events per batch of the two-process decode
# Files of this much raw JSON and more are decoded by two processes. Below it the second
# process costs more than it gives: its interpreter and imports (~80 MB of RSS) and the
# batches' transfer, for a second or less saved (measured in benchmarks/results/speed.md).
PARALLEL_MIN_BYTES = 256 << 20
GZIP_RATIO_GUESS = 10  # raw / compressed size of Kineto JSON (8-13 seen), when ISIZE is ambiguous
# A gzip file whose text grows past this many times the compressed bytes read so far (once
# past the floor) is refused: Kineto JSON expands 8-20x; a gzip bomb of valid events, 300x or
# more, would otherwise be decoded whole (1.5 GB of events from 5 MB).
GZIP_MAX_RATIO = 100
GZIP_RATIO_FLOOR = 64 << 20


class _Args(msgspec.Struct, gc=False, frozen=True):
    correlation: int | None = MISSING
    external_id: int | None = msgspec.field(default=MISSING, name="External id")
    collective_name: str | None = msgspec.field(default=None, name="Collective name")
    dtype: str | None = None
    in_nelems: int | None = msgspec.field(default=None, name="In msg nelems")
    out_nelems: int | None = msgspec.field(default=None, name="Out msg nelems")
    group_size: int | None = msgspec.field(default=None, name="Group size")
    pg_name: str | None = msgspec.field(default=None, name="Process Group Name")
    pg_desc: str | None = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: str | None = msgspec.field(default=None, name="Process Group Ranks")
    seq: int | None = msgspec.field(default=None, name="Seq")
    sequence_number: int | None = msgspec.field(default=MISSING, name="Sequence number")
    stream: int | None = MISSING
    name: str | None = None  # metadata events: thread / process names
    # Kernel launch shape, kept as its JSON text ("[216, 1, 1]"): tells GEMMs of one name apart.
    grid: msgspec.Raw = msgspec.Raw(b"")
    block: msgspec.Raw = msgspec.Raw(b"")
    # Raw: left undecoded unless needed (only CPU collectives read them).
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input type")


_NO_ARGS = _Args()  # shared by every event without args (structs are never mutated)
_X = "X"  # complete events' phase
_UNSEEN = object()  # a dict lookup's default: not seen before


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float | None = None
    dur: float | None = None
    args: _Args | None = _NO_ARGS


class _TraceFile(msgspec.Struct):
    traceEvents: list[_Event] | None = None
    schemaVersion: Any = None
    deviceProperties: Any = None
    distributedInfo: dict[str, Any] | None = None
    baseTimeNanoseconds: int | None = None
    traceName: str | None = None
    displayTimeUnit: Any = None  # "ns": timestamps in ns (Perfetto's reading); else µs


_DECODER = msgspec.json.Decoder(_TraceFile)
_LIST_DECODER = msgspec.json.Decoder(list[_Event])
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")  # between two events (checked by decoding the piece)
DROPPED_CATEGORIES = frozenset({"python_function", "Trace"})

# Collective arguments: on few events, kept sparse while loading (column, dtype kind).
_RARE = (
    ("collective_name", "cat"),
    ("dtype", "cat"),
    ("in_nelems", "int"),
    ("out_nelems", "int"),
    ("group_size", "int"),
    ("pg_name", "cat"),
    ("pg_desc", "cat"),
    ("pg_ranks", "cat"),
    ("seq", "int"),
    ("grid", "raw"),
    ("block", "raw"),
)
_DENSE_ARGS = ("correlation", "external_id", "sequence_number", "stream")
_get = {name: attrgetter(name) for name in ("ph", "cat", "name", "pid", "tid", "ts", "dur", "args")}
_get_arg = {name: attrgetter(name) for name in (*_DENSE_ARGS, *(r for r, _ in _RARE))}
_get_rare = attrgetter(*(r for r, _ in _RARE))
_get_dense = attrgetter(*_DENSE_ARGS)
_get_input_dims = attrgetter("input_dims")


def raw_size(path: Path) -> int:
    """Bytes of JSON in the file: its size, or for gzip the size its trailer records (ISIZE,
    the raw size mod 4 GiB), taken as the candidate nearest a typical compression ratio;
    0 when unreadable (or not a regular file)."""
    try:
        with open_regular(path) as fh:
            size = os.fstat(fh.fileno()).st_size
            if size < 18 or fh.read(2) != b"\x1f\x8b":
                return size
            fh.seek(-4, os.SEEK_END)
            isize = int.from_bytes(fh.read(4), "little")
    except OSError:
        return 0
    guess = size * GZIP_RATIO_GUESS
    wrap = 1 << 32
    floor = size // 2  # what gzip gives back is never much smaller than what it stores
    low = isize + max(0, -(-(floor - isize) // wrap)) * wrap
    candidates = [low + k * wrap for k in range(max(1, guess // wrap + 2))]
    return min(candidates, key=lambda c: abs(math.log(c / guess)))


def _check_path(path: Path) -> None:
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise UserError(f"{path}: no such file") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a loop of symbolic links
            raise UserError(f"{path}: no such file (a loop of symbolic links)") from None
        raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if stat.S_ISDIR(mode):
        raise UserError(f"{path}: is a directory, not a trace file")
    if not stat.S_ISREG(mode):
        raise UserError(f"{path}: not a regular file (a FIFO, device or socket): give a trace file")


def _gzip_error(path: Path) -> UserError:
    return UserError(f"{path}: truncated or corrupt gzip: re-copy or re-export the trace")


def _open(path: Path):
    """The file opened for reading, refused unless it is a regular file."""
    try:
        return open_regular(path)
    except NotRegularFile:
        raise UserError(
            f"{path}: not a regular file (a FIFO, device or socket): give a trace file"
        ) from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from None


def read_bytes(path: Path, limit: int = _LOOKAHEAD) -> bytes:
    """The file's JSON text, gunzipped when it is gzip (by magic bytes, whatever the suffix):
    at most `limit` bytes of it (a longer text is refused: never a whole file in memory)."""
    _check_path(path)
    parts, size = [], 0
    for block in _text(path, _read_blocks(path, None)):
        parts.append(block)
        size += len(block)
        if size > limit:
            raise UserError(
                f"{path}: over {limit >> 20} MB of JSON, more than this reader holds at once"
            )
    return b"".join(parts)


_MSGSPEC_BYTE = re.compile(r"\(byte (\d+)\)")
_MSGSPEC_INDEX = re.compile(r"`\$(\.traceEvents)?\[(\d+)\]")


def _where(message: str, offset: int, events_before: int) -> str:
    """msgspec's positions in a piece of text as positions in the file: byte offsets shifted
    by where the piece starts, event indices by the events before it."""
    message = _MSGSPEC_BYTE.sub(lambda m: f"(byte {int(m.group(1)) + offset})", message)
    return _MSGSPEC_INDEX.sub(
        lambda m: f"`$.traceEvents[{int(m.group(2)) + events_before}]", message
    )


def _decode_error(
    path: Path, exc: BaseException, offset: int = 0, events_before: int = 0
) -> UserError:
    """The one-line error for text that does not decode (offset: where the text starts in the
    file, less one for a `[` put before a piece)."""
    if isinstance(exc, RecursionError):
        return UserError(
            f"{path}: JSON nested too deeply (past byte {max(offset, 0)}): not a Kineto trace"
        )
    if isinstance(exc, UnicodeDecodeError):  # prevented by `_text`; kept as a safety net
        return UserError(f"{path}: not UTF-8 text: Kineto traces are UTF-8; re-export the trace")
    reason = _where(str(exc), offset, events_before)
    if isinstance(exc, msgspec.ValidationError):
        return UserError(f"{path}: not a Kineto trace layout ({reason})")
    return UserError(f"{path}: not valid JSON ({reason}): is the file complete?")


def _decode(path: Path, data: bytes, offset: int = 0, events_before: int = 0) -> _TraceFile:
    """The top-level object (or a bare list of events) in `data`, which starts `offset` bytes
    into the file after `events_before` events."""
    if not data.strip():
        raise UserError(f"{path}: empty file: not a Kineto trace")
    try:
        return _DECODER.decode(data)
    except msgspec.ValidationError as exc:
        # A bare list of events is an older Chrome-trace layout; accept it.
        if data.lstrip()[:1] == b"[":
            try:
                return _TraceFile(traceEvents=_LIST_DECODER.decode(data))
            except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as inner:
                if not isinstance(inner, msgspec.ValidationError):
                    raise _decode_error(path, inner, offset, events_before) from None
        raise _decode_error(path, exc, offset, events_before) from None
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as exc:
        raise _decode_error(path, exc, offset, events_before) from None


def _top_level_keys(path: Path, text: bytes) -> list[str] | None:
    """The keys of the top-level object in `text` (valid JSON), duplicates kept; None for a
    bare list."""
    last: list[list[str]] = []

    def pairs(items: list) -> dict:
        last[:] = [[k for k, _ in items]]
        return {}

    try:
        value = json.loads(text, object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return None
    return last[0] if isinstance(value, dict) and last else None


def _check_one_events_key(path: Path, texts: list[bytes]) -> None:
    """Refuse a file with two `traceEvents` keys (decoders keep the last one, silently). The
    precise check (parsing the keys) runs only where the name occurs twice."""
    if sum(t.count(b'"traceEvents"') for t in texts) < 2:
        return
    keys = _top_level_keys(path, b"".join(texts))
    if keys is not None and keys.count("traceEvents") > 1:
        raise UserError(
            f"{path}: two 'traceEvents' arrays in one file (two traces merged or "
            "concatenated?): keep one trace per file"
        )


_INT64 = 1 << 63
# JSON names of the integer columns, for notices.
_INT_KEYS = {
    "correlation": "correlation",
    "external_id": "External id",
    "sequence_number": "Sequence number",
    "stream": "stream",
    "in_nelems": "In msg nelems",
    "out_nelems": "Out msg nelems",
    "group_size": "Group size",
    "seq": "Seq",
}


def _fits(value: int) -> bool:
    return -_INT64 <= value < _INT64


class _IdMap:
    """pid/tid values may be strings ('Spans', 'GPU 0'), or integers beyond int64; give them
    stable negative ids."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def __call__(self, value: int | str) -> int:
        if isinstance(value, str):
            try:
                value = int(value)
            except ValueError:
                return self.ids.setdefault(value, -2 - len(self.ids))
        if _fits(value):
            return value
        return self.ids.setdefault(str(value), -2 - len(self.ids))


class _Codes(dict):
    """String -> code in order of first appearance."""

    def __init__(self, watch: str | None = None) -> None:
        super().__init__()
        self.watch = watch
        self.watched: set[int] = set()  # codes of strings starting with `watch`

    def code(self, key: str) -> int:
        code = self.get(key)
        if code is None:
            code = self[key] = len(self)
            if self.watch is not None and key.startswith(self.watch):
                self.watched.add(code)
        return code

    def codes(self, keys: list[str]) -> array:
        """The codes of `keys` (a C-level dict lookup each; new strings are added)."""
        found = list(map(self.get, keys))
        try:
            return array("i", found)
        except TypeError:  # strings not seen before: coded once each, in order, then looked up
            for key in dict.fromkeys(compress(keys, map(is_, found, repeat(None)))):
                self.code(key)
            return array("i", map(self.__getitem__, keys))

    def categorical(self, codes: np.ndarray) -> pd.Categorical:
        """The codes (in first-appearance order, -1 for None) as a Categorical whose categories
        are sorted, as `pd.Categorical(values)` makes them."""
        names = [k for k in self if k is not None]
        if not names:
            empty = pd.Index([], dtype=str)
            return pd.Categorical.from_codes(np.full(codes.size, -1, np.int8), categories=empty)
        categories = pd.Index(names, dtype=str)
        order = np.argsort(np.asarray(names, dtype=object), kind="stable")
        remap = np.full(len(self) + 1, -1, dtype=np.int32)
        first = [self[k] for k in names]
        remap[np.asarray(first, dtype=np.int64)[order]] = np.arange(len(names), dtype=np.int32)
        codes = remap[codes]  # code -1 (None) reads remap[-1] == -1
        return pd.Categorical.from_codes(_narrow(codes), categories=categories[order])


def _sparse_categorical(n: int, rows: np.ndarray, values: list[str | None]) -> pd.Categorical:
    """A text column holding `values` at `rows` (None elsewhere) as a Categorical with sorted
    categories (as `_Codes.categorical` makes them), its codes in the narrowest integer type
    from the start: the column is mostly absent, and a full int32 array costs 4x the memory
    traffic."""
    names = sorted(v for v in dict.fromkeys(values) if v is not None)
    lookup: dict[str | None, int] = {name: i for i, name in enumerate(names)}
    lookup[None] = -1
    dtype = next(
        (d for d in (np.int8, np.int16, np.int32) if len(names) - 1 < np.iinfo(d).max), np.int64
    )
    codes = np.full(n, -1, dtype=dtype)
    codes[rows] = np.fromiter(map(lookup.__getitem__, values), dtype, len(rows))
    return pd.Categorical.from_codes(codes, categories=pd.Index(names, dtype=str))


def _narrow(codes: np.ndarray) -> np.ndarray:
    top = int(codes.max()) if codes.size else 0
    for dtype in (np.int8, np.int16, np.int32):
        if top < np.iinfo(dtype).max:
            return codes.astype(dtype, copy=False)
    return codes


class _Columns:
    """Columns of the complete events, filled piece by piece from decoded structs."""

    def __init__(
        self, defer_metadata: bool = False, tables: tuple[_Codes, _Codes] | None = None
    ) -> None:
        self.defer_metadata = defer_metadata  # a batch: ids are given when batches merge
        self.metadata: list[tuple[str, int | str, int | str, str]] = []
        self.ts = array("d")
        self.dur = array("d")
        self.pid = array("q")
        self.tid = array("q")
        self.dense = {name: array("q") for name in _DENSE_ARGS}
        self.cats, self.names = tables or (_Codes(), _Codes(watch="gloo:"))
        self.cat_codes = array("i")
        self.name_codes = array("i")
        self.rare_rows = array("q")
        self.rare: dict[str, list[Any]] = {name: [] for name, _ in _RARE}
        self.has_collective = False
        self.gloo: list[tuple[int, bytes, bytes]] = []  # (row, Input Dims, Input type)
        self.string_ids: list[tuple[int, str, str]] = []  # (row, "pid"/"tid", value)
        self.ids = _IdMap()
        self.thread_names: dict[tuple[int, int], str] = {}
        self.process_names: dict[int, str] = {}
        self.raw_count = 0
        self.python_events = 0  # with_stack's python_function events (dropped)
        self.input_dims = False  # any operator carries `Input Dims` (record_shapes)
        self.too_big: dict[str, int] = {}  # column -> integers beyond int64 read as absent
        self.raw_text: dict[bytes, str | None] = {b"": None}  # launch shapes' text, decoded once

    def __len__(self) -> int:
        return len(self.ts)

    def add(self, events: list[_Event]) -> None:
        """Take one piece of decoded events (in file order)."""
        self.raw_count += len(events)
        complete = list(compress(events, map(_X.__eq__, map(_get["ph"], events))))
        if len(complete) != len(events):
            metadata = [e for e in events if e.ph == "M"]
            if metadata:
                self._metadata(metadata)
        events = complete
        if not events:
            return
        cats = list(map(_get["cat"], events))
        if "python_function" in cats or "Trace" in cats:  # DROPPED_CATEGORIES
            self.python_events += cats.count("python_function")
            keep = [c not in DROPPED_CATEGORIES for c in cats]
            events = list(compress(events, keep))
            cats = list(compress(cats, keep))
        try:
            ts = array("d", map(_get["ts"], events))
        except TypeError:  # events without a timestamp are dropped
            keep = [e.ts is not None for e in events]
            events = list(compress(events, keep))
            cats = list(compress(cats, keep))
            ts = array("d", map(_get["ts"], events))
        if not events:
            return
        row0 = len(self.ts)
        self.ts += ts
        try:
            self.dur += array("d", map(_get["dur"], events))
        except TypeError:
            self.dur += array("d", [e.dur or 0.0 for e in events])
        for attr, column in (("pid", self.pid), ("tid", self.tid)):
            try:
                column += array("q", map(_get[attr], events))
            except (TypeError, OverflowError):  # strings, or integers beyond int64
                column += array(
                    "q",
                    [
                        self._thread_id(row0 + i, attr, getattr(e, attr))
                        for i, e in enumerate(events)
                    ],
                )
        self.cat_codes += self.cats.codes(cats)
        name_codes = self.names.codes(list(map(_get["name"], events)))
        self.name_codes += name_codes
        args = list(map(_get["args"], events))
        if None in args:
            args = [_NO_ARGS if a is None else a for a in args]
        if not self.input_dims:
            self.input_dims = any(map(_get_input_dims, args))
        try:  # the four dense columns in one pass over the args, as rows of 4
            dense = array("q", chain.from_iterable(map(_get_dense, args)))
        except (TypeError, OverflowError):  # None, or integers beyond int64
            for name in _DENSE_ARGS:
                values = map(_get_arg[name], args)
                self.dense[name] += array("q", [self._int(name, v) for v in values])
        else:
            rows = np.frombuffer(dense, dtype=np.int64).reshape(-1, len(_DENSE_ARGS))
            for j, name in enumerate(_DENSE_ARGS):
                self.dense[name].frombytes(rows[:, j].tobytes())
        self._rare(args, row0)
        if self.names.watched and not self.names.watched.isdisjoint(name_codes):
            for i, code in enumerate(name_codes):
                if code in self.names.watched and args[i].input_dims:
                    a = args[i]
                    self.gloo.append((row0 + i, bytes(a.input_dims), bytes(a.input_type)))

    def _rare(self, args: list[_Args], row0: int) -> None:
        """Collective arguments of the events that carry a `Collective name` and of GPU events
        (those with a stream), the only rows that read them; other rows keep them absent."""
        n = len(args)
        names = list(map(_get_arg["collective_name"], args))
        named = names.count(None) != n
        wanted = np.frombuffer(self.dense["stream"], dtype=np.int64)[row0 : row0 + n] >= 0
        if named:
            self.has_collective = True
            wanted |= np.array(names, dtype=object) != None  # noqa: E711 (elementwise)
        rows = np.flatnonzero(wanted)
        if not rows.size:
            return
        self.rare_rows.frombytes((rows + row0).tobytes())
        # One tuple of the rare fields per wanted row, transposed into one tuple per field.
        fields = zip(*map(_get_rare, map(args.__getitem__, rows.tolist())), strict=True)
        for (name, kind), values in zip(_RARE, fields, strict=True):
            if kind == "raw":  # JSON text, as str: batches cross process boundaries
                texts = list(map(bytes, values))
                found = list(map(self.raw_text.get, texts, repeat(_UNSEEN, len(texts))))
                if _UNSEEN in found:  # a text not seen before
                    found = [self._raw_text(t) for t in texts]
                self.rare[name] += found
            elif kind == "int":
                present = list(filter(None, values))  # zeros and absent ones fit anyway
                if present and not (_fits(max(present)) and _fits(min(present))):
                    values = tuple(None if v is None else self._int(name, v) for v in values)
                self.rare[name] += values
            else:
                self.rare[name] += values

    def _raw_text(self, raw: bytes) -> str | None:
        """A launch shape's JSON text as a str (None when absent), decoded once per text."""
        text = self.raw_text.get(raw, _UNSEEN)
        if text is _UNSEEN:
            text = self.raw_text[raw] = raw.decode()
        return text  # type: ignore[return-value]

    def _int(self, name: str, value: int | None) -> int:
        """An integer argument as stored: absent (MISSING) when missing or beyond int64."""
        if value is None:
            return MISSING
        if _fits(value):
            return value
        self.too_big[name] = self.too_big.get(name, 0) + 1
        return MISSING

    def _thread_id(self, row: int, attr: str, value: int | str) -> int:
        if isinstance(value, str):
            try:
                value = int(value)
            except ValueError:
                # Strings get negative ids after every metadata event's (as they always have).
                self.string_ids.append((row, attr, value))
                return 0
        if _fits(value):
            return value
        self.string_ids.append((row, attr, str(value)))  # beyond int64: an id like a string's
        return 0

    def _metadata(self, events: list[_Event]) -> None:
        for event in events:
            a = event.args
            if a is None or a.name is None:
                continue
            if self.defer_metadata:
                self.metadata.append((event.name, event.pid, event.tid, a.name))
            else:
                self._name_thread(event.name, event.pid, event.tid, a.name)

    def _name_thread(self, kind: str, pid: int | str, tid: int | str, name: str) -> None:
        if kind == "thread_name":
            self.thread_names[(self.ids(pid), self.ids(tid))] = name
        elif kind == "process_name":
            self.process_names[self.ids(pid)] = name

    @classmethod
    def merge(cls, batches: list[_Columns]) -> _Columns:
        """Batches (in file order) as one set of columns, exactly as if loaded in one go."""
        out = cls()
        for batch in batches:  # metadata first: its string ids come before the events'
            for item in batch.metadata:
                out._name_thread(*item)
        offset = 0
        parts: dict[str, list[np.ndarray]] = {}
        rare_rows = []
        remaps: dict[int, np.ndarray] = {}  # per string table (batches of a process share one)

        def remap(local: list[str] | _Codes, codes: _Codes) -> np.ndarray:
            if id(local) not in remaps:
                remaps[id(local)] = np.array([codes.code(k) for k in local] + [-1], np.int32)
            return remaps[id(local)]

        for batch in batches:
            n = len(batch)
            out.raw_count += batch.raw_count
            out.python_events += batch.python_events
            for name, count in batch.too_big.items():
                out.too_big[name] = out.too_big.get(name, 0) + count
            out.input_dims = out.input_dims or batch.input_dims
            if not n:
                continue
            for attr, dtype in (
                ("ts", np.float64),
                ("dur", np.float64),
                ("pid", np.int64),
                ("tid", np.int64),
            ):
                parts.setdefault(attr, []).append(np.frombuffer(getattr(batch, attr), dtype))
            for name in _DENSE_ARGS:
                parts.setdefault(name, []).append(np.frombuffer(batch.dense[name], np.int64))
            for attr, codes in (("cat_codes", out.cats), ("name_codes", out.names)):
                local = getattr(batch, "cats" if attr == "cat_codes" else "names")
                parts.setdefault(attr, []).append(
                    remap(local, codes)[np.frombuffer(getattr(batch, attr), np.int32)]
                )
            rare_rows.append(np.frombuffer(batch.rare_rows, np.int64) + offset)
            for name, _ in _RARE:
                out.rare[name] += batch.rare[name]
            out.has_collective |= batch.has_collective
            out.gloo += [(row + offset, d, t) for row, d, t in batch.gloo]
            out.string_ids += [(row + offset, a, v) for row, a, v in batch.string_ids]
            offset += n
        if offset:
            out.ts, out.dur, out.pid, out.tid = (
                np.concatenate(parts[a]) for a in ("ts", "dur", "pid", "tid")
            )
            out.dense = {name: np.concatenate(parts[name]) for name in _DENSE_ARGS}
            out.cat_codes = np.concatenate(parts["cat_codes"])
            out.name_codes = np.concatenate(parts["name_codes"])
            out.rare_rows = np.concatenate(rare_rows)
        return out

    def frame(self) -> pd.DataFrame:
        """The columns as a DataFrame; strings become categoricals (few distinct names)."""
        pid = np.frombuffer(self.pid, dtype=np.int64)
        tid = np.frombuffer(self.tid, dtype=np.int64)
        for row, attr, value in self.string_ids:
            (pid if attr == "pid" else tid)[row] = self.ids(value)
        ts = np.frombuffer(self.ts, dtype=np.float64)
        dur = np.frombuffer(self.dur, dtype=np.float64)
        columns: dict[str, Any] = {
            "ts": ts,
            "dur": dur,
            "pid": pid,
            "tid": tid,
            "cat": self.cats.categorical(np.frombuffer(self.cat_codes, dtype=np.int32)),
            "name": self.names.categorical(np.frombuffer(self.name_codes, dtype=np.int32)),
            **{name: np.frombuffer(self.dense[name], dtype=np.int64) for name in _DENSE_ARGS},
            "end": ts + dur,
        }
        if self.has_collective:
            rows = np.frombuffer(self.rare_rows, dtype=np.int64)
            for name, kind in _RARE:
                values = self.rare[name]
                if kind == "int":
                    column = np.full(len(ts), MISSING, dtype=np.int64)
                    column[rows] = [MISSING if v is None else v for v in values]
                    columns[name] = column
                else:
                    columns[name] = _sparse_categorical(len(ts), rows, values)
        frame = pd.DataFrame(columns, copy=False)
        if self.names.watched:
            frame["cpu_coll_bytes"] = _gloo_payload(len(ts), self.gloo)
        return frame


_GLOO_SIZES = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8, "long int": 8, "int": 4}


def _gloo_payload(n: int, rows: list[tuple[int, bytes, bytes]]) -> np.ndarray:
    """Bytes of CPU (gloo) collectives, from their recorded input shapes and types."""
    nbytes = np.full(n, MISSING, dtype=np.int64)
    for row, raw_dims, raw_types in rows:
        try:
            dims = msgspec.json.decode(raw_dims)
            types = msgspec.json.decode(raw_types) if raw_types else []
        except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
            continue
        if not (isinstance(dims, list) and dims and isinstance(dims[0], list)):
            continue
        shape = dims[0]
        if not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d < _INT64 for d in shape
        ):
            continue  # not a shape: left unknown
        numel = math.prod(shape)
        kind = types[0] if isinstance(types, list) and types else "float"
        size = _GLOO_SIZES.get(kind, 4) if isinstance(kind, str) else 4
        if numel * size < _INT64:
            nbytes[row] = numel * size
    return nbytes


def _read_blocks(path: Path, on_progress: Callable[[int], None] | None) -> Iterator[bytes]:
    """The file's (gunzipped) bytes in blocks, read ahead on a helper thread."""
    raw = _open(path)  # closed by the reader thread
    is_gzip = raw.read(2) == b"\x1f\x8b"
    raw.seek(0)
    stream = gzip.GzipFile(fileobj=raw, mode="rb") if is_gzip else raw
    blocks: queue.Queue = queue.Queue(maxsize=3)
    stop = threading.Event()

    def reader() -> None:
        text = 0  # bytes of text read so far
        try:
            while not stop.is_set():
                block = stream.read(_BLOCK)
                text += len(block)
                if is_gzip and text > GZIP_RATIO_FLOOR and text > GZIP_MAX_RATIO * raw.tell():
                    blocks.put(
                        UserError(
                            f"{path}: expands to over {GZIP_MAX_RATIO}x its compressed size "
                            f"({text >> 20} MB of text from {raw.tell() >> 10} KB so far; "
                            "Kineto traces expand 8-20x): a gzip bomb? refused"
                        )
                    )
                    return
                blocks.put((block, raw.tell()))
                if not block:
                    return
        except (EOFError, zlib.error, gzip.BadGzipFile):
            blocks.put(_gzip_error(path))
        except OSError as exc:
            blocks.put(UserError(f"{path}: cannot read ({exc.strerror or exc})"))
        finally:
            stream.close()
            raw.close()

    thread = threading.Thread(target=reader, name="fsdp-trace-reader", daemon=True)
    thread.start()
    try:
        while True:
            item = blocks.get()
            if isinstance(item, UserError):
                raise item
            block, offset = item
            if on_progress is not None:
                on_progress(offset)
            if not block:
                return
            yield block
    finally:
        stop.set()
        while thread.is_alive():  # unblock a reader waiting on a full queue
            try:
                blocks.get_nowait()
            except queue.Empty:
                thread.join(0.01)


_UTF8_BOM = b"\xef\xbb\xbf"
_UTF8_SLICE = 1 << 20  # non-ASCII text is checked this much at a time (bounds the str made)


def _encoding(head: bytes) -> str | None:
    """UTF-16 or UTF-32 JSON, told by a byte-order mark or by the NULs around its first
    (ASCII) characters (RFC 4627 §3); None for anything else."""
    if head.startswith((b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")):
        return "UTF-32"
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "UTF-16"
    if len(head) < 4:
        return None
    zero = [b == 0 for b in head[:4]]
    if zero in ([True, True, True, False], [False, True, True, True]):
        return "UTF-32"
    if zero in ([True, False, True, False], [False, True, False, True]):
        return "UTF-16"
    return None


def _text(path: Path, blocks: Iterator[bytes]) -> Iterator[bytes]:
    """`blocks`, checked as they pass to be UTF-8 (RFC 8259: JSON text is UTF-8): UTF-16/32
    and invalid UTF-8 (anywhere, even in fields nobody reads) are refused, naming the byte.
    ASCII blocks (nearly all of a Kineto trace) cost one `isascii` scan."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    offset = 0  # bytes of text before `block`
    for block in blocks:
        if offset == 0:
            encoding = _encoding(block[:4])
            if encoding is not None:
                raise UserError(
                    f"{path}: {encoding} text: Kineto traces are UTF-8 JSON; convert it "
                    f"(iconv -f {encoding} -t UTF-8) or re-export the trace"
                )
        for start in range(0, len(block), _UTF8_SLICE):
            piece = block[start : start + _UTF8_SLICE]
            pending = decoder.getstate()[0]
            if not pending and piece.isascii():
                continue
            try:
                decoder.decode(piece)
            except UnicodeDecodeError as exc:
                at = offset + start - len(pending) + exc.start
                bad = (pending + piece)[exc.start]
                raise UserError(
                    f"{path}: not UTF-8 text (byte 0x{bad:02x} at byte {at}): Kineto traces "
                    "are UTF-8; re-export the trace"
                ) from None
        offset += len(block)
        yield block
    pending = decoder.getstate()[0]
    if pending:
        raise UserError(
            f"{path}: not UTF-8 text (a sequence cut short at byte {offset - len(pending)}): "
            "is the file complete?"
        )


def _parse(path: Path, progress: bool | None, parallel: bool | None = None) -> Trace:
    if parallel is None:
        parallel = _parallel_worth_it(path)
    helper = _Helper() if parallel else None  # forked before the progress bar's thread starts
    with _ProgressBar(path, progress) as on_progress:
        done = _stream_parallel(path, on_progress, helper) if helper is not None else None
        if done is None:
            columns = _Columns()
            parsed = _stream(path, columns, on_progress)
        else:
            parsed, columns = done
    if parsed.traceEvents is None:
        raise UserError(f"{path}: no 'traceEvents' key: not a Kineto trace (unknown layout)")
    if not columns.raw_count:
        raise UserError(f"{path}: 'traceEvents' is empty: the profiler recorded nothing")
    if not len(columns):
        raise UserError(f"{path}: no complete ('X') events: unknown or empty trace layout")
    frame = columns.frame()
    ns = parsed.displayTimeUnit == "ns"
    if ns:  # Perfetto reads such a trace's ts and dur in ns; Kineto writes µs ("ms" here)
        for column in ("ts", "dur", "end"):
            frame[column] = frame[column] / 1000.0
    frame, notices = validate.events(path, frame)
    if ns:
        notices.append(
            'displayTimeUnit "ns": timestamps and durations read as nanoseconds (as '
            "Perfetto reads them), not Kineto's microseconds"
        )
    if columns.too_big:
        counts = ", ".join(f"{_INT_KEYS.get(k, k)} ×{n}" for k, n in columns.too_big.items())
        notices.append(
            f"{sum(columns.too_big.values())} integer arguments beyond int64 were read as "
            f"absent ({counts})"
        )
    info = validate.distributed_info(parsed.distributedInfo)
    notices += info.notices
    device_props, dropped = validate.plain_items(parsed.deviceProperties)
    if dropped:
        notices.append(f"{dropped} deviceProperties entries of the wrong shape were ignored")
    base_time = parsed.baseTimeNanoseconds
    if base_time is not None and not 0 <= base_time < _INT64:
        notices.append(f"baseTimeNanoseconds {base_time} is not a time: ignored")
        base_time = None
    return Trace(
        path=str(path),
        events=frame,
        rank=info.rank,
        world_size=info.world_size,
        distributed=info.clean,
        device_properties=device_props,
        base_time_ns=base_time,
        thread_names=columns.thread_names,
        process_names=columns.process_names,
        string_ids=columns.ids.ids,
        raw_event_count=columns.raw_count,
        python_events=columns.python_events,
        input_dims=columns.input_dims,
        notices=notices,
    )


def _blank_limit_error(path: Path) -> UserError:
    return UserError(f"{path}: over {_LOOKAHEAD >> 20} MB of blank space and no JSON: not a trace")


def _after_header(path: Path, blocks: Iterator[bytes]) -> tuple[str, bytes, Iterator[bytes], int]:
    """Read `blocks` up to where the events start: (kind, text, rest, skipped).

    - ("events", header, rest, skipped): `header` is the text up to and including
      `"traceEvents": [` (or the `[` of a bare list of events), `rest` the event text after it
      then the remaining blocks;
    - ("whole", data, nothing, skipped): a file of another layout, read to its end (under the
      look-ahead bound): decode it at once, for its content or its exact error.

    `skipped`: the blank bytes (and UTF-8 byte-order mark) before the text. What shows
    neither within _LOOKAHEAD bytes is refused: memory never grows with the input."""
    held: list[bytes] = []
    size = skipped = 0
    start = b""  # the first byte after the blanks
    for block in blocks:
        if not start:
            if skipped == 0 and block.startswith(_UTF8_BOM):
                block, skipped = block[3:], 3
            text = block.lstrip()
            skipped += len(block) - len(text)
            if not text:
                if skipped > _LOOKAHEAD:
                    raise _blank_limit_error(path)
                continue
            block, start = text, text[:1]
            if start == b"[":  # a bare list of events (an older Chrome-trace layout)
                return "events", b"[", chain([block[1:]], blocks), skipped
        held.append(block)
        size += len(block)
        if start == b"{":
            text = b"".join(held)
            match = _EVENTS_KEY.search(text)
            if match is not None:
                return "events", text[: match.end()], chain([text[match.end() :]], blocks), skipped
            held = [text]
        if size > _LOOKAHEAD:
            if start == b"{":
                raise UserError(
                    f'{path}: no "traceEvents" array within the first {_LOOKAHEAD >> 20} MB: '
                    "not a Kineto trace (unknown layout)"
                )
            head = b"".join(held)[:16]
            raise UserError(f"{path}: not valid JSON (it starts {head!r}): not a Kineto trace")
    if not start:
        raise UserError(f"{path}: empty file: not a Kineto trace")
    return "whole", b"".join(held), iter(()), skipped


def _stream(path: Path, columns: _Columns, on_progress) -> _TraceFile:
    """Decode the file piece by piece into `columns`; returns the top-level fields."""
    blocks = _read_blocks(path, on_progress)
    text_blocks = _text(path, blocks)
    try:
        kind, text, rest, skipped = _after_header(path, text_blocks)
        if kind == "whole":
            # Another layout (or an empty or broken file), small: decode it at once, which
            # also gives the right error message.
            _check_one_events_key(path, [text])
            parsed = _decode(path, text, skipped)
            del text
            if parsed.traceEvents is not None:
                _add_all(columns, parsed.traceEvents)
                parsed.traceEvents = []
            return parsed
        pieces = _Pieces(path, columns, skipped + len(text))
        buf = b""
        for block in rest:
            buf = buf + block if buf else block
            buf = pieces.decode(buf)
        # The last events, the closing ']' and the keys after it, under the header's keys.
        _check_one_events_key(path, [text, buf])
        shift = pieces.offset - len(text)  # tail bytes: where they are in the file
        parsed = _decode(path, text + buf, shift, columns.raw_count)
        _add_all(columns, parsed.traceEvents or [])
        parsed.traceEvents = []
        return parsed
    finally:
        text_blocks.close()
        blocks.close()


def _parallel_worth_it(path: Path) -> bool:
    """Two processes decode large files (one is enough for small ones, or on one core)."""
    if (os.cpu_count() or 1) < 2 or os.environ.get("FSDP_TRACE_LOAD_PROCESSES") == "1":
        return False
    return raw_size(path) >= PARALLEL_MIN_BYTES


def _decode_batch(text: bytes, tables: tuple[_Codes, _Codes]) -> _Columns:
    """One batch of whole events (no brackets) as columns; metadata ids are given later.
    `tables`: this process's category and name codes, shared by its batches."""
    columns = _Columns(defer_metadata=True, tables=tables)
    rest = _Pieces(Path("batch"), columns).decode(text)
    if rest.strip():
        columns.add(_LIST_DECODER.decode(b"[" + rest + b"]"))
    return columns


def _helper(tasks, results) -> None:
    """The second decoding process: batches in, columns out (None: a batch failed); last,
    its string tables (the codes of its batches), then None. A batch is its text (gzip), or
    where it lies in a plain file, which this process then reads itself: the text never
    crosses the pipe."""
    tables = (_Codes(), _Codes(watch="gloo:"))
    files: dict[str, Any] = {}
    try:
        while True:
            item = tasks.get()
            if item is None:
                results.put(("tables", list(tables[0]), list(tables[1])))
                results.put(None)
                return
            index, text = item
            try:
                if isinstance(text, tuple):  # (path, start, end) of a plain file
                    name, start, end = text
                    if name not in files:
                        files[name] = open_regular(name)
                    text = _read_range(files[name], start, end)
                batch = _decode_batch(text, tables)
                batch.cats = batch.names = None  # type: ignore[assignment]  (sent at the end)
                results.put((index, batch))
            except Exception:  # the main process falls back to decoding serially
                results.put((index, None))
    finally:
        for handle in files.values():
            handle.close()


def _read_range(handle, start: int, end: int) -> bytes:
    """Bytes [start, end) of an open plain file, checked to be UTF-8 (ValueError if not:
    the serial path then names the byte)."""
    text = os.pread(handle.fileno(), end - start, start)
    if len(text) != end - start:
        raise ValueError("the file changed while it was read")
    if not text.isascii():
        text.decode("utf-8")  # a cut is always at an ASCII brace: no sequence is split
    return text


class _Helper:
    """The second decoding process and its queues, started at once (a fork is safest before
    this process starts any thread)."""

    def __init__(self) -> None:
        import multiprocessing as mp

        methods = mp.get_all_start_methods()
        context = mp.get_context("fork" if "fork" in methods else methods[0])
        self.tasks = context.Queue(maxsize=2)
        self.results = context.Queue()
        self.process = context.Process(target=_helper, args=(self.tasks, self.results))
        self.process.daemon = True
        self.process.start()

    def close(self) -> None:
        if self.process.is_alive():
            self.process.terminate()
        self.process.join()
        self.tasks.cancel_join_thread()  # batches left unsent (after an error) are dropped
        self.tasks.close()
        self.results.close()


class _HelperResults:
    """The decoding helper's finished batches as they arrive, and its string tables."""

    def __init__(self, process, results) -> None:
        self.process, self.results = process, results
        self.batches: dict[int, _Columns | None] = {}
        self.ids: set[int] = set()  # the batches the helper decoded
        self.tables: list[list[str]] = [[], []]
        self.done = False

    def collect(self, block: bool) -> None:
        """Take the helper's finished batches (all of them, up to its end mark, if block)."""
        while not self.done:
            try:
                item = self.results.get(timeout=1.0) if block else self.results.get_nowait()
            except queue.Empty:
                if not block:
                    return
                if not self.process.is_alive():
                    raise RuntimeError("the decoding helper died") from None
                continue
            if item is None:
                self.done = True
            elif item[0] == "tables":
                self.tables[:] = item[1:]
            else:
                self.batches[item[0]] = item[1]
                self.ids.add(item[0])

    def finish(self, path, header: bytes, tail: bytes, tables, sent: int, tasks):
        """Decode the last batch here (`header` + `tail`), wait for the helper's, and merge
        every batch in order, each naming its own process's string tables; None where a
        batch failed (the serial path then says why)."""
        _check_one_events_key(path, [header, tail])
        parsed = _decode(path, header + tail)
        last = _Columns(defer_metadata=True, tables=tables)
        _add_all(last, parsed.traceEvents or [])
        parsed.traceEvents = []
        self.batches[sent] = last
        tasks.put(None)
        self.collect(block=True)
        if any(self.batches.get(i) is None for i in range(sent + 1)):
            return None
        mine = [list(tables[0]), list(tables[1])]
        for i in range(sent + 1):
            batch = self.batches[i]
            strings = self.tables if i in self.ids else mine
            batch.cats, batch.names = strings  # type: ignore[assignment,union-attr]
        return parsed, _Columns.merge([self.batches[i] for i in range(sent + 1)])  # type: ignore[misc]


def _stream_parallel(
    path: Path, on_progress, helper: _Helper | None = None
) -> tuple[_TraceFile, _Columns] | None:
    """Decode with a helper process taking batches whenever it is free (the main process
    decodes the others); None when the file needs the serial path (odd layout, or a batch
    that would not decode: the serial path then gives the exact error). A plain file is cut
    into batches by offsets that each process reads itself; gzip's text is sent to the
    helper."""
    helper = helper or _Helper()
    with _open(path) as raw:
        plain = raw.read(2) != b"\x1f\x8b"
    if plain:
        return _stream_parallel_plain(path, on_progress, helper)
    tasks, results = helper.tasks, helper.results
    received = _HelperResults(helper.process, results)
    batches = received.batches
    collect = received.collect
    tables = (_Codes(), _Codes(watch="gloo:"))  # this process's batches' string codes

    sent = 0
    blocks = _read_blocks(path, on_progress)
    text_blocks = _text(path, blocks)
    try:
        kind, header, rest, _ = _after_header(path, text_blocks)
        if kind == "whole":
            return None  # an unusual layout: the serial path decodes it whole
        buf = b""
        for block in rest:
            buf = buf + block if buf else block
            pos = 0
            while len(buf) - pos > _BATCH:
                cut = _BOUNDARY.search(buf, pos + _BATCH)
                if cut is None:
                    break
                text = buf[pos : cut.start() + 1]
                pos = cut.end() - 1
                index = sent
                sent += 1
                try:
                    tasks.put_nowait((index, text))  # the helper is free: its batch
                except queue.Full:  # the helper is busy: ours
                    try:
                        batches[index] = _decode_batch(text, tables)
                    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError, UserError):
                        return None  # the serial path finds the real error (or the cut)
                    collect(block=False)
            buf = buf[pos:]
            if len(buf) > _LOOKAHEAD + _BLOCK:
                return None  # no event ends in it: the serial path says why
        return received.finish(path, header, buf, tables, sent, tasks)
    except RuntimeError:
        return None
    finally:
        text_blocks.close()
        blocks.close()
        helper.close()


def _batch_edges(handle, start: int, size: int, step: int) -> list[tuple[int, int]] | None:
    """The event boundaries that cut a plain file's events into batches: the first one at
    or after each multiple of `step` past `start` (each batch is then `step` bytes or a
    little more), the last one at least `step` bytes before the end (the rest, with the keys
    after the events, is decoded with the header); each as (end of the event before it,
    start of the event after it). None when no boundary shows within the look-ahead bound
    (the serial path then says why)."""
    edges: list[tuple[int, int]] = []
    window = 1 << 16
    nominal = start + step
    while nominal + step < size:
        at, found = nominal, None
        while found is None and at - nominal < _LOOKAHEAD and at < size:
            chunk = os.pread(handle.fileno(), window + 8, at)
            found = _BOUNDARY.search(chunk)
            if found is None:
                at += window
        if found is None:
            return None
        edges.append((at + found.start() + 1, at + found.end() - 1))  # after `}`, at `{`
        nominal = max(nominal + step, edges[-1][1] + 1)
    return edges


def _stream_parallel_plain(
    path: Path, on_progress, helper: _Helper
) -> tuple[_TraceFile, _Columns] | None:
    """`_stream_parallel` for a plain (not gzip) file: the main process reads the header,
    cuts the events into batches at event boundaries by offset, and each process reads and
    decodes the batches it takes (the helper whenever it is free); the rest, after the last
    cut, is decoded with the header (its top-level keys)."""
    tasks, results = helper.tasks, helper.results
    received = _HelperResults(helper.process, results)
    batches = received.batches
    collect = received.collect
    tables = (_Codes(), _Codes(watch="gloo:"))  # this process's batches' string codes

    blocks = _read_blocks(path, None)
    text_blocks = _text(path, blocks)
    try:
        try:
            kind, header, _, skipped = _after_header(path, text_blocks)
        finally:
            text_blocks.close()
            blocks.close()
        if kind == "whole":
            return None  # an unusual layout: the serial path decodes it whole
        with _open(path) as handle:
            size = os.fstat(handle.fileno()).st_size
            edges = _batch_edges(handle, skipped + len(header), size, _BATCH)
            if edges is None:
                return None
            starts = [skipped + len(header)] + [after for _, after in edges]
            ends = [before for before, _ in edges]
            sent = len(edges)
            for index, (start, end) in enumerate(zip(starts, ends, strict=False)):
                try:
                    tasks.put_nowait((index, (str(path), start, end)))  # the helper is free
                except queue.Full:  # the helper is busy: ours
                    try:
                        text = _read_range(handle, start, end)
                        batches[index] = _decode_batch(text, tables)
                    except (msgspec.DecodeError, RecursionError, ValueError, UserError):
                        return None  # the serial path finds the real error (or the cut)
                    collect(block=False)
                if on_progress is not None:
                    on_progress(end)
            try:
                tail = _read_range(handle, starts[-1], size)
            except ValueError:
                return None
        if len(tail) > _LOOKAHEAD + _BATCH:
            return None
        return received.finish(path, header, tail, tables, sent, tasks)
    except RuntimeError:
        return None
    finally:
        helper.close()


def _add_all(columns: _Columns, events: list[_Event]) -> None:
    for i in range(0, len(events), 2048):
        columns.add(events[i : i + 2048])


class _Pieces:
    """Cuts the `traceEvents` text into pieces at event boundaries and decodes them.
    `offset`: where in the file the text given to `decode` next starts."""

    def __init__(self, path: Path, columns: _Columns, offset: int = 0) -> None:
        self.path = path
        self.columns = columns
        self.size = _PIECE
        self.offset = offset

    def decode(self, buf: bytes) -> bytes:
        """Decode every whole piece at the front of `buf`; returns the rest. A rest past the
        look-ahead bound (no event ends within it) is refused."""
        pos = 0
        while len(buf) - pos > self.size:
            match = _BOUNDARY.search(buf, pos + self.size)
            if match is None:
                break
            try:
                events = _LIST_DECODER.decode(b"[" + buf[pos : match.start() + 1] + b"]")
            except RecursionError as exc:
                raise _decode_error(self.path, exc, self.offset + pos) from None
            except (msgspec.DecodeError, UnicodeDecodeError) as exc:  # ValidationError too
                # The cut fell inside an event (a `},{` within its args): take a larger piece.
                # Past the look-ahead bound it is a real error (else the end of the file
                # shows it when the rest is decoded, `_stream`).
                self.size *= 2
                if self.size > _LOOKAHEAD:
                    raise _decode_error(
                        self.path, exc, self.offset + pos - 1, self.columns.raw_count
                    ) from None
                continue
            self.columns.add(events)
            del events
            pos = match.end() - 1
            self.size = _PIECE
        self.offset += pos
        rest = buf[pos:]
        if len(rest) > _LOOKAHEAD + _BLOCK:
            raise _no_event_end(self.path, rest, self.offset, self.columns.raw_count)
        return rest


def _no_event_end(path: Path, text: bytes, offset: int, events_before: int) -> UserError:
    """The error for event text in which no event ends within the look-ahead bound: what
    decoding it says (nested too deeply, an invalid character), else that it holds no end."""
    try:
        _LIST_DECODER.decode(b"[" + text[:_LOOKAHEAD])
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as exc:
        if not (isinstance(exc, msgspec.DecodeError) and "truncated" in str(exc)):
            return _decode_error(path, exc, offset - 1, events_before)
    return UserError(
        f"{path}: not valid JSON: no event ends within {_LOOKAHEAD >> 20} MB after byte "
        f"{offset}: not a Kineto trace (or an event larger than this reader takes)"
    )


def wants_progress(raw: int) -> bool:
    """Whether `raw` bytes of JSON get a progress bar (loading one file, or analyzing several):
    more than PROGRESS_MIN_BYTES, stderr a terminal, and FSDP_TRACE_QUIET unset."""
    return (
        raw > PROGRESS_MIN_BYTES and sys.stderr.isatty() and not os.environ.get("FSDP_TRACE_QUIET")
    )


class _ProgressBar:
    """A rich progress bar on stderr for large files when stderr is a terminal."""

    def __init__(self, path: Path, enabled: bool | None) -> None:
        self.progress = None
        try:
            size = path.stat().st_size
        except OSError:
            size = 0
        if enabled is None:
            enabled = wants_progress(raw_size(path))
        if enabled and size:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            self.progress = Progress(
                TextColumn("loading {task.description}"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            from rich.markup import escape

            from fsdp_trace.printable import printable

            self.task = self.progress.add_task(escape(printable(path.name)), total=size)

    def __enter__(self) -> Callable[[int], None] | None:
        if self.progress is None:
            return None
        self.progress.start()
        return lambda done: self.progress.update(self.task, completed=done)

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()


def load_trace(
    path: str | Path,
    cache: bool = True,
    progress: bool | None = None,
    parallel: bool | None = None,
    *,
    content: str | None = None,
) -> Trace:
    """Parse one Kineto trace. Bad input raises UserError with a one-line message.

    `cache`: reuse (and store) the parsed columns keyed by the file's content, under
    $FSDP_TRACE_CACHE_DIR or ~/.cache/fsdp-trace (see `fsdp_trace.analysis.read.cache`).
    `progress`: a progress bar on stderr; None shows it for large files on a terminal.
    `parallel`: decode with a second process; None does for large files on 2+ cores.
    `content`: the file's `cache.content_hash`, when the caller has it (saves hashing again).
    """
    from fsdp_trace.analysis.read import cache as cache_mod

    path = Path(path)
    _check_path(path)
    entry = cache_mod.TraceEntry.for_file(path, content) if cache and cache_mod.enabled() else None
    trace = entry.load(path) if entry is not None else None
    if trace is None:
        trace = _parse(path, progress, parallel)
        if entry is not None:
            entry.store(trace)
    if trace.rank is None:
        trace.rank = rank_from_name(path)
    return trace
