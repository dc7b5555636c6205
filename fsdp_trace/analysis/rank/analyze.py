"""One trace in, one RankAnalysis out: step windows, overlap per step, and every collective
attributed to its FSDP2 unit and phase. Pure: no printing, no files."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fsdp_trace.analysis import classify
from fsdp_trace.analysis import intervals as iv
from fsdp_trace.analysis.rank import context, fsdp1, hostside, kernel_figures, setup
from fsdp_trace.analysis.rank import steps as steps_mod
from fsdp_trace.analysis.rank.blocks import block_table, empty_frame, phase_table
from fsdp_trace.analysis.rank.context import CpuContext, EventRows
from fsdp_trace.analysis.rank.cpu_collectives import analyze_cpu_trace
from fsdp_trace.analysis.read.trace import MISSING, Trace, pg_sizes, trace_meta
from fsdp_trace.analysis.results import COLLECTIVE_COLUMNS, STEP_COLUMNS, RankAnalysis, kept_columns
from fsdp_trace.analysis.table import array_of, one_object_each
from fsdp_trace.vocab import UNATTRIBUTED, Collective, Device, Kind, Phase, Source

BREAKDOWN_FROM = STEP_COLUMNS.index("model_compute_us")  # the step breakdown's columns


# The kernel table's columns `_collectives` reads, and those of its compute kernels that the
# block and phase tables read.
_COMM_COLUMNS = ("step", "ts", "end", "dur", "stream", "correlation", "name", "phase")
_COMPUTE_COLUMNS = ("step", "ts", "end", "block", "phase")
# The events' columns of the NCCL kernels that their collectives read (names, NCCL arguments).
_NCCL_COLUMNS = (
    "name",
    "collective_name",
    "in_nelems",
    "out_nelems",
    "dtype",
    "group_size",
    "pg_name",
    "pg_desc",
    "pg_ranks",
    "seq",
)
# A kind's name by its number (the kernel table names kinds).
_KIND_NAMES = np.array(
    [classify.KIND_NAMES.get(i) for i in range(max(classify.KIND_NAMES) + 1)], dtype=object
)


def _kind_names(kinds: np.ndarray) -> np.ndarray | pd.Series:
    """Each kind's name, typed as a column of names is (an empty one too: pandas types the
    strings of a mapped column, not an empty object array)."""
    if kinds.size:
        return _KIND_NAMES[kinds]
    return pd.Series(kinds).map(classify.KIND_NAMES)


def _text_column(events: pd.DataFrame, name: str, rows: np.ndarray) -> np.ndarray:
    """A sparse text column of `events` at `rows` (None where absent or not loaded)."""
    if name not in events:
        return np.full(rows.size, None, dtype=object)
    return np.asarray(events[name].array[rows], dtype=object)


def _rows_of(events: pd.DataFrame, rows: np.ndarray, columns: tuple[str, ...]) -> EventRows:
    """The columns of `events.loc[rows, columns]` (each a Series of that frame's index and
    dtype) by name: `.loc` with a mask and a column list costs ~4x more on a small rank's
    events, and a frame of them ~0.2 ms more to make and ~7 µs a column read, fixed costs
    paid once per rank."""
    index = events.index[rows]
    return {c: pd.Series(events[c].array[rows], index=index, name=c, copy=False) for c in columns}


def device_names(trace: Trace) -> list[str]:
    """The GPU names in the trace's deviceProperties (rule 8 infers NVLink from SXM parts)."""
    return [
        str(p["name"]) for p in trace.device_properties if isinstance(p, dict) and p.get("name")
    ]


def _link_launches(events: pd.DataFrame, kinds: np.ndarray, gpu_idx: np.ndarray) -> np.ndarray:
    """Row of the launch event (same `correlation`) of each GPU event, or -1."""
    correlation = array_of(events, "correlation")
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


