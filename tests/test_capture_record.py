"""run.json arithmetic (step time, tokens/s, MFU, scaling efficiency, allocator retries), the
end-of-capture summary, the recorded command, and how outputs are written and taken back.
Numbers are checked against formulas written out here, not against the code's own helpers."""

from __future__ import annotations

import json
import shlex
import statistics
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from fsdp_trace import atomic
from fsdp_trace.capture import outputs, parallelize, runner, schedule, train
from fsdp_trace.capture.config import PRESET_NAMES, CaptureConfig
from fsdp_trace.capture.models import (
    PRESETS,
    ModelSpec,
    build_model,
    count_parameters,
    resolve_shape,
)
from fsdp_trace.capture.summary import print_summary, summary_rows
from fsdp_trace.errors import UserError
from tests.models_for_tests import TwoLayer

H100 = {"gpu_name": "NVIDIA H100 80GB HBM3", "dense_bf16_peak_tflops": 989.0}
CUDA_WORLD = {"world_size": 2, "local_world_size": 2, "nnodes": 1, "backend": "nccl"}
PER_RANK = [
    {
        "rank": 0,
        "step_ms": [100.0, 110.0, 120.0],
        "memory": {"peak_allocated_gib": 10.0, "peak_reserved_gib": 12.0, "num_alloc_retries": 1},
    },
    {
        "rank": 1,
        "step_ms": [105.0, 100.0, 130.0],
        "memory": {"peak_allocated_gib": 11.0, "peak_reserved_gib": 11.5, "num_alloc_retries": 2},
    },
]


def record_for(cfg: CaptureConfig, spec: ModelSpec, env: dict, device: str = "cuda") -> dict:
    return runner.build_record(
        cfg,
        command="fsdp-trace capture ...",
        argv=["fsdp-trace", "capture"],
        world={**CUDA_WORLD, "device": device},
        env=env,
        spec=spec,
        params=count_parameters(spec.model),
        block_paths=["layers.0"],
        ac_blocks=[],
        plan=parallelize.ShardPlan(),
        per_rank=PER_RANK,
    )


@pytest.fixture(scope="module")
def small_spec() -> ModelSpec:
    """gpt-small at batch 4 x seq 512, built on the meta device (no memory)."""
    return build_model("gpt-small", 4, 512, torch.device("cpu"), seed=0, rank=0, world_size=2)


def test_mfu_is_6n_plus_attention_over_the_dense_peak(tmp_path, small_spec):
    cfg = CaptureConfig(model="gpt-small", batch_size=4, seq_len=512, timed_steps=3).validate()
    record = record_for(cfg, small_spec, H100)
    figures = record["figures"]
    # The slowest rank sets each step's pace: max over ranks per step, then the median.
    pace = [105.0, 110.0, 130.0]
    assert figures["step_time_ms"]["median"] == statistics.median(pace) == 110.0
    assert figures["step_time_ms"]["max"] == 130.0 and figures["step_time_ms"]["n"] == 3
    tokens_per_s = 4 * 512 / 0.110
    assert figures["tokens_per_s_per_gpu"] == pytest.approx(tokens_per_s)
    # gpt-small: 8 blocks of 12 d^2 (qkv, wo, 2 x 4d MLP) + the d x vocab head, d = 1024.
    layers, d, vocab, seq = 8, 1024, 32768, 512
    flops = 6 * (layers * 12 * d * d + d * vocab) + 12 * layers * d * seq
    assert figures["flops_per_token"] == flops
    assert figures["mfu"] == pytest.approx(tokens_per_s * flops / 989e12)
    assert figures["achieved_tflops_per_gpu"] == pytest.approx(tokens_per_s * flops / 1e12)
    assert figures["notices"] == []
    # Memory: the worst rank; allocator retries (timed steps only) summed over ranks.
    assert (figures["peak_allocated_gib"], figures["peak_reserved_gib"]) == (11.0, 12.0)
    assert figures["num_alloc_retries"] == 3
    assert (record["model"]["batch_size"], record["model"]["seq_len"]) == (4, 512)


def test_unknown_gpu_omits_mfu_with_a_notice_that_reaches_the_summary(small_spec, capsys):
    cfg = CaptureConfig(model="gpt-small", batch_size=4, seq_len=512, timed_steps=3).validate()
    env = {"gpu_name": "NVIDIA GeForce RTX 4090", "dense_bf16_peak_tflops": None}
    record = record_for(cfg, small_spec, env)
    assert record["figures"]["mfu"] is None
    notice = (
        "MFU omitted: no dense bf16 peak known for 'NVIDIA GeForce RTX 4090' "
        "(fsdp_trace/capture/environment.py lists the known GPUs)"
    )
    assert record["figures"]["notices"] == [notice]
    rows = dict(summary_rows(record))
    assert rows["MFU"] == notice.removeprefix("MFU ")
    print_summary(record, "runs/x")
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "runs/x/run.json"
    assert f"  MFU                 {rows['MFU']}" in printed
    assert any(line.startswith("  step time           110.00 ms median") for line in printed)


