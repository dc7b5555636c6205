"""What the user pointed at, as runs: each run is the traces of one training job (one rank
each, timing and optionally detailed), with its run.json when it has one. A run is the unit
of the cross-rank view, the inferred configuration and the diagnosis.

`resolve` is the one pass from the user's paths to `Inputs`: each path is opened (a trace
file, or a folder), each folder walked (`_walk`), each run folder found read (`capture_run`).
The walk and the run reader see a folder through `Folder`: `LocalFolder` here, and
`remote.UrlFolder` (fsspec) for a URL, so local and URL inputs are found and refused alike."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from fsdp_trace.analysis.read import readers, remote
from fsdp_trace.analysis.read.readers import OWN_RECORDS, SUMMARY
from fsdp_trace.analysis.read.text import cannot_read
from fsdp_trace.analysis.read.trace import rank_from_name
from fsdp_trace.errors import UserError
from fsdp_trace.runrecord import RUN_FILE, RunRecord, read_run
from fsdp_trace.vocab import Source

# A trace file: a local path, or an object named by a URL.
File = Path | remote.Url


@dataclass(frozen=True)
class TraceInput:
    """One trace file to analyze (a local path, or a URL: `fsdp_trace.analysis.read.remote`), and
    what kind of trace it is."""

    path: File
    source: str = Source.TRACE


@dataclass
class RunInput:
    """One run's traces, and where they came from."""

    name: str
    traces: list[TraceInput]
    run: RunRecord | None = None
    run_dir: Path | remote.Url | None = None
    sources: list[str] = field(default_factory=list)  # the user's paths behind it


class Folder(Protocol):
    """A folder the inputs may be in, as the walk (`_walk`) and the run reader (`capture_run`)
    see it: `LocalFolder` here, `remote.UrlFolder` behind an fsspec URL. Both kinds are found
    and read by the same code, so a layout means the same runs and files wherever it lies."""

    @property
    def where(self) -> Path | remote.Url:
        """What runs and messages name it by."""
        ...

    def key(self) -> str:
        """Its identity in one walk: a folder reached again (a link loop) is read once."""
        ...

    def same_as(self, other: Path | remote.Url) -> bool:
        """Whether `other`, named otherwise, is this folder (a local symbolic link)."""
        ...

    def holds_run(self) -> bool:
        """Whether it has a run.json (then it is a run: nothing below is searched)."""
        ...

    def entries(self) -> tuple[Sequence[tuple[str, File]], Sequence[tuple[str, Folder]]]:
        """Its files and subfolders, each with its name; a UserError when it cannot be read."""
        ...

    def read_run(self) -> RunRecord: ...

    def leads_out(self, name: str) -> bool:
        """Whether a name its run.json gives leads out of it (a run.json is input, not trusted)."""
        ...

    def named(self, name: str) -> str:
        """How messages name the file `name` in it."""
        ...

    def members(self) -> Callable[[str], File | None]:
        """A lookup of its files by name (relative, `/`-separated): the file, None if absent."""
        ...

    def kept(self) -> list[str]:
        """Names of the files it has, for the message of a run whose traces are all absent."""
        ...


