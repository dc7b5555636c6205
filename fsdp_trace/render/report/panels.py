"""The report's panels, in display order. A panel is one function `(run, view) -> Panel | None`
registered with `@panel`; None leaves it out of the page. Adding a panel to the report is one
such function:

    @panel
    def memory(run: RunAnalysis, view: RunView) -> Panel | None:
        return Panel("memory", "Memory", "caption", figure=memory_figure(run))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fsdp_trace.errors import UserError
from fsdp_trace.present.view import RunView
from fsdp_trace.render.report import figures as figs
from fsdp_trace.render.report import markup
from fsdp_trace.render.report.timeline import MAX_TIMELINE_RANKS, timeline_ranks
from fsdp_trace.result import RunAnalysis


@dataclass
class Panel:
    """One section of the page: a title and caption, a figure (a plotly Figure drawn in the
    page) or the `missing` line said instead, and HTML below it (tables)."""

    key: str
    title: str
    caption: str = ""
    figure: Any | None = None
    missing: str = ""
    body: str = ""
    half: bool = False  # may share a row with a half panel beside it


Builder = Callable[[RunAnalysis, RunView], "Panel | None"]
PANELS: list[Builder] = []


def panel(builder: Builder) -> Builder:
    """Register a panel; the page shows them in the order they are registered."""
    PANELS.append(builder)
    return builder


def build(run: RunAnalysis, view: RunView) -> list[Panel]:
    return [p for builder in PANELS if (p := _built(builder, run, view)) is not None]


def _built(builder: Builder, run: RunAnalysis, view: RunView) -> Panel | None:
    """The panel, or, where it cannot be computed, the panel saying why: one panel's fault
    never costs the report."""
    try:
        return builder(run, view)
    except Exception as exc:  # said in the panel: the rest of the page stands
        reason = exc.message if isinstance(exc, UserError) else f"{type(exc).__name__}: {exc}"
        return Panel(
            builder.__name__,
            builder.__name__.replace("_", " ").capitalize(),
            missing=f"This panel could not be computed ({reason}); the rest of the report "
            "stands. Please report it with the traces.",
        )


def _communicates(run: RunAnalysis) -> bool:
    return not figs.timing(run.collectives).empty


@panel
def diagnosis(run: RunAnalysis, view: RunView) -> Panel:
    return Panel("diagnosis", "Diagnosis: what to change", body=markup.findings(view))


@panel
def whatif(run: RunAnalysis, view: RunView) -> Panel:
    from fsdp_trace.present.whatif import panel_view

    ranking = panel_view(run, view.peers)
    if isinstance(ranking, str):
        return Panel("whatif", "What if: the changes, predicted", missing=ranking)
    return Panel(
        "whatif",
        "What if: the changes, predicted",
        "Each change the diagnosis names, replayed on the measured step (fsdp-trace whatif): "
        "the predicted step with its uncertainty; a diamond where a run of this job made the "
        "change. "
        + " ".join(f"{line[:1].upper()}{line[1:].rstrip('.')}." for line in ranking.basis),
        figure=figs.whatif_figure(ranking),
        body=markup.table(ranking.table),
    )


@panel
def breakdown(run: RunAnalysis, view: RunView) -> Panel | None:
    if not view.breakdown.rows:
        return None
    detailed = any("(detailed)" in b.label for b in view.bars)
    return Panel(
        "breakdown",
        "Where each rank's step goes",
        "Each rank's median step, cut into parts that add up to it: compute, recompute, FSDP's "
        "copies, communication no compute hides (exposed) split into the transfer itself and "
        "waiting inside NCCL kernels for a later rank, and idle time (nothing on the GPU)."
        + (
            " Detailed bars: the one step traced with record_shapes and with_stack (slowed by "
            "the profiler; not matched across ranks, so its exposed time is not split)."
            if detailed
            else ""
        ),
        figure=figs.breakdown_figure(view),
        missing="No step to break down.",
        body=markup.table(view.breakdown, heading="Where each rank's step goes"),
    )


@panel
def ranks(run: RunAnalysis, view: RunView) -> Panel:
    return Panel("ranks", "Per rank", body=markup.table(view.ranks, heading="Per rank"))


@panel
def configuration(run: RunAnalysis, view: RunView) -> Panel:
    return Panel(
        "config",
        "Inferred configuration",
        "The FSDP setup the analysis holds this run to: from run.json where it says, else read "
        "from the trace, else FSDP2's documented default (said).",
        body=markup.config(view.config),
        half=True,
    )


@panel
def distortion(run: RunAnalysis, view: RunView) -> Panel | None:
    if view.distortion is None:
        return None
    title = "Profiler distortion"
    return Panel("distortion", title, body=markup.table(view.distortion, heading=title), half=True)


@panel
def crossrank(run: RunAnalysis, view: RunView) -> Panel | None:
    if view.crossrank is None:
        return None
    return Panel(
        "crossrank",
        "Across ranks",
        "A collective ends at about the same moment on every rank, so the shortest duration "
        "across ranks approximates the transfer; each rank's excess is waiting for the last to "
        "arrive (a straggler shows as the others' waiting). Clocks are aligned by matched end "
        "times when they disagree.",
        body=markup.table(view.crossrank, heading="Across ranks")
        + (markup.table(view.transfer) if view.transfer is not None else ""),
    )


@panel
def timeline(run: RunAnalysis, view: RunView) -> Panel:
    shown, total = len(timeline_ranks(run)), len([r for r in run.ranks if len(r.steps)])
    subset = (
        f" Showing {shown} of {total} ranks: the most and the least exposed "
        f"(at most {MAX_TIMELINE_RANKS})."
        if shown < total
        else ""
    )
    caption = (
        "One representative step: the timing step of median length (averaged over ranks), the "
        "same step on every rank. Rows are GPU streams; bars are kernels, coloured compute / "
        "AllGather / ReduceScatter; the bottom row shows when communication ran with no "
        "compute beside it (exposed). Hover a bar for its block, phase, bytes and bandwidth; "
        "drag to zoom, double-click to reset."
        if run.gpu
        else "One representative step: the step of median length (averaged over ranks). A CPU "
        "(gloo) trace has no GPU kernels: the bars are the collectives on gloo's threads."
    )
    try:
        figure = figs.timeline_figure(run)
    except UserError as exc:  # the kernels could not be read again (a trace changed)
        return Panel("timeline", "Step timeline", missing=f"No timeline: {exc}")
    return Panel(
        "timeline",
        "Step timeline",
        caption + subset,
        figure=figure,
        missing="No profiled steps to draw.",
    )


@panel
def blocks(run: RunAnalysis, view: RunView) -> Panel:
    if not _communicates(run):  # nothing to attribute: one note, not three empty figures
        return Panel(
            "blocks",
            "Communication",
            missing="No collectives: a single-GPU (or non-distributed) trace has nothing to "
            "attribute.",
        )
    table = (
        f"<details><summary>{markup.esc(view.blocks.title)}</summary>"
        f"{markup.table(view.blocks, caption=False)}</details>"
        if view.blocks is not None
        else ""
    )
    return Panel(
        "blocks",
        "Communication per block",
        "Per step, worst exposed first: AllGather in forward, AllGather in backward (including "
        "recompute), ReduceScatter. Hatched red: the part not hidden by compute."
        if run.gpu
        else "Per step, longest first. On CPU (gloo) traces exposure is not measured.",
        figure=figs.blocks_figure(run),
        missing="No per-block figures.",
        body=table,
    )


@panel
def bandwidth(run: RunAnalysis, view: RunView) -> Panel | None:
    if not _communicates(run):
        return None
    transfer = run.crossrank is not None and not run.crossrank.empty
    return Panel(
        "bandwidth",
        "Bandwidth per collective",
        "Bus bandwidth (nccl-tests convention) against message size. Circles: each kernel's "
        "own duration, which includes waiting for peers (lower bounds)."
        + (
            " Diamonds: each collective matched across ranks, over its transfer time (the "
            "shortest duration across ranks)."
            if transfer
            else ""
        ),
        figure=figs.bandwidth_figure(run),
        missing="No collectives with a known size and duration.",
        half=not figs.heatmap_wide(run),
    )


@panel
def heatmap(run: RunAnalysis, view: RunView) -> Panel | None:
    if not _communicates(run):
        return None
    return Panel(
        "heatmap",
        "Exposed communication, rank × block" if run.gpu else "Communication time, rank × block",
        "Per step, summed over phases and collectives: a straggler shows as a row. Where one "
        "unit (usually the root) is far above the blocks, the colour is capped at the 95th "
        "percentile of the other cells (said on the colour bar); hover shows every value."
        if run.gpu
        else "Communication time per step (exposure is not measured on CPU traces).",
        figure=figs.heatmap_figure(run),
        missing="Needs collectives from two ranks or more.",
        half=not figs.heatmap_wide(run),
    )


@panel
def hta(run: RunAnalysis, view: RunView) -> Panel | None:
    if view.hta is None:
        return None
    title = "Cross-check with HTA"
    return Panel("hta", title, body=markup.table(view.hta, heading=title))
