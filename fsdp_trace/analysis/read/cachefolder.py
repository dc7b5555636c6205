"""The cache folder's policy: where it is, whether it is used (switched off, or a folder that
cannot be trusted), and its size budget (least recently used entries evicted, temporary files
of crashed writers deleted; `clear`). What the entries hold and how they are keyed:
`fsdp_trace.analysis.read.cache`, which re-exports these names."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from fsdp_trace.errors import UserError

SUFFIX = ".fsdptrace"
TMP_PREFIX = ".tmp-"
TMP_MAX_AGE_S = 3600.0  # older temporary files are a crashed writer's: deleted
MAX_GB_DEFAULT = 20.0
PACKED_PLOTLYJS = "plotlyjs"  # subfolder: the packed plotly.js (render/plotlyjs.py)
PACKED_PREFIX = "packed-"


_off_here: list[str] = []  # why `off()` turned caching off in this process, innermost last


@contextlib.contextmanager
def off(reason: str = "--no-cache") -> Iterator[None]:
    """Caching off in this process while the block runs (`--no-cache`): no entry is read from
    or written to the cache folder (the packed plotly.js, which no input shapes, still is)."""
    _off_here.append(reason)
    try:
        yield
    finally:
        _off_here.pop()


def switched_off(assets: bool = False) -> str | None:
    """Why the environment (or `off()`) turns caching off, or None. `assets`: for a file that
    depends on no input (the packed plotly.js), which `off()` (`--no-cache`) leaves on."""
    if _off_here and not assets:
        return _off_here[-1]
    if os.environ.get("FSDP_TRACE_CACHE", "1").strip().lower() in ("0", "no", "false", "off"):
        return "FSDP_TRACE_CACHE=0"
    if "PYTEST_CURRENT_TEST" in os.environ and not os.environ.get("FSDP_TRACE_CACHE_DIR"):
        return "under pytest without FSDP_TRACE_CACHE_DIR"
    return None


def refused(folder: Path | None = None) -> str | None:
    """Why the cache folder cannot be trusted (see the module docstring), or None. A folder
    that does not exist yet is fine: it is made (mode 0700) on the first write."""
    folder = folder or directory()
    try:
        info = os.stat(folder)
    except OSError:
        return None  # missing (made later), or unreachable (writes fail quietly)
    if not stat.S_ISDIR(info.st_mode):
        return f"{folder} is not a folder"
    mode = stat.S_IMODE(info.st_mode)
    if mode & stat.S_ISVTX:
        return None  # shared but sticky: only our own entries are read (`_Entry._read`)
    uid = os.geteuid()
    if info.st_uid != uid:
        return (
            f"{folder} is owned by uid {info.st_uid}, not you (uid {uid}): set "
            "FSDP_TRACE_CACHE_DIR to a folder of your own"
        )
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = "all users" if mode & stat.S_IWOTH else "its group"
        return (
            f"{folder} is writable by {who} (mode {mode:o}): run `chmod go-w {folder}`, or set "
            "FSDP_TRACE_CACHE_DIR to a folder of your own"
        )
    return None


_warned: set[str] = set()


def enabled(assets: bool = False) -> bool:
    """Whether caching is on here (see the module docstring). A refused folder turns it off,
    with one warning line on stderr (once per process and reason). `assets`: for the packed
    plotly.js, a function of the installed plotly alone, kept under `--no-cache` too (only
    FSDP_TRACE_CACHE=0 turns it off): packing it costs ~2 s a run."""
    if switched_off(assets) is not None:
        return False
    reason = refused()
    if reason is not None:
        if reason not in _warned:
            _warned.add(reason)
            from fsdp_trace.printable import printable

            print(
                f"fsdp-trace: warning: cache off: {printable(reason)}", file=sys.stderr, flush=True
            )
        return False
    return True


def directory() -> Path:
    explicit = os.environ.get("FSDP_TRACE_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "fsdp-trace"


def max_bytes() -> int:
    """The size budget: FSDP_TRACE_CACHE_MAX_GB (default 20 GB)."""
    try:
        gb = float(os.environ.get("FSDP_TRACE_CACHE_MAX_GB", MAX_GB_DEFAULT))
    except ValueError:
        gb = MAX_GB_DEFAULT
    return int(max(gb, 0.0) * 1024**3) if math.isfinite(gb) else int(MAX_GB_DEFAULT * 1024**3)


# --- size budget, clearing, statistics ------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _File:
    path: str
    name: str
    size: int
    used: float  # mtime: entries are touched when read


def files(folder: Path) -> list[_File]:
    """The cache's files in `folder`: entries, the packed plotly.js (in its subfolder) and
    temporary files, nothing else."""
    found = []
    for where, prefix, suffix in (
        (folder, "", SUFFIX),
        (folder / PACKED_PLOTLYJS, PACKED_PREFIX, ""),
    ):
        try:
            with os.scandir(where) as items:
                for item in items:
                    name = item.name
                    ours = name.startswith(prefix) and name.endswith(suffix)
                    if not (ours or name.startswith(TMP_PREFIX)):
                        continue
                    with contextlib.suppress(OSError):
                        stat = item.stat(follow_symlinks=False)
                        found.append(_File(item.path, name, stat.st_size, stat.st_mtime))
        except OSError:
            pass
    return found


# Eviction scans the whole folder (a stat per file): after every write, a run of a thousand
# ranks would scan a folder of thousands of entries a thousand times (quadratic). While a run
# analyzes its traces (`deferred`), a write scans only once a sixteenth of the budget has
# been written since the last scan, and the run scans once when it ends.
_deferred = 0  # nesting depth of `deferred`
_worker = False  # a worker process: deferred for its life
_unscanned = 0  # bytes written since this process last scanned
DEFERRED_SHARE = 16


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Writes in this block scan for eviction only now and then (see above); the block's end
    scans the cache folder once if anything was written."""
    global _deferred
    _deferred += 1
    try:
        yield
    finally:
        _deferred -= 1
        if not _deferred and _unscanned and enabled():
            _scan(directory(), None)