class LocalFolder:
    """A local folder, as `Folder`. A folder or entry that cannot be examined makes the folder
    unreadable (`Path.is_file` raises PermissionError in a folder we cannot search)."""

    def __init__(self, path: Path) -> None:
        self.where = path

    def _unreadable(self, exc: OSError) -> UserError:
        return UserError(f"{self.where}: cannot read the folder ({exc.strerror or exc})")

    def key(self) -> str:
        return os.path.realpath(self.where)

    def same_as(self, other: Path | remote.Url) -> bool:
        return isinstance(other, Path) and os.path.samefile(self.where, other)

    def holds_run(self) -> bool:
        try:
            return (self.where / RUN_FILE).exists()
        except OSError as exc:
            raise self._unreadable(exc) from None

    def entries(self) -> tuple[list[tuple[str, Path]], list[tuple[str, LocalFolder]]]:
        try:
            listed = sorted(self.where.iterdir())
            files = [(p.name, p) for p in listed if p.is_file()]
            folders = [(p.name, LocalFolder(p)) for p in listed if p.is_dir()]
        except OSError as exc:
            raise self._unreadable(exc) from None
        return files, folders

    def read_run(self) -> RunRecord:
        return read_run(self.where)

    def leads_out(self, name: str) -> bool:
        """Absolute, or out through `..`; symbolic links inside the folder are the user's own."""
        base = os.path.abspath(self.where)
        inside = os.path.abspath(self.where / name)
        return os.path.isabs(name) or os.path.commonpath([base, inside]) != base

    def named(self, name: str) -> str:
        return str(self.where / name)

    def members(self) -> Callable[[str], Path | None]:
        return lambda name: path if (path := self.where / name).is_file() else None

    def kept(self) -> list[str]:
        try:
            return [p.name for p in self.where.iterdir() if p.is_file()]
        except OSError:
            return [RUN_FILE]


def capture_run(folder: Folder) -> RunInput:
    """A capture run folder: its timing traces (all of them must be there) and the detailed
    ones that are (users delete them to save space)."""
    run = folder.read_run()
    member = folder.members()
    timing = [member(name) for name in _inside(folder, run.files.timing)]
    missing = [folder.named(n) for n, f in zip(run.files.timing, timing, strict=True) if f is None]
    if timing and len(missing) == len(timing):
        raise _left_out(folder.where, len(timing), folder.kept())
    if missing or not timing:
        raise UserError(
            f"{folder.where}: run.json lists timing traces that are missing: "
            f"{', '.join(missing[:3])}"
            if missing
            else f"{folder.where}: run.json lists no timing traces: re-run the capture"
        )
    detailed = [member(name) for name in _inside(folder, run.files.detailed)]
    where = folder.where
    return RunInput(
        where.name or str(where),
        [TraceInput(f, Source.TIMING) for f in timing if f is not None]
        + [TraceInput(f, Source.DETAILED) for f in detailed if f is not None],
        run,
        where,
        [str(where)],
    )


def _inside(folder: Folder, names: list[str]) -> list[str]:
    """`names`, refused (a one-line error) when one leads out of `folder`: the one check, and
    the one message, for local and URL runs alike."""
    for name in names:
        if folder.leads_out(name):
            raise UserError(
                f"{folder.named(RUN_FILE)}: lists the trace {name!r}, which is outside the run "
                "directory: refused (a run.json names its traces relative to its own folder)"
            )
    return names


def _left_out(where: object, listed: int, kept: list[str]) -> UserError:
    """A run whose traces are all absent (`kept`: the files it has): its record kept without
    them (a sweep point keeps run.json and analysis.json when its traces are deleted or left
    out for size)."""
    read = "; `fsdp-trace plot` and `compare` read its analysis.json" if SUMMARY in kept else ""
    return UserError(
        f"{where}: traces left out (run.json lists {listed}, all missing; only "
        f"{', '.join(sorted(kept)[:4])} here): nothing to analyze{read}"
    )


# How deep below a given folder run directories and traces are looked for (a sweep's folder,
# torchtitan's profile_traces/iteration_N/, a parent of several runs).
SEARCH_DEPTH = 3


@dataclass
class Inputs:
    """What the paths hold: capture runs (with run.json), and trace files to group by their
    content (`fsdp_trace.analysis.read.grouping`)."""

    runs: list[RunInput]
    loose: list[File]
    sources: dict[File, str]  # each loose file → the user's path that named it
    # Runs found below a given folder that cannot be analyzed, one line each (a folder of
    # many runs analyzes those it can); a run named itself is an error instead.
    skipped: list[str] = field(default_factory=list)


def _rank_order(entry: tuple[str, File]) -> tuple[int, str]:
    rank = rank_from_name(Path(entry[0]))
    return (rank if rank is not None else 1 << 30, entry[0])