@dataclass
class CpuSlices:
    """A trace's CPU-thread slices (operators and user annotations), kept beside its analysis
    for the Perfetto view, so that writing it never parses the trace again. Compact columns,
    in trace order: about 30 bytes a slice."""

    pid: np.ndarray  # int64
    tid: np.ndarray  # int64
    ts: np.ndarray  # float64, µs
    end: np.ndarray  # float64, µs
    kind: np.ndarray  # classify kind: CPU_OP or ANNOTATION
    name: np.ndarray  # codes into `names` (-1: none)
    names: list[str]
    thread_names: dict[tuple[int, int], str]

    @classmethod
    def of(cls, trace: Trace, kinds: np.ndarray) -> CpuSlices:
        events = trace.events
        rows = np.flatnonzero((kinds == classify.CPU_OP) | (kinds == classify.ANNOTATION))
        names = events["name"].array
        return cls(
            pid=array_of(events, "pid")[rows],
            tid=array_of(events, "tid")[rows],
            ts=array_of(events, "ts")[rows],
            end=array_of(events, "end")[rows],
            kind=kinds[rows],
            name=names.codes[rows],
            names=[str(c) for c in names.categories],
            thread_names=dict(trace.thread_names),
        )


_keep_cpu_slices = False


@contextmanager
def keeping_cpu_slices(keep: bool = True) -> Iterator[None]:
    """Within it, every analysis made in this process (and in workers forked from it) keeps
    its trace's `CpuSlices` as the attribute `cpu_slices` (the Perfetto view reads them).
    An attribute, not a field: never stored in the cache."""
    global _keep_cpu_slices
    before, _keep_cpu_slices = _keep_cpu_slices, keep
    try:
        yield
    finally:
        _keep_cpu_slices = before


def analyze_trace(trace: Trace, source: str = Source.TRACE) -> RankAnalysis:
    """Everything per step, per collective and per block for one rank's trace."""
    kinds = classify.event_kinds(trace.events)
    result = kernel_figures.attach(_analyze(trace, source, kinds))
    if _keep_cpu_slices:
        result.cpu_slices = CpuSlices.of(trace, kinds)
    return result


