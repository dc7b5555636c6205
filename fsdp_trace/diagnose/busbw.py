"""The bus bandwidth a healthy link reaches at each message size: the reference curves the
`low-bus-bandwidth` rule compares against (`data/busbw.csv`, shipped in the package), and how
a curve is measured from analyzed runs (`benchmarks/busbw_table.py` writes the table with
`measure` and `table`).

A row of the table is one message size of one curve:

- `interconnect`: run.json's topology (`nvlink`, `mixed`, `pcie`), as the rule reads it;
- `gpus`: the ranks of the collective's process group;
- `collective`: `AllGather`, `ReduceScatter` or `AllReduce`, as NCCL names its kernels;
- `bytes`: the message, as the analysis counts it (a reduce-scatter in fp32 moves twice the
  bytes of the bf16 all-gather of the same unit);
- `busbw_gbps`: the median transfer-time bus bandwidth of the matched collectives of that size
  (the shortest duration across the group's ranks, so waiting for a late peer is left out;
  nccl-tests' bus factor), `n` of them;
- `provisional`: 1 where no run measured this group size: the nearest measured group size's
  figure, copied until one does (its `source` says so);
- `gpu`, `source`: the GPU and the runs the figure comes from.

Between two sizes of a curve the expected busbw is interpolated linearly in log(message size);
above the largest size it is the largest's (busbw saturates with size); below the smallest
there is none (busbw falls with size, so the smallest size's figure would overstate it)."""

from __future__ import annotations

import csv
import functools
import io
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from fsdp_trace.analysis.table import array_of
from fsdp_trace.vocab import Collective

TABLE = Path(__file__).resolve().parent / "data" / "busbw.csv"
COLUMNS = [
    "interconnect",
    "gpus",
    "collective",
    "bytes",
    "busbw_gbps",
    "n",
    "provisional",
    "gpu",
    "source",
]
KEY = ["interconnect", "gpus", "collective"]
MIN_SAMPLES = 3  # matched collectives a size needs before it becomes a row of a curve
MEASURED = (Collective.ALL_GATHER, Collective.REDUCE_SCATTER, Collective.ALL_REDUCE)


@dataclass(frozen=True)
class Curve:
    """One curve of the table: busbw against message size for one interconnect, collective
    and group size."""

    interconnect: str
    collective: str
    gpus: int  # the group size the figures were measured at
    asked_gpus: int  # the group size asked for
    sizes: np.ndarray  # bytes, ascending
    busbw: np.ndarray  # GB/s at each size
    provisional: bool  # a row is provisional, or measured at another group size
    sources: tuple[str, ...]

    def at(self, nbytes) -> np.ndarray:
        """Expected busbw (GB/s) at each message size: log-linear between the curve's sizes,
        the largest size's above them, NaN below the smallest."""
        x = np.log(np.asarray(nbytes, dtype=np.float64).reshape(-1))
        xs = np.log(self.sizes)
        out = np.interp(x, xs, self.busbw)
        out[~(x >= xs[0])] = np.nan  # below the curve, and NaN sizes
        return out

    def describe(self) -> str:
        """'AllGather over 2 GPUs (measured)', 'AllGather over 2 GPUs, used for 4
        (provisional)'."""
        where = f"{self.collective} over {self.gpus} GPUs"
        if self.gpus != self.asked_gpus:
            where += f", used for {self.asked_gpus}"
        return f"{where} ({'provisional' if self.provisional else 'measured'})"


