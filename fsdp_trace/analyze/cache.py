"""A cache of parsed traces: the loader's columns, keyed by the trace file's content.

Where: $FSDP_TRACE_CACHE_DIR, else ~/.cache/fsdp-trace (under $XDG_CACHE_HOME when set).
Off: `load_trace(..., cache=False)` / `fsdp-trace analyze --no-cache`, or FSDP_TRACE_CACHE=0.
Under pytest (PYTEST_CURRENT_TEST is set) the cache is off unless FSDP_TRACE_CACHE_DIR names
a directory, so a test run never writes to the user's home.

Key: a hash of the file's bytes (xxh3-128 when the `xxhash` package is installed, ~0.05 s per
GB; else BLAKE2b) and its size, plus the loader's FORMAT_VERSION, so a changed file or a changed
loader never reads a stale entry. An entry is one file, written under a temporary name and
renamed into place (atomic): a small JSON header (the trace's metadata and column layout)
followed by the raw column arrays, read back with one read and no parsing. No pickle: a
corrupt or foreign entry can only fail to load, and then it is ignored and rewritten.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fsdp_trace.analyze import loader

MAGIC = b"FSDPTRC\x00"
_ALIGN = 64
MAX_BYTES_DEFAULT = 20 * 1024**3  # entries beyond this total are evicted, oldest first

try:  # optional: much faster than hashlib on large traces
    import xxhash

    def _hasher():
        return xxhash.xxh3_128()

    HASH_NAME = "xxh3"
except ImportError:  # pragma: no cover - depends on the environment

    def _hasher():
        return hashlib.blake2b(digest_size=16)

    HASH_NAME = "b2b"


def enabled() -> bool:
    """Whether caching is on by default here (see the module docstring)."""
    if os.environ.get("FSDP_TRACE_CACHE", "1").strip().lower() in ("0", "no", "false", "off"):
        return False
    return not ("PYTEST_CURRENT_TEST" in os.environ and not os.environ.get("FSDP_TRACE_CACHE_DIR"))


def directory() -> Path:
    explicit = os.environ.get("FSDP_TRACE_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "fsdp-trace"


def content_hash(path: Path) -> str:
    """Hash of the file's bytes, read in blocks into one reused buffer (~0.2 s per GB from
    the page cache; memory-mapping pays a page fault per 4 KiB instead)."""
    hasher = _hasher()
    buffer = bytearray(1 << 20)
    view = memoryview(buffer)
    size = 0
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buffer):
            hasher.update(view[:n])
            size += n
    return f"{HASH_NAME}-{hasher.hexdigest()}-{size}"


@dataclass
class Entry:
    """The cache entry of one trace file's content."""

    file: Path

    @classmethod
    def for_file(cls, path: Path) -> Entry | None:
        try:
            key = content_hash(path)
        except OSError:
            return None  # the loader reports unreadable files
        return cls(directory() / f"v{loader.FORMAT_VERSION}-{key}.fsdptrace")

    def load(self, path: Path) -> loader.Trace | None:
        """The cached trace, or None (missing, corrupt or of another format)."""
        try:
            with open(self.file, "rb", buffering=0) as fh:
                data = np.empty(os.fstat(fh.fileno()).st_size, dtype=np.uint8)  # not zeroed
                if fh.readinto(memoryview(data)) != data.size:
                    return None
        except OSError:
            return None
        try:
            trace = _decode(data, path)
        except Exception:  # corrupt entry: ignore it; the caller parses and rewrites it
            return None
        with contextlib.suppress(OSError):
            os.utime(self.file)  # recently used: evicted last
        return trace

    def store(self, trace: loader.Trace) -> bool:
        """Write the entry atomically; False (and nothing left behind) when it cannot."""
        tmp = None
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=self.file.parent)
            with os.fdopen(fd, "wb") as fh:
                _encode(trace, fh)
            os.replace(tmp, self.file)
            tmp = None
        except (OSError, ValueError, TypeError):  # unwritable place or unexpected column
            return False
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        _evict(self.file.parent, keep=self.file)
        return True