def _analyze(trace: Trace, source: str, kinds: np.ndarray) -> RankAnalysis:
    source = Source(source).value  # a plain string in every table (and in the cache)
    events = trace.events
    notices: list[str] = list(trace.notices)
    gpu_idx = np.flatnonzero(
        classify.kind_mask(kinds, classify.COMM, classify.COMPUTE, classify.MEMCPY, classify.MEMSET)
    )
    if not classify.kind_mask(kinds[gpu_idx], classify.COMM, classify.COMPUTE).any():
        return analyze_cpu_trace(trace, kinds, source)

    cpu_mask = classify.kind_mask(kinds, classify.CPU_OP, classify.ANNOTATION, classify.LAUNCH)
    cpu = _rows_of(events, np.flatnonzero(cpu_mask), CpuContext.COLUMNS)
    cpu_steps = steps_mod.cpu_steps(events, kinds, notices)
    launch_row = _link_launches(events, kinds, gpu_idx)
    linked = launch_row >= 0
    launch_ts = np.where(linked, array_of(events, "ts")[np.maximum(launch_row, 0)], np.nan)
    step_of = _assign_steps(cpu_steps, linked, launch_ts, notices)
    keep = step_of >= 0
    dropped = int((~keep).sum())
    if dropped:
        notices.append(
            f"{dropped} GPU events launched outside the profiled steps (or with no launch "
            "in the trace) were left out"
        )
    kidx = gpu_idx[keep]
    # The kept GPU events' columns as arrays (the kernel table's, in its order); the frames
    # are made once each at the end (a column set on a frame, a mask or a drop cost a pandas
    # step each).
    ts_arr, end_arr = array_of(events, "ts")[kidx], array_of(events, "end")[kidx]
    kind_arr = kinds[kidx]
    kc: dict[str, np.ndarray] = {
        "ts": ts_arr,
        "end": end_arr,
        "dur": array_of(events, "dur")[kidx],
        "device": array_of(events, "pid")[kidx],
        "stream": array_of(events, "tid")[kidx],
        "kind": kind_arr,
        "name": events["name"].array[kidx],
        "step": step_of[keep],
        "correlation": array_of(events, "correlation")[kidx],
        # Launch shape (JSON text): tells apart kernels of one name (rule 7).
        "grid": _text_column(events, "grid", kidx),
        "block_dim": _text_column(events, "block", kidx),
    }
    k_step = kc["step"]
    if cpu_steps.empty or not linked.any():
        windows = pd.DataFrame(
            {"step": [0], "start": [iv.nan_min(ts_arr)], "end": [iv.nan_max(end_arr)]}
        )
    else:
        windows = steps_mod.gpu_windows(
            cpu_steps, k_step, ts_arr, end_arr, setup.optimizer_ends(cpu, cpu_steps)
        )

    is_comm = kind_arr == classify.COMM
    is_compute = kind_arr == classify.COMPUTE
    cover = Coverage.of(ts_arr, end_arr, kind_arr)

    # Context of every kept GPU event's launch: block, phase, FSDP's own work.
    cpu_ctx = CpuContext.build(cpu)
    launch = _LaunchContext.of(launch_row[keep], events, cpu_ctx)
    kc["block"] = launch.block
    kc["phase"] = launch.phase
    # FSDP's own copy/cast kernels: launched inside any FSDP2 label (copy-in/out, chunk_cat,
    # casts, gradient accumulation); the units' compute runs between the labels.
    kc["fsdp"] = launch.inside_label & is_compute
    # The CPU time of each launch, and for FSDP's own kernels the unit of the label they
    # were launched in (the unit being gathered or reduced): what a replay of the step reads.
    kc["launch_ts"] = launch.time
    label_unit = cpu_ctx.labels.fqn_at(launch.chain[:, 0])
    kc["unit"] = np.where(kc["fsdp"], label_unit, kc["block"])

    # Steps.
    starts = array_of(windows, "start", np.float64)
    ends = array_of(windows, "end", np.float64)
    step_us = ends - starts
    figures = cover.in_windows(starts, ends)
    # The NCCL kernels' events, the columns their collectives read, sliced once.
    comm_events = _rows_of(
        events, kidx[is_comm], tuple(c for c in _NCCL_COLUMNS if c in events.columns)
    )
    coll = classify.collective_types(comm_events) if is_comm.any() else np.array([], dtype=object)
    comm_ts, comm_end = ts_arr[is_comm], end_arr[is_comm]
    ag = coll == Collective.ALL_GATHER
    rs = coll == Collective.REDUCE_SCATTER
    ag_u = iv.union(comm_ts[ag], comm_end[ag])
    rs_u = iv.union(comm_ts[rs], comm_end[rs])
    is_recompute = is_compute & (kc["phase"] == Phase.RECOMPUTE)
    recompute_us = _windowed_lengths(
        iv.union(ts_arr[is_recompute], end_arr[is_recompute]), starts, ends
    )

    def count(kind: int) -> np.ndarray:
        """Per window, its kernels of `kind`."""
        per_step = iv.value_counts(k_step[kind_arr == kind])
        return np.array([per_step.get(s, 0) for s in windows["step"].tolist()], dtype=np.int64)

    idle_us = step_us - figures["busy_us"]
    with np.errstate(invalid="ignore", divide="ignore"):
        step_frame = pd.DataFrame(
            {
                "rank": trace.rank,
                "source": source,
                "step": array_of(windows, "step"),
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
                # The breakdown's columns (filled in by `kernel_figures` and the run).
                **{c: np.full(starts.size, np.nan) for c in STEP_COLUMNS[BREAKDOWN_FROM:]},
            }
        )
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

    fsdp1_units = None
    if cpu_ctx.label_table.empty and is_comm.any():  # no FSDP2 labels: FSDP1's, by order
        fsdp1_units = fsdp1.attribute(
            cpu, cpu_ctx.keys, cpu_steps, launch.thread[is_comm], launch.time[is_comm]
        )
    collectives = _collectives(
        trace,
        comm_events,
        {c: kc[c][is_comm] for c in _COMM_COLUMNS},
        coll,
        cpu_ctx,
        launch.chain[is_comm],
        cover.compute,
        source,
        notices,
        fsdp1_units,
    )
    k_compute = {c: kc[c][is_compute] for c in _COMPUTE_COLUMNS}
    blocks = block_table(collectives, k_compute, len(windows), trace.rank, source)
    compute_keys = [k_compute["step"], k_compute["phase"]]
    phase_rows, phase_us = iv.union_length_by_keys(compute_keys, k_compute["ts"], k_compute["end"])
    exposed_start, exposed_end = cover.exposed
    exposed_step = steps_mod.step_of_time(windows, exposed_start, "start", "end")
    exposed = pd.DataFrame(
        kept_columns(
            "exposed", {"start_us": exposed_start, "end_us": exposed_end, "step": exposed_step}
        )
    )
    signals = setup.signals(cpu, cpu_ctx, cpu_steps, kc, launch.thread, cover.busy, cover.compute)
    host = hostside.host_time(
        cpu, kinds[cpu_mask], cpu_ctx, kc, launch.thread, windows, cover.busy, cpu_steps
    )
    kernels = pd.DataFrame({**kc, "kind": _kind_names(kind_arr)}, copy=False)
    return RankAnalysis(
        rank=trace.rank,
        path=trace.path,
        source=source,
        device=Device.GPU.value,
        steps=step_frame,
        collectives=collectives,
        blocks=blocks,
        kernel_table=kernels,
        exposed=exposed,
        compute_phases=phase_table(
            *(key[phase_rows] for key in compute_keys), phase_us, trace.rank, source
        ),
        fsdp=cpu_ctx.facts(cpu_steps),
        streams=_stream_roles(kernels, collectives),
        notices=notices,
        meta=trace_meta(trace, cpu_ctx.compiled_regions, device_names(trace), cpu_ctx.unit_names),
        setup=signals.to_dict(),
        host=host.to_dict(),
    )


