"""Edge cases on small synthetic traces whose answers are worked out by hand."""

from __future__ import annotations

import math

import pytest

from fsdp_trace.analyze import analyze
from tests.synth import AUTOGRAD, TraceBuilder


def one_rank(tmp_path, builder: TraceBuilder, name: str = "rank0.json"):
    result = analyze(builder.write(tmp_path / name))
    assert len(result.ranks) == 1
    return result.ranks[0]


def test_overlapping_kernels_on_several_streams(tmp_path):
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.label("FSDP::pre_forward (layers.0)", 10, 60)
    b.label("FSDP::all_gather (layers.0)", 20, 40)
    b.kernel("gemm_a", 100, 200, launch_ts=5)  # stream 7: [100, 300]
    b.kernel("gemm_b", 350, 150, launch_ts=6)  # stream 7: [350, 500]
    b.kernel("side", 250, 150, launch_ts=7, stream=8)  # stream 8: [250, 400]
    b.nccl("AllGather", 450, 150, launch_ts=30)  # [450, 600]
    b.label("FSDP::post_backward_reduce (layers.0)", 80, 30, tid=AUTOGRAD)
    b.nccl("ReduceScatter", 520, 40, launch_ts=90, stream=21, launch_tid=AUTOGRAD)
    r = one_rank(tmp_path, b)
    step = r.steps.iloc[0]
    assert step["step_us"] == pytest.approx(500)  # first kernel 100 → last end 600
    assert step["compute_us"] == pytest.approx(400)  # union, not the 500 of summed durations
    assert step["comm_us"] == pytest.approx(150)
    assert step["overlap_us"] == pytest.approx(50)
    assert step["exposed_us"] == pytest.approx(100)
    assert step["exposed_pct"] == pytest.approx(20)
    assert step["idle_us"] == pytest.approx(0)
    assert step["overlap_pct"] == pytest.approx(100 * 50 / 150)
    coll = r.collectives.set_index("collective")
    # Exposed time is shared among concurrent collectives: AG alone 60 µs, both 40 µs.
    assert coll.loc["AllGather", "exposed_us"] == pytest.approx(20 + 20 + 40)
    assert coll.loc["ReduceScatter", "exposed_us"] == pytest.approx(20)
    assert coll["exposed_us"].sum() == pytest.approx(step["exposed_us"])
    assert coll.loc["AllGather", "block"] == "layers.0"
    assert coll.loc["AllGather", "phase"] == "forward"
    assert coll.loc["ReduceScatter", "block"] == "layers.0"
    assert coll.loc["ReduceScatter", "phase"] == "backward"
    # 1,000,000 bf16 elements in 150 µs: 13.3 GB/s algbw, busbw x (n-1)/n = 1/2.
    assert coll.loc["AllGather", "bytes"] == 2_000_000
    assert coll.loc["AllGather", "algbw_gbps"] == pytest.approx(2e6 / 150e-6 / 1e9)
    assert coll.loc["AllGather", "busbw_gbps"] == pytest.approx(2e6 / 150e-6 / 1e9 / 2)


def test_zero_length_kernels_count_nothing(tmp_path):
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.kernel("gemm", 100, 100, launch_ts=5)
    b.kernel("empty", 150, 0.0, launch_ts=6, stream=8)
    b.nccl("AllGather", 300, 0.0, launch_ts=7)
    b.nccl("AllGather", 320, 10, launch_ts=8)
    r = one_rank(tmp_path, b)
    step = r.steps.iloc[0]
    assert step["compute_us"] == pytest.approx(100)
    assert step["comm_us"] == pytest.approx(10)
    assert step["exposed_us"] == pytest.approx(10)
    assert len(r.collectives) == 2
    assert r.collectives["exposed_us"].tolist() == pytest.approx([0.0, 10.0])
    assert math.isnan(r.collectives["algbw_gbps"].iloc[0])  # no bandwidth from 0 µs


def test_collective_straddling_a_step_boundary(tmp_path):
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.step(2, 1000, 1000)
    b.kernel("gemm", 100, 800, launch_ts=10)  # step 1: [100, 900]
    b.nccl("AllGather", 1000, 300, launch_ts=800)  # launched in step 1, runs [1000, 1300]
    b.kernel("gemm", 1200, 300, launch_ts=1100)  # step 2's first kernel: [1200, 1500]
    r = one_rank(tmp_path, b)
    s1, s2 = r.steps.iloc[0], r.steps.iloc[1]
    assert (s1["start_us"], s1["end_us"]) == (100, 1200)  # up to step 2's first kernel
    assert (s2["start_us"], s2["end_us"]) == (1200, 1500)
    assert s1["comm_us"] == pytest.approx(200) and s1["exposed_us"] == pytest.approx(200)
    assert s2["comm_us"] == pytest.approx(100) and s2["exposed_us"] == pytest.approx(0)
    assert s1["comm_us"] + s2["comm_us"] == pytest.approx(300)  # nothing lost, nothing twice
    assert r.collectives["step"].tolist() == [1]  # counted in the step that launched it


