"""GPT-shaped models of one width each, for measuring bus bandwidth per message size with the
project's own capture (benchmarks/gpu_runs_4gpu.sh, stage busbw): 4 blocks of width d, so each
block's all-gather moves its 12·d² bf16 parameters (about 24·d² bytes: d 128 → 0.4 MB,
d 1024 → 25 MB, d 4096 → 403 MB) and its reduce-scatter (fp32) twice that; a vocabulary of
1024 keeps the root unit small. A factory per width, `busbw_model:d<WIDTH>`:

    PYTHONPATH=benchmarks fsdp-trace capture --model busbw_model:d1024 --batch-size 1 \\
        --seq-len 128 --nproc-per-node 2

(`--hsdp N` with N processes: N replicas of one shard, so every unit's gradient is one
all-reduce over N ranks.)"""

from __future__ import annotations

import torch

from fsdp_trace.capture.models import GPT, GPTConfig, ModelContext, ModelSpec, gpt_flops_per_token

WIDTHS = (32, 64, 128, 256, 512, 1024, 2048, 4096)
BLOCKS = 4
VOCAB = 1024


def build(ctx: ModelContext, width: int) -> ModelSpec:
    cfg = GPTConfig(
        n_layers=BLOCKS,
        d_model=width,
        n_heads=max(1, width // 64),
        seq_len=ctx.seq_len,
        vocab_size=VOCAB,
        batch_size=ctx.batch_size,
    )
    with torch.device("meta"):
        model = GPT(cfg)
    generator = torch.Generator(device=ctx.device)
    generator.manual_seed(ctx.seed * 1000 + ctx.rank)

    def batch_fn(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(
            0, VOCAB, (ctx.batch_size, ctx.seq_len + 1), device=ctx.device, generator=generator
        )
        return tokens[:, :-1], tokens[:, 1:]

    return ModelSpec(
        model=model,
        blocks=list(model.layers),
        batch_fn=batch_fn,
        batch_size=ctx.batch_size,
        seq_len=ctx.seq_len,
        embedding_units=(("tok_embeddings", "pos_embeddings"), ("norm", "output")),
        init_weights=model.init_weights,
        flops_per_token=gpt_flops_per_token(cfg, ctx.seq_len),
        flops_note="6*N + 12*L*d*T (N excludes embedding tables)",
        description={
            "family": "gpt",
            "factory": f"busbw_model:d{width}",
            "n_layers": BLOCKS,
            "d_model": width,
            "n_heads": cfg.n_heads,
            "vocab_size": VOCAB,
            "max_seq_len": ctx.seq_len,
        },
    )


def _factory(width: int):
    def factory(ctx: ModelContext) -> ModelSpec:
        return build(ctx, width)

    factory.__name__ = factory.__qualname__ = f"d{width}"
    factory.__doc__ = f"{BLOCKS} GPT blocks of width {width} (busbw_model.build)."
    return factory


for _width in WIDTHS:
    globals()[f"d{_width}"] = _factory(_width)
