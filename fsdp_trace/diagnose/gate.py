"""`--fail-on "exposed_pct>5"`: a CI gate over the reported metrics.

A condition is `metric OP value` with OP one of > >= < <= == !=. Per-rank metrics (the
median over the rank's timing steps) fail when any rank violates the condition; the step
breakdown's parts (`exposed_wait_pct`, `exposed_transfer_pct`, ...) are per rank too; run
metrics come from run.json's figures; `findings` counts the causes to act on (minor findings
and notes about the measurement apart). A metric the input cannot give (overlap on CPU/gloo
traces, waiting with one rank, MFU without run.json) is an error, never a silent pass.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass

import numpy as np

from fsdp_trace.analysis.table import array_of
from fsdp_trace.diagnose.finding import FindingKind
from fsdp_trace.errors import UserError
from fsdp_trace.fmt import CPU_SCALING
from fsdp_trace.result import RunAnalysis
from fsdp_trace.runrecord import on_cpu

OPS = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
}
NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
CONDITION = re.compile(rf"^\s*([a-z_]+)\s*(>=|<=|==|!=|>|<)\s*({NUMBER})\s*$")


@dataclass(frozen=True)
class Metric:
    """A gateable metric: where its value comes from and what it means."""

    help: str
    source: str  # "steps", "breakdown", "crossrank", "distortion", "run" or "findings"
    column: str = ""  # steps / crossrank column, or run.json figure
    scale: float = 1.0
    fraction: bool = False  # a 0–1 figure: messages also show it as a percentage


METRICS: dict[str, Metric] = {
    "exposed_pct": Metric("exposed communication, % of the step", "steps", "exposed_pct"),
    "overlap_pct": Metric("communication hidden behind compute, % of it", "steps", "overlap_pct"),
    "idle_pct": Metric("GPU idle (no kernel), % of the step", "steps", "idle_pct"),
    "step_ms": Metric("step time (GPU window), ms", "steps", "step_us", 1e-3),
    "exposed_ms": Metric("exposed communication per step, ms", "steps", "exposed_us", 1e-3),
    "comm_ms": Metric(
        "communication (union of NCCL kernels) per step, ms", "steps", "comm_us", 1e-3
    ),
    "compute_ms": Metric(
        "compute (union of compute kernels) per step, ms", "steps", "compute_us", 1e-3
    ),
    "recompute_pct": Metric(
        "activation-checkpoint recompute, % of the step", "steps", "recompute_pct"
    ),
    "recompute_ms": Metric(
        "activation-checkpoint recompute per step, ms", "steps", "recompute_us", 1e-3
    ),
    "exposed_transfer_pct": Metric(
        "exposed communication moving data (waiting excluded), % of the step",
        "breakdown",
        "exposed_transfer_us",
        100.0,
    ),
    "exposed_transfer_ms": Metric(
        "exposed communication moving data per step, ms", "steps", "exposed_transfer_us", 1e-3
    ),
    "exposed_wait_pct": Metric(
        "exposed waiting for peers inside NCCL kernels, % of the step",
        "breakdown",
        "exposed_wait_us",
        100.0,
    ),
    "exposed_wait_ms": Metric(
        "exposed waiting for peers per step, ms", "steps", "exposed_wait_us", 1e-3
    ),
    "fsdp_copy_pct": Metric(
        "FSDP's own copy/cast kernels alone on the GPU, % of the step",
        "breakdown",
        "fsdp_copy_us",
        100.0,
    ),
    "model_compute_pct": Metric(
        "model compute (no FSDP copies, no recompute), % of the step",
        "breakdown",
        "model_compute_us",
        100.0,
    ),
    "exposed_unsplit_pct": Metric(
        "exposed communication not matched across ranks, % of the step",
        "breakdown",
        "exposed_unsplit_us",
        100.0,
    ),
    "exposed_unsplit_ms": Metric(
        "exposed communication not matched across ranks per step, ms",
        "steps",
        "exposed_unsplit_us",
        1e-3,
    ),
    "idle_ms": Metric("GPU idle (no kernel) per step, ms", "steps", "idle_us", 1e-3),
    "fsdp_copy_ms": Metric(
        "FSDP's own copy/cast kernels alone on the GPU per step, ms", "steps", "fsdp_copy_us", 1e-3
    ),
    "model_compute_ms": Metric(
        "model compute (no FSDP copies, no recompute) per step, ms",
        "steps",
        "model_compute_us",
        1e-3,
    ),
    "wait_pct": Metric(
        "time waiting inside NCCL kernels for later ranks, % of the step", "crossrank", "wait_pct"
    ),
    "wait_ms": Metric(
        "time waiting inside NCCL kernels for later ranks per step, ms",
        "crossrank",
        "wait_us_per_step",
        1e-3,
    ),
    "straggler_pct": Metric(
        "share of its matched collectives the rank arrived last at, %",
        "crossrank",
        "arrived_last_share",
        100.0,
    ),
    "distortion_pct": Metric(
        "detailed step's slowdown over the timing median, %", "distortion", "slowdown_pct"
    ),
    "mfu": Metric("model FLOPs utilisation (run.json), a fraction", "run", "mfu", fraction=True),
    "tokens_per_s_per_gpu": Metric("tokens/s/GPU (run.json)", "run", "tokens_per_s_per_gpu"),
    "scaling_efficiency": Metric(
        "tokens/s/GPU ÷ the 1-GPU baseline's (run.json), a fraction",
        "run",
        "scaling_efficiency",
        fraction=True,
    ),
    "peak_allocated_gib": Metric(
        "peak allocated memory (run.json), GiB", "run", "peak_allocated_gib"
    ),
    "num_alloc_retries": Metric("allocator retries (run.json)", "run", "num_alloc_retries"),
    "findings": Metric("number of causes to act on (minor ones apart)", "findings"),
}
RUN_HINTS = {
    "scaling_efficiency": "capture with --baseline",
    "mfu": "needs the model's FLOPs and a GPU with a known peak",
}


@dataclass(frozen=True)
class Condition:
    metric: str
    op: str
    value: float

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"


def parse(text: str) -> Condition:
    match = CONDITION.match(text)
    if not match:
        raise UserError(
            f"--fail-on {text!r}: write metric OP number, e.g. 'exposed_pct>5' (OP: "
            + " ".join(OPS)
            + ")"
        )
    metric, op, value = match.groups()
    if metric not in METRICS:
        raise UserError(
            f"--fail-on {text!r}: unknown metric {metric!r}; one of {', '.join(METRICS)}"
        )
    return Condition(metric, op, float(value))


def _unavailable(condition: Condition, why: str) -> UserError:
    return UserError(
        f"--fail-on {condition}: metric {condition.metric} is not available for this input: {why}"
    )


def _per_rank_medians(
    condition: Condition, analysis: RunAnalysis, metric: Metric
) -> list[tuple[str, float]]:
    out = []
    for rank in analysis.ranks:
        if metric.column not in rank.steps:
            continue
        series = rank.steps[metric.column].to_numpy(dtype=np.float64)
        if metric.source == "breakdown":  # a part's share of each step
            with np.errstate(invalid="ignore", divide="ignore"):
                series = series / array_of(rank.steps, "step_us", np.float64)
        if np.isfinite(series).any():
            out.append((f"rank {rank.rank}", float(np.nanmedian(series)) * metric.scale))
    if not out:
        if any(metric.column in r.steps for r in analysis.ranks):
            why = (
                f"CPU (gloo) traces have no GPU kernels, so no per-step {metric.column}"
                if not analysis.gpu
                else "waiting and transfer are told apart only for collectives matched across "
                "two or more ranks"
                if metric.column in ("exposed_transfer_us", "exposed_wait_us")
                else "no analyzed step has it"
            )
        else:
            why = f"the analysis has no per-step {metric.column}"
        raise _unavailable(condition, why)
    return out


def values(condition: Condition, analysis: RunAnalysis) -> list[tuple[str, float]]:
    """(where, value) pairs the condition is checked against; UserError when the input
    cannot give the metric."""
    metric = METRICS[condition.metric]
    if metric.source == "findings":
        causes = [f for f in analysis.diagnosis.findings if f.kind == FindingKind.CAUSE]
        return [("diagnosis", float(len(causes)))]
    if metric.source == "run":
        if analysis.run is None:
            raise _unavailable(condition, "it comes from run.json: analyze a capture run directory")
        figure = getattr(analysis.run.figures, metric.column, None)
        if condition.metric == "scaling_efficiency" and figure is not None and on_cpu(analysis.run):
            raise _unavailable(condition, f"a CPU (gloo) run: scaling efficiency is {CPU_SCALING}")
        if figure is None:
            hint = RUN_HINTS.get(condition.metric, "the capture did not record it")
            raise _unavailable(condition, f"run.json has no {metric.column} ({hint})")
        return [("run", float(figure))]
    if metric.source == "crossrank":
        cross = analysis.crossrank
        if cross is None or cross.empty:
            raise _unavailable(
                condition, "it needs GPU traces of two or more ranks whose collectives match"
            )
        ranks = array_of(cross.per_rank, "rank")
        found = cross.per_rank[metric.column].to_numpy(dtype=np.float64) * metric.scale
        return [
            (f"rank {int(r)}", float(v))
            for r, v in zip(ranks, found, strict=True)
            if np.isfinite(v)
        ]
    if metric.source == "distortion":
        items = analysis.distortion()
        if not items:
            raise _unavailable(
                condition, "it needs a capture run's detailed traces (do not pass --no-detailed)"
            )
        return [(f"rank {d['rank']}", float(d[metric.column])) for d in items]
    return _per_rank_medians(condition, analysis, metric)


def _show(metric: Metric, value: float) -> str:
    return f"{value:.4g} ({100 * value:.1f} %)" if metric.fraction else f"{value:.4g}"


def violations(conditions: list[Condition], runs: list[RunAnalysis]) -> list[str]:
    """One line per violated condition and run, naming where and the value found."""
    lines = []
    for run in runs:
        prefix = f"{run.name}: " if len(runs) > 1 else ""
        for condition in conditions:
            metric = METRICS[condition.metric]
            hits = [
                (where, v)
                for where, v in values(condition, run)
                if OPS[condition.op](v, condition.value)
            ]
            if hits:
                found = ", ".join(f"{where}: {_show(metric, v)}" for where, v in hits)
                lines.append(f"{prefix}{condition} violated ({found})")
    return lines
