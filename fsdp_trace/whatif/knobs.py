"""The knobs the what-if replay models, and how each changes a measured step's program.

Every change is made of what the trace measured: a recomputed block recomputes its own
measured forward (and costs the host what launching that forward cost); a gather that
reshard_after_forward adds moves the unit's measured forward gather again; bytes scale
transfer times at the measured bandwidth; a batch scales compute with tokens and leaves
communication, FSDP's copies, the optimizer and the host's launch time as they were.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, fields

import numpy as np
import pandas as pd

from fsdp_trace.analysis.job.config import InferredConfig
from fsdp_trace.errors import UserError
from fsdp_trace.knobs import select_ac_blocks
from fsdp_trace.runrecord import RunRecord
from fsdp_trace.vocab import ROOT, Collective, Phase
from fsdp_trace.whatif.program import Program, SegmentKind, micro_batches

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
HEAD = "norm, output"  # the unit --shard-embeddings gives the head (torchtitan's layout)


@dataclass(frozen=True)
class Knobs:
    """What to change. None: leave as the run had it."""

    ac_coverage: float | None = None  # fraction of blocks checkpointed, spread evenly
    reshard_after_forward: bool | None = None  # every block unit
    keep_last_unsharded: bool | None = None  # the last block (and the head) keep params
    root_reshard_after_forward: bool | None = None
    shard_embeddings: bool | None = None  # embeddings and head their own units
    prefetch_forward: int | None = None  # explicit forward prefetch depth (0: implicit)
    prefetch_backward: int | None = None
    reduce_dtype: str | None = None  # fp32 / bf16
    batch_size: int | None = None  # local batch (compute scales with tokens)
    batch_scale: float | None = None  # the same as a factor, when run.json has no batch
    accum_no_sync: bool | None = None  # reduce gradients on the last micro-batch only
    # reshard_after_forward per unit: these units ("layers.6,layers.7") keep their parameters
    # after forward (fully_shard(block, reshard_after_forward=False) on each)
    unsharded_units: str | None = None

    def changed(self) -> dict[str, object]:
        return {
            f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None
        }

    def describe(self) -> str:
        return ", ".join(f"{k}={_text(v)}" for k, v in self.changed().items()) or "(nothing)"


def _text(value: object) -> str:
    return (
        str(value).lower()
        if isinstance(value, bool)
        else f"{value:g}"
        if isinstance(value, float)
        else str(value)
    )


def parse(assignments: list[str]) -> Knobs:
    """`["ac_coverage=0.5", "reshard_after_forward=false"]` → Knobs; one-line errors."""
    names = {f.name: f for f in fields(Knobs)}
    values: dict[str, object] = {}
    for text in assignments:
        name, sep, raw = text.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or name not in names:
            raise UserError(f"--set {text!r}: write KNOB=VALUE with KNOB one of {', '.join(names)}")
        values[name] = _value(name, raw.strip(), text)
    return Knobs(**values)


def _value(name: str, raw: str, text: str) -> object:
    lower = raw.lower()
    if name in (
        "reshard_after_forward",
        "keep_last_unsharded",
        "root_reshard_after_forward",
        "shard_embeddings",
        "accum_no_sync",
    ):
        if lower in ("true", "1", "yes"):
            return True
        if lower in ("false", "0", "no"):
            return False
        raise UserError(f"--set {text!r}: {name} takes true or false")
    if name == "unsharded_units":
        units = [u.strip() for u in raw.split(",") if u.strip()]
        if not units:
            raise UserError(f"--set {text!r}: name the units, e.g. unsharded_units=layers.7")
        return ",".join(units)
    if name == "reduce_dtype":
        if lower not in DTYPE_BYTES:
            raise UserError(f"--set {text!r}: reduce_dtype takes {', '.join(DTYPE_BYTES)}")
        return lower
    try:
        number = float(raw)
    except ValueError:
        raise UserError(f"--set {text!r}: {name} takes a number") from None
    if not math.isfinite(number):
        raise UserError(f"--set {text!r}: {name} takes a finite number")
    if name == "ac_coverage":
        if not 0.0 <= number <= 1.0:
            raise UserError(f"--set {text!r}: ac_coverage is a fraction in [0, 1]")
        return number  # 0 too: no block checkpointed
    if name in ("prefetch_forward", "prefetch_backward", "batch_size"):
        low = 1 if name == "batch_size" else 0
        if number != int(number) or number < low:
            raise UserError(f"--set {text!r}: {name} takes a whole number")
        if number > MAX_WHOLE:
            raise UserError(
                f"--set {text!r}: {name} takes a whole number from {low} to {MAX_WHOLE:,}"
            )
        return int(number)
    if number <= 0:
        raise UserError(f"--set {text!r}: {name} must be positive")
    if name == "batch_scale":
        _check_scale(number, text)
    return number


# The replay scales compute with a batch's tokens; past this factor either way memory, kernel
# efficiency and the host's share change in ways it does not model.
MAX_BATCH_FACTOR = 64
MAX_WHOLE = 1_000_000  # a batch or prefetch depth beyond any run


def _check_scale(factor: float, text: str) -> None:
    if not 1 / MAX_BATCH_FACTOR <= factor <= MAX_BATCH_FACTOR:
        raise UserError(
            f"--set {text!r}: a batch {factor:g}x the measured one: the replay scales compute "
            f"with tokens, which holds from 1/{MAX_BATCH_FACTOR}x to {MAX_BATCH_FACTOR}x "
            "(beyond, memory and kernel efficiency change); give a change in that range"
        )


# --- edits of a program --------------------------------------------------------------------


@dataclass
class Context:
    """What the edits read about the run beyond the programs."""

    config: InferredConfig
    run: RunRecord | None
    blocks: list[str]  # block units in forward order

    @property
    def batch(self) -> int | None:
        if self.run is not None and self.run.model.batch_size:
            return self.run.model.batch_size
        return None


def apply(program: Program, knobs: Knobs, ctx: Context) -> Program:
    """A copy of `program` as the step would run with `knobs`."""
    p = program.copy()
    if knobs.ac_coverage is not None:
        p = _ac(p, knobs.ac_coverage, ctx)
    reshard = _reshard_targets(knobs, ctx)
    for unit, want in reshard.items():
        p = _reshard(p, unit, want, ctx)
    if knobs.shard_embeddings:
        p = _shard_embeddings(p, ctx, keep_head=bool(knobs.keep_last_unsharded))
    if knobs.prefetch_forward is not None or knobs.prefetch_backward is not None:
        p = _prefetch(p, knobs, ctx)
    if knobs.reduce_dtype is not None:
        p = _reduce_dtype(p, knobs.reduce_dtype, ctx)
    scale = _batch_scale(knobs, ctx)
    if scale != 1.0:
        p = _batch(p, scale)
    if knobs.accum_no_sync:
        p = _no_sync(p)
    return p


def _batch(p: Program, scale: float) -> Program:
    """Tokens × `scale`: the model's kernels take `scale` times as long; FSDP's copies, the
    optimizer and the host's launches stay as they were."""
    segs = p.segments
    model = segs["kind"].isin([SegmentKind.MODEL, SegmentKind.RECOMPUTE]).to_numpy()
    scaled = [d * scale if m else d for d, m in zip(segs["k_dur"], model, strict=True)]
    segs["k_dur"] = scaled
    segs["busy_us"] = [float(d.sum()) for d in scaled]
    segs.loc[model, "beside_us"] = (segs["beside_us"].to_numpy() * scale)[model]
    return p


