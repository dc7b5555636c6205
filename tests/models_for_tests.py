"""User model factories for the `--model package.module:factory` tests."""

from __future__ import annotations

import os

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
