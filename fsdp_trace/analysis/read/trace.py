"""A parsed trace: the columns every reader produces and the analysis reads.

Kept apart from the loader so that the cache (which stores `Trace`s) and the loader (which
uses the cache) do not import each other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fsdp_trace.analysis.table import array_of

MISSING = -1  # integer columns use -1 for "absent"
# Bump when the parsed columns change (names, dtypes, meaning): cached entries of another
# version are ignored.
FORMAT_VERSION = 4
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


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
    python_events: int = 0  # with_stack's python_function events (dropped on load)
    input_dims: bool = False  # an operator carries `Input Dims` (record_shapes)
    # What loading had to leave out or fix (impossible events, duplicates, bad distributedInfo
    # fields, integers beyond int64): each a counted notice the analysis passes on.
    notices: list[str] = field(default_factory=list)


def pg_sizes(distributed: dict) -> dict[str, float]:
    """pg_name → size from a trace's `distributedInfo.pg_config` (`pg_size`, else the ranks)."""
    out: dict[str, float] = {}
    config = distributed.get("pg_config") if isinstance(distributed, dict) else None
    for pg in config if isinstance(config, list) else []:
        if not isinstance(pg, dict) or pg.get("pg_name") is None:
            continue
        size = pg.get("pg_size")
        ranks = pg.get("ranks")
        if isinstance(size, int) and size > 0:
            out[str(pg["pg_name"])] = float(size)
        elif isinstance(ranks, list) and ranks:
            out[str(pg["pg_name"])] = float(len(ranks))
    return out


def rank_from_name(path: Path) -> int | None:
    """The rank a file name gives (`rank3.json`, `rank_3_trace.json.gz`), used when the trace
    itself does not say."""
    match = _RANK_IN_NAME.search(Path(path).name)
    return int(match.group(1)) if match else None


def trace_meta(
    trace: Trace,
    compiled_regions: int,
    device_names: list[str],
    unit_names: dict[str, str] | None = None,
) -> dict[str, Any]:
    """What a RankAnalysis keeps about its trace beyond the tables: who it is (rank, world,
    process groups), when (the absolute time base), how it was profiled (record_shapes,
    with_stack), its GPUs and compiled regions, the ids of its processes. Grouping files into
    runs reads these."""
    return {
        "world_size": trace.world_size,
        "distributed": trace.distributed,
        "device_names": device_names,
        "compiled_regions": compiled_regions,
        "base_time_ns": trace.base_time_ns,
        "record_shapes": trace.input_dims,
        "with_stack": trace.python_events > 0,
        "unit_names": unit_names or {},  # unit as shown → its raw path in the labels
        # The process (and device) ids of its first events: two ranks' traces never share
        # them with every timestamp too (`pipeline.copied_ranks`).
        "first_pids": np.unique(array_of(trace.events, "pid")[:1000]).tolist(),
    }
