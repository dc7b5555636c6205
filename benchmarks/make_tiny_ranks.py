"""Many small ranks for the per-rank fixed cost (issue 23): each rank a real capture cut to its
first steps.

    python benchmarks/make_tiny_ranks.py --ranks 300 --out /tmp/tiny300

Rank r is the shipped gpt-small-2gpu timing trace of rank r % 2 (`--source`: another run
directory) cut to the events that start before its `--steps`+1-th `ProfilerStep` (its first
`--steps` steps; metadata events kept), with `distributedInfo` saying rank r of `--ranks`.
Written as plain JSON, `rank{r}.json` (about 1.8 MB per step of this source). The ranks are
copies: their collectives do not match across ranks (the cheap path of the cross-rank view),
as in benchmarks/bench_dask.py.

    python benchmarks/make_tiny_ranks.py --ranks 1000 --world --out /tmp/world1000

`--world`: each rank its own process in one job of `--ranks` ranks, so that every collective
matches across all of them (the cross-rank view's full path): its host process id its own,
its collectives in one group of every rank (`Group size`, `distributedInfo.pg_config`, and
`Process Group Ranks` cut after 30 ranks as the profiler cuts it), and each NCCL kernel
starting 0–20 µs later on some ranks than on others (a late arrival: same end, shorter
kernel), so that the match has waiting to split off.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SOURCE = REPO / "sample_traces" / "gpt-small-2gpu"


def cut(trace: dict, steps: int) -> dict:
    """`trace` keeping its metadata events and the events that start before step steps+1."""
    events = trace["traceEvents"]
    starts = sorted(
        e["ts"]
        for e in events
        if e.get("ph") == "X"
        and e.get("cat") == "user_annotation"
        and str(e.get("name", "")).startswith("ProfilerStep#")
    )
    end = starts[steps] if len(starts) > steps else float("inf")
    kept = [e for e in events if e.get("ph") == "M" or ("ts" in e and e["ts"] < end)]
    return {**trace, "traceEvents": kept}


def world_rank(trace: dict, rank: int, world: int) -> dict:
    """`trace` as rank `rank`'s own in a job of `world` ranks (see `--world`)."""
    events = trace["traceEvents"]
    host = next(e["pid"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
    cut = world > 30  # the profiler writes the first 30 members, then "..."
    members = "[" + ", ".join(map(str, range(min(world, 30)))) + (", ...]" if cut else "]")
    late = ((rank * 7919) % 1000) * 0.02  # µs: this rank's late arrival at each collective
    out = []
    for e in events:
        args = e.get("args")
        if isinstance(args, dict) and "Process Group Ranks" in args:
            args = {**args, "Process Group Ranks": members, "Group size": world}
            if "Rank" in args:
                args["Rank"] = rank
            e = {**e, "args": args}
            if e.get("cat") == "kernel" and e.get("dur", 0) > late:
                e["ts"] = round(e["ts"] + late, 3)
                e["dur"] = round(e["dur"] - late, 3)
        if e.get("pid") == host:
            e = {**e, "pid": host + 1 + rank}
        out.append(e)
    group = {"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl"}
    info = {
        **trace.get("distributedInfo", {}),
        "pg_config": [{**group, "pg_size": world, "ranks": list(range(world))}],
    }
    return {**trace, "traceEvents": out, "distributedInfo": info}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--world", action="store_true", help="each rank its own, in one job")
    args = parser.parse_args()
    sources = sorted(args.source.glob("rank*.timing.json*"))
    cuts = []
    for path in sources:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as fh:
            cuts.append(cut(json.load(fh), args.steps))
    args.out.mkdir(parents=True, exist_ok=True)
    for rank in range(args.ranks):
        trace = cuts[rank % len(cuts)]
        if args.world:
            trace = world_rank(trace, rank, args.ranks)
        info = {**trace.get("distributedInfo", {}), "rank": rank, "world_size": args.ranks}
        text = json.dumps({**trace, "distributedInfo": info})
        (args.out / f"rank{rank}.json").write_text(text)
    size = sum(p.stat().st_size for p in args.out.glob("rank*.json"))
    print(f"{args.ranks} ranks, {size / args.ranks / 1e6:.2f} MB each, in {args.out}")


if __name__ == "__main__":
    main()
