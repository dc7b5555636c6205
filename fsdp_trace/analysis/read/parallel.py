"""Large files decoded by two processes: a forked helper takes batches of events (BATCH bytes)
whenever it is free, the main process decodes the rest, and the batches are merged in file
order into exactly the columns one process would build. A plain file is cut by offsets that
each process reads itself; gzip's text is sent to the helper. Any batch that does not decode
sends the file down the one-process path (`fsdp_trace.analysis.read.loader`), which reports
the real error."""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
from pathlib import Path
from typing import Any

import msgspec

from fsdp_trace.analysis.read.columns import Codes, Columns, compiled_reader
from fsdp_trace.analysis.read.events import (
    BOUNDARY,
    COMPILED_PIECE,
    LIST_DECODER,
    Pieces,
    TraceFile,
    add_all,
    check_one_events_key,
    decode,
)
from fsdp_trace.analysis.read.text import (
    BLOCK,
    LOOKAHEAD,
    after_header,
    open_trace,
    raw_size,
    read_blocks,
    utf8_checked,
)
from fsdp_trace.errors import UserError
from fsdp_trace.runrecord import open_regular

BATCH = 8 << 20  # bytes of events per batch of the two-process decode
# Files of this much raw JSON and more are decoded by two processes. Below it the second
# process costs more than it gives: its interpreter and imports (~80 MB of RSS) and the
# batches' transfer, for a second or less saved (measured in benchmarks/results/speed.md).
PARALLEL_MIN_BYTES = 256 << 20
# The longest the main process waits on the helper without a word from it: a batch decodes in
# well under a second, so a helper silent this long is stuck (a lock another thread held at
# the fork), and the file goes down the one-process path instead of hanging the command.
STALL_SECONDS = 60.0
KILL_AFTER_SECONDS = 5.0  # a helper SIGTERM has not ended by then is killed


# Files of this much raw JSON and more are read by two threads where the compiled reader is
# (`Columns.read_beside`): four of its pieces, so that the thread's start (~0.1 ms) is
# repaid many times over.
BESIDE_MIN_BYTES = 4 * COMPILED_PIECE


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the system says, as a batch
    scheduler's cgroup sets it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1  # pragma: no cover - macOS, Windows


def one_core() -> bool:
    return usable_cores() < 2 or os.environ.get("FSDP_TRACE_LOAD_PROCESSES") == "1"


def parallel_worth_it(path: Path) -> bool:
    """Two processes decode large files (one is enough for small ones, or on one core)."""
    if one_core():
        return False
    if compiled_reader():  # it reads faster than a second process's batches are merged
        return False
    return raw_size(path) >= PARALLEL_MIN_BYTES


def beside_worth_it(path: Path) -> bool:
    """A second thread reads every other piece of a large file, where the compiled reader is
    (it releases the GIL; merging a second process's batches costs more than it gives)."""
    return not one_core() and compiled_reader() and raw_size(path) >= BESIDE_MIN_BYTES


def _decode_batch(text: bytes, tables: tuple[Codes, Codes]) -> Columns:
    """One batch of whole events (no brackets) as columns; metadata ids are given later.
    `tables`: this process's category and name codes, shared by its batches."""
    columns = Columns(defer_metadata=True, tables=tables)
    rest = Pieces(Path("batch"), columns).decode(text)
    if rest.strip() and not columns.add_text(rest, 0, len(rest)):
        columns.add(LIST_DECODER.decode(b"[" + rest + b"]"))
    return columns


def _helper(tasks, answers) -> None:
    """The second decoding process: batches in, columns out (None: a batch failed); last,
    its string tables (the codes of its batches), then None. A batch is its text (gzip), or
    where it lies in a plain file, which this process then reads itself: the text never
    crosses the pipe. Answers go out on `answers` (this process holds its only write end)
    from a thread of their own, so that decoding goes on while the main process is busy."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the command's handler is not for this process
    tables = (Codes(), Codes(watch="gloo:"))
    files: dict[str, Any] = {}
    outbox: queue.SimpleQueue = queue.SimpleQueue()

    def send() -> None:
        while True:
            item = outbox.get()
            answers.send(item)
            if item is None:
                return

    sender = threading.Thread(target=send, name="fsdp-trace-answers", daemon=True)
    sender.start()
    try:
        while True:
            item = tasks.get()
            if item is None:
                outbox.put(("tables", list(tables[0]), list(tables[1])))
                outbox.put(None)
                sender.join()  # every answer sent whole before this process ends
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
                outbox.put((index, batch))
            except Exception:  # the main process falls back to decoding serially
                outbox.put((index, None))
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


class Helper:
    """The second decoding process, its task queue and the pipe of its answers, started at
    once (a fork is safest before this process starts any thread). This process closes its
    copy of the answers' write end: a helper that dies, even halfway through an answer, is
    an end of file here, never a wait."""

    def __init__(self, target=None) -> None:
        """`target`: the helper's function, `_helper` (tests give stuck and dying ones)."""
        import multiprocessing as mp

        methods = mp.get_all_start_methods()
        context = mp.get_context("fork" if "fork" in methods else methods[0])
        self.tasks = context.Queue(maxsize=2)
        self.answers, writer = context.Pipe(duplex=False)
        self.process = context.Process(target=target or _helper, args=(self.tasks, writer))
        self.process.daemon = True
        self.process.start()
        writer.close()

    def close(self) -> None:
        """End the helper (killed if SIGTERM does not end it within KILL_AFTER_SECONDS)."""
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(KILL_AFTER_SECONDS)
            if self.process.is_alive():
                self.process.kill()
        self.process.join()
        self.tasks.cancel_join_thread()  # batches left unsent (after an error) are dropped
        self.tasks.close()
        self.answers.close()


