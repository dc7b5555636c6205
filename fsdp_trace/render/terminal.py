"""The rich terminal summary of an analysis: per rank, then per block (worst first)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fsdp_trace.analysis.results import Analysis


def _ms(us: float | None) -> str:
    return "—" if us is None or (isinstance(us, float) and math.isnan(us)) else f"{us / 1e3:.2f}"


def _pct(value: float | None) -> str:
    return (
        "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.1f}"
    )


def _spread(stat: dict[str, float] | None, fmt) -> str:
    if not stat:
        return "—"
    if stat["min"] == stat["max"]:
        return fmt(stat["median"])
    return f"{fmt(stat['median'])} [dim]({fmt(stat['min'])}–{fmt(stat['max'])})[/]"


def run_figures(run: dict[str, Any]) -> list[tuple[str, str]]:
    """The capture's own measurements (un-profiled steps), for the header."""
    figures = run.get("figures", {})
    items: list[tuple[str, str]] = []
    step = figures.get("step_time_ms")
    if step:
        items.append(("step (un-profiled)", f"{step['median']:.2f} ms"))
    if figures.get("tokens_per_s_per_gpu"):
        items.append(("tokens/s/GPU", f"{figures['tokens_per_s_per_gpu']:,.0f}"))
    if figures.get("mfu") is not None:
        items.append(("MFU", f"{100 * figures['mfu']:.1f} %"))
    if figures.get("scaling_efficiency") is not None:
        items.append(("scaling efficiency", f"{100 * figures['scaling_efficiency']:.1f} %"))
    if figures.get("peak_allocated_gib") is not None:
        items.append(("peak memory", f"{figures['peak_allocated_gib']:.1f} GiB allocated"))
    return items


def make_console() -> Console:
    """Wide enough for the block table when output is piped (rich assumes 80 columns)."""
    import sys

    return Console() if sys.stdout.isatty() else Console(width=160)


def render(analysis: Analysis, console: Console | None = None, top: int = 15) -> None:
    console = console or make_console()
    run = analysis.run
    title = ", ".join(analysis.inputs)
    console.print(f"[bold]fsdp-trace analyze[/] {title}")
    if run:
        model = run.get("model", {})
        world = run.get("world", {})
        parallel = run.get("parallel", {})
        name = model.get("preset") or model.get("factory", "?")
        console.print(
            f"model {name} ({model.get('params_total', 0) / 1e6:.0f}M params), "
            f"batch {model.get('batch_size')} x seq {model.get('seq_len')}, "
            f"{world.get('world_size')} x {world.get('device')}, "
            f"AC {len(parallel.get('ac_blocks', []))}/{model.get('n_blocks')} blocks"
        )
        figures = run_figures(run)
        if figures:
            console.print("  ".join(f"{k}: [bold]{v}[/]" for k, v in figures))
    for notice in notice_lines(analysis):
        console.print(f"[yellow]notice:[/] {escape(notice)}")

    console.print(rank_table(analysis))

    for item in analysis.distortion():
        console.print(
            f"rank {item['rank']}: the detailed step (record_shapes + with_stack) took "
            f"{_ms(item['detailed_step_us'])} ms vs {_ms(item['timing_median_step_us'])} ms "
            f"timing median ({item['slowdown_pct']:+.0f} %: profiler distortion)"
        )

    blocks = analysis.blocks
    blocks = blocks[blocks["source"] != "detailed"] if len(blocks) else blocks
    if len(blocks):
        console.print(block_table(blocks, top))
    if analysis.crossrank is not None and not analysis.crossrank.empty:
        console.print(crossrank_table(analysis.crossrank))
    render_findings(analysis.findings, console)
    if analysis.hta is not None and len(analysis.hta):
        hta = Table(
            title="Cross-check with HTA get_comm_comp_overlap (same trace)", title_justify="left"
        )
        for header in (
            "rank",
            "HTA overlap %",
            "fsdp-trace, HTA's rules %",
            "fsdp-trace, its steps %",
        ):
            hta.add_column(header, justify="right")
        for row in analysis.hta.itertuples():
            hta.add_row(
                str(row.rank),
                _pct(row.hta_pct),
                _pct(row.ours_hta_rules_pct),
                _pct(row.ours_steps_pct),
            )
        console.print(hta)


def _ranks(numbers: list[int]) -> str:
    return ("ranks " if len(numbers) > 1 else "rank ") + ", ".join(map(str, numbers))


