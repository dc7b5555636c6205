"""Per-trace work: load and analyze one trace file (through the cache), and many of them at
once. This is the map step of the pipeline (`fsdp_trace.pipeline`): each trace is analyzed on
its own, and only its `RankAnalysis` comes back, without its kernels
(`RankAnalysis.without_kernels`): small tables, never the events; a small run analyzed without
the cache keeps them (`keeps_kernels`)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from fsdp_trace.analysis.rank.analyze import analyze_trace
from fsdp_trace.analysis.read import cache as cache_mod
from fsdp_trace.analysis.read import loader, remote
from fsdp_trace.analysis.read.inputs import TraceInput
from fsdp_trace.analysis.read.loader import raw_size, wants_progress
from fsdp_trace.analysis.read.parallel import usable_cores
from fsdp_trace.analysis.read.readers import load as load_trace  # through the reader registry
from fsdp_trace.analysis.read.remote import is_url
from fsdp_trace.analysis.read.trace import rank_from_name
from fsdp_trace.analysis.results import (
    MAX_TIMELINE_RANKS,
    RankAnalysis,
    Reread,
    set_kernel_reader,
)
from fsdp_trace.errors import UserError
from fsdp_trace.vocab import Source

if TYPE_CHECKING:
    from fsdp_trace.analysis.read.remote import Url


@dataclasses.dataclass(frozen=True)
class Failure:
    """A trace whose analysis failed where it ran (a cluster worker): left out of its run,
    which says so. `rank`: what the file name says (the trace could not be read to tell)."""

    path: str
    rank: int | None
    reason: str  # one line: the loader's error, or how the worker died
    source: str = Source.TRACE

    def line(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else self.path.rpartition("/")[2]
        kind = " (detailed trace)" if self.source == Source.DETAILED else ""
        return f"{who}{kind} missing: {self.reason}"


def analyze_file(
    path: str | Path | Url,
    source: str = Source.TRACE,
    *,
    cache: bool = True,
    progress: bool | None = None,
    parallel: bool | None = None,
) -> RankAnalysis:
    """Load and analyze one trace file (used per rank, also by parallel workers).

    `cache`: reuse the analysis (else the parsed columns) of an unchanged file, and store
    them (see `fsdp_trace.analysis.read.cache`); `progress`: a loading bar on stderr (None: for
    large files when stderr is a terminal); `parallel`: decode a large file with two
    processes (None: when it is large, or two threads where the compiled reader is; False:
    one thread).

    Only one trace's parsed events live here, and only until its analysis is done: the
    result holds copies of the few columns it keeps, never the events; its kernels too (a
    run keeps `without_kernels`, but for `keeps_kernels`, and reads them again through
    here). A URL is read through fsspec (`fsdp_trace.analysis.read.remote`)."""
    lookup = lookup_for(TraceInput(path if is_url(path) else Path(path), source), cache)
    if lookup.hit is not None:
        return lookup.hit
    return lookup.compute(progress=progress, parallel=parallel)


@dataclasses.dataclass
class _Lookup:
    """One trace's analysis looked up in the cache: the hit, or what computing it needs."""

    path: Path
    source: str
    cache: bool
    entry: cache_mod.AnalysisEntry | None = None
    content: str | None = None  # the file's content hash, shared with the parsed-trace entry
    hit: RankAnalysis | None = None
    stamp: str | None = None  # the file's `stamp`, taken before it is read

    @classmethod
    def of(cls, path: Path, source: str, cache: bool) -> _Lookup:
        lookup = cls(path, source, cache, stamp=stamp(path))
        if not (cache and cache_mod.enabled() and path.is_file()):
            return lookup
        try:
            lookup.content = cache_mod.content_hash(path)
        except OSError:
            return lookup  # the loader reports unreadable files
        params = {
            "source": str(source),
            "rank_from_name": rank_from_name(path),  # the rank when the trace names none
        }
        lookup.entry = cache_mod.AnalysisEntry.for_file(path, params, lookup.content)
        if lookup.entry is not None:
            lookup.hit = lookup.entry.load(path)
        return lookup

    def compute(self, progress: bool | None = None, parallel: bool | None = None) -> RankAnalysis:
        """Load, analyze, and store the result when caching."""
        trace = load_trace(
            self.path, cache=self.cache, progress=progress, parallel=parallel, content=self.content
        )
        result = analyze_trace(trace, self.source)
        del trace  # before the entry is written: its events are not needed any more
        if self.entry is not None:
            self.entry.store(result)
        return result


