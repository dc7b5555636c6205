"""The analysis of real captured traces, checked against an independent computation written
here in plain Python (json + sorted lists), sharing no code with fsdp_trace.analyze."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from fsdp_trace.analyze import analyze
from tests.conftest import SAMPLES

GPU_RUN = SAMPLES / "gpt-small-2gpu"
AC_RUN = SAMPLES / "gpt-small-2gpu-fullac"
BLOCKS = {"root"} | {f"layers.{i}" for i in range(8)}


def raw_events(path: Path) -> list[dict]:
    return json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]


def merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(s, e) for s, e in out]


def total(intervals) -> float:
    return sum(e - s for s, e in intervals)


def clip(intervals, lo, hi):
    return [(max(s, lo), min(e, hi)) for s, e in intervals if min(e, hi) > max(s, lo)]


def independent_steps(path: Path) -> list[dict]:
    """Step windows and overlap, straight from the definitions in the README."""
    events = raw_events(path)
    steps = sorted(
        (e["ts"], e["ts"] + e["dur"], int(e["name"].split("#")[1]))
        for e in events
        if e.get("cat") == "user_annotation"
        and re.fullmatch(r"ProfilerStep#\d+", e.get("name", ""))
    )
    launch_ts = {
        e["args"]["correlation"]: e["ts"]
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    kept = []
    for e in events:
        if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        t = launch_ts.get(e.get("args", {}).get("correlation"))
        step = next((n for s, end, n in steps if t is not None and s <= t <= end), None)
        if step is not None:
            kept.append((step, e))
    starts: dict[int, float] = {}
    last_end: dict[int, float] = {}
    for step, e in kept:
        starts[step] = min(starts.get(step, float("inf")), e["ts"])
        last_end[step] = max(last_end.get(step, 0.0), e["ts"] + e["dur"])
    order = sorted(starts, key=starts.get)
    comm = merge(
        [
            (e["ts"], e["ts"] + e["dur"])
            for _, e in kept
            if e["cat"] == "kernel" and e["name"].startswith("nccl")
        ]
    )
    compute = merge(
        [
            (e["ts"], e["ts"] + e["dur"])
            for _, e in kept
            if e["cat"] == "kernel" and not e["name"].startswith("nccl")
        ]
    )
    result = []
    for i, step in enumerate(order):
        lo = starts[step]
        hi = starts[order[i + 1]] if i + 1 < len(order) else last_end[step]
        c, k = clip(comm, lo, hi), clip(compute, lo, hi)
        busy = total(merge(c + k))
        overlap = total(c) + total(k) - busy
        result.append(
            {
                "step": step,
                "step_us": hi - lo,
                "comm_us": total(c),
                "compute_us": total(k),
                "overlap_us": overlap,
                "exposed_us": total(c) - overlap,
                "idle_us": hi - lo - busy,
            }
        )
    return result


def independent_blocks(path: Path) -> dict[int, str]:
    """correlation → unit of every NCCL kernel, by scanning the labels around its launch."""
    events = raw_events(path)
    prefixes = ("FSDP::all_gather", "FSDP::post_backward_reduce")
    labels = [
        e
        for e in events
        if e.get("cat") == "user_annotation" and e.get("name", "").startswith(prefixes)
    ]
    launches = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    units = {}
    for e in events:
        if e.get("cat") != "kernel" or not e["name"].startswith("nccl"):
            continue
        launch = launches.get(e["args"]["correlation"])
        if launch is None:
            continue
        around = [
            lb
            for lb in labels
            if lb["tid"] == launch["tid"] and lb["ts"] <= launch["ts"] <= lb["ts"] + lb["dur"]
        ]
        if not around:
            continue
        innermost = max(around, key=lambda lb: lb["ts"])
        match = re.search(r"\((.*)\)$", innermost["name"])
        units[e["args"]["correlation"]] = match.group(1) if match else "root"
    return units


@pytest.mark.parametrize("run", [GPU_RUN, AC_RUN], ids=["no-ac", "full-ac"])
@pytest.mark.parametrize("rank", [0, 1])
def test_step_figures_match_an_independent_computation(run, rank):
    result = analyze(run, detailed=False)
    ours = result.ranks[rank].steps.set_index("step")
    expected = independent_steps(run / f"rank{rank}.timing.json.gz")
    assert len(expected) == 5 and sorted(ours.index) == [e["step"] for e in expected]
    for e in expected:
        row = ours.loc[e["step"]]
        for key in ("step_us", "comm_us", "compute_us", "overlap_us", "exposed_us", "idle_us"):
            assert row[key] == pytest.approx(e[key], rel=1e-9, abs=1e-6), (key, e["step"])


@pytest.mark.parametrize("rank", [0, 1])
def test_every_collective_is_attributed_like_an_independent_scan(rank):
    path = GPU_RUN / f"rank{rank}.timing.json.gz"
    result = analyze(path)
    coll = result.ranks[0].collectives
    expected = independent_blocks(path)
    ours = dict(zip(coll["correlation"], coll["block"], strict=True))
    assert {c: ours[c] for c in expected} == expected
    assert set(coll["block"]) == BLOCKS  # every block of the sample model, and the root
    assert (coll["block"] != "unattributed").all()


def test_counts_per_block_match_the_reshard_setting():
    result = analyze(GPU_RUN, detailed=False)
    blocks = result.blocks
    ag = blocks[blocks["collective"] == "AllGather"].drop_duplicates(["rank", "block"])
    per_unit = dict(zip(ag["block"], ag["unit_count_per_step"], strict=False))
    assert {b: per_unit[b] for b in BLOCKS} == {
        **{f"layers.{i}": 2.0 for i in range(8)},
        "root": 1.0,
    }
    rs = blocks[blocks["collective"] == "ReduceScatter"]
    assert set(rs["block"]) == BLOCKS and (rs["unit_count_per_step"] == 1.0).all()
    assert (blocks["excess"] <= 0).all()
    phases = set(zip(blocks["block"], blocks["phase"], blocks["collective"], strict=True))
    assert ("layers.3", "forward", "AllGather") in phases
    assert ("layers.3", "backward", "AllGather") in phases
    assert ("layers.3", "backward", "ReduceScatter") in phases


def test_message_sizes_follow_the_model():
    """A block all-gathers its bf16 parameters: 12·d² for d=1024; RS reduces in fp32."""
    result = analyze(GPU_RUN, detailed=False)
    coll = result.collectives
    block_ag = coll[(coll["collective"] == "AllGather") & (coll["block"] == "layers.2")]
    block_rs = coll[(coll["collective"] == "ReduceScatter") & (coll["block"] == "layers.2")]
    params = 12 * 1024**2 + 4 * 1024  # four matmuls + two LayerNorms (weight and bias)
    assert set(block_ag["bytes"]) == {2 * params}
    assert set(block_rs["bytes"]) == {4 * params}
    assert (block_ag["busbw_gbps"] == block_ag["algbw_gbps"] / 2).all()


def test_recompute_appears_only_under_activation_checkpointing():
    plain = analyze(GPU_RUN, detailed=False).ranks[0]
    assert "recompute" not in set(plain.compute_phases["phase"])
    full = analyze(AC_RUN, detailed=False).ranks[0]
    kernels = full.kernels[full.kernels["kind"] == "compute"]
    per_block = kernels.groupby(["block", "phase"])["dur"].sum().unstack()
    layers = per_block.loc[sorted(BLOCKS - {"root"})]
    # Every checkpointed block recomputes most of its forward (non-reentrant AC stops once
    # the saved tensors backward needs are rebuilt, so not the block's last matmul).
    ratio = layers["recompute"] / layers["forward"]
    assert ratio.between(0.6, 1.0).all(), ratio
    assert pd.isna(per_block.loc["root", "recompute"])  # the root is not checkpointed
