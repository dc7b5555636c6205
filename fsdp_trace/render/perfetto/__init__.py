"""The annotated Perfetto view: an analysis written as a protobuf TrackEvent trace.

Per rank, one process track ("rank R") holding
- the GPU streams, named by their role ("stream 7 (compute)"), with every kept GPU event
  (read again: a run does not hold its ranks' kernels, `RankAnalysis.load_kernels`);
- the CPU threads with their cpu_op / user_annotation slices (reloaded from the rank's trace);
- tracks fsdp-trace adds: "exposed communication" (one slice per interval of C \\ K),
  "FSDP collectives" (each NCCL collective named with what matters at a glance,
  "AG layers.3 bwd · 25.2 MB · 97 GB/s · 0.44 ms exposed", and every figure kept as arguments:
  block, phase, bytes, bandwidth, exposed time, ...), flow arrows from each all-gather to the
  first compute kernel of the block that consumes it, and the counter "exposed µs per step".

The file is ordered as trace processor reads it best: every track descriptor, then the interned
strings (event names, categories, argument names and string values, on the one packet
sequence), then every event in timestamp order across all tracks and ranks. Events are
serialized as they are made into a spill file beside the output, with only their timestamps
and offsets kept in memory, then copied out in timestamp order (a stable sort, so each track
keeps its begin/end order at equal timestamps). The output is a temporary file renamed at the
end: a failed or interrupted write leaves nothing behind.

A slice track must hold strictly nested slices; where the input's do not nest (kernels that
overlap on one stream, CPU ops cut by clock rounding, concurrent collectives), the slices that
do not fit go to extra lanes, sibling tracks named "<track> [2]", "[3]", ...

Rooms: `wire` (the protobuf encoding), `file` (the file's order, interning, lanes), `ranks`
(each rank's tracks); `write_perfetto` here joins them.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from fsdp_trace.atomic import atomic_open
from fsdp_trace.errors import UserError
from fsdp_trace.render.perfetto.file import Writer
from fsdp_trace.render.perfetto.ranks import RankWriter


def write_perfetto(
    analysis: Any,
    path: Path,
    *,
    include_detailed: bool = False,
    cpu: bool = True,
    cache: bool = True,
) -> dict[str, Any]:
    """Write `analysis` (a `Result`, or one `RunAnalysis`) as an annotated Perfetto trace at
    `path` (atomically: a temporary file in the same folder, renamed at the end). Returns
    counts of what was written: tracks, slices per kind (gpu, cpu, collective, exposed),
    flows, counter values, per rank."""
    path = Path(path)
    runs = analysis.runs if hasattr(analysis, "runs") else [analysis]
    items = [
        r
        for run in runs
        for r in list(run.ranks) + (list(run.detailed) if include_detailed else [])
    ]
    if not items:
        raise UserError("nothing to write to the Perfetto trace: the analysis holds no trace")
    started = time.perf_counter()
    per_rank = []
    with (
        atomic_open(path, "wb", buffering=1 << 20) as handle,
        tempfile.TemporaryFile(prefix=f".{path.name}.", suffix=".spill", dir=path.parent) as spill,
    ):
        writer = Writer(handle, spill)
        for index, rank in enumerate(items):
            per_rank.append(RankWriter(writer, rank, index, cache).write(cpu=cpu))
        writer.finish()
    slices: dict[str, int] = {}
    for item in per_rank:
        for kind, count in item["slices"].items():
            if kind != "counter":
                slices[kind] = slices.get(kind, 0) + count
    return {
        "path": str(path),
        "bytes": path.stat().st_size,
        "ranks": len(per_rank),
        "tracks": writer.tracks,
        "lanes": sum(item["lanes"] for item in per_rank),
        "slices": slices,
        "flows": writer.flows,
        "counters": writer.counters,
        "packets": writer.packets,
        "seconds": time.perf_counter() - started,
        "per_rank": per_rank,
    }
