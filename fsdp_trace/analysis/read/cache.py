"""A cache of parsed traces and of their analysis, keyed by the trace file's content.

Two kinds of entry per trace file: the loader's columns (`Trace`), and one rank's analysis
(`RankAnalysis`) for given expectations (run.json's reshard settings) and source. A second
`analyze` of an unchanged file reads its analysis back and parses nothing; a `load_trace`
(Perfetto view, HTA cross-check) reads the columns back.

Where: $FSDP_TRACE_CACHE_DIR, else ~/.cache/fsdp-trace (under $XDG_CACHE_HOME when set).
The folder also keeps the packed plotly.js the HTML pages inline (`PACKED_PLOTLYJS/`, written
and read by fsdp_trace/render/plotlyjs.py under the same trust rules, keyed by plotly.js'
content): `clear` and the size budget treat it like the entries.
Off: `analyze(..., cache=False)` (parsed traces and analyses), `fsdp-trace analyze --no-cache`
(`off()`: no entry is read or written for the whole command; the packed plotly.js, which no
input shapes, still is), or FSDP_TRACE_CACHE=0 (nothing at all).
Under pytest (PYTEST_CURRENT_TEST is set) the cache is off unless FSDP_TRACE_CACHE_DIR names
a directory, so a test run never writes to the user's home.
Size: FSDP_TRACE_CACHE_MAX_GB (default 20); beyond it the least recently used entries go.

Key: a hash of the file's bytes (xxh3-128, ~0.1 s per GB from the page cache; BLAKE2b without
the `xxhash` package) and its size, plus the code version: fsdp-trace's version, the versions of
numpy, pandas and msgspec, and a hash of the source files that produce the entry (the loader
and this module for parsed columns, the whole analysis package for results). A changed file or
changed code never reads a stale entry; entries of other versions are left alone (two installed
versions can share the folder) until the size budget evicts them.

An entry is one file, written under a temporary name and renamed into place (atomic): a prefix
with a checksum (xxh3-64 of everything after it), a JSON header (the object's plain fields and
the column layout of its DataFrames), then the raw column arrays, read back with one read and no
parsing. No pickle: a corrupt or foreign entry can only fail to load (the checksum catches any
flipped byte), and then it is ignored and rewritten. The header holds the entry's key (its file
name), checked on every read: an entry renamed or copied under another key never answers for
that other trace.

Trust: only a folder of one's own is used. A cache folder owned by another user, or writable
by other users (group or world) without the sticky bit, is refused: caching is off, with one
warning line on stderr, and `fsdp-trace cache info` says why. In a sticky shared folder (like
/tmp) other users cannot replace one's files, so it is used, but an entry is read only when it
is a regular file owned by the current user and writable by no one else; anything else named
like an entry (a FIFO, a symbolic link, another user's file) is never opened.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import math
import os
import stat
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import msgspec
import numpy as np
import pandas as pd

from fsdp_trace.analysis.read import trace as trace_mod
from fsdp_trace.analysis.read.cachefolder import (  # the folder's policy, re-exported
    MAX_GB_DEFAULT as MAX_GB_DEFAULT,
)
from fsdp_trace.analysis.read.cachefolder import PACKED_PLOTLYJS as PACKED_PLOTLYJS
from fsdp_trace.analysis.read.cachefolder import PACKED_PREFIX as PACKED_PREFIX
from fsdp_trace.analysis.read.cachefolder import SUFFIX as SUFFIX
from fsdp_trace.analysis.read.cachefolder import TMP_MAX_AGE_S as TMP_MAX_AGE_S
from fsdp_trace.analysis.read.cachefolder import TMP_PREFIX as TMP_PREFIX
from fsdp_trace.analysis.read.cachefolder import after_write as after_write
from fsdp_trace.analysis.read.cachefolder import clear as clear
from fsdp_trace.analysis.read.cachefolder import defer_for_this_process as defer_for_this_process
from fsdp_trace.analysis.read.cachefolder import deferred as deferred
from fsdp_trace.analysis.read.cachefolder import directory as directory
from fsdp_trace.analysis.read.cachefolder import enabled as enabled
from fsdp_trace.analysis.read.cachefolder import evict as evict
from fsdp_trace.analysis.read.cachefolder import files as files
from fsdp_trace.analysis.read.cachefolder import max_bytes as max_bytes
from fsdp_trace.analysis.read.cachefolder import off as off
from fsdp_trace.analysis.read.cachefolder import refused as refused
from fsdp_trace.analysis.read.cachefolder import switched_off as switched_off
from fsdp_trace.runrecord import open_regular

MAGIC = b"FSDPTRC\x03"
_PREFIX = struct.Struct("<8sQQ")  # magic, checksum of the rest, header length (padded)
_ALIGN = 64

try:  # a declared dependency; the fallback keeps a broken install working, only slower
    import xxhash

    def _content_hasher():
        return xxhash.xxh3_128()

    def checksum_hasher():
        return xxhash.xxh3_64()

    HASH_NAME = "xxh3"
except ImportError:  # pragma: no cover - depends on the environment

    def _content_hasher():
        return hashlib.blake2b(digest_size=16)

    def checksum_hasher():
        return hashlib.blake2b(digest_size=8)

    HASH_NAME = "b2b"


def content_hash(path: Path) -> str:
    """Hash of the file's bytes, read in blocks into one reused buffer (~0.1 s per GB from
    the page cache; memory-mapping pays a page fault per 4 KiB instead)."""
    hasher = _content_hasher()
    buffer = bytearray(1 << 20)
    view = memoryview(buffer)
    size = 0
    with open_regular(path) as fh:
        while n := fh.readinto(buffer):
            hasher.update(view[:n])
            size += n
    return f"{HASH_NAME}-{hasher.hexdigest()}-{size}"


@functools.cache
def code_version(kind: str) -> str | None:
    """What produces an entry of `kind` ("trace" or "analysis"; "all": every source file of
    the package, what a Dask worker that assembles a run runs): package and library versions
    and a hash of the source files; None (no caching) when the sources cannot be read."""
    from fsdp_trace import __version__

    hasher = checksum_hasher()
    versions = (__version__, trace_mod.FORMAT_VERSION, np.__version__, pd.__version__)
    hasher.update(repr((*versions, msgspec.__version__, kind)).encode())
    try:
        for file in _sources(kind):
            hasher.update(file.name.encode() + b"\0" + file.read_bytes())
    except OSError:
        return None
    return hasher.hexdigest()[:16]


def _sources(kind: str) -> list[Path]:
    """The source files whose code shapes an entry of `kind`."""
    read = Path(__file__).resolve().parent  # fsdp_trace/analysis/read
    analysis = read.parent
    # Shared by the loader and the analysis: the vocabulary, run.json reading, the errors.
    shared = [analysis.parent / name for name in ("vocab.py", "runrecord.py", "errors.py")]
    # The compiled reader where built (whether or not FSDP_TRACE_READER turns it off: the
    # two readers' columns are the same, tests/test_compiled_reader.py).
    from fsdp_trace.analysis.read import columns

    module = columns.compiled_module()
    compiled = [Path(module)] if module else []
    if kind == "all":
        return sorted(analysis.parent.rglob("*.py")) + compiled
    if kind == "trace":
        names = (
            "loader.py",
            "text.py",
            "events.py",
            "columns.py",
            "parallel.py",
            "trace.py",
            "validate.py",
            "cache.py",
            "cachefolder.py",
        )
        own = [analysis / "classify.py", analysis / "table.py"]
        return [read / name for name in names] + own + shared + compiled
    # the loader (the compiled reader too), the analysis, the results
    return sorted(analysis.rglob("*.py")) + shared + compiled


class _Unsupported(TypeError):
    """A value this format does not store exactly: the entry is not written."""


# --- entries ------------------------------------------------------------------------------


@dataclasses.dataclass
class _Entry:
    """One cache file; `kind` names what it holds."""

    file: Path
    kind: str

    @property
    def key(self) -> str:
        """What the entry answers for: its file name, stored inside it too."""
        return self.file.name[: -len(SUFFIX)] if self.file.name.endswith(SUFFIX) else ""

    def trusted(self) -> bool:
        """Whether the entry is a file the cache would read (a regular file of ours that no
        one else can write: `_own`), without reading it."""
        try:
            info = os.stat(self.file, follow_symlinks=False)
        except OSError:
            return False
        return stat.S_ISREG(info.st_mode) and _own(info)

    def _read(self, cls: type, path: Path) -> Any | None:
        """The cached object (its `path` set to `path`), or None: missing, not a regular file
        of ours, corrupt, of other code, of another key, or failing its checksum."""
        try:
            with open_regular(self.file, follow_symlinks=False) as fh:
                info = os.fstat(fh.fileno())
                if not _own(info):
                    return None  # another user's file (a shared sticky folder), or writable
                data = np.empty(info.st_size, dtype=np.uint8)  # not zeroed
                if fh.readinto(memoryview(data)) != data.size:
                    return None
        except OSError:
            return None
        try:
            obj = _decode(data, cls, self.kind, self.key)
        except Exception:  # corrupt entry: ignore it; the caller recomputes and rewrites it
            return None
        obj.path = str(path)
        with contextlib.suppress(OSError):
            os.utime(self.file)  # recently used: evicted last
        return obj

    def _write(self, obj: Any) -> bool:
        """Write the entry atomically; False (and nothing left behind) when it cannot."""
        tmp = None
        try:
            self.file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=self.file.parent)
            with os.fdopen(fd, "wb") as fh:
                _encode(obj, self.kind, fh, self.key)
            os.replace(tmp, self.file)
            tmp = None
        except (OSError, ValueError, TypeError, OverflowError, msgspec.EncodeError):
            return False  # unwritable place, or a value the format does not hold
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        after_write(self.file.parent, self.file)
        return True


def _own(info: os.stat_result) -> bool:
    """A file of the current user that no one else can write: the only kind the cache reads."""
    return info.st_uid == os.geteuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def read_own(path: Path) -> bytes | None:
    """A cache file's bytes (other than entries: the packed plotly.js), read under the rules
    entries are read under (a regular file of ours, writable by no one else); None when it is
    missing, unreadable or not trusted."""
    try:
        with open_regular(path, follow_symlinks=False) as fh:
            return fh.read() if _own(os.fstat(fh.fileno())) else None
    except OSError:
        return None


def write_own(path: Path, data: bytes) -> bool:
    """Write a cache file (other than entries) atomically, as entries are written: mode 0600, a
    temporary name `clear` and the size budget know; False (nothing left) when it cannot."""
    tmp = None
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=path.parent)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
        tmp = None
    except OSError:
        return False
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    after_write(directory(), path)
    return True


class TraceEntry(_Entry):
    """The parsed columns of one trace file's content."""

    @classmethod
    def for_file(cls, path: Path, content: str | None = None) -> TraceEntry | None:
        """The entry of `path`'s content (`content`: its `content_hash`, when known)."""
        code = code_version("trace")
        if code is None:
            return None
        try:
            content = content or content_hash(path)
        except OSError:
            return None  # the loader reports unreadable files
        return cls(directory() / f"trace-{code}-{content}{SUFFIX}", "trace")

    def load(self, path: Path) -> trace_mod.Trace | None:
        return self._read(trace_mod.Trace, path)

    def store(self, trace: trace_mod.Trace) -> bool:
        return self._write(trace)


