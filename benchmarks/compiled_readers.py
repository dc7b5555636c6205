"""Compiled columnar JSON readers from PyPI wheels against the parse floor, on one large trace.

    python benchmarks/compiled_readers.py /tmp/big/rank0.json --python /tmp/pv/bin/python

Issue 12 asks for 1 GB analyzed in ≤ 1.5x the parse floor (the typed streaming msgspec decode
of the fields the analysis reads, benchmarks/parse_floor.py) and welcomes a compiled parser if
it installs from a PyPI wheel. The loader's own decode is the floor's; what it adds is building
columns from the decoded Structs (~40-50 ns per field per event at Python level). A reader that
produced the columns directly in compiled code would remove that. This script measures the
candidates with wheels on PyPI, each in a fresh process reading the same file into the same
columns (ph, cat, name, pid, tid, ts, dur and the dense `args` integers), beside the floor:

- pyarrow.json.read_json (explicit schema; the `traceEvents` array rewritten as one object per
  line, which it needs; the rewrite is timed apart),
- polars.read_json (explicit schema, the `traceEvents` array cut out of the file),
- duckdb's read_json (the file as is, the array unnested in SQL).

`--python` names an interpreter that has pyarrow, polars and duckdb installed (they are not the
project's dependencies), e.g. `python -m venv /tmp/pv && /tmp/pv/bin/pip install pyarrow polars
duckdb numpy`. Each reader prints its row count; a reader that fails says why in its row.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_vs_hta import _cpu  # noqa: E402

# Each snippet reads sys.argv[1] into columns and prints "rows <n>" (and timing notes) on stderr.
_CUT = """
import re, sys, time
path = sys.argv[1]
data = open(path, "rb").read()
start = data.index(b"[", data.index(b'"traceEvents"')) + 1
end = data.rindex(b"]")
"""

READERS: dict[str, str] = {
    "pyarrow.json.read_json": _CUT
    + """
import pyarrow as pa, pyarrow.json as pj
t = time.perf_counter()
lines = re.sub(rb"\\}\\s*,\\s*\\{", b"}\\n{", data[start:end])
del data
rewrite = time.perf_counter() - t
args = pa.struct([("correlation", pa.int64()), ("External id", pa.int64()),
                  ("stream", pa.int64()), ("Sequence number", pa.int64())])
schema = pa.schema([("ph", pa.string()), ("cat", pa.string()), ("name", pa.string()),
                    ("pid", pa.int64()), ("tid", pa.int64()), ("ts", pa.float64()),
                    ("dur", pa.float64()), ("args", args)])
options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore",
                          newlines_in_values=True)
table = pj.read_json(pa.BufferReader(lines), parse_options=options)
print(f"rows {table.num_rows} (rewrite to one event per line {rewrite:.2f} s)", file=sys.stderr)
""",
    "polars.read_json": _CUT
    + """
import io, polars as pl
body = b"[" + data[start:end] + b"]"
del data
args = pl.Struct({"correlation": pl.Int64, "External id": pl.Int64, "stream": pl.Int64,
                  "Sequence number": pl.Int64})
schema = {"ph": pl.Utf8, "cat": pl.Categorical, "name": pl.Categorical, "pid": pl.Utf8,
          "tid": pl.Utf8, "ts": pl.Float64, "dur": pl.Float64, "args": args}
frame = pl.read_json(io.BytesIO(body), schema=schema)
print(f"rows {frame.height}", file=sys.stderr)
""",
    "duckdb read_json": """
import sys, duckdb
con = duckdb.connect()
query = '''
SELECT e.ph, e.cat, e.name, e.pid, e.tid, e.ts, e.dur, e.args."correlation",
       e.args."External id", e.args."stream", e.args."Sequence number"
FROM (SELECT unnest(traceEvents) AS e FROM read_json(?, maximum_object_size=4000000000,
  columns={traceEvents: 'STRUCT(ph VARCHAR, cat VARCHAR, name VARCHAR, pid VARCHAR,
    tid VARCHAR, ts DOUBLE, dur DOUBLE, args STRUCT("correlation" BIGINT,
    "External id" BIGINT, "stream" BIGINT, "Sequence number" BIGINT))[]'}))
'''
columns = con.execute(query, [sys.argv[1]]).fetchnumpy()
print(f"rows {len(columns['ts'])}", file=sys.stderr)
""",
}


def run(command: list[str], timeout: float) -> tuple[float, float, int, str]:
    """Wall s, CPU s and peak RSS (KiB) of one fresh process, and the last line it printed."""
    start = time.perf_counter()
    with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as proc:
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        err = proc.stderr.read().decode(errors="replace")  # type: ignore[union-attr]
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        timer.cancel()
    wall = time.perf_counter() - start
    lines = [line for line in err.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    if wall >= timeout:
        last = f"stopped after {timeout:.0f} s"
    elif proc.returncode:
        last = f"failed: {last}"
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss, last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--python", required=True, help="an interpreter with the readers")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--out", type=Path, default=HERE / "results/compiled_readers.md")
    args = parser.parse_args()
    versions = subprocess.run(
        [
            args.python,
            "-c",
            "import pyarrow, polars, duckdb; print(pyarrow.__version__, "
            "polars.__version__, duckdb.__version__)",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    rows = []
    wall, cpu, rss, note = run(
        [sys.executable, str(HERE / "parse_floor.py"), str(args.trace)], args.timeout
    )
    rows.append(("parse floor (benchmarks/parse_floor.py, msgspec Structs)", wall, cpu, rss, note))
    floor = wall
    for (name, code), version in zip(READERS.items(), versions, strict=True):
        print(f"== {name}", file=sys.stderr)
        wall, cpu, rss, note = run([args.python, "-c", code, str(args.trace)], args.timeout)
        rows.append((f"{name} ({version})", wall, cpu, rss, note))
    size = args.trace.stat().st_size
    lines = [
        "# Compiled columnar readers against the parse floor (issue 12)",
        "",
        f"Command (from the repository root): `python benchmarks/compiled_readers.py "
        f"{args.trace} --python {args.python}`",
        "",
        f"Machine: {_cpu()}, {os.cpu_count()} cores; "
        f"load average {', '.join(f'{x:.2f}' for x in os.getloadavg())} at the end. "
        f"Input: {size / 1e9:.2f} GB of JSON. One fresh process each "
        "(wall, CPU and peak RSS of that process).",
        "",
        "| reader | wall s | CPU s | peak RSS | / floor (wall) | outcome |",
        "|---|---|---|---|---|---|",
    ]
    for name, wall, cpu, rss, note in rows:
        lines.append(
            f"| {name} | {wall:.2f} | {cpu:.2f} | {rss / 2**20:.2f} GiB | {wall / floor:.1f}× "
            f"| {note} |"
        )
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