# `_LaunchContext.phase`'s names, by the code it selects.
_PHASE_NAMES = np.array(
    [
        Phase.UNATTRIBUTED.value,
        Phase.RECOMPUTE.value,
        Phase.BACKWARD.value,
        Phase.OPTIMIZER.value,
        Phase.FORWARD.value,
    ],
    dtype=object,
)


@dataclass
class _LaunchContext:
    """Per GPU event: the FSDP2 labels around its launch, its unit's window and phase."""

    chain: np.ndarray  # label forest indices, innermost first (-1 padded)
    block: np.ndarray
    phase: np.ndarray
    inside_label: np.ndarray
    time: np.ndarray  # the launch's CPU time (NaN: no launch in the trace)
    thread: np.ndarray  # the launching thread's code in the CPU context's keys (-1: none)

    @classmethod
    def of(cls, rows: np.ndarray, events: pd.DataFrame, ctx: CpuContext) -> _LaunchContext:
        has_launch = rows >= 0
        thread = np.full(rows.size, -1, dtype=np.int64)
        time = np.full(rows.size, -1.0)
        safe = rows[has_launch]
        thread[has_launch] = ctx.keys.code(
            array_of(events, "pid")[safe], array_of(events, "tid")[safe]
        )
        time[has_launch] = array_of(events, "ts")[safe]
        in_recompute = ctx.recompute.contains(thread, time) & has_launch
        in_autograd = ctx.autograd.contains(thread, time) & has_launch
        in_optimizer = ctx.optimizer.contains(thread, time) & has_launch
        chain = ctx.labels.chain(ctx.labels.innermost(ctx.keys, thread, time))
        window_idx = ctx.windows.innermost(ctx.keys, thread, time)
        in_backward_window = ctx.windows.kind_in({Phase.BACKWARD.value}, window_idx)
        phase_label = ctx.labels.first_of(chain, context.FORWARD_LABELS | context.BACKWARD_LABELS)
        backward = (
            ctx.labels.kind_in(context.BACKWARD_LABELS, phase_label)
            | in_autograd
            | in_backward_window
        )
        # The first that holds, in this order (no launch: no context), as one shared name a
        # phase: text of a row each would be a string a kernel in every table made of them.
        phase = _PHASE_NAMES[
            np.select([~has_launch, in_recompute, backward, in_optimizer], [0, 1, 2, 3], default=4)
        ]
        return cls(
            chain=chain,
            block=ctx.windows.fqn_at(window_idx),
            phase=phase,
            inside_label=(chain[:, 0] >= 0) & has_launch,
            time=np.where(has_launch, time, np.nan),
            thread=thread,
        )


