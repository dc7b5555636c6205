"""What the client holds per rank (issue 23), measured with tracemalloc: the per-rank results
as they arrive from the workers, and what the run level adds over them.

    python benchmarks/held_per_rank.py /tmp/spd/world1000 --ranks 128

The first `--ranks` traces of the folder are analyzed as a run analyzes them (a pool of
processes, no cache: each result pickled back to this process, what every rank repeats held
once by `perrank.SharedGroups`), without their kernels as a Dask client holds them. Then, in
this process:

- **kept**: those results unpickled again and shared as the client does, held at once (the
  Python memory they take, per rank), and of it the tables (the kept result's pandas frames,
  each rank's unpickled on its own: their strings not shared across ranks, an upper bound);
- **run level**: `pipeline.analyze_run` over the results (configuration, cross-rank match,
  breakdown, diagnosis): what it still holds when it returns and its peak, per rank, with the
  lines that allocated most of what it holds.

Python's allocations only (tracemalloc): the process's RSS is benchmarks/client_rss.py's.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import pickle
import re
import sys
import tracemalloc
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _rank_number(path: Path) -> int:
    found = re.findall(r"\d+", path.stem)
    return int(found[-1]) if found else -1


def _traced(make, frames: int = 1) -> tuple[object, int, int, tracemalloc.Snapshot]:
    """(what `make()` returns, the bytes of Python memory it holds once made, the most it
    held on the way, the snapshot of what it holds: tracebacks of `frames` frames)."""
    gc.collect()
    tracemalloc.start(frames)
    before, _ = tracemalloc.get_traced_memory()
    made = make()
    gc.collect()
    after, peak = tracemalloc.get_traced_memory()
    snapshot = tracemalloc.take_snapshot()
    tracemalloc.stop()
    return made, after - before, peak - before, snapshot


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a folder of per-rank traces, rank*.json")
    parser.add_argument("--ranks", type=int, default=128, help="how many of them (the first)")
    parser.add_argument("--top", type=int, default=8, help="the run level's largest lines")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    import pandas as pd

    import fsdp_trace.pipeline as pipeline
    from fsdp_trace.analysis.job.perrank import SharedGroups

    paths = sorted(args.folder.glob("rank*.json"), key=_rank_number)[: args.ranks]
    if not paths:
        print(f"{args.folder}: no rank*.json traces", file=sys.stderr)
        return 2
    captured: dict[str, object] = {}
    original = pipeline.analyze_run

    def capture(run_in, analyses, **kwargs):
        captured.update(run_in=run_in, analyses=analyses, kwargs=kwargs)
        return original(run_in, analyses, **kwargs)

    pipeline.analyze_run = capture
    try:
        pipeline.analyze([str(p) for p in paths], jobs=None, cache=False)
    finally:
        pipeline.analyze_run = original
    # Without kernels, as a Dask client and a local run of more than a few ranks hold them (a
    # small local run keeps them: `perrank.keeps_kernels`).
    results = [r.without_kernels(False) for r in captured["analyses"]]
    n = len(results)
    blobs = [pickle.dumps(r, protocol=5) for r in results]

    def arrive() -> list:
        shared = SharedGroups()
        return [shared(pickle.loads(b)) for b in blobs]

    kept, kept_bytes, _, _ = _traced(arrive)
    tables = [
        f.name
        for f in dataclasses.fields(kept[0])
        if isinstance(getattr(kept[0], f.name), pd.DataFrame)
    ]
    per_table = {}
    for name in tables:
        table_blobs = [pickle.dumps(getattr(r, name), protocol=5) for r in kept]
        _, size, _, _ = _traced(lambda tb=table_blobs: [pickle.loads(b) for b in tb])
        per_table[name] = size
    print(f"{n} ranks of {args.folder}; pickled result {sum(map(len, blobs)) / n / 1024:.1f} KB")
    print(f"kept results, as the client holds them: {kept_bytes / n / 1024:.1f} KB a rank")
    shown = ", ".join(f"{k} {v / n / 1024:.1f}" for k, v in per_table.items())
    print(f"  of it the tables (KB a rank, strings not shared): {shown}")
    print(f"  tables in all: {sum(per_table.values()) / n / 1024:.1f} KB a rank")

    run, held, peak, snapshot = _traced(
        lambda: pipeline.analyze_run(captured["run_in"], kept, **captured["kwargs"]), frames=8
    )
    print(
        f"run level: holds {held / n / 1024:.1f} KB a rank when it returns, "
        f"{peak / n / 1024:.1f} KB a rank at its peak"
    )
    by_line: Counter[str] = Counter()
    for stat in snapshot.statistics("traceback"):
        ours = [f for f in stat.traceback if "fsdp_trace" in f.filename]
        if ours:
            frame = ours[-1]  # our innermost frame (tracemalloc lists the oldest first)
            by_line[f"{frame.filename.split('fsdp_trace/')[-1]}:{frame.lineno}"] += stat.size
    for where, size in by_line.most_common(args.top):
        print(f"  {size / n / 1024:5.1f} KB a rank  {where}")
    del run
    return 0


if __name__ == "__main__":
    sys.exit(main())