class _HelperResults:
    """The decoding helper's finished batches as they arrive, and its string tables."""

    def __init__(self, process, answers) -> None:
        self.process, self.answers = process, answers
        self.batches: dict[int, Columns | None] = {}
        self.ids: set[int] = set()  # the batches the helper decoded
        self.tables: list[list[str]] = [[], []]
        self.done = False

    def collect(self, block: bool) -> None:
        """Take the helper's finished batches (all of them, up to its end mark, if block).
        RuntimeError (the one-process path then) if the helper dies or says nothing for
        STALL_SECONDS."""
        heard = time.monotonic()
        while not self.done:
            if not self.answers.poll(1.0 if block else 0):
                if not block:
                    return
                if not self.process.is_alive():
                    raise RuntimeError("the decoding helper died")
                if time.monotonic() - heard > STALL_SECONDS:
                    raise RuntimeError("the decoding helper is stuck")
                continue
            try:
                item = self.answers.recv()
            except (EOFError, OSError):  # it died (halfway through an answer, maybe)
                raise RuntimeError("the decoding helper died") from None
            heard = time.monotonic()
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
        check_one_events_key(path, [header, tail])
        parsed = decode(path, header + tail)
        last = Columns(defer_metadata=True, tables=tables)
        add_all(last, parsed.traceEvents or [])
        parsed.traceEvents = []
        self.batches[sent] = last
        try:
            tasks.put(None, timeout=STALL_SECONDS)
        except queue.Full:
            raise RuntimeError("the decoding helper is stuck") from None
        self.collect(block=True)
        if any(self.batches.get(i) is None for i in range(sent + 1)):
            return None
        mine = [list(tables[0]), list(tables[1])]
        for i in range(sent + 1):
            batch = self.batches[i]
            strings = self.tables if i in self.ids else mine
            batch.cats, batch.names = strings  # type: ignore[assignment,union-attr]
        return parsed, Columns.merge([self.batches[i] for i in range(sent + 1)])  # type: ignore[misc]


def stream_parallel(
    path: Path, on_progress, helper: Helper | None = None
) -> tuple[TraceFile, Columns] | None:
    """Decode with a helper process taking batches whenever it is free (the main process
    decodes the others); None when the file needs the serial path (odd layout, or a batch
    that would not decode: the serial path then gives the exact error). A plain file is cut
    into batches by offsets that each process reads itself; gzip's text is sent to the
    helper."""
    helper = helper or Helper()
    with open_trace(path) as raw:
        plain = raw.read(2) != b"\x1f\x8b"
    if plain:
        return _stream_parallel_plain(path, on_progress, helper)
    tasks = helper.tasks
    received = _HelperResults(helper.process, helper.answers)
    batches = received.batches
    collect = received.collect
    tables = (Codes(), Codes(watch="gloo:"))  # this process's batches' string codes

    sent = 0
    blocks = read_blocks(path, on_progress)
    text_blocks = utf8_checked(path, blocks)
    try:
        kind, header, rest, _ = after_header(path, text_blocks)
        if kind == "whole":
            return None  # an unusual layout: the serial path decodes it whole
        buf = b""
        for block in rest:
            buf = buf + block if buf else block
            pos = 0
            while len(buf) - pos > BATCH:
                cut = BOUNDARY.search(buf, pos + BATCH)
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
            if len(buf) > LOOKAHEAD + BLOCK:
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
        while found is None and at - nominal < LOOKAHEAD and at < size:
            chunk = os.pread(handle.fileno(), window + 8, at)
            found = BOUNDARY.search(chunk)
            if found is None:
                at += window
        if found is None:
            return None
        edges.append((at + found.start() + 1, at + found.end() - 1))  # after `}`, at `{`
        nominal = max(nominal + step, edges[-1][1] + 1)
    return edges


def _stream_parallel_plain(
    path: Path, on_progress, helper: Helper
) -> tuple[TraceFile, Columns] | None:
    """`stream_parallel` for a plain (not gzip) file: the main process reads the header,
    cuts the events into batches at event boundaries by offset, and each process reads and
    decodes the batches it takes (the helper whenever it is free); the rest, after the last
    cut, is decoded with the header (its top-level keys)."""
    tasks = helper.tasks
    received = _HelperResults(helper.process, helper.answers)
    batches = received.batches
    collect = received.collect
    tables = (Codes(), Codes(watch="gloo:"))  # this process's batches' string codes

    blocks = read_blocks(path, None)
    text_blocks = utf8_checked(path, blocks)
    try:
        try:
            kind, header, _, skipped = after_header(path, text_blocks)
        finally:
            text_blocks.close()
            blocks.close()
        if kind == "whole":
            return None  # an unusual layout: the serial path decodes it whole
        with open_trace(path) as handle:
            size = os.fstat(handle.fileno()).st_size
            edges = _batch_edges(handle, skipped + len(header), size, BATCH)
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
        if len(tail) > LOOKAHEAD + BATCH:
            return None
        return received.finish(path, header, tail, tables, sent, tasks)
    except RuntimeError:
        return None
    finally:
        helper.close()
