"""Edge cases on small synthetic traces whose answers are worked out by hand."""

from __future__ import annotations

import json
import math

import pytest

from fsdp_trace import analyze
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
    """Three all-gathers of one unit in one step (forward, then twice in backward, as
    reentrant checkpointing does): the unit reshards, so 2 are expected, one is too many."""
    b = TraceBuilder()
    b.step(1, 0, 3000)
    for i, hook in enumerate(("pre_forward", "pre_backward", "pre_backward")):
        b.label(f"FSDP::{hook} (layers.0)", 95 + i * 500, 30)
        b.label("FSDP::all_gather (layers.0)", 100 + i * 500, 10)
        b.nccl("AllGather", 200 + i * 500, 10, launch_ts=105 + i * 500)
    r = one_rank(tmp_path, b)
    assert (r.blocks["unit_count_per_step"] == 3).all()
    assert (r.blocks["expected_per_step"] == 2).all()
    assert (r.blocks["excess"] == 1).all()


def test_rank_from_file_name_when_trace_has_none(tmp_path):
    b = TraceBuilder(rank=None)
    b.step(1, 0, 100)
    b.kernel("gemm", 10, 10, launch_ts=1)
    r = one_rank(tmp_path, b, name="rank3_trace.json.gz")
    assert r.rank == 3


def _two_kernels(b: TraceBuilder, launches: bool) -> None:
    b.kernel("gemm", 100, 100, launch_ts=5 if launches else None)  # [100, 200]
    b.nccl("AllGather", 150, 100, launch_ts=6 if launches else None)  # [150, 250]


@pytest.mark.parametrize("with_steps", [True, False], ids=["profiler-steps", "no-steps"])
def test_kernels_without_launch_events_fall_back_to_one_window(tmp_path, with_steps):
    """A GPU-only export (no cuda_runtime/cuda_driver launches): one window over the trace."""
    b = TraceBuilder()
    if with_steps:
        b.step(1, 0, 1000)
    _two_kernels(b, launches=False)
    r = one_rank(tmp_path, b)
    (step,) = r.steps.to_dict("records")
    assert (step["start_us"], step["end_us"]) == (100, 250)
    assert step["compute_us"] == pytest.approx(100) and step["comm_us"] == pytest.approx(100)
    assert step["overlap_us"] == pytest.approx(50) and step["exposed_us"] == pytest.approx(50)
    assert len(r.kernels) == 2  # nothing left out
    assert any("none of the 2 GPU events has its launch" in n for n in r.notices)
    (coll,) = r.collectives.to_dict("records")
    assert (coll["block"], coll["phase"]) == ("unattributed", "unattributed")
    assert math.isnan(r.blocks.iloc[0]["expected_per_step"])  # no unit: nothing to flag


def test_nccl_kernels_all_launched_outside_the_steps_say_so(tmp_path):
    b = TraceBuilder()
    b.nccl("AllGather", 50, 30, launch_ts=-200)  # launched before the profiled step
    b.step(1, 0, 1000)
    b.kernel("gemm", 100, 100, launch_ts=5)
    r = one_rank(tmp_path, b)
    assert not any("no NCCL kernels" in n for n in r.notices)
    assert any(
        "all 1 NCCL kernels were launched outside the profiled steps" in n for n in r.notices
    )
    assert r.steps.iloc[0]["comm_us"] == 0


def test_bare_cpu_trace_claims_no_gloo_collectives(tmp_path):
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.cpu("aten::mm", 10, 100)
    r = one_rank(tmp_path, b)
    assert r.collectives.empty
    assert r.notices == [
        "no GPU kernels and no collectives (neither NCCL kernels nor gloo ops): a CPU-only "
        "trace, nothing to measure"
    ]


def _root_and_block_gathers(b: TraceBuilder, root_backward: bool = False) -> None:
    """One step: the root gathers in forward (and, with `root_backward`, again in backward),
    layers.0 twice: in its forward and again in its backward."""
    b.step(1, 0, 3000)
    b.label("FSDP::pre_forward", 5, 30)
    b.label("FSDP::all_gather", 10, 10)
    b.nccl("AllGather", 100, 10, launch_ts=12)
    b.label("FSDP::pre_forward (layers.0)", 195, 30)
    b.label("FSDP::pre_backward (layers.0)", 1195, 30)
    for t in (200, 1200):
        b.label("FSDP::all_gather (layers.0)", t, 10)
        b.nccl("AllGather", t + 300, 10, launch_ts=t + 2)
    if root_backward:
        b.label("FSDP::pre_backward", 1000, 30)
        b.label("FSDP::all_gather", 1005, 10)
        b.nccl("AllGather", 1050, 10, launch_ts=1007)


