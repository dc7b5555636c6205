"""The Python API: point it at a trace file, a capture run directory, or a directory of
per-rank traces, get an `Analysis` back (dataclasses holding DataFrames).

    from fsdp_trace.analyze import analyze
    result = analyze("sample_traces/gpt-small-2gpu")
    result.steps, result.blocks, result.collectives
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fsdp_trace.analyze import cache as cache_mod
from fsdp_trace.analyze.loader import load_trace, rank_from_name, raw_size, wants_progress
from fsdp_trace.analyze.rank import Expectations, analyze_trace
from fsdp_trace.analyze.results import Analysis, RankAnalysis
from fsdp_trace.capture.outputs import RUN_FILE, read_run
from fsdp_trace.errors import UserError

TRACE_SUFFIXES = (".json", ".json.gz")


@dataclass(frozen=True)
class TraceInput:
    path: Path
    source: str  # "timing", "detailed" or "trace"


@dataclass
class ResolvedInput:
    traces: list[TraceInput]
    run: dict[str, Any] | None
    run_dir: Path | None


def _is_trace_file(path: Path) -> bool:
    return path.is_file() and path.name.endswith(TRACE_SUFFIXES) and path.name != RUN_FILE


def _rank_key(path: Path) -> tuple[int, str]:
    rank = rank_from_name(path)
    return (rank if rank is not None else 1 << 30, path.name)


def resolve(path: str | Path) -> ResolvedInput:
    """What to analyze at `path`: a trace file, a capture run, or a directory of traces."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such file or directory")
    if path.is_file():
        if not path.name.endswith(TRACE_SUFFIXES):
            raise UserError(f"{path}: not a .json or .json.gz trace")
        return ResolvedInput([TraceInput(path, "trace")], None, None)
    if (path / RUN_FILE).exists():
        run = read_run(path)
        files = run.get("files", {})
        traces = [TraceInput(path / f, "timing") for f in files.get("timing", [])]
        missing = [str(t.path) for t in traces if not t.path.exists()]
        if missing or not traces:
            raise UserError(
                f"{path}: run.json lists timing traces that are missing: {', '.join(missing[:3])}"
            )
        # Detailed traces are optional: users drop them to save space.
        traces += [
            TraceInput(path / f, "detailed")
            for f in files.get("detailed", [])
            if (path / f).exists()
        ]
        return ResolvedInput(traces, run, path)
    candidates = sorted((p for p in path.iterdir() if _is_trace_file(p)), key=_rank_key)
    if not candidates:
        raise UserError(f"{path}: no .json/.json.gz traces and no run.json in this directory")
    return ResolvedInput([TraceInput(p, "trace") for p in candidates], None, None)


def analyze_file(
    path: str | Path,
    run: dict | None = None,
    source: str = "trace",
    *,
    cache: bool = True,
    progress: bool | None = None,
    parallel: bool | None = None,
) -> RankAnalysis:
    """Load and analyze one trace file (used per rank, also by parallel workers).

    `cache`: reuse the analysis (else the parsed columns) of an unchanged file, and store
    them (see `fsdp_trace.analyze.cache`); `progress`: a loading bar on stderr (None: for
    large files when stderr is a terminal); `parallel`: decode a large file with two
    processes (None: when it is large).

    Only one trace's parsed events live here, and only until its analysis is done: the
    result holds copies of the few columns it keeps, never the events."""
    lookup = _Lookup.of(Path(path), run, source, cache)
    if lookup.hit is not None:
        return lookup.hit
    return lookup.compute(progress=progress, parallel=parallel)


