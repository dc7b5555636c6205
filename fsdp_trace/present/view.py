"""What every front end shows of an analysis, computed once: the verdict, the inferred
configuration, per-rank cards and tables (always per rank: never one median pooled over
ranks), where each rank's step goes, the per-block table, the cross-rank table, the
findings and the notices. Text is formatted here; the renderers only lay it out."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fsdp_trace import fmt
from fsdp_trace.analysis import intervals as iv
from fsdp_trace.analysis.rank.breakdown import PARTS
from fsdp_trace.analysis.results import RankAnalysis
from fsdp_trace.analysis.table import array_of
from fsdp_trace.diagnose.causes import cost_text
from fsdp_trace.diagnose.finding import Finding, FindingKind
from fsdp_trace.present import headline
from fsdp_trace.present.configuration import config_lines, short_list
from fsdp_trace.result import Result, RunAnalysis
from fsdp_trace.vocab import Device, Source

# The breakdown's parts as people read them, in the order they stack.
PART_LABELS = {
    "compute_us": "compute",
    "recompute_us": "recompute",
    "fsdp_copy_us": "FSDP copies",
    "exposed_transfer_us": "exposed transfer",
    "exposed_wait_us": "waiting for peers",
    "exposed_unsplit_us": "exposed (unsplit)",
    "idle_us": "idle",
}
STACK_ORDER = (
    "compute_us",
    "recompute_us",
    "fsdp_copy_us",
    "exposed_transfer_us",
    "exposed_wait_us",
    "exposed_unsplit_us",
    "idle_us",
)
assert set(STACK_ORDER) == set(PARTS)
EXPOSED_PARTS = ("exposed_transfer_us", "exposed_wait_us", "exposed_unsplit_us")


@dataclass(frozen=True)
class Card:
    key: str
    label: str
    value: str
    sub: str = ""
    tone: str = ""


@dataclass(frozen=True)
class Table:
    """Headers and rows of text; `numeric_from`: the first right-aligned column. Where the
    terminal is narrow: `names` are the columns of names a user types (a block, a run, a knob:
    never broken), `narrow` the headers left out first, and the first `heading` columns name
    a row of the stacked layout."""

    key: str
    title: str
    headers: list[str]
    rows: list[list[str]]
    numeric_from: int = 1
    highlight: list[bool] = field(default_factory=list)  # per row: draw attention to it
    names: tuple[int, ...] = (0,)
    narrow: tuple[str, ...] = ()
    heading: int = 1


@dataclass(frozen=True)
class FindingView:
    number: int
    rule: str
    title: str
    cost: str  # "13.18 ms per step (25.0 % of the step)", "" for measurement findings
    cause: str
    evidence: str
    why: str
    change: str
    cli: str
    code: str
    basis: str
    where: str  # "rank 0; layers.3, layers.4"
    symptoms: list[FindingView]
    kind: str = FindingKind.CAUSE  # or a note (MEASUREMENT, NOTE): no cost of its own
    minor: bool = False


@dataclass(frozen=True)
class BreakdownBar:
    """One rank's median step as stacked parts (ms), for the stacked-bar figure."""

    label: str
    step: int
    step_ms: float
    parts: dict[str, float]  # PART_LABELS key → ms (NaN: unknown)
    text: dict[str, str]  # PART_LABELS key → "1.91 ms (3.6 %)", or "—" when unknown


@dataclass
class RunView:
    name: str
    title: str  # the inputs
    description: str  # the run line (run.json), or what the traces say
    verdict: str
    healthy: bool
    run_figures: list[headline.Figure]
    cards: list[Card]
    config: list[tuple[str, str, str]]  # label, value, source
    breakdown: Table
    bars: list[BreakdownBar]
    ranks: Table
    distortion: Table | None
    blocks: Table | None
    crossrank: Table | None
    transfer: Table | None
    findings: list[FindingView]
    minor: list[FindingView]
    notices: list[str]
    hta: Table | None
    cpu: bool
    diagnosis_heading: str  # the line above the findings
    peers: list = field(default_factory=list)  # the result's other runs (the report sets it)
    # The ranks that stand out (labels, as the per-rank tables' first column): what the
    # terminal shows of a run of more than TERMINAL_RANKS ranks (`focus_ranks`).
    focus: list[str] = field(default_factory=list)