def _gathers(rank) -> dict[str, tuple[float, float]]:
    ag = rank.blocks[rank.blocks["collective"] == "AllGather"].drop_duplicates("block")
    return {
        b: (u, e)
        for b, u, e in zip(
            ag["block"], ag["unit_count_per_step"], ag["expected_per_step"], strict=True
        )
    }


def _capture_run(tmp_path, builder: TraceBuilder, **record) -> object:
    """A run directory holding the trace and a run.json with the given sections."""
    folder = tmp_path / "run"
    folder.mkdir()
    builder.write(folder / "rank0.json")
    run = {"world": {"world_size": 2}, "files": {"timing": ["rank0.json"]}, **record}
    (folder / "run.json").write_text(json.dumps(run))
    return analyze(folder, cache=False).only


def test_without_run_json_reshard_is_read_from_where_units_are_gathered(tmp_path):
    """No run.json: a unit gathered again in backward reshards after forward (2 per step), the
    root gathered in forward only keeps its parameters (1): what the trace shows, said."""
    b = TraceBuilder()
    _root_and_block_gathers(b)
    result = analyze(b.write(tmp_path / "rank0.json"), cache=False).only
    assert _gathers(result.ranks[0]) == {"root": (1, 1), "layers.0": (2, 2)}
    assert (result.ranks[0].blocks["excess"] == 0).all()
    units = {u.name: u.reshard_after_forward for u in result.config.units}
    assert (units["layers.0"].value, units["layers.0"].source) == (True, "trace")
    assert (units["root"].value, units["root"].source) == (False, "trace")


def test_a_root_gathered_in_backward_is_read_as_resharding(tmp_path):
    b = TraceBuilder()
    _root_and_block_gathers(b, root_backward=True)
    result = analyze(b.write(tmp_path / "rank0.json"), cache=False).only
    assert _gathers(result.ranks[0])["root"] == (2, 2)
    assert result.config.reshards("root") is True


@pytest.mark.parametrize(
    ("setting", "root_expected", "block_expected"),
    [
        ({"layers.0": True, "root": "default"}, 1, 2),  # what capture records
        ({"layers.0": False, "root": "default"}, 1, 1),  # no reshard: one gather
        ({"layers.0": 2, "root": True}, 2, 2),  # explicit True on the root is obeyed
        ({"layers.0": True, "root": False}, 1, 2),
    ],
)
def test_expected_gathers_follow_run_json(tmp_path, setting, root_expected, block_expected):
    b = TraceBuilder()
    _root_and_block_gathers(b)
    run = _capture_run(
        tmp_path,
        b,
        parallel={"reshard_after_forward": setting},
        environment={"torch": "2.11.0"},
    )
    assert run.config.expected("root", "AllGather") == root_expected
    assert run.config.expected("layers.0", "AllGather") == block_expected
    assert run.config.expected("layers.0", "ReduceScatter") == 1
    assert run.config.unit("layers.0").reshard_after_forward.source == "run.json"


def test_root_before_torch_2_8_never_reshards(tmp_path):
    b = TraceBuilder()
    _root_and_block_gathers(b)
    run = _capture_run(
        tmp_path,
        b,
        parallel={"reshard_after_forward": {"root": True, "layers.0": True}},
        environment={"torch": "2.6"},
    )
    assert run.config.expected("root", "AllGather") == 1


def test_reshard_false_expects_one_gather_and_flags_two(tmp_path):
    b = TraceBuilder()
    _root_and_block_gathers(b)
    run = _capture_run(
        tmp_path, b, parallel={"reshard_after_forward": {"layers.0": False, "root": "default"}}
    )
    r = run.ranks[0]
    assert _gathers(r) == {"root": (1, 1), "layers.0": (2, 1)}
    assert (r.blocks.set_index("block").loc["layers.0", "excess"] == 1).all()
    # run.json wins over what the trace shows, and says so.
    assert any("layers.0: run.json records reshard_after_forward=False" in n for n in run.notices)


