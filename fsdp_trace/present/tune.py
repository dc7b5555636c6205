"""The tuning table (`fsdp-trace tune`) as text, once for the terminal, tune.md and tune.html:
each run in the order captured, the knob it added, its predicted and measured change against
the run kept before it, and whether it was kept. Every Δ and the noise can be recomputed from
the table: they compare the p10 tok/s/GPU column (`tune.speed`), and efficiency is tok/s/GPU
÷ the 1-GPU baseline's at the same batch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from fsdp_trace import fmt
from fsdp_trace.fmt import plural
from fsdp_trace.present.compare import CPU_EFFICIENCY, on_cpu
from fsdp_trace.present.view import Table
from fsdp_trace.trials import ON_CPU, ONE_GPU, Role, Trial, TuneResult, describe


def _tried(trial: Trial, nproc: int, cpu: bool, baselines: int) -> str:
    many = plural(nproc, "CPU rank") if cpu else plural(nproc, "GPU")
    if trial.role is Role.BASELINE:
        one = plural(1, "CPU rank") if cpu else "1 GPU"
        if baselines > 1 and trial.changes:
            return f"{one} (baseline at {describe(trial.changes)})"
        return f"{one} (baseline)"
    if trial.role is Role.EAGER:
        return f"{many}, eager"
    if trial.role is Role.REPEAT:
        return f"{many}, eager again (noise)"
    text = f"+ {trial.knob}"
    captured = describe(trial.changes)
    if trial.changes and captured != trial.knob:
        text += f" ({captured})"  # a batch factor, captured as a batch size
    return text


def _predicted(trial: Trial) -> str:
    if trial.predicted_pct is None:
        return fmt.DASH
    text = fmt.signed(trial.predicted_pct, " %")
    if fmt.finite(trial.predicted_uncertainty_pct):
        text += f" ± {trial.predicted_uncertainty_pct:.1f}"
    return text


def _kept(trial: Trial) -> str:
    if trial.failed:
        return f"failed: {trial.failed}"
    if trial.role is not Role.TRIAL:
        return fmt.DASH
    return "kept" if trial.kept else "no"


def _speed(trial: Trial, statistic: str) -> str:
    text = fmt.num(trial.speed, ",.0f")
    if trial.speed is not None and trial.statistic and trial.statistic != statistic:
        text += f" ({trial.statistic})"
    return text


def _efficiency(trial: Trial, row: dict) -> str:
    if (row and on_cpu(row)) or trial.no_efficiency == ON_CPU:
        return CPU_EFFICIENCY
    return fmt.fraction_pct(trial.efficiency)


STATISTIC = "p10"  # whatif.ANCHOR; tests/test_tune.py checks they agree
SPEED = f"{STATISTIC} tok/s/GPU"
HEADERS = (
    "#",
    "run",
    "what was tried",
    "tok/s/GPU",
    SPEED,
    "efficiency",
    "exposed %",
    "mem GiB",
    "predicted Δ",
    "measured Δ",
    "against",
    "kept",
)
NUMERIC = set(HEADERS) - {"run", "what was tried", "against", "kept"}


def numeric(header: str) -> bool:
    return header in NUMERIC


@dataclass(frozen=True)
class TuneView:
    """What every front end shows for a tuning loop: its summary lines, table and notices."""

    summary: list[str]
    table: Table
    notices: list[str]
    rows: pd.DataFrame  # the compare-style frame (one row per run) the chart draws


def _noise_line(result: TuneResult) -> str:
    if result.noise_pct is None:
        return f"run-to-run noise unknown (no {SPEED} measured): nothing can be kept"
    repeat = next((t for t in result.trials if t.role is Role.REPEAT), None)
    differed = repeat.measured_pct if repeat is not None else None
    text = f"run-to-run noise {fmt.pct(result.noise_pct)} % of {SPEED}: "
    if differed is not None and abs(differed) >= result.noise_pct - 1e-9:
        text += f"the eager run's repeat measured {fmt.signed(differed, ' %')}"
    else:
        text += (
            "2 standard errors of the two runs' step statistics (σ/√n each), more than "
            f"the repeat's {fmt.signed(differed, ' %')}"
        )
    return text + "; a knob is kept when its measured Δ is larger"


def _efficiency_line(result: TuneResult, cpu: bool) -> str | None:
    if result.nproc <= 1:
        return f"efficiency: none — {ONE_GPU}"
    if cpu:
        return None  # the run table's CPU notice says why
    bases = [t for t in result.trials if t.role is Role.BASELINE and not t.failed]
    which = ", ".join(t.name for t in bases) or "none measured"
    return (
        "efficiency: tok/s/GPU ÷ that of the 1-GPU baseline at the same batch "
        f"({which}); --target is judged on it"
    )


def _blank_efficiency(result: TuneResult) -> list[str]:
    """One notice per reason a row's efficiency is blank, beyond the 1-GPU and CPU cases."""
    why: dict[str, list[str]] = {}
    for t in result.trials:
        if t.no_efficiency and t.no_efficiency not in (ONE_GPU, ON_CPU):
            why.setdefault(t.no_efficiency, []).append(t.name)
    return [
        f"efficiency left blank for {', '.join(names)}: {reason}" for reason, names in why.items()
    ]