def diagnosis_heading(run: RunAnalysis) -> str:
    """What the numbered findings amount to, in one line (every front end prints this one):
    the causes, and the notes on the measurement itself (profiler distortion) counted apart,
    so that the count matches the numbers below it."""
    d = run.diagnosis
    causes = [f for f in d.findings if f.kind == FindingKind.CAUSE]
    measurement = sum(f.kind == FindingKind.MEASUREMENT for f in d.findings)
    setup = sum(f.kind == FindingKind.NOTE for f in d.findings)
    about = "".join(
        f"; {fmt.plural(n, 'note')} {what}"
        for n, what in ((measurement, "on the measurement itself"), (setup, "on the set-up"))
        if n
    )
    if not run.gpu:
        if not causes:
            return f"CPU (gloo) trace: no structural finding{about} (timing is not measured on CPU)"
        return (
            f"{fmt.plural(len(causes), 'finding')} on a CPU (gloo) trace: structural, not costed "
            f"(timing is not measured on CPU){about}"
        )
    if causes:
        return f"{fmt.plural(len(causes), 'cause')} to act on, the first first{about}"
    if d.minor:
        return (
            "Healthy: no cause costs 1 % of the step or more, or has a change predicted to save "
            f"more than the run's noise (minor ones below){about}"
        )
    return f"Healthy: no rule found a problem in the run{about}"


# A run of more ranks than this: the terminal's per-rank tables show the ranks that stand out,
# not one line per rank (the view keeps every rank: --json, --csv and the report have them).
TERMINAL_RANKS = 16
# Of each figure, the ranks with the largest values that stand out.
FOCUS_PER_FIGURE = 4


def focus_ranks(
    per: pd.DataFrame, named: set[int], across: pd.DataFrame | None = None
) -> list[str]:
    """The ranks that stand out, in rank order: the slowest, the most exposed and the idlest
    by their median step (a few of each); across ranks (`across`: the cross-rank view's
    per-rank table), those that wait the most and those that arrive last the most often (a
    straggler's own step need not be the slowest); the `named` ones (by the findings); the
    first."""
    if per.empty:
        return []
    labels = per["label"].astype(str).tolist()
    picked = {labels[0]}
    for column in ("step_us", "exposed_pct", "idle_pct"):
        values = pd.to_numeric(per[column], errors="coerce")
        picked.update(labels[i] for i in values.nlargest(FOCUS_PER_FIGURE).index)
    if across is not None and not across.empty:
        for column in ("wait_pct", "arrived_last_share"):
            values = pd.to_numeric(across[column], errors="coerce")
            named = named | {
                int(across["rank"][i]) for i in values.nlargest(FOCUS_PER_FIGURE).index
            }
    picked.update(label for label, rank in zip(labels, per["rank"], strict=True) if rank in named)
    return [label for label in labels if label in picked]


def rank_label(r: RankAnalysis, ranks: list[RankAnalysis]) -> str:
    """ "rank 3", or the file name too where rank numbers do not tell traces apart."""
    return rank_labels([r], ranks)[0]


def rank_labels(these: list[RankAnalysis], ranks: list[RankAnalysis]) -> list[str]:
    """`rank_label` of each of `these`, the rank numbers of `ranks` counted once (every
    rank's label on its own counts them all: a million counts at a thousand ranks)."""
    counts = Counter(x.rank for x in ranks)
    return [
        f"rank {r.rank}"
        if r.rank is not None and counts[r.rank] == 1
        else f"rank {'?' if r.rank is None else r.rank} ({Path(r.path).name})"
        for r in these
    ]


# --- the run's parts --------------------------------------------------------------------------