def test_scaling_efficiency_against_a_baseline_run(tmp_path, small_spec):
    base = tmp_path / "b4-1gpu"
    base.mkdir()
    (base / "run.json").write_text(
        json.dumps({"figures": {"tokens_per_s_per_gpu": 20000.0}, "world": {"world_size": 1}})
    )
    cfg = CaptureConfig(
        model="gpt-small", batch_size=4, seq_len=512, timed_steps=3, baseline=str(base)
    ).validate()
    figures = record_for(cfg, small_spec, H100)["figures"]
    assert figures["scaling_efficiency"] == pytest.approx((4 * 512 / 0.110) / 20000.0)
    assert figures["baseline_tokens_per_s"] == 20000.0 and figures["notices"] == []
    rows = dict(summary_rows(record_for(cfg, small_spec, H100)))
    assert rows["scaling efficiency"].startswith(f"{(4 * 512 / 0.110) / 20000.0:.3f} vs ")

    missing = replace(cfg, baseline=str(tmp_path / "nope"))
    figures = record_for(missing, small_spec, H100)["figures"]
    assert figures["scaling_efficiency"] is None
    assert figures["notices"][0].startswith("scaling efficiency omitted: ")


def test_without_flops_per_token_mfu_uses_6n_and_says_so():
    model = TwoLayer()  # two Linear(16, 16) with bias: 2 x (256 + 16) parameters
    spec = ModelSpec(
        model=model,
        blocks=list(model.blocks),
        batch_fn=lambda step: (None, None),
        batch_size=8,
        seq_len=1,
    )
    cfg = CaptureConfig(model="m.f:g", batch_size=8, seq_len=1, timed_steps=3).validate()
    figures = record_for(cfg, spec, H100)["figures"]
    assert figures["flops_per_token"] == 6 * 2 * (16 * 16 + 16)
    assert figures["mfu"] == pytest.approx((8 / 0.110) * 6 * 544 / 989e12)
    assert figures["notices"] == ["FLOPs per token estimated as 6*N: attention term unknown"]


def test_cpu_runs_say_why_mfu_is_missing(small_spec):
    cfg = CaptureConfig(model="gpt-small", batch_size=4, seq_len=512, timed_steps=3).validate()
    record = record_for(cfg, small_spec, {"gpu_name": None}, device="cpu")
    assert record["figures"]["mfu"] is None
    assert dict(summary_rows(record))["MFU"] == "omitted: not a GPU run"


def test_allocator_retries_count_only_the_timed_steps(monkeypatch):
    """The counters run from process start; the timed steps' share is the difference."""
    counters = iter(
        [{"num_alloc_retries": 7, "num_ooms": 1}, {"num_alloc_retries": 9, "num_ooms": 1}]
    )
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device: next(counters))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 3 * 2**30)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device: 4 * 2**30)
    gpu = torch.device("cuda", 0)
    before = train.allocator_counters(gpu)  # read right before the timed steps
    assert train.memory_figures(gpu, before) == {
        "peak_allocated_gib": 3.0,
        "peak_reserved_gib": 4.0,
        "num_alloc_retries": 2,
        "num_ooms": 0,
    }


def test_factory_shape_is_required_and_presets_resolve_their_defaults():
    assert resolve_shape("tiny", None, None) == (2, 64)
    assert resolve_shape("gpt-1.3b", 1, None) == (1, 2048)
    assert resolve_shape("pkg.mod:build", 8, 128) == (8, 128)
    with pytest.raises(UserError, match="pass --batch-size and --seq-len"):
        resolve_shape("pkg.mod:build", 8, None)
    with pytest.raises(UserError, match="pass --seq-len"):
        CaptureConfig(model="pkg.mod:build", batch_size=8).validate()
    assert set(PRESET_NAMES) == set(PRESETS)


def test_out_of_memory_message_names_the_presets_real_shape():
    cfg = CaptureConfig(model="gpt-1.3b").validate()
    message = runner.oom_message(cfg, *resolve_shape("gpt-1.3b", None, None), torch.device("cpu"))
    assert message.startswith("out of memory on CPU with batch 4 x seq 2048: lower --batch-size")
    cpu_failure = RuntimeError(
        "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: "
        "you tried to allocate 8 bytes"
    )
    assert runner.is_out_of_memory(cpu_failure)
    assert not runner.is_out_of_memory(RuntimeError("shape mismatch"))