def _collectives(
    trace: Trace,
    comm_events: EventRows,
    comm: dict[str, np.ndarray],
    coll: np.ndarray,
    cpu_ctx: CpuContext,
    chain: np.ndarray,
    compute_u: iv.Intervals,
    source: str,
    notices: list[str],
    fsdp1_units: tuple[np.ndarray, np.ndarray] | None = None,
) -> pd.DataFrame:
    """One row per communication kernel (`comm_events`: their trace events with the NCCL args;
    `comm`: their columns of the kernel table, `_COMM_COLUMNS`): unit, phase, bytes,
    bandwidth, exposed share."""
    n = len(comm_events["name"])
    if n == 0:
        return empty_frame(COLLECTIVE_COLUMNS)
    labels = cpu_ctx.labels
    ag = labels.first_of(chain, {context.ALL_GATHER})
    rs = labels.first_of(chain, {context.REDUCE})
    hooks = labels.first_of(chain, context.FORWARD_LABELS | context.BACKWARD_LABELS)
    # All-gathers by their `FSDP::all_gather (unit)`; gradient reductions (reduce-scatter and
    # HSDP's all-reduce) by `FSDP::post_backward_reduce (unit)`; torch 2.4 has no all_gather
    # label: the enclosing hook's unit.
    block = np.where(
        coll == Collective.ALL_GATHER,
        labels.fqn_at(ag),
        np.where(
            (coll == Collective.REDUCE_SCATTER) | (coll == Collective.ALL_REDUCE),
            labels.fqn_at(rs),
            None,
        ),
    )
    block = np.where(pd.isna(block), labels.fqn_at(hooks), block)
    if fsdp1_units is not None:  # FSDP1: its units by the order of its hooks
        block = np.where(pd.isna(block), fsdp1_units[0], block)
    prefetch = labels.first_of(chain, context.PREFETCH_LABELS)
    issuer = labels.first_of(chain, context.ISSUER_LABELS)
    issued_by = labels.fqn_at(issuer)
    issued_by = np.where(pd.isna(issued_by), block, issued_by)

    def col(name: str, default):
        return array_of(comm_events, name) if name in comm_events else np.full(n, default)

    in_n = col("in_nelems", MISSING).astype(np.float64)
    out_n = col("out_nelems", MISSING).astype(np.float64)
    elem = (
        classify.dtype_bytes(comm_events["dtype"])
        if "dtype" in comm_events
        else np.zeros(n, dtype=np.int64)
    )
    nelems = np.maximum(in_n, out_n)
    nbytes = np.where((nelems >= 0) & (elem > 0), nelems * elem, np.nan)
    group = _group_sizes(trace, comm_events, col("group_size", MISSING), notices)
    dur = comm["dur"]
    with np.errstate(divide="ignore", invalid="ignore"):
        algbw = np.where(dur > 0, nbytes / (dur * 1e-6) / 1e9, np.nan)
    factor = classify.bus_factors(coll, group)
    phase = comm["phase"].copy()
    hook_kind = labels.kind_at(hooks)
    not_recompute = phase != Phase.RECOMPUTE
    phase = np.where(
        np.isin(hook_kind, list(context.FORWARD_LABELS)) & not_recompute, Phase.FORWARD.value, phase
    )
    phase = np.where(
        np.isin(hook_kind, list(context.BACKWARD_LABELS)) & not_recompute,
        Phase.BACKWARD.value,
        phase,
    )
    # Without a hook label (FSDP1, labels lost) a reduce-scatter is still a gradient
    # reduction: backward, never the forward a missing label would leave.
    unlabeled = pd.isna(hook_kind) | (hooks < 0)
    phase = np.where(
        unlabeled & (coll == Collective.REDUCE_SCATTER) & (phase == Phase.FORWARD),
        Phase.BACKWARD.value,
        phase,
    )
    if fsdp1_units is not None:
        phase = np.where(pd.isna(fsdp1_units[1]), phase, fsdp1_units[1])
    # The frame of COLLECTIVE_COLUMNS at once, the cross-rank columns NaN until the match (a
    # reindex and reset_index after cost ~0.4 ms a rank).
    no_match = np.full(n, np.nan)
    frame = pd.DataFrame(
        {
            "rank": trace.rank,
            "source": source,
            "step": comm["step"],
            "collective": coll,
            "block": block,
            "phase": one_object_each(np.asarray(phase, dtype=object)),  # one `np.where` each
            "issued_by": issued_by,
            "prefetched": prefetch >= 0,
            "start_us": comm["ts"],
            "end_us": comm["end"],
            "dur_us": dur,
            "exposed_us": iv.split_uncovered(comm["ts"], comm["end"], compute_u),
            "bytes": nbytes,
            "group_size": group,
            "algbw_gbps": algbw,
            "busbw_gbps": algbw * factor,
            "dtype": col("dtype", None),
            "pg_name": col("pg_name", None),
            "pg_desc": col("pg_desc", None),
            "pg_ranks": comm_events["pg_ranks"].array if "pg_ranks" in comm_events else None,
            "seq": col("seq", MISSING),
            "stream": comm["stream"],
            "correlation": comm["correlation"],
            "kernel": pd.Series(comm["name"], copy=False).astype(str).to_numpy(),
            "transfer_us": no_match,
            "wait_us": no_match.copy(),
            "exposed_transfer_us": no_match.copy(),
        },
        columns=COLLECTIVE_COLUMNS,
    )
    # Filled by pandas: a column of no block at all stays of object dtype, as it always was.
    frame["block"] = frame["block"].fillna(UNATTRIBUTED)
    return frame