def _batch_scale(knobs: Knobs, ctx: Context) -> float:
    if knobs.batch_scale is not None:
        return float(knobs.batch_scale)
    if knobs.batch_size is None:
        return 1.0
    if ctx.batch is None:
        raise UserError(
            "--set batch_size: the run's batch is not known (no run.json): use "
            "batch_scale=FACTOR instead"
        )
    scale = knobs.batch_size / ctx.batch
    _check_scale(scale, f"batch_size={knobs.batch_size}")
    return scale


def _reshard_targets(knobs: Knobs, ctx: Context) -> dict[str, bool]:
    out: dict[str, bool] = {}
    if knobs.reshard_after_forward is not None:
        out.update(dict.fromkeys(ctx.blocks, knobs.reshard_after_forward))
    if knobs.keep_last_unsharded is not None and ctx.blocks:
        # kept unsharded: no reshard; undone: the last block reshards like the others
        last = ctx.blocks[-1]
        out[last] = False if knobs.keep_last_unsharded else out.get(last, True)
    if knobs.root_reshard_after_forward is not None:
        out[ROOT] = knobs.root_reshard_after_forward
    if knobs.unsharded_units:
        for unit in knobs.unsharded_units.split(","):
            if unit not in ctx.blocks and unit != ROOT:
                raise UserError(
                    f"--set unsharded_units: no unit {unit!r} in this run (its units: "
                    f"{', '.join([*ctx.blocks, ROOT][:12])})"
                )
            out[unit] = False
    return out