def read_table(path: Path | str) -> pd.DataFrame:
    """A busbw table (CSV) with its columns typed; a row that repeats another's key and size
    is an error (each size of a curve is one figure)."""
    table = pd.read_csv(path, dtype={"interconnect": str, "collective": str, "source": str})
    missing = [c for c in COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"{path}: not a busbw table (no {', '.join(missing)} column)")
    table = table[COLUMNS].copy()
    table["gpus"] = table["gpus"].astype(np.int64)
    table["bytes"] = table["bytes"].astype(np.float64)
    table["busbw_gbps"] = table["busbw_gbps"].astype(np.float64)
    table["n"] = table["n"].astype(np.int64)
    table["provisional"] = table["provisional"].astype(np.int64).astype(bool)
    table["gpu"] = table["gpu"].fillna("")
    table["source"] = table["source"].fillna("")
    repeated = table.duplicated([*KEY, "bytes"])
    if repeated.any():
        first = table[repeated].iloc[0]
        raise ValueError(
            f"{path}: two rows for {first['interconnect']} {first['collective']} over "
            f"{first['gpus']} GPUs at {first['bytes']:.0f} bytes"
        )
    if not (table["bytes"] > 0).all() or not (table["busbw_gbps"] > 0).all():
        raise ValueError(f"{path}: sizes and bandwidths must be positive")
    return table


@functools.cache
def reference() -> pd.DataFrame:
    """The shipped table (data/busbw.csv)."""
    return read_table(TABLE)


def curve(
    table: pd.DataFrame, interconnect: str | None, collective: str, gpus: int
) -> Curve | None:
    """The curve for this interconnect, collective and group size: the group size's own rows,
    else the nearest group size measured (the smaller on a tie), marked provisional; None
    where the table has nothing for the interconnect and collective."""
    rows = table[(table["interconnect"] == interconnect) & (table["collective"] == collective)]
    if rows.empty or not gpus or gpus < 1:
        return None
    sizes = sorted(int(g) for g in rows["gpus"].unique())
    pick = min(sizes, key=lambda g: (abs(math.log(g) - math.log(gpus)), g))
    rows = rows[rows["gpus"] == pick].sort_values("bytes")
    sources = tuple(dict.fromkeys(s for s in rows["source"] if s))
    return Curve(
        interconnect=str(interconnect),
        collective=collective,
        gpus=pick,
        asked_gpus=int(gpus),
        sizes=array_of(rows, "bytes", np.float64),
        busbw=array_of(rows, "busbw_gbps", np.float64),
        provisional=bool(rows["provisional"].any()) or pick != gpus,
        sources=sources,
    )


def expected(
    table: pd.DataFrame,
    interconnect: str | None,
    collectives: pd.Series,
    gpus: pd.Series,
    nbytes: pd.Series,
) -> tuple[np.ndarray, list[Curve]]:
    """Expected busbw for each message (NaN where the table has no curve for it or the
    message is smaller than its curve), and the curves used."""
    out = np.full(len(nbytes), np.nan)
    used = []
    frame = pd.DataFrame(
        {
            "collective": np.asarray(collectives, dtype=object),
            "gpus": np.asarray(gpus, dtype=np.float64),
            "bytes": np.asarray(nbytes, dtype=np.float64),
        }
    )
    frame = frame.dropna(subset=["gpus"])
    for (kind, size), part in frame.groupby(["collective", "gpus"], sort=True):
        found = curve(table, interconnect, str(kind), int(size))
        if found is None:
            continue
        values = found.at(array_of(part, "bytes"))
        out[part.index.to_numpy()] = values
        if np.isfinite(values).any():
            used.append(found)
    return out, used


# --- measuring a curve from analyzed runs ---------------------------------------------------


def measure(run) -> pd.DataFrame:
    """One analyzed run's matched all-gathers, reduce-scatters and all-reduces (GPU timing
    traces, every rank of the group analyzed): collective, group size, bytes and transfer-time
    busbw, one row per matched collective. Empty where nothing matched (a CPU run, one rank's
    trace)."""
    cross = run.crossrank
    if cross is None or cross.empty:
        return pd.DataFrame(columns=["collective", "gpus", "bytes", "busbw_gbps"])
    matched = cross.matched
    sizes = group_sizes(run)
    gpus = matched["pg"].astype(str).map(sizes).astype("float64")
    frame = pd.DataFrame(
        {
            "collective": matched["collective"].astype(str),
            "gpus": gpus.fillna(matched["n_ranks"].astype("float64")),
            "n_ranks": matched["n_ranks"].astype("float64"),
            "bytes": pd.to_numeric(matched["bytes"], errors="coerce"),
            "busbw_gbps": pd.to_numeric(matched["transfer_busbw_gbps"], errors="coerce"),
        }
    )
    frame = frame[
        frame["collective"].isin([str(c) for c in MEASURED])
        & (frame["n_ranks"] == frame["gpus"])  # every rank of the group was there
        & (frame["bytes"] > 0)
        & np.isfinite(frame["busbw_gbps"])
        & (frame["busbw_gbps"] > 0)
    ]
    frame = frame.drop(columns="n_ranks").reset_index(drop=True)
    frame["gpus"] = frame["gpus"].astype(np.int64)
    return frame


