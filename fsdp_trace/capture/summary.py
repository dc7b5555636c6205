"""The few lines rank 0 prints when a capture ends: the run's figures and every notice, so a
user sees at once what run.json says (an omitted MFU included) without opening it.

Pure formatting of the run.json record, rendered with rich only: the capture path must stay
importable with torch + typer + rich (no pandas, plotly, msgspec or perfetto).
"""

from __future__ import annotations

from typing import IO, Any

# Every row label summary_rows uses, to align the text column.
LABELS = ("run", "step time", "tokens/s/GPU", "MFU", "scaling efficiency", "peak memory", "notice")


def _gib(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} GiB"


def summary_rows(record: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, text) rows of a run.json record, in reading order; notices last, one row each."""
    figures = record["figures"]
    model = record["model"]
    world = record["world"]
    name = model.get("preset") or model.get("factory") or record["config"]["model"]
    rows = [
        (
            "run",
            f"{name}, batch {model['batch_size']} x seq {model['seq_len']}, "
            f"{world['world_size']} rank(s) on {world['device']} ({world['backend']})",
        )
    ]
    stats = figures.get("step_time_ms")
    if stats:
        rows.append(
            (
                "step time",
                f"{stats['median']:.2f} ms median (p10-p90 {stats['p10']:.2f}-{stats['p90']:.2f}, "
                f"min-max {stats['min']:.2f}-{stats['max']:.2f}, {stats['n']} steps)",
            )
        )
        rows.append(("tokens/s/GPU", f"{figures['tokens_per_s_per_gpu']:,.0f}"))
        mfu = figures.get("mfu")
        if mfu is not None:
            rows.append(
                (
                    "MFU",
                    f"{mfu:.3f} ({figures['achieved_tflops_per_gpu']:.1f} TFLOP/s per GPU of "
                    f"{record['environment']['dense_bf16_peak_tflops']:g} dense bf16)",
                )
            )
        else:
            why = next((n for n in figures["notices"] if n.startswith("MFU omitted")), None)
            rows.append(("MFU", why.removeprefix("MFU ") if why else "omitted"))
        efficiency = figures.get("scaling_efficiency")
        if efficiency is not None:
            rows.append(
                (
                    "scaling efficiency",
                    f"{efficiency:.3f} vs {figures['baseline_dir']} "
                    f"({figures['baseline_tokens_per_s']:,.0f} tokens/s on 1 GPU)",
                )
            )
    else:
        rows.append(("step time", "not measured (--timed-steps 0)"))
    if "peak_allocated_gib" in figures:
        memory = (
            f"{_gib(figures['peak_allocated_gib'])} allocated, "
            f"{_gib(figures.get('peak_reserved_gib'))} reserved (max over ranks)"
        )
        if "num_alloc_retries" in figures:
            memory += f"; {figures['num_alloc_retries']} allocator retries in the timed steps"
        rows.append(("peak memory", memory))
    elif "peak_rss_gib" in figures:
        rows.append(("peak memory", f"{_gib(figures['peak_rss_gib'])} RSS (max over ranks)"))
    for notice in figures["notices"]:
        if not notice.startswith("MFU omitted"):
            rows.append(("notice", notice))
    return rows


def print_summary(record: dict[str, Any], out_dir: str, file: IO[str] | None = None) -> None:
    """Print the rows (to stdout unless `file` is given), one per line and never wrapped, so
    they read the same in a terminal, a log file, or grep."""
    from rich.console import Console
    from rich.text import Text

    console = Console(file=file, highlight=False, soft_wrap=True)
    console.print(Text(f"{out_dir}/run.json", style="bold"))
    width = max(map(len, LABELS))
    for label, text in summary_rows(record):
        style = "yellow" if label == "notice" else "bold"
        console.print(Text.assemble("  ", (label.ljust(width), style), "  ", text))
