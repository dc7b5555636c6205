"""The step breakdown against a plain-Python computation from the raw trace JSON, on every
shipped GPU sample, every rank, every timing step: each step's parts are disjoint and add up
to the step, and each part equals what a sweep over the raw kernels gives.

The independent computation reads the JSON itself: kernels (NCCL ones are communication),
their launches (by correlation), the FSDP2 labels and autograd regions on the launching
thread (a launch inside any `FSDP::` label is FSDP's own copy; a forward op with a sequence
number inside `autograd::engine::evaluate_function` is recompute), and pairs each rank's
k-th NCCL kernel of a step with the other rank's (transfer = the shorter duration). Only the
step windows are taken from the analysis (tested on their own in test_analyze_real.py)."""

from __future__ import annotations

import bisect
import gzip
import json
from collections import defaultdict
from functools import cache

import pytest

from fsdp_trace import analyze
from tests.conftest import SAMPLES

PRECEDENCE = (
    "recompute_us",
    "compute_us",
    "fsdp_copy_us",
    "exposed_transfer_us",
    "exposed_wait_us",
    "exposed_unsplit_us",
)
GPU_RUNS = [
    "gpt-small-2gpu",
    "gpt-small-2gpu-fullac",
    "gpt-small-1gpu",
    *(
        f"diagnosis/{d}"
        for d in (
            "comm-bound",
            "host-bound",
            "grad-accum",
            "p2p-disabled",
            "max-connections-1",
            "straggler",
            "tuned-b16",
            "gpt-1.3b-b4-2gpu",
        )
    ),
    *(f"whatif-1gpu/{d}" for d in sorted(p.name for p in (SAMPLES / "whatif-1gpu").iterdir())),
    "tune-1gpu/eager",
]


class Regions:
    """Closed intervals per thread, for 'is this time inside one of them' queries."""

    def __init__(self) -> None:
        self.by_thread: dict[tuple, list[tuple[float, float]]] = defaultdict(list)

    def add(self, thread, start: float, end: float) -> None:
        self.by_thread[thread].append((start, end))

    def freeze(self) -> None:
        for thread, spans in self.by_thread.items():
            spans.sort()
            merged: list[list[float]] = []
            for s, e in spans:
                if merged and s <= merged[-1][1]:
                    merged[-1][1] = max(merged[-1][1], e)
                else:
                    merged.append([s, e])
            self.by_thread[thread] = [tuple(m) for m in merged]

    def inside(self, thread, t: float) -> bool:
        spans = self.by_thread.get(thread, [])
        i = bisect.bisect_right(spans, (t, float("inf"))) - 1
        return i >= 0 and spans[i][0] <= t <= spans[i][1]


def raw_kernels(path) -> list[dict]:
    """Every kernel with its kind (comm / recompute / fsdp / compute) from the JSON alone."""
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    launches = {}
    fsdp, autograd = Regions(), Regions()
    forward_ops = []
    for e in events:
        if e.get("ph") != "X":
            continue
        cat, name = e.get("cat", ""), e.get("name", "")
        thread = (e.get("pid"), e.get("tid"))
        if cat in ("cuda_runtime", "cuda_driver"):
            launches[e["args"].get("correlation")] = (thread, e["ts"])
        elif cat == "user_annotation" and name.startswith("FSDP::"):
            fsdp.add(thread, e["ts"], e["ts"] + e["dur"])
        elif cat == "cpu_op":
            if name.startswith("autograd::engine::evaluate_function"):
                autograd.add(thread, e["ts"], e["ts"] + e["dur"])
            elif "Sequence number" in e.get("args", {}) and "Backward" not in name:
                forward_ops.append((thread, e["ts"], e["ts"] + e["dur"]))
    fsdp.freeze()
    autograd.freeze()
    recompute = Regions()
    for thread, s, end in forward_ops:
        if autograd.inside(thread, s):
            recompute.add(thread, s, end)
    recompute.freeze()
    out = []
    for e in events:
        if e.get("cat") != "kernel" or e.get("ph") != "X":
            continue
        corr = e["args"].get("correlation")
        launch = launches.get(corr)
        if e["name"].lower().startswith("nccl"):
            kind = "comm"
        elif launch is not None and recompute.inside(*launch):
            kind = "recompute"
        elif launch is not None and fsdp.inside(*launch):
            kind = "fsdp"
        else:
            kind = "compute"
        out.append(
            {"kind": kind, "ts": e["ts"], "end": e["ts"] + e["dur"], "corr": corr, "launch": launch}
        )
    return out


