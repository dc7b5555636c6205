"""Synthetic FSDP2 training steps on several ranks, as Kineto traces: a small co-simulation
of FSDP2's schedule (implicit forward prefetch, backward prefetch of the previous unit, a
reduce-scatter after each unit's backward, HSDP's all-reduce after it) with collectives that
end together on every rank of their group. Every time is chosen by the test, so each
diagnosis rule can be shown its problem, and a healthy run, with known numbers.

The streams wait as torch 2.6-2.11's FSDP2 makes them (`_fsdp_param_group.py`
`post_backward` / `finalize_backward`, `_fsdp_collectives.py` `foreach_reduce`,
`_fsdp_state.py` `_root_pre_forward` / `_root_post_backward_final_callback`):
- a unit's reduce-scatter runs on the reduce-scatter stream after its backward; before
  issuing it, the compute stream waits for the previous reduce-scatter of that backward
  (`comm_ctx.reduce_scatter_state.event`), so compute stalls behind slow reduce-scatters;
- HSDP's all-reduce runs on its own all-reduce stream, after its unit's reduce-scatter
  (`all_reduce_stream.wait_stream(reduce_scatter_stream)`); the next reduce-scatter does not
  wait for it;
- at the end of each backward the compute stream waits for every reduction of it
  (`finalize_backward`), and each forward's first gather waits for the compute stream
  (`_root_pre_forward`); with `accum_no_sync` only the last micro-batch reduces.

    sim = Sim(ranks=2, blocks=4)
    sim.delay[1] = 3000  # rank 1's host is late every step
    paths = sim.write(tmp_path)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from tests.synth import AUTOGRAD, MAIN, TraceBuilder

ROOT = "root"


@dataclass
class Sim:
    ranks: int = 2
    blocks: int = 4
    steps: int = 3
    fwd_us: float = 1000.0  # a block's forward compute
    bwd_us: float = 2000.0  # a block's backward compute
    ag_us: float = 300.0  # a block's all-gather transfer
    rs_us: float = 400.0  # a block's reduce-scatter transfer
    root_fwd_us: float = 500.0
    root_bwd_us: float = 1000.0
    root_ag_us: float = 300.0
    root_rs_us: float = 400.0
    nelems: int = 25_000_000  # a block's parameters (the root's: the same)
    root_nelems: int | None = None
    reshard: bool = True  # blocks reshard after forward (gathered again in backward)
    root_reshard: bool = False  # the root too
    checkpointed: set[int] = field(default_factory=set)  # blocks under activation ckpt
    hsdp_replicas: int = 1  # HSDP: replicate groups of size `hsdp_replicas`
    ar_us: float = 500.0  # HSDP all-reduce transfer
    gap_us: float = 0.0  # host gap between compute launches (all ranks)
    delay: dict[int, float] = field(default_factory=dict)  # per rank: host late at step start
    slow: dict[int, float] = field(default_factory=dict)  # per rank: compute ×
    micro_batches: int = 1
    copy_in_us: float = 0.0  # a reduce-scatter's copy-in on the compute stream (its unit's)
    accum_no_sync: bool = False  # gradients reduced on the last micro-batch only
    optimizer_us: float = 300.0
    world_size: int | None = None  # distributedInfo (default: ranks)
    # The host's speed against the GPU's: 1 launches each kernel just before it runs (the
    # host paces the GPU); above 1 the CPU side of each step is compressed toward the step's
    # start, so the host runs ahead and the GPU's own dependencies set the times.
    host_speed: float = 1.0
    device_name: str = "NVIDIA H100 80GB HBM3"

    def units(self) -> list[str]:
        return [ROOT, *(f"layers.{i}" for i in range(self.blocks))]

    # --- the co-simulation ----------------------------------------------------------------

    def write(self, folder: Path, run_json: dict | None = None) -> list[Path]:
        """Write rank{R}.json per rank into `folder` (and run.json when given, with the
        trace list filled in); returns the trace paths."""
        folder.mkdir(parents=True, exist_ok=True)
        builders = self.build()
        paths = []
        for rank, b in enumerate(builders):
            path = folder / f"rank{rank}.json"
            doc = b.document()
            # The GPUs of the node (the profiler lists every visible one).
            doc["deviceProperties"] = [
                {"id": i, "name": self.device_name} for i in range(self.ranks)
            ]
            pgs = [{"pg_name": "0", "pg_desc": "default_pg", "ranks": list(range(self.ranks))}]
            if self.hsdp_replicas > 1:
                pgs.append(
                    {"pg_name": "shard", "pg_desc": "mesh_shard", "ranks": self._shard_group(rank)}
                )
                pgs.append(
                    {
                        "pg_name": "replicate",
                        "pg_desc": "mesh_replicate",
                        "ranks": self._replicate_group(rank),
                    }
                )
            doc["distributedInfo"]["pg_config"] = pgs
            path.write_text(json.dumps(doc))
            paths.append(path)
        if run_json is not None:
            record = {"files": {"timing": [p.name for p in paths]}, **run_json}
            (folder / "run.json").write_text(json.dumps(record))
        return paths

    def _shard_size(self) -> int:
        return self.ranks // self.hsdp_replicas

    def _shard_group(self, rank: int) -> list[int]:
        s = self._shard_size()
        first = (rank // s) * s
        return list(range(first, first + s))

    def _replicate_group(self, rank: int) -> list[int]:
        s = self._shard_size()
        return list(range(rank % s, self.ranks, s))

    def build(self) -> list[TraceBuilder]:
        n = self.ranks
        world = self.world_size or n
        bs = [TraceBuilder(rank=r, world_size=world) for r in range(n)]
        clock = [0.0] * n  # GPU time each rank is at (compute stream free)
        comm_free = [0.0] * n
        rs_free = [0.0] * n  # the reduce-scatter stream
        ar_free = [0.0] * n  # HSDP's all-reduce stream
        t_step = 0.0
        for step in range(1, self.steps + 1):
            step_start = [t_step + 100.0 + self.delay.get(r, 0.0) for r in range(n)]
            for r in range(n):
                bs[r].step(step, t_step, 1.0)  # ended below, when the step's end is known
                clock[r] = max(clock[r], step_start[r])
                comm_free[r] = max(comm_free[r], step_start[r])
            for micro in range(self.micro_batches):
                reduce = not self.accum_no_sync or micro == self.micro_batches - 1
                self._forward(bs, clock, comm_free)
                self._backward(bs, clock, comm_free, rs_free, ar_free, reduce)
                if reduce:  # finalize_backward: compute waits for every reduction
                    for r in range(n):
                        clock[r] = max(clock[r], rs_free[r], ar_free[r])
            end = []
            for r in range(n):
                start = clock[r]
                corr_ts = start - 20.0
                bs[r].cpu("Optimizer.step#AdamW.step", corr_ts - 5, 30.0)
                bs[r].kernel("multi_tensor_apply_kernel", start, self.optimizer_us, corr_ts - 2)
                clock[r] = start + self.optimizer_us
                end.append(clock[r])
            t_next = max(end) + 200.0
            for r in range(n):  # the CPU step spans every launch of this step
                last = bs[r].events[[e["name"] for e in bs[r].events].index(f"ProfilerStep#{step}")]
                last["ts"], last["dur"] = t_step, t_next - t_step - 1.0
            t_step = t_next
        if self.host_speed != 1.0:
            for b in bs:
                _compress_host(b, 1.0 / self.host_speed)
        return bs

    def _compute(self, r: int, us: float) -> float:
        return us * self.slow.get(r, 1.0)

    def _collective(
        self,
        bs: list[TraceBuilder],
        kind: str,
        unit: str,
        starts: list[float],
        transfer: float,
        group_of,
        label: str | None,
        tid: int,
        stream: int,
        nelems: int,
        pg: str = "0",
        launches: list[float] | None = None,
    ) -> list[float]:
        """One collective per rank: each group's ranks end together at their latest arrival
        plus the transfer. `launches`: CPU launch times (default: 30 µs before the GPU
        start). Returns each rank's end."""
        ends = [0.0] * len(starts)
        done: set[int] = set()
        for r in range(len(starts)):
            if r in done:
                continue
            group = group_of(r)
            finish = max(starts[g] for g in group) + transfer
            for g in group:
                ends[g] = finish
                done.add(g)
        for r, b in enumerate(bs):
            launch = launches[r] if launches is not None else starts[r] - 30.0
            if label is not None:
                b.label(label, launch - 2.0, 6.0, tid=tid)
            corr = b.nccl(
                kind,
                starts[r],
                ends[r] - starts[r],
                launch_ts=launch,
                stream=stream,
                launch_tid=tid,
                nelems=nelems,
            )
            args = b.events[-1]["args"]
            assert args["correlation"] == corr
            group = group_of(r)
            args["Group size"] = len(group)
            args["Process Group Name"] = pg
            args["Process Group Ranks"] = "[" + ", ".join(map(str, group)) + "]"
            if kind == "AllGather":
                args["In msg nelems"] = nelems // len(group)
                args["Out msg nelems"] = nelems
            elif kind == "ReduceScatter":
                args["In msg nelems"] = nelems
                args["Out msg nelems"] = nelems // len(group)
        return ends

    def _shard_of(self, r: int) -> list[int]:
        return self._shard_group(r) if self.hsdp_replicas > 1 else list(range(self.ranks))

    def _sizes(self, unit: str) -> tuple[float, float, float, float, int]:
        if unit == ROOT:
            return (
                self.root_fwd_us,
                self.root_bwd_us,
                self.root_ag_us,
                self.root_rs_us,
                self.root_nelems or self.nelems,
            )
        return self.fwd_us, self.bwd_us, self.ag_us, self.rs_us, self.nelems

    def _gather(
        self, bs, unit, starts, hook: str, tid: int, launches: list[float] | None = None
    ) -> list[float]:
        """All-gather `unit`: inside its own `hook` label (pre_forward / pre_backward), or, for
        a prefetch, inside `FSDP::backward_prefetch for unit` at the issuer's `launches`."""
        _, _, ag, _, nelems = self._sizes(unit)
        label = "FSDP::all_gather" if unit == ROOT else f"FSDP::all_gather ({unit})"
        launches = launches or [s - 30.0 for s in starts]
        for r, b in enumerate(bs):
            if hook.endswith("_prefetch"):
                name = f"FSDP::{hook} for {'' if unit == ROOT else unit}"
            else:
                name = f"FSDP::{hook}" if unit == ROOT else f"FSDP::{hook} ({unit})"
            b.label(name, launches[r] - 8.0, 16.0, tid=tid)
        pg = "shard" if self.hsdp_replicas > 1 else "0"
        return self._collective(
            bs, "AllGather", unit, starts, ag, self._shard_of, label, tid, 20, nelems, pg, launches
        )

    def _forward(self, bs, clock, comm_free) -> None:
        n = len(bs)
        units = self.units()
        # Once per forward (micro-batch): the gather streams wait for the compute stream.
        first = [max(comm_free[r], clock[r]) for r in range(n)]
        for b, t in zip(bs, first, strict=True):
            b.label("FSDP::root_pre_forward", t - 60.0, 10.0)
        gathered = self._gather(bs, units[0], first, "pre_forward", MAIN)
        for r in range(n):
            comm_free[r] = gathered[r]
        for i, unit in enumerate(units):
            fwd, _, _, _, _ = self._sizes(unit)
            starts = [max(clock[r] + self.gap_us, gathered[r]) for r in range(n)]
            if i + 1 < len(units):  # implicit prefetch: the next unit's gather runs beside
                nxt = [max(comm_free[r], starts[r]) for r in range(n)]
                next_gathered = self._gather(bs, units[i + 1], nxt, "pre_forward", MAIN)
                for r in range(n):
                    comm_free[r] = next_gathered[r]
            for r, b in enumerate(bs):
                # Launched between the unit's pre_forward and post_forward, before the
                # next unit's pre_forward issues its gather.
                kernel = "fwd_gemm_root" if unit == ROOT else "fwd_gemm_block"
                b.kernel(kernel, starts[r], self._compute(r, fwd), starts[r] - 60.0, stream=7)
                clock[r] = starts[r] + self._compute(r, fwd)
                post = "FSDP::post_forward" if unit == ROOT else f"FSDP::post_forward ({unit})"
                b.label(post, starts[r] - 50.0, 3.0)
            if i + 1 < len(units):
                gathered = next_gathered

    def _backward(self, bs, clock, comm_free, rs_free, ar_free, reduce: bool = True) -> None:
        n = len(bs)
        order = [ROOT, *reversed(self.units()[1:])]  # backward starts with the head (root)
        needs = {u: (self.root_reshard if u == ROOT else self.reshard) for u in order}
        ready = {u: [clock[r] for r in range(n)] for u in order if not needs[u]}
        first = order[0]
        if needs[first]:
            starts = [max(comm_free[r], clock[r]) for r in range(n)]
            ready[first] = self._gather(bs, first, starts, "pre_backward", AUTOGRAD)
            for r in range(n):
                comm_free[r] = ready[first][r]
        previous_rs: list[float] | None = None  # this backward's last reduce-scatter's end
        for i, unit in enumerate(order):
            _, bwd, _, rs, nelems = self._sizes(unit)
            starts = [max(clock[r] + self.gap_us, ready[unit][r]) for r in range(n)]
            hook = [s - 100.0 for s in starts]  # this unit's pre_backward on the CPU
            for r, b in enumerate(bs):
                name = "FSDP::pre_backward" if unit == ROOT else f"FSDP::pre_backward ({unit})"
                b.label(name, hook[r], 40.0, tid=AUTOGRAD)
            if i + 1 < len(order) and needs[order[i + 1]]:  # prefetch the next one's gather
                nxt = [max(comm_free[r], starts[r]) for r in range(n)]
                ready[order[i + 1]] = self._gather(
                    bs, order[i + 1], nxt, "backward_prefetch", AUTOGRAD, [h + 20 for h in hook]
                )
                for r in range(n):
                    comm_free[r] = ready[order[i + 1]][r]
            index = None if unit == ROOT else int(unit.split(".")[1])
            issued = [0.0] * n  # post_backward on the CPU, right after the backward's launches
            for r, b in enumerate(bs):
                t = starts[r]
                if index in self.checkpointed:  # recompute: forward ops run inside backward
                    fwd = self._compute(r, self._sizes(unit)[0])
                    b.cpu(
                        "autograd::engine::evaluate_function: CheckpointFunctionBackward",
                        t - 50.0,
                        20.0,
                        tid=AUTOGRAD,
                    )
                    b.cpu("aten::mm", t - 45.0, 10.0, tid=AUTOGRAD, **{"Sequence number": 7})
                    b.kernel("fwd_gemm_block", t, fwd, t - 44.0, stream=7, launch_tid=AUTOGRAD)
                    t += fwd
                b.cpu(
                    "autograd::engine::evaluate_function: MmBackward0",
                    t - 30.0,
                    20.0,
                    tid=AUTOGRAD,
                )
                b.kernel(
                    "bwd_gemm", t, self._compute(r, bwd), t - 25.0, stream=7, launch_tid=AUTOGRAD
                )
                clock[r] = t + self._compute(r, bwd)
                issued[r] = t - 5.0
            if not reduce:  # no_sync: the gradients accumulate, nothing is reduced
                continue
            if previous_rs is not None:  # compute waits for the previous reduce-scatter
                for r in range(n):
                    clock[r] = max(clock[r], previous_rs[r])
            if self.copy_in_us:  # the gradients copied into the reduce-scatter's input
                for r, b in enumerate(bs):
                    b.kernel(
                        "chunk_cat_cuda_kernel",
                        clock[r],
                        self.copy_in_us,
                        issued[r] - 1.0,
                        stream=7,
                        launch_tid=AUTOGRAD,
                    )
                    clock[r] += self.copy_in_us
            label = (
                "FSDP::post_backward_reduce"
                if unit == ROOT
                else f"FSDP::post_backward_reduce ({unit})"
            )
            pg = "shard" if self.hsdp_replicas > 1 else "0"
            starts_rs = [max(rs_free[r], clock[r]) for r in range(n)]
            ended = self._collective(
                bs,
                "ReduceScatter",
                unit,
                starts_rs,
                rs,
                self._shard_of,
                label,
                AUTOGRAD,
                21,
                nelems,
                pg,
                issued,
            )
            previous_rs = ended
            for r in range(n):
                rs_free[r] = ended[r]
            if self.hsdp_replicas > 1:  # its own stream, after this unit's reduce-scatter
                ended = self._collective(
                    bs,
                    "AllReduce",
                    unit,
                    [max(ar_free[r], ended[r]) for r in range(n)],
                    self.ar_us,
                    self._replicate_group,
                    None,  # issued inside the reduce-scatter's post_backward_reduce
                    AUTOGRAD,
                    22,
                    nelems // self._shard_size(),
                    "replicate",
                    [t + 1.0 for t in issued],
                )
                for r in range(n):
                    ar_free[r] = ended[r]


def _compress_host(b: TraceBuilder, factor: float) -> None:
    """Every CPU event moved toward its step's start (ts and dur × factor from there)."""
    starts = sorted(e["ts"] for e in b.events if e["name"].startswith("ProfilerStep#"))
    for e in b.events:
        if e["pid"] != b.cpu_pid or e["name"].startswith("ProfilerStep#"):
            continue
        origin = max((t for t in starts if t <= e["ts"]), default=e["ts"])
        e["ts"] = origin + (e["ts"] - origin) * factor
        e["dur"] = e["dur"] * factor
