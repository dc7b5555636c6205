"""The JSON of an analysis (`--json`, `Result.to_json()`): every number, with stable names.

One run: the run's payload at the top level. Several runs: `runs`, one payload each, with
`inputs` and `grouping` beside them. Per run: `ranks[i]` (medians and spreads over the
timing steps, `breakdown`: the median step's parts), `steps`, `blocks`, `collectives`,
`breakdown` (per step), `config` (inferred, each item with its source), `crossrank`,
`findings` (ordered causes with their folded `symptoms`), `minor`, `verdict`, `notices`."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pandas as pd

from fsdp_trace import __version__
from fsdp_trace.analysis.job.config import InferredConfig, Item, Mesh
from fsdp_trace.analysis.job.crossrank import CrossRank
from fsdp_trace.analysis.rank.setup import SetUp
from fsdp_trace.diagnose.finding import Finding
from fsdp_trace.result import Result, RunAnalysis


class _Cleaned(list):
    """Rows `records` already made JSON-safe: `clean` passes them through (a table of a
    large trace is ~10^5 cells, walked once, not twice)."""


def clean(value: Any) -> Any:
    """JSON-safe: NaN and infinities → null, numpy scalars → Python, enums → their value."""
    if type(value) is _Cleaned:
        return value
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, str):
        return str(value)
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    return value


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """The rows as dicts of JSON-safe values (`clean`'s), built a column at a time: numeric
    columns convert in bulk, and only text/object cells go through `clean` one by one."""
    if frame is None or frame.empty:
        return []
    keys = [str(k) for k in frame.columns]
    columns = [_column_values(frame.iloc[:, i]) for i in range(frame.shape[1])]
    return _Cleaned(dict(zip(keys, row, strict=True)) for row in zip(*columns, strict=True))


def _column_values(column: pd.Series) -> list[Any]:
    """One column's cells as `records` gives them: missing (NaN, None, NA) and infinite
    numbers → None, numpy scalars → Python ones, text as plain str."""
    values = column.to_numpy()
    if values.dtype.kind in "iub":
        return values.tolist()
    if values.dtype.kind == "f":
        cells = values.astype(object)
        cells[~np.isfinite(values)] = None
        return cells.tolist()
    cells = column.astype(object).where(column.notna(), None).tolist()
    return [clean(v) for v in cells]


def _item(item: Item) -> dict[str, Any]:
    value = item.value
    if isinstance(value, Mesh | SetUp):
        value = {**dataclasses.asdict(value), "description": value.describe()}
    return {"value": value, "source": item.source, "evidence": item.evidence}


def config_payload(config: InferredConfig) -> dict[str, Any]:
    return {
        "setup": _item(config.setup),
        "world_size": _item(config.world_size),
        "mesh": _item(config.mesh),
        "units": [
            {
                "name": u.name,
                "raw": u.raw,
                "reshard_after_forward": _item(u.reshard_after_forward),
                "gathers_per_micro_batch": u.gathers_per_micro_batch,
                "checkpointed": u.checkpointed,
            }
            for u in config.units
        ],
        "micro_batches": _item(config.micro_batches),
        "checkpointed": _item(config.checkpointed),
        "forward_prefetch": _item(config.forward_prefetch),
        "backward_prefetch": _item(config.backward_prefetch),
        "compiled": _item(config.compiled),
        "reduce_dtype": _item(config.reduce_dtype),
        "accum_no_sync": _item(config.accum_no_sync),
        "labels": config.labels,
        "notices": config.notices,
    }


def finding_payload(f: Finding) -> dict[str, Any]:
    return {
        "number": f.number,
        "rule": f.rule,
        "title": f.title,
        "kind": f.kind,
        "cause": f.cause,
        "cost_us": f.cost_us,
        "cost_pct": f.cost_pct,
        "step_us": f.step_us,
        "basis": str(f.basis),
        "ranks": f.ranks,
        "blocks": f.blocks,
        "evidence": f.evidence,
        "why": f.why,
        "change": dataclasses.asdict(f.change),
        "symptoms": [finding_payload(s) for s in f.symptoms],
        "metrics": f.metrics,
    }


def crossrank_payload(crossrank: CrossRank | None) -> dict[str, Any] | None:
    if crossrank is None or crossrank.empty:
        return None
    return {
        "per_rank": records(crossrank.per_rank),
        "clock_offsets_us": crossrank.clock_offsets_us,
        "notices": crossrank.notices,
        "matched": records(crossrank.matched),
    }


def run_payload(run: RunAnalysis) -> dict[str, Any]:
    record = run.run
    return clean(
        {
            "name": run.name,
            "inputs": run.inputs,
            "verdict": run.diagnosis.verdict,
            "healthy": run.diagnosis.healthy,
            "run": {
                "config": record.raw.get("config"),
                "model": record.raw.get("model"),
                "world": record.raw.get("world"),
                "parallel": record.raw.get("parallel"),
                "figures": record.raw.get("figures"),
            }
            if record is not None
            else None,
            "config": config_payload(run.config),
            "ranks": [
                {
                    **r.summary(),
                    "breakdown": run.rank_breakdown(r),
                    "path": r.path,
                    "device": str(r.device),
                    "notices": r.notices,
                    "streams": r.streams,
                }
                for r in run.ranks
            ],
            "detailed": [
                {**r.summary(), "breakdown": run.rank_breakdown(r), "path": r.path}
                for r in run.detailed
            ],
            "distortion": run.distortion(),
            "steps": records(run.steps),
            "breakdown": records(run.breakdown),
            "blocks": records(run.blocks),
            "collectives": records(run.collectives),
            "hta": records(run.hta) if run.hta is not None else None,
            "findings": [finding_payload(f) for f in run.diagnosis.findings],
            "minor": [finding_payload(f) for f in run.diagnosis.minor],
            "crossrank": crossrank_payload(run.crossrank),
            "notices": run.notices,
        }
    )


def payload(result: Result) -> dict[str, Any]:
    head = {
        "tool": "fsdp-trace",
        "version": __version__,
        "inputs": result.inputs,
        "grouping": result.grouping,
    }
    if len(result.runs) == 1:
        return {**head, **run_payload(result.runs[0]), "notices": result.notices}
    return clean({**head, "notices": result.notices, "runs": [run_payload(r) for r in result.runs]})


def to_json(result: Result | RunAnalysis) -> dict[str, Any]:
    """Everything a result holds, as --json writes it: a `Result`'s `payload`, one run's
    `run_payload`. (`Result.to_json()` is a shim to this, for the API users README shows.)"""
    return run_payload(result) if isinstance(result, RunAnalysis) else payload(result)