def partition(kernels: list[dict], lo: float, hi: float, transfer: dict) -> dict[str, float]:
    """Sweep the window's elementary segments: each goes to the first part whose intervals
    cover it (PRECEDENCE), else idle."""
    spans = []  # (start, end, part)
    for k in kernels:
        if k["kind"] == "comm":
            t = transfer.get(k["corr"])
            if t is None:
                spans.append((k["ts"], k["end"], "exposed_unsplit_us"))
            else:
                cut = max(k["end"] - t, k["ts"])
                spans.append((k["ts"], cut, "exposed_wait_us"))
                spans.append((cut, k["end"], "exposed_transfer_us"))
        else:
            part = {"recompute": "recompute_us", "fsdp": "fsdp_copy_us"}.get(
                k["kind"], "compute_us"
            )
            spans.append((k["ts"], k["end"], part))
    points = []
    for s, e, part in spans:
        s, e = max(s, lo), min(e, hi)
        if e > s:
            points.append((s, 1, part))
            points.append((e, -1, part))
    points.sort(key=lambda p: p[0])
    active = dict.fromkeys(PRECEDENCE, 0)
    out = dict.fromkeys((*PRECEDENCE, "idle_us"), 0.0)
    previous = lo
    for t, delta, part in points:
        if t > previous:
            owner = next((p for p in PRECEDENCE if active[p] > 0), "idle_us")
            out[owner] += t - previous
            previous = t
        active[part] += delta
    out["idle_us"] += hi - previous
    return out


@cache
def analyzed(path: str):
    return analyze(SAMPLES / path, detailed=False).only


@pytest.mark.parametrize("path", GPU_RUNS)
def test_breakdown_against_the_raw_trace(path):
    run = analyzed(path)
    raw = {r.rank: raw_kernels(SAMPLES / path / f"rank{r.rank}.timing.json.gz") for r in run.ranks}
    # Pair the ranks' NCCL kernels: per rank, those the analysis kept, in launch order.
    kept = {r.rank: r.collectives.sort_values("correlation") for r in run.ranks}
    transfer: dict[int, dict] = {r: {} for r in kept}
    if len(kept) == 2:
        a, b = kept.values()
        for (ca, da), (cb, db) in zip(
            zip(a["correlation"], a["dur_us"], strict=True),
            zip(b["correlation"], b["dur_us"], strict=True),
            strict=True,
        ):
            t = min(da, db)
            ra, rb = kept
            transfer[ra][ca], transfer[rb][cb] = t, t
    for r in run.ranks:
        kept_corr = set(r.kernels["correlation"])
        kernels = [k for k in raw[r.rank] if k["corr"] in kept_corr]
        assert len(kernels) == len(r.kernels[r.kernels["kind"].isin(["comm", "compute"])])
        for row in r.steps.itertuples():
            want = partition(kernels, row.start_us, row.end_us, transfer[r.rank])
            parts = {
                "recompute_us": row.recompute_us,
                "compute_us": row.model_compute_us,
                "fsdp_copy_us": row.fsdp_copy_us,
                "exposed_transfer_us": row.exposed_transfer_us,
                "exposed_wait_us": row.exposed_wait_us,
                "exposed_unsplit_us": row.exposed_unsplit_us,
                "idle_us": row.idle_us,
            }
            for part, value in parts.items():
                if len(kept) == 1 and part in ("exposed_transfer_us", "exposed_wait_us"):
                    assert value != value  # one rank: the split is unknown (NaN), not 0
                    continue
                assert value == pytest.approx(want[part], abs=0.05), (path, r.rank, row.step, part)
            total = sum(v for v in parts.values() if v == v)
            assert total == pytest.approx(row.step_us, rel=1e-9, abs=1e-6)