def stamp(path: str | Path | Url) -> str | None:
    """What tells this version of a trace file from another without reading it: its size and
    modification time (ns); for a URL, its `remote.fingerprint` (size and version). None:
    missing (or a URL whose filesystem reports no version)."""
    if is_url(path):
        from fsdp_trace.analysis.read.remote import fingerprint

        try:
            return fingerprint(str(path))
        except UserError:
            return None
    try:
        info = os.stat(path)
    except OSError:
        return None
    return f"{info.st_size}-{info.st_mtime_ns}"


def lookup_for(trace: TraceInput, cache: bool):  # -> _Lookup | UrlLookup
    """The cache lookup of one trace, local file or URL (fsspec imported only for a URL)."""
    if is_url(trace.path):
        return UrlLookup.of(str(trace.path), trace.source, cache)
    return _Lookup.of(Path(trace.path), trace.source, cache)


# Worker processes pay off only for this much uncached JSON in all: below it, a pool's
# interpreters (~60 MB of RSS each) cost more than the second core saves (shipped samples:
# `--jobs 2` 1.04-1.13x faster, 2.2x the memory; benchmarks/results/speed.md).
POOL_MIN_BYTES = 64 << 20
# A process holds one trace's events at its peak: ~1.2x the trace's JSON (its own measure,
# benchmarks/results/single_trace.md), taken as 1.5x; `auto_jobs` gives the processes at most
# half the memory available.
EVENTS_PER_JSON_BYTE = 1.5


