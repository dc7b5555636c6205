"""Scaling efficiency against activation-checkpoint coverage: run the captures of a sweep and
turn run directories into the table behind efficiency.html and `fsdp-trace compare`."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fsdp_trace.errors import UserError

RUN_FILE = "run.json"
TABLE_COLUMNS = [
    "run",
    "label",
    "model",
    "batch_size",
    "seq_len",
    "world_size",
    "ac_coverage",
    "compile",
    "step_ms",
    "tokens_per_s_per_gpu",
    "scaling_efficiency",
    "mfu",
    "exposed_pct",
    "recompute_pct",
    "peak_allocated_gib",
]


def parse_points(text: str) -> list[float]:
    """'0,0.25,0.5' → [0.0, 0.25, 0.5], each a fraction in [0, 1]."""
    try:
        points = [float(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise UserError(f"--ac-coverage takes comma-separated fractions, not {text!r}") from None
    if not points or any(not 0.0 <= p <= 1.0 for p in points):
        raise UserError(f"--ac-coverage needs fractions in [0, 1], got {text!r}")
    return sorted(set(points))


def point_dir(out: Path, coverage: float, nproc: int) -> Path:
    return out / f"ac{coverage:.2f}-{nproc}gpu"


def run_sweep(
    base, points: list[float], nproc: int, out: Path, rendezvous, baseline: bool
) -> list[Path]:
    """Capture each coverage point on `nproc` GPUs, after its 1-GPU baseline."""
    from fsdp_trace.capture.launcher import launch

    out.mkdir(parents=True, exist_ok=True)
    dirs = []
    for coverage in points:
        base_dir = point_dir(out, coverage, 1)
        if baseline and nproc > 1:
            launch(
                replace(base, ac_coverage=coverage, out=str(base_dir), baseline=None), 1, rendezvous
            )
            dirs.append(base_dir)
        run_dir = point_dir(out, coverage, nproc)
        cfg = replace(
            base,
            ac_coverage=coverage,
            out=str(run_dir),
            baseline=str(base_dir) if baseline and nproc > 1 else base.baseline,
        )
        launch(cfg, nproc, rendezvous)
        dirs.append(run_dir)
    return dirs


def find_runs(paths: list[str | Path]) -> list[Path]:
    """Run directories given directly, or found one level below (a sweep's folder)."""
    runs: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if (path / RUN_FILE).exists():
            runs.append(path)
        elif path.is_dir():
            found = sorted(p.parent for p in path.glob(f"*/{RUN_FILE}"))
            if not found:
                raise UserError(f"{path}: no run.json here or one level below: not a capture run")
            runs.extend(found)
        else:
            raise UserError(f"{path}: no such run directory")
    return runs


def _read(run: Path) -> dict[str, Any]:
    try:
        return json.loads((run / RUN_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{run / RUN_FILE}: unreadable ({exc})") from None


def _trace_figures(run: Path) -> tuple[float, float]:
    """Median exposed-communication % and recompute share of the step, from the timing traces."""
    from fsdp_trace.analyze import analyze

    result = analyze(run, detailed=False)
    steps = result.steps
    if steps.empty:
        return float("nan"), float("nan")
    exposed = (
        float(np.nanmedian(steps["exposed_pct"].astype(float)))
        if steps["exposed_pct"].notna().any()
        else float("nan")
    )
    phases = pd.concat([r.compute_phases for r in result.ranks], ignore_index=True)
    recompute = (
        phases.loc[phases["phase"] == "recompute", "compute_us"].sum() if len(phases) else 0.0
    )
    total = steps["step_us"].sum()
    return exposed, 100.0 * recompute / total if total else float("nan")


def _label(run: dict[str, Any]) -> str:
    cfg = run.get("config", {})
    parts = [f"{run['world']['world_size']} GPU"]
    if cfg.get("ac_coverage"):
        parts.append(f"AC {cfg['ac_coverage']:g}")
    if cfg.get("compile"):
        parts.append("compile")
    if cfg.get("reshard_after_forward") is not True:
        parts.append(f"reshard={cfg.get('reshard_after_forward')}")
    for knob, text in (
        ("shard_embeddings", "emb units"),
        ("keep_last_unsharded", "keep last"),
        ("prefetch_forward", "fwd prefetch"),
        ("prefetch_backward", "bwd prefetch"),
    ):
        value = cfg.get(knob)
        if value:
            parts.append(text if value is True else f"{text} {value}")
    return ", ".join(parts)


def run_table(runs: list[Path], with_traces: bool = True) -> pd.DataFrame:
    """One row per run: knobs and figures; efficiency against the matching 1-GPU run."""
    rows = []
    for path in runs:
        run = _read(path)
        figures = run.get("figures", {})
        model = run.get("model", {})
        exposed, recompute = _trace_figures(path) if with_traces else (float("nan"), float("nan"))
        rows.append(
            {
                "run": str(path),
                "label": _label(run),
                "model": model.get("preset") or model.get("factory"),
                "batch_size": model.get("batch_size"),
                "seq_len": model.get("seq_len"),
                "world_size": run["world"]["world_size"],
                "ac_coverage": run.get("parallel", {}).get("ac_coverage_effective", 0.0),
                "compile": bool(run.get("config", {}).get("compile")),
                "step_ms": (figures.get("step_time_ms") or {}).get("median"),
                "tokens_per_s_per_gpu": figures.get("tokens_per_s_per_gpu"),
                "scaling_efficiency": figures.get("scaling_efficiency"),
                "mfu": figures.get("mfu"),
                "exposed_pct": exposed,
                "recompute_pct": recompute,
                "peak_allocated_gib": figures.get(
                    "peak_allocated_gib", figures.get("peak_rss_gib")
                ),
            }
        )
    table = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    return _fill_efficiency(table)


def _fill_efficiency(table: pd.DataFrame) -> pd.DataFrame:
    """Efficiency = tok/s/GPU at N ÷ tok/s of the 1-GPU run with the same model, batch,
    sequence, AC coverage and compile setting; run.json's own figure where no such run is given."""
    key = ["model", "batch_size", "seq_len", "ac_coverage", "compile"]
    single = (
        table[table["world_size"] == 1].drop_duplicates(key).set_index(key)["tokens_per_s_per_gpu"]
    )
    efficiency = []
    for row in table.itertuples(index=False):
        base = single.get(tuple(getattr(row, k) for k in key))
        if row.world_size == 1:
            efficiency.append(1.0 if base is not None else row.scaling_efficiency)
        elif base is not None and base:
            efficiency.append(row.tokens_per_s_per_gpu / base)
        else:
            efficiency.append(row.scaling_efficiency)
    table["scaling_efficiency"] = pd.to_numeric(pd.Series(efficiency), errors="coerce")
    return table


IGNORED_KNOBS = {
    "out",
    "overwrite",
    "baseline",
    "extra",
    "timed_steps",
    "timing_steps",
    "warmup_steps",
    "timeout_s",
}


def knob_changes(before: dict[str, Any], after: dict[str, Any]) -> str:
    """'compile: False → True, ac_coverage: 0 → 0.5' between two runs' configs."""
    changes = []
    for key in after:
        if key in IGNORED_KNOBS or before.get(key) == after.get(key):
            continue
        changes.append(f"{key}: {before.get(key)} → {after.get(key)}")
    return ", ".join(changes)


def compare_table(runs: list[Path], with_traces: bool = True) -> pd.DataFrame:
    """`fsdp-trace compare`: the runs in the order given, each with what changed from the
    previous one (GPUs and knobs) and what that bought in tokens/s/GPU."""
    table = run_table(runs, with_traces=with_traces)
    configs = [_read(path) for path in runs]
    changes, gains = [""], [float("nan")]
    for i in range(1, len(configs)):
        prev, cur = configs[i - 1], configs[i]
        change = knob_changes(prev.get("config", {}), cur.get("config", {}))
        if prev["world"]["world_size"] != cur["world"]["world_size"]:
            gpus = f"GPUs: {prev['world']['world_size']} → {cur['world']['world_size']}"
            change = f"{gpus}, {change}" if change else gpus
        changes.append(change or "(same knobs)")
        before = table["tokens_per_s_per_gpu"].iloc[i - 1]
        after = table["tokens_per_s_per_gpu"].iloc[i]
        gains.append(100.0 * (after / before - 1.0) if before else float("nan"))
    table["change"] = changes
    table["tokens_per_s_per_gpu_change_pct"] = gains
    return table
