"""The per-rank cost of `fsdp-trace analyze` over many small ranks (issue 23), side by side with
the parse floor and, optionally, another checkout, in one run.

    python benchmarks/make_tiny_ranks.py --ranks 300 --out /tmp/tiny300
    python benchmarks/make_tiny_ranks.py --ranks 60 --out /tmp/tiny60
    python benchmarks/per_rank_cost.py /tmp/tiny60 /tmp/tiny300 --before /tmp/before \\
        --runs 3 --out benchmarks/results/per_rank.md

For each folder of ranks, three commands run in turn (A B C A B C ..., each a fresh process):
`fsdp-trace analyze DIR --no-cache --no-report --jobs 1` from this checkout, the same from
`--before` (another checkout's root, put first on sys.path), and the parse floor,
`python benchmarks/parse_floor.py DIR/rank*.json` (the typed streaming msgspec decode of every
file, one after the other, nothing else). Per round: each command's wall time, its time per
rank, and its ratio to the floor's (and this checkout's to `--before`'s). With two folders, the
cost of one more rank is the slope of CPU time (user + system: steadier than wall time on a
shared machine) between them, (t(many) - t(few)) / (many - few): start-up, imports and the
run-level steps that do not grow with ranks drop out, and 1,000 ranks are extrapolated from it.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from speed_targets import Side, cpu_ratios, load_text, pairs, spread, table  # noqa: E402


def command(root: Path, args: list[str]) -> list[str]:
    """`fsdp-trace ARGS` run from the checkout at `root`, whatever the working directory
    (`python -m` would import the package found there first, not PYTHONPATH's)."""
    code = (
        f"import sys; sys.path.insert(0, {str(root)!r}); sys.argv[0] = 'fsdp-trace'; "
        "from fsdp_trace.cli import main; main()"
    )
    return ["-c", code, *args]


def sides(folder: Path, before: Path | None) -> list[Side]:
    ranks = sorted(str(p) for p in folder.glob("rank*.json"))
    analyze = ["analyze", str(folder), "--no-cache", "--no-report", "--jobs", "1"]
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env = {**base, "FSDP_TRACE_QUIET": "1", "FSDP_TRACE_CACHE": "0"}
    out = [Side("this checkout", command(REPO, analyze), env, [])]
    if before is not None:
        out.append(Side("before", command(before, analyze), env, []))
    floor = [str(REPO / "benchmarks" / "parse_floor.py"), *ranks]
    out.append(Side("parse floor", floor, base, []))
    return out


def per_round(a: Side, b: Side) -> list[float]:
    return [x.wall_s / y.wall_s for x, y in zip(a.runs, b.runs, strict=True)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", type=Path, nargs="+", help="folders of rank*.json")
    parser.add_argument("--before", type=Path, help="another checkout's root, measured beside")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--out", type=Path, help="write the markdown here (else stdout)")
    args = parser.parse_args()
    lines = [
        "# Per-rank cost over many small ranks, side by side (issue 23)",
        "",
        f"Command: `python benchmarks/per_rank_cost.py {' '.join(sys.argv[1:])}`",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}. Each figure a whole fresh process; rounds alternate "
        "the commands; ratios per round (min / median / max).",
        "",
    ]
    medians: dict[str, dict[int, float]] = {}
    for folder in args.folders:
        ranks = len(list(folder.glob("rank*.json")))
        size = sum(p.stat().st_size for p in folder.glob("rank*.json")) / ranks / 1e6
        measured = sides(folder, args.before)
        lines.append(f"## {ranks} ranks of {size:.2f} MB ({folder})")
        lines += ["", f"{load_text()} before."]
        pairs(measured, args.runs, args.warmup, args.timeout)
        lines += [f"{load_text()} after.", "", *table(measured), ""]
        floor = measured[-1]
        for side in measured[:-1]:
            per_rank = [r.wall_s / ranks * 1e3 for r in side.runs]
            cpu_rank = [r.cpu_s / ranks * 1e3 for r in side.runs]
            lines.append(
                f"- {side.label}: {spread(per_rank, '{:.1f}')} ms per rank (wall / ranks), "
                f"{spread(cpu_rank, '{:.1f}')} ms of CPU; / parse floor: wall "
                f"{spread(per_round(side, floor))}×, CPU {spread(cpu_ratios(side, floor))}×"
            )
        if args.before is not None:
            lines.append(
                f"- this checkout / before: wall {spread(per_round(measured[0], measured[1]))}×,"
                f" CPU {spread(cpu_ratios(measured[0], measured[1]))}×"
            )
        floor_ms = [r.wall_s / ranks * 1e3 for r in floor.runs]
        lines += [f"- parse floor: {spread(floor_ms, '{:.1f}')} ms per rank", ""]
        for side in measured:
            medians.setdefault(side.label, {})[ranks] = statistics.median(
                r.cpu_s for r in side.runs
            )
    counts = sorted({n for m in medians.values() for n in m})
    if len(counts) >= 2:
        few, many = counts[0], counts[-1]
        lines += [
            f"## One more rank: the slope between {few} and {many} ranks (median CPU s)",
            "",
            "| command | CPU ms per added rank | 1,000 ranks (extrapolated, CPU s) |",
            "|---|---:|---:|",
        ]
        for label, m in medians.items():
            slope = (m[many] - m[few]) / (many - few)
            thousand = m[many] + slope * (1000 - many)
            lines.append(f"| {label} | {slope * 1e3:.1f} | {thousand:.0f} s |")
        lines.append("")
    text = "\n".join(lines)
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
