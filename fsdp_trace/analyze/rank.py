"""One trace in, one RankAnalysis out: step windows, overlap per step, and every collective
attributed to its FSDP2 unit and phase. Pure: no printing, no files."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from fsdp_trace.analyze import classify, context
from fsdp_trace.analyze import intervals as iv
from fsdp_trace.analyze import steps as steps_mod
from fsdp_trace.analyze.loader import MISSING, Trace
from fsdp_trace.analyze.results import (
    BLOCK_COLUMNS,
    COLLECTIVE_COLUMNS,
    STEP_COLUMNS,
    RankAnalysis,
)

FORWARD_LABELS = {
    "pre_forward",
    "forward_prefetch",
    "post_forward",
    "root_pre_forward",
    "all_gather_copy_out",
    "cast_forward_inputs",
    "cast_forward_outputs",
}
BACKWARD_LABELS = {
    "pre_backward",
    "backward_prefetch",
    "post_backward_accumulate",
    "post_backward_reshard",
    "post_backward_reduce",
    "post_backward_rs_wait",
    "root_post_backward_callback",
    "finalize_backward",
}
ISSUER_LABELS = {
    "pre_forward",
    "pre_backward",
    "post_forward",
    "post_backward_reduce",
    "root_pre_forward",
    "root_post_backward_callback",
}
UNATTRIBUTED = "unattributed"
AUTOGRAD_PREFIX = "autograd::engine::evaluate_function"
OPTIMIZER_PREFIX = "Optimizer.step#"
C10D_COLLECTIVES = {
    "c10d::_allgather_base_": "AllGather",
    "c10d::allgather_": "AllGather",
    "c10d::_reduce_scatter_base_": "ReduceScatter",
    "c10d::reduce_scatter_": "ReduceScatter",
    "c10d::allreduce_": "AllReduce",
    "c10d::broadcast_": "Broadcast",
}


@dataclass
class Expectations:
    """How many collectives per unit and optimizer step the reshard setting implies.

    Per optimizer step, not per micro-batch: FSDP2 re-gathers every micro-batch under
    gradient accumulation, and that excess is exactly what the diagnosis should point at.
    Without run.json the FSDP2 defaults are assumed (torch >= 2.8: `reshard_after_forward`
    True for every unit but the root, which keeps its parameters after forward).
    """

    ag_per_step: dict[str, int] = field(default_factory=dict)
    default_ag: int = 2  # fully_shard's default for non-root units: reshard after forward
    root_ag: int = 1  # the root's default: no reshard after forward (backward reuses them)
    rs_per_step: int = 1
    micro_batches: int = 1

    @classmethod
    def from_run(cls, run: dict | None) -> Expectations:
        """The recorded `parallel.reshard_after_forward` of every unit, root included
        ("default" or absent: FSDP2's default for that unit)."""
        if not run:
            return cls()
        parallel = run.get("parallel", {}) or {}
        micro = int(parallel.get("grad_accum", 1) or 1)
        torch_version = str((run.get("environment") or {}).get("torch") or "")
        ag: dict[str, int] = {}
        for unit, setting in (parallel.get("reshard_after_forward") or {}).items():
            count = gathers_per_step(setting, unit == context.ROOT, torch_version)
            if count is not None:
                ag[unit] = count
        return cls(ag_per_step=ag, micro_batches=micro)

    def expected(self, block: str, collective: str) -> float:
        if block == UNATTRIBUTED:
            return float("nan")  # no unit to hold a count against
        if collective == "AllGather":
            default = self.root_ag if block == context.ROOT else self.default_ag
            return float(self.ag_per_step.get(block, default))
        if collective == "ReduceScatter":
            return float(self.rs_per_step)
        return float("nan")


def gathers_per_step(setting: object, is_root: bool, torch_version: str = "") -> int | None:
    """All-gathers per step that a unit's `reshard_after_forward` implies: 2 when it reshards
    (True, or an int: backward re-gathers from the smaller group), 1 when it does not;
    None (the default's) for "default"/None. Before torch 2.8 FSDP2 never resharded the root
    after forward, whatever it was given."""
    if setting is None or setting == "default":
        return None
    if is_root and _torch_before(torch_version, (2, 8)):
        return 1
    if setting is False:
        return 1
    if isinstance(setting, int):  # True, or a group size to reshard to
        return 2
    return None


def _torch_before(version: str, limit: tuple[int, int]) -> bool:
    match = re.match(r"^(\d+)\.(\d+)", version)
    return bool(match) and (int(match.group(1)), int(match.group(2))) < limit


@dataclass
class _Cpu:
    """The CPU-side context of a trace, built once and queried for every launch."""

    keys: context.ThreadKeys
    labels: context.Forest
    windows: context.Forest
    autograd: context.ThreadUnion
    recompute: context.ThreadUnion
    optimizer: context.ThreadUnion
    COLUMNS = ("pid", "tid", "ts", "end", "name", "sequence_number")

    @classmethod
    def build(cls, cpu: pd.DataFrame) -> _Cpu:
        keys = context.ThreadKeys(
            cpu["pid"].to_numpy(), cpu["tid"].to_numpy(), cpu["ts"].to_numpy()
        )
        code = keys.codes
        fsdp = context.fsdp_labels(cpu)
        labels = context.Forest.build(
            keys,
            keys.code(fsdp["pid"], fsdp["tid"]),
            fsdp["ts"],
            fsdp["end"],
            fsdp["kind"],
            fsdp["fqn"],
        )
        win = context.block_windows(fsdp)
        windows = context.Forest.build(
            keys,
            keys.code(win["pid"], win["tid"]),
            win["w_start"],
            win["w_end"],
            win["phase"],
            win["fqn"],
        )
        names = cpu["name"]  # string tests run once per distinct name
        ts, end = cpu["ts"].to_numpy(), cpu["end"].to_numpy()
        is_autograd = context.name_mask(names, lambda n: n.startswith(AUTOGRAD_PREFIX))
        autograd = context.ThreadUnion(keys, code[is_autograd], ts[is_autograd], end[is_autograd])
        # Recompute = forward ops (they carry an autograd sequence number) run inside backward.
        candidate = (
            (cpu["sequence_number"].to_numpy() != MISSING)
            & ~context.name_mask(names, lambda n: "Backward" in n)
            & ~is_autograd
        )
        inside = np.zeros(len(cpu), dtype=bool)
        inside[candidate] = autograd.contains(code[candidate], ts[candidate])
        recompute = context.ThreadUnion(keys, code[inside], ts[inside], end[inside])
        is_opt = context.name_mask(names, lambda n: n.startswith(OPTIMIZER_PREFIX))
        optimizer = context.ThreadUnion(keys, code[is_opt], ts[is_opt], end[is_opt])
        return cls(keys, labels, windows, autograd, recompute, optimizer)


def _empty(columns: list[str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in columns})


def _text_column(events: pd.DataFrame, name: str, rows: np.ndarray) -> np.ndarray:
    """A sparse text column of `events` at `rows` (None where absent or not loaded)."""
    if name not in events:
        return np.full(rows.size, None, dtype=object)
    return np.asarray(events[name].array[rows], dtype=object)


def device_names(trace: Trace) -> list[str]:
    """The GPU names in the trace's deviceProperties (rule 8 infers NVLink from SXM parts)."""
    return [
        str(p["name"]) for p in trace.device_properties if isinstance(p, dict) and p.get("name")
    ]


def _link_launches(events: pd.DataFrame, kinds: np.ndarray, gpu_idx: np.ndarray) -> np.ndarray:
    """Row of the launch event (same `correlation`) of each GPU event, or -1."""
    correlation = events["correlation"].to_numpy()
    launch_rows = np.flatnonzero((kinds == classify.LAUNCH) & (correlation >= 0))
    if launch_rows.size == 0:  # no launch events at all (e.g. a GPU-only export)
        return np.full(gpu_idx.size, -1, dtype=np.int64)
    launch_corr = correlation[launch_rows]
    order = np.argsort(launch_corr, kind="stable")
    sorted_corr = launch_corr[order]
    corr = correlation[gpu_idx]
    pos = np.searchsorted(sorted_corr, corr)
    safe = np.minimum(pos, sorted_corr.size - 1)
    found = (pos < sorted_corr.size) & (corr >= 0) & (sorted_corr[safe] == corr)
    return np.where(found, launch_rows[order][safe], -1)


def _windowed_lengths(u: iv.Intervals, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    return iv.covered_up_to(u, ends) - iv.covered_up_to(u, starts)


@dataclass
class Coverage:
    """Unions of communication and compute kernels, and what follows from them. The one
    place overlap figures are made: the per-step analysis and the HTA cross-check both
    measure through it."""

    comm: iv.Intervals
    compute: iv.Intervals
    exposed: iv.Intervals  # comm \ compute
    busy: iv.Intervals  # comm ∪ compute

    @classmethod
    def of(cls, ts: np.ndarray, end: np.ndarray, kinds: np.ndarray) -> Coverage:
        """From GPU events and their classify kinds (memcpy, memset, sync count as neither)."""
        is_comm, is_compute = kinds == classify.COMM, kinds == classify.COMPUTE
        comm = iv.union(ts[is_comm], end[is_comm])
        compute = iv.union(ts[is_compute], end[is_compute])
        busy = iv.union(
            np.concatenate([comm[0], compute[0]]), np.concatenate([comm[1], compute[1]])
        )
        return cls(comm, compute, iv.subtract(comm, compute), busy)

    def in_windows(self, starts: np.ndarray, ends: np.ndarray) -> dict[str, np.ndarray]:
        """|C|, |K|, |C ∩ K|, |C \\ K| and |C ∪ K| within each window [start, end]."""
        comm = _windowed_lengths(self.comm, starts, ends)
        exposed = _windowed_lengths(self.exposed, starts, ends)
        return {
            "comm_us": comm,
            "compute_us": _windowed_lengths(self.compute, starts, ends),
            "overlap_us": comm - exposed,
            "exposed_us": exposed,
            "busy_us": _windowed_lengths(self.busy, starts, ends),
        }


def overlap_pct(comm_us: np.ndarray, overlap_us: np.ndarray) -> np.ndarray:
    """HTA's comp_comm_overlap_pctg: overlap / comm (NaN without communication)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(comm_us > 0, 100.0 * overlap_us / comm_us, np.nan)


def _assign_steps(
    cpu_steps: pd.DataFrame, linked: np.ndarray, launch_ts: np.ndarray, notices: list[str]
) -> np.ndarray:
    """The step of each GPU event (-1: left out), from where its launch lies."""
    if not linked.any():
        # Without launches nothing tells steps apart (the GPU-side ProfilerStep is not the
        # step): every GPU event goes into one window.
        notices.append(
            f"none of the {linked.size} GPU events has its launch in the trace (no "
            "cuda_runtime/cuda_driver launch with the same correlation): steps cannot be told "
            "apart, so one window covers the whole trace and blocks and phases are unattributed"
        )
        return np.zeros(linked.size, dtype=np.int64)
    if cpu_steps.empty:
        notices.append("no ProfilerStep annotations: one window over the whole trace")
        step_of = np.zeros(linked.size, dtype=np.int64)
    else:
        step_of = steps_mod.step_of_time(cpu_steps, np.nan_to_num(launch_ts, nan=-np.inf))
    return np.where(linked, step_of, -1)


def analyze_trace(
    trace: Trace, expectations: Expectations | None = None, source: str = "trace"
) -> RankAnalysis:
    """Everything per step, per collective and per block for one rank's trace."""
    expectations = expectations or Expectations()
    events = trace.events
    kinds = classify.event_kinds(events)
    notices: list[str] = []
    gpu_idx = np.flatnonzero(
        classify.kind_mask(kinds, classify.COMM, classify.COMPUTE, classify.MEMCPY, classify.MEMSET)
    )
    if not classify.kind_mask(kinds[gpu_idx], classify.COMM, classify.COMPUTE).any():
        from fsdp_trace.analyze.cpu_collectives import analyze_cpu_trace

        return analyze_cpu_trace(trace, kinds, expectations, source)

    cpu_mask = classify.kind_mask(kinds, classify.CPU_OP, classify.ANNOTATION, classify.LAUNCH)
    cpu = events.loc[cpu_mask, list(_Cpu.COLUMNS)]  # only what the CPU context reads
    cpu_steps = steps_mod.cpu_steps(events, kinds)
    launch_row = _link_launches(events, kinds, gpu_idx)
    linked = launch_row >= 0
    launch_ts = np.where(linked, events["ts"].to_numpy()[np.maximum(launch_row, 0)], np.nan)
    step_of = _assign_steps(cpu_steps, linked, launch_ts, notices)
    keep = step_of >= 0
    dropped = int((~keep).sum())
    if dropped:
        notices.append(
            f"{dropped} GPU events launched outside the profiled steps (or with no launch "
            "in the trace) were left out"
        )
    kidx = gpu_idx[keep]
    k = pd.DataFrame(
        {
            "ts": events["ts"].to_numpy()[kidx],
            "end": events["end"].to_numpy()[kidx],
            "dur": events["dur"].to_numpy()[kidx],
            "device": events["pid"].to_numpy()[kidx],
            "stream": events["tid"].to_numpy()[kidx],
            "kind": kinds[kidx],
            "name": events["name"].array[kidx],
            "step": step_of[keep],
            "correlation": events["correlation"].to_numpy()[kidx],
            # Launch shape (JSON text): tells apart kernels of one name (rule 7).
            "grid": _text_column(events, "grid", kidx),
            "block_dim": _text_column(events, "block", kidx),
            "launch_row": launch_row[keep],
        }
    )
    if cpu_steps.empty or not linked.any():
        windows = pd.DataFrame({"step": [0], "start": [k["ts"].min()], "end": [k["end"].max()]})
    else:
        windows = steps_mod.gpu_windows(
            cpu_steps, k["step"].to_numpy(), k["ts"].to_numpy(), k["end"].to_numpy()
        )

    kind_arr = k["kind"].to_numpy()
    is_comm = kind_arr == classify.COMM
    is_compute = kind_arr == classify.COMPUTE
    ts_arr, end_arr = k["ts"].to_numpy(), k["end"].to_numpy()
    cover = Coverage.of(ts_arr, end_arr, kind_arr)

    # Context of every kept GPU event's launch: block, phase.
    cpu_ctx = _Cpu.build(cpu)
    rows = k["launch_row"].to_numpy()
    has_launch = rows >= 0
    l_thread = np.full(len(k), -1, dtype=np.int64)
    l_time = np.full(len(k), np.nan)
    l_thread[has_launch] = cpu_ctx.keys.code(
        events["pid"].to_numpy()[rows[has_launch]], events["tid"].to_numpy()[rows[has_launch]]
    )
    l_time[has_launch] = events["ts"].to_numpy()[rows[has_launch]]
    t_safe = np.nan_to_num(l_time, nan=-1.0)
    in_recompute = cpu_ctx.recompute.contains(l_thread, t_safe) & has_launch
    in_autograd = cpu_ctx.autograd.contains(l_thread, t_safe) & has_launch
    in_optimizer = cpu_ctx.optimizer.contains(l_thread, t_safe) & has_launch
    label_chain = cpu_ctx.labels.chain(cpu_ctx.labels.innermost(cpu_ctx.keys, l_thread, t_safe))
    window_idx = cpu_ctx.windows.innermost(cpu_ctx.keys, l_thread, t_safe)
    in_backward_window = cpu_ctx.windows.kind_in({"backward"}, window_idx)
    k["block"] = cpu_ctx.windows.fqn_at(window_idx)
    phase_label = cpu_ctx.labels.first_of(label_chain, FORWARD_LABELS | BACKWARD_LABELS)
    phase = np.where(
        in_recompute,
        "recompute",
        np.where(
            cpu_ctx.labels.kind_in(BACKWARD_LABELS, phase_label) | in_autograd | in_backward_window,
            "backward",
            np.where(in_optimizer, "optimizer", "forward"),
        ),
    )
    k["phase"] = np.where(has_launch, phase, UNATTRIBUTED)  # no launch: no CPU context

    # Steps.
    starts = windows["start"].to_numpy(dtype=np.float64)
    ends = windows["end"].to_numpy(dtype=np.float64)
    step_us = ends - starts
    figures = cover.in_windows(starts, ends)
    comm_events = events.iloc[kidx[is_comm]]  # the NCCL kernels' events, sliced once
    coll = classify.collective_types(comm_events) if is_comm.any() else np.array([], dtype=object)
    comm_ts, comm_end = ts_arr[is_comm], end_arr[is_comm]
    ag_u = iv.union(comm_ts[coll == "AllGather"], comm_end[coll == "AllGather"])
    rs_u = iv.union(comm_ts[coll == "ReduceScatter"], comm_end[coll == "ReduceScatter"])
    is_recompute = is_compute & (k["phase"].to_numpy() == "recompute")
    recompute_us = _windowed_lengths(
        iv.union(ts_arr[is_recompute], end_arr[is_recompute]), starts, ends
    )
    per_step_counts = k.groupby(["step", "kind"]).size().unstack(fill_value=0)

    def count(kind: int) -> np.ndarray:
        column = per_step_counts.get(kind, pd.Series(0, index=per_step_counts.index))
        return column.reindex(windows["step"]).fillna(0).to_numpy(dtype=np.int64)

    idle_us = step_us - figures["busy_us"]
    with np.errstate(invalid="ignore", divide="ignore"):
        step_frame = pd.DataFrame(
            {
                "rank": trace.rank,
                "source": source,
                "step": windows["step"].to_numpy(),
                "start_us": starts,
                "end_us": ends,
                "step_us": step_us,
                "compute_us": figures["compute_us"],
                "comm_us": figures["comm_us"],
                "overlap_us": figures["overlap_us"],
                "exposed_us": figures["exposed_us"],
                "exposed_pct": 100.0 * figures["exposed_us"] / step_us,
                "idle_us": idle_us,
                "idle_pct": 100.0 * idle_us / step_us,
                "overlap_pct": overlap_pct(figures["comm_us"], figures["overlap_us"]),
                "ag_us": _windowed_lengths(ag_u, starts, ends),
                "rs_us": _windowed_lengths(rs_u, starts, ends),
                "recompute_us": recompute_us,
                "recompute_pct": 100.0 * recompute_us / step_us,
                "n_comm_kernels": count(classify.COMM),
                "n_compute_kernels": count(classify.COMPUTE),
            }
        )[STEP_COLUMNS]
    n_comm_in_trace = int((kinds[gpu_idx] == classify.COMM).sum())
    if n_comm_in_trace == 0:
        notices.append(
            "no NCCL kernels: a single-GPU (or non-distributed) trace, nothing to overlap"
        )
    elif not is_comm.any():
        notices.append(
            f"all {n_comm_in_trace} NCCL kernels were launched outside the profiled steps (or "
            "their launches are not in the trace): no communication in the analyzed steps"
        )

    collectives = _collectives(
        trace,
        comm_events,
        k[is_comm],
        coll,
        cpu_ctx,
        label_chain[is_comm],
        cover.compute,
        source,
    )
    k_compute = k[is_compute]
    blocks = _blocks(collectives, k_compute, len(windows), expectations, trace.rank, source)
    compute_phases = iv.grouped_union_length(
        k_compute["step"].astype(str) + "|" + k_compute["phase"],
        k_compute["ts"],
        k_compute["end"],
    )
    phases_frame = _phase_table(compute_phases, trace.rank, source)
    exposed = pd.DataFrame({"start_us": cover.exposed[0], "end_us": cover.exposed[1]})
    exposed["step"] = steps_mod.step_of_time(
        windows, exposed["start_us"].to_numpy(), "start", "end"
    )
    kernels = k.drop(columns=["launch_row"]).assign(
        kind=lambda f: f["kind"].map(classify.KIND_NAMES)
    )
    return RankAnalysis(
        rank=trace.rank,
        path=trace.path,
        source=source,
        device="gpu",
        steps=step_frame,
        collectives=collectives,
        blocks=blocks,
        kernels=kernels,
        exposed=exposed,
        compute_phases=phases_frame,
        streams=_stream_roles(kernels, collectives),
        notices=notices,
        meta={
            "world_size": trace.world_size,
            "distributed": trace.distributed,
            "device_names": device_names(trace),
        },
    )


def _collectives(
    trace: Trace,
    comm_events: pd.DataFrame,
    comm: pd.DataFrame,
    coll: np.ndarray,
    cpu_ctx: _Cpu,
    chain: np.ndarray,
    compute_u: iv.Intervals,
    source: str,
) -> pd.DataFrame:
    """One row per communication kernel (`comm_events`: their trace events with the NCCL args;
    `comm`: their rows of the kernel table): unit, phase, bytes, bandwidth, exposed share."""
    n = len(comm_events)
    if n == 0:
        return _empty(COLLECTIVE_COLUMNS)
    labels = cpu_ctx.labels
    ag = labels.first_of(chain, {"all_gather"})
    rs = labels.first_of(chain, {"post_backward_reduce"})
    hooks = labels.first_of(chain, FORWARD_LABELS | BACKWARD_LABELS)
    block = np.where(
        coll == "AllGather",
        labels.fqn_at(ag),
        np.where(coll == "ReduceScatter", labels.fqn_at(rs), None),
    )
    block = np.where(pd.isna(block), labels.fqn_at(hooks), block)  # torch 2.4: no all_gather label
    prefetch = labels.first_of(chain, {"forward_prefetch", "backward_prefetch"})
    issuer = labels.first_of(chain, ISSUER_LABELS)
    issued_by = labels.fqn_at(issuer)
    issued_by = np.where(pd.isna(issued_by), block, issued_by)

    def col(name: str, default):
        return comm_events[name].to_numpy() if name in comm_events else np.full(n, default)

    in_n = col("in_nelems", MISSING).astype(np.float64)
    out_n = col("out_nelems", MISSING).astype(np.float64)
    elem = (
        classify.dtype_bytes(comm_events["dtype"])
        if "dtype" in comm_events
        else np.zeros(n, dtype=np.int64)
    )
    nelems = np.maximum(in_n, out_n)
    nbytes = np.where((nelems >= 0) & (elem > 0), nelems * elem, np.nan)
    group = col("group_size", MISSING).astype(np.float64)
    group = np.where(group > 0, group, float(trace.world_size) if trace.world_size else np.nan)
    dur = comm["dur"].to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        algbw = np.where(dur > 0, nbytes / (dur * 1e-6) / 1e9, np.nan)
    factor = classify.bus_factors(coll, group)
    phase = comm["phase"].to_numpy().copy()
    hook_kind = labels.kind_at(hooks)
    phase = np.where(
        np.isin(hook_kind, list(FORWARD_LABELS)) & (phase != "recompute"), "forward", phase
    )
    phase = np.where(
        np.isin(hook_kind, list(BACKWARD_LABELS)) & (phase != "recompute"), "backward", phase
    )
    frame = pd.DataFrame(
        {
            "rank": trace.rank,
            "source": source,
            "step": comm["step"].to_numpy(),
            "collective": coll,
            "block": block,
            "phase": phase,
            "issued_by": issued_by,
            "prefetched": prefetch >= 0,
            "start_us": comm["ts"].to_numpy(),
            "end_us": comm["end"].to_numpy(),
            "dur_us": dur,
            "exposed_us": iv.split_uncovered(
                comm["ts"].to_numpy(), comm["end"].to_numpy(), compute_u
            ),
            "bytes": nbytes,
            "group_size": group,
            "algbw_gbps": algbw,
            "busbw_gbps": algbw * factor,
            "dtype": col("dtype", None),
            "pg_name": col("pg_name", None),
            "pg_ranks": comm_events["pg_ranks"].array if "pg_ranks" in comm_events else None,
            "seq": col("seq", MISSING),
            "stream": comm["stream"].to_numpy(),
            "correlation": comm["correlation"].to_numpy(),
            "kernel": comm["name"].astype(str).to_numpy(),
        }
    )
    frame["block"] = frame["block"].fillna("unattributed")
    return frame[COLLECTIVE_COLUMNS].reset_index(drop=True)


def _blocks(
    collectives: pd.DataFrame,
    compute: pd.DataFrame,
    n_steps: int,
    expectations: Expectations,
    rank: int | None,
    source: str,
) -> pd.DataFrame:
    """Per block × phase × collective, per step: counts vs expected, time, exposed, bandwidth,
    and the unit's own compute in that phase (plus, on backward rows, its recomputation)."""
    if collectives.empty or n_steps == 0:
        return _empty(BLOCK_COLUMNS)
    c = collectives.copy()
    c["key"] = c["block"].astype(str) + "|" + c["phase"] + "|" + c["collective"]
    known = c["bytes"].notna() & (c["dur_us"] > 0)
    c["timed_bytes"] = c["bytes"].where(known)
    c["timed_dur"] = c["dur_us"].where(known)
    grouped = c.groupby(["block", "phase", "collective"], sort=False)
    agg = grouped.agg(
        count=("dur_us", "size"),
        exposed=("exposed_us", "sum"),
        bytes=("bytes", lambda s: s.sum(min_count=1)),
        timed_bytes=("timed_bytes", lambda s: s.sum(min_count=1)),
        timed_dur=("timed_dur", "sum"),
        group_size=("group_size", "max"),
    ).reset_index()
    union = iv.grouped_union_length(c["key"], c["start_us"], c["end_us"])
    keys = agg["block"].astype(str) + "|" + agg["phase"] + "|" + agg["collective"]
    agg["time"] = keys.map(union)
    # Expectations are per unit and step, over both phases (e.g. 2 AG with reshard).
    per_unit = c.groupby(["block", "collective"]).size() / n_steps
    pairs = list(zip(agg["block"], agg["collective"], strict=True))
    unit_count = np.array([per_unit.get(p, 0.0) for p in pairs])
    expected = np.array([expectations.expected(b, col) for b, col in pairs])
    block_compute = iv.grouped_union_length(
        compute["block"].fillna("").astype(str) + "|" + compute["phase"],
        compute["ts"],
        compute["end"],
    )
    # algbw over the kernels whose bytes and duration are known: Σ bytes / Σ duration. busbw
    # is that × the collective's bus factor, so the two stay in the nccl-tests ratio.
    with np.errstate(invalid="ignore", divide="ignore"):
        algbw = (agg["timed_bytes"] / agg["timed_dur"].where(agg["timed_dur"] > 0)) * 1e6 / 1e9
    factor = classify.bus_factors(agg["collective"], agg["group_size"])
    recompute = np.array(
        [
            block_compute.get(f"{b}|recompute", np.nan) / n_steps if p == "backward" else np.nan
            for b, p in zip(agg["block"], agg["phase"], strict=True)
        ],
        dtype=np.float64,
    )
    out = pd.DataFrame(
        {
            "rank": rank,
            "source": source,
            "block": agg["block"],
            "phase": agg["phase"],
            "collective": agg["collective"],
            "count_per_step": agg["count"] / n_steps,
            "unit_count_per_step": unit_count,
            "expected_per_step": expected,
            "excess": unit_count - expected,
            "time_us_per_step": agg["time"] / n_steps,
            "exposed_us_per_step": agg["exposed"] / n_steps,
            "bytes_per_step": agg["bytes"] / n_steps,
            "algbw_gbps": algbw,
            "busbw_gbps": algbw * factor,
            "compute_us_per_step": [
                block_compute.get(f"{b}|{p}", np.nan) / n_steps
                for b, p in zip(agg["block"], agg["phase"], strict=True)
            ],
            "recompute_us_per_step": recompute,
        }
    )
    return out.sort_values("exposed_us_per_step", ascending=False, kind="stable").reset_index(
        drop=True
    )[BLOCK_COLUMNS]


def _phase_table(lengths: pd.Series, rank: int | None, source: str) -> pd.DataFrame:
    if lengths.empty:
        return pd.DataFrame(columns=["rank", "source", "step", "phase", "compute_us"])
    keys = lengths.index.to_series().str.split("|", n=1, expand=True)
    return (
        pd.DataFrame(
            {
                "rank": rank,
                "source": source,
                "step": keys[0].astype(np.int64).to_numpy(),
                "phase": keys[1].to_numpy(),
                "compute_us": lengths.to_numpy(),
            }
        )
        .sort_values(["step", "phase"])
        .reset_index(drop=True)
    )


def _stream_roles(kernels: pd.DataFrame, collectives: pd.DataFrame) -> dict[int, str]:
    """Name each stream by what runs on it (stream ids are not stable across runs)."""
    roles: dict[int, str] = {}
    if kernels.empty:
        return roles
    by_stream = kernels.groupby("stream")
    for stream, group in by_stream:
        kinds = group["kind"].value_counts()
        if kinds.get("comm", 0) > 0:
            types = collectives.loc[collectives["stream"] == stream, "collective"].value_counts()
            roles[int(stream)] = f"{types.index[0]} (NCCL)" if len(types) else "communication"
        elif kinds.get("compute", 0) >= kinds.sum() / 2:
            roles[int(stream)] = "compute"
        else:
            roles[int(stream)] = "copy"
    compute_streams = [s for s, r in roles.items() if r == "compute"]
    if len(compute_streams) > 1:
        busiest = kernels[kernels["kind"] == "compute"].groupby("stream")["dur"].sum().idxmax()
        for s in compute_streams:
            roles[s] = "compute" if s == busiest else "compute (side)"
    return roles
