"""A trace file as UTF-8 text, in blocks: plain or gzip (by its magic bytes), read ahead on a
helper thread when larger than a block (zlib releases the GIL, so gunzipping runs beside the
decoder), with the bounds
that keep a hostile file from costing unbounded memory: only regular files are opened (a FIFO
is refused, not waited on); UTF-16/32 and invalid UTF-8 are refused naming the byte; a gzip
file expanding past GZIP_MAX_RATIO is refused; and nothing is held beyond LOOKAHEAD bytes while
looking for the `traceEvents` array (`after_header`)."""

from __future__ import annotations

import codecs
import errno
import gzip
import math
import os
import queue
import re
import stat
import threading
import zlib
from collections.abc import Callable, Iterator
from itertools import chain
from pathlib import Path

from fsdp_trace.errors import UserError
from fsdp_trace.runrecord import NotRegularFile, open_regular

BLOCK = 8 << 20  # bytes read (or gunzipped) at a time

# Look-ahead bound: the most text held while looking for what must come next (the
# `"traceEvents": [` key, the end of an event, the end of a file decoded whole). Kineto's
# header is a few KB and an event well under a megabyte; a file that keeps neither promise in
# this many bytes is refused, so memory never grows with a hostile (or gzip-bomb) input.
LOOKAHEAD = 16 << 20

GZIP_RATIO_GUESS = 10  # raw / compressed size of Kineto JSON (8-13 seen), when ISIZE is ambiguous
# A gzip file whose text grows past this many times the compressed bytes read so far (once
# past the floor) is refused: Kineto JSON expands 8-20x; a gzip bomb of valid events, 300x or
# more, would otherwise be decoded whole (1.5 GB of events from 5 MB).
GZIP_MAX_RATIO = 100
DEFLATE_MAX_RATIO = 1032  # the most deflate can expand (258-byte matches in 2-bit codes)
GZIP_RATIO_FLOOR = 64 << 20


def gzip_text_limit(compressed: int) -> int:
    """The most text taken from `compressed` bytes of gzip (or of an archive member): more
    is refused as a bomb."""
    return max(GZIP_RATIO_FLOOR, GZIP_MAX_RATIO * compressed)


EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')


def raw_size(path: Path) -> int:
    """Bytes of JSON in the file: its size, or for gzip the size its trailer records (ISIZE,
    the raw size mod 4 GiB), taken as the candidate nearest a typical compression ratio, and
    no more than the reader takes from a file of that size (past it, `read_blocks` refuses
    a gzip bomb) nor deflate can give (a cut file's last bytes, read as a trailer, claim
    anything); 0 when unreadable (or not a regular file)."""
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
    nearest = min(candidates, key=lambda c: abs(math.log(c / guess)))
    return min(nearest, gzip_text_limit(size), DEFLATE_MAX_RATIO * size)


def cannot_read(path: Path, exc: OSError) -> UserError:
    """The one-line error for an input the system will not read (permissions, I/O)."""
    return UserError(f"{path}: cannot read ({exc.strerror or exc})")


def check_path(path: Path) -> None:
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise UserError(f"{path}: no such file") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a loop of symbolic links
            raise UserError(f"{path}: no such file (a loop of symbolic links)") from None
        raise cannot_read(path, exc) from None
    if stat.S_ISDIR(mode):
        raise UserError(f"{path}: is a directory, not a trace file")
    if not stat.S_ISREG(mode):
        raise UserError(f"{path}: not a regular file (a FIFO, device or socket): give a trace file")


def _gzip_error(path: Path) -> UserError:
    return UserError(f"{path}: truncated or corrupt gzip: re-copy or re-export the trace")


def open_trace(path: Path):
    """The file opened for reading, refused unless it is a regular file."""
    try:
        return open_regular(path)
    except NotRegularFile:
        raise UserError(
            f"{path}: not a regular file (a FIFO, device or socket): give a trace file"
        ) from None
    except OSError as exc:
        raise cannot_read(path, exc) from None