def _host_cost(segs: pd.DataFrame, rows: np.ndarray) -> float:
    """Host time to launch these consecutive segments: from the first's launch to the next
    segment's after them."""
    if not rows.size:
        return 0.0
    host = segs["host_us"].to_numpy()
    after = rows.max() + 1
    end = host[after] if after < len(host) else host[rows.max()]
    return max(0.0, float(end - host[rows.min()]))


def _shift_host(p: Program, from_us: float, by: float) -> None:
    """Launches at or after `from_us` happen `by` µs later (earlier when negative)."""
    for frame in (p.segments, p.ops):
        later = frame["host_us"] >= from_us
        frame.loc[later, "host_us"] = frame.loc[later, "host_us"] + by


def _set_segments(p: Program, segs: pd.DataFrame) -> Program:
    """Replace the segments (an `orig` column names each one's old position, -1 for new
    ones), remapping the all-gathers' consumer positions."""
    position = {int(o): i for i, o in enumerate(segs["orig"].to_numpy()) if o >= 0}
    ops = p.ops.copy()
    ops["consumer"] = [position.get(int(v), -1) if v >= 0 else -1 for v in ops["consumer"]]
    p.segments = segs.drop(columns="orig").reset_index(drop=True)
    p.ops = ops
    return p


def _ac(p: Program, coverage: float, ctx: Context) -> Program:
    """Blocks checkpointed or not, in every micro-batch: each backward recomputes (or stops
    recomputing) that micro-batch's own forward of the block."""
    blocks = ctx.blocks
    want = {blocks[i] for i in select_ac_blocks(len(blocks), coverage)}
    have = set(p.segments.loc[p.segments["kind"] == SegmentKind.RECOMPUTE, "unit"])
    segs = p.segments.assign(orig=np.arange(len(p.segments)))
    count = int(micro_batches(segs).max(initial=0)) + 1
    for unit in sorted(have - want):  # stop recomputing: its time and its launches go
        for m in range(count):  # each backward's rows on their own (positions move)
            rows = np.flatnonzero(
                (segs["unit"] == unit).to_numpy()
                & (segs["kind"] == SegmentKind.RECOMPUTE).to_numpy()
                & (micro_batches(segs) == m)
            )
            if not rows.size:
                continue
            cost = _host_cost(segs, rows)
            start = float(segs["host_us"].to_numpy()[rows.min()])
            segs = segs.drop(index=segs.index[rows]).reset_index(drop=True)
            p.segments = segs
            _shift_host(p, start, -cost)
            segs = p.segments
    for unit in [b for b in blocks if b in want - have]:  # recompute its own forward
        for m in range(count):  # in each micro-batch's backward, that micro-batch's forward
            mine = (
                (segs["unit"] == unit).to_numpy()
                & (segs["kind"] == SegmentKind.MODEL).to_numpy()
                & (micro_batches(segs) == m)
            )
            phase = segs["phase"].to_numpy()
            forward = np.flatnonzero(mine & (phase == Phase.FORWARD))
            backward = np.flatnonzero(mine & (phase == Phase.BACKWARD))
            if forward.size and backward.size:
                segs = _insert_recompute(p, segs, unit, forward, int(backward[0]))
    p = _set_segments(p, segs)
    return _recompute_after_gather(p)