def test_kernels_launched_before_the_window_are_left_out(tmp_path):
    b = TraceBuilder()
    b.kernel("stale", 50, 100, launch_ts=-500)  # launched before profiling started
    b.kernel("orphan", 60, 10, launch_ts=None)  # its launch is not in the trace
    b.step(1, 0, 1000)
    b.kernel("gemm", 200, 100, launch_ts=10)
    r = one_rank(tmp_path, b)
    assert r.steps.iloc[0]["start_us"] == 200
    assert r.steps.iloc[0]["compute_us"] == pytest.approx(100)
    assert any("2 GPU events launched outside" in n for n in r.notices)


def test_no_profiler_step_gives_one_window_with_a_notice(tmp_path):
    b = TraceBuilder()
    b.kernel("gemm", 100, 100, launch_ts=5)
    b.nccl("AllReduce", 150, 100, launch_ts=6)
    r = one_rank(tmp_path, b)
    assert len(r.steps) == 1
    assert r.steps.iloc[0]["step_us"] == pytest.approx(150)
    assert r.steps.iloc[0]["exposed_us"] == pytest.approx(50)
    assert any("no ProfilerStep" in n for n in r.notices)


def test_single_gpu_trace_says_there_is_nothing_to_overlap(tmp_path):
    b = TraceBuilder(world_size=1)
    b.step(1, 0, 1000)
    b.kernel("gemm", 100, 100, launch_ts=5)
    r = one_rank(tmp_path, b)
    assert r.collectives.empty
    assert r.steps.iloc[0]["comm_us"] == 0
    assert any("no NCCL kernels" in n for n in r.notices)


def test_prefetched_all_gather_names_consumer_and_issuer(tmp_path):
    b = TraceBuilder()
    b.step(1, 0, 2000)
    b.label("FSDP::all_gather", 5, 10)  # the root unit: no path suffix
    b.nccl("AllGather", 100, 10, launch_ts=8)
    b.label("FSDP::pre_backward (layers.1)", 500, 100, tid=AUTOGRAD)
    b.label("FSDP::backward_prefetch for layers.0", 510, 80, tid=AUTOGRAD)
    b.label("FSDP::all_gather (layers.0)", 520, 60, tid=AUTOGRAD)
    b.nccl("AllGather", 700, 10, launch_ts=530, launch_tid=AUTOGRAD)
    r = one_rank(tmp_path, b)
    root, prefetched = r.collectives.sort_values("start_us").to_dict("records")
    assert (root["block"], root["phase"], root["prefetched"]) == ("root", "forward", False)
    assert prefetched["block"] == "layers.0"
    assert prefetched["issued_by"] == "layers.1"
    assert prefetched["phase"] == "backward"
    assert prefetched["prefetched"]


def test_recompute_kernels_are_told_apart_from_backward(tmp_path):
    b = TraceBuilder()
    b.step(1, 0, 2000)
    b.cpu("autograd::engine::evaluate_function: MmBackward0", 100, 300, tid=AUTOGRAD)
    b.cpu("aten::linear", 120, 50, tid=AUTOGRAD, **{"Sequence number": 7})  # recompute
    b.cpu("aten::mm", 200, 50, tid=AUTOGRAD)  # the backward op itself
    b.kernel("gemm_recompute", 500, 100, launch_ts=130, launch_tid=AUTOGRAD)
    b.kernel("gemm_backward", 600, 100, launch_ts=210, launch_tid=AUTOGRAD)
    b.kernel("gemm_forward", 300, 100, launch_ts=50)
    r = one_rank(tmp_path, b)
    phases = dict(zip(r.kernels["name"].astype(str), r.kernels["phase"], strict=True))
    assert phases == {
        "gemm_recompute": "recompute",
        "gemm_backward": "backward",
        "gemm_forward": "forward",
    }
    by_phase = r.compute_phases.set_index("phase")["compute_us"]
    assert by_phase.to_dict() == {"backward": 100.0, "forward": 100.0, "recompute": 100.0}


def test_expected_counts_flag_extra_all_gathers(tmp_path):
    b = TraceBuilder()
    b.step(1, 0, 3000)
    for i in range(3):  # three all-gathers of one unit in one step: one too many
        b.label("FSDP::all_gather (layers.0)", 100 + i * 500, 10)
        b.nccl("AllGather", 200 + i * 500, 10, launch_ts=105 + i * 500)
    r = one_rank(tmp_path, b)
    row = r.blocks.iloc[0]
    assert row["unit_count_per_step"] == 3
    assert row["expected_per_step"] == 2
    assert row["excess"] == 1


def test_rank_from_file_name_when_trace_has_none(tmp_path):
    b = TraceBuilder(rank=None)
    b.step(1, 0, 100)
    b.kernel("gemm", 10, 10, launch_ts=1)
    r = one_rank(tmp_path, b, name="rank3_trace.json.gz")
    assert r.rank == 3
