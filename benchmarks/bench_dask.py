"""Ranks analyzed per minute on a Dask cluster against its number of workers, and the client's
peak RSS beside it (issue 12).

    python benchmarks/bench_dask.py --ranks 16 64 --workers 1 2 4 --size 100MB \\
        --root /tmp/fsdp-trace-dask-bench --out benchmarks/results/dask.md

For each rank count, `benchmarks/make_large_trace.py` writes that many ranks of `--size` raw
JSON each (the shipped gpt-small-2gpu timing traces replicated, ranks aligned step by step)
under `--root`. For each worker count a fresh cluster is started as a user would start one:
`dask scheduler` and that many `dask worker --nthreads 1` processes on 127.0.0.1. The client
is a separate process running `fsdp_trace.analyze(DIR, client=Client(ADDRESS), cache=False)`
(the workers parse every trace: nothing cached), timed from the call to the result, so the
cluster's start-up is not counted but the workers' first imports are; its peak RSS is its
own `ru_maxrss`, the cluster's processes not included. `--jobs 1` without Dask (the whole
analysis in one process) is measured beside it. With two rank counts or more, the client's
peak RSS per added rank (the slope between the fewest and the most ranks, per worker count)
is written below the table: what the client holds per rank. The generated traces are
deleted at the end (`--keep` keeps them).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# What README's "Scaling out with Dask" says to start `dask worker` with (set in the shell, they
# take precedence over Dask's MALLOC_TRIM_THRESHOLD_=65536; fsdp_trace/analysis/job/cluster.py).
WORKER_MALLOC = {"MALLOC_TRIM_THRESHOLD_": "134217728", "MALLOC_MMAP_THRESHOLD_": "33554432"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _path() -> str:
    """PYTHONPATH for the processes started here: this checkout first (installed or not)."""
    return os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)


def generate(folder: Path, ranks: int, size: str) -> None:
    """`ranks` traces of `size` raw JSON each in `folder` (kept when already there)."""
    if folder.is_dir() and len(list(folder.glob("rank*.json"))) == ranks:
        return
    subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "make_large_trace.py"),
            "--size",
            size,
            "--ranks",
            str(ranks),
            "--out",
            str(folder),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@contextlib.contextmanager
def cluster(workers: int, logs: Path, trim: bool = False):
    """`dask scheduler` + `workers` × `dask worker --nthreads 1` on 127.0.0.1; stopped after.
    `trim`: keep Dask's default MALLOC_TRIM_THRESHOLD_=65536 on the workers."""
    from distributed import Client

    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = {**os.environ, "FSDP_TRACE_CACHE": "0", "PYTHONPATH": _path()}
    for name in WORKER_MALLOC:
        env.pop(name, None)
    if not trim:  # workers as README says to start them, not with Dask's malloc trim setting
        env.update(WORKER_MALLOC)
    dask = [sys.executable, "-m", "dask"]
    procs = []

    def start(args: list[str], name: str) -> None:
        log = open(logs / f"{name}.log", "wb")  # noqa: SIM115 - lives as long as the process
        procs.append(
            subprocess.Popen(
                dask + args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        )

    try:
        start(["scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"], "s")
        for i in range(workers):
            start(
                ["worker", address, "--nthreads", "1", "--no-dashboard", "--host", "127.0.0.1"],
                f"w{i}",
            )
        with Client(address, timeout=60) as probe:
            probe.wait_for_workers(workers, timeout=120)
        yield address
    finally:
        for proc in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(procs):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def client_run(folder: Path, address: str | None) -> dict:
    """One analysis in a fresh process (on the cluster at `address`, else `--jobs 1`)."""
    done = subprocess.run(
        [sys.executable, __file__, "--client", str(folder), "--address", address or ""],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "FSDP_TRACE_CACHE": "0", "FSDP_TRACE_QUIET": "1", "PYTHONPATH": _path()},
        timeout=1800,
    )
    if done.returncode != 0:
        raise SystemExit(f"client failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def client_main(folder: str, address: str) -> None:
    """The measured client: analyze, then print seconds, ranks and peak RSS as JSON."""
    import pickle
    import resource

    import fsdp_trace

    client = None
    if address:
        from distributed import Client

        client = Client(address, timeout=60)
    start = time.perf_counter()
    result = fsdp_trace.analyze(folder, client=client, cache=False)
    seconds = time.perf_counter() - start
    missing = [n for n in result.runs[0].notices if "missing" in n]
    back = len(pickle.dumps(result.ranks[0]))
    if client is not None:
        client.close()
    print(
        json.dumps(
            {
                "seconds": seconds,
                "ranks": len(result.ranks),
                "missing": missing,
                "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "result_mb_per_rank": back / 1e6,
            }
        )
    )


def machine() -> str:
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    import importlib.util

    import distributed
    import pandas

    arrow = "with" if importlib.util.find_spec("pyarrow") else "without"
    return (
        f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM, Python {platform.python_version()}, "
        f"distributed {distributed.__version__}, pandas {pandas.__version__} ({arrow} "
        f"pyarrow), Linux {platform.release()}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument(
        "--default-trim-workers",
        type=int,
        nargs="*",
        default=[],
        help="also run these worker counts with Dask's MALLOC_TRIM_THRESHOLD_=65536 left on",
    )
    parser.add_argument("--size", default="100MB", help="raw JSON per rank")
    parser.add_argument("--root", type=Path, default=Path("/tmp/fsdp-trace-dask-bench"))
    parser.add_argument("--out", type=Path, help="write the results as Markdown here")
    parser.add_argument("--keep", action="store_true", help="keep the generated traces")
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        client_main(args.client, args.address)
        return
    command = "python benchmarks/bench_dask.py " + shlex.join(sys.argv[1:])
    rows = []
    try:
        for ranks in args.ranks:
            folder = args.root / f"ranks{ranks}"
            started = time.perf_counter()
            generate(folder, ranks, args.size)
            gb = sum(p.stat().st_size for p in folder.glob("rank*.json")) / 1e9
            print(f"{ranks} ranks, {gb:.2f} GB: {time.perf_counter() - started:.0f} s to write")
            runs = [("--jobs 1 (no Dask)", None, False)]
            runs += [(f"{w}, Dask's malloc trim", w, True) for w in args.default_trim_workers]
            runs += [(f"{w}", w, False) for w in args.workers]
            for label, workers, trim in runs:
                if workers is None:
                    got = client_run(folder, None)
                else:
                    logs = args.root / f"logs-{ranks}-{workers}-{trim}"
                    logs.mkdir(parents=True, exist_ok=True)
                    with cluster(workers, logs, trim) as address:
                        got = client_run(folder, address)
                assert got["ranks"] == ranks and not got["missing"], got
                row = {"ranks": ranks, "gb": gb, "workers": label, **got}
                row["per_min"] = 60 * ranks / got["seconds"]
                rows.append(row)
                print(
                    f"  workers {label}: {got['seconds']:.1f} s, {row['per_min']:.1f} ranks/min, "
                    f"client peak RSS {got['rss_mb']:.0f} MB",
                    flush=True,
                )
    finally:
        if not args.keep:
            import shutil

            shutil.rmtree(args.root, ignore_errors=True)
    for label, mb in per_rank(rows).items():
        print(f"  workers {label}: client peak RSS {mb:.2f} MB per added rank")
    if args.out:
        write(args.out, rows, command, args.size)


def per_rank(rows: list[dict]) -> dict[str, float]:
    """Per worker count: (peak RSS at the most ranks − at the fewest) ÷ the ranks between,
    the client's memory per rank (its code and the cluster's connection cancel out)."""
    out = {}
    for label in dict.fromkeys(r["workers"] for r in rows):
        mine = sorted((r for r in rows if r["workers"] == label), key=lambda r: r["ranks"])
        if len(mine) > 1 and mine[-1]["ranks"] > mine[0]["ranks"]:
            rise = mine[-1]["rss_mb"] - mine[0]["rss_mb"]
            out[label] = rise / (mine[-1]["ranks"] - mine[0]["ranks"])
    return out


def write(out: Path, rows: list[dict], command: str, size: str) -> None:
    lines = [
        "# Dask: ranks per minute against workers, client peak RSS",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {machine()}.",
        "",
        f"Traces: generated by `benchmarks/make_large_trace.py --size {size} --ranks N` "
        "(gpt-small-2gpu timing traces replicated; plain JSON). Nothing cached (the workers "
        "parse every trace). The client is its own process; its peak RSS excludes the "
        "cluster's processes. Cluster start-up is not timed; the workers' first imports are.",
        "",
        "| ranks | GB of JSON | workers | seconds | ranks / min | client peak RSS (MB) "
        "| result per rank (MB, pickled) |",
        "|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['ranks']} | {r['gb']:.1f} | {r['workers']} | {r['seconds']:.1f} | "
            f"{r['per_min']:.1f} | {r['rss_mb']:.0f} | {r['result_mb_per_rank']:.2f} |"
        )
    slopes = per_rank(rows)
    if slopes:
        lines += ["", "| workers | client peak RSS per added rank (MB) |", "|---|---:|"]
        lines += [f"| {label} | {mb:.2f} |" for label, mb in slopes.items()]
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
