"""Write the bus-bandwidth reference table (fsdp_trace/diagnose/data/busbw.csv) from analyzed
capture runs: per interconnect, group size, collective and message size, the median
transfer-time busbw of the runs' matched collectives (the tool's own numbers: the report's
bandwidth panel plots the same points). See fsdp_trace/diagnose/busbw.py for the columns.

    # the shipped table: the 2x H200 samples, copied as provisional for 4 GPUs
    python benchmarks/busbw_table.py sample_traces/gpt-small-2gpu ... --provisional-for 4 \\
        --out fsdp_trace/diagnose/data/busbw.csv
    # after a GPU session (benchmarks/gpu_runs_4gpu.sh busbw): its runs replace the curves they
    # measure, the other rows of the table are kept
    python benchmarks/busbw_table.py sample_traces/busbw-4gpu/* \\
        --merge fsdp_trace/diagnose/data/busbw.csv --out fsdp_trace/diagnose/data/busbw.csv

Runs left out, each with a line saying why: CPU (gloo) runs (no GPU kernels, so no transfer
times), runs whose run.json records no interconnect, and runs whose environment changes how
NCCL moves data (NCCL_P2P_DISABLE and the like: not what a healthy link gives). Exits 1 when
no row could be measured.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

try:  # the package as installed or on PYTHONPATH (a GPU session's carried copy), else the
    import fsdp_trace  # repository this script sits in
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import fsdp_trace

from fsdp_trace.diagnose import busbw
from fsdp_trace.runrecord import RUN_FILE, read_run

# Environment that changes the transport or the channels NCCL uses: such a run measures the
# setting, not the link.
TRANSPORT_ENV = (
    "NCCL_P2P_DISABLE",
    "NCCL_P2P_LEVEL",
    "NCCL_SHM_DISABLE",
    "NCCL_IB_DISABLE",
    "NCCL_NET",
    "NCCL_ALGO",
    "NCCL_PROTO",
    "NCCL_MAX_NCHANNELS",
    "NCCL_MIN_NCHANNELS",
    "NCCL_NCHANNELS_PER_NET_PEER",
    "CUDA_DEVICE_MAX_CONNECTIONS",
)


def measure_run(path: Path, name: str) -> tuple[str, str, str, pd.DataFrame] | str:
    """(name, interconnect, gpu, rows) for a run, or the reason it is left out."""
    if not (path / RUN_FILE).is_file():
        return "no run.json (the interconnect is recorded there)"
    record = read_run(path)
    if record.world.device == "cpu":
        return "a CPU (gloo) run: no GPU kernels, so no transfer times"
    link = record.environment.topology
    if not link:
        return "run.json records no interconnect"
    changed = [f"{k}={v}" for k, v in record.environment.env_vars.items() if k in TRANSPORT_ENV]
    if changed:
        return f"its environment sets {', '.join(changed)}: not a healthy link's figure"
    run = fsdp_trace.analyze(path, detailed=False).only
    rows = busbw.measure(run)
    if rows.empty:
        return "no matched collective with bytes and a transfer time"
    return name, link, record.environment.gpu_name or "", rows


def build(
    runs: list[str], merge: Path | None, provisional: list[int], notify=print
) -> pd.DataFrame:
    measured = []
    for raw in runs:
        got = measure_run(Path(raw), raw.rstrip("/"))
        if isinstance(got, str):
            notify(f"left out {raw}: {got}")
        else:
            measured.append(got)
            notify(f"measured {raw}: {len(got[3])} matched collectives ({got[1]}, {got[2]})")
    new = busbw.table(measured)
    if merge is not None and merge.exists():
        # the curves measured now replace the table's (provisional or not); the rest stay
        old = busbw.read_table(merge)
        now = set(map(tuple, new[busbw.KEY].astype(str).to_numpy()))
        kept = [tuple(map(str, k)) not in now for k in old[busbw.KEY].to_numpy()]
        new = pd.concat([old[kept], new], ignore_index=True)
    for gpus in provisional:
        new = pd.concat([new, busbw.provisional_rows(new, gpus)], ignore_index=True)
    return busbw.read_rows(new) if len(new) else new


def summary(table: pd.DataFrame) -> str:
    lines = []
    for (link, gpus, kind), part in table.groupby(busbw.KEY, sort=True):
        state = "provisional" if part["provisional"].any() else "measured"
        lines.append(
            f"{link:7s} {gpus} GPUs {kind:14s} {len(part):2d} sizes "
            f"{part['bytes'].min() / 1e6:9.3f}-{part['bytes'].max() / 1e6:8.1f} MB  busbw "
            f"{part['busbw_gbps'].min():6.1f}-{part['busbw_gbps'].max():6.1f} GB/s  {state}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="capture run directories")
    parser.add_argument("--out", type=Path, help="the CSV to write (default: print it)")
    parser.add_argument(
        "--merge", type=Path, help="a table whose curves not measured here are kept"
    )
    parser.add_argument(
        "--provisional-for",
        type=int,
        action="append",
        default=[],
        metavar="GPUS",
        help="copy the nearest measured group size's curves to this group size, provisional",
    )
    args = parser.parse_args(argv)
    table = build(args.runs, args.merge, args.provisional_for)
    if table.empty:
        print("no row measured: nothing written", file=sys.stderr)
        return 1
    text = busbw.to_csv(table)
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"wrote {args.out} ({len(table)} rows)")
    print(summary(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
