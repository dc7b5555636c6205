"""What the user pointed at, as runs: each run is the traces of one training job (one rank
each, timing and optionally detailed), with its run.json when it has one. A run is the unit
of the cross-rank view, the inferred configuration and the diagnosis."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fsdp_trace.analysis.read import readers, remote
from fsdp_trace.analysis.read.readers import OWN_RECORDS, SUMMARY
from fsdp_trace.analysis.read.trace import rank_from_name
from fsdp_trace.errors import UserError
from fsdp_trace.runrecord import RUN_FILE, RunRecord, read_run
from fsdp_trace.vocab import Source


@dataclass(frozen=True)
class TraceInput:
    """One trace file to analyze (a local path, or a URL: `fsdp_trace.analysis.read.remote`), and
    what kind of trace it is."""

    path: Path | remote.Url
    source: str = Source.TRACE


@dataclass
class RunInput:
    """One run's traces, and where they came from."""

    name: str
    traces: list[TraceInput]
    run: RunRecord | None = None
    run_dir: Path | remote.Url | None = None
    sources: list[str] = field(default_factory=list)  # the user's paths behind it


def is_trace_file(path: Path) -> bool:
    return (
        path.is_file() and path.name.endswith(readers.suffixes()) and path.name not in OWN_RECORDS
    )


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
    if timing and len(missing) == len(timing):
        try:
            kept = [p.name for p in path.iterdir() if p.is_file()]
        except OSError:
            kept = [RUN_FILE]
        raise _left_out(path, len(timing), kept)
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


def _left_out(where: object, listed: int, kept: list[str]) -> UserError:
    """A run whose traces are all absent (`kept`: the files it has): its record kept without
    them (a sweep point keeps run.json and analysis.json when its traces are deleted or left
    out for size)."""
    read = "; `fsdp-trace plot` and `compare` read its analysis.json" if SUMMARY in kept else ""
    return UserError(
        f"{where}: traces left out (run.json lists {listed}, all missing; only "
        f"{', '.join(sorted(kept)[:4])} here): nothing to analyze{read}"
    )


def _name_inside(folder: str, name: str) -> str:
    """A run.json's trace name, refused when it leads out of its (URL) folder."""
    parts = name.split("/")
    if name.startswith("/") or ".." in parts or remote.is_url(name):
        raise UserError(
            f"{folder}/{RUN_FILE}: lists the trace {name!r}, which is outside the run "
            "directory: refused (a run.json names its traces relative to its own folder)"
        )
    return name


def capture_run_url(folder: remote.Url) -> RunInput:
    """A capture run directory named by a URL, as `capture_run` reads a local one."""
    run = remote.read_run_file(folder)
    present = remote.listed_files(folder)  # name relative to the folder -> size

    def traces(names: list[str], source: str) -> list[TraceInput]:
        return [
            TraceInput(remote.Url(folder.child(n).url, present.get(n, -1)), source)
            for n in names
            if _name_inside(folder.url, n) in present
        ]

    timing = traces(run.files.timing, Source.TIMING)
    missing = [folder.child(n).url for n in run.files.timing if n not in present]
    if run.files.timing and not timing:
        raise _left_out(folder, len(run.files.timing), list(present))
    if missing or not timing:
        raise UserError(
            f"{folder}: run.json lists timing traces that are missing: {', '.join(missing[:3])}"
            if missing
            else f"{folder}: run.json lists no timing traces: re-run the capture"
        )
    detailed = traces(run.files.detailed, Source.DETAILED)
    return RunInput(folder.name or folder.url, timing + detailed, run, folder, [folder.url])


# How deep below a given folder run directories and traces are looked for (a sweep's folder,
# torchtitan's profile_traces/iteration_N/, a parent of several runs).
SEARCH_DEPTH = 3


@dataclass
class Inputs:
    """What the paths hold: capture runs (with run.json), and trace files to group by their
    content (`fsdp_trace.analysis.read.grouping`)."""

    runs: list[RunInput]
    loose: list[Path | remote.Url]
    sources: dict[Path | remote.Url, str]  # each loose file → the user's path that named it
    # Runs found below a given folder that cannot be analyzed, one line each (a folder of
    # many runs analyzes those it can); a run named itself is an error instead.
    skipped: list[str] = field(default_factory=list)


