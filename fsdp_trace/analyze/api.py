"""The Python API: point it at a trace file, a capture run directory, or a directory of
per-rank traces, get an `Analysis` back (dataclasses holding DataFrames).

    from fsdp_trace.analyze import analyze
    result = analyze("sample_traces/gpt-small-2gpu")
    result.steps, result.blocks, result.collectives
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fsdp_trace.analyze.loader import load_trace
from fsdp_trace.analyze.rank import Expectations, analyze_trace
from fsdp_trace.analyze.results import Analysis, RankAnalysis
from fsdp_trace.errors import UserError

RUN_FILE = "run.json"
TRACE_SUFFIXES = (".json", ".json.gz")
_RANK = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


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


def read_run(run_dir: Path) -> dict[str, Any]:
    path = run_dir / RUN_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: unreadable run.json ({exc}): re-run the capture") from None


def _rank_key(path: Path) -> tuple[int, str]:
    match = _RANK.search(path.name)
    return (int(match.group(1)) if match else 1 << 30, path.name)


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


def analyze_file(path: str | Path, run: dict | None = None, source: str = "trace") -> RankAnalysis:
    """Load and analyze one trace file (used per rank, also by parallel workers)."""
    trace = load_trace(path)
    return analyze_trace(trace, Expectations.from_run(run), source)


def analyze(
    paths: str | Path | Sequence[str | Path],
    *,
    jobs: int = 1,
    detailed: bool = True,
) -> Analysis:
    """Analyze every trace behind `paths` (files, run directories, trace directories)."""
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
    results = _run_all(work, jobs)
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


def _run_all(work: list[tuple[TraceInput, dict | None]], jobs: int) -> list[RankAnalysis]:
    if jobs <= 1 or len(work) <= 1:
        return [analyze_file(t.path, run, t.source) for t, run in work]
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(analyze_file, t.path, run, t.source) for t, run in work]
        return [f.result() for f in futures]
