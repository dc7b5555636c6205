"""fsdp-trace against Holistic Trace Analysis on the same traces, side by side, in one run.

    python benchmarks/bench_vs_hta.py                      # everything; writes results/speed.md
    python benchmarks/bench_vs_hta.py --quick              # shipped samples only (a minute)
    python benchmarks/bench_vs_hta.py --cases detailed --out results/speed_detailed.md

Runs in about 35 minutes on 2 cores, most of it HTA on the 1 GB inputs (~13 min for one rank,
15 min until the limit on eight).

Each measurement is a fresh Python process (imports included):
  HTA:  `TraceAnalysis(trace_files={rank: path, ...})` + `get_comm_comp_overlap()`, with
        holistictraceanalysis 0.5.0 (installed) and, given --traceinsight DIR (or
        $FSDP_TRACE_TRACEINSIGHT), with its successor traceinsight 0.6.1 installed apart in DIR
        (`pip install --no-deps --target DIR traceinsight==0.6.1`: both install the module
        `hta`) and put first on PYTHONPATH;
  ours: `fsdp_trace.analyze(paths, jobs=J, cache=False)`, which computes the same
        overlap figure per step plus everything else (steps, per-collective attribution,
        per-block tables, exposed intervals).
Wall time is the child's; peak RSS is the largest sum of RSS over the child's process tree,
sampled every 50 ms (HTA parses several ranks in a fork pool; so does `--jobs`), beside the
largest single process (wait4's ru_maxrss). A tree past --rss-cap or --timeout is killed and
the row says so. The large inputs are generated under /tmp by make_large_trace.py (real steps of
the shipped gpt-small capture, replicated); files are read once beforehand so both tools start
from the page cache. The detailed case is the real 40.5 MB detailed trace in
benchmarks/traces/ (record_shapes + with_stack), gunzipped under --work.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "sample_traces"

HTA_CODE = r"""
import json, logging, sys, time
logging.getLogger("hta").setLevel(logging.ERROR)
from hta.trace_analysis import TraceAnalysis
files = json.loads(sys.argv[1])
t = time.perf_counter()
analysis = TraceAnalysis(trace_files={int(r): p for r, p in files.items()})
frame = analysis.get_comm_comp_overlap(visualize=False)
pct = dict(zip(frame["rank"].astype(int), frame["comp_comm_overlap_pctg"].astype(float)))
print(json.dumps({"in_process_s": time.perf_counter() - t, "overlap_pct": pct}))
"""

OURS_CODE = r"""
import json, sys, time
from fsdp_trace import analyze
files, jobs, cache = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
t = time.perf_counter()
result = analyze(list(files.values()), jobs=jobs, cache=cache)
ranks = [r for run in result.runs for r in run.ranks]
pct = {}
for r in ranks:
    comm = r.steps["comm_us"].sum()
    pct[r.rank] = round(100.0 * r.steps["overlap_us"].sum() / comm, 2) if comm else None
print(json.dumps({"in_process_s": time.perf_counter() - t, "overlap_pct": pct,
                  "steps": int(sum(len(r.steps) for r in ranks)),
                  "collectives": int(sum(len(r.collectives) for r in ranks))}))