def group_sizes(run) -> dict[str, int]:
    """Process group name → its size, from the ranks' collectives."""
    frames = [r.collectives for r in run.ranks if len(r.collectives) and "pg_name" in r.collectives]
    if not frames:
        return {}
    # The two columns joined as arrays: a pick and a concat of a thousand ranks' frames cost
    # ~0.2 ms a rank.
    both = pd.DataFrame(
        {
            "pg_name": np.concatenate([array_of(f, "pg_name", object) for f in frames]),
            "group_size": np.concatenate([array_of(f, "group_size") for f in frames]),
        }
    ).dropna()
    return {str(k): int(v) for k, v in both.groupby("pg_name")["group_size"].max().items()}


def table(measured: Iterable[tuple[str, str, str, pd.DataFrame]]) -> pd.DataFrame:
    """The table from measured runs, each (source name, interconnect, gpu name, `measure`'s
    rows): per interconnect, group size, collective and message size, the median busbw over
    every run's matched collectives of that size, where there are at least MIN_SAMPLES."""
    frames = [
        rows.assign(interconnect=link, gpu=gpu, source=name)
        for name, link, gpu, rows in measured
        if len(rows) and link
    ]
    if not frames:
        return pd.DataFrame(columns=COLUMNS)
    pooled = pd.concat(frames, ignore_index=True)
    out = []
    for (link, gpus, kind, nbytes), part in pooled.groupby(
        ["interconnect", "gpus", "collective", "bytes"], sort=True
    ):
        if len(part) < MIN_SAMPLES:
            continue
        counts = part.groupby("source", sort=True).size()
        out.append(
            {
                "interconnect": link,
                "gpus": int(gpus),
                "collective": kind,
                "bytes": int(nbytes),
                "busbw_gbps": round(float(part["busbw_gbps"].median()), 2),
                "n": len(part),
                "provisional": 0,
                "gpu": "; ".join(dict.fromkeys(part["gpu"])),
                "source": "; ".join(f"{name} ({count})" for name, count in counts.items()),
            }
        )
    return pd.DataFrame(out, columns=COLUMNS)


def provisional_rows(measured: pd.DataFrame, gpus: int) -> pd.DataFrame:
    """Rows for a group size no run measured: each (interconnect, collective) curve of the
    nearest measured group size, copied and marked provisional, its source saying so."""
    rows = []
    typed = read_rows(measured)
    for (link, kind), part in typed.groupby(["interconnect", "collective"], sort=True):
        if (part["gpus"] == gpus).any():
            continue
        found = curve(typed, link, kind, gpus)
        for row in part[part["gpus"] == found.gpus].to_dict("records"):
            rows.append(
                {
                    **row,
                    "gpus": gpus,
                    "bytes": int(row["bytes"]),
                    "provisional": 1,
                    "source": f"provisional: as measured over {found.gpus} GPUs by {row['source']}",
                }
            )
    return pd.DataFrame(rows, columns=COLUMNS)


def read_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """A table built in memory, typed as `read_table` types a file."""
    return read_table(io.StringIO(to_csv(frame)))


def to_csv(frame: pd.DataFrame) -> str:
    """The table as CSV text, rows in key and size order (every field quoted where needed)."""
    ordered = frame[COLUMNS].sort_values([*KEY, "bytes"], kind="stable")
    ordered = ordered.assign(
        bytes=ordered["bytes"].astype(np.int64), provisional=ordered["provisional"].astype(int)
    )
    buffer = io.StringIO()
    ordered.to_csv(buffer, index=False, quoting=csv.QUOTE_MINIMAL, lineterminator="\n")
    return buffer.getvalue()