def test_timeouts_are_explained_in_one_line():
    cfg = CaptureConfig(timeout_s=600)
    nccl = RuntimeError(
        "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, "
        "OpType=_ALLGATHER_BASE) ran for 600000 milliseconds before timing out.\nmore"
    )
    assert runner.failure_message(nccl, cfg).startswith(
        "a collective waited longer than --timeout-s 600 for another rank, which is stuck or "
        "far behind (RuntimeError: [Rank 0] Watchdog caught"
    )
    assert runner.failure_message(ValueError("bad\nsecond"), cfg) == "ValueError: bad"


# --- the recorded command -----------------------------------------------------------------


def parse_capture(command: str, monkeypatch) -> tuple[CaptureConfig, int, object]:
    """Run a recorded command's arguments through the real CLI, stopping at the launcher."""
    from typer.testing import CliRunner

    import fsdp_trace.capture.launcher as launcher
    from fsdp_trace import cli

    seen: dict = {}
    monkeypatch.setattr(launcher, "launch", lambda c, n, r: seen.update(cfg=c, nproc=n, rdzv=r))
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    args = shlex.split(command)
    assert args[:2] == ["fsdp-trace", "capture"]
    result = CliRunner().invoke(cli.app, args[1:])
    assert result.exit_code == 0, result.output
    return seen["cfg"], seen["nproc"], seen["rdzv"]


def test_recorded_command_rebuilds_the_same_run(monkeypatch):
    from fsdp_trace.capture.launcher import Rendezvous

    cfg = CaptureConfig(
        model="gpt-small",
        out="runs/a b",
        batch_size=2,
        reshard_after_forward="false",
        keep_last_unsharded=True,
        ac_coverage=1.0,
        lr=3e-4,
        compile=True,
        straggler_rank=1,
        straggler_delay_ms=2.5,
    ).validate()
    rdzv = Rendezvous(nnodes="2", node_rank=0, rdzv_backend="c10d", rdzv_endpoint="head:29500")
    command = cfg.capture_command(8, rdzv.capture_args())
    assert command == (
        "fsdp-trace capture --model gpt-small --nproc-per-node 8 --nnodes 2 --node-rank 0 "
        "--rdzv-backend c10d --rdzv-endpoint head:29500 --out 'runs/a b' --batch-size 2 "
        "--reshard-after-forward false --keep-last-unsharded --ac-coverage 1 --compile "
        "--lr 0.0003 --straggler-rank 1 --straggler-delay-ms 2.5"
    )
    again, nproc, again_rdzv = parse_capture(command, monkeypatch)
    assert again.to_dict() == cfg.to_dict() and nproc == 8
    assert again_rdzv == replace(rdzv, nproc_per_node=8)  # the launcher's options, one object


def test_a_sweep_point_records_its_own_capture(monkeypatch):
    """What the sweep hands the launcher for its 1-GPU baseline point, recorded as such."""
    base = CaptureConfig(model="gpt-1.3b", batch_size=1, warmup_steps=2).validate()
    point = replace(base, ac_coverage=0.25, out="sweeps/b1/ac0.25-1gpu")
    command = point.capture_command(1)
    assert command == (
        "fsdp-trace capture --model gpt-1.3b --nproc-per-node 1 --out sweeps/b1/ac0.25-1gpu "
        "--batch-size 1 --ac-coverage 0.25 --warmup-steps 2"
    )
    again, nproc, _ = parse_capture(command, monkeypatch)
    assert again.to_dict() == point.to_dict() and nproc == 1


def test_under_plain_torchrun_the_command_is_rebuilt_from_its_environment(monkeypatch):
    for name in (outputs.COMMAND_ENV, outputs.ARGV_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv("WORLD_SIZE", "8")
    cfg = CaptureConfig(model="tiny", out="r", timed_steps=5).validate()
    cli_view = "torchrun --nproc-per-node=4 -m fsdp_trace capture --out r --timed-steps 5"
    command, argv = runner.recorded_command(cfg, cli_view)
    assert command == (
        "fsdp-trace capture --model tiny --nproc-per-node 4 --nnodes 2 --out r --timed-steps 5"
    )
    assert argv == shlex.split(cli_view)


# --- outputs: temp names, renames, and taking them back --------------------------------------


def fill(folder: Path, names: list[str]) -> None:
    folder.mkdir(exist_ok=True)
    for name in names:
        (folder / name).write_text("x")


CAPTURE_FILES = [
    "rank0.detailed.json.gz",
    "rank1.timing.json.gz",
    "rank10.timing.json.gz",
    ".rank1.detailed.tmp-4242.json.gz",
    ".rank0.timing.tmp-17.json.gz",
    ".run.json.k2j3h4.tmp",
]


def test_a_failed_run_takes_back_traces_and_temp_files_but_not_the_users(tmp_path):
    out = tmp_path / "run"
    fill(out, [*CAPTURE_FILES, "notes.txt", "rank-notes.md"])
    outputs.remove_incomplete_outputs(out, created=False)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "rank-notes.md"]

    fill(out, CAPTURE_FILES)
    (out / "notes.txt").unlink()
    (out / "rank-notes.md").unlink()
    outputs.remove_incomplete_outputs(out, created=True)
    assert not out.exists()  # a directory we made for nothing goes too

    fill(out, [*CAPTURE_FILES, "run.json"])  # a complete run is never touched
    outputs.remove_incomplete_outputs(out, created=True)
    assert len(list(out.iterdir())) == len(CAPTURE_FILES) + 1