def tune_view(result: TuneResult, folder: Path, figures: pd.DataFrame) -> TuneView:
    """`figures`: `sweep.run_table` over the trials' run directories, in the trials' order
    (failed trials have none); `result`'s figures as `tune.settle` left them."""
    by_run = {Path(row["run"]).name: row for row in figures.to_dict("records")}
    cpu = bool(len(figures)) and bool((figures["device"] == "cpu").all())
    baselines = sum(t.role is Role.BASELINE for t in result.trials)
    rows = []
    for i, trial in enumerate(result.trials):
        row = by_run.get(trial.name, {})
        rows.append(
            [
                str(i + 1),
                trial.name,
                _tried(trial, result.nproc, cpu, baselines),
                fmt.num(trial.tokens_per_s_per_gpu, ",.0f"),
                _speed(trial, STATISTIC),
                _efficiency(trial, row),
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
        f"Tuning, run by run: what each knob bought ({SPEED} against the run kept before it)",
        list(HEADERS),
        rows,
        highlight=[t.kept for t in result.trials],
        names=(1,),
        heading=2,
    )
    kept = ", ".join(f"{k}={v}" for k, v in result.kept.items()) or "none"
    basis = (
        f"measured Δ and the noise compare {SPEED}: tokens per step per GPU ÷ the run's "
        "10th-percentile un-profiled step, the statistic the what-if replay predicts "
        "(interference only lengthens steps); tok/s/GPU is run.json's, over the median step"
    )
    summary = [f"kept: {kept}", _noise_line(result), basis]
    efficiency = _efficiency_line(result, cpu)
    if efficiency:
        summary.append(efficiency)
    summary += [f"stopped: {result.stopped}", *result.notes]
    chart = figures.copy()
    chart["label"] = [Path(r).name for r in chart["run"]]
    by_name = {t.name: t for t in result.trials}
    chart["change"] = [_tried(by_name[n], result.nproc, cpu, baselines) for n in chart["label"]]
    chart["scaling_efficiency"] = pd.to_numeric(
        pd.Series([by_name[n].efficiency for n in chart["label"]], index=chart.index),
        errors="coerce",
    )
    notices = [*(figures.attrs.get("notices") or []), *_blank_efficiency(result)]
    return TuneView(summary, table, notices, chart)


def markdown(view: TuneView, title: str) -> str:
    """tune.md: the table a tuning write-up pastes."""
    lines = [f"# {title}", "", *(f"- {line}" for line in view.summary), "", *table_lines(view)]
    if view.notices:
        lines += ["", *(f"> {notice}" for notice in view.notices)]
    return "\n".join(lines) + "\n"


def table_lines(view: TuneView) -> list[str]:
    """The Markdown table alone (tune.md's, and the README's)."""
    table = view.table

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = ["| " + " | ".join(table.headers) + " |"]
    lines.append("|" + "|".join("---:" if numeric(h) else "---" for h in table.headers) + "|")
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in table.rows]
    return lines