def _insert_recompute(
    p: Program, segs: pd.DataFrame, unit: str, forward: np.ndarray, at: int
) -> pd.DataFrame:
    """The unit's `forward` segments run again before segment `at` (its backward), launched
    one after the other as the forward launched them; later launches move by that time."""
    costs = [_host_cost(segs, np.array([r])) for r in forward]
    cost = sum(costs)
    starts = np.concatenate([[0.0], np.cumsum(costs)[:-1]])
    k_off = np.concatenate(
        [o + s for o, s in zip(segs["k_off"].to_numpy()[forward], starts, strict=True)]
    )
    k_dur = np.concatenate(list(segs["k_dur"].to_numpy()[forward]))
    k_extra = np.concatenate(list(segs["k_extra"].to_numpy()[forward]))
    k_extra[0] = 0.0
    new = pd.DataFrame(
        {
            "unit": unit,
            "phase": Phase.RECOMPUTE.value,
            "kind": SegmentKind.RECOMPUTE,
            "busy_us": float(segs["busy_us"].to_numpy()[forward].sum()),
            "gap_us": float(segs["gap_us"].to_numpy()[forward].sum()),
            "beside_us": float(segs["beside_us"].to_numpy()[forward].sum()),
            "kernels": int(segs["kernels"].to_numpy()[forward].sum()),
            "k_off": [k_off],
            "k_dur": [k_dur],
            "k_extra": [k_extra],
            "host_us": float(segs["host_us"].to_numpy()[at]),
            "start_us": np.nan,
            "end_us": np.nan,
            "orig": -1,
        },
        index=[0],
    )
    p.segments = segs
    _shift_host(p, float(segs["host_us"].to_numpy()[at]), cost)
    segs = p.segments
    new["host_us"] = float(segs["host_us"].to_numpy()[at]) - cost
    return pd.concat([segs.iloc[:at], new, segs.iloc[at:]], ignore_index=True)


def _recompute_after_gather(p: Program) -> Program:
    """A recompute runs on the gathered parameters: an all-gather whose consumer is the
    segment right after its unit's recompute is needed by the recompute."""
    segs, ops = p.segments, p.ops
    kind, unit = segs["kind"].to_numpy(), segs["unit"].to_numpy()
    consumer = ops["consumer"].to_numpy().copy()
    for j, (c, u) in enumerate(zip(consumer, ops["unit"], strict=True)):
        if c > 0 and kind[c - 1] == SegmentKind.RECOMPUTE and unit[c - 1] == u:
            consumer[j] = c - 1
    ops["consumer"] = consumer
    return p


