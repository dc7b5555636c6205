"""The decoded shape of a Kineto trace (msgspec structs holding only the fields the analysis
reads), the decoding of its text with errors that name the place in the file, and `Pieces`,
which cuts the `traceEvents` text at event boundaries and hands each piece's events to the
columns (`fsdp_trace.analysis.read.columns`) at once, so decoded structs never all live at
once."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Protocol

import msgspec

from fsdp_trace.analysis.read.text import BLOCK, LOOKAHEAD
from fsdp_trace.analysis.read.trace import MISSING
from fsdp_trace.errors import UserError

PIECE = 256 << 10  # bytes of events decoded at a time: the structs of a piece stay in cache
# Bytes read at a time by a compiled reader (which makes no structs): fewer calls, fewer cuts.
COMPILED_PIECE = 2 << 20


class Args(msgspec.Struct, gc=False, frozen=True):
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


NO_ARGS = Args()  # shared by every event without args (structs are never mutated)
COMPLETE = "X"  # complete events' phase
_UNSEEN = object()  # a dict lookup's default: not seen before


class Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float | None = None
    dur: float | None = None
    args: Args | None = NO_ARGS


class TraceFile(msgspec.Struct):
    traceEvents: list[Event] | None = None
    schemaVersion: Any = None
    deviceProperties: Any = None
    distributedInfo: dict[str, Any] | None = None
    baseTimeNanoseconds: int | None = None
    traceName: str | None = None
    displayTimeUnit: Any = None  # "ns": timestamps in ns (Perfetto's reading); else µs


DECODER = msgspec.json.Decoder(TraceFile)
LIST_DECODER = msgspec.json.Decoder(list[Event])
EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
BOUNDARY = re.compile(rb"\}\s*,\s*\{")  # between two events (checked by decoding the piece)
DROPPED_CATEGORIES = frozenset({"python_function", "Trace"})

_MSGSPEC_BYTE = re.compile(r"\(byte (\d+)\)")
_MSGSPEC_INDEX = re.compile(r"`\$(\.traceEvents)?\[(\d+)\]")


def _where(message: str, offset: int, events_before: int) -> str:
    """msgspec's positions in a piece of text as positions in the file: byte offsets shifted
    by where the piece starts, event indices by the events before it."""
    message = _MSGSPEC_BYTE.sub(lambda m: f"(byte {int(m.group(1)) + offset})", message)
    return _MSGSPEC_INDEX.sub(
        lambda m: f"`$.traceEvents[{int(m.group(2)) + events_before}]", message
    )


def decode_error(
    path: Path, exc: BaseException, offset: int = 0, events_before: int = 0
) -> UserError:
    """The one-line error for text that does not decode (offset: where the text starts in the
    file, less one for a `[` put before a piece)."""
    if isinstance(exc, RecursionError):
        return UserError(
            f"{path}: JSON nested too deeply (past byte {max(offset, 0)}): not a Kineto trace"
        )
    if isinstance(exc, UnicodeDecodeError):  # prevented by `utf8_checked`; kept as a safety net
        return UserError(f"{path}: not UTF-8 text: Kineto traces are UTF-8; re-export the trace")
    reason = _where(str(exc), offset, events_before)
    if isinstance(exc, msgspec.ValidationError):
        return UserError(f"{path}: not a Kineto trace layout ({reason})")
    return UserError(f"{path}: not valid JSON ({reason}): is the file complete?")


def decode(path: Path, data: bytes, offset: int = 0, events_before: int = 0) -> TraceFile:
    """The top-level object (or a bare list of events) in `data`, which starts `offset` bytes
    into the file after `events_before` events."""
    if not data.strip():
        raise UserError(f"{path}: empty file: not a Kineto trace")
    try:
        return DECODER.decode(data)
    except msgspec.ValidationError as exc:
        # A bare list of events is an older Chrome-trace layout; accept it.
        if data.lstrip()[:1] == b"[":
            try:
                return TraceFile(traceEvents=LIST_DECODER.decode(data))
            except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as inner:
                if not isinstance(inner, msgspec.ValidationError):
                    raise decode_error(path, inner, offset, events_before) from None
        raise decode_error(path, exc, offset, events_before) from None
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as exc:
        raise decode_error(path, exc, offset, events_before) from None


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


def check_one_events_key(path: Path, texts: list[bytes]) -> None:
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


class Beside(Protocol):
    """A reader of one piece at a time on a thread of its own, beside the caller's
    (`fsdp_trace.analysis.read.columns.SecondReader`)."""

    def start(self, text: bytes, start: int, stop: int) -> None: ...

    def forget(self) -> None:
        """Its piece is not taken: the text is cut anew."""
        ...


class Sink(Protocol):
    """Where decoded events go, piece by piece (`fsdp_trace.analysis.read.columns.Columns`):
    named here so the decoding knows nothing of the columns."""

    raw_count: int  # events taken so far: decoding errors count from it
    piece_bytes: int  # the size of the pieces it takes best (PIECE, or COMPILED_PIECE)
    second: Beside | None  # reads every other piece, where on

    def take_second(self) -> bool:
        """Take the piece `second` read (after the one before it); False when it declined
        (then it is read again here, and decoded if declined again)."""
        ...

    def add(self, events: list[Event]) -> None: ...

    def add_text(self, text: bytes, start: int, stop: int) -> bool:
        """Take the events of text[start:stop] without decoding them here; False when the
        sink declines (then they are decoded and given to `add`)."""
        ...


def add_all(columns: Sink, events: list[Event]) -> None:
    for i in range(0, len(events), 2048):
        columns.add(events[i : i + 2048])


class Pieces:
    """Cuts the `traceEvents` text into pieces at event boundaries and decodes them.
    `offset`: where in the file the text given to `decode` next starts."""

    def __init__(self, path: Path, columns: Sink, offset: int = 0) -> None:
        self.path = path
        self.columns = columns
        self.piece = columns.piece_bytes
        self.size = self.piece
        self.offset = offset

    def decode(self, buf: bytes) -> bytes:
        """Decode every whole piece at the front of `buf`; returns the rest. A rest past the
        look-ahead bound (no event ends within it) is refused. With a second reader, the
        piece after each one is read beside it, cut where it would be cut after it."""
        pos = 0
        second = self.columns.second
        while len(buf) - pos > self.size:
            match = BOUNDARY.search(buf, pos + self.size)
            if match is None:
                break
            after = match.end() - 1
            beside = None
            if second is not None and len(buf) - after > self.piece:
                following = BOUNDARY.search(buf, after + self.piece)
                if following is not None:
                    beside = following.end() - 1
                    second.start(buf, after, following.start() + 1)
            if not self._piece(buf, pos, match.start() + 1):  # cut inside an event
                if beside is not None:
                    second.forget()
                continue
            pos = after
            self.size = self.piece
            if beside is not None and self.columns.take_second():
                pos = beside
        self.offset += pos
        rest = buf[pos:]
        if len(rest) > LOOKAHEAD + BLOCK:
            raise _no_event_end(self.path, rest, self.offset, self.columns.raw_count)
        return rest

    def _piece(self, buf: bytes, start: int, stop: int) -> bool:
        """Take the events of buf[start:stop]: the compiled reader's, else msgspec's. False
        when the cut fell inside an event (a `},{` within its args): the piece size is
        doubled for the caller to cut again; past the look-ahead bound it is a real error
        (else the end of the file shows it when the rest is decoded, `_stream`)."""
        if self.columns.add_text(buf, start, stop):
            return True
        try:
            events = LIST_DECODER.decode(b"[" + buf[start:stop] + b"]")
        except RecursionError as exc:
            raise decode_error(self.path, exc, self.offset + start) from None
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:  # ValidationError too
            self.size *= 2
            if self.size > LOOKAHEAD:
                raise decode_error(
                    self.path, exc, self.offset + start - 1, self.columns.raw_count
                ) from None
            return False
        self.columns.add(events)
        return True


def _no_event_end(path: Path, text: bytes, offset: int, events_before: int) -> UserError:
    """The error for event text in which no event ends within the look-ahead bound: what
    decoding it says (nested too deeply, an invalid character), else that it holds no end."""
    try:
        LIST_DECODER.decode(b"[" + text[:LOOKAHEAD])
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as exc:
        if not (isinstance(exc, msgspec.DecodeError) and "truncated" in str(exc)):
            return decode_error(path, exc, offset - 1, events_before)
    return UserError(
        f"{path}: not valid JSON: no event ends within {LOOKAHEAD >> 20} MB after byte "
        f"{offset}: not a Kineto trace (or an event larger than this reader takes)"
    )
