"""The analysis of real captured traces, checked against an independent computation written
here in plain Python (json + sorted lists), sharing no code with fsdp_trace.analysis."""

from __future__ import annotations

import bisect
import gzip
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from fsdp_trace import analyze
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


# --- attribution, phase and recompute from the raw JSON (README "Per collective", "Per block")

FORWARD_HOOKS = {
    "pre_forward",
    "forward_prefetch",
    "post_forward",
    "root_pre_forward",
    "all_gather_copy_out",
    "cast_forward_inputs",
    "cast_forward_outputs",
}
BACKWARD_HOOKS = {
    "pre_backward",
    "backward_prefetch",
    "post_backward_accumulate",
    "post_backward_reshard",
    "post_backward_reduce",
    "post_backward_rs_wait",
    "root_post_backward_callback",
    "finalize_backward",
}
ISSUERS = {
    "pre_forward",
    "pre_backward",
    "post_forward",
    "post_backward_reduce",
    "root_pre_forward",
    "root_post_backward_callback",
}


def parse_label(name: str) -> tuple[str, str]:
    """('all_gather', 'layers.3') from 'FSDP::all_gather (layers.3)'; no path: the root."""
    body = name.removeprefix("FSDP::")
    if " for " in body:  # FSDP::backward_prefetch for layers.3
        kind, unit = body.split(" for ", 1)
        return kind, unit
    if body.endswith(")") and " (" in body:
        kind, unit = body[:-1].split(" (", 1)
        return kind, unit or "root"
    return body, "root"


class ThreadIntervals:
    """Closed intervals of one kind per (pid, tid), with their payload, searched by bisect."""

    def __init__(self, items) -> None:  # items: (pid, tid, start, end, payload)
        self.by_thread: dict = {}
        for pid, tid, start, end, payload in sorted(items, key=lambda i: (i[2], -i[3])):
            self.by_thread.setdefault((pid, tid), []).append((start, end, payload))
        self.starts = {k: [s for s, _, _ in v] for k, v in self.by_thread.items()}

    def around(self, pid, tid, t) -> list:
        """Payloads of the intervals holding t, innermost (latest start) first."""
        items = self.by_thread.get((pid, tid), [])
        last = bisect.bisect_right(self.starts.get((pid, tid), []), t)
        return [p for s, e, p in reversed(items[:last]) if s <= t <= e]


def recompute_regions(events: list[dict]) -> ThreadIntervals:
    """Forward ops (they carry a `Sequence number`) that start inside the autograd engine's
    `evaluate_function` on the same thread: activation-checkpoint recomputation."""
    engine = ThreadIntervals(
        (e["pid"], e["tid"], e["ts"], e["ts"] + e["dur"], None)
        for e in events
        if e.get("cat") == "cpu_op" and e["name"].startswith("autograd::engine::evaluate_function")
    )
    return ThreadIntervals(
        (e["pid"], e["tid"], e["ts"], e["ts"] + e["dur"], None)
        for e in events
        if e.get("cat") == "cpu_op"
        and "Sequence number" in e.get("args", {})
        and "Backward" not in e["name"]
        and not e["name"].startswith("autograd::engine::evaluate_function")
        and engine.around(e["pid"], e["tid"], e["ts"])
    )


def independent_context(path: Path) -> dict[int, dict]:
    """correlation → block, phase, issued_by (NCCL kernels) and recompute (every kernel), from
    the FSDP labels, the autograd engine and the optimizer around the launch, on its thread."""
    events = raw_events(path)
    labels = ThreadIntervals(
        (e["pid"], e["tid"], e["ts"], e["ts"] + e["dur"], parse_label(e["name"]))
        for e in events
        if e.get("cat") == "user_annotation" and e["name"].startswith("FSDP::")
    )
    recompute = recompute_regions(events)
    engine = ThreadIntervals(
        (e["pid"], e["tid"], e["ts"], e["ts"] + e["dur"], None)
        for e in events
        if e["name"].startswith("autograd::engine::evaluate_function")
    )
    optimizer = ThreadIntervals(
        (e["pid"], e["tid"], e["ts"], e["ts"] + e["dur"], None)
        for e in events
        if e.get("cat") == "user_annotation" and e["name"].startswith("Optimizer.step#")
    )
    launches = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    out = {}
    for e in events:
        if e.get("cat") != "kernel":
            continue
        launch = launches.get(e["args"].get("correlation"))
        if launch is None:
            continue
        where = (launch["pid"], launch["tid"], launch["ts"])
        info = {"recompute": bool(recompute.around(*where))}
        if e["name"].startswith("nccl"):
            around = labels.around(*where)  # (kind, unit), innermost first
            wanted = "all_gather" if "AllGather" in e["name"] else "post_backward_reduce"
            block = next(u for k, u in around if k == wanted)
            hook = next((k for k, _ in around if k in FORWARD_HOOKS | BACKWARD_HOOKS), None)
            if info["recompute"]:
                phase = "recompute"
            elif hook is not None:
                phase = "forward" if hook in FORWARD_HOOKS else "backward"
            elif engine.around(*where):
                phase = "backward"
            elif optimizer.around(*where):
                phase = "optimizer"
            else:
                phase = "forward"
            issuer = next((u for k, u in around if k in ISSUERS), block)
            info.update(block=block, phase=phase, issued_by=issuer)
        out[e["args"]["correlation"]] = info
    return out


