"""What a capture writes into --out (and reading its run.json back), and how a failed or
interrupted run takes it back.

Torch-free on purpose: the launcher (and the CLI's checks before launching) use it on machines
where torch may be missing, to give a one-line error instead of an import traceback.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from fsdp_trace.runrecord import RUN_FILE

ERROR_DIR_ENV = "FSDP_TRACE_ERROR_DIR"
COMMAND_ENV = "FSDP_TRACE_COMMAND"
ARGV_ENV = "FSDP_TRACE_ARGV"


def trace_name(rank: int, phase: str) -> str:
    return f"rank{rank}.{phase}.json.gz"


def trace_temp_name(path: Path, pid: int) -> Path:
    """A hidden sibling of a trace that keeps `.json.gz` (the profiler gzips by suffix)."""
    return path.with_name(f".{path.name[: -len('.json.gz')]}.tmp-{pid}.json.gz")


def out_dir_problem(out: Path, overwrite: bool) -> str | None:
    """Why the output directory cannot be used, or None."""
    if out.exists() and not out.is_dir():
        return f"--out {out} exists and is not a directory"
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        return f"--out {out} already exists and is not empty: pass --overwrite or choose another"
    return None


def _capture_files(out: Path, rank: int | None) -> Iterator[Path]:
    """Files a capture writes: final traces, their hidden temp names, and (all ranks) run.json
    with its temp names. `rank` limits it to one rank's traces (`rank1.` never matches rank10)."""
    who = "*" if rank is None else str(rank)
    yield from out.glob(f"rank{who}.*.json.gz")
    yield from out.glob(f".rank{who}.*.tmp-*")
    if rank is None:
        yield from out.glob(RUN_FILE)
        yield from out.glob(f".{RUN_FILE}.*")


def remove_outputs(out: Path, rank: int | None = None) -> None:
    """Delete what a capture wrote (one rank's traces, or everything), temp files included.
    Tolerates another process deleting the same files (every node's local rank 0 may)."""
    if not out.is_dir():
        return
    for path in list(_capture_files(out, rank)):
        path.unlink(missing_ok=True)


def remove_incomplete_outputs(out: Path, created: bool) -> None:
    """After a failed or interrupted run: no traces and no temp files without run.json, and no
    directory we made for nothing."""
    if not out.is_dir() or (out / RUN_FILE).exists():
        return
    remove_outputs(out)
    if created and not any(out.iterdir()):
        out.rmdir()
