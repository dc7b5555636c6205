"""The parse floor: a typed, streaming msgspec decode of a trace, and nothing else.

    python benchmarks/parse_floor.py /tmp/big/rank0.json
    python benchmarks/parse_floor.py /tmp/tiny300/rank*.json   # several files, one by one

It is the yardstick for `fsdp-trace analyze` on one large file (benchmarks/results/speed.md):
what it costs only to read the file and decode the fields the analysis needs into msgspec
Structs, streaming through the file the way the loader does (8 MB blocks read on a helper
thread, the `traceEvents` array cut at event boundaries into 256 KB pieces, each piece decoded
into typed Structs and dropped). No columns, no analysis, no output, one process, nothing of
fsdp-trace imported: the Structs below repeat the loader's field list so that the floor stays a
floor if the loader changes. A gzip file is gunzipped on the reader thread, as the loader does.
Prints events decoded and seconds on stderr (the whole process is what benchmarks time).
"""

from __future__ import annotations

import gzip
import queue
import re
import sys
import threading
import time

import msgspec

BLOCK = 8 << 20
PIECE = 256 << 10
MISSING = -1


class Args(msgspec.Struct, gc=False, frozen=True):
    """The `args` fields the analysis reads (fsdp_trace/analysis/read/events.py `Args`)."""

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
    name: str | None = None
    grid: msgspec.Raw = msgspec.Raw(b"")
    block: msgspec.Raw = msgspec.Raw(b"")
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input type")


class Event(msgspec.Struct, gc=False):
    """One trace event's fields the analysis reads."""

    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float | None = None
    dur: float | None = None
    args: Args | None = None


class Tail(msgspec.Struct):
    """The end of the file: the last events and the top-level keys after them."""

    traceEvents: list[Event] = []


DECODER = msgspec.json.Decoder(list[Event])
TAIL = msgspec.json.Decoder(Tail)
EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
BOUNDARY = re.compile(rb"\}\s*,\s*\{")


def blocks(path: str):
    """The file's (gunzipped) bytes in blocks, read ahead on a helper thread."""
    raw = open(path, "rb")  # noqa: SIM115 (closed when the reader ends)
    stream = gzip.GzipFile(fileobj=raw) if raw.read(2) == b"\x1f\x8b" else raw
    raw.seek(0)
    ahead: queue.Queue = queue.Queue(maxsize=3)

    def reader() -> None:
        with raw, stream:
            while True:
                block = stream.read(BLOCK)
                ahead.put(block)
                if not block:
                    return

    threading.Thread(target=reader, daemon=True).start()
    while block := ahead.get():
        yield block


def decode(path: str) -> int:
    """Decode every event of the file piece by piece; returns how many were decoded."""
    count = 0
    buf = b""
    started = False
    for block in blocks(path):
        buf = buf + block if buf else block
        if not started:
            match = EVENTS_KEY.search(buf)
            if match is None:
                continue
            buf, started = buf[match.end() :], True
        pos, size = 0, PIECE
        while len(buf) - pos > size:
            cut = BOUNDARY.search(buf, pos + size)
            if cut is None:
                break
            try:
                count += len(DECODER.decode(b"[" + buf[pos : cut.start() + 1] + b"]"))
            except msgspec.DecodeError:  # the cut fell inside an event: a larger piece
                size *= 2
                continue
            pos, size = cut.end() - 1, PIECE
        buf = buf[pos:]
    # The last events, the closing bracket and the keys after it, under the object's brace.
    count += len(TAIL.decode(b'{"traceEvents": [' + buf).traceEvents)
    return count


if __name__ == "__main__":
    start = time.perf_counter()
    n = sum(decode(path) for path in sys.argv[1:])  # several files: one after the other
    print(f"{n} events decoded in {time.perf_counter() - start:.2f} s", file=sys.stderr)
