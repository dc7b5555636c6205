"""The terminal view: the view model (`fsdp_trace.present.view`) laid out with rich."""

from __future__ import annotations

import sys

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table as RichTable

from fsdp_trace.present.view import FindingView, RunView, Table, run_view, side_by_side
from fsdp_trace.result import Result


def make_console(width: int = 160) -> Console:
    """Wide enough for the widest table when output is piped (rich assumes 80 columns)."""
    return Console() if sys.stdout.isatty() else Console(width=width)


def table(view: Table) -> RichTable:
    out = RichTable(title=view.title, title_justify="left")
    for i, header in enumerate(view.headers):
        out.add_column(header, justify="right" if i >= view.numeric_from else "left")
    flags = view.highlight or [False] * len(view.rows)
    for row, flag in zip(view.rows, flags, strict=True):
        out.add_row(*(f"[red]{escape(c)}[/]" if flag else escape(c) for c in row))
    return out


def render(result: Result, console: Console | None = None, top: int = 15) -> None:
    console = console or make_console()
    console.print(f"[bold]fsdp-trace analyze[/] {escape(', '.join(result.inputs))}")
    if len(result.runs) > 1:
        console.print(f"[dim]{escape(result.grouping)}[/]")
        console.print(table(side_by_side(result)))
    for notice in result.input_notices:
        console.print(f"[yellow]notice:[/] {escape(notice)}")
    for run in result.runs:
        render_run(run_view(run, top), console, several=len(result.runs) > 1)


def render_run(view: RunView, console: Console, several: bool = False) -> None:
    if several:
        console.rule(f"[bold]{escape(view.name)}")
    console.print(escape(view.description))
    if view.run_figures:
        console.print(_cards(view.run_figures))
    tone = "yellow" if view.cpu else "green" if view.healthy else "bold red"
    console.print(f"[bold]Verdict:[/] [{tone}]{escape(view.verdict)}[/]")
    if view.cards:
        console.print(_cards(view.cards))
    config = RichTable(title="Inferred configuration", title_justify="left", show_header=False)
    for column in ("item", "value", "from"):
        config.add_column(column, style="dim" if column == "from" else None)
    for label, value, source in view.config:
        config.add_row(escape(label), escape(value), escape(source))
    console.print(config)
    for notice in view.notices:
        console.print(f"[yellow]notice:[/] {escape(notice)}")
    if view.breakdown.rows:
        console.print(table(view.breakdown))
    console.print(table(view.ranks))
    if view.distortion is not None:
        console.print(table(view.distortion))
    if view.blocks is not None:
        console.print(table(view.blocks))
    if view.crossrank is not None:
        console.print(table(view.crossrank))
    render_findings(view, console)
    if view.hta is not None:
        console.print(table(view.hta))


def _cards(items) -> RichTable:
    """Figures or cards as rows: label, value, and the line that says what the value is."""
    grid = RichTable.grid(padding=(0, 2))
    for _ in range(3):
        grid.add_column()
    for c in items:
        grid.add_row(escape(c.label), f"[bold]{escape(c.value)}[/]", f"[dim]{escape(c.sub)}[/]")
    return grid


def _finding(f: FindingView, console: Console, indent: str = "") -> None:
    number = f"{f.number:>2}. " if f.number else "- "
    cost = f" — {escape(f.cost)}" if f.cost else ""
    console.print(f"{indent}[bold red]{number}{escape(f.title)}[/]{cost} [dim]({f.basis})[/]")
    pad = indent + "    "
    console.print(f"{pad}[bold]cause:[/] {escape(f.cause)}")
    if f.where:
        console.print(f"{pad}[bold]where:[/] {escape(f.where)}")
    console.print(f"{pad}[bold]evidence:[/] {escape(f.evidence)}")
    console.print(f"{pad}[bold]why:[/] {escape(f.why)}")
    console.print(f"{pad}[bold]change:[/] {escape(f.change)}")
    if f.cli:
        console.print(f"{pad}[bold]try:[/] fsdp-trace capture ... {escape(f.cli)}")
    if f.code:
        console.print(f"{pad}[bold]in code:[/] {escape(f.code)}")
    for symptom in f.symptoms:
        cost = f" ({escape(symptom.cost)})" if symptom.cost else ""  # a note: no cost
        console.print(f"{pad}[bold]explains:[/] {escape(symptom.title)}{cost}")
        console.print(f"{pad}    {escape(symptom.evidence)}")


def render_findings(view: RunView, console: Console) -> None:
    """Diagnosis: causes first (costliest first, each with what it explains), then notes
    about the measurement, then minor findings."""
    tone = "yellow" if view.cpu else "bold" if view.findings else "green"
    console.print(f"[bold]Diagnosis:[/] [{tone}]{escape(view.diagnosis_heading)}[/]")
    for f in view.findings:
        _finding(f, console)
    if view.minor:
        console.print("[bold]Minor[/] (each below 1 % of the step)")
        for f in view.minor:
            console.print(f"  - {escape(f.title)} — {escape(f.cost)}: {escape(f.evidence)}")


def compare_view(table_: pd.DataFrame, console: Console | None = None) -> None:
    """`fsdp-trace compare`: one row per run, with the change each step bought, then the
    table's notices (a CPU run's timing, blank figures)."""
    from fsdp_trace.present.compare import compare_table, numeric

    console = console or make_console(200)
    view = compare_table(table_)
    out = RichTable(title=view.title, title_justify="left")
    names = [len(row[view.headers.index("run")]) for row in view.rows]
    widths = {"what changed": 24, "run": min(max(names, default=3), 32)}
    for header in view.headers:  # numbers never wrap; the run and what changed may
        if numeric(header):
            out.add_column(header, justify="right", no_wrap=True)
        else:  # a run's name is never cut short
            out.add_column(header, min_width=widths.get(header), overflow="fold")
    for row in view.rows:
        out.add_row(*(escape(c) for c in row))
    console.print(out)
    for notice in table_.attrs.get("notices", []):
        console.print(f"[yellow]notice:[/] {escape(notice)}")
