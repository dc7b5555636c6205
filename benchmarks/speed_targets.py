"""The speed targets of issue 12, each a ratio of two commands measured side by side in one run.

    python benchmarks/speed_targets.py        # all four; writes results/speed_targets.md
    python benchmarks/speed_targets.py --only imports,perfetto --runs 5

1. parse floor: `fsdp-trace analyze BIG --no-cache --no-report` against
   `python benchmarks/parse_floor.py BIG` (the typed streaming msgspec decode alone) on a
   1 GB single-rank trace made by make_large_trace.py; target ≤ 1.5×, peak RSS ≤ 1.2 GB.
2. HTA: `fsdp-trace analyze DETAILED --no-cache --no-report` against HTA's
   `TraceAnalysis(...)` + `get_comm_comp_overlap()` (holistictraceanalysis 0.5.0, and
   traceinsight 0.6.1 put first on PYTHONPATH) on the real 40.5 MB detailed trace
   (benchmarks/traces/gpt-1.3b-b2-ac1.detailed.json.gz, gunzipped); target ≥ 10×.
3. imports: `python -c "import fsdp_trace.cli as c; c.common.analyze_modules()"` (what analyze
   imports, as the command does) and `python -m fsdp_trace --help`
   against `python -c pass`; targets ≤ 0.3 s and ≤ 0.2 s above that floor.
4. perfetto: the analysis with `--perfetto OUT` against the same analysis alone; ≤ 1.5×.

Commands run in turn (A B A B ...), each a fresh process; the ratio is taken pair by pair,
so a drift in the machine's speed moves both sides. Figures: min / median / max. Wall time
and CPU time (user + system, the process and the children it waited for) come from the
operating system's accounting of the finished child (os.wait4); peak RSS: the largest sum
over the process tree, sampled every 50 ms (a process shorter than that may show less). The load
average is printed before and after each target: this 2-core machine is shared, and a busy
machine slows the two-process decode more than a one-process yardstick.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_vs_hta import HTA_CODE, Run, _cpu, measure  # noqa: E402

DETAILED = REPO / "benchmarks" / "traces" / "gpt-1.3b-b2-ac1.detailed.json.gz"
# What `fsdp-trace analyze` imports before it reads a trace (the command's own imports, its
# pipeline, the loader, the terminal rendering and the output checks).
ANALYZE_IMPORTS = (
    "fsdp_trace.cli, fsdp_trace.pipeline, fsdp_trace.analysis.read.loader, "
    "fsdp_trace.analysis.rank.analyze, fsdp_trace.diagnose.gate, fsdp_trace.render.terminal, "
    "fsdp_trace.render.export"
)
TARGETS = ("floor", "hta", "imports", "perfetto")
DEPS = "import numpy, pandas, msgspec"
MAKE_BIG = ("--size", "1GB", "--out")
PIP_APART = ("-m", "pip", "install", "-q", "--no-deps", "--target")  # as .ci/run does


@dataclass
class Side:
    label: str
    argv: list[str]  # after `python`
    env: dict[str, str]
    runs: list[Run]


def pairs(sides: list[Side], runs: int, warmup: int, timeout: float) -> None:
    """Run every side in turn, `runs` rounds after `warmup` uncounted ones."""
    for round_ in range(warmup + runs):
        for side in sides:
            run = measure(None, side.argv, timeout, 64 << 30, side.env, json_out=False)
            if run.status != "ok":
                raise SystemExit(f"{side.label}: {run.status}\n{run.err}")
            if round_ >= warmup:
                side.runs.append(run)
        print(
            "   " + "  ".join(f"{s.label}: {s.runs[-1].wall_s:.2f}s" for s in sides if s.runs),
            file=sys.stderr,
        )


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    return " / ".join(fmt.format(v) for v in (min(values), statistics.median(values), max(values)))


def ratios(a: Side, b: Side) -> list[float]:
    """A / B wall time, per round."""
    return [x.wall_s / y.wall_s for x, y in zip(a.runs, b.runs, strict=True)]


def above(a: Side, floor: Side) -> list[float]:
    """A's wall time above the floor's, per round (seconds)."""
    return [x.wall_s - y.wall_s for x, y in zip(a.runs, floor.runs, strict=True)]


def table(sides: list[Side]) -> list[str]:
    lines = [
        "| command | wall s (min / median / max) | CPU s (min / median / max) | peak RSS |",
        "|---|---|---|---|",
    ]
    for s in sides:
        wall = [r.wall_s for r in s.runs]
        cpu = [r.cpu_s for r in s.runs]
        tree = max(r.tree_rss for r in s.runs) / 2**20
        lines.append(f"| {s.label} | {spread(wall)} | {spread(cpu)} | {tree:.0f} MiB |")
    return lines


def cpu_ratios(a: Side, b: Side) -> list[float]:
    """A / B CPU time (user + system, children included), per round."""
    return [x.cpu_s / y.cpu_s for x, y in zip(a.runs, b.runs, strict=True)]


def load_text() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(TARGETS), help=f"some of {', '.join(TARGETS)}")
    parser.add_argument("--runs", type=int, default=5, help="counted rounds per target")
    parser.add_argument("--big-runs", type=int, default=3, help="rounds on the 1 GB trace")
    parser.add_argument("--work", type=Path, default=Path("/tmp/fsdp-trace-speed"))
    parser.add_argument("--big", type=Path, help="a 1 GB trace (default: made under --work)")
    parser.add_argument(
        "--traceinsight",
        type=Path,
        default=os.environ.get("FSDP_TRACE_TRACEINSIGHT"),
        help="a folder with traceinsight 0.6.1 installed apart (pip install --no-deps "
        "--target DIR traceinsight==0.6.1); default $FSDP_TRACE_TRACEINSIGHT, else installed "
        "under --work",
    )
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/speed_targets.md")
    args = parser.parse_args(argv)
    only = [t for t in args.only.split(",") if t]
    args.work.mkdir(parents=True, exist_ok=True)
    cache = Path(tempfile.mkdtemp(prefix="cache-", dir=args.work))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(FSDP_TRACE_CACHE_DIR=str(cache), FSDP_TRACE_QUIET="1", PYTHONPATH=str(REPO))
    # Byte-compiled once, as an installed package is: imports are then measured, not compiles.
    subprocess.run([sys.executable, "-m", "compileall", "-q", "fsdp_trace"], cwd=REPO, env=env)
    given = argv if argv is not None else sys.argv[1:]
    command = "python benchmarks/speed_targets.py" + "".join(f" {a}" for a in given)
    out = [
        "# Speed targets (issue 12), side by side",
        "",
        f"Command (from the repository root): `{command}`",
        "",
        f"Machine: {_cpu()}, {os.cpu_count()} cores; Python {platform.python_version()}. "
        "Every figure is a whole fresh process (start-up, imports, exit). Rounds alternate "
        "the commands; ratios are per round (min / median / max). "
        "See benchmarks/speed_targets.py for how each is measured.",
        "",
    ]
    fsdp = ["-m", "fsdp_trace"]
    if "floor" in only:
        big = args.big or args.work / "big" / "rank0.json"
        if not big.exists():
            subprocess.run(
                [sys.executable, "benchmarks/make_large_trace.py", *MAKE_BIG, str(big.parent)],
                cwd=REPO,
                check=True,
            )
        print(f"== parse floor ({load_text()})", file=sys.stderr)
        before = load_text()
        analyze = [*fsdp, "analyze", str(big), "--no-cache", "--no-report"]
        a = Side("fsdp-trace analyze BIG --no-cache --no-report", analyze, env, [])
        b = Side(
            "python benchmarks/parse_floor.py BIG", ["benchmarks/parse_floor.py", str(big)], env, []
        )
        pairs([a, b], args.big_runs, 0, 1200)
        r = ratios(a, b)
        out += [
            f"## 1. Parse floor: 1 GB single rank ({big.stat().st_size / 1e9:.2f} GB of JSON)",
            "",
            f"{before} before, {load_text()} after.",
            "",
            *table([a, b]),
            "",
            f"**analyze / floor (wall, per round): {spread(r)}×** (target ≤ 1.5×); CPU time "
            f"(both decoding processes) / floor's: {spread(cpu_ratios(a, b))}×; peak RSS of "
            f"the process tree {max(x.tree_rss for x in a.runs) / 1e9:.2f} GB (target ≤ 1.2 GB).",
            "",
        ]
    if "hta" in only:
        detailed = args.work / "detailed.json"
        if not detailed.exists():
            detailed.write_bytes(gzip.decompress(DETAILED.read_bytes()))
        ti = args.traceinsight or args.work / "traceinsight"
        if not (Path(ti) / "hta").exists():
            subprocess.run(
                [sys.executable, *PIP_APART, str(ti), "traceinsight==0.6.1"],
                check=True,
            )
        files = json.dumps({"0": str(detailed)})
        print(f"== HTA ({load_text()})", file=sys.stderr)
        before = load_text()
        analyze = [*fsdp, "analyze", str(detailed), "--no-cache", "--no-report"]
        ours = Side("fsdp-trace analyze DETAILED --no-cache --no-report", analyze, env, [])
        hta = Side("HTA 0.5.0 (holistictraceanalysis)", ["-c", HTA_CODE, files], env, [])
        ti_env = {**env, "PYTHONPATH": f"{ti}{os.pathsep}{REPO}"}
        tin = Side("traceinsight 0.6.1", ["-c", HTA_CODE, files], ti_env, [])
        pairs([ours, hta, tin], args.runs, 1, 600)
        out += [
            f"## 2. HTA: the real detailed trace ({detailed.stat().st_size / 1e6:.1f} MB of "
            "JSON, record_shapes + with_stack, gpt-1.3b on an H100)",
            "",
            f"{before} before, {load_text()} after. HTA: `TraceAnalysis(trace_files={{0: "
            "path}})` + `get_comm_comp_overlap()` in a fresh process (bench_vs_hta.py's code); "
            "traceinsight installs the same module `hta`, put first on PYTHONPATH.",
            "",
            *table([ours, hta, tin]),
            "",
            f"**HTA 0.5.0 / fsdp-trace (wall, per round): {spread(ratios(hta, ours))}×; "
            f"traceinsight 0.6.1 / fsdp-trace: {spread(ratios(tin, ours))}×** (target ≥ 10×).",
            "",
        ]
    if "imports" in only:
        print(f"== imports ({load_text()})", file=sys.stderr)
        before = load_text()
        floor = Side("python -c pass", ["-c", "pass"], env, [])
        code = ["-c", "import fsdp_trace.cli as c; c.common.analyze_modules()"]
        imports = Side("python -c 'import fsdp_trace.cli; …analyze_modules()'", code, env, [])
        modules = ["-c", f"import {ANALYZE_IMPORTS}"]
        plain = Side("python -c 'import <analyze's modules>'", modules, env, [])
        helps = Side("python -m fsdp_trace --help", [*fsdp, "--help"], env, [])
        deps = Side("python -c 'import numpy, pandas, msgspec'", ["-c", DEPS], env, [])
        pairs([floor, imports, plain, helps, deps], max(args.runs, 10), 1, 60)
        out += [
            "## 3. Imports",
            "",
            f"{before} before, {load_text()} after. What `fsdp-trace analyze` imports before "
            "it reads a trace: `fsdp_trace.cli`, then `cli.common.analyze_modules()`, the "
            "command's own import step (its modules imported with the cyclic collector paused); "
            f"beside it, a plain `import` of those modules: `{ANALYZE_IMPORTS}`.",
            "",
            *table([floor, imports, plain, helps, deps]),
            "",
            f"**Import time (wall above `python -c pass`, per round): "
            f"{spread(above(imports, floor))} s** (target ≤ 0.3 s); **`--help`: "
            f"{spread(above(helps, floor))} s** (target ≤ 0.2 s). The analysis's own "
            f"libraries alone (numpy, pandas, msgspec): {spread(above(deps, floor))} s.",
            "",
        ]
    if "perfetto" in only:
        big = args.big or args.work / "big" / "rank0.json"
        pftrace = args.work / "big.pftrace"
        print(f"== perfetto ({load_text()})", file=sys.stderr)
        before = load_text()
        base = [*fsdp, "analyze", str(big), "--no-cache", "--no-report"]
        with_pf = [*base, "--perfetto", str(pftrace)]
        a = Side("fsdp-trace analyze BIG --no-cache --no-report --perfetto OUT", with_pf, env, [])
        b = Side("fsdp-trace analyze BIG --no-cache --no-report", base, env, [])
        pairs([a, b], args.big_runs, 0, 1200)
        out += [
            "## 4. Perfetto on the 1 GB trace",
            "",
            f"{before} before, {load_text()} after; the written trace: "
            f"{pftrace.stat().st_size / 1e6:.0f} MB.",
            "",
            *table([a, b]),
            "",
            f"**with --perfetto / without (wall, per round): {spread(ratios(a, b))}×** "
            "(target ≤ 1.5×).",
            "",
        ]
        pftrace.unlink(missing_ok=True)
    shutil.rmtree(cache, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(out))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