def test_breakdown_adds_up_on_detailed_traces_and_the_per_rank_median_step():
    for path in ("gpt-small-2gpu", "gpt-small-2gpu-fullac"):
        run = analyze(SAMPLES / path).only
        frame = run.breakdown
        parts = frame.drop(columns=["rank", "source", "step", "step_us"]).fillna(0.0)
        assert ((parts.sum(axis=1) - frame["step_us"]).abs() < 1e-6).all()
        for r in run.ranks + run.detailed:
            b = run.rank_breakdown(r)
            own = frame[(frame["rank"] == r.rank) & (frame["source"] == r.source)]
            ordered = sorted(own["step_us"])
            assert b["step_us"] == ordered[(len(ordered) - 1) // 2]  # the median step
            assert sum(v or 0.0 for k, v in b.items() if k not in ("step", "step_us")) == (
                pytest.approx(b["step_us"])
            )


def test_recompute_and_fsdp_copies_are_found():
    """fullac recomputes every block inside backward; FSDP's copy-in/out kernels run in any
    FSDP2 run. The plain reading of the JSON finds them where the analysis does."""
    run = analyzed("gpt-small-2gpu-fullac")
    assert (run.steps["recompute_us"] > 0).all() and (run.steps["fsdp_copy_us"] >= 0).all()
    plain = analyzed("gpt-small-2gpu")
    assert (plain.steps["recompute_us"] == 0).all()
    kinds = {
        k["kind"] for k in raw_kernels(SAMPLES / "gpt-small-2gpu-fullac" / "rank0.timing.json.gz")
    }
    assert kinds == {"comm", "compute", "recompute", "fsdp"}


def test_a_collectives_match_is_found_by_its_correlation_as_pandas_finds_it():
    """`breakdown._positions`: each wanted id's position among the matched ones, -1 where
    unmatched, as `pd.Index(keys).get_indexer(wanted)` gives it (keys distinct); other dtypes
    and repeated keys go through pandas, which refuses repeated keys."""
    import numpy as np
    import pandas as pd

    from fsdp_trace.analysis.rank.breakdown import _positions

    rng = np.random.default_rng(7)
    for _ in range(500):
        keys = rng.choice(200, int(rng.integers(0, 40)), replace=False).astype(np.int64)
        wanted = rng.integers(-3, 210, int(rng.integers(0, 60))).astype(np.int64)
        assert _positions(keys, wanted).tolist() == pd.Index(keys).get_indexer(wanted).tolist()
    floats = np.array([2.0, np.nan, 5.0])
    assert _positions(floats, np.array([np.nan, 5.0])).tolist() == [1, 2]  # pandas' NaN match
    with pytest.raises(pd.errors.InvalidIndexError):
        _positions(np.array([4, 4]), np.array([4]))


@pytest.mark.parametrize("matched_share", [0.0, 0.5, 1.0])
def test_the_exposed_parts_count_unit_cells(matched_share):
    """`breakdown._exposed_parts` on collectives of whole µs (all matched, none, some: where
    the wait or unsplit set is empty its part is not computed): each part is the number of
    1 µs cells of the window that are exposed and in that part, counted one cell at a time."""
    import numpy as np

    from fsdp_trace.analysis import intervals as iv
    from fsdp_trace.analysis.rank.breakdown import _comm_sets, _exposed_parts

    rng = np.random.default_rng(int(matched_share * 10))
    for _ in range(300):
        n = int(rng.integers(0, 6))
        ts = rng.integers(0, 50, n).astype(float)
        dur = rng.integers(1, 12, n).astype(float)
        end = ts + dur
        matched = rng.random(n) < matched_share
        transfer = np.where(matched, np.floor(rng.random(n) * (dur + 1)), np.nan)
        k0 = rng.integers(0, 60, 4).astype(float)
        busy = iv.union(k0, k0 + rng.integers(0, 10, 4))
        exposed = iv.subtract(iv.union(ts, end), busy)
        starts, ends = np.array([0.0, 20.0]), np.array([30.0, 64.0])
        got = _exposed_parts(exposed, _comm_sets(ts, end, transfer), starts, ends)
        cut = np.maximum(end - np.nan_to_num(transfer), ts)
        for w, (lo, hi) in enumerate(zip(starts, ends, strict=True)):
            want = {"exposed_transfer_us": 0, "exposed_wait_us": 0, "exposed_unsplit_us": 0}
            for x in range(int(lo), int(hi)):
                if not _covers(ts, end, x) or _covers(*busy, x):
                    continue  # not communication, or compute hides it
                if _covers(cut[matched], end[matched], x):
                    want["exposed_transfer_us"] += 1
                elif _covers(ts[matched], cut[matched], x):
                    want["exposed_wait_us"] += 1
                elif _covers(ts[~matched], end[~matched], x):
                    want["exposed_unsplit_us"] += 1
            for part, cells in want.items():
                assert got[part][w] == cells, (part, w)


def _covers(starts, ends, x: int) -> bool:
    """Whether one of the intervals holds the cell [x, x + 1)."""
    return bool(((starts <= x) & (x + 1 <= ends)).any())
