"""The fixed cost of a rank (issue 23): what one more rank costs whatever its trace's size, the
intercept of a rank's CPU time against its size, side by side with another checkout.

    for s in 1 2 4; do
        python benchmarks/make_tiny_ranks.py --ranks 40 --steps $s --out /tmp/fixed/s$s
    done
    python benchmarks/fixed_cost.py /tmp/fixed/s1 /tmp/fixed/s2 /tmp/fixed/s4 --before BASE

For each folder (ranks of one size), each checkout and each round (A B, then B A, ..., each a
fresh process): the rank's per-rank work done in one process, rank after rank, as a `--jobs`
worker does it (load the trace, `analyze_trace`, the compact copy a run keeps: `as_kept`),
and the process's CPU time per rank after three ranks of warm-up; beside it the parse floor
of the same files (the typed msgspec decode, `parse_floor.py`'s), per rank. The least CPU
time per rank over the rounds, per folder, is fitted by least squares against the ranks' size
in MB: the intercept is the fixed cost of a rank (the pandas and numpy steps a rank pays
however few its events), the slope the cost per MB. The run-level steps (the client's share,
the cross-rank view) are not in it: benchmarks/per_rank_cost.py times whole runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent

# Runs in the measured process: argv = checkout root, folder.
PROBE = r"""
import json, sys, time
from pathlib import Path
root, folder = sys.argv[1], Path(sys.argv[2])
sys.path.insert(0, root)
sys.path.insert(0, root + "/benchmarks")
from fsdp_trace.analysis.read.loader import load_trace
from fsdp_trace.analysis.rank.analyze import analyze_trace
from parse_floor import decode as floor
files = sorted(folder.glob("rank*.json"))
stages = {"load_ms": 0.0, "analyze_ms": 0.0, "kept_ms": 0.0}
def work(path):
    t0 = time.process_time()
    trace = load_trace(path, cache=False, progress=False, parallel=False)
    t1 = time.process_time()
    result = analyze_trace(trace, "trace")
    t2 = time.process_time()
    result.as_kept(False, kernels=False)
    t3 = time.process_time()
    return t1 - t0, t2 - t1, t3 - t2
for path in files[:3]:
    work(path)
    floor(str(path))
t0 = time.process_time()
for path in files:
    for name, seconds in zip(stages, work(path)):
        stages[name] += seconds / len(files) * 1e3
rank_ms = (time.process_time() - t0) / len(files) * 1e3
t0 = time.process_time()
for path in files:
    floor(str(path))
floor_ms = (time.process_time() - t0) / len(files) * 1e3
mb = sum(p.stat().st_size for p in files) / len(files) / 1e6
print(json.dumps({"rank_ms": rank_ms, "floor_ms": floor_ms, "mb": mb, **stages}))
"""


STAGES = ("load_ms", "analyze_ms", "kept_ms")


def measure(root: Path, folder: Path) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(root), str(folder)],
        check=True,
        capture_output=True,
        text=True,
        env={"FSDP_TRACE_QUIET": "1", "FSDP_TRACE_CACHE": "0", "PATH": "/usr/bin:/bin"},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def fit(mb: list[float], ms: list[float]) -> tuple[float, float]:
    """(intercept ms, slope ms per MB) of the least-squares line through the points."""
    slope, intercept = np.polyfit(np.asarray(mb), np.asarray(ms), 1)
    return float(intercept), float(slope)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", type=Path, nargs="+", help="folders of rank*.json, one size")
    parser.add_argument("--before", type=Path, help="another checkout's root, measured beside")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    checkouts = {"this checkout": REPO}
    if args.before is not None:
        checkouts["before"] = args.before.resolve()
    best: dict[tuple[str, Path], dict[str, float]] = {}
    runs: dict[tuple[str, Path], list[dict[str, float]]] = {}
    for i in range(args.rounds):
        for folder in args.folders:
            order = list(checkouts.items())
            for name, root in order if i % 2 == 0 else order[::-1]:  # who goes first alternates
                got = measure(root, folder)
                key = (name, folder)
                runs.setdefault(key, []).append(got)
                best[key] = {k: min(r[k] for r in runs[key]) for k in got}
    print(f"Least CPU time per rank over {args.rounds} rounds (ms), per folder:\n")
    print("| folder | MB a rank | " + " | ".join(checkouts) + " | parse floor |")
    print("|---|---:|" + "---:|" * (len(checkouts) + 1))
    for folder in args.folders:
        first = best[(next(iter(checkouts)), folder)]
        cells = [f"{best[(n, folder)]['rank_ms']:.1f}" for n in checkouts]
        floor_ms = min(best[(n, folder)]["floor_ms"] for n in checkouts)
        print(f"| {folder} | {first['mb']:.2f} | " + " | ".join(cells) + f" | {floor_ms:.1f} |")
    print("\nBy stage (ms a rank, each the least over the rounds): load / analyze_trace / kept\n")
    for folder in args.folders:
        parts = [
            f"{n} " + " / ".join(f"{best[(n, folder)][k]:.1f}" for k in STAGES) for n in checkouts
        ]
        print(f"- {folder}: " + "; ".join(parts))
    print("\nFitted against the size (least squares): fixed ms a rank + ms per MB\n")
    for name in checkouts:
        mb = [best[(name, f)]["mb"] for f in args.folders]
        fixed, per_mb = fit(mb, [best[(name, f)]["rank_ms"] for f in args.folders])
        print(f"- {name}: **{fixed:.1f} ms a rank** + {per_mb:.1f} ms per MB")
    mb = [best[(next(iter(checkouts)), f)]["mb"] for f in args.folders]
    floors = [min(best[(n, f)]["floor_ms"] for n in checkouts) for f in args.folders]
    fixed, per_mb = fit(mb, floors)
    print(f"- parse floor: {fixed:.1f} ms a rank + {per_mb:.1f} ms per MB")
    if args.before is None:
        return
    print("\nThe medians over the rounds, fitted the same way; this checkout / before per round\n")
    for name in checkouts:
        medians = [statistics.median(r["rank_ms"] for r in runs[(name, f)]) for f in args.folders]
        fixed, per_mb = fit(mb, medians)
        print(f"- {name}: {fixed:.1f} ms a rank + {per_mb:.1f} ms per MB")
    for folder in args.folders:
        pairs = zip(runs[("this checkout", folder)], runs[("before", folder)], strict=True)
        ratios = [a["rank_ms"] / b["rank_ms"] for a, b in pairs]
        shown = ", ".join(f"{r:.2f}" for r in ratios)
        print(f"- {folder}: {shown} (median {statistics.median(ratios):.2f})")


if __name__ == "__main__":
    main()