class AnalysisEntry(_Entry):
    """One rank's analysis of one trace file's content, for given analysis parameters."""

    @classmethod
    def for_file(
        cls, path: Path, params: dict[str, Any], content: str | None = None
    ) -> AnalysisEntry | None:
        """The entry of `path`'s content analyzed with `params` (JSON-able: expectations,
        source, the rank the file name gives)."""
        code = code_version("analysis")
        if code is None:
            return None
        try:
            content = content or content_hash(path)
        except OSError:
            return None
        hasher = checksum_hasher()
        hasher.update(json.dumps(params, sort_keys=True, default=repr).encode())
        name = f"analysis-{code}-{content}-{hasher.hexdigest()[:16]}{SUFFIX}"
        return cls(directory() / name, "analysis")

    @classmethod
    def of_key(cls, key: str) -> AnalysisEntry:
        """The entry named `key` (`_Entry.key`) in this machine's cache folder: what a rank's
        kernels are read again from, whatever its trace holds now."""
        return cls(directory() / f"{key}{SUFFIX}", "analysis")

    def load(self, path: Path):  # -> RankAnalysis | None
        from fsdp_trace.analysis.results import RankAnalysis

        return self._read(RankAnalysis, path)

    def store(self, result) -> bool:
        return self._write(result)


