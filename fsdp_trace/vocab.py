"""The domain's words, defined once. Every table column, JSON field and rule compares against
these, never against a string literal typed again somewhere else.

The enums are `str` enums: a member equals its value (`Phase.FORWARD == "forward"`), so
DataFrame columns keep plain strings and JSON stays as it was, while code names the word.
"""

from __future__ import annotations

from enum import Enum


class Word(str, Enum):
    """A str enum that prints and formats as its value on every Python version."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    @classmethod
    def values(cls) -> tuple[str, ...]:
        return tuple(m.value for m in cls)


class Phase(Word):
    """Where in the training step a GPU event was launched."""

    FORWARD = "forward"
    BACKWARD = "backward"
    RECOMPUTE = "recompute"  # activation-checkpoint recomputation inside backward
    OPTIMIZER = "optimizer"
    UNATTRIBUTED = "unattributed"  # no launch event in the trace: no CPU context


class Source(Word):
    """What kind of trace a RankAnalysis came from."""

    TIMING = "timing"  # a lean timing trace (capture's five timing steps)
    DETAILED = "detailed"  # record_shapes + with_stack beside a timing trace of the same rank
    TRACE = "trace"  # a trace the user captured their own way: the timing they have


class Collective(Word):
    """Collective types, named as NCCL names its kernels."""

    ALL_GATHER = "AllGather"
    REDUCE_SCATTER = "ReduceScatter"
    ALL_REDUCE = "AllReduce"
    ALL_TO_ALL = "AllToAll"
    BROADCAST = "Broadcast"
    REDUCE = "Reduce"
    SEND_RECV = "SendRecv"
    BARRIER = "Barrier"
    UNKNOWN = "Unknown"


# The collectives that reduce gradients at the end of backward: FSDP's reduce-scatter and,
# under HSDP, the all-reduce across replicas.
GRADIENT_REDUCTIONS = (Collective.REDUCE_SCATTER, Collective.ALL_REDUCE)


class Kind(Word):
    """What a GPU event is (the `kind` column of the kernel tables)."""

    COMM = "comm"
    COMPUTE = "compute"
    MEMCPY = "memcpy"
    MEMSET = "memset"
    SYNC = "sync"


class Device(Word):
    GPU = "gpu"
    CPU = "cpu"  # gloo traces: collectives on the host, no GPU kernels


class MeshKind(Word):
    """The data-parallel layout a run used."""

    FSDP = "fsdp"  # 1-D: every rank in one shard group
    HSDP = "hsdp"  # replicate × shard: gathers inside a shard group, an all-reduce across
    DDP = "ddp"  # DistributedDataParallel: replicated, gradients all-reduced in buckets
    SINGLE = "single"  # one rank: no communication
    UNKNOWN = "unknown"


class Parallelism(Word):
    """The data-parallel wrapper a run's traces show (fsdp_trace.analysis.rank.setup)."""

    FSDP2 = "FSDP2"  # torch.distributed.fsdp.fully_shard
    FSDP1 = "FSDP1"  # the FullyShardedDataParallel class
    DDP = "DDP"  # DistributedDataParallel: every rank holds every parameter
    NONE = "none"  # none of them seen


class Basis(Word):
    """Whether a figure was measured in the trace or inferred from it."""

    MEASURED = "measured"
    INFERRED = "inferred"
    PREDICTED = "predicted"  # a cost: what the change saves, replayed by the what-if engine


# The unit FSDP2 labels without a path (the module passed to the last fully_shard).
ROOT = "root"
# The block of a collective or kernel whose launch no FSDP2 label encloses.
UNATTRIBUTED = "unattributed"
# Units that are not transformer blocks.
NON_BLOCK_UNITS = frozenset({ROOT, UNATTRIBUTED})
