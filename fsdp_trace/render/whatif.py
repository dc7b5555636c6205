"""The what-if views in the terminal."""

from __future__ import annotations

from rich.console import Console

from fsdp_trace.present.whatif import PredictionView, RankingView
from fsdp_trace.render.terminal import escape, print_table


def render_prediction(view: PredictionView, console: Console) -> None:
    print_table(console, view.table)
    if view.ranks is not None:
        print_table(console, view.ranks)
    for line in view.basis:
        console.print(f"[dim]{escape(line)}[/]")


def render_ranking(view: RankingView, console: Console) -> None:
    if not view.table.rows:
        console.print("No finding names a change the replay models: nothing to rank.")
        return
    print_table(console, view.table)
    for line in view.basis:
        console.print(f"[dim]{escape(line)}[/]")
