"""User model factories for the `--model package.module:factory` tests."""

from __future__ import annotations

import os
import time

import torch
from torch import nn

from fsdp_trace.capture.models import ModelContext, ModelSpec


class TwoLayer(nn.Module):
    def __init__(self, dim: int = 16, fail_on_rank: int | None = None, oom: bool = False) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(dim, dim) for _ in range(2))
        self.fail_on_rank = fail_on_rank
        self.oom = oom

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.oom:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        if self.fail_on_rank is not None and int(os.environ["RANK"]) == self.fail_on_rank:
            raise RuntimeError("data loader crashed on purpose")
        for block in self.blocks:
            x = torch.relu(block(x))
        return x.pow(2).mean()


def _spec(ctx: ModelContext, model: TwoLayer) -> tuple:
    def batch(step: int):
        return torch.randn(ctx.batch_size, 16, device=ctx.device), None

    return model, list(model.blocks), batch


def two_layer(ctx: ModelContext):
    """A valid user model returned as the plain (model, blocks, batch_fn) tuple."""
    return _spec(ctx, TwoLayer())


def two_layer_spec(ctx: ModelContext) -> ModelSpec:
    model, blocks, batch = _spec(ctx, TwoLayer())
    return ModelSpec(
        model=model,
        blocks=blocks,
        batch_fn=batch,
        batch_size=ctx.batch_size,
        seq_len=ctx.seq_len,
        flops_per_token=1234.0,
    )


def fails_on_rank_1(ctx: ModelContext):
    return _spec(ctx, TwoLayer(fail_on_rank=1))


def runs_out_of_memory(ctx: ModelContext):
    return _spec(ctx, TwoLayer(oom=True))


def not_a_spec(ctx: ModelContext):
    return 42


def _sleeping_batches(ctx: ModelContext, sleeps_from_step: int, only_rank: int | None):
    """Batches that stop coming from `sleeps_from_step` on (a stuck data loader), on one rank
    or all: the job is then alive but blocked, for the hang and interrupt tests."""
    model = TwoLayer()
    pid_dir = os.environ.get("FSDP_TRACE_TEST_PID_DIR")
    if pid_dir:  # lets a test kill one rank
        with open(os.path.join(pid_dir, f"rank{ctx.rank}.pid"), "w") as handle:
            handle.write(str(os.getpid()))

    def batch(step: int):
        if step >= sleeps_from_step and only_rank in (None, ctx.rank):
            while True:
                time.sleep(0.1)
        return torch.randn(ctx.batch_size, 16, device=ctx.device), None

    return model, list(model.blocks), batch


def hangs_on_rank_1(ctx: ModelContext):
    """Rank 1 never delivers its first batch: rank 0 waits in the first all-gather."""
    return _sleeping_batches(ctx, 0, only_rank=1)


def stalls_after_profiling(ctx: ModelContext):
    """With --warmup-steps 0 --timing-steps 1, both traces of every rank are written (steps
    0-3), then every rank stalls in the timed steps: a run to interrupt half way."""
    return _sleeping_batches(ctx, 4, only_rank=None)


def oom_in_init_weights(ctx: ModelContext) -> ModelSpec:
    """Built on meta; initialising the real weights runs out of memory (the build phase)."""
    with torch.device("meta"):
        model = TwoLayer()

    def init_weights() -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")

    return ModelSpec(
        model=model,
        blocks=list(model.blocks),
        batch_fn=lambda step: (torch.randn(ctx.batch_size, 16, device=ctx.device), None),
        batch_size=ctx.batch_size,
        seq_len=ctx.seq_len,
        init_weights=init_weights,
    )
