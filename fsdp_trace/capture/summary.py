"""The few lines rank 0 prints when a capture ends: the run's figures and every notice, so a
user sees at once what run.json says (an omitted MFU included) without opening it.

The rows come from the presentation layer (`fsdp_trace.present.headline`, standard library
only), so they read as analyze's headline does; rendered with rich only: the capture path must
stay importable with torch + typer + rich (no pandas, plotly, msgspec or perfetto).
"""

from __future__ import annotations

from typing import IO, Any

from fsdp_trace.present.headline import SUMMARY_LABELS
from fsdp_trace.present.headline import summary_rows as record_rows
from fsdp_trace.runrecord import RunRecord

# On CPU (gloo) the timed steps measure the host's cores, which every rank shares: a figure
# against a 1-rank baseline is no scaling efficiency (a CPU sweep read "11.9").
CPU_SCALING = "not computed on CPU (host cores shared by every rank, not GPUs)"
CPU_NOTICE = (
    "CPU (gloo) run: step time and tokens/s measure the host, not GPUs and their "
    "interconnect, and are not meaningful for scaling (the sharding, the AC plan and the "
    "collectives in the traces are)"
)


def summary_rows(record: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, text) rows of a run.json record (as written), in reading order. A CPU run's
    scaling efficiency is not shown as a figure, and a notice says what its timing means."""
    run = RunRecord.from_json(record)
    rows = record_rows(run)
    if run.world.device != "cpu":
        return rows
    rows = [(label, CPU_SCALING if label == "scaling efficiency" else text) for label, text in rows]
    return [*rows, ("notice", CPU_NOTICE)]


def print_summary(record: dict[str, Any], out_dir: str, file: IO[str] | None = None) -> None:
    """Print the rows (to stdout unless `file` is given), one per line and never wrapped, so
    they read the same in a terminal, a log file, or grep."""
    from rich.console import Console
    from rich.text import Text

    console = Console(file=file, highlight=False, soft_wrap=True)
    console.print(Text(f"{out_dir}/run.json", style="bold"))
    width = max(map(len, SUMMARY_LABELS))
    for label, text in summary_rows(record):
        style = "yellow" if label == "notice" else "bold"
        console.print(Text.assemble("  ", (label.ljust(width), style), "  ", text))
