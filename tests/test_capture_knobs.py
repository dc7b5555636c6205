"""Each knob reaches FSDP2: AC placement, prefetch lists, reshard settings (one gloo process)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.distributed.device_mesh import init_device_mesh

from fsdp_trace.capture import parallelize
from fsdp_trace.capture.config import CaptureConfig, parse_reshard
from fsdp_trace.capture.environment import dense_peak_tflops, parse_topology_matrix
from fsdp_trace.capture.models import GPT, PRESETS, gpt_flops_per_token
from fsdp_trace.errors import UserError
from tests.conftest import free_port


@pytest.fixture(scope="module")
def mesh(gloo_world_of_one):
    return init_device_mesh("cpu", (1,))


@pytest.mark.parametrize(
    ("n", "coverage", "expected"),
    [
        (8, 0.0, []),
        (8, 1.0, list(range(8))),
        (8, 0.5, [1, 3, 5, 7]),
        (8, 0.25, [2, 6]),
        (4, 0.5, [1, 3]),
        (24, 0.75, [0, 2, 3, 4, 6, 7, 8, 10, 11, 12, 14, 15, 16, 18, 19, 20, 22, 23]),
        (3, 0.1, []),
    ],
)
def test_ac_coverage_selects_blocks_evenly(n, coverage, expected):
    chosen = parallelize.select_ac_blocks(n, coverage)
    assert chosen == expected
    assert len(chosen) == round(coverage * n)


def test_ac_wraps_exactly_the_chosen_blocks_and_keeps_their_paths():
    model = GPT(PRESETS["tiny"])
    paths = [f"layers.{i}" for i in range(4)]
    wrapped = parallelize.apply_activation_checkpointing(model, paths, [1, 3], "non-reentrant")
    assert wrapped == ["layers.1", "layers.3"]
    kinds = [isinstance(model.get_submodule(p), CheckpointWrapper) for p in paths]
    assert kinds == [False, True, False, True]
    assert parallelize.module_paths(model, list(model.layers)) == paths


def test_prefetch_lists():
    units = ["a", "b", "c", "d"]
    forward, backward = parallelize.prefetch_lists(units, 2, 1)
    assert forward == {"a": ["b", "c"], "b": ["c", "d"], "c": ["d"]}
    assert backward == {"d": ["c"], "c": ["b"], "b": ["a"]}
    assert parallelize.prefetch_lists(units, 0, 0) == ({}, {})


def test_keep_last_unsharded_keeps_the_last_block_and_the_head():
    from fsdp_trace.capture.parallelize import reshard_setting

    # units: embeddings, layers.0..2, norm+output: the last block is unit 3
    assert [reshard_setting(i, 3, True, True) for i in range(5)] == [True, True, True, False, False]
    assert [reshard_setting(i, 3, True, False) for i in range(5)] == [True] * 5


def test_units_with_and_without_separate_embeddings():
    blocks = ["layers.0", "layers.1"]
    emb = [("tok_embeddings", "pos_embeddings"), ("norm", "output")]
    assert parallelize.plan_units(blocks, emb, False) == [["layers.0"], ["layers.1"]]
    assert parallelize.plan_units(blocks, emb, True) == [
        ["tok_embeddings", "pos_embeddings"],
        ["layers.0"],
        ["layers.1"],
        ["norm", "output"],
    ]


def _state(module):
    return module._get_fsdp_state()


def test_reshard_and_prefetch_reach_fully_shard(mesh):
    with torch.device("meta"):
        model = GPT(PRESETS["tiny"])
    units = [[f"layers.{i}"] for i in range(4)]
    plan = parallelize.apply_fsdp(
        model,
        mesh,
        units,
        param_dtype="bf16",
        reduce_dtype="fp32",
        reshard=True,
        keep_last_unsharded=True,
        forward_prefetch=1,
        backward_prefetch=2,
    )
    groups = [_state(model.layers[i])._fsdp_param_group for i in range(4)]
    # reshard True keeps a post-forward mesh; the last unit kept unsharded has none.
    assert [g.post_forward_mesh_info is not None for g in groups] == [True, True, True, False]
    assert plan.reshard_after_forward == {
        "layers.0": True,
        "layers.1": True,
        "layers.2": True,
        "layers.3": False,
        "root": "default",
    }
    forward = [s._fsdp_param_group for s in _state(model.layers[0])._states_to_forward_prefetch]
    assert forward == [groups[1]]
    backward = [s._fsdp_param_group for s in _state(model.layers[3])._states_to_backward_prefetch]
    assert backward == [groups[2], groups[1]]
    mp = groups[0].mp_policy
    assert mp.param_dtype == torch.bfloat16 and mp.reduce_dtype == torch.float32


def test_reshard_false_reaches_fully_shard(mesh):
    with torch.device("meta"):
        model = GPT(PRESETS["tiny"])
    parallelize.apply_fsdp(
        model,
        mesh,
        [["layers.0"], ["layers.1"]],
        param_dtype="fp32",
        reduce_dtype="fp32",
        reshard=False,
        keep_last_unsharded=False,
        forward_prefetch=0,
        backward_prefetch=0,
    )
    assert _state(model.layers[0])._fsdp_param_group.post_forward_mesh_info is None


def test_reshard_parsing():
    assert parse_reshard("true") is True and parse_reshard("False") is False
    assert parse_reshard("4") == 4
    with pytest.raises(UserError):
        parse_reshard("1")
    with pytest.raises(UserError):
        parse_reshard("sometimes")


def test_config_round_trips_through_the_cli_arguments(monkeypatch):
    """What the launcher replays to every rank rebuilds exactly the same config."""
    from typer.testing import CliRunner

    import fsdp_trace.capture.launcher as launcher
    from fsdp_trace import cli

    cfg = CaptureConfig(
        model="gpt-small",
        batch_size=2,
        ac_coverage=0.25,
        reshard_after_forward=4,
        keep_last_unsharded=True,
        prefetch_forward=2,
        compile=True,
        straggler_rank=1,
        straggler_delay_ms=5.0,
        grad_accum=2,
    ).validate()
    seen = {}
    monkeypatch.setattr(launcher, "launch", lambda c, nproc, rdzv: seen.setdefault("cfg", c))
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    result = CliRunner().invoke(cli.app, ["capture", *cfg.to_cli_args()])
    assert result.exit_code == 0, result.output
    assert seen["cfg"].to_dict() == cfg.to_dict()


def test_gpt_flops_per_token_reference_config():
    cfg = PRESETS["gpt-1.3b"]
    # 24 blocks x 12 d^2 + output head, times 6, plus 12 L d T attention.
    n = 24 * 12 * 2048**2 + 2048 * 50304
    assert gpt_flops_per_token(cfg, 2048) == 6 * n + 12 * 24 * 2048 * 2048


def test_peak_table_and_topology_parsing():
    assert dense_peak_tflops("NVIDIA H200") == 989.0
    assert dense_peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert dense_peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert dense_peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert dense_peak_tflops("NVIDIA GeForce RTX 4090") is None
    matrix = (
        "\t\x1b[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\x1b[0m\n"
        "GPU0\t X \tNV18\t0-31\t0\nGPU1\tNV18\t X \t0-31\t0\n"
    )
    assert parse_topology_matrix(matrix) == {"0-1": "NV18"}


def _shard_with_int_reshard(rank: int, world_size: int, port: int, results) -> None:
    """One of four gloo ranks: shard the tiny GPT with `--reshard-after-forward 2` and report
    what fully_shard made of it."""
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    try:
        with torch.device("meta"):
            model = GPT(PRESETS["tiny"])
        config = CaptureConfig(reshard_after_forward="2").validate()
        plan = parallelize.apply_fsdp(
            model,
            init_device_mesh("cpu", (world_size,)),
            [[f"layers.{i}"] for i in range(4)],
            param_dtype="fp32",
            reduce_dtype="fp32",
            reshard=config.reshard_after_forward,
            keep_last_unsharded=True,
            forward_prefetch=0,
            backward_prefetch=0,
        )
        groups = [_state(model.layers[i])._fsdp_param_group for i in range(4)]
        results.put(
            (
                rank,
                plan.reshard_after_forward,
                [g.mesh_info.shard_mesh_size for g in groups],
                [
                    None
                    if g.post_forward_mesh_info is None
                    else g.post_forward_mesh_info.shard_mesh_size
                    for g in groups
                ],
            )
        )
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_integer_reshard_reaches_fully_shard_on_four_ranks():
    """`--reshard-after-forward 2` on 4 ranks: every block is sharded over 4, and after forward
    kept sharded over groups of 2 (the last block, kept unsharded, keeps no post-forward mesh)."""
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    mp.spawn(_shard_with_int_reshard, args=(4, free_port(), results), nprocs=4, join=True)
    seen = sorted(results.get() for _ in range(4))
    assert [rank for rank, *_ in seen] == [0, 1, 2, 3]
    for _, plan, shard_sizes, post_forward_sizes in seen:
        assert plan == {
            "layers.0": 2,
            "layers.1": 2,
            "layers.2": 2,
            "layers.3": False,
            "root": "default",
        }
        assert shard_sizes == [4, 4, 4, 4]
        assert post_forward_sizes == [2, 2, 2, None]
