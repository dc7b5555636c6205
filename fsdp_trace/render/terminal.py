"""The terminal view: the view model (`fsdp_trace.present.view`) laid out with rich."""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape as markup_escape
from rich.table import Table as RichTable
from rich.text import Text

from fsdp_trace.present.view import FindingView, RunView, Table, run_view, side_by_side
from fsdp_trace.printable import printable, printable_lines
from fsdp_trace.result import Result


def escape(text: object) -> str:
    """Text for rich's markup: shown as is (no markup read in it), every control character
    an input could carry (escape sequences in a kernel's or a file's name) shown escaped."""
    return markup_escape(printable_lines(text))


def _printable(view: Table) -> Table:
    """The table with every control character of its text shown escaped (cells are drawn as
    plain text, never read as markup)."""
    return dataclasses.replace(
        view,
        title=printable_lines(view.title),
        headers=[printable(h) for h in view.headers],
        rows=[[printable(c) for c in row] for row in view.rows],
    )


PIPED_WIDTH = 160  # piped output without COLUMNS (rich would assume 80)


def make_console(width: int = PIPED_WIDTH) -> Console:
    """The terminal's width; piped, COLUMNS where it is set, else `width`. Tables fit it
    whatever it is (`print_table`)."""
    if sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit():
        return Console()  # rich reads the terminal's size, or COLUMNS
    return Console(width=width)


# --- tables that fit the terminal --------------------------------------------------------------
#
# A table is printed whole where it fits; else with its headers and text wrapped (words never
# cut; a number breaks only before its parenthesis, "52.76 (51.56–55.38)", a name only after
# itself, "gpt-small-1gpu (differs: AC coverage)"); else without its `narrow` columns, said
# under it; else stacked, one block per row. Rich alone would shrink columns below their
# longest word and cut names ("layer…").

PIECE = re.compile(r" (?=\()")  # where a number's or a name's cell may break
NUMBER, NAME, TEXT = "number", "name", "text"  # how a column's cells may break


def _pieces(text: str, kind: str) -> list[str]:
    """The parts of a cell no line break may split."""
    if kind == NUMBER:
        return PIECE.split(text)
    if kind == NAME:
        name, *rest = PIECE.split(text, maxsplit=1)
        return [name, *(w for r in rest for w in r.split())]
    return text.split() or [""]


@dataclass(frozen=True)
class _Column:
    """A column's content widths (padding and borders apart): its longest header word,
    narrowest cell (its longest unbreakable part), widest cell, and widest line."""

    header: int
    piece: int
    whole: int
    widest: int
    kind: str

    @property
    def unbroken(self) -> bool:
        """Its cells rather kept whole (a number, a name)."""
        return self.kind != TEXT


def _column(view: Table, i: int, kind: str, header: bool) -> _Column:
    cells = [row[i] for row in view.rows]
    piece = max((cell_len(p) for c in cells for p in _pieces(c, kind)), default=1)
    whole = max((cell_len(c) for c in cells), default=1)
    words = max(cell_len(w) for w in _pieces(view.headers[i], TEXT)) if header else 1
    widest = max(whole, cell_len(view.headers[i]) if header else 1)
    return _Column(words, piece, whole, widest, kind)