"""


@dataclass
class Run:
    wall_s: float
    tree_rss: int  # bytes, peak of the sum over the process tree
    max_rss: int  # bytes, the largest single process (ru_maxrss)
    status: str  # "ok", "timeout", "rss cap", "failed (rc N)"
    out: dict = field(default_factory=dict)
    err: str = ""
    cpu_s: float = 0.0  # user + system seconds of the child and the children it waited for


def measure(
    code: str | None, args: list[str], timeout: float, rss_cap: int, env: dict, json_out=True
) -> Run:
    """Run `python -c code args` (code None: `python args`) in a fresh process; wall time,
    peak tree RSS, status; `json_out`: its last line of stdout is its JSON result."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, *(["-c", code] if code is not None else []), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=REPO,
        start_new_session=True,  # one process group: the whole tree can be killed
    )
    peak, status = [0], ["ok"]
    done = threading.Event()

    def sample() -> None:
        root = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                procs = [root, *root.children(recursive=True)]
                total = 0
                for p in procs:
                    with contextlib.suppress(psutil.Error):
                        total += p.memory_info().rss
                peak[0] = max(peak[0], total)
                elapsed = time.perf_counter() - start
                if total > rss_cap or elapsed > timeout:
                    status[0] = "rss cap" if total > rss_cap else "timeout"
                    os.killpg(proc.pid, signal.SIGKILL)
                    return
            except psutil.Error:
                return
            done.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out_chunks: list[bytes] = []
    err_chunks: list[bytes] = []
    readers = [
        threading.Thread(target=lambda: out_chunks.append(proc.stdout.read()), daemon=True),
        threading.Thread(target=lambda: err_chunks.append(proc.stderr.read()), daemon=True),
    ]
    for r in readers:
        r.start()
    _, raw_status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    for r in readers:
        r.join()
    proc.returncode = os.waitstatus_to_exitcode(raw_status)
    stdout = b"".join(out_chunks).decode(errors="replace")
    stderr = b"".join(err_chunks).decode(errors="replace")
    if status[0] == "ok" and proc.returncode != 0:
        status[0] = f"failed (rc {proc.returncode})"
    out = {}
    if status[0] == "ok" and json_out:
        try:
            out = json.loads(stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            status[0] = "no result"
    cpu = usage.ru_utime + usage.ru_stime
    return Run(wall, peak[0], usage.ru_maxrss * 1024, status[0], out, stderr[-2000:], cpu)


def median_run(runs: list[Run]) -> Run:
    """The run of median wall time (a failed run, if any, stands for all)."""
    failed = [r for r in runs if r.status != "ok"]
    if failed:
        return failed[0]
    return sorted(runs, key=lambda r: r.wall_s)[len(runs) // 2]


def warm(paths: list[Path]) -> None:
    for path in paths:
        with open(path, "rb") as fh:
            while fh.read(64 << 20):
                pass


def size_text(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit in ("B", "KB") else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n:.2f} GB"


def files_of(paths: list[Path]) -> dict[str, str]:
    """{rank: path} as HTA's trace_files (rank from the file name, else the position)."""
    from fsdp_trace.analysis.read.loader import rank_from_name

    out = {}
    for i, p in enumerate(paths):
        rank = rank_from_name(p)
        out[str(i if rank is None else rank)] = str(p.resolve())
    return out


def generate(out: Path, ranks: int, size: str) -> list[Path]:
    names = [out / f"rank{r}.json" for r in range(ranks)]
    if all(n.exists() for n in names):
        return names
    subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "make_large_trace.py"),
            "--size",
            size,
            "--ranks",
            str(ranks),
            "--out",
            str(out),
        ],
        check=True,
    )
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/fsdp-trace-bench"))
    parser.add_argument("--size", default="1GB", help="raw JSON size of the large trace")
    parser.add_argument("--big-ranks", type=int, default=8)
    parser.add_argument("--mid-sizes", default="100MB,300MB", help="more generated sizes")
    parser.add_argument("--timeout", type=float, default=1200, help="per run, seconds")
    parser.add_argument(
        "--timeout-many", type=float, default=900, help="per run of the many-rank input, seconds"
    )
    parser.add_argument("--rss-cap-gb", type=float, default=16, help="kill a run past this")
    parser.add_argument("--quick", action="store_true", help="shipped samples only")
    parser.add_argument("--repeat", type=int, default=3, help="runs per small input (median)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "speed.md")
    parser.add_argument(
        "--cases", default="", help="only the inputs whose label holds one of these (comma list)"
    )
    parser.add_argument(
        "--traceinsight",
        type=Path,
        default=os.environ.get("FSDP_TRACE_TRACEINSIGHT") or None,
        help="a folder holding traceinsight 0.6.1 installed apart: HTA runs with it too",
    )
    args = parser.parse_args(argv)

    env = {**os.environ, "FSDP_TRACE_CACHE": "0", "FSDP_TRACE_QUIET": "1", "PYTHONPATH": str(REPO)}
    cap = int(args.rss_cap_gb * 1e9)
    cases: list[tuple[str, list[Path], bool]] = []  # (label, files, run HTA)
    for run in ("gpt-small-2gpu", "gpt-small-2gpu-fullac"):
        timing = sorted((SAMPLES / run).glob("rank*.timing.json.gz"))
        cases.append((f"{run} rank0 timing (sample)", timing[:1], True))
        cases.append((f"{run} 2 ranks timing (sample)", timing, True))
    hta_data = REPO / "tests" / "data" / "hta" / "nccl_data_a100_pt24.json.gz"
    if hta_data.exists():
        cases.append(("HTA's nccl_data_a100 test trace", [hta_data], True))
    detailed = REPO / "benchmarks" / "traces" / "gpt-1.3b-b2-ac1.detailed.json.gz"
    if detailed.exists():
        plain = args.work / "detailed" / "rank0.json"
        if not plain.exists():
            plain.parent.mkdir(parents=True, exist_ok=True)
            plain.write_bytes(gzip.decompress(detailed.read_bytes()))
        cases.append(("real detailed trace gpt-1.3b (with_stack, record_shapes)", [plain], True))
    wanted = [w for w in args.cases.split(",") if w]

    def chosen(label: str) -> bool:
        return not wanted or any(w in label for w in wanted)

    big: list[Path] = []
    if not args.quick:  # generated inputs, made only when chosen
        for mid in filter(None, args.mid_sizes.split(",")):
            if chosen(label := f"generated {mid}, 1 rank"):
                cases.append((label, generate(args.work / mid, 1, mid), True))
        if chosen(label := f"generated {args.size}, 1 rank"):
            big = generate(args.work / "big1", 1, args.size)
            cases.append((label, big, True))
        if chosen(label := f"generated {args.size} × {args.big_ranks} ranks"):
            many = generate(args.work / f"big{args.big_ranks}", args.big_ranks, args.size)
            cases.append((label, many, True))
    cases = [c for c in cases if chosen(c[0])]
    ti_env = None
    if args.traceinsight is not None:
        ti_env = {**env, "PYTHONPATH": f"{args.traceinsight}{os.pathsep}{REPO}"}

    from fsdp_trace.analysis.read.loader import raw_size  # in this process only (not measured)

    rows, scaling = [], []
    for label, paths, with_hta in cases:
        timeout = args.timeout_many if len(paths) > 2 else args.timeout
        warm(paths)
        files = json.dumps(files_of(paths))
        raw = sum(raw_size(p) for p in paths)  # the loader's estimate (gzip's trailer)
        print(f"== {label}: {len(paths)} file(s), {size_text(raw)} raw JSON", file=sys.stderr)
        repeat = args.repeat if raw < 200e6 else 1  # small inputs: the median of a few runs
        ours = {}
        for jobs in sorted({1, min(2, len(paths))}):
            ours[jobs] = median_run(
                [
                    measure(OURS_CODE, [files, str(jobs), "0"], timeout, cap, env)
                    for _ in range(repeat)
                ]
            )
            got = ours[jobs]
            print(
                f"   ours --jobs {jobs}: {got.wall_s:.2f}s {size_text(got.tree_rss)} {got.status}",
                file=sys.stderr,
            )
        hta = (
            median_run([measure(HTA_CODE, [files], timeout, cap, env) for _ in range(repeat)])
            if with_hta
            else None
        )
        if hta is not None:
            print(
                f"   HTA: {hta.wall_s:.2f}s {size_text(hta.tree_rss)} {hta.status}", file=sys.stderr
            )
            if hta.status != "ok":
                print(hta.err[-800:], file=sys.stderr)
        ti = (
            median_run([measure(HTA_CODE, [files], timeout, cap, ti_env) for _ in range(repeat)])
            if with_hta and ti_env is not None
            else None
        )
        if ti is not None:
            print(
                f"   traceinsight: {ti.wall_s:.2f}s {size_text(ti.tree_rss)} {ti.status}",
                file=sys.stderr,
            )
        rows.append((label, paths, raw, hta, ours, ti))
        if len(paths) > 1:
            scaling.append((label, ours))

    cached = measure_cache(args, env, cap, big) if not wanted else []

    write_report(args, rows, scaling, cached, argv)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def measure_cache(args, env: dict, cap: int, big: list[Path]) -> list[tuple[str, str, Run]]:
    """First and second analysis with the cache on, from an empty cache folder: the API on
    the 2-rank sample run and on the large trace, then the whole `fsdp-trace analyze`
    command on the sample (a second run: the entries exist). Second runs of small inputs:
    the median of --repeat runs."""
    import shutil

    folder = args.work / "cache"
    shutil.rmtree(folder, ignore_errors=True)
    cache_env = {**env, "FSDP_TRACE_CACHE": "1", "FSDP_TRACE_CACHE_DIR": str(folder)}
    sample = SAMPLES / "gpt-small-2gpu"
    cases = [(f"{sample.name} (run directory: 2 ranks, timing + detailed)", [sample], True)]
    if big:
        cases.append((f"generated {args.size}, 1 rank", big, False))
    code = OURS_CODE.replace("list(files.values())", "files")  # files: a list of paths here
    out: list[tuple[str, str, Run]] = []
    for label, paths, small in cases:
        warm(
            [p for p in paths if p.is_file()]
            + [p for d in paths if d.is_dir() for p in d.iterdir()]
        )
        argv = [json.dumps([str(p) for p in paths]), "1", "1"]
        for which in ("first", "second"):
            repeat = args.repeat if small and which == "second" else 1
            run = median_run(
                [measure(code, argv, args.timeout, cap, cache_env) for _ in range(repeat)]
            )
            out.append((f"`analyze()` {label}", which, run))
            print(
                f"   cache, {which} run, {label}: {run.wall_s:.2f}s {run.status}", file=sys.stderr
            )
    cli = ["-m", "fsdp_trace", "analyze", str(sample.relative_to(REPO)), "--no-report"]
    runs = [
        measure(None, cli, args.timeout, cap, cache_env, json_out=False) for _ in range(args.repeat)
    ]
    out.append((f"`fsdp-trace {' '.join(cli[2:])}`", "second", median_run(runs)))
    return out


def fmt_run(run: Run | None) -> tuple[str, str]:
    if run is None:
        return "—", "—"
    if run.status != "ok":
        return (f"{run.status} after {run.wall_s:.0f} s", f"≥ {size_text(run.tree_rss)}")
    return f"{run.wall_s:.2f} s", size_text(run.tree_rss)


MARKER = "<!-- end of the generated part: text below is kept when the benchmark re-runs -->"


def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    parts = [f"Python {platform.python_version()}"]
    for name in ("numpy", "pandas", "msgspec", "xxhash", "HolisticTraceAnalysis"):
        try:
            parts.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            parts.append(f"{name} (not installed)")
    return ", ".join(parts)


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _pct(run: Run | None, rank: str = "0") -> str:
    if run is None or run.status != "ok":
        return "—"
    values = run.out.get("overlap_pct", {})
    value = values.get(rank, next(iter(values.values()), None)) if values else None
    return "—" if value is None else f"{value:.2f}"


def _targets(hta: Run | None, ours: Run) -> str:
    if hta is None or ours.status != "ok" or not hta.tree_rss:
        return "—"
    fast = hta.wall_s / ours.wall_s >= 10
    small = ours.tree_rss * 3 <= hta.tree_rss
    return f"{'✓' if fast else '✗'} {'✓' if small else '✗'}"


def _in_process(hta: Run | None, ours: Run) -> str:
    theirs = hta.out.get("in_process_s") if hta is not None and hta.status == "ok" else None
    mine = ours.out.get("in_process_s") if ours.status == "ok" else None
    if theirs is None or mine is None:
        return "—"
    return f"{theirs:.2f} / {mine:.2f} s ({theirs / mine:.0f}×)"


def _traceinsight(ti: Run | None, ours: Run) -> str:
    if ti is None:
        return "—"
    wall, _ = fmt_run(ti)
    speed, _ = _ratio(ti, ours)
    return f"{wall} ({speed})"


def _ratio(hta: Run | None, ours: Run) -> tuple[str, str]:
    if hta is None or ours.status != "ok":
        return "—", "—"
    speed = hta.wall_s / ours.wall_s
    memory = ours.tree_rss / hta.tree_rss if hta.tree_rss else float("nan")
    if hta.status != "ok":  # HTA was stopped: its time and memory are lower bounds
        return f"> {speed:.0f}×", f"< 1/{1 / memory:.0f}" if memory else "—"
    return f"{speed:.1f}×", f"1/{1 / memory:.1f}" if memory else "—"


def write_report(args, rows, scaling, cached, argv) -> None:
    command = "python benchmarks/bench_vs_hta.py" + "".join(f" {a}" for a in (argv or sys.argv[1:]))
    load = os.getloadavg()
    lines = [
        "# Speed and memory: fsdp-trace vs HTA (holistictraceanalysis 0.5.0, traceinsight 0.6.1)",
        "",
        f"Command (from the repository root): `{command}`",
        "",
        f"Machine: {_cpu()}, {os.cpu_count()} cores, "
        f"{psutil.virtual_memory().total / 1e9:.0f} GB RAM; {_versions()}. "
        f"Load average at the end: {load[0]:.1f} (other jobs shared the machine).",
        "",
        "Each figure is one fresh process (Python start-up and imports included). HTA: "
        "`TraceAnalysis(trace_files=...)` + `get_comm_comp_overlap()` (holistictraceanalysis "
        "0.5.0; traceinsight 0.6.1, installed apart and first on PYTHONPATH, in its own "
        "column). fsdp-trace: "
        "`fsdp_trace.analyze(paths, jobs=J, cache=False)`, i.e. every per-step, "
        "per-collective and per-block figure, not only the overlap. Peak RSS is the largest sum "
        "over the process tree (sampled every 50 ms); both tools fork workers for several ranks "
        "(HTA a pool of min(ranks, cores) processes; fsdp-trace `--jobs`). Speed-up = HTA wall "
        "/ fsdp-trace wall; memory = fsdp-trace peak / HTA peak. fsdp-trace uses `--jobs 1` for "
        "one file and `--jobs 2` for several (HTA uses both cores there too). Inputs under "
        f"200 MB: the median of {args.repeat} runs; larger ones: one run. Limits: "
        f"{args.timeout:.0f} s per run ({args.timeout_many:.0f} s on the many-rank input) and "
        f"{args.rss_cap_gb:g} GB of tree RSS; a run past either is killed and reported as "
        "such, its time and memory then being lower bounds.",
        "",
        "| input | raw JSON | HTA wall | HTA peak RSS | fsdp-trace wall | fsdp-trace peak RSS "
        "| speed-up | memory | targets ≥10×, ≤⅓ | in-process HTA / ours | "
        "overlap % rank 0: HTA / ours | traceinsight 0.6.1 wall (speed-up) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, _paths, raw, hta, ours, ti in rows:
        jobs = max(ours)
        run = ours[jobs]
        hta_wall, hta_rss = fmt_run(hta)
        our_wall, our_rss = fmt_run(run)
        speed, memory = _ratio(hta, run)
        name = f"{label}" + (f" (`--jobs {jobs}`)" if jobs > 1 else "")
        lines.append(
            f"| {name} | {size_text(raw)} | {hta_wall} | {hta_rss} | {our_wall} | {our_rss} "
            f"| {speed} | {memory} | {_targets(hta, run)} | {_in_process(hta, run)} "
            f"| {_pct(hta)} / {_pct(run)} | {_traceinsight(ti, run)} |"
        )
    lines += [
        "",
        "Overlap: HTA's figure is one ratio over the kernels launched before the last "
        "`ProfilerStep` (not clipped to steps, ns timestamps rounded to µs on some traces); "
        "ours here is Σ overlap / Σ comm over the steps as README 'Definitions' states them. "
        "They are different windows of the same quantity; `fsdp-trace analyze --hta` shows "
        "that with HTA's window both agree (README 'Cross-check with HTA').",
        "",
        "Targets: ✓/✗ for ≥ 10× HTA's speed and ≤ ⅓ of its peak RSS, whole processes. "
        "In-process: the seconds each tool's own call takes (HTA's `TraceAnalysis` + "
        "`get_comm_comp_overlap`; our `analyze`), without Python start-up and imports, and "
        "their ratio.",
        "",
        "## `--jobs` scaling (fsdp-trace, several ranks)",
        "",
        "| input | `--jobs 1` wall | peak RSS | `--jobs 2` wall | peak RSS | speed-up |",
        "|---|---|---|---|---|---|",
    ]
    for label, ours in scaling:
        one, two = ours.get(1), ours.get(2)
        if one is None or two is None:
            continue
        w1, r1 = fmt_run(one)
        w2, r2 = fmt_run(two)
        lines.append(f"| {label} | {w1} | {r1} | {w2} | {r2} | {one.wall_s / two.wall_s:.2f}× |")
    if cached:
        lines += [
            "",
            "## Cache (`cache=True`, starting from an empty cache folder)",
            "",
            "First run: parses, analyzes, writes the parsed-columns and analysis entries. "
            "Second run: hashes the file, reads the analysis entry back (nothing parsed or "
            "analyzed). Wall and RSS: the whole process; in-process: the `analyze()` call.",
            "",
            "| what | run | wall | peak RSS | in-process |",
            "|---|---|---|---|---|",
        ]
        for label, which, run in cached:
            wall, rss = fmt_run(run)
            inner = run.out.get("in_process_s")
            inner_text = f"{inner:.3f} s" if inner is not None else "—"
            lines.append(f"| {label} | {which} | {wall} | {rss} | {inner_text} |")
    lines += ["", MARKER]
    kept = ""  # notes written by hand below the marker survive a re-run
    if args.out.exists() and MARKER in args.out.read_text():
        kept = args.out.read_text().split(MARKER, 1)[1]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + (kept or "\n"))


if __name__ == "__main__":
    sys.exit(main())
