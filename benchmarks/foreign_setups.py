"""Train a small GPT under plain torch.profiler in set-ups fsdp-trace did not make itself.

    torchrun --nproc-per-node 2 benchmarks/foreign_setups.py --setup ddp --out /tmp/foreign/ddp
    torchrun --nproc-per-node 4 benchmarks/foreign_setups.py --setup hsdp --device cpu --out /tmp/h

Written the way a plain PyTorch user would (no `fsdp-trace capture`, no run.json): each rank
writes `<host>_<pid>.<ns>.pt.trace.json.gz` through `tensorboard_trace_handler`, so the rank is
only in the trace's `distributedInfo`. The traces test that the analyzer recognizes set-ups it
did not launch: FSDP1, DDP, root-only FSDP2, CPU offload, float8, a GPU straggler, HSDP, and a
folder mixing lean timing traces with detailed traces of a few ranks. Only the GPT class comes
from fsdp-trace, so the model matches the project's presets.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

SETUPS = (
    "fsdp2",
    "fsdp2-root-only",
    "fsdp2-offload",
    "fsdp1",
    "ddp",
    "float8",
    "slow-gpu",
    "hsdp",
    "mixed-detail",
)
CUDA_ONLY = ("fsdp2-offload", "float8")
# Model shapes per device: small enough that the traces can be committed to git.
DEFAULTS = {
    "cuda": dict(layers=6, d_model=1024, heads=16, seq_len=1024, vocab=32768, batch_size=4),
    "cpu": dict(layers=4, d_model=64, heads=4, seq_len=64, vocab=512, batch_size=2),
}
SLOW_SIZE = {"cuda": 4096, "cpu": 256}  # square matmul of the straggler's extra work
DETAILED_RANKS = (0, 1)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setup", required=True, choices=SETUPS)
    parser.add_argument("--out", required=True, type=Path, help="folder for the traces")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None)
    for name in ("layers", "d-model", "heads", "seq-len", "vocab", "batch-size"):
        parser.add_argument(f"--{name}", type=int, default=None, help="default: by device")
    parser.add_argument("--steps", type=int, default=2, help="active (profiled) steps")
    parser.add_argument("--slow-rank", type=int, default=1, help="slow-gpu: the straggler")
    parser.add_argument(
        "--slow-work", type=int, default=6, help="slow-gpu: extra square matmuls per block forward"
    )
    parser.add_argument("--replicas", type=int, default=2, help="hsdp: replicate-dim size")
    args = parser.parse_args()
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    for key, default in DEFAULTS[args.device].items():
        if getattr(args, key) is None:
            setattr(args, key, default)
    return args


def fail(message: str) -> NoReturn:
    """Every rank meets the same refusal: rank 0 says why, all leave with exit status 2."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"foreign_setups: {message}", file=sys.stderr, flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()
    sys.exit(2)


def preflight(args: argparse.Namespace, world: int) -> None:
    """Refuse what cannot run before any process group exists, so no rank hangs."""
    if args.device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda but CUDA is not available (use --device cpu)")
    if args.setup in CUDA_ONLY and args.device != "cuda":
        fail(f"--setup {args.setup} needs CUDA: it cannot run with --device cpu")
    if args.setup == "hsdp" and (args.replicas < 1 or world % args.replicas):
        fail(f"--replicas {args.replicas} does not divide the world size {world}")
    if args.setup == "slow-gpu" and not 0 <= args.slow_rank < world:
        fail(f"--slow-rank {args.slow_rank} is not a rank of a world of {world}")
    if args.d_model % args.heads:
        fail(f"--d-model {args.d_model} is not a multiple of --heads {args.heads}")
    if args.setup == "float8":
        try:
            import torchao.float8  # noqa: F401
        except ImportError as exc:
            fail(f"--setup float8 needs torchao (from torchao.float8 import ...): {exc}")
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if torch.cuda.get_device_capability(local) < (8, 9):
            fail("--setup float8 needs a GPU with float8 matmuls (SM 8.9+, e.g. H100)")


def build_model(args: argparse.Namespace, device: torch.device) -> nn.Module:
    """The project's GPT, built on the device with the same weights on every rank."""
    try:
        from fsdp_trace.capture.models import GPT, GPTConfig
    except ImportError:  # run from a checkout without installing: the repo root is ../
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from fsdp_trace.capture.models import GPT, GPTConfig
    cfg = GPTConfig(
        n_layers=args.layers,
        d_model=args.d_model,
        n_heads=args.heads,
        seq_len=args.seq_len,
        vocab_size=args.vocab,
        batch_size=args.batch_size,
    )
    torch.manual_seed(0)
    with device:
        model = GPT(cfg)
    model.init_weights()
    return model


