"""A run's own measurements (run.json: the un-profiled timed steps) as the headline every view
shows: one description line, figure cards, and the rows capture prints when a run ends.
Standard library only: `fsdp-trace capture` imports it with torch, typer and rich alone."""

from __future__ import annotations

from dataclasses import dataclass

from fsdp_trace import fmt
from fsdp_trace.fmt import CPU_SCALING
from fsdp_trace.runrecord import RunRecord, on_cpu
from fsdp_trace.vocab import MeshKind


@dataclass(frozen=True)
class Figure:
    """One headline figure: a label, its value as text, a line under it, and how it reads
    ("good", "warn", "bad" or "")."""

    key: str
    label: str
    value: str
    sub: str = ""
    tone: str = ""


def description(record: RunRecord) -> str:
    """ "gpt-small (169M params), batch 16 × seq 1024, 2 × cuda (nccl), AC 0/8 blocks"."""
    model, world = record.model, record.world
    params = f" ({model.params_total / 1e6:,.0f}M params)" if model.params_total else ""
    mesh = record.parallel.mesh
    hsdp = (
        f", HSDP {mesh.replicate} × {mesh.shard}"
        if mesh is not None and mesh.kind == MeshKind.HSDP
        else ""
    )
    blocks = model.n_blocks if model.n_blocks is not None else len(model.blocks)
    return (
        f"{model.name}{params}, batch {model.batch_size} × seq {model.seq_len}, "
        f"{world.world_size} × {world.device} ({world.backend}){hsdp}, "
        f"AC {len(record.parallel.ac_blocks)}/{blocks} blocks"
    )


# What a CPU (gloo) run shows for a scaling efficiency that run.json may still hold (captures
# before the capture stopped computing it on CPU): not a figure.


def figures(record: RunRecord) -> list[Figure]:
    """The capture's own measurements of the un-profiled steps, in reading order."""
    f = record.figures
    out: list[Figure] = []
    if f.step_time_ms is not None:
        n = f.step_time_ms.n
        out.append(
            Figure(
                "step_ms_unprofiled",
                "Step (un-profiled)",
                f"{f.step_time_ms.median:.2f} ms",
                f"median of {fmt.plural(n, 'timed step')} without the profiler (run.json): "
                "the training's own speed"
                if n
                else "median of the steps timed without the profiler (run.json)",
            )
        )
    if fmt.finite(f.tokens_per_s_per_gpu):
        out.append(
            Figure("tokens_per_s_per_gpu", "Tokens/s per GPU", f"{f.tokens_per_s_per_gpu:,.0f}")
        )
    if fmt.finite(f.mfu):
        sub = (
            f"{f.achieved_tflops_per_gpu:.0f} TFLOP/s per GPU"
            if fmt.finite(f.achieved_tflops_per_gpu)
            else "model FLOPs utilization"
        )
        out.append(Figure("mfu", "MFU", fmt.fraction_pct(f.mfu), sub))
    elif f.omitted("MFU omitted"):
        out.append(Figure("mfu", "MFU", fmt.DASH, f.omitted("MFU omitted").removeprefix("MFU ")))
    if fmt.finite(f.scaling_efficiency) and on_cpu(record):
        out.append(Figure("scaling_efficiency", "Scaling efficiency", fmt.DASH, CPU_SCALING))
    elif fmt.finite(f.scaling_efficiency):
        sub = (
            f"vs 1 GPU at {f.baseline_tokens_per_s:,.0f} tokens/s"
            if fmt.finite(f.baseline_tokens_per_s)
            else "vs the 1-GPU baseline"
        )
        out.append(
            Figure(
                "scaling_efficiency",
                "Scaling efficiency",
                fmt.fraction_pct(f.scaling_efficiency),
                sub,
            )
        )
    if fmt.finite(f.peak_allocated_gib):
        sub = "allocated"
        if fmt.finite(f.peak_reserved_gib):
            sub += f"; {f.peak_reserved_gib:.2f} GiB reserved"
        if f.num_alloc_retries:
            sub += f"; {fmt.plural(f.num_alloc_retries, 'allocator retry', 'allocator retries')}"
        out.append(
            Figure(
                "peak_memory",
                "Peak memory",
                fmt.gib(f.peak_allocated_gib),
                sub,
                "warn" if f.num_alloc_retries else "",
            )
        )
    elif fmt.finite(f.peak_rss_gib):
        out.append(
            Figure("peak_memory", "Peak memory", fmt.gib(f.peak_rss_gib), "resident set (CPU)")
        )
    return out


# Every row label `summary_rows` uses, to align the text column.
SUMMARY_LABELS = (
    "run",
    "step time",
    "tokens/s/GPU",
    "MFU",
    "scaling efficiency",
    "peak memory",
    "notice",
)


def summary_rows(record: RunRecord) -> list[tuple[str, str]]:
    """(label, text) rows capture prints when a run ends, in reading order; notices last."""
    f = record.figures
    rows = [("run", description(record))]
    stats = f.step_time_ms
    if stats is not None:
        spread = ""
        if stats.p10 is not None and stats.p90 is not None:
            spread = f" (p10-p90 {stats.p10:.2f}-{stats.p90:.2f}"
            if stats.min is not None and stats.max is not None:
                spread += f", min-max {stats.min:.2f}-{stats.max:.2f}"
            spread += f", {fmt.plural(stats.n, 'step')})"
        rows.append(("step time", f"{stats.median:.2f} ms median{spread}"))
        rows.append(("tokens/s/GPU", fmt.num(f.tokens_per_s_per_gpu, ",.0f")))
        if f.mfu is not None:
            peak = record.environment.dense_bf16_peak_tflops
            rows.append(
                (
                    "MFU",
                    f"{f.mfu:.3f} ({fmt.num(f.achieved_tflops_per_gpu, '.1f')} TFLOP/s per GPU "
                    f"of {fmt.num(peak, 'g')} dense bf16)",
                )
            )
        else:
            why = f.omitted("MFU omitted")
            rows.append(("MFU", why.removeprefix("MFU ") if why else "omitted"))
        if f.scaling_efficiency is not None and on_cpu(record):
            rows.append(("scaling efficiency", CPU_SCALING))
        elif f.scaling_efficiency is not None:
            rows.append(
                (
                    "scaling efficiency",
                    f"{f.scaling_efficiency:.3f} vs {f.baseline_dir} "
                    f"({fmt.num(f.baseline_tokens_per_s, ',.0f')} tokens/s on 1 GPU)",
                )
            )
    else:
        rows.append(("step time", "not measured (--timed-steps 0)"))
    if f.peak_allocated_gib is not None:
        memory = (
            f"{fmt.gib(f.peak_allocated_gib)} allocated, {fmt.gib(f.peak_reserved_gib)} "
            "reserved (max over ranks)"
        )
        if f.num_alloc_retries is not None:
            retries = fmt.plural(f.num_alloc_retries, "allocator retry", "allocator retries")
            memory += f"; {retries} in the timed steps"
        rows.append(("peak memory", memory))
    elif f.peak_rss_gib is not None:
        rows.append(("peak memory", f"{fmt.gib(f.peak_rss_gib)} RSS (max over ranks)"))
    rows += [("notice", n) for n in f.notices if not n.startswith("MFU omitted")]
    return rows
