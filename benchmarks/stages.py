"""Where `fsdp-trace analyze` spends its time, stage by stage, in one process.

    python benchmarks/stages.py /tmp/big/rank0.json                    # this checkout
    git worktree add /tmp/before 543437d
    python benchmarks/stages.py /tmp/big/rank0.json --repo /tmp/before  # another version
    python benchmarks/stages.py TRACE --rounds 3 --repo /tmp/before --vs  # both, in turn

Each round runs `fsdp-trace analyze TRACE --no-cache --no-report` in a fresh process of the
given checkout, with its stages wrapped: imports, the decode (the two-process decode of a
large file, or the one-process one), merging the batches, building the frame, validating the
events, the per-rank analysis, the run's analysis (configuration, cross-rank view,
breakdown, diagnosis), the terminal output. Per stage: wall seconds and the main process's
CPU seconds; the decode also gives the helper process's CPU seconds. Prints a Markdown table
of the medians over the rounds (with --vs, one column pair per checkout).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Runs inside the measured process: wraps the stages, then runs the command.
PROBE = r"""
import json, os, resource, sys, time
start = time.perf_counter()
marks = {}
def cpu():
    return time.process_time()
def helper_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime
def add(name, wall, main, helper=0.0):
    w, m, h = marks.get(name, (0.0, 0.0, 0.0))
    marks[name] = (w + wall, m + main, h + helper)
t0, c0 = time.perf_counter(), cpu()
import fsdp_trace.cli as cli
from fsdp_trace.analysis.job import perrank
from fsdp_trace.analysis.rank import analyze as rank
from fsdp_trace.analysis.read import columns, loader, validate
import fsdp_trace.pipeline as pipeline
from fsdp_trace.render import terminal
add("imports", time.perf_counter() - start, cpu())
def wrap(owner, name, stage, children=False):
    f = getattr(owner, name)
    def wrapped(*a, **k):
        t, c, h = time.perf_counter(), cpu(), helper_cpu()
        try:
            return f(*a, **k)
        finally:
            add(stage, time.perf_counter() - t, cpu() - c, helper_cpu() - h if children else 0.0)
    setattr(owner, name, wrapped)
wrap(loader, "stream_parallel", "decode + columns (two processes)", children=True)
wrap(loader, "_stream", "decode + columns (one process)")
wrap(columns.Columns, "merge", "merge the batches")
wrap(columns.Columns, "frame", "frame")
wrap(validate, "events", "validate")
wrap(perrank, "analyze_trace", "analyze_trace (per rank)")
wrap(pipeline, "analyze_run", "analyze_run (config, cross-rank, breakdown, diagnosis)")
wrap(terminal, "render", "terminal output")
sys.argv = ["fsdp-trace", "analyze", sys.argv[1], "--no-cache", "--no-report"]
out = sys.stdout
sys.stdout = open(os.devnull, "w")
try:
    cli.main()
except SystemExit:
    pass
sys.stdout = out
total = time.perf_counter() - start
add("whole process (in it)", total, cpu(), helper_cpu())
print(json.dumps(marks))
"""


def run(repo: Path, trace: Path, cache: Path) -> dict[str, tuple[float, float, float]]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPATH=str(repo), FSDP_TRACE_CACHE_DIR=str(cache), FSDP_TRACE_QUIET="1")
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(trace)],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout to measure")
    parser.add_argument("--vs", action="store_true", help="also this checkout, in turn")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/fsdp-trace-stages-cache"))
    args = parser.parse_args(argv)
    repos = [args.repo.resolve()] + ([REPO] if args.vs and args.repo.resolve() != REPO else [])
    for repo in repos:
        subprocess.run([sys.executable, "-m", "compileall", "-q", "fsdp_trace"], cwd=repo)
    results: dict[Path, list[dict]] = {repo: [] for repo in repos}
    for _ in range(args.rounds):
        for repo in repos:
            results[repo].append(run(repo, args.trace, args.cache))
            print(
                f"   {repo}: {results[repo][-1]['whole process (in it)'][0]:.2f}s", file=sys.stderr
            )
    stages = list(dict.fromkeys(s for rounds in results.values() for r in rounds for s in r))
    head = "| stage |" + "".join(
        f" {_name(r)}: wall s | main CPU s | helper CPU s |" for r in repos
    )
    lines = [head, "|---|" + "---|---|---|" * len(repos)]
    for stage in stages:
        cells = []
        for repo in repos:
            values = [r.get(stage) for r in results[repo]]
            if any(v is None for v in values):
                cells.append(" — | — | — |")
                continue
            wall, main, helper = (statistics.median(v[i] for v in values) for i in range(3))
            helper_text = f"{helper:.2f}" if helper else ""
            cells.append(f" {wall:.2f} | {main:.2f} | {helper_text} |")
        lines.append(f"| {stage} |" + "".join(cells))
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    size = args.trace.stat().st_size / 1e9
    print(f"{args.trace} ({size:.2f} GB), medians of {args.rounds} rounds; load average {load}")
    print("\n".join(lines))
    return 0


def _name(repo: Path) -> str:
    head = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    return f"{'this checkout' if repo == REPO else repo.name} ({head or '?'})"


if __name__ == "__main__":
    sys.exit(main())
