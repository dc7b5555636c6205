"""The tuning table's front ends: the terminal, tune.md and tune.html (the compare view's chart
over the tuning runs, then the table). All three render one `TuneView`."""

from __future__ import annotations

import html
from pathlib import Path

from fsdp_trace.present.tune import TuneView, markdown, numeric

TITLE = "fsdp-trace tune: which knob bought each point"


def terminal(view: TuneView) -> None:
    from fsdp_trace.render.terminal import escape, make_console, print_table

    console = make_console(200)
    table = view.table
    print_table(console, table, lambda i: numeric(table.headers[i]), flagged="green")
    for line in view.summary:
        console.print(escape(line))
    for notice in view.notices:
        console.print(f"[yellow]notice:[/] {escape(notice)}")


def render_html(view: TuneView) -> str:
    from fsdp_trace.render import plotlyjs
    from fsdp_trace.render.compare import CSS, figure, view_html

    chart = plotlyjs.to_html(
        figure(view.rows),
        full_html=False,
        default_width="100%",
        default_height="720px",
        config={"responsive": True, "displaylogo": False},
    )
    summary = "".join(f"<li>{html.escape(line)}</li>" for line in view.summary)
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in view.notices)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>fsdp-trace tune</title><style>{CSS}</style></head><body><main>"
        f"<h1>{html.escape(TITLE)}</h1>"
        '<p class="caption">Each knob was captured on top of the knobs kept before it and '
        "measured against the run kept then, on p10 tok/s/GPU (tokens per step per GPU ÷ the "
        "10th-percentile un-profiled step, the statistic the replay predicts); predicted: "
        "the what-if replay of that run's trace. Kept rows are green. Efficiency = "
        "tok/s/GPU ÷ that of the 1-GPU baseline at the same batch (none on a 1-GPU tune)."
        "</p>"
        f"<ul>{summary}</ul>{chart}{view_html(view.table, numeric)}"
        + (f'<ul class="notices">{notes}</ul>' if notes else "")
        + "</main></body></html>\n"
    )


def outputs(view: TuneView) -> dict[str, str]:
    """tune.md always; tune.html where plotly is installed."""
    files = {"tune.md": markdown(view, TITLE)}
    try:
        import plotly  # noqa: F401
    except ImportError:
        return files
    files["tune.html"] = render_html(view)
    return files


def write(view: TuneView, folder: Path) -> list[Path]:
    from fsdp_trace import atomic

    written = []
    for name, text in outputs(view).items():
        atomic.write_text(folder / name, text)
        written.append(folder / name)
    return written
