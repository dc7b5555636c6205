"""Trace readers, as a registry: each reader turns one file of its format into a `Trace`
(fsdp_trace/analysis/read/trace.py) with the columns below; everything after it is format-free.
Another format is one module with a `Reader` and one `register(...)` call.

The columns a reader must produce, one row per complete event (`Trace.events`):

- `ts`, `dur`, `end` (float64): start, duration and end, µs (ns fractions kept);
- `pid`, `tid` (int64): process and thread; for GPU events the device and the stream;
- `cat` (categorical): Kineto's category (`kernel`, `gpu_memcpy`, `gpu_memset`,
  `cuda_runtime`, `cuda_driver`, `cpu_op`, `user_annotation`, ...; classify.py maps them);
- `name` (categorical): kernel, operator, `FSDP::...` label, `ProfilerStep#N`;
- `correlation`, `external_id`, `sequence_number`, `stream` (int64, -1 when absent): the
  kernel ↔ launch link, `External id`, an operator's autograd `Sequence number`, a GPU
  event's stream;
- `collective_name`, `dtype`, `pg_name`, `pg_desc`, `pg_ranks` (categorical): NCCL kernels'
  `Collective name`, `dtype`, `Process Group Name/Description/Ranks`;
- `in_nelems`, `out_nelems`, `group_size`, `seq` (int64, -1 when absent): `In/Out msg
  nelems`, `Group size`, `Seq`;
- `grid`, `block` (categorical): a kernel's launch shape, as JSON text;
- `cpu_coll_bytes` (float64): gloo traces only, bytes of each CPU collective;

and on the `Trace`: `rank`, `world_size`, `distributed` (`distributedInfo`), `device_properties`,
`base_time_ns`, thread and process names, `python_events` and `input_dims` (how it was
profiled). The collective columns may be missing when no event has them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fsdp_trace.analysis.read.trace import Trace
from fsdp_trace.errors import UserError
from fsdp_trace.runrecord import RUN_FILE
from fsdp_trace.trials import TUNE_FILE

# fsdp-trace's own records, never traces: run.json, a sweep point's analysis.json
# (sweep.SUMMARY_FILE), tune's table.
SUMMARY = "analysis.json"
OWN_RECORDS = frozenset({RUN_FILE, SUMMARY, TUNE_FILE})


@dataclass(frozen=True)
class Reader:
    name: str
    suffixes: tuple[str, ...]  # file names this reader takes
    load: Callable[..., Trace]  # (path, *, cache, progress, parallel, content) -> Trace


READERS: list[Reader] = []


def register(reader: Reader) -> Reader:
    """Add a reader; the first whose suffix matches a file's name reads it."""
    if any(r.name == reader.name for r in READERS):
        raise ValueError(f"reader {reader.name!r} registered twice")
    READERS.append(reader)
    return reader


def suffixes() -> tuple[str, ...]:
    return tuple(s for r in READERS for s in r.suffixes)


def reader_for(path: Path) -> Reader:
    name = Path(path).name
    for reader in READERS:
        if name.endswith(reader.suffixes):
            return reader
    known = ", ".join(suffixes())
    raise UserError(f"{path}: not a trace this tool reads ({known})")


def load(path: str | Path, **options) -> Trace:
    """The trace at `path`, through the reader of its format (options: cache, progress,
    parallel, content — see `fsdp_trace.analysis.read.loader.load_trace`)."""
    return reader_for(Path(path)).load(path, **options)


def _kineto(path: str | Path, **options) -> Trace:
    from fsdp_trace.analysis.read.loader import load_trace

    return load_trace(path, **options)


register(Reader("Kineto Chrome JSON", (".json", ".json.gz"), _kineto))