def defer_for_this_process() -> None:
    """A worker process (of a pool or a Dask cluster): its writes scan only now and then (a
    pool's run scans the folder it shares with its workers when it ends; a Dask worker's own
    folder is scanned at each sixteenth of the budget it writes)."""
    global _worker
    _worker = True


def after_write(folder: Path, keep: Path) -> None:
    """A write's eviction: at once, or deferred (see above)."""
    global _unscanned
    with contextlib.suppress(OSError):
        _unscanned += keep.stat().st_size
    if (_deferred or _worker) and _unscanned < max_bytes() // DEFERRED_SHARE:
        return
    _scan(folder, keep)


def _scan(folder: Path, keep: Path | None) -> None:
    global _unscanned
    _unscanned = 0
    evict(folder, keep=keep)


def evict(folder: Path | None = None, keep: Path | None = None) -> int:
    """Delete temporary files older than an hour (a crashed writer's), then the least
    recently used entries until the folder fits the size budget; entries of other versions
    are treated like any other (never deleted for being foreign). Returns bytes freed."""
    folder = folder or directory()
    now = time.time()
    freed = 0
    kept: list[_File] = []
    for item in files(folder):
        if item.name.startswith(TMP_PREFIX) and now - item.used > TMP_MAX_AGE_S:
            with contextlib.suppress(OSError):
                os.unlink(item.path)
                freed += item.size
                continue
        kept.append(item)
    total = sum(item.size for item in kept)  # young temporary files count, but stay
    budget = max_bytes()
    for item in sorted(kept, key=lambda f: f.used):
        if total <= budget:
            break
        if item.name.startswith(TMP_PREFIX) or (keep is not None and item.path == str(keep)):
            continue
        with contextlib.suppress(OSError):
            os.unlink(item.path)
            total -= item.size
            freed += item.size
    return freed


def clear(folder: Path | None = None) -> tuple[int, int]:
    """Delete every entry, the packed plotly.js and temporary files in the cache folder (other
    files are left); returns (files deleted, bytes freed). A refused folder (another user's) is
    left alone."""
    folder = folder or directory()
    reason = refused(folder)
    if reason is not None:
        raise UserError(f"the cache is not used: {reason}; nothing deleted")
    count = freed = 0
    for item in files(folder):
        with contextlib.suppress(OSError):
            os.unlink(item.path)
            count += 1
            freed += item.size
    return count, freed
