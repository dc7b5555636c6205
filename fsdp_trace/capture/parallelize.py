"""FSDP2 the way good training code applies it: AC wrappers, then one unit per block, root last.

Each piece is a small function so the knobs can be tested without a training step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fsdp_trace.errors import UserError
from fsdp_trace.knobs import select_ac_blocks

__all__ = ["select_ac_blocks"]  # re-exported: capture's callers import it from here

DTYPE_MAP = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def module_paths(model: nn.Module, modules: Sequence[nn.Module]) -> list[str]:
    """The `named_modules()` path of each module (what FSDP2 puts in its profiler labels)."""
    by_id = {id(m): name for name, m in model.named_modules()}
    paths = []
    for module in modules:
        if id(module) not in by_id:
            raise UserError("a block given to shard is not a submodule of the model")
        paths.append(by_id[id(module)])
    return paths


def _replace_submodule(model: nn.Module, path: str, new: nn.Module) -> None:
    parent_path, _, leaf = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    setattr(parent, leaf, new)


def apply_activation_checkpointing(
    model: nn.Module, block_paths: Sequence[str], indices: Sequence[int], mode: str
) -> list[str]:
    """Wrap the chosen blocks in `checkpoint_wrapper` (before sharding); their paths stay put."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        checkpoint_wrapper,
    )

    impl = CheckpointImpl.REENTRANT if mode == "reentrant" else CheckpointImpl.NO_REENTRANT
    wrapped = []
    for index in indices:
        path = block_paths[index]
        block = model.get_submodule(path)
        _replace_submodule(model, path, checkpoint_wrapper(block, checkpoint_impl=impl))
        wrapped.append(path)
    return wrapped


def apply_compile(model: nn.Module, block_paths: Sequence[str]) -> None:
    """Compile each block in place (per-block compile keeps FSDP's hooks outside the graph)."""
    for path in block_paths:
        model.get_submodule(path).compile()


HSDP_DIM_NAMES = ("replicate", "shard")


def mesh_record(hsdp: int, world_size: int) -> dict[str, Any]:
    """run.json's `parallel.mesh`: the device mesh every unit is sharded on."""
    if hsdp <= 1:
        return {"kind": "fsdp", "shard": world_size}
    return {
        "kind": "hsdp",
        "replicate": hsdp,
        "shard": world_size // hsdp,
        "dim_names": list(HSDP_DIM_NAMES),
    }


def build_mesh(device_type: str, world_size: int, hsdp: int) -> Any:
    """The mesh for `fully_shard`: 1-D over every rank, or (replicate, shard) for HSDP, where
    FSDP2 all-gathers and reduce-scatters on the shard group and all-reduces gradients on the
    replicate group. Rank r sits at (r // shards, r % shards)."""
    from torch.distributed.device_mesh import init_device_mesh

    from fsdp_trace.capture.config import hsdp_shape

    replicas, shards = hsdp_shape(hsdp, world_size)
    if replicas == 1:
        return init_device_mesh(device_type, (world_size,))
    return init_device_mesh(device_type, (replicas, shards), mesh_dim_names=HSDP_DIM_NAMES)


@dataclass
class ShardPlan:
    """What was sharded and how: recorded verbatim in run.json."""

    units: list[list[str]] = field(default_factory=list)  # forward order, root excluded
    reshard_after_forward: dict[str, Any] = field(default_factory=dict)
    forward_prefetch: dict[str, list[str]] = field(default_factory=dict)
    backward_prefetch: dict[str, list[str]] = field(default_factory=dict)
    mixed_precision: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "units": [", ".join(u) for u in self.units],
            "root": "root",
            "reshard_after_forward": self.reshard_after_forward,
            "forward_prefetch": self.forward_prefetch,
            "backward_prefetch": self.backward_prefetch,
            "mixed_precision": self.mixed_precision,
        }