def _walk(
    folder: Folder, depth: int, skipped: list[str], seen: set[str]
) -> tuple[list[Folder], list[File]]:
    """Capture run folders and loose trace files (rank-ordered) at or below `folder`, at most
    `depth` folders down: a folder with run.json is a run, a folder with traces is not
    searched further, hidden folders are not searched. A subfolder that cannot be read is
    said in `skipped` (`folder` itself: an error); one reached again is read once."""
    key = folder.key()
    if key in seen:
        return [], []
    seen.add(key)
    if folder.holds_run():
        return [folder], []
    files, subfolders = folder.entries()
    traces = [
        file
        for name, file in sorted(files, key=_rank_order)
        if name.endswith(readers.suffixes()) and name not in OWN_RECORDS
    ]
    if traces or depth == 0:
        return [], traces
    runs: list[Folder] = []
    loose: list[File] = []
    for name, sub in sorted(subfolders, key=lambda entry: entry[0]):
        if name.startswith("."):
            continue
        try:
            r, f = _walk(sub, depth - 1, skipped, seen)
        except UserError as exc:
            skipped.append(exc.message)
            continue
        runs += r
        loose += f
    return runs, loose


def _open_local(path: Path) -> Path | LocalFolder:
    """A local path as a trace file (of a format some reader takes) or a folder."""
    try:
        exists, is_file, is_dir = path.exists(), path.is_file(), path.is_dir()
    except OSError as exc:  # in a folder we cannot search: PermissionError
        raise cannot_read(path, exc) from None
    if not exists:
        raise UserError(f"{path}: no such file or directory")
    if is_file:
        readers.reader_for(path)  # a format some reader takes, else a one-line error
        return path
    if is_dir:
        return LocalFolder(path)
    raise UserError(f"{path}: not a regular file or a folder")


def _file_key(file: File) -> str:
    """A file's identity: one file is analyzed once, however named (a local path resolved)."""
    return file.url if isinstance(file, remote.Url) else os.path.realpath(file)


def resolve(paths: str | Path | Sequence[str | Path]) -> Inputs:
    """The capture runs and loose trace files behind `paths`, local or URLs, in one pass:
    each path opened (a file, or a folder walked), each run found read."""
    if isinstance(paths, str | Path):
        paths = [paths]
    if not paths:
        raise UserError("no input: give trace files, run directories or trace directories")
    runs: list[RunInput] = []
    loose: list[File] = []
    sources: dict[File, str] = {}
    skipped: list[str] = []
    files_seen: set[str] = set()

    def add(folder: Folder, given: Path | remote.Url) -> None:
        """The run in `folder`; one found below the given path that cannot be read is said
        in `skipped`."""
        if any(folder.where == r.run_dir for r in runs):
            return
        if any(r.run_dir is not None and folder.same_as(r.run_dir) for r in runs):
            return  # the same folder under another name (a symbolic link)
        try:
            run = capture_run(folder)
        except UserError as exc:
            if folder.where == given:
                raise
            skipped.append(exc.message)
            return
        if any(r.name == run.name for r in runs):  # a/run and b/run: by their path
            run.name = str(folder.where)
        runs.append(run)

    for raw in paths:
        if remote.is_url(raw):
            named, given = str(raw), remote.Url(str(raw).rstrip("/"))
            found = remote.open_url(named, SEARCH_DEPTH)
        else:
            given = Path(raw)
            named, found = str(given), _open_local(given)
        if isinstance(found, Path | remote.Url):
            found_runs, found_files = [], [found]
        else:
            found_runs, found_files = _walk(found, SEARCH_DEPTH, skipped, set())
            if not found_runs and not found_files:
                raise UserError(
                    f"{named}: no .json/.json.gz traces and no run.json here or "
                    f"{SEARCH_DEPTH} folders below"
                )
        for folder in found_runs:
            add(folder, given)
        for file in found_files:
            if (key := _file_key(file)) not in files_seen:
                files_seen.add(key)
                loose.append(file)
                sources[file] = named
    if not runs and not loose:
        more = f" (and {len(skipped) - 1} more runs cannot be analyzed)" if len(skipped) > 1 else ""
        raise UserError(skipped[0] + more)
    return Inputs(runs, loose, sources, skipped)