def per_rank(run: RunAnalysis) -> pd.DataFrame:
    """Per timing rank, its headline figures from its median step (the breakdown every view
    and rule reads: `RunAnalysis.rank_breakdown`), in % of that step; and overlap, the
    median over its steps (not a part of the step)."""
    rows = []
    for r, label in zip(run.ranks, rank_labels(run.ranks, run.ranks), strict=True):
        row: dict[str, Any] = {"label": label, "rank": r.rank}
        b = run.rank_breakdown(r)
        row["overlap_pct"] = iv.column_median(r.steps, "overlap_pct")
        if b is None:  # CPU traces: the step only
            row["step_us"] = iv.column_median(r.steps, "step_us")
            for part in ("exposed", *PARTS):
                row[part.replace("_us", "") + "_pct"] = np.nan
            rows.append(row)
            continue
        step = b["step_us"]
        row["step_us"] = step
        for part in PARTS:
            value = b[part]
            row[part.replace("_us", "_pct")] = 100.0 * value / step if value is not None else np.nan
        exposed = sum(
            b[p] or 0.0 for p in ("exposed_transfer_us", "exposed_wait_us", "exposed_unsplit_us")
        )
        row["exposed_pct"] = 100.0 * exposed / step
        rows.append(row)
    return pd.DataFrame(rows)


def _worst(frame: pd.DataFrame, column: str) -> tuple[float, str]:
    values = pd.to_numeric(frame[column], errors="coerce")
    if values.notna().sum() == 0:
        return float("nan"), ""
    i = values.idxmax()
    return float(values[i]), str(frame.loc[i, "label"])


def _worst_row(frame: pd.DataFrame) -> pd.Series | None:
    """The rank whose median step exposes the most communication."""
    values = pd.to_numeric(frame["exposed_pct"], errors="coerce") if len(frame) else None
    if values is None or values.notna().sum() == 0:
        return None
    return frame.loc[values.idxmax()]


def _range(frame: pd.DataFrame, column: str) -> str:
    values = pd.to_numeric(frame[column], errors="coerce").dropna()
    if len(values) < 2:
        return ""
    return f"ranks range {values.min():.1f}–{values.max():.1f} %"


def cards(run: RunAnalysis, per: pd.DataFrame | None = None) -> list[Card]:
    """Headline cards, per rank: the worst rank's figure, with the range over ranks (`per`:
    `per_rank(run)` where the caller has it)."""
    per = per_rank(run) if per is None else per
    out: list[Card] = []
    if per.empty:
        return out
    steps = pd.to_numeric(per["step_us"], errors="coerce")
    if steps.notna().any():
        slowest = per.loc[steps.idxmax(), "label"]
        sub = (
            f"median profiled step of the slowest rank ({slowest})"
            if len(per) > 1
            else "median profiled step"
        )
        sub += _beside_unprofiled(run, float(steps.max()))
        out.append(Card("step_ms", "Step time (profiled)", fmt.ms(steps.max(), " ms"), sub))
    if not run.gpu:
        out.append(
            Card(
                "exposed_pct",
                "Exposed communication",
                fmt.DASH,
                "CPU (gloo) trace: collectives run on the host; overlap not measured",
            )
        )
        return out
    transfer_known = per["exposed_transfer_pct"].notna().any()
    if transfer_known:
        value, who = _worst(per, "exposed_transfer_pct")
        tone = "bad" if value >= 10 else "warn" if value >= 3 else "good"
        sub = f"of the step, waiting excluded; worst: {who}"
        out.append(
            Card("exposed_transfer_pct", "Exposed transfer", fmt.pct(value, " %"), sub, tone)
        )
        value, who = _worst(per, "exposed_wait_pct")
        tone = "bad" if value >= 10 else "warn" if value >= 3 else "good"
        out.append(
            Card(
                "exposed_wait_pct",
                "Waiting for peers",
                fmt.pct(value, " %"),
                f"of the step: waiting inside NCCL kernels that no compute hides; worst: {who} "
                "(Across ranks counts its hidden waiting too)",
                tone,
            )
        )
    else:
        value, who = _worst(per, "exposed_pct")
        tone = "bad" if value >= 20 else "warn" if value >= 5 else "good"
        sub = f"of the step ({who}); waiting and transfer not told apart: no cross-rank match"
        out.append(Card("exposed_pct", "Exposed communication", fmt.pct(value, " %"), sub, tone))
    value, who = _worst(per, "idle_pct")
    out.append(
        Card(
            "idle_pct",
            "GPU idle",
            fmt.pct(value, " %"),
            f"nothing on the GPU; worst: {who}"
            + (f"; {_range(per, 'idle_pct')}" if len(per) > 1 else ""),
            "bad" if value >= 20 else "warn" if value >= 5 else "good",
        )
    )
    overlap = pd.to_numeric(per["overlap_pct"], errors="coerce")
    if overlap.notna().any():
        low = per.loc[overlap.idxmin(), "label"]
        out.append(
            Card(
                "overlap_pct",
                "Overlap",
                fmt.pct(overlap.min(), " %"),
                f"of communication hidden by compute; lowest: {low}"
                + (f"; {_range(per, 'overlap_pct')}" if len(per) > 1 else ""),
            )
        )
    return out