def _owners(traces: list) -> str:
    """Who a notice came from: 'rank 1', 'ranks 0, 1 (timing and detailed traces)',
    'rank 1; rank 0 (detailed)', or file names where ranks cannot tell traces apart."""
    numbers = [r.rank for r in traces]
    if None in numbers or len({(r.rank, r.source) for r in traces}) < len(traces):
        return ", ".join(dict.fromkeys(Path(r.path).name for r in traces))
    plain = sorted({r.rank for r in traces if r.source != "detailed"})
    detailed = sorted({r.rank for r in traces if r.source == "detailed"})
    if plain and plain == detailed:
        return f"{_ranks(plain)} (timing and detailed traces)"
    parts = [_ranks(plain)] if plain else []
    parts += [f"{_ranks(detailed)} (detailed)"] if detailed else []
    return "; ".join(parts)


def notice_lines(analysis: Analysis) -> list[str]:
    """Notices of the run (run.json's figures.notices), of the analysis, and of each trace,
    each trace's prefixed by who gave it; one line for a notice that several traces share."""
    figures = (analysis.run or {}).get("figures") or {}
    lines = [f"run.json: {n}" for n in figures.get("notices") or []]
    lines += list(analysis.notices)
    owners: dict[str, list] = {}
    for r in analysis.ranks + analysis.detailed:
        for notice in dict.fromkeys(r.notices):
            owners.setdefault(notice, []).append(r)
    lines += [f"{_owners(traces)}: {notice}" for notice, traces in owners.items()]
    return list(dict.fromkeys(lines))


def rank_table(analysis: Analysis) -> Table:
    """Per rank: the medians and spreads of the headline figures; recompute % when the
    steps recompute (activation checkpointing)."""
    table = Table(
        title="Per rank (median and min–max over the profiled steps)", title_justify="left"
    )
    steps = analysis.steps
    with_recompute = bool(len(steps)) and bool(
        (pd.to_numeric(steps["recompute_us"], errors="coerce").fillna(0) > 0).any()
    )
    headers = ["rank", "steps", "step ms", "exposed comm %", "overlap %", "comm ms"]
    headers += (
        ["compute ms", "recompute %", "idle %"] if with_recompute else ["compute ms", "idle %"]
    )
    for header in headers:
        table.add_column(header, justify="right")
    for r in analysis.ranks:
        s = r.summary()
        cells = [
            str(r.rank),
            str(s["n_steps"]),
            _spread(s["step_us"], lambda v: f"{v / 1e3:.2f}"),
            _spread(s["exposed_pct"], lambda v: f"{v:.1f}"),
            _spread(s["overlap_pct"], lambda v: f"{v:.1f}"),
            _spread(s["comm_us"], lambda v: f"{v / 1e3:.2f}"),
            _spread(s["compute_us"], lambda v: f"{v / 1e3:.2f}"),
        ]
        if with_recompute:
            cells.append(_spread(s.get("recompute_pct"), lambda v: f"{v:.1f}"))
        cells.append(_spread(s["idle_pct"], lambda v: f"{v:.1f}"))
        table.add_row(*cells)
    return table