@dataclasses.dataclass
class _Lookup:
    """One trace's analysis looked up in the cache: the hit, or what computing it needs."""

    path: Path
    expectations: Expectations
    source: str
    cache: bool
    entry: cache_mod.AnalysisEntry | None = None
    content: str | None = None  # the file's content hash, shared with the parsed-trace entry
    hit: RankAnalysis | None = None

    @classmethod
    def of(cls, path: Path, run: dict | None, source: str, cache: bool) -> _Lookup:
        lookup = cls(path, Expectations.from_run(run), source, cache)
        if not (cache and cache_mod.enabled() and path.is_file()):
            return lookup
        try:
            lookup.content = cache_mod.content_hash(path)
        except OSError:
            return lookup  # the loader reports unreadable files
        params = {
            "expectations": dataclasses.asdict(lookup.expectations),
            "source": source,
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
        result = analyze_trace(trace, self.expectations, self.source)
        del trace  # before the entry is written: its events are not needed any more
        if self.entry is not None:
            self.entry.store(result)
        return result


def analyze(
    paths: str | Path | Sequence[str | Path],
    *,
    jobs: int = 1,
    detailed: bool = True,
    cache: bool = True,
) -> Analysis:
    """Analyze every trace behind `paths` (files, run directories, trace directories).

    `jobs`: traces analyzed at once, each in its own process holding one trace's events at a
    time (results are identical to `jobs=1`). `cache`: False re-parses every file and writes
    no cache entry (the CLI's `--no-cache`)."""
    if isinstance(paths, str | Path):
        paths = [paths]
    resolved = [resolve(p) for p in paths]
    runs = [r.run for r in resolved if r.run is not None]
    run = runs[0] if len(runs) == 1 and len(resolved) == 1 else None
    work: list[tuple[TraceInput, dict | None]] = []
    for item in resolved:
        for trace in item.traces:
            if trace.source == "detailed" and not detailed:
                continue
            work.append((trace, item.run))
    results = _run_all(work, jobs, cache)
    ranks = [r for r in results if r.source != "detailed"]
    details = [r for r in results if r.source == "detailed"]
    notices = []
    seen = [r.rank for r in ranks]
    if len(set(seen)) != len(seen):
        notices.append("several traces share a rank number: ranks are told apart by file")
    return Analysis(
        inputs=[str(p) for p in paths],
        ranks=ranks,
        detailed=details,
        run=run,
        notices=notices,
    )


# Worker processes pay off only for this much uncached JSON in all: below it, a pool's
# interpreters (~60 MB of RSS each) cost more than the second core saves (shipped samples:
# `--jobs 2` 1.04-1.13x faster, 2.2x the memory; benchmarks/results/speed.md).
POOL_MIN_BYTES = 64 << 20


def _run_all(
    work: list[tuple[TraceInput, dict | None]], jobs: int, cache: bool = True
) -> list[RankAnalysis]:
    """Every trace's analysis, in the order of `work`.

    Cached analyses are read here first. The rest: in parallel, each worker process loads
    and analyzes one trace at a time (decoding it alone), so memory holds at most `jobs`
    traces' parsed events; results come back in submission order. With one job (or little
    to do), one at a time here, a large file decoded by two processes instead."""
    lookups = [_Lookup.of(t.path, run, t.source, cache) for t, run in work]
    results: list[RankAnalysis | None] = [lookup.hit for lookup in lookups]
    todo = [i for i, lookup in enumerate(lookups) if lookup.hit is None]
    raw = {i: raw_size(work[i][0].path) for i in todo}
    jobs = max(1, min(jobs, len(todo)))
    if jobs == 1 or sum(raw.values()) < POOL_MIN_BYTES:
        for i in todo:
            results[i] = lookups[i].compute()
        return results  # type: ignore[return-value]
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(max_workers=jobs) as pool:
        # Workers are forked here, before the progress bar starts its thread; each gets the
        # lookup (parameters, cache entry, content hash: the file is not hashed again).
        futures = {pool.submit(_compute_in_worker, lookups[i]): i for i in todo}
        progress = _Progress(sum(_size(work[i][0].path) for i in todo), sum(raw.values()), "traces")
        with progress:
            for future in as_completed(futures):
                i = futures[future]
                results[i] = future.result()
                progress.advance(_size(work[i][0].path))
    return results  # type: ignore[return-value]


def _compute_in_worker(lookup: _Lookup) -> RankAnalysis:
    return lookup.compute(progress=False, parallel=False)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


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