def _beside_unprofiled(run: RunAnalysis, profiled_us: float) -> str:
    """How a profiled step compares with run.json's un-profiled median, and why."""
    stats = run.run.figures.step_time_ms if run.run is not None else None
    if stats is None or not stats.median or not fmt.finite(profiled_us):
        return ""
    median = float(stats.median)
    change = 100.0 * (profiled_us / 1e3 / median - 1.0)
    if change >= 1.0:
        return (
            f"; {change:+.0f} % over the un-profiled median ({median:.2f} ms): the profiler's "
            "own overhead and step-to-step spread"
        )
    if change <= -1.0:
        return f"; {change:.0f} % under the un-profiled median ({median:.2f} ms)"
    return f"; about the un-profiled median ({median:.2f} ms)"


def breakdown_table(run: RunAnalysis) -> tuple[Table, list[BreakdownBar]]:
    """Per rank: its median step cut into parts (ms and % of the step)."""
    rows, bars = [], []
    every = run.ranks + run.detailed
    for r, label in zip(every, rank_labels(every, run.ranks), strict=True):
        b = run.rank_breakdown(r)
        label += " (detailed)" if r.source == Source.DETAILED else ""
        if b is None:
            continue
        step = b["step_us"]
        text = {
            part: fmt.DASH
            if b[part] is None
            else f"{b[part] / 1e3:.2f} ms ({100 * b[part] / step:.1f} %)"
            for part in STACK_ORDER
        }
        cells = [label, str(b["step"]), fmt.ms(step)]
        rows.append(cells + [text[p].replace(" ms", "") for p in STACK_ORDER])
        bars.append(
            BreakdownBar(
                label,
                b["step"],
                step / 1e3,
                {p: (b[p] / 1e3 if b[p] is not None else float("nan")) for p in STACK_ORDER},
                text,
            )
        )
    headers = ["rank", "step", "step ms", *(f"{PART_LABELS[p]} ms (%)" for p in STACK_ORDER)]
    return (
        Table(
            "breakdown",
            "Where each rank's step goes (its median step; the parts add up to the step)",
            headers,
            rows,
        ),
        bars,
    )