def test_block_busbw_is_block_algbw_times_the_bus_factor(tmp_path):
    """Two gathers of one unit, of different speed: busbw = (Σ bytes / Σ time) × (n−1)/n,
    not the mean of the kernels' busbw (which weights the fast one too much)."""
    b = TraceBuilder(world_size=4)
    b.step(1, 0, 3000)
    for t, dur in ((100, 100), (1100, 300)):
        b.label("FSDP::all_gather (layers.0)", t, 10)
        b.nccl("AllGather", t + 200, dur, launch_ts=t + 2, nelems=1_000_000)
    r = one_rank(tmp_path, b)
    row = r.blocks.iloc[0]
    algbw = 2 * 2e6 / 400e-6 / 1e9  # 4 MB in 400 µs: 10 GB/s
    assert row["algbw_gbps"] == pytest.approx(algbw)
    assert row["busbw_gbps"] == pytest.approx(algbw * 3 / 4)
    kernel_mean = r.collectives["busbw_gbps"].mean()
    assert kernel_mean == pytest.approx((20 + 20 / 3) / 2 * 3 / 4)  # what it used to report
    assert kernel_mean != pytest.approx(row["busbw_gbps"])


def _legacy_trace() -> TraceBuilder:
    """Two steps with every number worked out by hand (see the test)."""
    b = TraceBuilder(rank=1)
    b.step(1, 0, 1000)
    b.kernel("gemm_a", 100, 200, launch_ts=5)  # [100, 300] stream 7
    b.kernel("gemm_b", 350, 150, launch_ts=6)  # [350, 500]
    b.nccl("AllGather", 250, 200, launch_ts=20)  # [250, 450] stream 20
    b.step(2, 1000, 1000)
    b.kernel("Memcpy HtoD (Pageable -> Device)", 1050, 40, 1002, cat="gpu_memcpy")
    b.kernel("gemm_c", 1100, 300, launch_ts=1005)  # [1100, 1400]
    b.nccl("ReduceScatter", 1300, 300, launch_ts=1010, stream=21)  # [1300, 1600]
    return b


@pytest.mark.parametrize("layout", ["legacy", "legacy-list"])
def test_pytorch_1_12_layout(tmp_path, layout):
    path = _legacy_trace().write(tmp_path / "rank1_trace.json", layout=layout)
    r = one_rank(tmp_path, _legacy_trace(), name="unused.json")  # the current layout
    legacy = analyze(path).ranks[0]
    assert legacy.rank == 1  # distributedInfo, or the file name for a bare list
    s1, s2 = legacy.steps.to_dict("records")
    # Step 1 ends where step 2's first GPU work starts: the batch copy at 1050.
    assert (s1["start_us"], s1["end_us"], s2["start_us"], s2["end_us"]) == (100, 1050, 1050, 1600)
    assert (s1["compute_us"], s1["comm_us"], s1["overlap_us"], s1["exposed_us"]) == (
        350,
        200,
        150,  # [250, 300] and [350, 450]
        50,
    )
    assert s1["idle_us"] == 950 - 400  # busy [100, 500]
    assert (s2["compute_us"], s2["comm_us"], s2["overlap_us"], s2["exposed_us"]) == (
        300,
        300,
        100,
        200,
    )
    assert s2["idle_us"] == 550 - 500 and s2["step_us"] == 550
    coll = legacy.collectives.sort_values("start_us")
    assert coll["collective"].tolist() == ["AllGather", "ReduceScatter"]  # from legacy names
    assert coll["kernel"].str.startswith("ncclKernel_").all()
    assert coll["bytes"].isna().all()  # no message sizes recorded: no bandwidth, no guess
    assert coll["step"].tolist() == [1, 2]
    # The same numbers as the current layout of the same trace.
    columns = ["step_us", "compute_us", "comm_us", "overlap_us", "exposed_us", "idle_us"]
    assert legacy.steps[columns].to_numpy().tolist() == r.steps[columns].to_numpy().tolist()
