"""Decoded events into columns: each piece's structs become compact C arrays at once (C-level
`map` over attribute getters, no per-event Python code); strings become categorical codes as
they arrive; Python-stack events (with_stack traces hold ~9 of them per operator), flows and
other non-complete events are dropped on the way. Timestamps stay exact floats (µs with ns
fractions). `Columns.frame` makes the events' DataFrame (`fsdp_trace.analysis.read.readers`
lists its columns). `Columns.add_text` takes a piece's text with the compiled reader instead
(`_fastread.c`), to the same columns."""

from __future__ import annotations

import math
import os
import queue
import threading
from array import array
from itertools import chain, compress, repeat
from operator import attrgetter, is_, is_not
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from fsdp_trace.analysis.read import events as events_mod
from fsdp_trace.analysis.read.events import COMPLETE, DROPPED_CATEGORIES, NO_ARGS, Args, Event
from fsdp_trace.analysis.read.trace import MISSING

_UNSEEN = object()  # a dict lookup's default: not seen before
INT64 = 1 << 63

# The compiled reader's interface version: a shared library built from another version of
# _fastread.c (an editable install not rebuilt) is not used.
COMPILED_VERSION = 4
try:  # the compiled reader (built with the package where a C compiler was at hand)
    from fsdp_trace.analysis.read import _fastread
except ImportError:  # pragma: no cover - depends on the installation
    _CompiledReader = None
else:
    _CompiledReader = _fastread.Reader if _fastread.VERSION == COMPILED_VERSION else None

READER_ENV = "FSDP_TRACE_READER"  # "python": decode every piece with msgspec (tests, bisecting)


def compiled_module() -> str | None:
    """The compiled reader's file (a shared library); None where it is not built."""
    return None if _CompiledReader is None else _fastread.__file__


def compiled_reader() -> bool:
    """Whether pieces of events are read by the compiled reader (`_fastread.c`): built, and
    not turned off with FSDP_TRACE_READER=python."""
    return _CompiledReader is not None and os.environ.get(READER_ENV, "") != "python"


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
# The columns the compiled reader's pieces carry as bytes (besides the dense arguments').
_PIECE_COLUMNS = (
    ("ts", np.float64),
    ("dur", np.float64),
    ("pid", np.int64),
    ("tid", np.int64),
    ("cat_codes", np.int32),
    ("name_codes", np.int32),
    ("rare_rows", np.int64),
)
_get = {name: attrgetter(name) for name in ("ph", "cat", "name", "pid", "tid", "ts", "dur", "args")}
_get_arg = {name: attrgetter(name) for name in (*_DENSE_ARGS, *(r for r, _ in _RARE))}
_get_rare = attrgetter(*(r for r, _ in _RARE))
_get_dense = attrgetter(*_DENSE_ARGS)
_get_input_dims = attrgetter("input_dims")

# JSON names of the integer columns, for notices.
INT_KEYS = {
    "correlation": "correlation",
    "external_id": "External id",
    "sequence_number": "Sequence number",
    "stream": "stream",
    "in_nelems": "In msg nelems",
    "out_nelems": "Out msg nelems",
    "group_size": "Group size",
    "seq": "Seq",
}


def fits(value: int) -> bool:
    return -INT64 <= value < INT64


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
        if fits(value):
            return value
        return self.ids.setdefault(str(value), -2 - len(self.ids))


class Codes(dict):
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
        remap, names = self._sorted()
        if not names:
            empty = pd.Index([], dtype=str)
            return pd.Categorical.from_codes(np.full(codes.size, -1, np.int8), categories=empty)
        codes = remap[codes]  # code -1 (None) reads remap[-1] == -1
        return _categorical(_narrow(codes), names)

    def sparse_categorical(self, n: int, rows: np.ndarray, codes: np.ndarray) -> pd.Categorical:
        """`categorical` of a column of `n` rows holding `codes` at `rows` (missing
        elsewhere), its codes in the narrowest integer type from the start: the column is
        mostly absent, and a full int32 array costs 4x the memory traffic."""
        remap, names = self._sorted()
        out = np.full(n, -1, dtype=_narrow(np.array([len(names)])).dtype)
        out[rows] = remap[codes]  # code -1 (absent) and None's read -1
        return _categorical(out, names)

    def _sorted(self) -> tuple[np.ndarray, list[str]]:
        """The strings (None left out) sorted, and each code's place among them (-1 for
        None's, and at the end, for code -1)."""
        names = [k for k in self if k is not None]
        order = np.argsort(np.asarray(names, dtype=object), kind="stable")
        remap = np.full(len(self) + 1, -1, dtype=np.int32)
        first = np.asarray([self[k] for k in names], dtype=np.int64)
        remap[first[order]] = np.arange(len(names), dtype=np.int32)
        return remap, [names[i] for i in order.tolist()]