def rank_table(run: RunAnalysis) -> Table:
    """Per rank: median and min–max over the profiled steps of the headline figures."""
    with_recompute = any(
        bool((np.nan_to_num(iv.column_numbers(r.steps, "recompute_us"), nan=0.0) > 0).any())
        for r in run.ranks
        if len(r.steps)
    )
    headers = ["rank", "steps", "step ms", "exposed comm %", "overlap %", "comm ms", "compute ms"]
    headers += ["recompute %", "idle %"] if with_recompute else ["idle %"]
    rows = []
    for r, label in zip(run.ranks, rank_labels(run.ranks, run.ranks), strict=True):
        s = r.steps

        def cell(column: str, scale: float = 1.0, spec: str = ".1f", s=s) -> str:
            median, span = fmt.spread(s[column].tolist() if column in s else [], scale, spec)
            return f"{median} ({span})" if span else median

        cells = [
            label,
            str(len(s)),
            cell("step_us", 1e3, ".2f"),
            cell("exposed_pct"),
            cell("overlap_pct"),
            cell("comm_us", 1e3, ".2f"),
            cell("compute_us", 1e3, ".2f"),
        ]
        if with_recompute:
            cells.append(cell("recompute_pct"))
        cells.append(cell("idle_pct"))
        rows.append(cells)
    return Table("ranks", "Per rank (median and min–max over the profiled steps)", headers, rows)


def distortion_table(run: RunAnalysis) -> Table | None:
    items = run.distortion()
    if not items:
        return None
    rows = [
        [
            f"rank {d['rank']}",
            fmt.ms(d["detailed_step_us"]),
            fmt.ms(d["timing_median_step_us"]),
            fmt.signed(d["slowdown_pct"]),
            fmt.pct(d["detailed_exposed_pct"]),
            fmt.pct(d["timing_exposed_pct"]),
        ]
        for d in items
    ]
    headers = [
        "rank",
        "detailed step ms",
        "timing median ms",
        "slowdown %",
        "detailed exposed %",
        "timing exposed %",
    ]
    return Table(
        "distortion",
        "Profiler distortion: the detailed step (record_shapes + with_stack) vs the timing steps",
        headers,
        rows,
    )


def block_table(run: RunAnalysis, top: int | None = None) -> Table | None:
    """Per block × phase × collective, averaged over ranks, worst exposed first."""
    blocks = pd.concat([r.blocks for r in run.ranks if len(r.blocks)] or [pd.DataFrame()])
    if blocks.empty:
        return None
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
    shown = grouped if top is None else grouped.head(top)
    with_recompute = bool(grouped["recompute"].notna().any())
    headers = [
        "block",
        "phase",
        "collective",
        "count (unit / expected)",
        "comm ms",
        "exposed ms",
        "MB",
        "busbw GB/s",
        "block compute ms",
    ]
    if with_recompute:  # under AC the unit's backward window also recomputes its forward
        headers.append("+ recompute ms")
    rows, flags = [], []
    for row in shown.itertuples():
        count = fmt.count(row.count)
        if fmt.finite(row.expected):
            count += f" ({row.unit:g}/{row.expected:g})"
        cells = [
            str(row.block),
            str(row.phase),
            str(row.collective),
            count,
            fmt.ms(row.time),
            fmt.ms(row.exposed),
            fmt.mb(row.nbytes),
            fmt.num(row.busbw, ".0f"),
            fmt.ms(row.compute),
        ]
        if with_recompute:
            cells.append(fmt.ms(row.recompute))
        rows.append(cells)
        flags.append(bool(fmt.finite(row.excess) and row.excess > 1e-9))
    ranks = int(grouped["ranks"].max())
    note = f", mean of {ranks} ranks" if ranks > 1 else ""
    return Table(
        "blocks",
        f"Per block and phase, per step (worst exposed first{note}; {len(shown)} of "
        f"{len(grouped)} rows)",
        headers,
        rows,
        numeric_from=3,
        highlight=flags,
        narrow=("MB", "busbw GB/s"),
        heading=3,
    )