def _reshard(p: Program, unit: str, want: bool, ctx: Context) -> Program:
    ops = p.ops
    backward = ops["phase"].isin([Phase.BACKWARD, Phase.RECOMPUTE]).to_numpy()
    gathers = (ops["collective"] == Collective.ALL_GATHER).to_numpy() & (
        ops["unit"] == unit
    ).to_numpy()
    have = bool((gathers & backward).any())
    if want == have:
        return p
    segs = p.segments.assign(orig=np.arange(len(p.segments)))
    if not want:  # no backward gather: the op, its copy-out and their launches go
        consumers = [int(c) for c in ops.loc[gathers & backward, "consumer"] if c >= 0]
        copies = [c for c in consumers if segs["kind"].to_numpy()[c] == SegmentKind.FSDP]
        p.ops = _renumber_after(ops[~(gathers & backward)])
        if copies:
            rows = np.array(sorted(copies))
            cost = _host_cost(segs, rows)
            start = float(segs["host_us"].to_numpy()[rows.min()])
            segs = segs.drop(index=segs.index[rows]).reset_index(drop=True)
            p.segments = segs
            _shift_host(p, start, -cost)
            segs = p.segments
        return _set_segments(p, segs)
    # Gather again in backward: the unit's forward gather (its copy-in, transfer and
    # copy-out), issued by the unit before it in backward as it starts its backward
    # (FSDP2's implicit backward prefetch), or by the unit itself when it comes first.
    forward = ops[gathers & ~backward]
    side = segs["phase"].isin([Phase.BACKWARD, Phase.RECOMPUTE]).to_numpy()
    first = np.flatnonzero((segs["unit"] == unit).to_numpy() & side)
    if forward.empty or not first.size:
        return p
    at = int(first[0])
    issuer = _issuer(segs, at, ctx)
    op = forward.iloc[[0]].copy()
    op["phase"] = Phase.BACKWARD.value
    # Prefetched: at the end of the issuer's pre-backward (after its own gather); the unit's
    # own: at the start of its pre-backward (before it prefetches the next one).
    op["host_us"] = _just_before(segs, issuer) if issuer != at else _just_after(segs, at - 1)
    op["match"] = _new_match(p, unit)
    op["after"] = -1
    fwd_consumer = int(forward["consumer"].iloc[0])
    if fwd_consumer >= 0 and segs["kind"].to_numpy()[fwd_consumer] == SegmentKind.FSDP:
        copy = segs.iloc[[fwd_consumer]].copy()  # its copy-out, before the unit's backward
        copy["phase"], copy["orig"] = Phase.BACKWARD.value, -1
        copy["start_us"] = copy["end_us"] = np.nan
        # launched as the forward launched it: later launches move by that host time (the
        # inverse of removing a backward gather, which takes it off)
        cost = _host_cost(segs, np.array([fwd_consumer]))
        p.segments = segs
        _shift_host(p, float(segs["host_us"].to_numpy()[at]), cost)
        segs = p.segments
        copy["host_us"] = float(segs["host_us"].to_numpy()[at]) - cost
        segs = pd.concat([segs.iloc[:at], copy, segs.iloc[at:]], ignore_index=True)
    op["consumer"] = -1  # set below: the new copy-out, or the unit's first backward segment
    p.ops = pd.concat([ops, op], ignore_index=True).sort_values("host_us", kind="stable")
    p.ops = _renumber_after(p.ops)
    p = _set_segments(p, segs)
    p.ops.loc[p.ops["match"] == _new_match(p, unit), "consumer"] = at
    return p


def _issuer(segs: pd.DataFrame, at: int, ctx: Context) -> int:
    """The segment whose launch issues the backward gather of the unit starting at `at`:
    the first backward segment of the unit before it in backward (the next in forward
    order), else `at` itself."""
    unit = str(segs["unit"].to_numpy()[at])
    blocks = ctx.blocks
    if unit not in blocks or blocks.index(unit) + 1 >= len(blocks):
        return at
    nxt = blocks[blocks.index(unit) + 1]
    side = segs["phase"].isin([Phase.BACKWARD, Phase.RECOMPUTE]).to_numpy()
    rows = np.flatnonzero((segs["unit"] == nxt).to_numpy() & side)
    return int(rows[0]) if rows.size and rows[0] < at else at