def _walk(
    folder: Path, depth: int, skipped: list[str], seen: set[str] | None = None
) -> tuple[list[Path], list[Path]]:
    """Capture run folders and loose trace files at or below `folder`; a subfolder that
    cannot be read is said in `skipped` (`folder` itself: an error). A folder reached again
    through a symbolic link (a link to a folder above it, a loop) is read once."""
    seen = set() if seen is None else seen
    real = os.path.realpath(folder)
    if real in seen:
        return [], []
    seen.add(real)
    try:  # Path.exists/is_file/is_dir raise PermissionError in a folder we cannot search
        if (folder / RUN_FILE).exists():
            return [folder], []
        entries = sorted(folder.iterdir())
        files = sorted((p for p in entries if is_trace_file(p)), key=_rank_key)
        subfolders = [p for p in entries if p.is_dir() and not p.name.startswith(".")]
    except OSError as exc:
        raise UserError(f"{folder}: cannot read the folder ({exc.strerror or exc})") from None
    if files or depth == 0:
        return [], files
    runs, loose = [], []
    for sub in subfolders:
        try:
            r, f = _walk(sub, depth - 1, skipped, seen)
        except UserError as exc:
            skipped.append(exc.message)
            continue
        runs += r
        loose += f
    return runs, loose


def resolve(paths: str | Path | Sequence[str | Path]) -> Inputs:
    """The capture runs and loose trace files behind `paths`."""
    if isinstance(paths, str | Path):
        paths = [paths]
    if not paths:
        raise UserError("no input: give trace files, run directories or trace directories")
    runs: list[RunInput] = []
    loose: list[Path | remote.Url] = []
    sources: dict[Path | remote.Url, str] = {}
    skipped: list[str] = []
    real_files: set[str] = set()

    def add(folder, read, given) -> None:
        """The run in `folder`, read by `read`; one found below the given path that cannot
        be read is said in `skipped`."""
        if any(folder == r.run_dir for r in runs):
            return
        if isinstance(folder, Path) and any(
            isinstance(r.run_dir, Path) and os.path.samefile(folder, r.run_dir) for r in runs
        ):
            return  # the same folder under another name (a symbolic link)
        try:
            run = read(folder)
        except UserError as exc:
            if folder == given:
                raise
            skipped.append(exc.message)
            return
        if any(r.name == run.name for r in runs):  # a/run and b/run: by their path
            run.name = getattr(folder, "url", None) or str(folder)
        runs.append(run)

    for raw in paths:
        if remote.is_url(raw):  # found through its fsspec filesystem
            url_runs, url_files = remote.find(str(raw), SEARCH_DEPTH)
            if not url_runs and not url_files:
                raise UserError(
                    f"{raw}: no .json/.json.gz traces and no run.json here or "
                    f"{SEARCH_DEPTH} folders below"
                )
            for folder in url_runs:
                add(folder, capture_run_url, remote.Url(str(raw).rstrip("/")))
            for file in url_files:
                if file not in sources:
                    loose.append(file)
                    sources[file] = str(raw)
            continue
        path = Path(raw)
        try:
            exists, is_file, is_dir = path.exists(), path.is_file(), path.is_dir()
        except OSError as exc:  # in a folder we cannot search: PermissionError
            raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from None
        if not exists:
            raise UserError(f"{path}: no such file or directory")
        if is_file:
            readers.reader_for(path)  # a format some reader takes, else a one-line error
            found_runs, found = [], [path]
        elif is_dir:
            found_runs, found = _walk(path, SEARCH_DEPTH, skipped)
            if not found_runs and not found:
                raise UserError(
                    f"{path}: no .json/.json.gz traces and no run.json here or "
                    f"{SEARCH_DEPTH} folders below"
                )
        else:
            raise UserError(f"{path}: not a regular file or a folder")
        for folder in found_runs:
            add(folder, capture_run, path)
        for file in found:
            real = os.path.realpath(file)
            if file not in sources and real not in real_files:  # a file once, however named
                real_files.add(real)
                loose.append(file)
                sources[file] = str(path)
    if not runs and not loose:
        more = f" (and {len(skipped) - 1} more runs cannot be analyzed)" if len(skipped) > 1 else ""
        raise UserError(skipped[0] + more)
    return Inputs(runs, loose, sources, skipped)