def _recoded(
    codes: Codes, remap: np.ndarray, ids: bytes, new: list[tuple[int, str]]
) -> tuple[np.ndarray, bytes]:
    """The compiled reader's string ids as `codes`' codes (int32 bytes), the strings it names
    for the first time coded in order of first use, as `Codes.codes` codes them; returns the
    grown id -> code map too."""
    if new:
        top = max(local for local, _ in new) + 1
        if top > remap.size:
            remap = np.concatenate([remap, np.full(top - remap.size, -1, np.int32)])
        for local, name in new:
            remap[local] = codes.code(name)
    return remap, remap[np.frombuffer(ids, np.int32)].tobytes()


def _coded(codes: Codes, places: bytes, strings: list[str]) -> bytes:
    """A rare text field of a compiled reader's piece (each row's place in `strings`, the
    strings the piece names, int32 bytes, -1 where absent) as `codes`' codes (int32 bytes,
    -1 where absent)."""
    if not strings:
        return places  # every row absent: -1 each
    lookup = np.array([codes.code(text) for text in strings] + [-1], np.int32)  # [-1]: -1
    return lookup[np.frombuffer(places, np.int32)].tobytes()


# The categories of text columns made lately, by their names: every rank of a job names the
# same operators, kernels and NCCL arguments, and making the dtype (an Index of the names,
# checked distinct) costs more than the column it types.
_DTYPES: dict[tuple[str, ...], pd.CategoricalDtype] = {}
DTYPES_KEPT = 32  # a job's ranks share ~9 (the name, cat and argument columns')


def _categorical(codes: np.ndarray, names) -> pd.Categorical:
    """A Categorical of `codes` (each one -1, missing, or a place in `names`: they are made
    so, and not checked again) into `names` (text, sorted and distinct)."""
    key = tuple(names)
    dtype = _DTYPES.get(key)
    if dtype is None:
        if len(_DTYPES) >= DTYPES_KEPT:
            _DTYPES.clear()
        dtype = _DTYPES[key] = pd.CategoricalDtype(pd.Index(key, dtype=str))
    return pd.Categorical.from_codes(codes, dtype=dtype, validate=False)


def _narrow(codes: np.ndarray) -> np.ndarray:
    top = int(codes.max()) if codes.size else 0
    for dtype in (np.int8, np.int16, np.int32):
        if top < np.iinfo(dtype).max:
            return codes.astype(dtype, copy=False)
    return codes


