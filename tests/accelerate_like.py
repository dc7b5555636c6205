"""A model sharded the way Hugging Face Accelerate's FSDP2 plugin shards one with activation
checkpointing: the decoder sits under `.model` (as in `LlamaForCausalLM`), every block is
wrapped by `checkpoint_wrapper` first, and the INNER module is what becomes the FSDP unit. Its
units, and so its profiler labels, are `model.layers.N._checkpoint_wrapped_module`.

`fsdp-trace capture --model tests.accelerate_like:build --batch-size 2 --seq-len 64` (from the
repository root, so that `tests` imports). Leave `--ac-coverage` at 0: the factory itself
checkpoints every block.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    checkpoint_wrapper,
)

from fsdp_trace.capture.models import PRESETS, Block, GPTConfig, ModelContext

SHAPE = PRESETS["tiny"]  # 4 blocks, d 64, 4 heads, vocab 512


class Decoder(nn.Module):
    """The `.model` of a causal LM: embeddings, blocks, final norm (Hugging Face's names)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.norm(h)


class CausalLM(nn.Module):
    """`model` (the decoder) and `lm_head`, as in `LlamaForCausalLM`."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.model = Decoder(cfg)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.model(tokens))


def build(ctx: ModelContext):
    """(model, blocks, batch_fn): every block checkpoint-wrapped, the wrapped modules as units."""
    model = CausalLM(SHAPE)
    layers = model.model.layers
    for index, layer in enumerate(layers):
        layers[index] = checkpoint_wrapper(layer, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
    blocks = [wrapper._checkpoint_wrapped_module for wrapper in layers]
    generator = torch.Generator(device=ctx.device)
    generator.manual_seed(ctx.seed * 1000 + ctx.rank)

    def batch_fn(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(
            0,
            SHAPE.vocab_size,
            (ctx.batch_size, ctx.seq_len + 1),
            device=ctx.device,
            generator=generator,
        )
        return tokens[:, :-1], tokens[:, 1:]

    return model, blocks, batch_fn
