"""What the user pointed at, as runs: each run is the traces of one training job (one rank
each, timing and optionally detailed), with its run.json when it has one. A run is the unit
of the cross-rank view, the inferred configuration and the diagnosis."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fsdp_trace.analysis.perrank import TraceInput
from fsdp_trace.analysis.trace import rank_from_name
from fsdp_trace.errors import UserError
from fsdp_trace.runrecord import RUN_FILE, RunRecord, read_run
from fsdp_trace.vocab import Source

TRACE_SUFFIXES = (".json", ".json.gz")


@dataclass
class RunInput:
    """One run's traces, and where they came from."""

    name: str
    traces: list[TraceInput]
    run: RunRecord | None = None
    run_dir: Path | None = None
    sources: list[str] = field(default_factory=list)  # the user's paths behind it


def is_trace_file(path: Path) -> bool:
    return path.is_file() and path.name.endswith(TRACE_SUFFIXES) and path.name != RUN_FILE


def _rank_key(path: Path) -> tuple[int, str]:
    rank = rank_from_name(path)
    return (rank if rank is not None else 1 << 30, path.name)


def _inside(folder: Path, name: str) -> Path:
    """`folder / name`, refused when the name leads out of `folder` (a run.json is input, not
    trusted): an absolute path or `..`. Symbolic links inside the folder are the user's own."""
    path = folder / name
    base = os.path.abspath(folder)
    if os.path.isabs(name) or os.path.commonpath([base, os.path.abspath(path)]) != base:
        raise UserError(
            f"{folder / RUN_FILE}: lists the trace {name!r}, which is outside the run "
            "directory: refused (a run.json names its traces relative to its own folder)"
        )
    return path


def capture_run(path: Path) -> RunInput:
    """A capture run directory: its timing traces (all of them must be there) and the
    detailed ones that are (users delete them to save space)."""
    run = read_run(path)
    timing = [TraceInput(_inside(path, f), Source.TIMING) for f in run.files.timing]
    missing = [str(t.path) for t in timing if not t.path.is_file()]
    if missing or not timing:
        raise UserError(
            f"{path}: run.json lists timing traces that are missing: {', '.join(missing[:3])}"
            if missing
            else f"{path}: run.json lists no timing traces: re-run the capture"
        )
    detailed = [TraceInput(_inside(path, f), Source.DETAILED) for f in run.files.detailed]
    return RunInput(
        path.name or str(path),
        timing + [t for t in detailed if t.path.is_file()],
        run,
        path,
        [str(path)],
    )


def trace_files(path: Path) -> list[Path]:
    """The trace files a path names: itself, or the traces in a directory."""
    if not path.exists():
        raise UserError(f"{path}: no such file or directory")
    if path.is_file():
        if not path.name.endswith(TRACE_SUFFIXES):
            raise UserError(f"{path}: not a .json or .json.gz trace")
        return [path]
    candidates = sorted((p for p in path.iterdir() if is_trace_file(p)), key=_rank_key)
    if not candidates:
        raise UserError(f"{path}: no .json/.json.gz traces and no run.json in this directory")
    return candidates


def resolve(paths: str | Path | Sequence[str | Path]) -> tuple[list[RunInput], str]:
    """The runs behind `paths`, and one line saying how files were grouped: each capture run
    directory is a run; trace files and directories of traces given together form one run."""
    if isinstance(paths, str | Path):
        paths = [paths]
    if not paths:
        raise UserError("no input: give trace files, run directories or trace directories")
    runs: list[RunInput] = []
    loose: list[Path] = []
    loose_sources: list[str] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir() and (path / RUN_FILE).exists():
            runs.append(capture_run(path))
        else:
            loose += trace_files(path)
            loose_sources.append(str(path))
    if loose:
        unique = list(dict.fromkeys(loose))
        name = Path(loose_sources[0]).name if len(loose_sources) == 1 else "traces"
        runs.append(RunInput(name, [TraceInput(p) for p in unique], None, None, loose_sources))
    names = [r.name for r in runs]
    for i, run in enumerate(runs):  # two runs of one name are told apart by their path
        if names.count(run.name) > 1:
            run.name = run.sources[0] if run.sources else f"{run.name} #{i + 1}"
    return runs, _grouping(runs)


def _grouping(runs: list[RunInput]) -> str:
    parts = []
    for run in runs:
        timing = sum(t.source != Source.DETAILED for t in run.traces)
        detailed = len(run.traces) - timing
        kind = "capture run" if run.run is not None else "traces"
        text = f"{run.name} ({kind}: {timing} trace{'s' * (timing != 1)}"
        parts.append(text + (f" + {detailed} detailed)" if detailed else ")"))
    return f"{len(runs)} run{'s' * (len(runs) != 1)}: " + "; ".join(parts)