def _just_after(segs: pd.DataFrame, row: int) -> float:
    """A launch time right after segment `row`'s, before the next one's."""
    host = segs["host_us"].to_numpy(dtype=np.float64)
    if row < 0:
        return float(host[0] - 1.0) if len(host) else 0.0
    nxt = host[row + 1] if row + 1 < len(host) else host[row] + 2.0
    return float(host[row] + min(1.0, (nxt - host[row]) / 2))


def _just_before(segs: pd.DataFrame, row: int) -> float:
    """A launch time right before segment `row`'s, after the one before it."""
    host = segs["host_us"].to_numpy(dtype=np.float64)
    prev = host[row - 1] if row > 0 else host[row] - 1.0
    return float(host[row] - min(1.0, (host[row] - prev) / 2))


def _new_match(p: Program, unit: str) -> int:
    """A match id for an added collective, the same on every rank (by its unit)."""
    return 1_000_000_000 + zlib.crc32(unit.encode()) % 1_000_000


def _shard_embeddings(p: Program, ctx: Context, keep_head: bool) -> Program:
    """The root's parameters split into the embeddings (gathered first, as before) and the
    head (`norm, output`): its gather issued as the head's forward starts (after the last
    block's launches), again as its backward starts unless it is kept; its gradients reduced
    right after its backward instead of at the end. Bytes split by the head's share."""
    ops, segs = p.ops, p.segments.assign(orig=np.arange(len(p.segments)))
    head = _head_fraction(ctx)
    root_ag = ops[(ops["collective"] == Collective.ALL_GATHER) & (ops["unit"] == ROOT)]
    root_rs = ops[(ops["collective"] == Collective.REDUCE_SCATTER) & (ops["unit"] == ROOT)]
    if root_ag.empty or not ctx.blocks:
        return p
    last = ctx.blocks[-1]
    unit, phase = segs["unit"].to_numpy(), segs["phase"].to_numpy()
    last_fwd = np.flatnonzero((unit == last) & (phase == Phase.FORWARD))
    after = np.flatnonzero(
        (unit == ROOT)
        & (phase == Phase.FORWARD)
        & (np.arange(len(unit)) > (last_fwd.max() if last_fwd.size else -1))
    )
    root_bwd = np.flatnonzero((unit == ROOT) & (phase == Phase.BACKWARD))
    added = []
    first = root_ag.index[0]
    fwd_transfer = float(ops.at[first, "transfer_us"])
    ops.loc[root_ag.index, "transfer_us"] = ops.loc[root_ag.index, "transfer_us"] * (1 - head)
    if after.size and last_fwd.size:
        op = ops.loc[[first]].copy()
        op["unit"], op["transfer_us"] = HEAD, fwd_transfer * head
        op["host_us"] = _just_before(segs, int(after[0]))
        op["match"], op["consumer"], op["after"] = _new_match(p, HEAD), int(after[0]), -1
        added.append(op)
        if not keep_head and root_bwd.size:  # resharded after forward: gathered again
            again = op.copy()
            again["phase"] = Phase.BACKWARD.value
            again["host_us"] = _just_before(segs, int(root_bwd[0]))
            again["match"], again["consumer"] = _new_match(p, HEAD + " bwd"), int(root_bwd[0])
            added.append(again)
    if len(root_rs) and root_bwd.size:
        rs = root_rs.index[-1]
        blocks_bwd = np.flatnonzero(np.isin(unit, ctx.blocks) & (phase != Phase.FORWARD))
        head_end = [r for r in root_bwd if not blocks_bwd.size or r < blocks_bwd[0]]
        if head_end and head_end[-1] + 1 < len(segs):
            op = ops.loc[[rs]].copy()
            op["unit"], op["transfer_us"] = HEAD, float(ops.at[rs, "transfer_us"]) * head
            op["host_us"] = _just_before(segs, head_end[-1] + 1)
            op["match"], op["consumer"], op["after"] = _new_match(p, HEAD + " rs"), -1, -1
            added.append(op)
            ops.at[rs, "transfer_us"] = float(ops.at[rs, "transfer_us"]) * (1 - head)
    p.ops = pd.concat([ops, *added], ignore_index=True).sort_values("host_us", kind="stable")
    p.ops = _renumber_after(p.ops)
    return _set_segments(p, segs)