def block_table(blocks: pd.DataFrame, top: int) -> Table:
    """Per block × phase × collective, averaged over ranks, worst exposed first."""
    grouped = (
        blocks.groupby(["block", "phase", "collective"], sort=False)
        .agg(
            count=("count_per_step", "mean"),
            unit=("unit_count_per_step", "mean"),
            expected=("expected_per_step", "first"),
            excess=("excess", "max"),
            time=("time_us_per_step", "mean"),
            exposed=("exposed_us_per_step", "mean"),
            nbytes=("bytes_per_step", "mean"),
            busbw=("busbw_gbps", "mean"),
            compute=("compute_us_per_step", "mean"),
            recompute=("recompute_us_per_step", "mean"),
            ranks=("rank", "nunique"),
        )
        .reset_index()
        .sort_values(["exposed", "time"], ascending=False, na_position="last")
    )
    shown = grouped.head(top)
    rank_note = (
        f", mean of {int(grouped['ranks'].max())} ranks" if grouped["ranks"].max() > 1 else ""
    )
    table = Table(
        title=f"Per block and phase, per step (worst exposed first{rank_note}; "
        f"{len(shown)} of {len(grouped)} rows)",
        title_justify="left",
    )
    with_recompute = bool(grouped["recompute"].notna().any())
    headers = [
        "block",
        "phase",
        "collective",
        "count (unit/expected)",
        "comm ms",
        "exposed ms",
        "MB",
        "busbw GB/s",
        "block compute ms",
    ]
    if with_recompute:  # under AC the unit's backward window also recomputes its forward
        headers.append("+ recompute ms")
    for header in headers:
        table.add_column(
            header, justify="right" if header not in ("block", "phase", "collective") else "left"
        )
    for row in shown.itertuples():
        count = f"{row.count:g}"
        if not math.isnan(row.expected):
            count += f" ({row.unit:g}/{row.expected:g})"
        if row.excess > 0:
            count = f"[red]{count}[/]"
        table.add_row(
            str(row.block),
            row.phase,
            row.collective,
            count,
            _ms(row.time),
            _ms(row.exposed),
            "—" if math.isnan(row.nbytes) else f"{row.nbytes / 1e6:.1f}",
            "—" if math.isnan(row.busbw) else f"{row.busbw:.0f}",
            _ms(row.compute),
            *([_ms(row.recompute)] if with_recompute else []),
        )
    return table


def crossrank_table(crossrank) -> Table:
    """Per rank: time spent waiting inside NCCL kernels for peers, and who arrived last."""
    m = crossrank.matched
    table = Table(
        title=f"Across ranks ({len(m)} matched collectives; transfer = shortest duration across "
        "ranks, the rest is waiting)",
        title_justify="left",
    )
    for header in ("rank", "waiting ms/step", "arrived last", "clock offset µs"):
        table.add_column(header, justify="right")
    for row in crossrank.per_rank.itertuples():
        table.add_row(
            str(row.rank),
            _ms(row.wait_us_per_step),
            f"{row.arrived_last} ({100 * row.arrived_last_share:.0f} %)",
            f"{row.clock_offset_us:+.1f}",
        )
    return table


def render_findings(findings: list, console: Console) -> None:
    """Diagnosis: what was seen, why it matters, what to change — most costly first."""
    if not findings:
        console.print("[green]Diagnosis:[/] no rule found a problem.")
        return
    console.print(f"[bold]Diagnosis[/] ({len(findings)} findings, most costly first)")
    for f in findings:
        console.print(f"[bold red]{f.number:>2}. {escape(f.title)}[/]")
        console.print(f"    [bold]saw:[/] {escape(f.saw)}")
        console.print(f"    [bold]why:[/] {escape(f.why)}")
        console.print(f"    [bold]change:[/] {escape(f.change)}")


def _signed(value: float, unit: str) -> str:
    return "—" if value is None or pd.isna(value) else f"{value:+.1f}{unit}"


def compare_view(table: pd.DataFrame, console: Console | None = None) -> None:
    """`fsdp-trace compare`: one row per run, with the change each step bought."""
    console = console or make_console()
    view = Table(title="Runs compared, in the order given", title_justify="left")
    for header in (
        "#",
        "run",
        "GPUs",
        "tok/s/GPU",
        "Δ",
        "efficiency",
        "baseline",
        "exposed %",
        "Δ exposed",
        "MFU",
        "mem GiB",
        "Δ mem",
        "what changed",
    ):
        view.add_column(
            header, justify="left" if header in ("run", "baseline", "what changed") else "right"
        )
    for i, row in enumerate(table.itertuples(), start=1):
        change = row.tokens_per_s_per_gpu_change_pct
        view.add_row(
            str(i),
            escape(str(row.label)),
            str(row.world_size),
            f"{row.tokens_per_s_per_gpu:,.0f}",
            "—" if math.isnan(change) else f"{change:+.1f} %",
            "—" if pd.isna(row.scaling_efficiency) else f"{100 * row.scaling_efficiency:.1f} %",
            escape(str(getattr(row, "baseline", "") or "—")),
            _pct(row.exposed_pct),
            _signed(getattr(row, "exposed_pct_change", math.nan), " pt"),
            "—" if pd.isna(row.mfu) else f"{100 * row.mfu:.1f} %",
            "—" if pd.isna(row.peak_allocated_gib) else f"{row.peak_allocated_gib:.1f}",
            _signed(getattr(row, "peak_allocated_gib_change", math.nan), ""),
            escape(str(row.change)),
        )
    console.print(view)
