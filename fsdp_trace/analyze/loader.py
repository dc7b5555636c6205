"""The one trace loader: Kineto Chrome JSON (.json / .json.gz) into columnar arrays.

msgspec decodes straight into typed structs holding only the fields the analysis reads, and
the structs become numpy/pandas columns at once; Python-stack events (with_stack traces hold
~9 of them per operator) and flows are dropped on the way. Timestamps stay exact floats
(µs with ns fractions).
"""

from __future__ import annotations

import gzip
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from fsdp_trace.errors import UserError

MISSING = -1  # integer columns use -1 for "absent"


class _Args(msgspec.Struct):
    correlation: int | None = None
    external_id: int | None = msgspec.field(default=None, name="External id")
    collective_name: str | None = msgspec.field(default=None, name="Collective name")
    dtype: str | None = None
    in_nelems: int | None = msgspec.field(default=None, name="In msg nelems")
    out_nelems: int | None = msgspec.field(default=None, name="Out msg nelems")
    group_size: int | None = msgspec.field(default=None, name="Group size")
    pg_name: str | None = msgspec.field(default=None, name="Process Group Name")
    pg_desc: str | None = msgspec.field(default=None, name="Process Group Description")
    seq: int | None = msgspec.field(default=None, name="Seq")
    sequence_number: int | None = msgspec.field(default=None, name="Sequence number")
    stream: int | None = None
    name: str | None = None  # metadata events: thread / process names
    # Raw: left undecoded unless needed (only CPU collectives read them).
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input type")


class _Event(msgspec.Struct):
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float | None = None
    dur: float | None = None
    args: _Args | None = None


class _TraceFile(msgspec.Struct):
    traceEvents: list[_Event] | None = None
    schemaVersion: Any = None
    deviceProperties: Any = None
    distributedInfo: dict[str, Any] | None = None
    baseTimeNanoseconds: int | None = None
    traceName: str | None = None


_DECODER = msgspec.json.Decoder(_TraceFile)
_LIST_DECODER = msgspec.json.Decoder(list[_Event])
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
DROPPED_CATEGORIES = frozenset({"python_function", "Trace"})


@dataclass
class Trace:
    """One rank's trace as columns. `events` holds complete ('X') events only."""

    path: str
    events: pd.DataFrame
    rank: int | None = None
    world_size: int | None = None
    distributed: dict[str, Any] = field(default_factory=dict)
    device_properties: list[Any] = field(default_factory=list)
    base_time_ns: int | None = None
    thread_names: dict[tuple[int, int], str] = field(default_factory=dict)
    process_names: dict[int, str] = field(default_factory=dict)
    string_ids: dict[str, int] = field(default_factory=dict)  # string pid/tid -> negative ids
    raw_event_count: int = 0

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else Path(self.path).name