def test_one_rank_removes_only_its_own_files(tmp_path):
    fill(tmp_path, CAPTURE_FILES)
    outputs.remove_outputs(tmp_path, rank=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [
            *("rank0.detailed.json.gz", "rank10.timing.json.gz"),
            *(".rank0.timing.tmp-17.json.gz", ".run.json.k2j3h4.tmp"),
        ]
    )


class FailingProfiler:
    """Writes half a trace to the path it is given, then dies (a crash mid-export)."""

    def __init__(self) -> None:
        self.written: list[str] = []

    def export_chrome_trace(self, path: str) -> None:
        self.written.append(path)
        Path(path).write_bytes(b"\x1f\x8b half a trace")
        raise OSError("disk full")


def test_a_trace_is_written_under_a_temp_name_and_renamed(tmp_path):
    final = tmp_path / "rank0.timing.json.gz"
    prof = FailingProfiler()
    with pytest.raises(OSError):
        schedule.export_atomically(prof, final)
    written = Path(prof.written[0])
    assert written.parent == tmp_path and written.name.startswith(".rank0.timing.tmp-")
    assert written.name.endswith(".json.gz")  # the profiler gzips by suffix
    assert list(tmp_path.iterdir()) == []  # no final name, no temp left behind


def test_run_json_is_written_atomically(tmp_path):
    target = tmp_path / "run.json"
    with pytest.raises(RuntimeError), atomic.atomic_open(target) as handle:
        handle.write('{"half":')
        (temp,) = tmp_path.iterdir()
        assert temp.name.startswith(".run.json.")
        raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []
    atomic.write_text(target, "{}\n")
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


def test_each_nodes_local_rank_0_prepares_out(tmp_path, gloo_world_of_one):
    """Local rank 0 of every node creates --out (and clears an earlier run under
    --overwrite); other local ranks only wait, so --out need not be shared between nodes."""
    out = tmp_path / "node" / "run"
    runner.prepare_out_dir(out, local_rank=1)
    assert not out.exists()
    runner.prepare_out_dir(out, local_rank=0)
    assert out.is_dir()
    fill(out, [*CAPTURE_FILES, "run.json", "notes.txt"])
    runner.prepare_out_dir(out, local_rank=0)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_host_probe_per_rank_and_the_slowest_rank_per_probe(tmp_path, small_spec):
    cfg = CaptureConfig(model="gpt-small", batch_size=4, seq_len=512, timed_steps=3).validate()
    per_rank = [
        {**PER_RANK[0], "host_ms": [30.0, 20.0, 25.0]},
        {**PER_RANK[1], "host_ms": [10.0, 40.0, 22.0]},
    ]
    record = runner.build_record(
        cfg,
        command="fsdp-trace capture ...",
        argv=["fsdp-trace", "capture"],
        world={**CUDA_WORLD, "device": "cuda"},
        env=H100,
        spec=small_spec,
        params=count_parameters(small_spec.model),
        block_paths=["layers.0"],
        ac_blocks=[],
        plan=parallelize.ShardPlan(),
        per_rank=per_rank,
    )
    figures = record["figures"]
    assert figures["per_rank"][0]["host_step_ms"]["median"] == 25.0
    assert figures["per_rank"][1]["host_step_ms"]["median"] == 22.0
    assert figures["host_step_ms"]["median"] == 30.0  # max per probe: 30, 40, 25
    assert record_for(cfg, small_spec, H100)["figures"].get("host_step_ms") is None


def test_a_cpu_run_has_no_scaling_efficiency(tmp_path, small_spec):
    base = tmp_path / "b4-1gpu"
    base.mkdir()
    (base / "run.json").write_text(
        json.dumps({"figures": {"tokens_per_s_per_gpu": 20000.0}, "world": {"world_size": 1}})
    )
    cfg = CaptureConfig(
        model="gpt-small", batch_size=4, seq_len=512, timed_steps=3, baseline=str(base)
    ).validate()
    figures = record_for(cfg, small_spec, H100, device="cpu")["figures"]
    assert figures["scaling_efficiency"] is None
    assert any("not computed on CPU" in n for n in figures["notices"])