def plan_units(
    block_paths: Sequence[str],
    embedding_units: Sequence[Sequence[str]],
    shard_embeddings: bool,
) -> list[list[str]]:
    """FSDP units in forward order: [embeddings], each block, [norm, output]; the root is last."""
    units = [[p] for p in block_paths]
    if shard_embeddings:
        if not embedding_units:
            raise UserError("--shard-embeddings: this model names no embedding/output units")
        first, *rest = [list(u) for u in embedding_units]
        units = [first, *units, *rest]
    return units


def reshard_setting(
    unit_index: int, last_block_index: int, reshard: bool | int, keep_last_unsharded: bool
) -> bool | int:
    """Per-unit reshard_after_forward: the global knob, except (if asked) the last block and
    the units after it (the norm+output head): backward needs them at once, as torchtitan does."""
    if keep_last_unsharded and unit_index >= last_block_index:
        return False
    return reshard


def prefetch_lists(
    unit_names: Sequence[str], forward_depth: int, backward_depth: int
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Explicit prefetch: each unit prefetches the next `depth` units in its pass's order."""
    forward: dict[str, list[str]] = {}
    backward: dict[str, list[str]] = {}
    if forward_depth > 0:
        for i, name in enumerate(unit_names[:-1]):
            forward[name] = list(unit_names[i + 1 : i + 1 + forward_depth])
    if backward_depth > 0:
        reverse = list(reversed(unit_names))
        for i, name in enumerate(reverse[:-1]):
            backward[name] = reverse[i + 1 : i + 1 + backward_depth]
    return forward, backward


def apply_fsdp(
    model: nn.Module,
    mesh: Any,
    units: Sequence[Sequence[str]],
    *,
    param_dtype: str,
    reduce_dtype: str,
    reshard: bool | int,
    keep_last_unsharded: bool,
    forward_prefetch: int,
    backward_prefetch: int,
    block_paths: Sequence[str] | None = None,
    root_reshard: bool | str = "default",
) -> ShardPlan:
    """`fully_shard` each unit, then the root; set explicit prefetching between units.

    `root_reshard` is the root's reshard_after_forward: "default" leaves it to FSDP2 (not
    resharded after forward, from 2.8); True makes backward gather the root again."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    plan = ShardPlan(units=[list(u) for u in units])
    kwargs: dict[str, Any] = {"mesh": mesh}
    if param_dtype != "fp32" or reduce_dtype != "fp32":
        kwargs["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=DTYPE_MAP[param_dtype], reduce_dtype=DTYPE_MAP[reduce_dtype]
        )
    plan.mixed_precision = {"param_dtype": param_dtype, "reduce_dtype": reduce_dtype}
    names = [", ".join(u) for u in units]
    blocks = set(block_paths) if block_paths is not None else {p for u in units for p in u}
    last_block = max((i for i, u in enumerate(units) if set(u) <= blocks), default=len(units) - 1)
    sharded: dict[str, nn.Module] = {}
    for index, unit in enumerate(units):
        modules = [model.get_submodule(p) for p in unit]
        setting = reshard_setting(index, last_block, reshard, keep_last_unsharded)
        target = modules[0] if len(modules) == 1 else modules
        try:
            result = fully_shard(target, reshard_after_forward=setting, **kwargs)
        except (ValueError, AssertionError) as exc:
            raise UserError(f"fully_shard refused unit {names[index]!r}: {exc}") from None
        # A unit of several modules keeps its FSDP state (and prefetch API) on the first one.
        sharded[names[index]] = result[0] if isinstance(result, list) else result
        plan.reshard_after_forward[names[index]] = setting
    root_kwargs = {} if root_reshard == "default" else {"reshard_after_forward": root_reshard}
    fully_shard(model, **kwargs, **root_kwargs)
    plan.reshard_after_forward["root"] = root_reshard

    forward, backward = prefetch_lists(names, forward_prefetch, backward_prefetch)
    for name, targets in forward.items():
        sharded[name].set_modules_to_forward_prefetch([sharded[t] for t in targets])
    for name, targets in backward.items():
        sharded[name].set_modules_to_backward_prefetch([sharded[t] for t in targets])
    plan.forward_prefetch = forward
    plan.backward_prefetch = backward
    return plan
