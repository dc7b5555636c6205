"""How much of issue 23's 1,000-rank budget the loader alone takes: every rank of a folder read
into its events table (`load_trace`, nothing after it) by a pool of `--processes` (the
default `--jobs` pool's size on 2 cores), side by side with the parse floor of the same files
(`parse_floor.py`: the typed msgspec decode, one file after another, one process).

    python benchmarks/make_tiny_ranks.py --ranks 1000 --steps 1 --world --out /tmp/spd/world1000
    python benchmarks/loader_share.py /tmp/spd/world1000 --rounds 3

Each round runs both (who goes first alternates), each a fresh process, and prints the
loader's wall time over the floor's. Issue 23 asks the whole analysis of such a folder for at
most 3x the floor: what the loader takes of it is left to nothing else (the analysis, the
kept copies, the run level, start-up and the terminal).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Runs in the measured process: argv = checkout root, folder, processes.
LOADER = r"""
import sys
from multiprocessing import get_context
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from fsdp_trace.analysis.read.loader import load_trace
def events(path):
    return len(load_trace(path, cache=False, progress=False, parallel=False).events)
if __name__ == "__main__":
    files = sorted(str(p) for p in Path(sys.argv[2]).glob("rank*.json"))
    with get_context("fork").Pool(int(sys.argv[3])) as pool:
        print(sum(pool.imap_unordered(events, files, chunksize=4)))
"""


def timed(command: list[str]) -> float:
    env = {"FSDP_TRACE_QUIET": "1", "FSDP_TRACE_CACHE": "0", "PATH": "/usr/bin:/bin"}
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, env=env)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a folder of rank*.json")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    files = sorted(str(p) for p in args.folder.glob("rank*.json"))
    loader = [sys.executable, "-c", LOADER, str(REPO), str(args.folder), str(args.processes)]
    floor = [sys.executable, str(REPO / "benchmarks" / "parse_floor.py"), *files]
    ratios = []
    print(f"{len(files)} ranks; loader in {args.processes} processes against the parse floor\n")
    print("| round | loader s | floor s | loader / floor |")
    print("|---:|---:|---:|---:|")
    for i in range(args.rounds):
        if i % 2 == 0:
            load_s, floor_s = timed(loader), timed(floor)
        else:
            floor_s, load_s = timed(floor), timed(loader)
        ratios.append(load_s / floor_s)
        print(f"| {i + 1} | {load_s:.2f} | {floor_s:.2f} | {ratios[-1]:.2f}x |")
    print(f"\nmedian loader / floor: {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    main()
