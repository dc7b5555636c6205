"""Models to profile: the built-in GPT family (named presets) and user factories.

A user factory is `package.module:function`. It receives a `ModelContext` and returns either a
`ModelSpec` or a tuple `(model, blocks, batch_fn)`:

- `model`: an `nn.Module` (on CPU or the meta device; meta needs `ModelSpec.init_weights`).
- `blocks`: the submodules to shard one FSDP unit each (and to checkpoint under --ac-coverage),
  in forward order, e.g. `list(model.layers)`.
- `batch_fn(step) -> (inputs, targets)`: tensors on `ctx.device`. The loss is cross-entropy of
  `model(inputs)` against `targets`; with `targets=None`, `model(inputs)` must return the loss.

A factory model has no default shape: `--batch-size` and `--seq-len` are required (use
`--seq-len 1` for a model without a sequence dimension), and `batch_fn` must make batches of
exactly `ctx.batch_size` x `ctx.seq_len`: tokens/s and MFU count batch x seq tokens per step.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fsdp_trace.errors import UserError


@dataclass(frozen=True)
class GPTConfig:
    n_layers: int
    d_model: int
    n_heads: int
    seq_len: int
    vocab_size: int
    batch_size: int  # default local batch for the preset

    @property
    def mlp_hidden(self) -> int:
        return 4 * self.d_model


PRESETS: dict[str, GPTConfig] = {
    # CPU end to end in seconds (tests, CI).
    "tiny": GPTConfig(n_layers=4, d_model=64, n_heads=4, seq_len=64, vocab_size=512, batch_size=2),
    # The shipped sample traces: small enough for a few MB of trace, 8 blocks.
    "gpt-small": GPTConfig(
        n_layers=8, d_model=1024, n_heads=16, seq_len=1024, vocab_size=32768, batch_size=4
    ),
    # GPT-3 XL shape: the reference configuration of the benchmark.
    "gpt-1.3b": GPTConfig(
        n_layers=24, d_model=2048, n_heads=16, seq_len=2048, vocab_size=50304, batch_size=4
    ),
}


@dataclass
class ModelContext:
    """What a model factory gets: the shapes asked for and where the batch must live."""

    batch_size: int
    seq_len: int
    device: torch.device
    seed: int
    rank: int
    world_size: int


@dataclass
class ModelSpec:
    """A model ready to be parallelized, with what the train loop and the metrics need."""

    model: nn.Module
    blocks: Sequence[nn.Module]
    batch_fn: Callable[[int], tuple[Any, Any]]
    batch_size: int
    seq_len: int
    # Extra FSDP units used with --shard-embeddings, each a list of module paths.
    embedding_units: Sequence[Sequence[str]] = ()
    init_weights: Callable[[], None] | None = None
    flops_per_token: float | None = None
    flops_note: str = ""
    description: dict[str, Any] = field(default_factory=dict)


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.wqkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.wo = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bsz, seq, dim = x.shape
        qkv = self.wqkv(x).view(bsz, seq, 3, self.n_heads, dim // self.n_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(bsz, seq, dim))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.d_model, cfg.mlp_hidden, bias=False)
        self.w2 = nn.Linear(cfg.mlp_hidden, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x), approximate="tanh"))


class Block(nn.Module):
    """Pre-norm transformer block: the unit FSDP shards and AC checkpoints."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.mlp_norm = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class GPT(nn.Module):
    """Decoder-only GPT with learned positions; module names follow torchtitan's."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_embeddings = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model)
        self.output = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        h = self.tok_embeddings(tokens) + self.pos_embeddings(positions)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))

    @torch.no_grad()
    def init_weights(self) -> None:
        """GPT-2 style init; works on sharded DTensor parameters after `to_empty`."""
        depth_std = 0.02 / math.sqrt(2 * self.cfg.n_layers)
        for name, param in self.named_parameters():
            if name.endswith(("attn_norm.weight", "mlp_norm.weight", "norm.weight")):
                nn.init.ones_(param)
            elif name.endswith("bias"):
                nn.init.zeros_(param)
            elif name.endswith(("wo.weight", "w2.weight")):
                nn.init.normal_(param, std=depth_std)
            else:
                nn.init.normal_(param, std=0.02)


def gpt_flops_per_token(cfg: GPTConfig, seq_len: int) -> float:
    """6·N + 12·L·d·T (PaLM appendix B): N excludes the embedding tables, which do no matmul."""
    per_block = 3 * cfg.d_model**2 + cfg.d_model**2 + 2 * cfg.d_model * cfg.mlp_hidden
    n_matmul = cfg.n_layers * per_block + cfg.d_model * cfg.vocab_size
    return 6.0 * n_matmul + 12.0 * cfg.n_layers * cfg.d_model * seq_len


def build_gpt(preset: str, ctx: ModelContext) -> ModelSpec:
    base = PRESETS[preset]
    if ctx.seq_len > base.seq_len:
        cfg = GPTConfig(**{**base.__dict__, "seq_len": ctx.seq_len})
    else:
        cfg = base
    with torch.device("meta"):
        model = GPT(cfg)
    generator = torch.Generator(device=ctx.device)
    generator.manual_seed(ctx.seed * 1000 + ctx.rank)
    batch_size, seq_len = ctx.batch_size, ctx.seq_len

    def batch_fn(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(
            0, cfg.vocab_size, (batch_size, seq_len + 1), device=ctx.device, generator=generator
        )
        return tokens[:, :-1], tokens[:, 1:]

    return ModelSpec(
        model=model,
        blocks=list(model.layers),
        batch_fn=batch_fn,
        batch_size=batch_size,
        seq_len=seq_len,
        embedding_units=(("tok_embeddings", "pos_embeddings"), ("norm", "output")),
        init_weights=model.init_weights,
        flops_per_token=gpt_flops_per_token(cfg, seq_len),
        flops_note="6*N + 12*L*d*T (N excludes embedding tables)",
        description={
            "family": "gpt",
            "preset": preset,
            "n_layers": cfg.n_layers,
            "d_model": cfg.d_model,
            "n_heads": cfg.n_heads,
            "vocab_size": cfg.vocab_size,
            "max_seq_len": cfg.seq_len,
        },
    )


def _load_factory(target: str) -> Callable[[ModelContext], Any]:
    """The factory behind `package.module:factory`; whatever stops it from loading (no such
    module, a module that raises while imported, no such function) is one UserError."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        known = ", ".join(PRESETS)
        raise UserError(
            f"--model {target!r} is neither a preset ({known}) nor package.module:factory"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UserError(f"--model {target}: cannot import {module_name} ({exc})") from None
    except (Exception, SystemExit) as exc:  # the module's own code failed while importing
        first_line = (str(exc).strip().splitlines() or [""])[0][:300]
        detail = f"{type(exc).__name__}: {first_line}" if first_line else type(exc).__name__
        raise UserError(f"--model {target}: importing {module_name} failed ({detail})") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise UserError(f"--model {target}: {module_name} has no callable {attr}")
    return factory


def check_model(name: str) -> None:
    """Fail now, with one line, if `name` is a factory that cannot be loaded: before the
    launcher starts any rank, and on each rank before it joins the others."""
    if name not in PRESETS:
        _load_factory(name)


def resolve_shape(name: str, batch_size: int | None, seq_len: int | None) -> tuple[int, int]:
    """The (batch, seq) a run uses: the options, else the preset's defaults. A factory has no
    defaults, so both options are required (a one-line error, never a silent 1 x 1)."""
    if name in PRESETS:
        preset = PRESETS[name]
        return batch_size or preset.batch_size, seq_len or preset.seq_len
    if batch_size is None or seq_len is None:
        raise UserError(
            f"--model {name} is your own factory: pass --batch-size and --seq-len "
            "(use --seq-len 1 for a model without a sequence dimension)"
        )
    return batch_size, seq_len


def build_model(
    name: str, ctx_batch: int | None, ctx_seq: int | None, device: torch.device, **ctx: Any
) -> ModelSpec:
    """A preset by name, or a user factory `package.module:factory`."""
    batch_size, seq_len = resolve_shape(name, ctx_batch, ctx_seq)
    context = ModelContext(batch_size=batch_size, seq_len=seq_len, device=device, **ctx)
    if name in PRESETS:
        return build_gpt(name, context)
    factory = _load_factory(name)
    result = factory(context)
    if isinstance(result, ModelSpec):
        if (result.batch_size, result.seq_len) != (batch_size, seq_len):
            raise UserError(
                f"--model {name}: the factory's ModelSpec says batch {result.batch_size} x seq "
                f"{result.seq_len}, but --batch-size {batch_size} --seq-len {seq_len} were "
                "asked for: build the batch from ctx.batch_size and ctx.seq_len"
            )
        return result
    if isinstance(result, tuple) and len(result) == 3:
        model, blocks, batch_fn = result
        return ModelSpec(
            model=model,
            blocks=list(blocks),
            batch_fn=batch_fn,
            batch_size=context.batch_size,
            seq_len=context.seq_len,
            description={"family": "user", "factory": name},
        )
    raise UserError(
        f"--model {name}: the factory must return a ModelSpec or (model, blocks, batch_fn), "
        f"not {type(result).__name__}"
    )


def count_parameters(model: nn.Module) -> dict[str, int]:
    """Total and non-embedding parameter counts (works on meta and sharded modules)."""
    total = 0
    embedding = 0
    for module in model.modules():
        for param in module.parameters(recurse=False):
            numel = param.numel()
            total += numel
            if isinstance(module, nn.Embedding):
                embedding += numel
    return {"total": total, "non_embedding": total - embedding}