def auto_jobs(raw_sizes: list[int]) -> int:
    """The default of `--jobs` for traces of these sizes (bytes of JSON to decode): a process
    per core this process may run on, no more than the traces, and no more than half the
    available memory holds at one largest trace each (a machine's memory, not its cores,
    bounds a run of gigabyte traces)."""
    cores = usable_cores()
    largest = max(raw_sizes, default=0)
    free = available_memory()
    fit = int(free / 2 // (EVENTS_PER_JSON_BYTE * largest)) if largest and free else cores
    return max(1, min(cores, len(raw_sizes), fit))


def available_memory() -> int | None:
    """Bytes of memory available to new processes (Linux: MemAvailable), else None."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def keeps_kernels(work: list[TraceInput], cache: bool, every: bool = False) -> list[bool]:
    """Per trace of one local run, whether its analysis keeps its kernels: every timing
    trace's when `every` (views that read them all: whatif, --perfetto); else only where
    reading them again would parse the trace again (no cache: `cache` False or caching off
    here) and the run has no more timing traces than the report's timeline draws
    (`MAX_TIMELINE_RANKS`), which with what-if reads every one of them; never for a detailed
    trace (no view draws its kernels). Holding a few ranks' kernels costs less than parsing
    their traces twice; a larger run (or one through the cache, whose entry is read back
    cheaply) keeps its memory to the ranks' tables."""
    timing = [t.source != Source.DETAILED for t in work]
    if every:
        return timing
    if (cache and cache_mod.enabled()) or sum(timing) > MAX_TIMELINE_RANKS:
        return [False] * len(work)
    return timing


def analyze_all(
    work: list[TraceInput],
    jobs: int | None = 1,
    cache: bool = True,
    keep: list[bool] | None = None,
) -> list[RankAnalysis]:
    """Every trace's analysis without its kernels (`RankAnalysis.without_kernels`), in the
    order of `work`: a run's memory grows by a rank's tables, not by its events; except
    where `keep` says (per trace; None: `keeps_kernels` of `work` as one run: a small run
    without the cache keeps its timing traces' kernels).

    Cached analyses are read here first. The rest: in parallel, each worker process loads
    and analyzes one trace at a time (decoding it alone), so memory holds at most `jobs`
    traces' parsed events; small traces go to a worker a few at a time (`batches`); results
    come back in the order of `work`. With one job (or little
    to do), one at a time here, a large file decoded by two processes instead. `jobs` None:
    `auto_jobs` of the traces not in the cache."""
    with cache_mod.deferred():  # one scan of the cache folder for the run, not one per write
        return _analyze_all(work, jobs, cache, keep)


def _analyze_all(
    work: list[TraceInput], jobs: int | None, cache: bool, keep: list[bool] | None
) -> list[RankAnalysis]:
    lookups = [lookup_for(t, cache) for t in work]
    keep = keeps_kernels(work, cache) if keep is None else keep
    shared = SharedGroups()
    results: list[RankAnalysis | None] = [
        None if lookup.hit is None else shared(as_kept(lookup.hit, lookup, keep[i]))
        for i, lookup in enumerate(lookups)
    ]
    todo = [i for i, lookup in enumerate(lookups) if lookup.hit is None]
    raw = {i: _raw(work[i].path) for i in todo}
    jobs = auto_jobs(list(raw.values())) if jobs is None else jobs
    jobs = max(1, min(jobs, len(todo)))
    if jobs == 1 or sum(raw.values()) < POOL_MIN_BYTES:
        for i in todo:
            results[i] = shared(as_kept(lookups[i].compute(), lookups[i], keep[i]))
        return results  # type: ignore[return-value]
    from concurrent.futures import ProcessPoolExecutor, as_completed

    # Workers ignore Ctrl-C: the main process handles it (one line, no worker tracebacks) and
    # stops them itself.
    pool = ProcessPoolExecutor(max_workers=jobs, initializer=_start_worker)
    try:
        # Workers are forked here, before the progress bar starts its thread; each gets the
        # lookups (parameters, cache entry, content hash: the file is not hashed again).
        futures = {
            pool.submit(_compute_batch_in_worker, [(lookups[i], keep[i]) for i in batch]): batch
            for batch in batches(todo, raw, jobs)
        }
        progress = _Progress(sum(_size(work[i].path) for i in todo), sum(raw.values()), "traces")
        with progress:
            for future in as_completed(futures):
                batch = futures[future]
                for i, result in zip(batch, future.result(), strict=True):
                    results[i] = shared(result)
                    progress.advance(_size(work[i].path))
    except BaseException:
        stop_pool(pool)
        raise
    pool.shutdown()
    return results  # type: ignore[return-value]


class SharedGroups:
    """What every rank's result repeats, held once over a run's ranks, as each result
    arrives: its process groups' member lists (`distributedInfo.pg_config`: a thousand ranks
    of one job each carry the same thousand-rank list, a million integers on the client,
    quadratic in the ranks) and the names its records are keyed by (the kernel names of
    `kernel_time`, ~100 characters each, 50 a rank; the figures' names of `host` and
    `setup`), and its tables' column labels (an Index a table, ~1 KB each). Each becomes the
    first equal one seen (read only, never changed: every reader only reads them; a table
    given a column makes an Index of its own)."""

    def __init__(self) -> None:
        self.seen: dict[tuple, list] = {}
        self.names: dict[str, str] = {}
        self.columns: dict[tuple, Any] = {}  # pandas Index

    def __call__(self, result: Any) -> Any:
        if not isinstance(result, RankAnalysis):
            return result
        distributed = result.meta.get("distributed")
        groups = distributed.get("pg_config") if isinstance(distributed, dict) else None
        for pg in groups if isinstance(groups, list) else []:
            ranks = pg.get("ranks") if isinstance(pg, dict) else None
            if isinstance(ranks, list) and len(ranks) > 2:
                try:
                    pg["ranks"] = self.seen.setdefault(tuple(ranks), ranks)
                except TypeError:  # an unhashable member: left as it is
                    continue
        result.kernel_time = self._keyed(result.kernel_time)
        result.host = {
            k: self._keyed(v) if isinstance(v, dict) else v
            for k, v in self._keyed(result.host).items()
        }
        result.setup = self._keyed(result.setup)
        for field in dataclasses.fields(result):
            table = getattr(result, field.name)
            if isinstance(table, pd.DataFrame):
                labels = table.columns
                key = (type(labels).__name__, tuple(labels.names), str(labels.dtype), *labels)
                columns = self.columns.setdefault(key, table.columns)
                if columns is not table.columns:
                    table.columns = columns
        return result

    def _keyed(self, record: dict) -> dict:
        """`record` with its keys the names seen first."""
        name = self.names.setdefault
        return {name(k, k) if type(k) is str else k: v for k, v in record.items()}


def _start_worker() -> None:
    """A pool worker's start: Ctrl-C is the main process's; SIGTERM (`stop_pool`) ends it at
    once, even inside a long C call (the command's own handler, inherited by the fork, would
    wait for the next Python line); its cache writes deferred (the main process scans once
    when the run ends)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    cache_mod.defer_for_this_process()


STOP_WAIT_SECONDS = 5.0  # for the pool's manager thread to wind down after its workers end


def stop_pool(pool) -> None:
    """Cancel what has not started and end the workers now (not after their current trace),
    then wait (a bounded time) for the pool's manager thread to close its wake-up pipe: left
    closing it while the interpreter exits, it races the exit hook that writes to that pipe
    (CPython 3.11: "OSError: [Errno 9] Bad file descriptor", a traceback after the error's
    one line)."""
    # Taken before shutdown, which sets the pool's `_processes` and manager thread to None.
    processes = list((getattr(pool, "_processes", None) or {}).values())
    manager = getattr(pool, "_executor_manager_thread", None)
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()
    if manager is not None:
        manager.join(STOP_WAIT_SECONDS)


# A pool's task holds consecutive traces up to these bounds: each task's round trip (its
# lookups pickled, a future, the client's threads woken) costs the client ~0.3 ms of CPU, on
# the cores the workers use (~1.5 % of a 1.6 MB rank's analysis, benchmarks/results/per_rank.md).
BATCH_BYTES = 16 << 20  # bytes of JSON; a larger trace is a task alone
BATCH_TRACES = 16
# Tasks a worker gets at least, on even shares of the bytes: the last ones end close together.
TASKS_PER_WORKER = 4


def batches(todo: list[int], raw: dict[int, int], jobs: int) -> list[list[int]]:
    """`todo` (trace indices, in order) cut into the pool's tasks: consecutive traces, at most
    BATCH_TRACES of them and BATCH_BYTES of JSON (`raw`: each one's), and no more than a
    TASKS_PER_WORKER-th of a worker's even share of the bytes; a trace over the bound alone,
    and one of unknown size (0: a URL whose listing gives none) too."""
    limit = min(BATCH_BYTES, sum(raw[i] for i in todo) / (TASKS_PER_WORKER * jobs))
    out: list[list[int]] = []
    size = 0.0
    for i in todo:
        unknown = raw[i] <= 0
        if not out or unknown or len(out[-1]) >= BATCH_TRACES or size + raw[i] > limit:
            out.append([])
            size = 0.0
        out[-1].append(i)
        size = limit if unknown else size + raw[i]  # a trace of unknown size: a task alone
    return out


def _compute_batch_in_worker(tasks: list[tuple[_Lookup, bool]]) -> list[RankAnalysis]:
    """A pool task's traces analyzed one after the other (`_compute_in_worker`)."""
    return [_compute_in_worker(lookup, keep) for lookup, keep in tasks]


def _compute_in_worker(lookup: _Lookup, keep: bool) -> RankAnalysis:
    """One trace analyzed in a worker process; what comes back holds no kernels unless
    `keep` (`keeps_kernels`)."""
    return as_kept(lookup.compute(progress=False, parallel=False), lookup, keep)


def as_kept(result: RankAnalysis, lookup, keep: bool) -> RankAnalysis:
    """A fresh analysis (computed or read back through `lookup`) as the run keeps it: whole
    when `keep` and it has kernels (a CPU trace's table is empty: nothing to read again),
    else without its kernels, read again by what identifies the analyzed content (the key
    of its cache entry, the file's `stamp`: `RankAnalysis.load_kernels`); kept whole where
    neither exists."""
    entry = lookup.entry.key if lookup.entry is not None else None
    # A URL whose filesystem reports no version, analyzed without the cache: nothing would
    # tell a re-read of it from another object, so its kernels stay.
    unverifiable = entry is None and lookup.stamp is None
    return result.as_kept(
        lookup.cache,
        kernels=(keep or unverifiable) and bool(result.n_kernels),
        entry=entry,
        stamp=lookup.stamp,
    )


def _size(path: Path | Url) -> int:
    if is_url(path):
        return max(0, path.size)  # type: ignore[union-attr]
    try:
        return path.stat().st_size  # type: ignore[union-attr]
    except OSError:
        return 0


def _raw(path: Path | Url) -> int:
    """Bytes of JSON to decode (for a URL: its size as listed, gzip estimated)."""
    if not is_url(path):
        return raw_size(path)  # type: ignore[arg-type]
    from fsdp_trace.analysis.read.text import GZIP_RATIO_GUESS

    size = max(0, path.size)  # type: ignore[union-attr]
    return size * GZIP_RATIO_GUESS if str(path).endswith(".gz") else size


class _Progress:
    """Bytes of traces analyzed so far, on stderr, for large inputs on a terminal.
    `total`: the files' sizes on disk (what the bar counts); `raw`: their bytes of JSON
    (what decides whether the input is large)."""

    def __init__(self, total: int, raw: int, what: str) -> None:
        self.bar = None
        if wants_progress(raw):
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

            self.bar = Progress(
                TextColumn(f"analyzing {what}"),
                BarColumn(),
                DownloadColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self.task = self.bar.add_task(what, total=total)

    def __enter__(self) -> _Progress:
        if self.bar is not None:
            self.bar.start()
        return self

    def advance(self, amount: int) -> None:
        if self.bar is not None:
            self.bar.advance(self.task, amount)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()


def _same_content(path: str, key: str | None) -> bool:
    """Whether a local trace whose size or modification time moved still holds the analyzed
    bytes (a `touch`, a copy that kept them): its content hash is the one in the key of the
    analysis's cache entry. False without a key, for a URL, or when it cannot be read."""
    if not key or is_url(path):
        return False
    try:
        return f"-{cache_mod.content_hash(Path(path))}-" in key
    except OSError:
        return False


class _KernelReader:
    """How `RankAnalysis.load_kernels` reads a rank's kernels again (`results.KernelReader`)."""

    def read(self, rank: RankAnalysis, again: Reread, cache: bool):
        """From the cache entry its analysis wrote (by its key: the analyzed content's,
        whatever the file holds now), else its trace parsed and analyzed again, when its size
        and modification time (a URL's version) are as analyzed or, where only those moved,
        its content hash is the analyzed one (in the entry's key); else None (changed)."""
        table = None
        if cache and again.entry and cache_mod.enabled():
            hit = cache_mod.AnalysisEntry.of_key(again.entry).load(rank.path)
            table = None if hit is None else hit.kernel_table
        if table is None:
            moved = again.stamp is not None and stamp(rank.path) != again.stamp
            if moved and not _same_content(rank.path, again.entry):
                return None
            table = analyze_file(rank.path, again.source, cache=cache, progress=False).kernel_table
        return table

    def parses(self, again: Reread | None) -> bool:
        if again is None or not (again.cache and again.entry and cache_mod.enabled()):
            return True
        return not cache_mod.AnalysisEntry.of_key(again.entry).trusted()


set_kernel_reader(_KernelReader())


@dataclasses.dataclass
class UrlLookup:
    """One URL trace's analysis looked up in the cache (keyed on its `fingerprint`): the hit,
    or what computing it needs. The counterpart of `_Lookup` for local files; picklable
    (pool processes and Dask workers compute it)."""

    url: str
    source: str
    cache: bool
    params: dict[str, Any]
    entry: Any = None  # cache.AnalysisEntry
    hit: Any = None  # RankAnalysis
    stamp: str | None = None  # the object's `fingerprint` as looked up (None: no version)

    @classmethod
    def of(cls, url: str, source: str, cache: bool) -> UrlLookup:
        name = Path(remote.Url(url).name)
        params = {"source": str(source), "rank_from_name": rank_from_name(name)}
        lookup = cls(url, source, cache and cache_mod.enabled(), params)
        lookup.stamp = key = remote.fingerprint(url)  # also what kernels read again check
        if lookup.cache and key is not None:
            lookup.entry = cache_mod.AnalysisEntry.for_file(name, params, key)
            if lookup.entry is not None:
                lookup.hit = lookup.entry.load(url)
        return lookup

    def compute(self, progress: bool | None = None, parallel: bool | None = None):
        """Copy the object here, load and analyze it, store the result when caching."""
        entry = self.entry
        with remote.local_copy(self.url) as local:
            try:
                if entry is None and self.cache:  # no version reported: key on the content
                    content = cache_mod.content_hash(local)
                    entry = cache_mod.AnalysisEntry.for_file(local, self.params, content)
                    self.entry = entry  # what its kernels are read again from (as_kept)
                    hit = entry.load(self.url) if entry is not None else None
                    if hit is not None:
                        return hit
                trace = loader.load_trace(local, cache=False, progress=progress, parallel=parallel)
            except UserError as exc:
                raise UserError(remote.as_url(exc.message, local, self.url)) from None
            except OSError as exc:
                raise remote.io_error(self.url, exc) from None
            trace.path = self.url
            trace.notices = [remote.as_url(n, local, self.url) for n in trace.notices]
            result = analyze_trace(trace, self.source)
            del trace
        if entry is not None:
            entry.store(result)
        return result
