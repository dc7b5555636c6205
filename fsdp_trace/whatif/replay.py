"""Replay FSDP2's step on every rank at once: a discrete-event run of each rank's programs
(fsdp_trace.whatif.program) on its streams — compute, all-gather, reduce-scatter, all-reduce
— with collectives that end together on every rank of their group.

Each piece starts when its stream is free, its host launch has happened (a host-bound rank
stays host-bound), and what it depends on is done; a matched collective ends at the last
member's start plus its transfer time, so a late rank makes the others wait in the replay as
it did in the trace. The ranks' times are found by repeating passes until none moves; the
dependencies have no cycle, so this settles, and where it does not (a cycle: a modelling
bug) the replay is an error rather than the last pass's times."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fsdp_trace.analysis import intervals as iv
from fsdp_trace.analysis.rank.breakdown import Spans, partition
from fsdp_trace.errors import UserError
from fsdp_trace.vocab import Collective
from fsdp_trace.whatif.program import Program, SegmentKind, compute_waits, op_waits, waits

MAX_PASSES = 200
TAX_ROUNDS = 12  # damped rounds of the overlap-tax correction
TAX_DAMPING = 0.5
TAX_SETTLED_US = 10.0
SETTLED_US = 1e-3


@dataclass
class Timeline:
    """One rank's replayed step: when each segment and collective ran (µs, shared clock)."""

    program: Program
    seg_start: np.ndarray
    seg_end: np.ndarray
    op_start: np.ndarray
    op_end: np.ndarray

    @property
    def start(self) -> float:
        firsts = [self.seg_start.min()] + ([self.op_start.min()] if self.op_start.size else [])
        return float(min(firsts))

    @property
    def end(self) -> float:
        lasts = [self.seg_end.max()] + ([self.op_end.max()] if self.op_end.size else [])
        return float(max(lasts))

    @property
    def step_us(self) -> float:
        """The replayed step window: first work to last, plus the measured tail."""
        return self.end - self.start + self.program.tail_us

    def breakdown(self) -> dict[str, float]:
        """The replayed step cut into the measured breakdown's parts."""
        segs = self.program.segments
        kind = segs["kind"].to_numpy()
        spans = Spans(
            self.seg_start,
            self.seg_end,
            np.ones(len(segs), dtype=bool),
            kind == SegmentKind.RECOMPUTE,
            kind == SegmentKind.FSDP,
        )
        lo = np.array([self.start])
        hi = np.array([self.start + self.step_us])
        transfer = self.program.ops["transfer_us"].to_numpy(dtype=np.float64)
        parts = partition(spans, self.op_start, self.op_end, transfer, lo, hi)
        return {"step_us": float(hi[0] - lo[0]), **{k: float(v[0]) for k, v in parts.items()}}


def _stream(collective: str) -> str:
    return (
        collective
        if collective
        in (
            Collective.ALL_GATHER,
            Collective.REDUCE_SCATTER,
            Collective.ALL_REDUCE,
        )
        else "other"
    )


@dataclass
class _Plan:
    """A program laid out for fast passes: node order and dependency lists."""

    program: Program
    shift: float  # this rank's host origin on the shared clock
    gpu_origin: float  # when this rank's GPU took the step's first work (shared clock)
    latency: float
    host_scale: float
    order: list[tuple[int, int]]  # (0 segment / 1 op, position), in host launch order
    work: np.ndarray  # per segment: its kernels' time and their bubbles
    paced: np.ndarray  # per segment: its end as its launches allow, from the host origin
    needs: list[list[int]]  # per segment: ops it waits for
    streams: list[str]  # per op
    waits: np.ndarray  # per op: the segments its streams wait for (-1: none)
    op_waits: list[list[int]]  # per op: ops its stream waits for through the compute stream


def _plan(
    program: Program,
    shift: float,
    gpu_origin: float,
    latency: float,
    host_scale: float,
) -> _Plan:
    segs, ops = program.segments, program.ops
    work, paced = _pacing(segs, host_scale)
    nodes = [(float(h), 0, i) for i, h in enumerate(segs["host_us"].to_numpy())]
    nodes += [(float(h), 1, j) for j, h in enumerate(ops["host_us"].to_numpy())]
    nodes.sort()
    return _Plan(
        program=program,
        shift=shift,
        gpu_origin=gpu_origin,
        latency=latency,
        host_scale=host_scale,
        order=[(kind, i) for _, kind, i in nodes],
        work=work,
        paced=paced,
        needs=compute_waits(segs, ops),
        streams=[_stream(c) for c in ops["collective"]],
        waits=waits(segs, ops),
        op_waits=op_waits(segs, ops),
    )