def crossrank_table(run: RunAnalysis) -> Table | None:
    """Per rank: waiting inside NCCL kernels for peers, who arrived last, clock offset."""
    cross = run.crossrank
    if cross is None or cross.empty:
        return None
    per = cross.per_rank
    rows = []
    for row in per.itertuples():
        share = (
            f"{row.arrived_last} ({100 * row.arrived_last_share:.0f} %)"
            if fmt.finite(row.arrived_last_share)
            else str(row.arrived_last)
        )
        rows.append(
            [
                f"rank {row.rank}",
                f"{int(row.n_matched):,}",
                fmt.ms(row.wait_us_per_step),
                fmt.pct(row.wait_pct),
                share,
                fmt.signed(row.clock_offset_us),
            ]
        )
    return Table(
        "crossrank",
        f"Across ranks ({len(cross.matched):,} matched collectives; transfer = the shortest "
        "duration across ranks, the rest is waiting: all of it, hidden behind compute or not, "
        "median step; the breakdown's waiting for peers is its exposed part)",
        [
            "rank",
            "matched collectives",
            "waiting ms / step",
            "waiting % of step",
            "arrived last",
            "clock offset µs",
        ],
        rows,
    )


def transfer_table(run: RunAnalysis) -> Table | None:
    """Per collective type: busbw from kernel time (waiting included) and transfer time."""
    cross = run.crossrank
    if cross is None or cross.empty:
        return None
    matched = cross.matched
    # Of the ranks' collectives, only two columns are read: joined as arrays, not as frames
    # (a frame without one of them reads as all missing there, as `pd.concat` aligns it).
    frames = [r.collectives for r in run.ranks if len(r.collectives)]

    def joined(column: str) -> pd.Series:
        parts = [
            array_of(f, column, object) if column in f else np.full(len(f), np.nan, object)
            for f in frames
        ]
        return pd.Series(np.concatenate(parts or [np.empty(0, dtype=object)]), dtype=object)

    kinds = joined("collective")
    kernel_busbw = pd.to_numeric(joined("busbw_gbps"), errors="coerce")
    rows = []
    for kind in sorted(matched["collective"].dropna().astype(str).unique()):
        mine = matched[matched["collective"].astype(str) == kind]
        bw = pd.to_numeric(mine["transfer_busbw_gbps"], errors="coerce").dropna()
        kernel = kernel_busbw[(kinds == kind).to_numpy(dtype=bool)].dropna()
        rows.append(
            [
                kind,
                f"{len(mine):,}",
                fmt.mb(pd.to_numeric(mine["bytes"], errors="coerce").median()),
                fmt.num(kernel.median() if len(kernel) else None, ",.1f"),
                fmt.num(bw.median() if len(bw) else None, ",.1f"),
                fmt.num(np.percentile(bw, 90) if len(bw) else None, ",.1f"),
            ]
        )
    if not rows:
        return None
    return Table(
        "transfer",
        "Bandwidth: a kernel's duration includes waiting for peers; the transfer time does not",
        [
            "collective",
            "matched",
            "median MB",
            "busbw from kernel time, median GB/s",
            "busbw from transfer time, median GB/s",
            "p90 GB/s",
        ],
        rows,
    )


def hta_table(run: RunAnalysis) -> Table | None:
    hta = run.hta
    if hta is None or hta.empty:
        return None
    rows = [
        [
            f"rank {row['rank']}",
            fmt.num(row.get("hta_pct"), ".2f"),
            fmt.num(row.get("ours_hta_rules_pct"), ".2f"),
            fmt.num(row.get("ours_steps_pct"), ".2f"),
        ]
        for row in hta.to_dict("records")
    ]
    tools = sorted(set(hta["tool"].dropna())) if "tool" in hta.columns else []
    where = f"same trace; {', '.join(tools)}" if tools else "same trace"
    return Table(
        "hta",
        f"Cross-check with HTA get_comm_comp_overlap ({where})",
        ["rank", "HTA overlap %", "fsdp-trace, HTA's rules %", "fsdp-trace, its steps %"],
        rows,
    )