def _spread(widths: list[int], top: list[int], room: int, which: list[bool]) -> list[int]:
    """`widths` grown toward `top` within `room`, for the columns in `which`, each in
    proportion to what it lacks (as browsers lay out tables)."""
    spare = room - sum(widths)
    lack = [t - w if ok else 0 for w, t, ok in zip(widths, top, which, strict=True)]
    if spare <= 0 or not sum(lack):
        return widths
    if spare >= sum(lack):
        return [w + d for w, d in zip(widths, lack, strict=True)]
    grown = [w + spare * d // sum(lack) for w, d in zip(widths, lack, strict=True)]
    for i in sorted(range(len(grown)), key=lambda i: grown[i] - top[i]):
        if sum(grown) >= room:
            break
        if grown[i] < top[i]:
            grown[i] += 1
    return grown


def _fit(columns: list[_Column], room: int) -> list[int] | None:
    """Column widths within `room`, or None where even the narrowest do not fit: each column
    its widest where all fit; else headers wrap, numbers and names whole; else they break
    before their parenthesis too, text columns taking the room first and a number's column
    widened only where all its cells then fit whole (no column half broken)."""
    widest = [c.widest for c in columns]
    if sum(widest) <= room:
        return widest
    whole = [max(c.header, c.whole if c.unbroken else c.piece) for c in columns]
    if sum(whole) <= room:
        return _spread(whole, widest, room, [True] * len(columns))
    narrow = [max(c.header, c.piece) for c in columns]
    if sum(narrow) > room:
        return None
    widths = _spread(narrow, widest, room, [not c.unbroken for c in columns])
    for i in sorted(range(len(columns)), key=lambda i: whole[i] - widths[i]):
        if columns[i].unbroken and sum(widths) + whole[i] - widths[i] <= room:
            widths[i] = max(widths[i], whole[i])
    return widths


def _cell(text: str, width: int, kind: str, style: str | None) -> Text:
    if kind != TEXT and cell_len(text) > width:  # break where it may (the rest wraps)
        first, *rest = PIECE.split(text, maxsplit=0 if kind == NUMBER else 1)
        text = "\n".join([first, *rest])
    return Text(text, style=style or "", no_wrap=kind == NUMBER, overflow="fold")


def _kind(view: Table, i: int, numeric: Callable[[int], bool]) -> str:
    return NUMBER if numeric(i) else NAME if i in view.names else TEXT


def _laid_out(
    view: Table,
    columns: list[int],
    widths: list[int],
    numeric: Callable[[int], bool],
    show_header: bool,
    dim: tuple[int, ...],
    flagged: str,
) -> RichTable:
    out = RichTable(title=view.title, title_justify="left", show_header=show_header)
    for i, width in zip(columns, widths, strict=True):
        out.add_column(
            view.headers[i],
            justify="right" if numeric(i) else "left",
            width=width,
            style="dim" if i in dim else None,
        )
    flags = view.highlight or [False] * len(view.rows)
    for row, flag in zip(view.rows, flags, strict=True):
        out.add_row(
            *(
                _cell(row[i], w, _kind(view, i, numeric), flagged if flag else None)
                for i, w in zip(columns, widths, strict=True)
            )
        )
    return out


def _stacked(view: Table, width: int, flagged: str) -> list[Text]:
    """One block per row: its heading (the first `heading` cells), then "header value" pairs
    packed into lines, a pair never broken where it fits a line."""
    out = [Text(view.title, style="italic")]
    flags = view.highlight or [False] * len(view.rows)
    indent = "   "
    for row, flag in zip(view.rows, flags, strict=True):
        head = " · ".join(c for c in row[: view.heading] if c)
        out.append(Text(head, style=f"bold {flagged}" if flag else "bold"))
        line = Text(indent)
        for i in range(view.heading, len(view.headers)):
            if not row[i]:  # nothing to say
                continue
            pair = Text.assemble((view.headers[i], "dim"), " ", row[i])
            if cell_len(line.plain) > len(indent) and line.cell_len + 3 + pair.cell_len > width:
                out.append(line)
                line = Text(indent)
            if cell_len(line.plain) > len(indent):
                line.append("   ")
            line.append_text(pair)
        if cell_len(line.plain) > len(indent):
            out.append(line)
    return out


def print_table(
    console: Console,
    view: Table,
    numeric: Callable[[int], bool] | None = None,
    *,
    show_header: bool = True,
    dim: tuple[int, ...] = (),
    flagged: str = "red",
) -> None:
    """`view` laid out to fit the console's width (see above); `numeric`: the columns to
    right-align (default: from `view.numeric_from`); `dim`: columns shown dim; `flagged`: the
    style of highlighted rows."""
    view = _printable(view)
    numeric = numeric or (lambda i: i >= view.numeric_from)
    width = console.width
    everything = list(range(len(view.headers)))
    for n in range(len(view.narrow) + 1):
        left_out = view.narrow[:n]
        columns = [i for i in everything if view.headers[i] not in left_out]
        measured = [_column(view, i, _kind(view, i, numeric), show_header) for i in columns]
        room = width - (len(columns) + 1) - 2 * len(columns)  # borders, padding
        widths = _fit(measured, room)
        if widths is None:
            continue
        console.print(_laid_out(view, columns, widths, numeric, show_header, dim, flagged))
        if left_out:
            console.print(
                f"[dim]({escape(', '.join(left_out))} left out at {width} columns: a wider "
                "terminal, --json or the report has them)[/]"
            )
        return
    for line in _stacked(view, width, flagged):
        console.print(line)


def render(result: Result, console: Console | None = None, top: int = 15) -> None:
    console = console or make_console()
    console.print(f"[bold]fsdp-trace analyze[/] {escape(', '.join(result.inputs))}")
    if len(result.runs) > 1:
        console.print(f"[dim]{escape(result.grouping)}[/]")
        print_table(console, side_by_side(result))
    views = [run_view(run, top) for run in result.runs]
    print_notices(console, result.input_notices, alike=any(v.focus for v in views))
    for view in views:
        render_run(view, console, several=len(result.runs) > 1)


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
    config = Table(
        "config",
        "Inferred configuration",
        ["item", "value", "from"],
        [list(line) for line in view.config],
        numeric_from=3,
    )
    print_table(console, config, show_header=False, dim=(2,))
    print_notices(console, view.notices, alike=bool(view.focus))
    if view.breakdown.rows:
        _print_ranks(console, view.breakdown, view.focus)
    _print_ranks(console, view.ranks, view.focus)
    if view.distortion is not None:
        print_table(console, view.distortion)
    if view.blocks is not None:
        print_table(console, view.blocks)
    if view.crossrank is not None:
        _print_ranks(console, view.crossrank, view.focus)
    render_findings(view, console)
    if view.hta is not None:
        print_table(console, view.hta)


# Notices alike but for their numbers ("rank 7's trace is rank 1's"): more than this many, and
# the terminal prints the first and how many more (--json lists every one).
ALIKE_NOTICES = 3


def print_notices(console: Console, notices: list[str], alike: bool = False) -> None:
    """Each notice on its line; with `alike` (a run of many ranks), of the notices alike but
    for their numbers (a thousand ranks each saying the same), the first and the one with the
    largest number, and a count of the others."""
    groups: dict[str, list[str]] = {}
    for notice in notices:
        groups.setdefault(re.sub(r"\d+", "#", notice) if alike else notice, []).append(notice)
    for group in groups.values():
        if not alike or len(group) <= ALIKE_NOTICES:
            for notice in group:
                console.print(f"[yellow]notice:[/] {escape(notice)}")
            continue
        largest = max(group, key=lambda n: max(map(int, re.findall(r"\d+", n)), default=0))
        shown = list(dict.fromkeys([group[0], largest]))
        for notice in shown:
            console.print(f"[yellow]notice:[/] {escape(notice)}")
        console.print(
            f"[dim](and {len(group) - len(shown):,} more notices like these: --json lists "
            "every one)[/]"
        )


def _print_ranks(console: Console, view: Table, focus: list[str]) -> None:
    """A per-rank table; of a run of many ranks (the view's `focus` set), only the rows of the
    ranks that stand out, and a line saying so."""
    # A row's label is the rank's (`rank 3`, `rank 3 (b.json)` where numbers repeat), with
    # ` (detailed)` on a detailed trace's; the cross-rank table names ranks by number alone.
    keep = set(focus) | {label.split(" (")[0] for label in focus}
    rows = [
        i for i, row in enumerate(view.rows) if row and row[0].removesuffix(" (detailed)") in keep
    ]
    if not focus or len(view.rows) <= len(rows) or not rows:
        print_table(console, view)
        return
    shown = dataclasses.replace(
        view,
        rows=[view.rows[i] for i in rows],
        highlight=[view.highlight[i] for i in rows] if view.highlight else [],
    )
    print_table(console, shown)
    console.print(
        f"[dim]({len(rows)} of {len(view.rows):,} rows: the ranks that stand out (slowest, most "
        "exposed, idlest, waiting most, last to arrive most often, named by a finding, and the "
        "first); --json, --csv and the report have every rank)[/]"
    )


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
    basis = f" [dim]({f.basis})[/]" if f.basis and f.basis not in f.cost else ""
    console.print(f"{indent}[bold red]{number}{escape(f.title)}[/]{cost}{basis}")
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
        console.print(
            "[bold]Minor[/] (each below 1 % of the step, or its saving within the run's noise)"
        )
        for f in view.minor:
            console.print(f"  - {escape(f.title)} — {escape(f.cost)}: {escape(f.evidence)}")


def compare_view(table_: pd.DataFrame, console: Console | None = None) -> None:
    """`fsdp-trace compare`: one row per run, with the change each step bought, then the
    table's notices (a CPU run's timing, blank figures)."""
    from fsdp_trace.present.compare import compare_table, numeric

    console = console or make_console(200)
    view = compare_table(table_)
    print_table(console, view, lambda i: numeric(view.headers[i]))
    for notice in table_.attrs.get("notices", []):
        console.print(f"[yellow]notice:[/] {escape(notice)}")