class SecondReader:
    """A second compiled reader on a thread of its own: while the caller's thread reads one
    piece, this one reads the next (the reader releases the GIL: two cores, about half the
    time on a large file). Its string ids are its own, mapped to the columns' codes as its
    pieces are taken, in file order. One piece at a time: `start`, then `result` (taken with
    `Columns.take_second`) or `forget`."""

    def __init__(self) -> None:
        assert _CompiledReader is not None
        self.reader = _CompiledReader()
        self.cat_remap = np.empty(0, np.int32)
        self.name_remap = np.empty(0, np.int32)
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._busy = False
        self._thread = threading.Thread(
            target=self._run, name="fsdp-trace-second-reader", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while (piece := self._work.get()) is not None:
            text, start, stop = piece
            try:
                self._done.put((self.reader.parse(text, start, stop), None))
            except BaseException as exc:  # MemoryError: raised on the caller's thread
                self._done.put((None, exc))

    def start(self, text: bytes, start: int, stop: int) -> None:
        """Read text[start:stop] on the thread."""
        assert not self._busy
        self._busy = True
        self._work.put((text, start, stop))

    def result(self) -> dict[str, Any] | None:
        """The piece's columns once read (None: declined, left to msgspec)."""
        assert self._busy
        got, exc = self._done.get()
        self._busy = False
        if exc is not None:
            raise exc
        return got

    def forget(self) -> None:
        """The piece read is not taken (the caller cut the text anew)."""
        got = self.result()
        if got is not None:
            self.reader.forget(got["new_cats"], got["new_names"])

    def close(self) -> None:
        """Stop the thread once its piece (if any) is read; the reader goes with it, so a
        piece read and not taken needs no `forget` (nor a wait for its result, which an
        interrupt between `start`'s steps may never bring)."""
        self._work.put(None)
        self._thread.join()


class Columns:
    """Columns of the complete events, filled piece by piece from decoded structs."""

    def __init__(
        self, defer_metadata: bool = False, tables: tuple[Codes, Codes] | None = None
    ) -> None:
        self.defer_metadata = defer_metadata  # a batch: ids are given when batches merge
        self.metadata: list[tuple[str, int | str, int | str, str]] = []
        self.ts = array("d")
        self.dur = array("d")
        self.pid = array("q")
        self.tid = array("q")
        self.dense = {name: array("q") for name in _DENSE_ARGS}
        self.cats, self.names = tables or (Codes(), Codes(watch="gloo:"))
        self.cat_codes = array("i")
        self.name_codes = array("i")
        self.rare_rows = array("q")
        # The rare fields' values at the rare rows: integers (MISSING where absent), or for
        # text (and raw JSON text) the codes of their strings in the field's own table.
        self.rare: dict[str, array] = {
            name: array("q" if kind == "int" else "i") for name, kind in _RARE
        }
        self.rare_text = {name: Codes() for name, kind in _RARE if kind != "int"}
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
        # The compiled reader, and its string ids' codes in `cats` / `names` (-1: not yet).
        self.reader = _CompiledReader() if compiled_reader() else None
        self.cat_remap = np.empty(0, np.int32)
        self.name_remap = np.empty(0, np.int32)
        # Its pieces, held as they came and appended in one go (`_flush`): appending each
        # piece's few KB to the arrays regrows and copies them ~8 times over.
        self.pending: list[dict[str, Any]] = []
        self.pending_rows = 0
        self.second: SecondReader | None = None  # `read_beside`
        self.framed = False  # made into a frame (`frame`): its columns are the frame's now

    def __len__(self) -> int:
        return len(self.ts) + self.pending_rows

    @property
    def piece_bytes(self) -> int:
        return events_mod.PIECE if self.reader is None else events_mod.COMPILED_PIECE

    def __getstate__(self) -> dict[str, Any]:
        self._flush()
        state = self.__dict__.copy()
        state["reader"] = None  # holds C memory; a batch crossing processes is only merged
        state["second"] = None
        return state

    def read_beside(self) -> None:
        """Read every other piece on a second thread (`SecondReader`), where there is a
        compiled reader (it releases the GIL while it reads)."""
        if self.reader is not None and self.second is None:
            self.second = SecondReader()

    def close(self) -> None:
        """Stop the second thread, if any (its pieces are all taken or forgotten)."""
        second, self.second = self.second, None
        if second is not None:
            second.close()

    def _open(self) -> None:
        """Refuse a piece (or a second frame) once the columns are a frame's."""
        if self.framed:
            raise RuntimeError("these columns were made into a frame: nothing more is taken")

    def _flush(self) -> None:
        """Append the compiled reader's pieces held so far to the columns."""
        if not self.pending:
            return
        pieces, self.pending, self.pending_rows = self.pending, [], 0
        for key, _ in _PIECE_COLUMNS:
            getattr(self, key).frombytes(b"".join([piece[key] for piece in pieces]))
        for j, name in enumerate(_DENSE_ARGS):
            self.dense[name].frombytes(b"".join([piece["dense"][j] for piece in pieces]))

    def _flush_last(self) -> None:
        """`_flush` for the last time (`frame`): each column and its pieces held so far made
        one numpy array, one copy where `_flush` takes two (the pieces joined, then copied
        into the array: ~25 ms at 900,000 events). The columns are numpy arrays after it,
        as after `merge`."""
        if not self.pending:
            return
        pieces, self.pending, self.pending_rows = self.pending, [], 0

        def joined(column, parts: list[bytes], dtype) -> np.ndarray:
            arrays = [np.frombuffer(column, dtype)] if len(column) else []
            return np.concatenate(arrays + [np.frombuffer(p, dtype) for p in parts])

        for key, dtype in _PIECE_COLUMNS:
            setattr(self, key, joined(getattr(self, key), [p[key] for p in pieces], dtype))
        for j, name in enumerate(_DENSE_ARGS):
            parts = [piece["dense"][j] for piece in pieces]
            self.dense[name] = joined(self.dense[name], parts, np.int64)

    def add_text(self, text: bytes, start: int, stop: int) -> bool:
        """Take the events of `text[start:stop]` (whole events separated by commas) with the
        compiled reader, exactly as `add` takes them decoded; False (nothing taken) when
        there is no compiled reader or the piece is not its plain case, which then goes to
        msgspec and `add` (values of unexpected types, integers beyond int64, string ids of
        complete events, escaped keys: see `_fastread.c`)."""
        if self.reader is None:
            return False
        got = self.reader.parse(text, start, stop)
        if got is None:
            return False
        self.take(got)
        return True

    def take_second(self) -> bool:
        """The piece the second reader read (`SecondReader.start`) into the columns, in file
        order, as `take` takes the first reader's; False where it declined the piece."""
        assert self.second is not None
        got = self.second.result()
        if got is None:
            return False
        self.take(got, self.second)
        return True

    def read_last(self, text: bytes) -> tuple[int, dict[str, Any]] | None:
        """The events at the start of `text` up to the closing bracket of their array, read
        by the compiled reader but not yet taken (`take` them once the text after the
        bracket proves it closes the top-level `traceEvents`): (where the bracket is, what
        the reader made of them); None when there is no compiled reader or it declines.
        The last call of the reader on these columns."""
        if self.reader is None:
            return None
        got = self.reader.parse(text, 0, len(text), True)
        return None if got is None else (got["closed"], got)

    def take(self, got: dict[str, Any], side: Columns | SecondReader | None = None) -> None:
        """What the compiled reader made of a piece (`add_text`, `read_last`), into the
        columns. `side`: the reader whose string ids these are (their maps to codes): these
        columns' own, or the second one."""
        self._open()
        side = side or self
        self.raw_count += got["raw_count"]
        self._names(got["metadata"])
        self.python_events += got["python_events"]
        if not got["rows"]:
            return
        row0 = len(self)
        side.cat_remap, got["cat_codes"] = _recoded(
            self.cats, side.cat_remap, got["cat_ids"], got["new_cats"]
        )
        side.name_remap, got["name_codes"] = _recoded(
            self.names, side.name_remap, got["name_ids"], got["new_names"]
        )
        self.input_dims = self.input_dims or got["input_dims"]
        self.has_collective = self.has_collective or got["has_collective"]
        rare_rows = np.frombuffer(got["rare_rows"], np.int64)
        if rare_rows.size:
            got["rare_rows"] = (rare_rows + row0).tobytes()
            for (name, kind), values in zip(_RARE, got["rare"], strict=True):
                if kind == "int":
                    self.rare[name].frombytes(values)
                else:
                    self.rare[name].frombytes(_coded(self.rare_text[name], *values))
        self.gloo += [(row0 + row, dims, kind) for row, dims, kind in got["gloo"]]
        self.pending.append(got)
        self.pending_rows += got["rows"]

    def add(self, events: list[Event]) -> None:
        """Take one piece of decoded events (in file order)."""
        self._open()
        self._flush()
        self.raw_count += len(events)
        phases = list(map(_get["ph"], events))
        if phases.count(COMPLETE) != len(events):
            if "M" in phases:
                self._metadata(list(compress(events, map("M".__eq__, phases))))
            events = list(compress(events, map(COMPLETE.__eq__, phases)))
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
            args = [NO_ARGS if a is None else a for a in args]
        if not self.input_dims:
            self.input_dims = any(map(_get_input_dims, args))
        try:  # the four dense columns in one pass over the args, as rows of 4 (the struct
            # types them int or None: `fromiter` of a known count fills one buffer, no growing)
            dense = np.fromiter(
                chain.from_iterable(map(_get_dense, args)), np.int64, len(args) * len(_DENSE_ARGS)
            )
        except (TypeError, OverflowError):  # None, or integers beyond int64
            for name in _DENSE_ARGS:
                values = map(_get_arg[name], args)
                self.dense[name] += array("q", [self._int(name, v) for v in values])
        else:
            rows = dense.reshape(-1, len(_DENSE_ARGS))
            for j, name in enumerate(_DENSE_ARGS):
                self.dense[name].frombytes(rows[:, j].tobytes())
        self._rare(args, row0)
        if self.names.watched and not self.names.watched.isdisjoint(name_codes):
            for i, code in enumerate(name_codes):
                if code in self.names.watched and args[i].input_dims:
                    a = args[i]
                    self.gloo.append((row0 + i, bytes(a.input_dims), bytes(a.input_type)))

    def _rare(self, args: list[Args], row0: int) -> None:
        """Collective arguments of the events that carry a `Collective name` and of GPU events
        (those with a stream), the only rows that read them; other rows keep them absent."""
        n = len(args)
        names = list(map(_get_arg["collective_name"], args))
        named = names.count(None) != n
        wanted = np.frombuffer(self.dense["stream"], dtype=np.int64)[row0 : row0 + n] >= 0
        if named:
            self.has_collective = True
            wanted |= np.fromiter(map(is_not, names, repeat(None)), bool, n)
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
                self.rare[name] += self.rare_text[name].codes(found)
            elif kind == "int":
                present = list(filter(None, values))  # zeros and absent ones fit anyway
                if present and not (fits(max(present)) and fits(min(present))):
                    values = tuple(self._int(name, v) for v in values)
                self.rare[name] += array("q", [MISSING if v is None else v for v in values])
            else:
                self.rare[name] += self.rare_text[name].codes(values)

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
        if fits(value):
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
        if fits(value):
            return value
        self.string_ids.append((row, attr, str(value)))  # beyond int64: an id like a string's
        return 0

    def _metadata(self, events: list[Event]) -> None:
        self._names(
            [
                (e.name, e.pid, e.tid, e.args.name)
                for e in events
                if e.args is not None and e.args.name is not None
            ]
        )

    def _names(self, items: list[tuple[str, int | str, int | str, str]]) -> None:
        """Metadata events' (kind, pid, tid, name): thread and process names, or held for
        the merge of a batch."""
        if self.defer_metadata:
            self.metadata += items
            return
        for item in items:
            self._name_thread(*item)

    def _name_thread(self, kind: str, pid: int | str, tid: int | str, name: str) -> None:
        if kind == "thread_name":
            self.thread_names[(self.ids(pid), self.ids(tid))] = name
        elif kind == "process_name":
            self.process_names[self.ids(pid)] = name

    @classmethod
    def merge(cls, batches: list[Columns]) -> Columns:
        """Batches (in file order) as one set of columns, exactly as if loaded in one go."""
        out = cls()
        for batch in batches:  # metadata first: its string ids come before the events'
            for item in batch.metadata:
                out._name_thread(*item)
        offset = 0
        parts: dict[str, list[np.ndarray]] = {}
        rare_rows = []
        remaps: dict[int, np.ndarray] = {}  # per string table (batches of a process share one)

        def remap(local: list[str] | Codes, codes: Codes) -> np.ndarray:
            if id(local) not in remaps:
                remaps[id(local)] = np.array([codes.code(k) for k in local] + [-1], np.int32)
            return remaps[id(local)]

        for batch in batches:
            batch._flush()
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
            for name, kind in _RARE:
                values = np.frombuffer(batch.rare[name], np.int64 if kind == "int" else np.int32)
                if kind != "int":
                    values = remap(batch.rare_text[name], out.rare_text[name])[values]
                parts.setdefault(name, []).append(values)
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
            out.rare = {name: np.concatenate(parts[name]) for name, _ in _RARE}
        return out

    def frame(self) -> pd.DataFrame:
        """The columns as a DataFrame; strings become categoricals (few distinct names).
        Once: the frame holds the columns (no copy), so nothing more is taken after it."""
        self._open()
        self.framed = True
        self._flush_last()
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
                if kind == "int":
                    column = np.full(len(ts), MISSING, dtype=np.int64)
                    column[rows] = np.frombuffer(self.rare[name], np.int64)
                    columns[name] = column
                else:
                    codes = np.frombuffer(self.rare[name], np.int32)
                    columns[name] = self.rare_text[name].sparse_categorical(len(ts), rows, codes)
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
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d < INT64 for d in shape
        ):
            continue  # not a shape: left unknown
        numel = math.prod(shape)
        kind = types[0] if isinstance(types, list) and types else "float"
        size = _GLOO_SIZES.get(kind, 4) if isinstance(kind, str) else 4
        if numel * size < INT64:
            nbytes[row] = numel * size
    return nbytes
