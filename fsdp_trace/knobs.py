"""FSDP knobs shared by capture (which applies them) and the what-if replay (which predicts
them): one definition each, standard library only."""

from __future__ import annotations


def select_ac_blocks(n_blocks: int, coverage: float) -> list[int]:
    """Indices of the blocks to checkpoint: round(coverage·n) of them, spread evenly.

    Spreading (rather than the first k) keeps recompute evenly interleaved with the
    all-gathers it is meant to hide, like torchtitan's selective layer AC.
    """
    count = round(coverage * n_blocks)
    if count <= 0:
        return []
    if count >= n_blocks:
        return list(range(n_blocks))
    return sorted({int((i + 0.5) * n_blocks / count) for i in range(count)})


# What `fsdp-trace whatif --set` changes: capture's option names (run.json `config`), and
# batch_scale for a batch change where run.json does not give the batch.
KNOB_NAMES = (
    "ac_coverage",
    "reshard_after_forward",
    "keep_last_unsharded",
    "root_reshard_after_forward",
    "shard_embeddings",
    "prefetch_forward",
    "prefetch_backward",
    "reduce_dtype",
    "batch_size",
    "batch_scale",
    "accum_no_sync",
    "unsharded_units",  # what-if only: these units keep their parameters after forward
)