def read_bytes(path: Path) -> bytes:
    """The file's JSON text, gunzipped when it is gzip (by magic bytes, whatever the suffix)."""
    if not path.exists():
        raise UserError(f"{path}: no such file")
    if path.is_dir():
        raise UserError(f"{path}: is a directory, not a trace file")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror})") from None
    if data[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(data)
        except (EOFError, OSError, zlib.error):
            raise UserError(
                f"{path}: truncated or corrupt gzip: re-copy or re-export the trace"
            ) from None
    return data


def _decode(path: Path, data: bytes) -> _TraceFile:
    if not data.strip():
        raise UserError(f"{path}: empty file: not a Kineto trace")
    try:
        return _DECODER.decode(data)
    except msgspec.ValidationError as exc:
        # A bare list of events is an older Chrome-trace layout; accept it.
        if data.lstrip()[:1] == b"[":
            try:
                return _TraceFile(traceEvents=_LIST_DECODER.decode(data))
            except msgspec.DecodeError:
                pass
        raise UserError(f"{path}: not a Kineto trace layout ({exc})") from None
    except msgspec.DecodeError as exc:
        raise UserError(f"{path}: not valid JSON ({exc}): is the file complete?") from None


class _IdMap:
    """pid/tid values may be strings ('Spans', 'GPU 0'); give them stable negative ids."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def __call__(self, value: int | str) -> int:
        if isinstance(value, int):
            return value
        try:
            return int(value)
        except ValueError:
            return self.ids.setdefault(value, -2 - len(self.ids))


def _int_column(values: list[int | None]) -> np.ndarray:
    return np.array([MISSING if v is None else v for v in values], dtype=np.int64)


def _columns(events: list[_Event], ids: _IdMap) -> pd.DataFrame:
    """Complete events to a DataFrame; strings become categoricals (few distinct names)."""
    n = len(events)
    args = [e.args for e in events]
    has = [a is not None for a in args]

    def arg(attr: str) -> list[Any]:
        return [getattr(a, attr) if h else None for a, h in zip(args, has, strict=True)]

    frame = pd.DataFrame(
        {
            "ts": np.fromiter((e.ts for e in events), dtype=np.float64, count=n),
            "dur": np.fromiter((e.dur or 0.0 for e in events), dtype=np.float64, count=n),
            "pid": np.fromiter((ids(e.pid) for e in events), dtype=np.int64, count=n),
            "tid": np.fromiter((ids(e.tid) for e in events), dtype=np.int64, count=n),
            "cat": pd.Categorical([e.cat for e in events]),
            "name": pd.Categorical([e.name for e in events]),
            "correlation": _int_column(arg("correlation")),
            "external_id": _int_column(arg("external_id")),
            "sequence_number": _int_column(arg("sequence_number")),
            "stream": _int_column(arg("stream")),
        }
    )
    frame["end"] = frame["ts"] + frame["dur"]
    # Collective arguments exist on few events: keep them sparse-ish as nullable columns.
    coll = arg("collective_name")
    if any(v is not None for v in coll):
        frame["collective_name"] = pd.Categorical(coll)
        frame["dtype"] = pd.Categorical(arg("dtype"))
        frame["in_nelems"] = _int_column(arg("in_nelems"))
        frame["out_nelems"] = _int_column(arg("out_nelems"))
        frame["group_size"] = _int_column(arg("group_size"))
        frame["pg_name"] = pd.Categorical(arg("pg_name"))
        frame["pg_desc"] = pd.Categorical(arg("pg_desc"))
        frame["seq"] = _int_column(arg("seq"))
    return frame


def _gloo_payload(events: list[_Event], frame: pd.DataFrame) -> None:
    """Bytes of CPU (gloo) collectives, from their recorded input shapes and types."""
    mask = frame["name"].astype(str).str.startswith("gloo:").to_numpy()
    if not mask.any():
        return
    nbytes = np.full(len(frame), MISSING, dtype=np.int64)
    sizes = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8, "long int": 8, "int": 4}
    for i in np.flatnonzero(mask):
        a = events[i].args
        if a is None or not a.input_dims:
            continue
        try:
            dims = msgspec.json.decode(a.input_dims)
            types = msgspec.json.decode(a.input_type) if a.input_type else []
        except msgspec.DecodeError:
            continue
        if dims and isinstance(dims[0], list):
            numel = int(np.prod(dims[0])) if dims[0] else 1
            size = sizes.get(types[0] if types else "float", 4)
            nbytes[i] = numel * size
    frame["cpu_coll_bytes"] = nbytes


def load_trace(path: str | Path) -> Trace:
    """Parse one Kineto trace. Bad input raises UserError with a one-line message."""
    path = Path(path)
    data = read_bytes(path)
    parsed = _decode(path, data)
    del data
    if parsed.traceEvents is None:
        raise UserError(f"{path}: no 'traceEvents' key: not a Kineto trace (unknown layout)")
    raw = parsed.traceEvents
    if not raw:
        raise UserError(f"{path}: 'traceEvents' is empty: the profiler recorded nothing")
    ids = _IdMap()
    thread_names: dict[tuple[int, int], str] = {}
    process_names: dict[int, str] = {}
    complete: list[_Event] = []
    for event in raw:
        if event.ph == "X":
            if event.cat not in DROPPED_CATEGORIES and event.ts is not None:
                complete.append(event)
        elif event.ph == "M" and event.args is not None and event.args.name is not None:
            if event.name == "thread_name":
                thread_names[(ids(event.pid), ids(event.tid))] = event.args.name
            elif event.name == "process_name":
                process_names[ids(event.pid)] = event.args.name
    raw_count = len(raw)
    del raw
    parsed.traceEvents = None
    if not complete:
        raise UserError(f"{path}: no complete ('X') events: unknown or empty trace layout")
    frame = _columns(complete, ids)
    _gloo_payload(complete, frame)
    del complete

    dist_info = parsed.distributedInfo or {}
    rank = dist_info.get("rank")
    if rank is None:
        match = _RANK_IN_NAME.search(path.name)
        rank = int(match.group(1)) if match else None
    device_props = parsed.deviceProperties if isinstance(parsed.deviceProperties, list) else []
    return Trace(
        path=str(path),
        events=frame,
        rank=rank,
        world_size=dist_info.get("world_size"),
        distributed=dist_info,
        device_properties=device_props,
        base_time_ns=parsed.baseTimeNanoseconds,
        thread_names=thread_names,
        process_names=process_names,
        string_ids=ids.ids,
        raw_event_count=raw_count,
    )
