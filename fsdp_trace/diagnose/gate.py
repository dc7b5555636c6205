"""`--fail-on "exposed_pct>5"`: a CI gate over any reported metric.

A condition is `metric OP value` with OP one of > >= < <= == !=. Per-rank metrics (the
median over the rank's timing steps) fail when any rank violates the condition; run metrics
come from run.json's figures; `findings` counts the diagnosis findings.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass

import numpy as np

from fsdp_trace.analyze.results import Analysis
from fsdp_trace.errors import UserError

OPS = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
}
CONDITION = re.compile(r"^\s*([a-z_]+)\s*(>=|<=|==|!=|>|<)\s*(-?[0-9.]+(?:e-?\d+)?)\s*$")
RANK_METRICS = {
    "exposed_pct": ("exposed_pct", 1.0),
    "overlap_pct": ("overlap_pct", 1.0),
    "idle_pct": ("idle_pct", 1.0),
    "step_ms": ("step_us", 1e-3),
    "exposed_ms": ("exposed_us", 1e-3),
    "comm_ms": ("comm_us", 1e-3),
    "compute_ms": ("compute_us", 1e-3),
}
RUN_METRICS = (
    "mfu",
    "tokens_per_s_per_gpu",
    "scaling_efficiency",
    "peak_allocated_gib",
    "num_alloc_retries",
)
METRICS = (*RANK_METRICS, *RUN_METRICS, "findings")


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
        raise UserError(f"--fail-on {text!r}: write metric OP value, e.g. 'exposed_pct>5'")
    metric, op, value = match.groups()
    if metric not in METRICS:
        raise UserError(
            f"--fail-on {text!r}: unknown metric {metric!r}; one of {', '.join(METRICS)}"
        )
    return Condition(metric, op, float(value))


def values(condition: Condition, analysis: Analysis, n_findings: int) -> list[tuple[str, float]]:
    """(where, value) pairs the condition is checked against."""
    if condition.metric == "findings":
        return [("diagnosis", float(n_findings))]
    if condition.metric in RUN_METRICS:
        figure = ((analysis.run or {}).get("figures") or {}).get(condition.metric)
        if figure is None:
            raise UserError(
                f"--fail-on {condition}: {condition.metric} needs a capture run "
                "directory whose run.json has it"
            )
        return [("run", float(figure))]
    column, scale = RANK_METRICS[condition.metric]
    out = []
    for rank in analysis.ranks:
        series = rank.steps[column].astype(float)
        if series.notna().any():
            out.append((f"rank {rank.rank}", float(np.nanmedian(series)) * scale))
    return out


def violations(conditions: list[Condition], analysis: Analysis, n_findings: int) -> list[str]:
    """One line per violated condition, naming where and the value found."""
    lines = []
    for condition in conditions:
        hits = [
            (where, v)
            for where, v in values(condition, analysis, n_findings)
            if OPS[condition.op](v, condition.value)
        ]
        if hits:
            found = ", ".join(f"{where}: {v:.4g}" for where, v in hits)
            lines.append(f"{condition} violated ({found})")
    return lines