def _group_sizes(
    trace: Trace, comm_events: EventRows, stated: np.ndarray, notices: list[str]
) -> np.ndarray:
    """Each kernel's group size: its `Group size` argument, else its process group's size in
    pg_config. Where the two disagree the group's member list wins, and a size larger than
    the trace's world is never taken (left unknown); each said in a notice."""
    stated = stated.astype(np.float64)
    configured = _configured_group_sizes(trace, comm_events, len(stated))
    given = stated > 0
    clash = given & ~np.isnan(configured) & (stated != configured)
    if clash.any():
        i = int(np.flatnonzero(clash)[0])
        notices.append(
            f"{int(clash.sum())} NCCL kernels state `Group size` {stated[i]:.0f} where the "
            f"trace's pg_config lists {configured[i]:.0f} ranks in their process group: the "
            "group's member list is used (busbw and the mesh follow it)"
        )
    group = np.where(given & ~clash, stated, configured)
    unknown = int(np.isnan(group).sum())
    if unknown:
        notices.append(
            f"{unknown} NCCL kernels name no `Group size` and their process group is not in the "
            "trace's pg_config: their bus bandwidth is left empty (never assumed from the world "
            "size, which is wrong for HSDP and tensor-parallel groups)"
        )
    world = trace.world_size
    if isinstance(world, int) and world > 0:
        beyond = group > world
        if beyond.any():
            shown = f"{group[beyond][0]:.0f}"
            notices.append(
                f"{int(beyond.sum())} NCCL kernels state `Group size` {shown}, more than the "
                f"world of {world}: left unknown (their bus bandwidth too)"
            )
            group = np.where(beyond, np.nan, group)
    return group


