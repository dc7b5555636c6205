"""The tuning table (`fsdp-trace tune`) as text, once for the terminal, tune.md and tune.html:
each run in the order captured, the knob it added, its predicted and measured change in
tokens/s/GPU against the run kept before it, and whether it was kept."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from fsdp_trace.present import fmt
from fsdp_trace.present.compare import CPU_EFFICIENCY, on_cpu
from fsdp_trace.present.fmt import plural
from fsdp_trace.present.view import Table
from fsdp_trace.tune import Role, Trial, TuneResult


def _tried(trial: Trial, nproc: int, cpu: bool) -> str:
    many = plural(nproc, "CPU rank") if cpu else plural(nproc, "GPU")
    if trial.role is Role.BASELINE:
        return f"{plural(1, 'CPU rank') if cpu else '1 GPU'} (baseline)"
    if trial.role is Role.EAGER:
        return f"{many}, eager"
    if trial.role is Role.REPEAT:
        return f"{many}, eager again (noise)"
    return f"+ {trial.knob}"


def _predicted(trial: Trial) -> str:
    if trial.predicted_pct is None:
        return fmt.DASH
    text = fmt.signed(trial.predicted_pct, " %")
    if fmt.finite(trial.predicted_uncertainty_pct):
        text += f" ± {trial.predicted_uncertainty_pct:.1f}"
    return text


def _kept(trial: Trial) -> str:
    if trial.role is not Role.TRIAL:
        return fmt.DASH
    if trial.failed:
        return f"failed: {trial.failed}"
    return "kept" if trial.kept else "no"


HEADERS = (
    "#",
    "run",
    "what was tried",
    "tok/s/GPU",
    "efficiency",
    "exposed %",
    "mem GiB",
    "predicted Δ",
    "measured Δ",
    "against",
    "kept",
)
NUMERIC = {"#", "tok/s/GPU", "efficiency", "exposed %", "mem GiB", "predicted Δ", "measured Δ"}


def numeric(header: str) -> bool:
    return header in NUMERIC


@dataclass(frozen=True)
class TuneView:
    """What every front end shows for a tuning loop: its summary lines, table and notices."""

    summary: list[str]
    table: Table
    notices: list[str]
    rows: pd.DataFrame  # the compare-style frame (one row per run) the chart draws


def tune_view(result: TuneResult, folder: Path, figures: pd.DataFrame) -> TuneView:
    """`figures`: `sweep.run_table` over the trials' run directories, in the trials' order
    (failed trials have none)."""
    by_run = {Path(row["run"]).name: row for row in figures.to_dict("records")}
    cpu = bool(len(figures)) and bool((figures["device"] == "cpu").all())
    rows = []
    for i, trial in enumerate(result.trials):
        row = by_run.get(trial.name, {})
        efficiency = fmt.fraction_pct(row.get("scaling_efficiency"))
        if row and on_cpu(row):
            efficiency = CPU_EFFICIENCY
        rows.append(
            [
                str(i + 1),
                trial.name,
                _tried(trial, result.nproc, cpu),
                fmt.num(trial.tokens_per_s_per_gpu, ",.0f"),
                efficiency,
                fmt.pct(row.get("exposed_pct")),
                fmt.num(row.get("peak_allocated_gib"), ".2f"),
                _predicted(trial),
                fmt.signed(trial.measured_pct, " %"),
                trial.against or fmt.DASH,
                _kept(trial),
            ]
        )
    table = Table(
        "tune",
        "Tuning, run by run: what each knob bought (tokens/s/GPU against the run kept before it)",
        list(HEADERS),
        rows,
        highlight=[t.kept for t in result.trials],
    )
    kept = ", ".join(f"{k}={v}" for k, v in result.kept.items()) or "none"
    noise = (
        f"run-to-run noise {fmt.pct(result.noise_pct)} % of tokens/s/GPU (the eager run "
        "against its repeat, at least 2 standard errors): a knob is kept when it gains more"
        if result.noise_pct is not None
        else "run-to-run noise unknown (no tokens/s/GPU measured): nothing can be kept"
    )
    summary = [f"kept: {kept}", noise, f"stopped: {result.stopped}", *result.notes]
    chart = figures.copy()
    chart["label"] = [Path(r).name for r in chart["run"]]
    by_name = {t.name: t for t in result.trials}
    chart["change"] = [_tried(by_name[n], result.nproc, cpu) for n in chart["label"]]
    return TuneView(summary, table, list(figures.attrs.get("notices") or []), chart)


def markdown(view: TuneView, title: str) -> str:
    """tune.md: the table a tuning write-up pastes."""
    table = view.table

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = [f"# {title}", "", *(f"- {line}" for line in view.summary), ""]
    lines.append("| " + " | ".join(table.headers) + " |")
    lines.append("|" + "|".join("---:" if numeric(h) else "---" for h in table.headers) + "|")
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in table.rows]
    if view.notices:
        lines += ["", *(f"> {notice}" for notice in view.notices)]
    return "\n".join(lines) + "\n"


def folder_view(result: TuneResult, folder: Path) -> TuneView:
    """The view of a tuning folder: its runs' figures read back (`sweep.run_table`)."""
    from fsdp_trace.sweep import run_table

    runs = [folder / t.name for t in result.trials if not t.failed]
    figures = run_table(runs, notify=None)
    return tune_view(result, folder, figures)
