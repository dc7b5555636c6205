"""The one trace loader: Kineto Chrome JSON (.json / .json.gz) into columnar arrays.

The stages, one module each:

- `text`: the file as UTF-8 blocks, plain or gzip (gunzipped on a helper thread, beside the
  decoder: zlib releases the GIL), read under the bounds that keep bad input cheap;
- `events`: the `traceEvents` array cut at event boundaries into small pieces, each decoded by
  msgspec into typed structs holding only the fields the analysis reads; decoding errors name
  their place in the file;
- `columns`: each piece's structs become compact C arrays at once and are freed before the next
  piece (decoded structs never all live at once, and stay in the CPU cache while read);
  strings become categorical codes; Python-stack events, flows and other non-complete events
  are dropped on the way; timestamps stay exact floats (µs with ns fractions);
- `_fastread.c` (where built: an optional C extension): the compiled reader, which takes the
  pieces' text straight into the same columns, with no struct made per event; a piece it does
  not take (anything but the plain case) goes to msgspec as above. FSDP_TRACE_READER=python
  turns it off;
- `parallel`: files of PARALLEL_MIN_BYTES and more decoded by two processes into exactly the
  columns one process builds (without the compiled reader, which reads faster alone); with
  it, files of BESIDE_MIN_BYTES and more read by two threads (`columns.SecondReader`: the
  compiled reader releases the GIL), to the same columns;

and this module runs them for one file: the cache first (`fsdp_trace.analysis.read.cache`:
parsed columns keyed by the file's content), then the parse, then
`fsdp_trace.analysis.read.validate` (impossible times, duplicates, shared correlation ids,
`distributedInfo` fields), whose notices the `Trace` carries.

Bad input is refused in one line (UserError), never with a traceback, a hang or unbounded
memory: only regular files are opened (a FIFO is refused, not waited on); the text must be
UTF-8 (UTF-16/32 and invalid bytes anywhere are refused, naming the byte; a UTF-8 byte-order
mark is skipped); nothing is held beyond a look-ahead of LOOKAHEAD bytes while looking for the
`traceEvents` array or the end of an event, so a gzip bomb costs what that window costs, and
no file is ever decoded whole unless it fits in it; nesting too deep for the decoder, two
`traceEvents` keys, and values of the wrong type are refused with their place in the file.
Integers beyond int64 are read as absent (pid/tid: ids like strings'), with a counted notice.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Callable
from pathlib import Path

from fsdp_trace.analysis.read import validate
from fsdp_trace.analysis.read.columns import INT64, INT_KEYS, Columns
from fsdp_trace.analysis.read.events import Pieces, TraceFile, add_all, check_one_events_key, decode
from fsdp_trace.analysis.read.parallel import (
    Helper,
    beside_worth_it,
    parallel_worth_it,
    stream_parallel,
)
from fsdp_trace.analysis.read.text import (
    after_header,
    check_path,
    raw_size,
    read_blocks,
    utf8_checked,
)
from fsdp_trace.analysis.read.trace import FORMAT_VERSION, MISSING, Trace, rank_from_name
from fsdp_trace.errors import UserError

__all__ = ["FORMAT_VERSION", "MISSING", "Trace", "load_trace", "rank_from_name", "raw_size"]

PROGRESS_MIN_BYTES = 50 * 1024 * 1024  # show a progress bar for larger files (raw JSON bytes)


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


def _parse(path: Path, progress: bool | None, parallel: bool | None = None) -> Trace:
    beside = False  # a second thread reads every other piece (the compiled reader)
    if parallel is None:
        parallel = parallel_worth_it(path)
        beside = not parallel and beside_worth_it(path)
    helper = Helper() if parallel else None  # forked before the progress bar's thread starts
    with _ProgressBar(path, progress) as on_progress:
        done = stream_parallel(path, on_progress, helper) if helper is not None else None
        if done is None:
            columns = Columns()
            if beside:
                columns.read_beside()
            try:
                parsed = _stream(path, columns, on_progress)
            finally:
                columns.close()
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
        counts = ", ".join(f"{INT_KEYS.get(k, k)} ×{n}" for k, n in columns.too_big.items())
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
    if base_time is not None and not 0 <= base_time < INT64:
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


def _stream(path: Path, columns: Columns, on_progress) -> TraceFile:
    """Decode the file piece by piece into `columns`; returns the top-level fields."""
    blocks = read_blocks(path, on_progress)
    text_blocks = utf8_checked(path, blocks)
    try:
        kind, text, rest, skipped = after_header(path, text_blocks)
        if kind == "whole":
            # Another layout (or an empty or broken file), small: decode it at once, which
            # also gives the right error message.
            check_one_events_key(path, [text])
            parsed = decode(path, text, skipped)
            del text
            if parsed.traceEvents is not None:
                add_all(columns, parsed.traceEvents)
                parsed.traceEvents = []
            return parsed
        pieces = Pieces(path, columns, skipped + len(text))
        buf = b""
        for block in rest:
            buf = buf + block if buf else block
            buf = pieces.decode(buf)
        # The last events, the closing ']' and the keys after it, under the header's keys.
        shift = pieces.offset - len(text)  # tail bytes: where they are in the file
        parsed = _last_compiled(path, columns, text, buf, shift)
        if parsed is not None:
            return parsed
        check_one_events_key(path, [text, buf])
        parsed = decode(path, text + buf, shift, columns.raw_count)
        add_all(columns, parsed.traceEvents or [])
        parsed.traceEvents = []
        return parsed
    finally:
        text_blocks.close()
        blocks.close()


# An event put where the compiled reader's last events were, to see where the keys after them
# put it: its phase is this process's own, which no trace holds.
_MARK = secrets.token_hex(8)


def _last_compiled(
    path: Path, columns: Columns, header: bytes, buf: bytes, shift: int
) -> TraceFile | None:
    """The last events read by the compiled reader and the keys after them decoded apart,
    when the bracket it stopped at closes the top-level `traceEvents` (decoded with a marker
    event in place of those events, that array holds the marker alone); else None, nothing
    taken: the whole tail is decoded with msgspec as before (a nested `traceEvents` the
    header's search found, or an error, named in its place in the file)."""
    last = columns.read_last(buf)
    if last is None:
        return None
    closed, got = last
    marker = b'{"ph":"%s"}' % _MARK.encode()
    try:
        parsed = decode(path, header + marker + buf[closed:], shift + closed - len(marker))
    except UserError:
        return None
    held = parsed.traceEvents or []
    if len(held) != 1 or held[0].ph != _MARK:
        return None
    # A second top-level `traceEvents` key is in the header or after the bracket: the events
    # between them (a thousand ranks' megabytes) need not be searched for one.
    check_one_events_key(path, [header, buf[closed:]])
    parsed.traceEvents = []
    columns.take(got)
    return parsed


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
    `parallel`: decode with a second process; None does for large files on 2+ cores (and,
    where the compiled reader is, reads files of 8 MB and more with a second thread); False:
    neither (one thread, as a worker of a pool of processes reads).
    `content`: the file's `cache.content_hash`, when the caller has it (saves hashing again).
    """
    from fsdp_trace.analysis.read import cache as cache_mod

    path = Path(path)
    check_path(path)
    entry = cache_mod.TraceEntry.for_file(path, content) if cache and cache_mod.enabled() else None
    trace = entry.load(path) if entry is not None else None
    if trace is None:
        trace = _parse(path, progress, parallel)
        if entry is not None:
            entry.store(trace)
    if trace.rank is None:
        trace.rank = rank_from_name(path)
    return trace