def shard_fsdp2(model: nn.Module, mesh: Any, cuda: bool, per_block: bool = True, **kw: Any) -> None:
    """FSDP2 the usual way: each block, then the root (or the root alone)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    kwargs = {"mesh": mesh, "mp_policy": mp if cuda else MixedPrecisionPolicy(), **kw}
    if per_block:
        for block in model.layers:
            fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)


def add_straggler_work(model: nn.Module, device: torch.device, matmuls: int) -> None:
    """A GPU straggler: every block's forward runs extra matmuls on the compute stream (their
    result is discarded), so this rank computes longer while its host behaves the same."""
    size = SLOW_SIZE[device.type]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)

    def extra_work(module: nn.Module, inputs: Any) -> None:
        for _ in range(matmuls):
            torch.mm(a, b)

    for block in model.layers:  # after fully_shard: runs once the block is gathered
        block.register_forward_pre_hook(extra_work)


def parallelize(
    args: argparse.Namespace, model: nn.Module, device: torch.device, rank: int, world: int
) -> tuple[nn.Module, AbstractContextManager[Any]]:
    """Wrap the model as the set-up says; returns it and the autocast context (DDP only)."""
    from torch.distributed.device_mesh import init_device_mesh

    cuda = device.type == "cuda"
    setup = args.setup
    if setup == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
        amp = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else nullcontext()
        return ddp, amp
    if setup == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        try:
            wrapped = FullyShardedDataParallel(
                model,
                auto_wrap_policy=ModuleWrapPolicy({type(model.layers[0])}),
                use_orig_params=True,
                device_id=device,
                mixed_precision=mp if cuda else None,
            )
        except (ValueError, RuntimeError, AssertionError, NotImplementedError) as exc:
            fail(f"FSDP1 refused --device {device.type}: {type(exc).__name__}: {exc}")
        return wrapped, nullcontext()
    if setup == "hsdp":
        shape = (args.replicas, world // args.replicas)
        mesh = init_device_mesh(device.type, shape, mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh(device.type, (world,))
    if setup == "float8":
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        def float8_ok(module: nn.Module, fqn: str) -> bool:
            """Skip the output head (vocab dim) and shapes _scaled_mm cannot take."""
            if not isinstance(module, nn.Linear) or fqn == "output":
                return False
            return module.in_features % 16 == 0 and module.out_features % 16 == 0

        config = Float8LinearConfig(enable_fsdp_float8_all_gather=True)
        convert_to_float8_training(model, config=config, module_filter_fn=float8_ok)
    if setup == "fsdp2-offload":
        from torch.distributed.fsdp import CPUOffloadPolicy

        shard_fsdp2(model, mesh, cuda, offload_policy=CPUOffloadPolicy())
    else:
        shard_fsdp2(model, mesh, cuda, per_block=setup != "fsdp2-root-only")
    if setup == "slow-gpu" and rank == args.slow_rank:
        add_straggler_work(model, device, args.slow_work)
    return model, nullcontext()


def run_session(
    step_fn: Callable[[], None],
    device: torch.device,
    out: Path,
    wait: int,
    warmup: int,
    active: int,
    worker_name: str | None = None,
    detailed: bool = False,
) -> float:
    """One profiler session of exactly one cycle (repeat=1, never stepped past it: a loop
    past the cycle re-arms the profiler); returns the active steps' mean time in ms, timed
    with one synchronization before and after them (none per step: the host runs ahead, as
    in a training loop that does not read the loss every step)."""
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    handler = tensorboard_trace_handler(str(out), worker_name=worker_name, use_gzip=True)
    start = 0.0
    with profile(
        activities=activities,
        schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
        on_trace_ready=handler,
        record_shapes=detailed,
        with_stack=detailed,
    ) as prof:
        for index in range(wait + warmup + active):
            if index == wait + warmup:
                if cuda:
                    torch.cuda.synchronize(device)
                start = time.perf_counter()
            step_fn()
            prof.step()
        if cuda:
            torch.cuda.synchronize(device)
    return (time.perf_counter() - start) * 1e3 / active


def main() -> None:
    args = parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    preflight(args, world)
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")

    model, amp = parallelize(args, build_model(args, device), device, rank, world)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator(device=device)
    generator.manual_seed(1000 + rank)

    def train_step() -> None:
        shape = (args.batch_size, args.seq_len + 1)
        tokens = torch.randint(0, args.vocab, shape, device=device, generator=generator)
        with amp:
            logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    mixed = args.setup == "mixed-detail"
    name = f"rank{rank}" if mixed else None  # mixed-detail: names tell lean from detailed
    times = run_session(train_step, device, args.out, 1, 2, args.steps, worker_name=name)
    if mixed:  # then one detailed step on a few ranks; the others train alongside, unprofiled
        if rank in DETAILED_RANKS:
            run_session(train_step, device, args.out, 0, 1, 1, f"rank{rank}-detailed", True)
        else:
            for _ in range(2):
                train_step()
    print(
        f"[rank {rank}] {args.setup} on {device.type}: {times:.1f} ms per profiled step "
        f"({args.steps} steps) -> {args.out}",
        flush=True,
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