def _column_layout(frame: pd.DataFrame) -> list[tuple[str, str, np.ndarray, list[str] | None]]:
    layout = []
    for name in frame.columns:
        column = frame[name]
        if isinstance(column.dtype, pd.CategoricalDtype):
            values = column.array
            categories = [str(c) for c in values.categories]
            layout.append((name, "cat", np.ascontiguousarray(values.codes), categories))
        else:
            layout.append((name, "num", np.ascontiguousarray(column.to_numpy()), None))
    return layout


def _encode(trace: loader.Trace, fh) -> None:
    layout = _column_layout(trace.events)
    offset = 0
    columns = []
    for name, kind, values, categories in layout:
        columns.append(
            {
                "name": name,
                "kind": kind,
                "dtype": values.dtype.str,
                "offset": offset,
                "count": int(values.size),
                "categories": categories,
            }
        )
        offset += -(-values.nbytes // _ALIGN) * _ALIGN
    meta = {
        "format": loader.FORMAT_VERSION,
        "rows": len(trace.events),
        "columns": columns,
        "payload": offset,
        "rank": trace.rank,
        "world_size": trace.world_size,
        "distributed": trace.distributed,
        "device_properties": trace.device_properties,
        "base_time_ns": trace.base_time_ns,
        "thread_names": [[p, t, n] for (p, t), n in trace.thread_names.items()],
        "process_names": [[p, n] for p, n in trace.process_names.items()],
        "string_ids": trace.string_ids,
        "raw_event_count": trace.raw_event_count,
    }
    header = json.dumps(meta).encode()
    start = len(MAGIC) + 8 + len(header)
    pad = -start % _ALIGN
    fh.write(MAGIC + struct.pack("<Q", len(header) + pad) + header + b" " * pad)
    for _, _, values, _ in layout:
        fh.write(memoryview(values).cast("B"))
        fh.write(b"\0" * (-values.nbytes % _ALIGN))


def _decode(data: np.ndarray, path: Path) -> loader.Trace:
    if data[: len(MAGIC)].tobytes() != MAGIC:
        raise ValueError("not a cache entry")
    (size,) = struct.unpack_from("<Q", data, len(MAGIC))
    start = len(MAGIC) + 8
    meta: dict[str, Any] = json.loads(bytes(data[start : start + size]))
    base = start + size
    if meta["format"] != loader.FORMAT_VERSION or base + meta["payload"] != len(data):
        raise ValueError("wrong format or truncated")
    rows = meta["rows"]
    columns: dict[str, Any] = {}
    for spec in meta["columns"]:
        values = np.frombuffer(
            data, dtype=np.dtype(spec["dtype"]), count=spec["count"], offset=base + spec["offset"]
        )
        if values.size != rows:
            raise ValueError("column length")
        if spec["kind"] == "cat":
            columns[spec["name"]] = pd.Categorical.from_codes(
                values, categories=pd.Index(spec["categories"], dtype=str)
            )
        else:
            columns[spec["name"]] = values
    return loader.Trace(
        path=str(path),
        events=pd.DataFrame(columns, copy=False),
        rank=meta["rank"],
        world_size=meta["world_size"],
        distributed=meta["distributed"],
        device_properties=meta["device_properties"],
        base_time_ns=meta["base_time_ns"],
        thread_names={(p, t): n for p, t, n in meta["thread_names"]},
        process_names={p: n for p, n in meta["process_names"]},
        string_ids=meta["string_ids"],
        raw_event_count=meta["raw_event_count"],
    )


def _evict(folder: Path, keep: Path) -> None:
    """Drop entries of other loader formats, then the oldest beyond the size budget."""
    try:
        budget = int(float(os.environ.get("FSDP_TRACE_CACHE_MAX_GB", "20")) * 1024**3)
    except ValueError:
        budget = MAX_BYTES_DEFAULT
    prefix = f"v{loader.FORMAT_VERSION}-"
    entries = []
    try:
        for item in os.scandir(folder):
            if not item.name.endswith(".fsdptrace") or item.path == str(keep):
                continue
            try:
                if not item.name.startswith(prefix):
                    os.unlink(item.path)
                    continue
                stat = item.stat()
            except OSError:
                continue
            entries.append((stat.st_mtime, stat.st_size, item.path))
        total = sum(size for _, size, _ in entries) + keep.stat().st_size
    except OSError:
        return
    for _, size, name in sorted(entries):
        if total <= budget:
            break
        try:
            os.unlink(name)
            total -= size
        except OSError:
            pass