def _renumber_after(ops: pd.DataFrame) -> pd.DataFrame:
    """Sorting moved the ops: an all-reduce's `after` follows its reduce-scatter by unit."""
    ops = ops.reset_index(drop=True)
    after = []
    for i, op in enumerate(ops.itertuples()):
        if op.collective == Collective.ALL_REDUCE:
            rs = ops.iloc[:i]
            rs = rs[(rs["collective"] == Collective.REDUCE_SCATTER) & (rs["unit"] == op.unit)]
            after.append(int(rs.index[-1]) if len(rs) else -1)
        else:
            after.append(-1)
    ops["after"] = after
    return ops


def _head_fraction(ctx: Context) -> float:
    """The head's share of the root's parameters: from the model's shape in run.json
    (embeddings vocab × d + positions × d; head vocab × d + norm), else half (said so)."""
    model = ctx.run.model if ctx.run is not None else None
    raw = ctx.run.raw.get("model", {}) if ctx.run is not None else {}
    vocab, d = raw.get("vocab_size"), model.d_model if model else None
    if not vocab or not d:
        return 0.5
    positions = raw.get("max_seq_len") or 0
    embeddings = vocab * d + positions * d
    head = vocab * d + d
    return head / (embeddings + head)


def _prefetch(p: Program, knobs: Knobs, ctx: Context) -> Program:
    """Explicit prefetch: unit i's forward gather launched when unit i−k starts forward;
    its backward gather when unit i+k starts backward."""
    segs, ops = p.segments, p.ops
    order = ctx.blocks
    first_launch: dict[tuple[str, str], float] = {}
    for unit, phase, host in zip(segs["unit"], segs["phase"], segs["host_us"], strict=True):
        side = Phase.FORWARD.value if phase == Phase.FORWARD else Phase.BACKWARD.value
        first_launch.setdefault((unit, side), float(host))
    for i, op in enumerate(ops.itertuples()):
        if op.collective != Collective.ALL_GATHER or op.unit not in order:
            continue
        k = order.index(op.unit)
        if op.phase == Phase.FORWARD and knobs.prefetch_forward:
            issuer = order[k - knobs.prefetch_forward] if k >= knobs.prefetch_forward else None
            host = first_launch.get((issuer, Phase.FORWARD.value), 0.0) if issuer else 0.0
            ops.at[ops.index[i], "host_us"] = min(op.host_us, host)
        elif op.phase != Phase.FORWARD and knobs.prefetch_backward:
            j = k + knobs.prefetch_backward
            issuer = order[j] if j < len(order) else ROOT
            host = first_launch.get((issuer, Phase.BACKWARD.value))
            if host is not None:
                ops.at[ops.index[i], "host_us"] = min(op.host_us, host)
    return p


def _reduce_dtype(p: Program, dtype: str, ctx: Context) -> Program:
    current = str(ctx.config.reduce_dtype.value or "fp32")
    factor = DTYPE_BYTES[dtype] / DTYPE_BYTES.get(current, 4)
    ops = p.ops
    reductions = ops["collective"].isin([Collective.REDUCE_SCATTER, Collective.ALL_REDUCE])
    ops.loc[reductions, "transfer_us"] = ops.loc[reductions, "transfer_us"] * factor
    return p


def _no_sync(p: Program) -> Program:
    """Gradients reduced on the last micro-batch only: each unit's last reduction stays."""
    ops = p.ops
    reductions = ops["collective"].isin([Collective.REDUCE_SCATTER, Collective.ALL_REDUCE])
    keep = ~reductions | ~ops.duplicated(["collective", "unit"], keep="last")
    p.ops = _renumber_after(ops[keep])
    return p