@pytest.mark.parametrize("run", [GPU_RUN, AC_RUN], ids=["no-ac", "full-ac"])
@pytest.mark.parametrize("rank", [0, 1])
def test_block_phase_and_issuer_of_every_nccl_kernel(run, rank):
    path = run / f"rank{rank}.timing.json.gz"
    coll = analyze(path).ranks[0].collectives
    expected = independent_context(path)
    assert len(coll) > 100
    for row in coll.itertuples():
        e = expected[row.correlation]
        assert (row.block, row.phase, row.issued_by) == (e["block"], e["phase"], e["issued_by"]), (
            row.correlation,
            row.kernel,
        )
    assert set(coll["block"]) == BLOCKS
    assert {"forward", "backward"} <= set(coll["phase"])


@pytest.mark.parametrize("run", [GPU_RUN, AC_RUN], ids=["no-ac", "full-ac"])
def test_recompute_phase_marks_exactly_the_recomputed_kernels(run):
    path = run / "rank0.timing.json.gz"
    kernels = analyze(path).ranks[0].kernels
    expected = independent_context(path)
    compute = kernels[kernels["kind"] == "compute"]
    ours = set(compute.loc[compute["phase"] == "recompute", "correlation"])
    theirs = {c for c in compute["correlation"] if expected[c]["recompute"]}
    assert ours == theirs
    if run == AC_RUN:
        assert len(ours) > 100  # every block recomputes under full AC
    else:
        assert not ours and "recompute" not in set(kernels["phase"])


def backward_windows(events: list[dict]) -> ThreadIntervals:
    """Unit X's backward window: end of `pre_backward (X)` to the start of X's first
    `post_backward_*` on the same thread (README "Per block")."""
    closers = {
        "post_backward_accumulate",
        "post_backward_reshard",
        "post_backward_reduce",
        "post_backward_rs_wait",
        "finalize_backward",
    }
    labels = [
        (e["pid"], e["tid"], e["ts"], e["ts"] + e["dur"], *parse_label(e["name"]))
        for e in events
        if e.get("cat") == "user_annotation" and e["name"].startswith("FSDP::")
    ]
    windows = []
    for pid, tid, _, opened, kind, unit in labels:
        if kind != "pre_backward":
            continue
        ends = [
            ts
            for p, t, ts, _, k, u in labels
            if (p, t, u) == (pid, tid, unit) and k in closers and ts >= opened
        ]
        if ends:
            windows.append((pid, tid, opened, min(ends), unit))
    return ThreadIntervals(windows)


@pytest.mark.parametrize("rank", [0, 1])
def test_recompute_time_per_step_and_per_block(rank):
    """recompute_us = |union of recompute kernels| in the step window; per block, the union
    of the unit's recompute kernels (launched in its backward window) per step."""
    path = AC_RUN / f"rank{rank}.timing.json.gz"
    result = analyze(path).ranks[0]
    events = raw_events(path)
    regions = recompute_regions(events)
    windows = backward_windows(events)
    launches = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    steps = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("cat") == "user_annotation" and re.fullmatch(r"ProfilerStep#\d+", e["name"])
    )
    recompute: list[tuple[float, float]] = []
    per_unit: dict[str, list[tuple[float, float]]] = {}
    for e in events:
        if e.get("cat") != "kernel" or e["name"].startswith("nccl"):
            continue
        launch = launches.get(e["args"].get("correlation"))
        if launch is None or not any(s <= launch["ts"] <= end for s, end in steps):
            continue
        where = (launch["pid"], launch["tid"], launch["ts"])
        if regions.around(*where):
            interval = (e["ts"], e["ts"] + e["dur"])
            recompute.append(interval)
            unit = windows.around(*where)
            per_unit.setdefault(unit[0] if unit else "none", []).append(interval)
    merged = merge(recompute)
    for row in result.steps.itertuples():
        expected = total(clip(merged, row.start_us, row.end_us))
        assert row.recompute_us == pytest.approx(expected, rel=1e-9, abs=1e-6)
        assert row.recompute_pct == pytest.approx(100 * expected / row.step_us)
        assert 2 < row.recompute_pct < 15  # full AC of gpt-small: a real share of the step
    assert set(per_unit) == BLOCKS - {"root"}  # every checkpointed block, nothing else
    blocks = result.blocks[result.blocks["phase"] == "backward"]
    n_steps = len(result.steps)
    for unit, intervals in per_unit.items():
        ours = set(blocks.loc[blocks["block"] == unit, "recompute_us_per_step"])
        assert len(ours) == 1
        assert ours.pop() == pytest.approx(total(merge(intervals)) / n_steps, rel=1e-9)
    root = result.blocks[result.blocks["block"] == "root"]
    assert root["recompute_us_per_step"].isna().all()
    forward = result.blocks[result.blocks["phase"] == "forward"]
    assert forward["recompute_us_per_step"].isna().all()


def test_no_recompute_without_activation_checkpointing():
    result = analyze(GPU_RUN, detailed=False)
    assert (result.steps["recompute_us"] == 0).all()
    assert result.blocks["recompute_us_per_step"].isna().all()


def test_block_busbw_follows_block_algbw():
    """Block busbw = block algbw × (n−1)/n for n = 2, exactly (not a mean of kernels)."""
    blocks = analyze(GPU_RUN, detailed=False).blocks
    assert set(blocks["collective"]) == {"AllGather", "ReduceScatter"}
    ratio = blocks["busbw_gbps"] / blocks["algbw_gbps"]
    assert ratio.to_numpy() == pytest.approx(0.5, abs=1e-12)