def finding_view(f: Finding, minor: bool = False) -> FindingView:
    if f.kind != FindingKind.CAUSE:  # a note: about the measurement, or the set-up
        cost = ""
    elif not f.costed:
        cost = "not costed (CPU trace: no GPU timing)"
    else:
        cost = cost_text(f)
        if f.upper_bound:
            cost = "up to " + cost
        if f.saving is not None:
            cost += f"; the cause as measured: {fmt.ms(f.measured_us, ' ms')} per step"
        elif f.cost_note:
            cost += f"; {f.cost_note}"
    where = "; ".join(
        p
        for p in (
            fmt.ranks_text(f.ranks),
            short_list(f.blocks, 6) if f.blocks else "",
        )
        if p
    )
    return FindingView(
        number=f.number,
        rule=f.rule,
        title=f.title,
        cost=cost,
        cause=f.cause,
        evidence=f.evidence,
        why=f.why,
        change=f.change.text,
        cli=f.change.cli,
        code=f.change.code,
        basis=str(f.basis),
        where=where,
        symptoms=[finding_view(s) for s in f.symptoms],
        kind=f.kind,
        minor=minor,
    )


def _traces_description(run: RunAnalysis) -> str:
    devices = {r.device for r in run.ranks}
    kind = "GPU" if Device.GPU in devices else "CPU (gloo)"
    return (
        f"{fmt.plural(len(run.ranks), 'trace')} ({kind}), "
        f"{run.config.mesh.value.describe()}; no run.json: the configuration below is inferred "
        "from the traces"
    )


def run_view(run: RunAnalysis, top: int | None = 15) -> RunView:
    breakdown, bars = breakdown_table(run)
    findings = [finding_view(f) for f in run.diagnosis.findings]
    per = per_rank(run)
    return RunView(
        name=run.name,
        title=", ".join(run.inputs),
        description=headline.description(run.run) if run.run else _traces_description(run),
        verdict=run.diagnosis.verdict,
        healthy=run.diagnosis.healthy,
        run_figures=headline.figures(run.run) if run.run else [],
        cards=cards(run, per),
        config=config_lines(run.config),
        breakdown=breakdown,
        bars=bars,
        ranks=rank_table(run),
        distortion=distortion_table(run),
        blocks=block_table(run, top),
        crossrank=crossrank_table(run),
        transfer=transfer_table(run),
        findings=findings,
        minor=[finding_view(f, minor=True) for f in run.diagnosis.minor],
        notices=run.notices,
        hta=hta_table(run),
        cpu=not run.gpu,
        diagnosis_heading=diagnosis_heading(run),
        focus=focus_ranks(
            per,
            {r for f in run.diagnosis.findings for r in f.ranks},
            run.crossrank.per_rank if run.crossrank is not None else None,
        )
        if len(per) > TERMINAL_RANKS
        else [],
    )


def side_by_side(result: Result) -> Table | None:
    """Several runs analyzed together: one row each, per-rank figures as worst-rank values."""
    if len(result.runs) < 2:
        return None
    rows = []
    for run in result.runs:
        per = per_rank(run)
        step = pd.to_numeric(per["step_us"], errors="coerce").max() if len(per) else np.nan
        worst = _worst_row(per)  # one rank: its exposure and its own split
        exposed, transfer, wait = (
            (worst["exposed_pct"], worst["exposed_transfer_pct"], worst["exposed_wait_pct"])
            if worst is not None
            else (np.nan, np.nan, np.nan)
        )
        idle, _ = _worst(per, "idle_pct") if len(per) else (np.nan, "")
        rows.append(
            [
                run.name,
                run.config.mesh.value.describe(),
                run.diagnosis.verdict,
                str(len(run.ranks)),
                fmt.ms(step),
                fmt.pct(exposed),
                fmt.pct(transfer),
                fmt.pct(wait),
                fmt.pct(idle),
            ]
        )
    return Table(
        "runs",
        "Runs side by side (the rank exposing the most, its median step; idle: the worst rank)",
        [
            "run",
            "mesh",
            "verdict",
            "ranks",
            "step ms",
            "exposed %",
            "exposed transfer %",
            "waiting %",
            "idle %",
        ],
        rows,
        numeric_from=3,
    )
