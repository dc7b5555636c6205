"""Snapshot what `fsdp-trace analyze` writes for every shipped sample, and compare two snapshots.

    python scripts/outputs_snapshot.py OUT            # take a snapshot into OUT/
    python scripts/outputs_snapshot.py --compare A B  # byte-for-byte diff; exit 1 on any difference

A run folder is any folder under sample_traces/ holding run.json or a trace (*.json.gz).
For each one the snapshot keeps NAME.json (--json), NAME.csv/ (--csv), NAME.pftrace
(--perfetto), NAME.stdout (the terminal output) and NAME.rc (the exit status). Run it from
the repository root: the outputs name their inputs by the relative paths given here, so two
snapshots taken from two checkouts compare. The cache is off (--no-cache), so every number
is computed afresh.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

SAMPLES = Path("sample_traces")


def run_folders(root: Path = SAMPLES) -> list[Path]:
    found = []
    for folder in sorted(p for p in root.rglob("*") if p.is_dir()):
        names = [f.name for f in folder.iterdir() if f.is_file()]
        if "run.json" in names or any(n.endswith(".json.gz") for n in names):
            found.append(folder)
    return found


def snapshot_one(folder: Path, out: Path) -> str:
    name = "__".join(folder.relative_to(SAMPLES).parts)
    cmd = [
        sys.executable,
        "-m",
        "fsdp_trace",
        "analyze",
        str(folder),
        "--no-report",
        "--no-cache",
        "--json",
        str(out / f"{name}.json"),
        "--csv",
        str(out / f"{name}.csv"),
        "--perfetto",
        str(out / f"{name}.pftrace"),
    ]
    env = dict(os.environ, COLUMNS="120", NO_COLOR="1", TERM="dumb")
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    (out / f"{name}.stdout").write_text(done.stdout)
    (out / f"{name}.rc").write_text(f"{done.returncode}\n")
    return f"{done.returncode} {folder}"


def take(out: Path, jobs: int) -> int:
    out.mkdir(parents=True, exist_ok=True)
    folders = run_folders()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for line in pool.map(lambda f: snapshot_one(f, out), folders):
            print(line, flush=True)
    print(f"{len(folders)} run folders -> {out}")
    return 0


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def compare(a: Path, b: Path) -> int:
    fa, fb = files_under(a), files_under(b)
    bad = 0
    for name in sorted(fa ^ fb):
        print(f"only in {'A' if name in fa else 'B'}: {name}")
        bad += 1
    for name in sorted(fa & fb):
        if not filecmp.cmp(a / name, b / name, shallow=False):
            print(f"differs: {name}")
            bad += 1
    print(f"{len(fa & fb)} files compared, {bad} differences")
    return 1 if bad else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", type=Path, help="folder for a new snapshot")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"))
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    if args.out is None:
        parser.error("give OUT or --compare A B")
    return take(args.out, args.jobs)


if __name__ == "__main__":
    sys.exit(main())