# --- the file format ------------------------------------------------------------------------


def _encode(obj: Any, kind: str, fh: BinaryIO, key: str = "") -> None:
    """Prefix, JSON header (with the entry's `key`), then every DataFrame column's array,
    each 64-byte aligned."""
    arrays: list[np.ndarray] = []
    fields: dict[str, Any] = {}
    for spec in dataclasses.fields(obj):
        value = getattr(obj, spec.name)
        if isinstance(value, pd.DataFrame):
            fields[spec.name] = {"frame": _encode_frame(value, arrays)}
        else:
            fields[spec.name] = {"value": _to_json(value)}
    layout, offset = [], 0
    for values in arrays:
        layout.append([offset, values.dtype.str, int(values.size)])
        offset += -(-values.nbytes // _ALIGN) * _ALIGN
    header = msgspec.json.encode(
        {"kind": kind, "key": key, "code": code_version(kind), "fields": fields, "arrays": layout}
    )
    header += b" " * (-(_PREFIX.size + len(header)) % _ALIGN)
    checksum = checksum_hasher()
    fh.write(_PREFIX.pack(MAGIC, 0, len(header)))
    for chunk in _chunks(header, arrays):
        checksum.update(chunk)
        fh.write(chunk)
    fh.seek(0)
    fh.write(_PREFIX.pack(MAGIC, checksum.intdigest(), len(header)))


def _chunks(header: bytes, arrays: list[np.ndarray]) -> Iterator[bytes | memoryview]:
    yield header
    for values in arrays:
        yield memoryview(values).cast("B")
        if values.nbytes % _ALIGN:
            yield b"\0" * (-values.nbytes % _ALIGN)


def _decode(data: np.ndarray, cls: type, kind: str, key: str | None = None) -> Any:
    """The object in an entry's bytes; ValueError when it is not a sound entry of `kind`
    (and, given `key`, of that key)."""
    magic, checksum, size = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise ValueError("not a cache entry")
    hasher = checksum_hasher()
    hasher.update(memoryview(data)[_PREFIX.size :])
    if hasher.intdigest() != checksum:
        raise ValueError("checksum mismatch: a damaged entry")
    start = _PREFIX.size
    meta = msgspec.json.decode(bytes(data[start : start + size]))
    if meta["kind"] != kind or meta["code"] != code_version(kind):
        raise ValueError("an entry of another kind or code version")
    if key is not None and meta.get("key") != key:
        raise ValueError("an entry of another key (renamed or copied)")
    base = start + size
    arrays = []
    for offset, dtype, count in meta["arrays"]:
        arrays.append(np.frombuffer(data, dtype=np.dtype(dtype), count=count, offset=base + offset))
    names = {f.name for f in dataclasses.fields(cls)}
    if set(meta["fields"]) != names:
        raise ValueError("fields differ")
    values = {}
    for name, spec in meta["fields"].items():
        if "frame" in spec:
            values[name] = _decode_frame(spec["frame"], arrays)
        else:
            values[name] = _from_json(spec["value"])
    return cls(**values)


def _encode_frame(frame: pd.DataFrame, arrays: list[np.ndarray]) -> dict[str, Any]:
    index = frame.index
    if not isinstance(index, pd.RangeIndex) or index.name is not None or frame.attrs:
        raise _Unsupported("only frames with a plain RangeIndex are cached")
    if not frame.columns.is_unique or not all(isinstance(c, str) for c in frame.columns):
        raise _Unsupported("column names must be unique strings")
    if isinstance(frame.columns, pd.RangeIndex):  # a frame without columns
        names = {"range": [frame.columns.start, frame.columns.stop, frame.columns.step]}
    else:
        names = {"dtype": _dtype_spec(frame.columns.dtype)}
    columns = []
    for name in frame.columns:
        spec = _encode_values(frame[name], arrays)
        spec["name"] = name
        columns.append(spec)
    return {
        "range": [index.start, index.stop, index.step],
        "names": names,
        "columns": columns,
        "rows": len(frame),
    }


def _decode_frame(spec: dict[str, Any], arrays: list[np.ndarray]) -> pd.DataFrame:
    rows = spec["rows"]
    index = pd.RangeIndex(*spec["range"])
    data = {}
    for column in spec["columns"]:
        values = _decode_values(column, arrays)
        if len(values) != rows:
            raise ValueError("column length")
        if isinstance(values, np.ndarray) and values.dtype == object:
            # A bare object array of strings would be inferred as the "str" dtype.
            values = pd.Series(values, index=index, dtype=object, copy=False)
        data[column["name"]] = values
    frame = pd.DataFrame(data, index=index, copy=False)
    names = spec["names"]
    if "range" in names:
        frame.columns = pd.RangeIndex(*names["range"])
    else:
        frame.columns = pd.Index(list(data), dtype=_dtype(names["dtype"]))
    return frame


def _dtype_spec(dtype: Any) -> dict[str, Any]:
    """A dtype of strings or numbers, as JSON (what `_dtype` rebuilds)."""
    if isinstance(dtype, pd.StringDtype):
        na = "nan" if dtype.na_value is np.nan else "NA"
        return {"type": "str", "storage": dtype.storage, "na": na}
    if isinstance(dtype, np.dtype) and dtype.kind in "biufcO":
        return {"type": "numpy", "dtype": dtype.str}
    raise _Unsupported(f"dtype {dtype}")


def _dtype(spec: dict[str, Any]) -> Any:
    if spec["type"] == "str":
        return pd.StringDtype(spec["storage"], na_value=np.nan if spec["na"] == "nan" else pd.NA)
    return np.dtype(spec["dtype"])


def _encode_values(values: pd.Series | pd.Index, arrays: list[np.ndarray]) -> dict[str, Any]:
    """One column (or categories) as arrays + JSON: numbers raw, categoricals as codes and
    categories, strings as codes into their distinct values."""
    dtype = values.dtype
    if isinstance(dtype, pd.CategoricalDtype):
        arrays.append(np.ascontiguousarray(values.array.codes))
        codes = len(arrays) - 1
        categories = _encode_values(dtype.categories, arrays)
        return {
            "kind": "cat",
            "codes": codes,
            "categories": categories,
            "ordered": bool(dtype.ordered),
        }
    if isinstance(dtype, np.dtype) and dtype.kind in "biufc":
        arrays.append(np.ascontiguousarray(values.to_numpy()))
        return {"kind": "num", "array": len(arrays) - 1}
    if isinstance(dtype, pd.StringDtype) or (isinstance(dtype, np.dtype) and dtype.kind == "O"):
        return _encode_strings(values, arrays)
    raise _Unsupported(f"column dtype {dtype}")


def _encode_strings(values: pd.Series | pd.Index, arrays: list[np.ndarray]) -> dict[str, Any]:
    """Strings (and missing values) as int32 codes into their distinct values: -1 is the
    dtype's missing value; object columns tell None (-1) from NaN (-2)."""
    codes, uniques = pd.factorize(values, use_na_sentinel=True)
    distinct = list(uniques)
    if not all(isinstance(u, str) for u in distinct):
        raise _Unsupported("a column of objects other than strings")
    codes = codes.astype(np.int32)
    spec: dict[str, Any] = {"kind": "str", "dtype": _dtype_spec(values.dtype), "values": distinct}
    if isinstance(values.dtype, np.dtype):  # object: None and NaN are told apart
        missing = np.flatnonzero(codes < 0)
        if missing.size:
            raw = np.asarray(values, dtype=object)[missing]
            is_none = np.fromiter((v is None for v in raw), dtype=bool, count=raw.size)
            is_nan = np.fromiter(
                (isinstance(v, float) and v != v for v in raw), dtype=bool, count=raw.size
            )
            if not (is_none | is_nan).all():
                raise _Unsupported("missing values other than None and NaN")
            codes[missing[is_nan]] = -2
    arrays.append(codes)
    spec["codes"] = len(arrays) - 1
    return spec


def _decode_values(spec: dict[str, Any], arrays: list[np.ndarray]) -> Any:
    kind = spec["kind"]
    if kind == "num":
        return arrays[spec["array"]]
    if kind == "cat":
        categories = pd.Index(_decode_values(spec["categories"], arrays))
        return pd.Categorical.from_codes(
            arrays[spec["codes"]], dtype=pd.CategoricalDtype(categories, spec["ordered"])
        )
    if kind == "str":
        dtype = _dtype(spec["dtype"])
        codes = arrays[spec["codes"]]
        if isinstance(dtype, pd.StringDtype):
            table = np.array([*spec["values"], dtype.na_value], dtype=object)
            return pd.array(table[codes], dtype=dtype)  # code -1 reads the last: missing
        table = np.array([*spec["values"], np.nan, None], dtype=object)
        return table[codes]  # -1: None, -2: NaN
    raise ValueError(f"unknown column kind {kind}")


def _to_json(value: Any) -> Any:
    """Plain values as JSON, tagged so that `_from_json` gives back the same types: dicts
    (any hashable keys) and tuples are tagged, non-finite floats spelled out."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$f": repr(value)}
    if isinstance(value, list):
        return [_to_json(v) for v in value]
    if isinstance(value, tuple):
        return {"$t": [_to_json(v) for v in value]}
    if isinstance(value, dict):
        return {"$d": [[_to_json(k), _to_json(v)] for k, v in value.items()]}
    if isinstance(value, np.bool_ | np.integer | np.floating):
        return {"$np": value.dtype.str, "v": _to_json(value.item())}
    raise _Unsupported(f"a value of type {type(value).__name__}")


def _from_json(value: Any) -> Any:
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "$d" in value:
        return {_from_json(k): _from_json(v) for k, v in value["$d"]}
    if "$t" in value:
        return tuple(_from_json(v) for v in value["$t"])
    if "$f" in value:
        return float(value["$f"])
    if "$np" in value:
        return np.dtype(value["$np"]).type(_from_json(value["v"]))
    raise ValueError("unknown tag")


# --- statistics ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CacheInfo:
    """What the cache folder holds (`info()`)."""

    directory: Path
    enabled: bool  # on here (FSDP_TRACE_CACHE, pytest, a refused folder)
    max_bytes: int  # the size budget
    total_bytes: int  # entries and temporary files
    traces: int  # parsed-trace entries this version reads
    analyses: int  # analysis entries this version reads
    other_versions: int  # entries of other versions or code: kept until evicted
    temporary: int  # unfinished or abandoned writes
    state: str = "on"  # "on", or "off: <why>"
    plotlyjs: int = 0  # packed plotly.js files (one per plotly.js version)

    def lines(self) -> list[str]:
        gib = 1024**3
        return [
            f"cache: {self.directory} ({self.state})",
            f"size: {self.total_bytes / gib:.2f} GiB of {self.max_bytes / gib:.2f} GiB "
            "(FSDP_TRACE_CACHE_MAX_GB)",
            f"entries: {self.traces} parsed traces, {self.analyses} analyses of this version; "
            f"{self.other_versions} of other versions; {self.temporary} temporary files",
            f"packed plotly.js (for the HTML pages): {self.plotlyjs}",
        ]


def info(folder: Path | None = None) -> CacheInfo:
    """Counts and sizes of the cache folder's entries."""
    folder = folder or directory()
    found = files(folder)
    current = {
        kind: f"{kind}-{code}-" for kind in ("trace", "analysis") if (code := code_version(kind))
    }
    traces = analyses = other = temporary = plotlyjs = 0
    for item in found:
        if item.name.startswith(TMP_PREFIX):
            temporary += 1
        elif item.name.startswith(PACKED_PREFIX):
            plotlyjs += 1
        elif "trace" in current and item.name.startswith(current["trace"]):
            traces += 1
        elif "analysis" in current and item.name.startswith(current["analysis"]):
            analyses += 1
        else:
            other += 1
    reason = switched_off() or refused(folder)
    return CacheInfo(
        directory=folder,
        enabled=reason is None,
        state="on" if reason is None else f"off: {reason}",
        max_bytes=max_bytes(),
        total_bytes=sum(item.size for item in found),
        traces=traces,
        analyses=analyses,
        other_versions=other,
        temporary=temporary,
        plotlyjs=plotlyjs,
    )