def read_blocks(path: Path, on_progress: Callable[[int], None] | None) -> Iterator[bytes]:
    """The file's (gunzipped) bytes in blocks: read ahead on a helper thread, except a plain
    file of one block or less, read here (nothing to read ahead of: a thread's start and two
    hand-overs are ~1 ms, a sixth of a 1.6 MB rank's load)."""
    raw = open_trace(path)
    try:
        is_gzip = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        one_block = not is_gzip and os.fstat(raw.fileno()).st_size <= BLOCK
    except OSError as exc:
        raw.close()
        raise cannot_read(path, exc) from None
    if one_block:
        yield from _read_here(path, raw, on_progress)
    else:
        yield from _read_ahead(path, raw, is_gzip, on_progress)


def _read_here(path: Path, raw, on_progress: Callable[[int], None] | None) -> Iterator[bytes]:
    """`raw`'s blocks read in this thread (a file that grew since its size was read is read
    to its end all the same)."""
    with raw:
        while True:
            try:
                block = raw.read(BLOCK)
            except OSError as exc:
                raise cannot_read(path, exc) from None
            if on_progress is not None:
                on_progress(raw.tell())
            if not block:
                return
            yield block


def _read_ahead(
    path: Path, raw, is_gzip: bool, on_progress: Callable[[int], None] | None
) -> Iterator[bytes]:
    """`raw`'s (gunzipped) blocks read ahead on a helper thread (zlib releases the GIL), with
    the gzip bomb's bound."""
    stream = gzip.GzipFile(fileobj=raw, mode="rb") if is_gzip else raw
    blocks: queue.Queue = queue.Queue(maxsize=3)
    stop = threading.Event()

    def reader() -> None:
        text = 0  # bytes of text read so far
        try:
            while not stop.is_set():
                block = stream.read(BLOCK)
                text += len(block)
                if is_gzip and text > gzip_text_limit(raw.tell()):
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
            blocks.put(cannot_read(path, exc))
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


def utf8_checked(path: Path, blocks: Iterator[bytes]) -> Iterator[bytes]:
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
        if not decoder.getstate()[0] and block.isascii():  # the whole block, not copied
            offset += len(block)
            yield block
            continue
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


def _blank_limit_error(path: Path) -> UserError:
    return UserError(f"{path}: over {LOOKAHEAD >> 20} MB of blank space and no JSON: not a trace")


def after_header(path: Path, blocks: Iterator[bytes]) -> tuple[str, bytes, Iterator[bytes], int]:
    """Read `blocks` up to where the events start: (kind, text, rest, skipped).

    - ("events", header, rest, skipped): `header` is the text up to and including
      `"traceEvents": [` (or the `[` of a bare list of events), `rest` the event text after it
      then the remaining blocks;
    - ("whole", data, nothing, skipped): a file of another layout, read to its end (under the
      look-ahead bound): decode it at once, for its content or its exact error.

    `skipped`: the blank bytes (and UTF-8 byte-order mark) before the text. What shows
    neither within LOOKAHEAD bytes is refused: memory never grows with the input."""
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
                if skipped > LOOKAHEAD:
                    raise _blank_limit_error(path)
                continue
            block, start = text, text[:1]
            if start == b"[":  # a bare list of events (an older Chrome-trace layout)
                return "events", b"[", chain([block[1:]], blocks), skipped
        held.append(block)
        size += len(block)
        if start == b"{":
            text = b"".join(held)
            match = EVENTS_KEY.search(text)
            if match is not None:
                return "events", text[: match.end()], chain([text[match.end() :]], blocks), skipped
            held = [text]
        if size > LOOKAHEAD:
            if start == b"{":
                raise UserError(
                    f'{path}: no "traceEvents" array within the first {LOOKAHEAD >> 20} MB: '
                    "not a Kineto trace (unknown layout)"
                )
            head = b"".join(held)[:16]
            raise UserError(f"{path}: not valid JSON (it starts {head!r}): not a Kineto trace")
    if not start:
        raise UserError(f"{path}: empty file: not a Kineto trace")
    return "whole", b"".join(held), iter(()), skipped
