"""report.html: one self-contained page (plotly.js inlined once, opens offline from disk) that
lays out the view model (`fsdp_trace.present.view`): the verdict, the run's own figures,
per-rank cards, the inferred configuration, the findings, the notices, the tables, and the
figures (where each rank's step goes, the step timeline, communication per block, bandwidth
per collective, the rank × block map of exposed time).

    import fsdp_trace
    from fsdp_trace.render.report import write_report
    write_report(fsdp_trace.analyze("sample_traces/gpt-small-2gpu"), Path("report.html"))

`page` lays the page out, `panels` registers its sections in order (a new panel is one
function and its `@panel`), `figures` builds the plotly figures, `markup` the HTML fragments,
and `static/` holds the stylesheet and the script. Every figure is stored once as JSON in the
page; once all have drawn, the page sets `data-fsdp-rendered` on <body> to their number (the
browser test waits for it). Numbers follow README "Definitions"; times are in ms.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

from fsdp_trace import atomic
from fsdp_trace.collector import full_passes_deferred
from fsdp_trace.render.report.style import COLORS, RENDERED_ATTRIBUTE
from fsdp_trace.result import Result, RunAnalysis

__all__ = ["COLORS", "RENDERED_ATTRIBUTE", "render_html", "write_report"]


def as_result(analysis: Result | RunAnalysis) -> Result:
    """A Result as given, or one run wrapped as a Result of its own."""
    if isinstance(analysis, RunAnalysis):
        return Result(inputs=list(analysis.inputs), runs=[analysis], grouping="")
    return analysis


@full_passes_deferred()  # a run of many ranks read many times: fsdp_trace.collector
def render_html(analysis: Result | RunAnalysis) -> str:
    """The whole page as one string."""
    from fsdp_trace.render.report import page

    result = as_result(analysis)
    with ExitStack() as held:  # the panels read each run's tables many times
        for run in result.runs:
            held.enter_context(run.tables_held())
        return page.render(result)


def write_report(analysis: Result | RunAnalysis, path: Path) -> None:
    """Write the self-contained HTML report of a Result (or one run) to `path` (atomically)."""
    atomic.write_bytes(Path(path), render_html(analysis).encode("utf-8"))