def _configured_group_sizes(trace: Trace, comm_events: EventRows, n: int) -> np.ndarray:
    """Group size of kernels that carry no `Group size` arg: their process group's size in
    the trace's `distributedInfo.pg_config` (by `Process Group Name`); NaN when unknown. Never
    the world size: an HSDP or TP group is smaller, and busbw would be wrong."""
    sizes = pg_sizes(trace.distributed)
    if not sizes or "pg_name" not in comm_events:
        return np.full(n, np.nan)
    names = comm_events["pg_name"].array
    if isinstance(names, pd.Categorical):  # each name looked up once; code -1 (none): "nan"
        known = [*names.categories.tolist(), np.nan]
        return np.array([sizes.get(str(v), np.nan) for v in known], dtype=np.float64)[names.codes]
    names = np.asarray(names, dtype=object)
    return np.array([sizes.get(str(v), np.nan) if v is not None else np.nan for v in names])


def most_frequent(values: np.ndarray) -> object | None:
    """`value_counts().index[0]`: the most frequent value that is not missing, the first seen
    among equals (None for none)."""
    values = values[pd.notna(values)]
    if values.size == 0:
        return None
    codes, uniques = pd.factorize(values)  # in order of first appearance, as value_counts
    counts = np.bincount(codes, minlength=len(uniques))
    return uniques[iv.descending_order(counts, kind="quicksort")[0]]


def _stream_roles(kernels: pd.DataFrame, collectives: pd.DataFrame) -> dict[int, str]:
    """Name each stream by what runs on it (stream ids are not stable across runs)."""
    roles: dict[int, str] = {}
    if kernels.empty:
        return roles
    # Per stream (ascending, as groupby gives them): its kernels, NCCL and compute ones.
    streams, code = iv.unique(array_of(kernels, "stream"), return_inverse=True)
    kind = array_of(kernels, "kind")
    total = np.bincount(code, minlength=streams.size)
    comm = np.bincount(code, weights=kind == Kind.COMM, minlength=streams.size)
    compute = np.bincount(code, weights=kind == Kind.COMPUTE, minlength=streams.size)
    coll_stream = array_of(collectives, "stream")
    coll_type = array_of(collectives, "collective")
    for i, stream in enumerate(streams.tolist()):
        if comm[i] > 0:
            busiest = most_frequent(coll_type[coll_stream == stream])
            roles[int(stream)] = f"{busiest} (NCCL)" if busiest is not None else "communication"
        elif compute[i] >= total[i] / 2:
            roles[int(stream)] = Kind.COMPUTE.value
        else:
            roles[int(stream)] = "copy"
    compute_streams = [s for s, r in roles.items() if r == Kind.COMPUTE]
    if len(compute_streams) > 1:
        is_compute = kind == Kind.COMPUTE
        seen, where = iv.unique(code[is_compute], return_inverse=True)
        dur = array_of(kernels, "dur", np.float64)[is_compute]
        busy = iv.group_sum(where.astype(np.int64), dur, seen.size)  # as groupby sums
        busiest = streams[seen[int(np.argmax(busy))]]
        for s in compute_streams:
            roles[s] = Kind.COMPUTE.value if s == busiest else f"{Kind.COMPUTE} (side)"
    return roles