def replay(
    programs: list[Program],
    offsets: dict | None = None,
    host_scale: float | dict = 1.0,
    tax: float = 0.0,
) -> list[Timeline]:
    """Every rank's step replayed together. `offsets`: each rank's clock offset (µs) from
    the cross-rank view, so their host times share one clock. `host_scale`: the host's
    launch times scaled (1: as traced; below 1: a faster host, as without the profiler).
    `tax`: compute beside a running NCCL kernel takes 1 + tax times as long (measured:
    fsdp_trace.analysis.rank.overlap_tax)."""
    offsets = offsets or {}
    # One clock: the trace's (µs), each rank corrected by its offset. Launch latency is the
    # hardware's: the least launch-to-start any rank shows (a rank whose host runs ahead
    # shows only its lead).
    latency = min(p.latency_us for p in programs)
    plans = [
        _plan(
            p,
            p.host_origin - offsets.get(p.rank, 0.0),
            p.gpu_origin - offsets.get(p.rank, 0.0),
            latency,
            host_scale.get(p.rank, 1.0) if isinstance(host_scale, dict) else host_scale,
        )
        for p in programs
    ]
    seg_start = [np.zeros(len(p.segments)) for p in programs]
    seg_end = [np.zeros(len(p.segments)) for p in programs]
    op_start = [np.zeros(len(p.ops)) for p in programs]
    op_end = [np.zeros(len(p.ops)) for p in programs]
    members = _members(programs)
    _settle(plans, seg_start, seg_end, op_start, op_end, members)
    if tax > 0:
        # The overlap tax: the measured compute ran beside NCCL as measured; where the replay
        # puts more (or less) NCCL beside a segment, that time runs 1 + tax times slower
        # (faster). Where NCCL runs depends on the compute in turn (a kernel waiting for a
        # slow peer slows the compute beside it), so the correction is damped over rounds.
        factor = tax / (1.0 + tax)
        alone = [
            plan.work - plan.program.segments["beside_us"].to_numpy(dtype=np.float64) * factor
            for plan in plans
        ]
        for _ in range(TAX_ROUNDS):
            change = 0.0
            for r, plan in enumerate(plans):
                nccl = iv.union(op_start[r], op_end[r])
                beside = iv.overlap_each(seg_start[r], seg_end[r], nccl)
                target = np.maximum(alone[r] + beside * factor, 0.0)
                step = TAX_DAMPING * (target - plan.work)
                plan.work = plan.work + step
                change = max(change, float(np.abs(step).max(initial=0.0)))
            _settle(plans, seg_start, seg_end, op_start, op_end, members)
            if change < TAX_SETTLED_US:
                break
    return [
        Timeline(p, seg_start[r], seg_end[r], op_start[r], op_end[r])
        for r, p in enumerate(programs)
    ]


def _settle(plans, seg_start, seg_end, op_start, op_end, members) -> None:
    """Passes over every rank until no time moves; UserError where MAX_PASSES do not settle
    (a dependency cycle), rather than the last pass's times."""
    moved = 0.0
    for _ in range(MAX_PASSES):
        moved = 0.0
        for r, plan in enumerate(plans):
            moved = max(moved, _pass(r, plan, seg_start, seg_end, op_start, op_end, members))
        if moved < SETTLED_US:
            return
    raise UserError(
        f"what-if: the replay did not settle in {MAX_PASSES} passes (times still moved "
        f"{moved:.0f} µs): its stream dependencies form a cycle, a bug in fsdp-trace's model "
        "of this step; please report it"
    )


def _members(programs: list[Program]) -> dict[int, list[tuple[int, int]]]:
    """match id → its (rank position, op position) on every rank."""
    out: dict[int, list[tuple[int, int]]] = {}
    for r, p in enumerate(programs):
        for j, (match, matched) in enumerate(zip(p.ops["match"], p.ops["matched"], strict=True)):
            if matched and match >= 0:
                out.setdefault(int(match), []).append((r, j))
    return out


def _pass(r, plan: _Plan, seg_start, seg_end, op_start, op_end, members) -> float:
    program = plan.program
    ops = program.ops
    transfer = ops["transfer_us"].to_numpy(dtype=np.float64)
    host = plan.shift + plan.latency
    scale = plan.host_scale
    seg_host = program.segments["host_us"].to_numpy(dtype=np.float64) * scale + host
    op_host = ops["host_us"].to_numpy(dtype=np.float64) * scale + host
    setup = ops["setup_us"].to_numpy(dtype=np.float64)
    after = ops["after"].to_numpy()
    match = ops["match"].to_numpy()
    matched = ops["matched"].to_numpy()
    compute_free = plan.gpu_origin  # the GPU takes the step's work from here
    stream_free: dict[str, float] = {}
    moved = 0.0
    for kind, i in plan.order:
        if kind == 0:
            ready = max(compute_free, seg_host[i])
            for j in plan.needs[i]:
                ready = max(ready, op_end[r][j])
            end = max(ready + plan.work[i], host + plan.paced[i])
            moved = max(moved, abs(end - seg_end[r][i]), abs(ready - seg_start[r][i]))
            seg_start[r][i], seg_end[r][i] = ready, end
            compute_free = end
            continue
        stream = plan.streams[i]
        ready = max(stream_free.get(stream, plan.gpu_origin), op_host[i])
        for w in plan.waits[i]:  # FSDP2's stream waits
            if w >= 0:
                ready = max(ready, seg_end[r][w])
        if after[i] >= 0:
            ready = max(ready, op_end[r][after[i]])
        for j in plan.op_waits[i]:
            ready = max(ready, op_end[r][j])
        ready += setup[i]
        op_start[r][i] = ready
        last = ready
        if matched[i] and match[i] >= 0:
            for rr, jj in members.get(int(match[i]), []):
                last = max(last, op_start[rr][jj])
        end = last + transfer[i]
        moved = max(moved, abs(end - op_end[r][i]))
        op_end[r][i] = end
        stream_free[stream] = end
    return moved


def _pacing(segs, host_scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Per segment, its GPU work (kernels and their bubbles) and the earliest its last
    kernel can end when each kernel waits for its own launch (host times × host_scale):
    a kernel ends at max(the one before's end + its bubble, its launch) + its time, so
    the segment's end is the latest of launch_k + the time from kernel k on."""
    work = np.empty(len(segs))
    paced = np.empty(len(segs))
    for i, (host, off, dur, extra) in enumerate(
        zip(segs["host_us"], segs["k_off"], segs["k_dur"], segs["k_extra"], strict=True)
    ):
        step = dur + extra
        after = np.cumsum(step[::-1])[::-1] - extra  # kernel k's time and all after it
        work[i] = float(step.sum())
        paced[i] = float(np.max(host_scale * (host + off) + after)) if len(dur) else 0.0
    return work, paced
